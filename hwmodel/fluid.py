"""The fluid (flow-level) engine: contended resources and the activities that share them, on a SimPy
clock.

Every contended thing in the machine -- a directed link, a GPU's HBM bandwidth, its pool of SMs -- is
a :class:`~hwmodel.maxmin.Resource` (re-exported here) with a capacity per second. Everything that
uses them -- a network transfer, a collective, a kernel -- is an :class:`Activity`: an amount of work
and, per resource, a weight (the resource units it consumes per unit of work progress). Units are the
caller's, consistently: for a link, work in bytes, capacity in bytes/s, weight in bytes on the link
per byte of progress; for a kernel (``hwmodel/gpu.py``), work in solo seconds, weights in SMs and HBM
bytes/s, bound 1. Active activities share resources by weighted **max-min fairness**; the allocation,
and the progressive filling (SimGrid's ``maxmin_solve``) that computes it, are in
:mod:`hwmodel.maxmin`. This module keeps the clock: who is active, how far each activity got, when it
completes, and which rates a change can move.

An activity first pays its latency -- during which it loads nothing (SimGrid: "the latency is paid
beforehand") -- then joins the solver and drains at its current rate; ``done`` fires when its work is
done. Rates are re-solved only when something changes (an activity starts or ends, a capacity or a
rate bound changes), and every change of one instant is batched into one solve, run by a zero-delay
event after everything already scheduled for that instant.

*Side loads* give one-way coupling: an activity may declare resources it loads at ``w x rate`` without
being limited by them; that load is taken off the resource's capacity for everyone else. NCCL's HBM
traffic is modelled this way: a collective's speed is set by its links, and the HBM bandwidth it uses
is no longer available to kernels on that GPU. It keeps components GPU-local, which is what makes a
1,000-GPU simulation affordable (see ``docs/DESIGN.md``).

**Incremental re-solves (same allocation).** Progressive filling pops the *bottlenecks* that
characterise the max-min allocation (Bertsekas & Gallager, *Data Networks*, §6.5.2); the engine
remembers them (``Resource.bottleneck``) and marks what a change touches dirty: the resources that lost
or gained capacity or load, the classes that gained members. At the end of the instant
:func:`hwmodel.maxmin.solve_closure` re-fills the bottleneck closure of the dirty set alone, the other
activities held at their rates; the result is the allocation a fill of the whole connected component
gives, up to floating-point rounding order. Changes that provably alter no rate are not solved at all:
a capacity rise on a resource that is no one's bottleneck, a capacity cut that the current load still
fits, the end of an activity that sat at its rate bound, a new activity in a class at its bound whose
resources still fit it. When every change of an instant only frees capacity (activities end,
bottlenecks get room), the fill below the lowest rate involved is the same as before (the water level
rises alike up to it): that rate is the solve's *floor*, and slower activities keep their rates and stay
out of the closure. :meth:`FluidSystem.set_rate_bound` changes a bound mid-run (a kernel's
wave-quantised speed limit, see ``hwmodel/gpu.py``).

*Classes.* Activities with the same constrained resources and the same rate bound are always fixed in
the same step of progressive filling, so they share one rate; the engine keeps each such
:class:`RateClass` as one unknown whose weights are its members' sums. Kernels on a GPU (weights on its
SM pool and HBM, bound 1) form one class, so processor sharing among N kernels costs one solve of one
unknown, and a class alone on its resources (a kernel on an idle GPU) is rated on the spot. Each class
plans the next completion among its members on one heap; one SimPy timeout, for the earliest, wakes the
engine.

Invariants kept between events: ``Resource.load`` is the sum of ``w x rate`` over its constrained
users (updated incrementally, so up to rounding; exactly 0 without users) and ``Resource.side_load``
that over its side users;
``Resource.carried`` is the time integral of ``load + side_load`` up to the last change;
``Activity.remaining`` is the work left at the activity's last settlement.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Mapping
from typing import cast

import simpy

from hwmodel.maxmin import EPS, Resource, fill_one, keeps_bound_rate, lowest_movable_rate, maxmin, solve_closure

__all__ = ["Activity", "FluidSystem", "RateClass", "Resource", "maxmin"]

_EPS = EPS
_INF = math.inf
_SPARE_CLASSES_MAX = 4096
"""Ended classes kept for reuse (fewer allocations); the store is emptied when it reaches this."""
_REWEIGH_EVERY = 16
"""Departures after which a class's summed weights are recomputed exactly (not by subtraction)."""


