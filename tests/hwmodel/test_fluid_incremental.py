"""The fluid engine's incremental solves give the allocation a fill of the whole problem gives.

The engine re-solves only the activities reachable from a change through bottleneck resources, groups
activities of identical resources and bound into one class, and skips changes that cannot move a rate.
These tests hold it to :func:`hwmodel.maxmin.maxmin` (progressive filling from scratch) at random
instants, and check the closed forms of the cases the shortcuts are built on.
"""

import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from hwmodel.fluid import FluidSystem
from hwmodel.maxmin import maxmin


def test_tie_saturated_resource_that_is_no_bottleneck_still_binds_a_newcomer(env):
    # One flow saturates L1 and L2 at once (only one of them is recorded as its bottleneck). A flow
    # that joins L2 must still halve the first one's rate: 50 each.
    fs = FluidSystem(env)
    l1, l2 = fs.add_resource("L1", 100.0), fs.add_resource("L2", 100.0)
    a = fs.start(1e6, {l1: 1, l2: 1})
    env.run(until=1.0)
    b = fs.start(1e6, {l2: 1})
    env.run(until=2.0)
    assert (a.rate, b.rate) == pytest.approx((50.0, 50.0))


def test_newcomer_on_a_slack_resource_pulls_in_its_faster_users(env):
    # a: 90 on L (cap 100, not its bottleneck; its bound is). b joins L: fair share 50 each.
    fs = FluidSystem(env)
    link = fs.add_resource("L", 100.0)
    a = fs.start(1e6, {link: 1}, rate_bound=90.0)
    env.run(until=1.0)
    assert a.rate == 90.0 and not link.bottleneck
    b = fs.start(1e6, {link: 1})
    env.run(until=2.0)
    assert (a.rate, b.rate) == pytest.approx((50.0, 50.0))


def test_changes_that_move_no_rate_are_not_solved(env):
    fs = FluidSystem(env)
    link, other = fs.add_resource("L", 100.0), fs.add_resource("M", 10.0)
    a = fs.start(1e6, {link: 1}, rate_bound=30.0)  # at its bound, L has slack
    b = fs.start(1e6, {other: 1})
    env.run(until=1.0)
    solves = fs.solves
    fs.set_capacity(link, 200.0)  # more room on a resource that is no one's bottleneck
    fs.set_capacity(link, 40.0)   # less, but the load (30) still fits
    env.run(until=2.0)
    assert fs.solves == solves
    assert (a.rate, b.rate) == (30.0, 10.0)
    fs.set_capacity(link, 20.0)   # now it does not: re-solved
    env.run(until=3.0)
    assert fs.solves == solves + 1 and a.rate == 20.0


def test_identical_activities_share_one_class_and_one_rate(env):
    # Three "kernels" with different weights on the same SM pool and HBM, bound 1: one class whose rate
    # is min(1, 108 / sum(sms), hbm / sum(bytes/s)); a fourth arrives halfway through the first.
    fs = FluidSystem(env)
    sm, hbm = fs.add_resource("sm", 108.0), fs.add_resource("hbm", 1.0e12)
    ks = [fs.start(1.0, {sm: s, hbm: 1e11}, rate_bound=1.0) for s in (108.0, 54.0, 54.0)]
    env.run(until=0.5)
    assert all(k.rate == pytest.approx(108 / 216) for k in ks)  # SMs bind: 0.5
    assert len({id(k._cls) for k in ks}) == 1
    late = fs.start(0.25, {sm: 108.0, hbm: 1e11}, rate_bound=1.0)
    env.run(until=0.6)
    assert all(k.rate == pytest.approx(108 / 324) for k in [*ks, late])
    env.run()
    # late: 0.25 of work at 1/3 -> done at 0.5 + 0.75 = 1.25; the others did 0.25 by 0.5 and 0.25 more
    # by 1.25, then finish their last 0.5 at 1/2 -> 2.25.
    assert late.end_time == pytest.approx(1.25)
    assert all(k.end_time == pytest.approx(2.25) for k in ks)


def test_rate_bound_change_keeps_progress(env):
    fs = FluidSystem(env)
    link = fs.add_resource("L", 10.0)
    a = fs.start(100.0, {link: 1})
    env.run(until=1.0)
    fs.set_rate_bound(a, 4.0)  # 90 left at 4/s
    env.run(until=2.0)
    assert a.rate == 4.0
    fs.set_rate_bound(a, None)  # 86 left at 10/s
    env.run()
    assert a.end_time == pytest.approx(2.0 + 8.6)
    with pytest.raises(ValueError, match="rate_bound"):
        fs.set_rate_bound(a, 0.0)


def test_rate_bound_change_during_latency_applies_on_joining(env):
    fs = FluidSystem(env)
    link = fs.add_resource("L", 10.0)
    a = fs.start(10.0, {link: 1}, latency_s=1.0)
    fs.set_rate_bound(a, 2.0)
    env.run()
    assert a.end_time == pytest.approx(1.0 + 5.0)


