"""Weighted max-min fair rates by progressive filling: the pure solver (no SimPy, no clock).

**What is solved.** Resources ``r`` offer a capacity ``C_r`` per second: bytes/s for a link or a GPU's
HBM, SMs for a GPU's pool of SMs (compute throughput is folded into a kernel's solo time, so no
resource is in FLOP/s). Activities ``a`` progress at a rate ``x_a`` in work units per second (bytes/s
for a transfer or a collective; solo seconds per second for a kernel, so its bound 1 is "as fast as
alone"), consume ``w[a, r] * x_a`` of each resource they use (``w`` > 0: bytes on the link per byte
of progress, SMs held while running, HBM bytes/s at solo speed) and may have a rate bound ``b_a``.
The rates are the *weighted max-min fair* allocation of the constraints ``sum_a w[a, r] x_a <= C_r``
and ``x_a <= b_a``: the feasible allocation whose sorted rate vector is lexicographically largest.

**How.** Progressive filling, as SimGrid's LMM solver (``src/kernel/lmm/maxmin.cpp``,
``maxmin_solve``): the resource with the smallest fair share ``remaining capacity / sum of its unfixed
users' weights`` saturates and its unfixed users are fixed at that share; an activity whose own bound
is at most the current smallest share is fixed at its bound first; subtract, repeat. Fixing users at
the smallest share can only raise the other resources' shares, so a lazy min-heap of shares (a stale
entry is refreshed when it reaches the top) finds each bottleneck in O(log R): O((R + W) log R) per
solve for R resources and W weights.

**Invariants** (what the tests hold the engine to). The allocation is feasible; every activity is at
its bound or has a *bottleneck*: a saturated resource on which no user runs faster. That
characterisation makes the allocation unique (Bertsekas & Gallager, *Data Networks*,
§6.5.2; the weights change nothing in the proof), so a fill restricted to the activities a change
can reach -- :func:`solve_closure` -- gives the allocation a fill of the whole connected component
gives, up to floating-point rounding order.

Two views of the same solver: :func:`maxmin` fills activities from scratch (the reference the
property tests compare against); :func:`fill` and :func:`solve_closure` fill *rate classes* (the
engine's activities with the same constrained resources and bound, which progressive filling always
fixes together) while the classes outside the fill are held at their current rates. The
:class:`Resource` (a constraint) is defined here; the engine (:mod:`hwmodel.fluid`) makes resources,
keeps their loads and classes (:class:`~hwmodel.fluid.RateClass`) up to date and applies the rates.
The functions here read that state and never change it, and :func:`lowest_movable_rate` and
:func:`keeps_bound_rate` tell the engine when a change can move no rate at all.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Collection, Container, Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hwmodel.fluid import Activity, RateClass

EPS = 1e-12
"""Weights and works at or below this are treated as zero."""
_INF = math.inf
_STALE = 1 + 1e-12
"""A heap entry whose share grew by more than this factor is re-pushed (refreshed) instead of used."""


class Resource:
    """A shared capacity: the linear constraint ``sum(w_i * x_i) <= capacity`` per second.

    The solver reads its capacity, loads, users and classes; the engine (:mod:`hwmodel.fluid`), which
    makes and updates resources, also keeps on it a unit counter (bytes for a link) and, when the
    system records, a step function of its load over time.

    Raises:
        ValueError: a negative, NaN or infinite capacity.
    """

    __slots__ = ("name", "capacity", "nominal_capacity", "users", "side_users", "load", "side_load",
                 "carried", "_accounted_at_s", "timeline", "records", "meta", "index", "bottleneck", "classes",
                 "side_classes")

    def __init__(self, name: str, capacity: float, meta: object = None) -> None:
        if not capacity >= 0 or math.isinf(capacity):
            raise ValueError(f"resource {name!r}: capacity must be finite and >= 0, got {capacity!r}")
        self.name = name
        """Human-readable name, e.g. ``n0.gpu0->nvswitch0``."""
        self.capacity = float(capacity)
        """Units per second available now (after holds such as NCCL's SMs)."""
        self.nominal_capacity = float(capacity)
        """Capacity as built, before any :meth:`FluidSystem.set_capacity`."""
        self.users: dict[Activity, float] = {}
        """Active (post-latency) activities constrained by this resource, with their weights."""
        self.side_users: dict[Activity, float] = {}
        """Active activities side-loading this resource, with their weights."""
        self.load = 0.0
        """Units per second consumed now by constrained activities."""
        self.side_load = 0.0
        """Units per second consumed now by side loads (taken off the capacity)."""
        self.carried = 0.0
        """Total units consumed so far (bytes for a link), side loads included."""
        self._accounted_at_s = 0.0  # when ``carried`` was last brought up to date (by the engine)
        self.timeline: list[tuple[float, float]] = []
        """``(time_s, units_per_s)`` whenever the total load changes (if the system records)."""
        self.records = False
        """Whether the engine keeps :attr:`timeline` (set by :meth:`hwmodel.fluid.FluidSystem.add_resource`)."""
        self.meta = meta
        """Free slot for the owner (e.g. the topology edge)."""
        self.index = -1
        """Stable tie-break for the solver: the position in :attr:`FluidSystem.resources`, or the one a
        creator that makes resources on demand sets (:class:`hwmodel.cluster.Cluster`)."""
        self.bottleneck = False
        """Whether the last solve that touched this resource saturated it as some activity's
        bottleneck (progressive filling fixed activities at its fair share)."""
        self.classes: dict[RateClass, float] = {}
        """The rate classes constrained by this resource, with their summed weights."""
        self.side_classes: dict[RateClass, float] = {}
        """The rate classes side-loading this resource, with their summed side-load weights."""

    def available(self) -> float:
        """Capacity left for constrained activities once side loads are served (units/s, >= 0)."""
        return max(self.capacity - self.side_load, 0.0)

    def utilisation(self) -> list[tuple[float, float]]:
        """The recorded load as a fraction of nominal capacity: ``[(time_s, fraction), ...]``."""
        cap = self.nominal_capacity or 1.0
        return [(t, u / cap) for t, u in self.timeline]

    def __repr__(self) -> str:
        return f"Resource({self.name!r}, capacity={self.capacity:g})"


def maxmin(acts: list[Activity], resources: Iterable[Resource]) -> dict[Activity, float]:
    """Weighted max-min fair rates by progressive filling (SimGrid ``maxmin_solve``), from scratch.

    The reference for the engine's incremental solves. Each resource ``r`` offers ``r.available()``
    (units/s); activity ``a`` consumes ``w * x[a]`` on each ``(r, w)`` of ``a.weights`` and runs at
    most at ``a.rate_bound`` (``None``: unbounded). ``acts`` must hold every activity on
    ``resources`` that constrains them (a connected component), and ``resources`` every resource
    their weights name.

    Returns:
        activity -> rate (work units per second); 0 for activities on a zero-capacity resource.

    Raises:
        KeyError: an activity uses a resource missing from ``resources``.
    """
    offer_left: dict[Resource, float] = {}
    unfixed_weight: dict[Resource, float] = {}
    for r in resources:
        offer_left[r] = r.available()
        unfixed_weight[r] = 0.0
    for a in acts:
        for r, w in a.weights:
            unfixed_weight[r] += w
    heap = [(offer_left[r] / u, i, r) for i, (r, u) in enumerate(unfixed_weight.items()) if u > EPS]
    heapq.heapify(heap)
    seq = len(unfixed_weight)  # past every index above: entries never tie on (share, seq)
    rates: dict[Activity, float] = {}
    # (bound, activity) of the bounded activities, lowest bound first (stable: ties keep ``acts`` order)
    bounded = sorted(((a.rate_bound, a) for a in acts if a.rate_bound is not None), key=lambda ba: ba[0])
    next_bounded = 0
    left = len(acts)
    while left:
        share = math.inf
        while heap:  # drop resources without unfixed users; refresh stale shares
            key, _, r = heap[0]
            u = unfixed_weight[r]
            if u <= EPS:
                heapq.heappop(heap)
                continue
            current = offer_left[r] / u
            if current > key * _STALE + 1e-300:
                heapq.heapreplace(heap, (current, seq, r))
                seq += 1
                continue
            share = current
            break
        while next_bounded < len(bounded) and bounded[next_bounded][1] in rates:
            next_bounded += 1
        if next_bounded < len(bounded) and bounded[next_bounded][0] <= share:
            value, lowest = bounded[next_bounded]
            fix = [lowest]
        elif heap:
            r = heapq.heappop(heap)[2]
            fix = [a for a in r.users if a not in rates]
            value = max(share, 0.0)
        else:  # only bounded activities on no constraining resource (cannot happen with weights)
            for a in acts:
                if a not in rates:
                    rates[a] = a.rate_bound or 0.0
            break
        for a in fix:
            rates[a] = value
            left -= 1
            for r2, w in a.weights:
                offer_left[r2] -= w * value
                unfixed_weight[r2] -= w
    return rates


def fill_one(c: RateClass, complete: Container[Resource], applied: Container[Resource]
             ) -> tuple[float, Resource | None]:
    """The rate of a class filled alone: the tightest of its bound and what each resource of
    ``applied`` it uses offers it (``available()`` less the load of the other classes at their rates;
    on a resource in ``complete`` no other load is taken off, as every user there is being filled).
    Ties between resources go to the lower :attr:`Resource.index`.

    Returns:
        (rate in work units/s, the resource that sets it, or ``None`` when the bound does).
    """
    best = c.bound
    arg = None
    for r, w in c.weights.items():
        if r not in applied:
            continue
        offer = r.capacity - r.side_load
        if r not in complete:
            for other, w2 in r.classes.items():
                if other is not c:
                    offer -= w2 * other.rate
        if offer < 0:
            offer = 0.0
        x = offer / w
        if x < best or x == best and arg is not None and r.index < arg.index:
            best, arg = x, r
    return best, arg


def fill(classes: dict[RateClass, None], complete: dict[Resource, None], applied: dict[Resource, None]  # noqa: C901
         ) -> tuple[dict[RateClass, float], dict[Resource, float]]:
    # (Over 80 lines and past the complexity cap on purpose: the search for the smallest share stays
    # inline, as it runs at every fixing step of every solve and a call there costs a few per cent of
    # the engine's speed.)
    """Progressive filling (SimGrid ``maxmin_solve``) over ``classes`` and the constraints ``applied``,
    the classes outside ``classes`` held at their current rates: each resource offers what they leave
    of ``available()``.

    ``complete`` (a subset of ``applied``) names resources every user of which is in ``classes``, so
    their offer needs no sum over outsiders; every class in ``classes`` has a resource in ``applied``.
    The offer of any other resource is summed lazily: it enters the heap with a lower bound on its
    share (its whole load taken off) and is summed exactly only if it reaches the top.

    Returns:
        (class -> rate in work units/s, resource -> the fair share at which it saturated as a
        bottleneck).
    """
    if len(classes) == 1:  # one class (e.g. the kernels of one GPU): no heap needed
        for c in classes:
            rate, arg = fill_one(c, complete, applied)
            return {c: rate}, ({} if arg is None else {arg: rate})
    unfixed_weight, unfixed_users, weights_applied = _weights_on(classes, applied)
    offer_left: dict[Resource, float] = {}
    lazy: dict[Resource, None] = {}
    heap = []
    for r, u in unfixed_weight.items():
        if r in complete:
            offer = r.capacity - r.side_load
            if offer < 0:
                offer = 0.0
        else:
            offer = r.capacity - r.side_load - r.load  # a lower bound: the outsiders' load is less
            lazy[r] = None
        offer_left[r] = offer
        heap.append((offer / u, r.index, r))
    heapq.heapify(heap)
    rates: dict[RateClass, float] = {}
    saturated: dict[Resource, float] = {}
    bounded = [c for c in classes if c.bound != _INF]
    if len(bounded) > 1:
        bounded.sort(key=_bound_of)
    next_bounded = 0
    n_bounded = len(bounded)
    left = len(classes)
    while left:
        share = _INF
        while heap:  # drop resources without unfixed users; refresh stale shares
            key, idx, r = heap[0]
            if not unfixed_users[r]:
                heapq.heappop(heap)
                continue
            if r in lazy:  # the exact offer: the outsiders' load, then what has been fixed so far
                del lazy[r]
                offer = r.capacity - r.side_load
                fixed = 0.0
                for c, w in r.classes.items():
                    if c not in classes:
                        offer -= w * c.rate
                    elif c in rates:
                        fixed += w * rates[c]
                if offer < 0:
                    offer = 0.0
                offer_left[r] = offer - fixed
            current = offer_left[r] / unfixed_weight[r]
            if current > key * _STALE + 1e-300:
                heapq.heapreplace(heap, (current, idx, r))
                continue
            share = current
            break
        while next_bounded < n_bounded and bounded[next_bounded] in rates:
            next_bounded += 1
        if next_bounded < n_bounded and bounded[next_bounded].bound <= share:
            c = bounded[next_bounded]
            fix: tuple[RateClass, ...] | list[RateClass] = (c,)
            value = c.bound
        elif heap:
            r = heapq.heappop(heap)[2]
            value = share if share > 0 else 0.0
            saturated[r] = value
            fix = [c for c in r.classes if c not in rates and c in classes]
        else:  # cannot happen: every class has a resource in applied
            for c in classes:
                if c not in rates:
                    rates[c] = c.bound if c.bound != _INF else 0.0
            break
        for c in fix:
            rates[c] = value
            left -= 1
            for r2, w in weights_applied[c]:
                offer_left[r2] -= w * value
                unfixed_weight[r2] -= w
                unfixed_users[r2] -= 1
    return rates, saturated


def _bound_of(c: RateClass) -> float:
    return c.bound


def _weights_on(classes: dict[RateClass, None], applied: dict[Resource, None]
                ) -> tuple[dict[Resource, float], dict[Resource, int], dict[RateClass, list[tuple[Resource, float]]]]:
    """Per resource of ``applied`` used by ``classes``: their summed weights and their number; per
    class: its ``(resource, weight)`` on ``applied``, in ``applied`` order."""
    unfixed_weight: dict[Resource, float] = {}
    unfixed_users: dict[Resource, int] = {}
    weights_applied: dict[RateClass, list[tuple[Resource, float]]] = {}
    for r in applied:
        u = 0.0
        n = 0
        for c, w in r.classes.items():
            if c in classes:
                u += w
                n += 1
                cw = weights_applied.get(c)
                if cw is None:
                    weights_applied[c] = [(r, w)]
                else:
                    cw.append((r, w))
        if n:
            unfixed_weight[r] = u
            unfixed_users[r] = n
    return unfixed_weight, unfixed_users, weights_applied


def bottleneck_closure(classes: dict[RateClass, None], complete: dict[Resource, None],
                       new_resources: list[Resource], new_classes: list[RateClass],
                       floor_rate: float | None = None) -> None:
    """Close ``classes`` and ``complete`` in place under "resource -> its users, class -> its
    bottleneck resources": every user of a resource in ``complete`` is in ``classes`` (every user
    running at ``floor_rate`` or faster, if given), and every bottleneck resource of a class in
    ``classes`` is in ``complete``. ``new_resources`` / ``new_classes`` are the members just added
    (consumed)."""
    while new_resources or new_classes:
        while new_resources:
            r = new_resources.pop()
            for c in r.classes:
                if c not in classes and (floor_rate is None or c.rate >= floor_rate):
                    classes[c] = None
                    new_classes.append(c)
        while new_classes:
            c = new_classes.pop()
            for r in c.weights:
                if r.bottleneck and r not in complete:
                    complete[r] = None
                    new_resources.append(r)


def components(classes: dict[RateClass, None], applied: dict[Resource, None]
               ) -> list[tuple[dict[RateClass, None], dict[Resource, None]]]:
    """``classes`` split into the groups linked through shared resources of ``applied``, each with
    the resources of ``applied`` it uses (progressive filling of disjoint problems is independent, so
    each group can be filled on its own)."""
    seen: dict[RateClass, None] = {}
    groups = []
    for c in classes:
        if c in seen:
            continue
        group = {c: None}
        used: dict[Resource, None] = {}
        seen[c] = None
        stack = [c]
        while stack:
            x = stack.pop()
            for r in x.weights:
                if r in applied and r not in used:
                    used[r] = None
                    for y in r.classes:
                        if y not in seen and y in classes:
                            seen[y] = None
                            group[y] = None
                            stack.append(y)
        groups.append((group, used))
    return groups


ClosureSolution = tuple[dict["RateClass", None], dict["Resource", None], dict["RateClass", float],
                        dict["Resource", float], int]
"""What :func:`solve_closure` returns: ``(classes, applied, rates, saturated, fills)`` -- the classes
re-rated (in the order the engine applies their rates), the constraints the final fill applied (their
bottleneck flags are re-set from it), class -> new rate (work units/s), resource -> the fair share at
which it saturated as a bottleneck, and how many independent fills the final pass ran (one per linked
group). (A plain tuple: it is made at every solve.)"""


def solve_closure(seed_resources: Collection[Resource], seed_classes: Collection[RateClass],
                  floor_rate: float | None) -> ClosureSolution | None:
    """Re-solve only what a change can move: progressive filling over the closure of the change.

    ``seed_resources`` lost or gained capacity or load; ``seed_classes`` gained members (either may
    hold resources no class uses any more and ended classes: they are skipped). Rates move
    only along bottlenecks (module doc), so the fill covers the :func:`bottleneck_closure` of the
    seeds, with every other class held at its rate, and then checks the result: a resource outside
    the closure that saturates while an outside user runs faster pulls that resource in; a class that
    speeds up enough to overload a resource the fill did not apply gets that resource applied; either
    way the fill is repeated. The outcome meets the max-min characterisation for every class.
    ``floor_rate`` (``None``: none): the change only freed capacity and no class below this rate can
    move, so such classes stay out of the closure.

    Returns:
        a :data:`ClosureSolution`, or ``None`` when no live class is affected.
    """
    classes: dict[RateClass, None] = {}
    complete: dict[Resource, None] = {}
    applied: dict[Resource, None] = {}
    new_resources = [r for r in seed_resources if r.classes]
    for r in new_resources:
        complete[r] = None
    new_classes = [c for c in seed_classes if c.alive]
    for c in new_classes:  # new members: any of the class's resources may now bind
        classes[c] = None
        for r in c.weights:
            applied[r] = None
    # Several seeds may be unrelated changes at one instant (the same kernel on every GPU): fill each
    # linked group on its own. One seed's closure is connected.
    several = len(seed_resources) + len(seed_classes) > 1
    # With a floor, users of a resource in ``complete`` may stay outside: then no resource is complete
    # for the fill. Otherwise this is ``complete`` itself, growing with it.
    complete_for_fill = complete if floor_rate is None else {}
    while True:
        bottleneck_closure(classes, complete, new_resources, new_classes, floor_rate)
        if not classes:
            return None
        applied.update(complete)
        if several:
            rates, saturated, fills = _fill_groups(classes, complete_for_fill, applied)
        else:
            rates, saturated = fill(classes, complete_for_fill, applied)
            fills = 1
        new_resources.extend(_saturated_under_outsiders(saturated, complete, classes))
        for r in new_resources:
            complete[r] = None
        overloaded = _overloaded_by_speedups(classes, rates, applied)
        for r in overloaded:
            applied[r] = None
        if not new_resources and not overloaded:
            return classes, applied, rates, saturated, fills


def _fill_groups(classes: dict[RateClass, None], complete: dict[Resource, None],
                 applied: dict[Resource, None]) -> tuple[dict[RateClass, float], dict[Resource, float], int]:
    """:func:`fill`, group by group (the :func:`components` of ``classes``); also returns the number
    of fills run."""
    groups = components(classes, applied)
    if len(groups) == 1:
        return (*fill(classes, complete, applied), 1)
    rates: dict[RateClass, float] = {}
    saturated: dict[Resource, float] = {}
    for group, used in groups:
        group_rates, group_saturated = fill(group, complete, used)
        rates.update(group_rates)
        saturated.update(group_saturated)
    return rates, saturated, len(groups)


def _saturated_under_outsiders(saturated: dict[Resource, float], complete: dict[Resource, None],
                               classes: dict[RateClass, None]) -> list[Resource]:
    """Resources outside ``complete`` that saturated in the fill while a class outside ``classes``
    runs faster on them: that class must slow down too."""
    found = []
    for r, share in saturated.items():
        if r in complete:
            continue
        limit = share * (1 + 1e-12)
        for c in r.classes:
            if c.rate > limit and c not in classes:
                found.append(r)
                break
    return found


def _overloaded_by_speedups(classes: dict[RateClass, None], rates: dict[RateClass, float],
                            applied: dict[Resource, None]) -> list[Resource]:
    """Resources the fill did not apply (no one's bottleneck) that the classes speeding up would
    overload."""
    extra: dict[Resource, float] = {}
    for c in classes:
        d = rates[c] - c.rate
        if d > 0:
            for r, w in c.weights.items():
                if r not in applied:
                    extra[r] = extra.get(r, 0.0) + w * d
    overloaded = []
    for r, x in extra.items():
        if r.load + x > r.capacity - r.side_load:
            overloaded.append(r)
    return overloaded


def load_at_rates(r: Resource) -> float:
    """The load (units/s) the classes constrained by ``r`` put on it at their current rates, summed
    in class order (what ``r.load`` tracks incrementally)."""
    load = 0.0
    for c, w in r.classes.items():
        load += w * c.rate
    return load


def keeps_bound_rate(c: RateClass) -> bool:
    """Whether class ``c``, with no bottleneck among its resources (at its rate bound), keeps its rate
    after gaining load: its resources still fit the load at the current rates, so nothing moves."""
    for r in c.weights:
        if r.bottleneck:
            return False
        load = 0.0  # load_at_rates(r), inlined: this runs at every start of an activity in a class
        for other, w in r.classes.items():
            load += w * other.rate
        if load > r.capacity - r.side_load:
            return False
    return True


def lowest_movable_rate(r: Resource, rose: bool) -> float | None:
    """After ``r.available()`` changed (``rose``: it grew), the lowest rate the change can move:
    ``None`` when none can (``r`` is no one's bottleneck and its load still fits); the fastest rate on
    ``r`` when ``r`` is a bottleneck that got room (the fill below its level is unchanged); else 0."""
    if not r.bottleneck:
        return None if load_at_rates(r) <= r.available() else 0.0
    if rose:
        top = 0.0
        for c in r.classes:
            if c.rate > top:
                top = c.rate
        return top
    return 0.0