class Activity:
    """Work that progresses at a rate shared on resources. ``done`` fires when it completes.

    Made by :meth:`FluidSystem.start`; ``weights`` and ``side`` are ``((resource, weight), ...)``
    with each resource once.
    """

    __slots__ = ("name", "work", "remaining", "weights", "side", "rate_bound", "rate", "done",
                 "start_time", "active_time", "end_time", "_settled_at_s", "_finish_at_s", "rate_class",
                 "_class_key", "tag")

    def __init__(self, env: simpy.Environment, name: str, work: float,
                 weights: tuple[tuple[Resource, float], ...],
                 side: tuple[tuple[Resource, float], ...], rate_bound: float | None,
                 key: Iterable[Resource] | None = None) -> None:
        self.name = name
        self.work = work
        """Total units of work (bytes for a transfer, solo seconds for a kernel)."""
        self.remaining = work
        """Work left when its progress was last settled (at the last rate change)."""
        self.weights = weights
        """Constrained resources: units consumed per unit of progress."""
        self.side = side
        """Side-loaded resources: units consumed per unit of progress, not limiting."""
        self.rate_bound = rate_bound
        """Maximum progress rate (work units/s), or ``None``."""
        self.rate = 0.0
        """Current progress rate (work units per second)."""
        self.done: simpy.Event = env.event()
        """Succeeds (value: the activity) when all work is done."""
        self.start_time = env.now
        self.active_time: float | None = None
        """When the latency was paid and the activity joined the solver."""
        self.end_time: float | None = None
        self._settled_at_s = env.now  # when ``remaining`` was last brought up to date
        self._finish_at_s = _INF  # planned completion at the current rate
        self.rate_class: RateClass | None = None
        """The class it drains in (``None`` while paying its latency and once ended)."""
        bound = _INF if rate_bound is None else rate_bound
        # its class: the constrained resources, then the bound
        self._class_key = (*([r for r, _ in weights] if key is None else key), bound)
        self.tag: object = None
        """Free slot for the caller."""

    @property
    def _cls(self) -> RateClass | None:
        """Alias of :attr:`rate_class` (older name)."""
        return self.rate_class

    def __repr__(self) -> str:
        return f"Activity({self.name!r}, remaining={self.remaining:g}, rate={self.rate:g})"


class RateClass:
    """Active activities with the same constrained resources and rate bound: one rate for all.

    ``weights`` holds the members' summed weights per resource, ``side_weights`` their summed
    side-load weights (the sums in member order, as :meth:`FluidSystem._reweigh` computes them).
    """

    __slots__ = ("key", "weights", "side_weights", "bound", "rate", "members", "next_finish_s",
                 "version", "alive", "approx_departures")

    def __init__(self, key: tuple, bound: float) -> None:
        self.key = key
        self.weights: dict[Resource, float] = {}
        self.side_weights: dict[Resource, float] = {}
        self.bound = bound
        """Rate bound of every member (work units/s; inf: none)."""
        self.rate = 0.0
        """Progress rate of every member (work units/s)."""
        self.members: dict[Activity, None] = {}
        self.next_finish_s = _INF
        """Earliest planned completion among the members (inf: none planned)."""
        self.version = 0
        """Bumped at every re-plan: heap entries of older versions are void."""
        self.alive = True
        self.approx_departures = 0
        """Departures since ``weights`` were last recomputed exactly (they are subtracted meanwhile)."""


