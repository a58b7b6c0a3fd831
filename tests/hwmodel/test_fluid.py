"""Closed forms and invariants of the max-min fluid engine."""

import math

import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from hwmodel.fluid import FluidSystem
from hwmodel.maxmin import maxmin


def _run_transfer(env, fs, work, weights, latency_s=0.0, **kw):
    a = fs.start(work, weights, latency_s=latency_s, **kw)
    env.run()
    return a


def test_one_flow_takes_latency_plus_size_over_bandwidth(env):
    fs = FluidSystem(env)
    l1, l2 = fs.add_resource("a", 100e9), fs.add_resource("b", 25e9)
    a = _run_transfer(env, fs, 1e9, {l1: 1, l2: 1}, latency_s=2e-6)
    assert a.end_time == pytest.approx(2e-6 + 1e9 / 25e9, rel=1e-3)
    assert l2.carried == pytest.approx(1e9, rel=1e-9)


@pytest.mark.parametrize("k", [1, 2, 3, 8])
def test_k_equal_flows_share_one_link(env, k):
    fs = FluidSystem(env)
    link = fs.add_resource("l", 10.0)
    acts = [fs.start(100.0, {link: 1}) for _ in range(k)]
    env.run(until=1.0)
    assert all(a.rate == pytest.approx(10.0 / k) for a in acts)
    env.run()
    assert all(a.end_time == pytest.approx(10.0 * k) for a in acts)


def test_parking_lot_textbook_rates(env):
    # Links L1, L2 of capacity 1: a long flow crosses both, one short flow on each.
    # Max-min fair: every flow gets 1/2 (Bertsekas & Gallager, Data Networks, 6.5.2).
    fs = FluidSystem(env)
    l1, l2 = fs.add_resource("L1", 1.0), fs.add_resource("L2", 1.0)
    long_ = fs.start(10, {l1: 1, l2: 1})
    s1, s2 = fs.start(10, {l1: 1}), fs.start(10, {l2: 1})
    env.run(until=0.1)
    assert (long_.rate, s1.rate, s2.rate) == pytest.approx((0.5, 0.5, 0.5))


def test_parking_lot_unequal_capacity(env):
    # L1 capacity 1 with two flows, L2 capacity 10 with the long flow and a short one:
    # long and s1 get 1/2 on L1; s2 takes what is left on L2: 9.5.
    fs = FluidSystem(env)
    l1, l2 = fs.add_resource("L1", 1.0), fs.add_resource("L2", 10.0)
    long_ = fs.start(10, {l1: 1, l2: 1})
    s1, s2 = fs.start(10, {l1: 1}), fs.start(10, {l2: 1})
    env.run(until=0.1)
    assert (long_.rate, s1.rate, s2.rate) == pytest.approx((0.5, 0.5, 9.5))


def test_weighted_entity_gets_min_share_over_weight(env):
    fs = FluidSystem(env)
    a_, b_ = fs.add_resource("a", 100.0), fs.add_resource("b", 30.0)
    act = fs.start(1000, {a_: 2.0, b_: 1.0})
    env.run(until=0.01)
    assert act.rate == pytest.approx(min(100 / 2, 30 / 1))


def test_rate_bound_and_leftover_goes_to_others(env):
    fs = FluidSystem(env)
    link = fs.add_resource("l", 10.0)
    capped = fs.start(100, {link: 1}, rate_bound=2.0)
    free = fs.start(100, {link: 1})
    env.run(until=0.1)
    assert capped.rate == pytest.approx(2.0)
    assert free.rate == pytest.approx(8.0)


def test_departure_speeds_up_the_rest(env):
    fs = FluidSystem(env)
    link = fs.add_resource("l", 10.0)
    short = fs.start(10, {link: 1})
    long_ = fs.start(30, {link: 1})
    env.run()
    # both at 5 until t=2 (short done), then long alone at 10 for the remaining 20.
    assert short.end_time == pytest.approx(2.0)
    assert long_.end_time == pytest.approx(4.0)


def test_capacity_change_resolves(env):
    fs = FluidSystem(env)
    sm = fs.add_resource("sm", 108.0)
    k = fs.start(1.0, {sm: 108.0}, rate_bound=1.0)
    env.run(until=0.5)
    fs.set_capacity(sm, 84.0)
    env.run()
    assert k.end_time == pytest.approx(0.5 + 0.5 * 108 / 84)


