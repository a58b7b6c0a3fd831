"""The pure max-min solver (``hwmodel.maxmin``) on closed forms, with no SimPy and no clock.

Both views are checked: :func:`maxmin` over activities and :func:`fill` over rate classes (what the
engine's incremental solves run), on the textbook allocations of Bertsekas & Gallager, *Data
Networks*, §6.5.2 (parking lot) and weighted shares of one constraint.
"""

from dataclasses import dataclass

import pytest

from hwmodel.fluid import RateClass
from hwmodel.maxmin import Resource, fill, lowest_movable_rate, maxmin, solve_closure


@dataclass(eq=False)
class _Act:
    """What :func:`maxmin` reads of an activity: its weights and bound."""

    weights: tuple
    rate_bound: float | None = None


def _resources(*caps):
    out = []
    for i, c in enumerate(caps):
        r = Resource(f"r{i}", c)
        r.index = i
        out.append(r)
    return out


def _acts(spec):
    """``[(weights {resource: w}, bound), ...]`` -> activities registered as their resources' users."""
    acts = []
    for weights, bound in spec:
        a = _Act(tuple(weights.items()), bound)
        for r, w in weights.items():
            r.users[a] = w
        acts.append(a)
    return acts


def _classes(spec):
    """The same as rate classes (one member each), registered on their resources."""
    classes = {}
    for i, (weights, bound) in enumerate(spec):
        c = RateClass((i,), float("inf") if bound is None else bound)
        c.weights = dict(weights)
        for r, w in weights.items():
            r.classes[c] = w
        classes[c] = None
    return list(classes)


def _both(spec, resources):
    """Rates from :func:`maxmin` and from :func:`fill` (every resource applied and complete)."""
    acts = _acts(spec)
    by_act = maxmin(acts, resources)
    classes = _classes(spec)
    every = dict.fromkeys(resources)
    by_class, _saturated = fill(dict.fromkeys(classes), every, every)
    return [by_act[a] for a in acts], [by_class[c] for c in classes]


@pytest.mark.parametrize("caps", [(1.0, 1.0, 1.0), (2.0, 5.0, 3.0, 8.0), (4.0,)])
def test_parking_lot(caps):
    # A long flow crosses every link, one short flow on each: the tightest link c_min saturates first
    # and splits evenly, so long = c_min / 2 and the short flow on link k gets c_k - c_min / 2.
    links = _resources(*caps)
    spec = [(dict.fromkeys(links, 1.0), None)] + [({r: 1.0}, None) for r in links]
    c_min = min(caps)
    expect = [c_min / 2] + [c - c_min / 2 for c in caps]
    for rates in _both(spec, links):
        assert rates == pytest.approx(expect, rel=1e-12)


def test_weighted_shares_of_one_resource():
    # Weights w_i on one resource of capacity C: equal rates x with sum(w_i) x = C (the resource
    # units each consumes differ, the progress rates do not).
    (link,) = _resources(12.0)
    weights = [1.0, 2.0, 3.0]
    spec = [({link: w}, None) for w in weights]
    for rates in _both(spec, [link]):
        assert rates == pytest.approx([12.0 / 6.0] * 3, rel=1e-12)
        assert sum(w * x for w, x in zip(weights, rates, strict=True)) == pytest.approx(12.0, rel=1e-12)


def test_bound_below_the_share_is_fixed_first():
    # Capacity 10, three flows, one bounded at 1: it keeps 1, the others split the 9 left.
    (link,) = _resources(10.0)
    spec = [({link: 1.0}, 1.0), ({link: 1.0}, None), ({link: 1.0}, None)]
    for rates in _both(spec, [link]):
        assert rates == pytest.approx([1.0, 4.5, 4.5], rel=1e-12)


def test_side_load_and_zero_capacity():
    # A side load of 3 leaves 5 of 8 to share; a zero-capacity resource gives its users 0.
    a, b = _resources(8.0, 0.0)
    a.side_load = 3.0
    spec = [({a: 1.0}, None), ({a: 1.0}, None), ({b: 2.0}, None)]
    for rates in _both(spec, [a, b]):
        assert rates == pytest.approx([2.5, 2.5, 0.0], abs=1e-12)


def test_solve_closure_re_rates_only_what_a_change_reaches():
    # Two links with no shared user: the flows on link 0 at 1 each (saturated). Link 0's capacity
    # rises to 4: the closure is link 0's users (2 each); link 1's user is not re-rated.
    l0, l1 = _resources(2.0, 7.0)
    c0, c1, c2 = _classes([({l0: 1.0}, None), ({l0: 1.0}, None), ({l1: 1.0}, None)])
    c0.rate = c1.rate = 1.0
    c2.rate = 7.0
    l0.load, l1.load = 2.0, 7.0
    l0.bottleneck = l1.bottleneck = True
    l0.capacity = 4.0
    assert lowest_movable_rate(l0, rose=True) == 1.0  # a bottleneck got room: the fill below 1 stands
    classes, applied, rates, saturated, fills = solve_closure([l0], [], None)
    assert set(classes) == {c0, c1} and list(applied) == [l0] and fills == 1
    assert rates == {c0: 2.0, c1: 2.0}
    assert saturated == {l0: 2.0}
    # a link that is no one's bottleneck and still fits its load: no rate can move
    l1.bottleneck = False
    l1.capacity = 9.0
    assert lowest_movable_rate(l1, rose=True) is None