class FluidSystem:
    """Resources and activities on one SimPy environment, with max-min fair rates.

    Args:
        env: the SimPy environment whose clock is used.
        record: keep each resource's load timeline (for utilisation plots and reports).
    """

    def __init__(self, env: simpy.Environment, record: bool = True) -> None:
        self.env = env
        self.record = record
        self.resources: list[Resource] = []
        self._classes: dict[tuple, RateClass] = {}
        self._spare_classes: dict[tuple, RateClass] = {}  # ended classes kept for reuse
        # What the pending solve must look at (see the module doc):
        self._dirty_classes: dict[RateClass, None] = {}
        self._dirty_resources: dict[Resource, None] = {}
        self._floor_rate = _INF  # rates below this cannot move in the pending solve
        self._solve_pending = False
        # Set while a solve applies its rates: resources whose side load moved, judged after.
        self._deferred_side: dict[Resource, None] | None = None
        self._deferred_buffer: dict[Resource, None] = {}  # (kept for reuse: fewer allocations)
        self._due_buffer: list[Activity] = []  # (likewise)
        self._finish_heap: list[tuple[float, int, int, RateClass]] = []  # (time_s, seq, version, class)
        self._seq = 0
        self._wake_at_s = _INF
        self._wake_gen = 0  # only the wake-up of the latest generation acts
        self.solves = 0
        """Number of (incremental) solves so far (for benchmarks)."""
        self.solved_activities = 0
        """Sum over solves of the activities re-rated together, for benchmarks."""

    # -- building ---------------------------------------------------------------------------
    def add_resource(self, name: str, capacity: float, meta: object = None, *, record: bool = True) -> Resource:
        """Create a resource with ``capacity`` units per second; ``record``: keep its load timeline when the
        system records (False for a resource whose timeline nothing reads: each change costs a point).

        Raises:
            ValueError: a negative, NaN or infinite capacity.
        """
        r = Resource(name, capacity, meta)
        r._accounted_at_s = self.env.now
        r.records = self.record and record
        r.index = len(self.resources)
        self.resources.append(r)
        return r

    # -- activities ---------------------------------------------------------------------------
    def start(self, work: float, weights: Mapping[Resource, float] | Iterable[tuple[Resource, float]],
              *, latency_s: float = 0.0, rate_bound: float | None = None, name: str = "",
              side_loads: Mapping[Resource, float] | None = None) -> Activity:
        """Start an activity; returns it (``yield activity.done`` to wait).

        Args:
            work: units of work, finite and >= 0 (bytes for a transfer).
            weights: resource -> units consumed per unit of progress (> 0). Repeated resources add.
            latency_s: delay before the activity loads anything (path latency), >= 0.
            rate_bound: maximum progress rate (> 0), or ``None``. Required when ``weights`` is empty.
            name: label for traces and errors.
            side_loads: resource -> units consumed per unit of progress, not limiting (see module doc).

        Raises:
            ValueError: negative or infinite work, a negative latency, a non-positive weight or bound,
                or no resource and no bound.
        """
        # (a flat list of independent input checks)
        if not work >= 0 or math.isinf(work):
            raise ValueError(f"activity {name!r}: work must be finite and >= 0, got {work!r}")
        if not latency_s >= 0:
            raise ValueError(f"activity {name!r}: latency_s must be >= 0, got {latency_s!r}")
        if rate_bound is not None and not rate_bound > 0:
            raise ValueError(f"activity {name!r}: rate_bound must be > 0, got {rate_bound!r}")
        merged = weights if type(weights) is dict and _positive(weights) else \
            _merge(weights.items() if isinstance(weights, Mapping) else weights, name)
        side = () if not side_loads else tuple(side_loads.items()) if type(side_loads) is dict and \
            _positive(side_loads) else tuple(_merge(side_loads.items(), name).items())
        if not merged and rate_bound is None:
            raise ValueError(f"activity {name!r}: needs at least one resource or a rate_bound")
        act = Activity(self.env, name, float(work), tuple(merged.items()), side, rate_bound, merged)
        if latency_s > 0:
            self.env.timeout(latency_s).callbacks.append(lambda _ev: self._join(act))
        else:
            self._join(act)
        return act

    def set_capacity(self, resource: Resource, capacity: float) -> None:
        """Change a resource's capacity (units/s) now (e.g. SMs held by a communication kernel); rates
        are re-solved at the end of the instant unless none can change.

        Raises:
            ValueError: a negative or NaN capacity.
        """
        if not capacity >= 0:
            raise ValueError(f"resource {resource.name!r}: capacity must be >= 0, got {capacity!r}")
        rose = capacity >= resource.capacity
        resource.capacity = float(capacity)
        self._available_changed(resource, rose)

    def set_rate_bound(self, act: Activity, rate_bound: float | None) -> None:
        """Change an activity's rate bound (work units/s) now (e.g. a kernel's wave-quantised speed
        limit when SMs are held or released); its progress so far is kept and it is re-rated now
        (alone on its resources) or at the end of the instant. No effect on a finished activity.

        Raises:
            ValueError: a bound that is not > 0, or ``None`` for an activity without resources.
        """
        if rate_bound is not None and not rate_bound > 0:
            raise ValueError(f"activity {act.name!r}: rate_bound must be > 0, got {rate_bound!r}")
        if rate_bound is None and not act.weights:
            raise ValueError(f"activity {act.name!r}: needs at least one resource or a rate_bound")
        if act.end_time is not None or rate_bound == act.rate_bound:
            return
        act._class_key = (*act._class_key[:-1], _INF if rate_bound is None else rate_bound)
        if act.rate_class is None:  # still paying its latency
            act.rate_bound = rate_bound
            return
        now = self.env.now
        if act.rate:
            act.remaining -= act.rate * (now - act._settled_at_s)
        act._settled_at_s = now
        if self._detach(act, now):
            self._request_solve()
        act.rate_bound = rate_bound
        self._attach(act, now)

    def active(self) -> list[Activity]:
        """Activities currently draining (joined, not finished), in no particular order."""
        return [a for c in self._classes.values() for a in c.members]

    # -- internals: membership ------------------------------------------------------------------
    def _join(self, act: Activity) -> None:
        """``act`` has paid its latency: it joins the solver now (or ends at once without work)."""
        now = self.env.now
        act.active_time = act._settled_at_s = now
        if act.work <= _EPS:
            act.end_time = now
            act.remaining = 0.0
            act.done.succeed(act)
            return
        self._attach(act, now)

    def _attach(self, act: Activity, now: float) -> None:
        """Put ``act`` (progress settled at ``now``) into the class of its resources and bound."""
        for r, w in act.weights:
            r.users[act] = w
        for r, w in act.side:
            r.side_users[act] = w
        c = self._classes.get(act._class_key)
        if c is None:
            c = self._open_class(act)
            if act.weights:
                self._rate_new_class(c, act, now)
                return
            c.rate = c.bound  # bounded only by itself: never solved
        else:
            c.members[act] = None
            weights = c.weights  # (the sums in member order, as _reweigh computes them)
            for r, w in act.weights:
                r.classes[c] = weights[r] = weights[r] + w
            if act.side:
                side = c.side_weights
                for r, w in act.side:
                    r.side_classes[c] = side[r] = side.get(r, 0.0) + w
        act.rate_class = c
        x = act.rate = c.rate
        act._finish_at_s = _INF
        if x > 0:
            _add_loads(act.weights, x, now)  # it drains at the class's rate until the solve says otherwise
            for r, _ in act.side:
                self._refresh_side_load(r, now)
            left = act.remaining
            t = act._finish_at_s = now + (left if left > 0 else 0.0) / x
            if t < c.next_finish_s:
                self._schedule_class(c, t)
        if act.weights and c not in self._dirty_classes and not keeps_bound_rate(c):
            self._dirty_classes[c] = None
            self._floor_rate = 0.0
            self._request_solve()

    def _open_class(self, act: Activity) -> RateClass:
        """A class for ``act`` alone (a spare one of the same key if kept), registered on its
        resources."""
        key = act._class_key
        c = self._spare_classes.pop(key, None)
        if c is None:
            c = RateClass(key, cast(float, key[-1]))  # the key ends with the bound (see Activity)
            c.weights = dict(act.weights)
        else:  # an ended class of the same resources and bound: reuse its containers
            c.alive = True
            c.rate = 0.0
            c.next_finish_s = _INF
            c.approx_departures = 0
            weights = c.weights
            for r, w in act.weights:
                weights[r] = w
            c.side_weights.clear()
        self._classes[key] = c
        c.members[act] = None
        if act.side:
            c.side_weights.update(act.side)
        for r, w in act.weights:
            r.classes[c] = w
        for r, w in act.side:
            r.side_classes[c] = w
        return c

    def _rate_new_class(self, c: RateClass, act: Activity, now: float) -> None:
        """Rate the new class of ``act``: on the spot when alone on its resources (a kernel on an idle
        GPU) and no solve is pending, else in this instant's solve."""
        act.rate_class = c
        act.rate = 0.0
        act._finish_at_s = _INF
        for r in c.weights:
            if len(r.classes) > 1 or self._solve_pending:  # solved at the end of this instant
                self._dirty_classes[c] = None
                self._floor_rate = 0.0
                self._request_solve()
                return
        self._solo(c, now)

    def _solo(self, c: RateClass, now: float) -> None:
        """Rate a class that is alone on its resources: the tightest of its bound and what each
        resource has available (:func:`hwmodel.maxmin.fill_one` with no other class)."""
        best, arg = fill_one(c, c.weights, c.weights)
        for r in c.weights:
            r.bottleneck = r is arg
        self.solves += 1
        self.solved_activities += len(c.members)
        if self._deferred_side is not None:  # (inside a solve's apply phase: it judges side loads)
            self._set_class_rate(c, best, now)
            return
        self._deferred_side = self._deferred_buffer
        self._set_class_rate(c, best, now)
        self._deferred_side = None
        if self._deferred_buffer:
            self._judge_deferred_side_loads()

    def _reweigh(self, c: RateClass) -> None:
        """Recompute a class's summed weights from its members (exact, in member order)."""
        members = iter(c.members)
        first = next(members)
        weights = dict(first.weights)
        side = dict(first.side) if c.side_weights else None
        for m in members:
            for r, w in m.weights:
                weights[r] += w
            if side is not None:
                for r, w in m.side:
                    side[r] = side.get(r, 0.0) + w
        c.weights = weights
        for r, w in weights.items():
            r.classes[c] = w
        if side is not None:
            for r in c.side_weights:
                if r not in side:
                    del r.side_classes[c]
            c.side_weights = side
            for r, w in side.items():
                r.side_classes[c] = w

    def _finish(self, a: Activity) -> bool:
        """End ``a`` now; returns whether a solve is needed (the caller requests it, after every
        ``done`` of this instant is scheduled, so that what their waiters start joins that solve)."""
        dirty = self._detach(a, self.env.now)
        a.end_time = self.env.now
        a.remaining = 0.0
        a.done.succeed(a)
        return dirty

    def _detach(self, a: Activity, now: float) -> bool:
        """Take ``a`` out of its class and off its resources now (its progress is not settled);
        returns whether a bottleneck lost load (a solve is needed)."""
        c: RateClass = a.rate_class  # type: ignore[assignment]  # only active ones detach: class set
        x = c.rate
        del c.members[a]
        a.rate_class = None
        for r, _ in a.weights:
            del r.users[a]
        _add_loads(a.weights, -x, now)
        for r, _ in a.side:
            del r.side_users[a]
        if c.members:
            self._drop_member_weights(c, a)
        else:
            self._close_class(c)
        dirty = False
        for r, _ in a.weights:
            if r.bottleneck:  # capacity freed on someone's bottleneck
                self._dirty_resources[r] = None
                dirty = True
        if dirty and x < self._floor_rate:  # the fill below a's rate is unchanged without it
            self._floor_rate = x
        a.rate = 0.0
        for r, _ in a.side:
            self._refresh_side_load(r, now)
        return dirty

    def _drop_member_weights(self, c: RateClass, a: Activity) -> None:
        """Take departed ``a``'s weights off the sums of ``c`` (which keeps other members): by
        subtraction, recomputed exactly every ``_REWEIGH_EVERY`` departures and when side loads are
        involved."""
        c.approx_departures += 1
        if c.approx_departures < _REWEIGH_EVERY and len(c.members) > 1 and not a.side:
            weights = c.weights
            for r, w in a.weights:
                r.classes[c] = weights[r] = weights[r] - w
        else:
            c.approx_departures = 0
            self._reweigh(c)

    def _close_class(self, c: RateClass) -> None:
        """``c`` lost its last member: off its resources, into the spare store."""
        c.alive = False
        c.version += 1  # its planned completions are void
        del self._classes[c.key]
        spare = self._spare_classes
        if len(spare) >= _SPARE_CLASSES_MAX:
            spare.clear()
        spare[c.key] = c
        for r in c.weights:
            del r.classes[c]
            if not r.classes:
                r.bottleneck = False
        for r in c.side_weights:
            del r.side_classes[c]

    # -- internals: solving ---------------------------------------------------------------------
    def _available_changed(self, r: Resource, rose: bool = False) -> None:
        """``r.available()`` changed (``rose``: it grew): re-solve unless no rate can change."""
        if not r.classes:
            return
        if self._deferred_side is not None:  # a solve is applying its rates: judge when it is done
            self._deferred_side[r] = None
            return
        floor = lowest_movable_rate(r, rose)
        if floor is None:
            return
        if floor < self._floor_rate:
            self._floor_rate = floor
        self._dirty_resources[r] = None
        self._request_solve()

    def _request_solve(self) -> None:
        if not self._solve_pending:
            self._solve_pending = True
            # A zero-delay event runs after everything already scheduled for this instant, so
            # simultaneous starts and ends are solved once.
            self.env.timeout(0).callbacks.append(self._solve_dirty)

    def _solve_dirty(self, _ev: object = None) -> None:
        """The end of an instant with changes: re-solve what they can move
        (:func:`hwmodel.maxmin.solve_closure`) and apply the new rates."""
        self._solve_pending = False
        now = self.env.now
        dirty_resources, dirty_classes = self._dirty_resources, self._dirty_classes
        self._dirty_resources, self._dirty_classes = {}, {}
        floor = self._floor_rate
        self._floor_rate = _INF
        floor_rate = floor * (1 - 1e-12) if 0 < floor < _INF else None
        solution = solve_closure(dirty_resources, dirty_classes, floor_rate)
        if solution is None:
            return
        classes, applied, rates, saturated, fills = solution
        self.solves += fills
        n = 0
        for c in classes:
            n += len(c.members)
        self.solved_activities += n
        for r in applied:
            r.bottleneck = r in saturated
        # Side loads move with the new rates; whether that matters is judged once all are applied.
        self._deferred_side = self._deferred_buffer
        for c in classes:
            new = rates[c]
            if new != c.rate:
                self._set_class_rate(c, new, now)
        self._deferred_side = None
        if self._deferred_buffer:
            self._judge_deferred_side_loads()

    def _judge_deferred_side_loads(self) -> None:
        """After a solve's apply phase: the resources whose side load it moved may need a solve now."""
        changed = list(self._deferred_buffer)
        self._deferred_buffer.clear()
        for r in changed:
            self._available_changed(r)

    def _set_class_rate(self, c: RateClass, new: float, now: float) -> None:
        """Change class ``c``'s rate now: settle each member's progress, update the loads the class
        puts on resources, re-plan its completions."""
        old = c.rate
        c.rate = new
        first_finish_s = _INF
        for m in c.members:
            if old:
                m.remaining -= old * (now - m._settled_at_s)
            m._settled_at_s = now
            m.rate = new
            if new > 0:
                left = m.remaining
                t = now + (left if left > 0 else 0.0) / new
                if t < first_finish_s:
                    first_finish_s = t
            else:
                t = _INF
            m._finish_at_s = t
        _add_loads(c.weights.items(), new - old, now)  # (the hottest loop of the engine)
        for r in c.side_weights:
            self._refresh_side_load(r, now)
        self._schedule_class(c, first_finish_s)

    def _refresh_side_load(self, r: Resource, now: float) -> None:
        """Recompute ``r.side_load`` from its side classes' rates; re-solve if that matters."""
        side = 0.0
        for c, w in r.side_classes.items():
            side += w * c.rate
        if side != r.side_load:
            rose = side < r.side_load
            _account_load(r, 0.0, side, now)
            self._available_changed(r, rose)

    # -- internals: completions -----------------------------------------------------------------
    def _schedule_class(self, c: RateClass, t: float) -> None:
        """The next completion of a member of ``c`` is at ``t`` (s; inf: none planned)."""
        c.version += 1
        c.next_finish_s = t
        if t == _INF:
            return
        self._seq += 1
        heapq.heappush(self._finish_heap, (t, self._seq, c.version, c))
        if t < self._wake_at_s:
            self._wake_at_s = t
            self._wake_gen += 1
            gen = self._wake_gen
            self.env.timeout(t - self.env.now).callbacks.append(lambda _ev: self._wake(gen))

    def _wake(self, gen: int) -> None:
        """A planned completion time: finish every member due now (within 1e-12 s, relative past 1 s),
        re-plan their classes, request a solve if a bottleneck lost load, plan the next wake-up."""
        if gen != self._wake_gen:
            return
        now = self.env.now
        heap = self._finish_heap
        self._wake_at_s = _INF
        limit = now + 1e-12 * max(1.0, now)
        solve = False
        while heap:
            t, _, version, c = heap[0]
            if version != c.version or not c.alive:
                heapq.heappop(heap)
                continue
            if t > limit:
                break
            heapq.heappop(heap)
            due = self._due_buffer
            for m in c.members:
                if m._finish_at_s <= limit:
                    due.append(m)
            for m in due:
                if self._finish(m):
                    solve = True
            due.clear()
            if c.alive:  # re-plan the class
                first_finish_s = _INF
                for m in c.members:
                    if m._finish_at_s < first_finish_s:
                        first_finish_s = m._finish_at_s
                self._schedule_class(c, first_finish_s)
        if solve:
            self._request_solve()
        if heap and heap[0][0] < self._wake_at_s:  # (re-planned classes above may have set a later wake)
            t = heap[0][0]
            self._wake_at_s = t
            self._wake_gen += 1
            gen = self._wake_gen
            self.env.timeout(max(t - now, 0.0)).callbacks.append(lambda _ev: self._wake(gen))