def test_side_load_reduces_capacity_for_others(env):
    fs = FluidSystem(env)
    link, hbm = fs.add_resource("link", 10.0), fs.add_resource("hbm", 100.0)
    comm = fs.start(100, {link: 1}, side_loads={hbm: 3.0})   # 10/s on link -> 30/s of HBM
    kern = fs.start(5000, {hbm: 1})
    env.run(until=1.0)
    assert comm.rate == pytest.approx(10.0)
    assert kern.rate == pytest.approx(70.0)
    env.run(until=20.0)  # comm done at t=10: the kernel gets the whole HBM
    assert kern.rate == pytest.approx(100.0)


def test_zero_work_finishes_after_latency(env):
    fs = FluidSystem(env)
    link = fs.add_resource("l", 1.0)
    a = _run_transfer(env, fs, 0.0, {link: 1}, latency_s=3.0)
    assert a.end_time == pytest.approx(3.0)


@pytest.mark.parametrize("kwargs, field", [
    ({"work": -1}, "work"), ({"latency_s": -1}, "latency_s"), ({"rate_bound": 0}, "rate_bound"),
])
def test_bad_input_names_the_field(env, kwargs, field):
    fs = FluidSystem(env)
    link = fs.add_resource("l", 1.0)
    args = {"work": 1.0, **kwargs}
    work = args.pop("work")
    with pytest.raises(ValueError, match=field):
        fs.start(work, {link: 1}, **args)


def test_negative_capacity_rejected(env):
    fs = FluidSystem(env)
    with pytest.raises(ValueError, match="capacity"):
        fs.add_resource("l", -1.0)


# -- property tests -------------------------------------------------------------------------

flows_st = st.lists(
    st.tuples(st.sets(st.integers(0, 5), min_size=1, max_size=4),   # links used
              st.floats(0.5, 3.0),                                   # weight
              st.floats(1.0, 100.0),                                 # work
              st.floats(0.0, 5.0),                                   # start time
              st.one_of(st.none(), st.floats(0.5, 20.0))),           # rate bound
    min_size=1, max_size=12)


@settings(max_examples=60, deadline=None)
@given(caps=st.lists(st.floats(1.0, 50.0), min_size=6, max_size=6), flows=flows_st)
def test_random_flows_capacity_delivery_fairness(caps, flows):
    env = simpy.Environment()
    fs = FluidSystem(env)
    links = [fs.add_resource(f"l{i}", c) for i, c in enumerate(caps)]
    acts = []
    checks = []

    def starter(f):
        used, w, work, t0, ub = f
        yield env.timeout(t0)
        acts.append((fs.start(work, {links[i]: w for i in used}, rate_bound=ub), f))

    def checker():
        while True:
            yield env.timeout(0.37)
            yield env.timeout(0)  # let changes at this instant be solved (they are batched)
            live = fs.active()
            # capacity never exceeded
            for l in links:
                assert sum(w * a.rate for a, w in l.users.items()) <= l.capacity * (1 + 1e-9)
            # max-min: every flow is either at its bound or has a saturated link on which it has
            # the largest rate (per weight) among that link's flows.
            for a in live:
                if a.rate_bound is not None and a.rate >= a.rate_bound * (1 - 1e-9):
                    continue
                ok = False
                for r, _w in a.weights:
                    load = sum(ww * b.rate for b, ww in r.users.items())
                    if load >= r.capacity * (1 - 1e-9) and all(b.rate <= a.rate * (1 + 1e-9)
                                                                 for b in r.users):
                        ok = True
                assert ok, a
            checks.append(env.now)
            if not live and len(acts) == len(flows):
                return

    for f in flows:
        env.process(starter(f))
    env.process(checker())
    env.run(until=10_000)
    assert len(acts) == len(flows)
    for a, (_used, _w, _work, _t0, _ub) in acts:
        assert a.end_time is not None and a.remaining == 0.0
    # every byte delivered: each link carried exactly the sum of its flows' work x weight
    for i, l in enumerate(links):
        expect = sum(work * w for _a, (used, w, work, _t, _u) in acts if i in used)
        assert l.carried == pytest.approx(expect, rel=1e-6, abs=1e-6)


def test_maxmin_function_matches_hand_example(env):
    fs = FluidSystem(env)
    a_, b_ = fs.add_resource("a", 6.0), fs.add_resource("b", 4.0)
    f1 = fs.start(1, {a_: 1}); f2 = fs.start(1, {a_: 1, b_: 1}); f3 = fs.start(1, {b_: 1})  # noqa: E702
    env.run(until=1e-9)
    rates = maxmin([f1, f2, f3], [a_, b_])
    # b saturates first at 2 each (f2, f3); a gives f1 the remaining 4.
    assert (rates[f1], rates[f2], rates[f3]) == pytest.approx((4.0, 2.0, 2.0))
    assert not math.isnan(rates[f1])