def test_same_instant_finishes_and_starts_are_solved_once(env):
    # Two of three flows end together at t=3; their waiters start successors at that instant: one solve.
    fs = FluidSystem(env)
    link = fs.add_resource("L", 10.0)
    first = [fs.start(10.0, {link: 1}) for _ in range(2)]
    long_ = fs.start(1000.0, {link: 1})
    for a in first:
        a.done.callbacks.append(lambda _ev: fs.start(10.0, {link: 1}))
    env.run(until=1.0)
    solves = fs.solves
    env.run(until=3.5)
    assert fs.solves == solves + 1
    assert long_.rate == pytest.approx(10 / 3)


@pytest.mark.parametrize("flows_first", [True, False])
def test_side_load_raised_in_the_same_solve_as_a_kernel_is_judged_with_the_new_rates(env, flows_first):
    # h1 (4/s) binds K and K2 at 2 each; F and G share L at 5 each, F side-loading h0 with 0.7/unit.
    # At t=1 K2 and G end together: F -> 10 (side 7 on h0, 3 left) and K -> min(4, 3) = 3. K must not
    # keep the 4 the solve gives it before F's new side load is known.
    fs = FluidSystem(env)
    h0, h1, link = fs.add_resource("h0", 10.0), fs.add_resource("h1", 4.0), fs.add_resource("L", 10.0)

    def flows():
        fs.start(5.0, {link: 1}, rate_bound=50.0)  # G (a class of its own)
        return fs.start(1e3, {link: 1}, side_loads={h0: 0.7})  # F

    def kernels():
        fs.start(2.0, {h1: 1})  # K2
        return fs.start(1e3, {h0: 1, h1: 1})  # K

    if flows_first:
        f, k = flows(), kernels()
    else:
        k, f = kernels(), flows()
    env.run(until=0.5)
    assert (f.rate, k.rate) == pytest.approx((5.0, 2.0))
    env.run(until=1.5)
    assert (f.rate, k.rate) == pytest.approx((10.0, 3.0))
    assert h0.load + h0.side_load == pytest.approx(10.0)


# -- the engine against a fill from scratch -----------------------------------------------------

flows_st = st.lists(
    st.tuples(st.sets(st.integers(0, 4), min_size=1, max_size=3),  # links used
              st.sampled_from([1.0, 1.0, 2.0, 0.5]),                 # weight
              st.floats(1.0, 60.0),                                  # work
              st.sampled_from([0.0, 0.0, 0.5, 1.3, 2.0]),            # start time
              st.one_of(st.none(), st.sampled_from([1.0, 2.5, 7.0])),  # rate bound
              st.sampled_from([None, None, 0, 1])),                  # hbm side-loaded (links -> hbm)
    min_size=1, max_size=10)
kernels_st = st.lists(st.tuples(st.sampled_from([0, 1]), st.floats(0.5, 2.0), st.floats(1.0, 30.0),
                                st.sampled_from([0.0, 0.7, 1.3])), max_size=4)
changes_st = st.lists(st.tuples(st.floats(0.1, 6.0), st.integers(0, 6), st.sampled_from([0.0, 0.5, 1.0, 2.0])),
                      max_size=5)


@settings(max_examples=40, deadline=None)
@given(caps=st.lists(st.sampled_from([1.0, 2.0, 5.0, 10.0]), min_size=5, max_size=5), flows=flows_st,
       kernels=kernels_st, changes=changes_st)
def test_engine_rates_equal_a_fill_from_scratch(caps, flows, kernels, changes):
    env = simpy.Environment()
    fs = FluidSystem(env)
    links = [fs.add_resource(f"l{i}", c) for i, c in enumerate(caps)]
    hbm = [fs.add_resource(f"h{i}", 10.0) for i in range(2)]
    every = links + hbm
    acts = []

    def flow(used, w, work, t0, bound, side):
        yield env.timeout(t0)
        acts.append(fs.start(work, {links[i]: w for i in used}, rate_bound=bound,
                             side_loads={hbm[side]: 0.5} if side is not None else None))

    def kernel(h, w, work, t0):  # constrained by an hbm that link flows side-load
        yield env.timeout(t0)
        acts.append(fs.start(work, {hbm[h]: w}, rate_bound=3.0))

    def change(t, which, factor):  # capacity changes (links and hbm) and rate-bound changes
        yield env.timeout(t)
        if which < len(every):
            r = every[which]
            fs.set_capacity(r, r.nominal_capacity * factor)
            yield env.timeout(1.0)
            fs.set_capacity(r, r.nominal_capacity)
        else:
            live = [a for a in acts if a.end_time is None]
            if live:
                fs.set_rate_bound(live[0], factor or None)

    def check():
        while True:
            yield env.timeout(0.29)
            for _ in range(3):  # let the changes of this instant be solved (side loads cascade)
                yield env.timeout(0)
            live = [a for a in fs.active() if a.weights]
            ref = maxmin(live, every)
            for a in live:
                assert a.rate == pytest.approx(ref[a], rel=1e-9, abs=1e-12), a
            if len(acts) == len(flows) + len(kernels) and all(a.end_time is not None for a in acts):
                return

    for f in flows:
        env.process(flow(*f))
    for k in kernels:
        env.process(kernel(*k))
    for ch in changes:
        env.process(change(*ch))
    env.process(check())
    env.run(until=5_000)
    assert all(a.end_time is not None and a.remaining == 0.0 for a in acts)