def _account_load(r: Resource, load_delta: float, side_load: float, now: float) -> None:
    """The one load-accounting step: bring ``r.carried`` up to ``now`` at the old total load, then
    ``r.load += load_delta`` (exactly 0 once no activity uses ``r``) and ``r.side_load = side_load``
    (units/s), and record the new total in the timeline if it changed."""
    load = r.load
    total_old = load + r.side_load
    r.carried += total_old * (now - r._accounted_at_s)
    r._accounted_at_s = now
    load += load_delta
    if load <= 0 or not r.users:
        load = 0.0
    r.load = load
    r.side_load = side_load
    if r.records and load + side_load != total_old:  # a point at ``now`` is replaced
        timeline = r.timeline
        if timeline and timeline[-1][0] == now:
            timeline[-1] = (now, load + side_load)
        else:
            timeline.append((now, load + side_load))


def _add_loads(weights: Iterable[tuple[Resource, float]], rate: float, now: float) -> None:
    """:func:`_account_load` of ``w * rate`` on every ``(r, w)`` of ``weights``, side loads unchanged
    (inlined: an activity merged with its mirrors loads hundreds of links)."""
    for r, w in weights:
        load = r.load
        side = r.side_load
        total_old = load + side
        r.carried += total_old * (now - r._accounted_at_s)
        r._accounted_at_s = now
        load += w * rate
        if load <= 0 or not r.users:
            load = 0.0
        r.load = load
        if r.records and load + side != total_old:  # (as _account_load records, inlined: millions of calls)
            timeline = r.timeline
            if timeline and timeline[-1][0] == now:
                timeline[-1] = (now, load + side)
            else:
                timeline.append((now, load + side))


def _positive(weights: dict[Resource, float]) -> bool:
    """Whether every weight of a merged dict is > 0 (NaN is not), in C loops, not :func:`_merge`'s."""
    values = weights.values()
    return not values or (min(values) > 0 and (total := sum(values)) == total)


def _merge(items: Iterable[tuple[Resource, float]], name: str) -> dict[Resource, float]:
    """Weights per resource, repeated resources summed.

    Raises:
        ValueError: a weight that is not > 0.
    """
    merged: dict[Resource, float] = {}
    for r, w in items:
        if not w > 0:
            raise ValueError(f"activity {name!r}: weight on {r.name!r} must be > 0, got {w!r}")
        if r in merged:
            merged[r] += w
        else:
            merged[r] = w
    return merged
