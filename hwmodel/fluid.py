"""A fluid (flow-level) model of contended resources on a SimPy clock.

Every contended thing in the machine -- a directed link, a GPU's HBM bandwidth, its pool of SMs -- is
a :class:`Resource` with a capacity per second. Everything that uses them -- a network transfer, a
collective, a kernel -- is an :class:`Activity`: an amount of work and, per resource, a weight (the
resource units it consumes per unit of work progress). Active activities share resources by weighted
**max-min fairness**, computed by progressive filling exactly as SimGrid's LMM solver
(``src/kernel/lmm/maxmin.cpp``, ``maxmin_solve``): find the most constrained resource, fix the
activities on it at its fair share, subtract, repeat; an activity whose own rate bound is lower than
its share is fixed at its bound first.

Rates are re-solved only when something changes (an activity starts or ends, a capacity changes), and
all changes at one instant are batched into one solve. An activity first pays its latency -- during
which it loads nothing (SimGrid: "the latency is paid beforehand") -- and then drains at its current
rate.

*Side loads* give one-way coupling: an activity may declare resources it loads at ``w x rate`` without
being limited by them; that load is taken off the resource's capacity for everyone else. NCCL's HBM
traffic is modelled this way: a collective's speed is set by its links, and the HBM bandwidth it uses
is no longer available to kernels on that GPU. It keeps components GPU-local, which is what makes a
1,000-GPU simulation affordable (see ``docs/DESIGN.md``).

**How a change is re-solved (incremental, same allocation).** The weighted max-min allocation is the
unique feasible one in which every activity is at its rate bound or has a *bottleneck*: a saturated
resource on which no user runs faster (Bertsekas & Gallager, *Data Networks*, §6.5.2; weights change
nothing in the proof). Progressive filling pops exactly those bottlenecks; the engine remembers them
(``Resource.bottleneck``). A change can then only move the rates of the activities reachable from it
through bottleneck resources: the engine re-runs progressive filling over that closure alone, against
what the other activities leave of each resource, and checks the result -- a resource outside the
closure that saturates while an outside user runs faster pulls that resource into the closure and the
fill is repeated. The outcome satisfies the characterisation above for every activity, so it is the
allocation a fill of the whole connected component gives (up to floating-point rounding order).
Changes that provably alter no rate are not solved at all: a capacity rise on a resource that is no
one's bottleneck, a capacity cut that the current load still fits, the end of an activity that sat at
its rate bound, a new activity in a class at its bound whose resources still fit it. When every change
of an instant only frees capacity (activities end, bottlenecks get room), the fill below the lowest
rate involved is the same as before (the water level rises alike up to it), so slower activities keep
their rates and stay out of the closure. :meth:`FluidSystem.set_rate_bound` changes a bound mid-run
(a kernel's wave-quantised speed limit, see ``hwmodel/gpu.py``).

*Classes.* Activities with the same constrained resources and the same rate bound are always fixed in
the same step of progressive filling, so they share one rate; the solver treats each such class as one
activity whose weights are its members' sums. Kernels on a GPU (weights on its SM pool and HBM, bound
1) form one class, so processor sharing among N kernels costs one solve of one unknown.

Units are the caller's, consistently: for links, work in bytes, capacity in bytes/s, weight in bytes
on the link per byte of progress.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Mapping

import simpy

_EPS = 1e-12
_INF = math.inf


class Resource:
    """A shared capacity (a linear constraint ``sum(w_i * x_i) <= capacity``).

    Keeps a byte (unit) counter and, when recording, a step function of its load over time.
    """

    __slots__ = ("name", "capacity", "nominal_capacity", "users", "side_users", "load", "side_load",
                 "carried", "_last_t", "timeline", "meta", "index", "bottleneck", "_cls", "_side_cls")

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
        self._last_t = 0.0
        self.timeline: list[tuple[float, float]] = []
        """``(time_s, units_per_s)`` whenever the total load changes (if the system records)."""
        self.meta = meta
        """Free slot for the owner (e.g. the topology edge)."""
        self.index = -1
        """Position in :attr:`FluidSystem.resources` (a stable tie-break for the solver)."""
        self.bottleneck = False
        """Whether the last solve that touched this resource saturated it as some activity's
        bottleneck (progressive filling fixed activities at its fair share)."""
        self._cls: dict[_Class, float] = {}
        self._side_cls: dict[_Class, float] = {}

    def available(self) -> float:
        """Capacity left for constrained activities once side loads are served."""
        return max(self.capacity - self.side_load, 0.0)

    def utilisation(self) -> list[tuple[float, float]]:
        """The recorded load as a fraction of nominal capacity: ``[(time_s, fraction), ...]``."""
        cap = self.nominal_capacity or 1.0
        return [(t, u / cap) for t, u in self.timeline]

    def __repr__(self) -> str:
        return f"Resource({self.name!r}, capacity={self.capacity:g})"


class Activity:
    """Work that progresses at a rate shared on resources. ``done`` fires when it completes."""

    __slots__ = ("name", "work", "remaining", "weights", "side", "rate_bound", "rate", "done",
                 "start_time", "active_time", "end_time", "_last", "_t", "_cls", "_key", "tag")

    def __init__(self, env: simpy.Environment, name: str, work: float,
                 weights: tuple[tuple[Resource, float], ...],
                 side: tuple[tuple[Resource, float], ...], rate_bound: float | None,
                 key: Iterable[Resource] | None = None) -> None:
        self.name = name
        self.work = work
        """Total units of work (bytes for a transfer, solo seconds for a kernel)."""
        self.remaining = work
        """Work left at the last rate change (``_last``)."""
        self.weights = weights
        self.side = side
        self.rate_bound = rate_bound
        self.rate = 0.0
        """Current progress rate (work units per second)."""
        self.done: simpy.Event = env.event()
        """Succeeds (value: the activity) when all work is done."""
        self.start_time = env.now
        self.active_time: float | None = None
        """When the latency was paid and the activity joined the solver."""
        self.end_time: float | None = None
        self._last = env.now
        self._t = _INF
        self._cls: _Class | None = None
        bound = _INF if rate_bound is None else rate_bound
        self._key = (*([r for r, _ in weights] if key is None else key), bound)  # its class: resources, bound
        self.tag: object = None
        """Free slot for the caller."""

    def __repr__(self) -> str:
        return f"Activity({self.name!r}, remaining={self.remaining:g}, rate={self.rate:g})"


class _Class:
    """Active activities with the same constrained resources and rate bound: one rate for all.

    ``res`` holds the members' summed weights per resource, ``side`` their summed side-load weights.
    """

    __slots__ = ("key", "res", "side", "bound", "rate", "members", "t_next", "version", "alive", "drift")

    def __init__(self, key: tuple, bound: float) -> None:
        self.key = key
        self.res: dict[Resource, float] = {}
        self.side: dict[Resource, float] = {}
        self.bound = bound
        self.rate = 0.0
        self.members: dict[Activity, None] = {}
        self.t_next = _INF
        self.version = 0
        self.alive = True
        self.drift = 0  # departures since the weight sums were last recomputed exactly


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
        self._classes: dict[tuple, _Class] = {}
        self._spare: dict[tuple, _Class] = {}  # ended classes kept for reuse (fewer allocations)
        self._dbuf: dict[Resource, None] = {}
        self._due: list[Activity] = []
        self._seed_cls: dict[_Class, None] = {}
        self._seed_res: dict[Resource, None] = {}
        self._floor = _INF  # rates below this cannot move in the pending solve (see _solve_dirty)
        self._solve_pending = False
        self._deferred: dict[Resource, None] | None = None
        self._heap: list[tuple[float, int, int, _Class]] = []
        self._seq = 0
        self._wake_at = _INF
        self._wake_gen = 0
        self.solves = 0
        """Number of (incremental) solves so far (for benchmarks)."""
        self.solved_activities = 0
        """Sum over solves of the activities re-rated together, for benchmarks."""

    # -- building ---------------------------------------------------------------------------
    def add_resource(self, name: str, capacity: float, meta: object = None) -> Resource:
        """Create a resource with ``capacity`` units per second."""
        r = Resource(name, capacity, meta)
        r._last_t = self.env.now
        r.index = len(self.resources)
        self.resources.append(r)
        return r

    # -- activities ---------------------------------------------------------------------------
    def start(self, work: float, weights: Mapping[Resource, float] | Iterable[tuple[Resource, float]],
              *, latency_s: float = 0.0, rate_bound: float | None = None, name: str = "",
              side_loads: Mapping[Resource, float] | None = None) -> Activity:
        """Start an activity; returns it (``yield activity.done`` to wait).

        Args:
            work: units of work, >= 0 (bytes for a transfer).
            weights: resource -> units consumed per unit of progress (> 0). Repeated resources add.
            latency_s: delay before the activity loads anything (path latency).
            rate_bound: maximum progress rate, or ``None``. Required when ``weights`` is empty.
            name: label for traces and errors.
            side_loads: resource -> units consumed per unit of progress, not limiting (see module doc).

        Raises:
            ValueError: negative work or latency, a non-positive weight, or no resource and no bound.
        """
        if not work >= 0 or math.isinf(work):
            raise ValueError(f"activity {name!r}: work must be finite and >= 0, got {work!r}")
        if not latency_s >= 0:
            raise ValueError(f"activity {name!r}: latency_s must be >= 0, got {latency_s!r}")
        if rate_bound is not None and not rate_bound > 0:
            raise ValueError(f"activity {name!r}: rate_bound must be > 0, got {rate_bound!r}")
        merged = _merge(weights.items() if isinstance(weights, Mapping) else weights, name)
        s = tuple(_merge(side_loads.items(), name).items()) if side_loads else ()
        if not merged and rate_bound is None:
            raise ValueError(f"activity {name!r}: needs at least one resource or a rate_bound")
        act = Activity(self.env, name, float(work), tuple(merged.items()), s, rate_bound, merged)
        if latency_s > 0:
            self.env.timeout(latency_s).callbacks.append(lambda _ev: self._join(act))
        else:
            self._join(act)
        return act

    def set_capacity(self, resource: Resource, capacity: float) -> None:
        """Change a resource's capacity now (e.g. SMs held by a communication kernel)."""
        if not capacity >= 0:
            raise ValueError(f"resource {resource.name!r}: capacity must be >= 0, got {capacity!r}")
        rose = capacity >= resource.capacity
        resource.capacity = float(capacity)
        self._available_changed(resource, rose)

    def set_rate_bound(self, act: Activity, rate_bound: float | None) -> None:
        """Change an activity's rate bound now (e.g. a kernel's wave-quantised speed limit when SMs are
        held or released); its progress so far is kept and rates are re-solved at the end of the
        instant. No effect on a finished activity.

        Raises:
            ValueError: a bound that is not > 0, or ``None`` for an activity without resources.
        """
        if rate_bound is not None and not rate_bound > 0:
            raise ValueError(f"activity {act.name!r}: rate_bound must be > 0, got {rate_bound!r}")
        if rate_bound is None and not act.weights:
            raise ValueError(f"activity {act.name!r}: needs at least one resource or a rate_bound")
        if act.end_time is not None or rate_bound == act.rate_bound:
            return
        act._key = (*act._key[:-1], _INF if rate_bound is None else rate_bound)
        if act._cls is None:  # still paying its latency
            act.rate_bound = rate_bound
            return
        now = self.env.now
        if act.rate:
            act.remaining -= act.rate * (now - act._last)
        act._last = now
        if self._detach(act, now):
            self._request_solve()
        act.rate_bound = rate_bound
        self._attach(act, now)

    def active(self) -> list[Activity]:
        """Activities currently draining (joined, not finished), in no particular order."""
        return [a for c in self._classes.values() for a in c.members]

    # -- internals: membership ------------------------------------------------------------------
    def _join(self, act: Activity) -> None:
        now = self.env.now
        act.active_time = act._last = now
        if act.work <= _EPS:
            act.end_time = now
            act.remaining = 0.0
            act.done.succeed(act)
            return
        self._attach(act, now)

    def _attach(self, act: Activity, now: float) -> None:  # noqa: C901
        """Put ``act`` (progress settled at ``now``) into the class of its resources and bound."""
        key = act._key
        c = self._classes.get(key)
        for r, w in act.weights:
            r.users[act] = w
        for r, w in act.side:
            r.side_users[act] = w
        if c is None:
            c = self._spare.pop(key, None)
            if c is None:
                c = _Class(key, key[-1])
                c.res = dict(act.weights)
            else:  # an ended class of the same resources and bound: reuse its containers
                c.alive = True
                c.rate = 0.0
                c.t_next = _INF
                c.drift = 0
                res = c.res
                for r, w in act.weights:
                    res[r] = w
                c.side.clear()
            self._classes[key] = c
            c.members[act] = None
            if act.side:
                c.side.update(act.side)
            for r, w in act.weights:
                r._cls[c] = w
            for r, w in act.side:
                r._side_cls[c] = w
            if act.weights:
                act._cls = c
                act.rate = 0.0
                act._t = _INF
                for r in c.res:
                    if len(r._cls) > 1 or self._solve_pending:  # solved at the end of this instant
                        self._seed_cls[c] = None
                        self._floor = 0.0
                        self._request_solve()
                        return
                # Alone on its resources (a kernel on an idle GPU): what the solve would give, now.
                self._solo(c, now)
                return
            c.rate = key[-1]  # bounded only by itself: never solved
        else:
            c.members[act] = None
            res = c.res  # (the sums in member order, as _reweigh computes them, since the last one)
            for r, w in act.weights:
                r._cls[c] = res[r] = res[r] + w
            if act.side:
                side = c.side
                for r, w in act.side:
                    r._side_cls[c] = side[r] = side.get(r, 0.0) + w
        act._cls = c
        x = act.rate = c.rate
        act._t = _INF
        if x > 0:
            record = self.record
            for r, w in act.weights:  # it drains at the class's rate until the solve says otherwise
                _add_load(r, w * x, now, record)
            for r, _ in act.side:
                self._refresh_side_load(r, now)
            rem = act.remaining
            t = act._t = now + (rem if rem > 0 else 0.0) / x
            if t < c.t_next:
                self._schedule_class(c, t)
        if act.weights and c not in self._seed_cls:
            # A class at its rate bound (no bottleneck among its resources) keeps it if its resources
            # still fit the extra load: nothing else moves either.
            for r in c.res:
                if r.bottleneck:
                    break
                load = 0.0
                for c2, w in r._cls.items():
                    load += w * c2.rate
                if load > r.capacity - r.side_load:
                    break
            else:
                return
            self._seed_cls[c] = None
            self._floor = 0.0
            self._request_solve()

    def _solo(self, c: _Class, now: float) -> None:
        """Rate a class that is alone on its resources: the tightest of its bound and what each
        resource has available (the one-class case of :func:`_fill`)."""
        best = c.bound
        arg = None
        for r, w in c.res.items():
            a = r.capacity - r.side_load
            x = (a if a > 0 else 0.0) / w
            if x < best or x == best and arg is not None and r.index < arg.index:
                best, arg = x, r
        for r in c.res:
            r.bottleneck = r is arg
        self.solves += 1
        self.solved_activities += len(c.members)
        if self._deferred is not None:  # (inside a solve's apply phase: it judges side loads)
            self._set_class_rate(c, best, now)
            return
        self._deferred = deferred = self._dbuf
        self._set_class_rate(c, best, now)
        self._deferred = None
        if deferred:
            changed = list(deferred)
            deferred.clear()
            for r in changed:
                self._available_changed(r)

    def _reweigh(self, c: _Class) -> None:
        """Recompute a class's summed weights from its members (exact, in member order)."""
        members = iter(c.members)
        first = next(members)
        res = dict(first.weights)
        side = dict(first.side) if c.side else None
        for m in members:
            for r, w in m.weights:
                res[r] += w
            if side is not None:
                for r, w in m.side:
                    side[r] = side.get(r, 0.0) + w
        c.res = res
        for r, w in res.items():
            r._cls[c] = w
        if side is not None:
            for r in c.side:
                if r not in side:
                    del r._side_cls[c]
            c.side = side
            for r, w in side.items():
                r._side_cls[c] = w

    def _finish(self, a: Activity) -> bool:
        """End ``a`` now; returns whether a solve is needed (the caller requests it, after every
        ``done`` of this instant is scheduled, so that what their waiters start joins that solve)."""
        seeded = self._detach(a, self.env.now)
        a.end_time = self.env.now
        a.remaining = 0.0
        a.done.succeed(a)
        return seeded

    def _detach(self, a: Activity, now: float) -> bool:
        """Take ``a`` out of its class and off its resources now (its progress is not settled);
        returns whether a bottleneck lost load (a solve is needed)."""
        c: _Class = a._cls  # type: ignore[assignment]
        x = c.rate
        del c.members[a]
        a._cls = None
        record = self.record
        for r, w in a.weights:
            del r.users[a]
            _add_load(r, -w * x, now, record)
        for r, _ in a.side:
            del r.side_users[a]
        if c.members:
            c.drift += 1
            if c.drift < 16 and len(c.members) > 1 and not a.side:
                res = c.res  # take the departed member's weights off (recomputed exactly now and then)
                for r, w in a.weights:
                    r._cls[c] = res[r] = res[r] - w
            else:
                c.drift = 0
                self._reweigh(c)
        else:
            c.alive = False
            c.version += 1  # its planned completions are void
            del self._classes[c.key]
            spare = self._spare
            if len(spare) >= 4096:
                spare.clear()
            spare[c.key] = c
            for r in c.res:
                del r._cls[c]
                if not r._cls:
                    r.bottleneck = False
            for r in c.side:
                del r._side_cls[c]
        seeded = False
        for r, _ in a.weights:
            if r.bottleneck:  # capacity freed on someone's bottleneck
                self._seed_res[r] = None
                seeded = True
        if seeded and x < self._floor:  # the fill below a's rate is unchanged without it
            self._floor = x
        a.rate = 0.0
        for r, _ in a.side:
            self._refresh_side_load(r, now)
        return seeded

    # -- internals: solving ---------------------------------------------------------------------
    def _available_changed(self, r: Resource, rose: bool = False) -> None:
        """``r.available()`` changed (``rose``: it grew): re-solve unless no rate can change."""
        if not r._cls:
            return
        if self._deferred is not None:  # a solve is applying its rates: judge when it is done
            self._deferred[r] = None
            return
        if not r.bottleneck:
            load = 0.0
            for c, w in r._cls.items():
                load += w * c.rate
            if load <= r.available():  # still fits and is no one's bottleneck: rates stand
                return
            self._floor = 0.0
        elif rose:  # a bottleneck got room: the fill below its level is unchanged
            top = 0.0
            for c in r._cls:
                if c.rate > top:
                    top = c.rate
            if top < self._floor:
                self._floor = top
        else:
            self._floor = 0.0
        self._seed_res[r] = None
        self._request_solve()

    def _request_solve(self) -> None:
        if not self._solve_pending:
            self._solve_pending = True
            # A zero-delay event runs after everything already scheduled for this instant, so
            # simultaneous starts and ends are solved once.
            self.env.timeout(0).callbacks.append(self._solve_dirty)

    def _solve_dirty(self, _ev: object = None) -> None:  # noqa: C901
        self._solve_pending = False
        now = self.env.now
        seed_res, seed_cls = self._seed_res, self._seed_cls
        self._seed_res, self._seed_cls = {}, {}
        # When every change only freed capacity (ends, bottlenecks given room), the progressive fill
        # below the lowest rate involved is unchanged (the water level rises the same way up to it):
        # classes slower than that floor keep their rates and stay out of the closure.
        floor = self._floor
        self._floor = _INF
        lo = floor * (1 - 1e-12) if 0 < floor < _INF else None
        S: dict[_Class, None] = {}
        T: dict[Resource, None] = {}
        A: dict[Resource, None] = {}  # the constraints the fill applies
        grow_r = [r for r in seed_res if r._cls]
        for r in grow_r:
            T[r] = None
        grow_c = [c for c in seed_cls if c.alive]
        for c in grow_c:  # new members: any of the class's resources may now bind
            S[c] = None
            for r in c.res:
                A[r] = None
        several = len(seed_res) + len(seed_cls) > 1  # one seed: its closure is connected
        TS = T if lo is None else {}  # resources whose every user is in S (for _fill's shortcut)
        while True:
            _closure(S, T, grow_r, grow_c, lo)
            if not S:
                return
            A.update(T)
            if several:  # unrelated changes at one instant (e.g. the same kernel on every GPU)
                parts = _parts(S, A)
                if len(parts) == 1:
                    rates, popped = _fill(S, TS, A)
                else:
                    rates, popped = {}, {}
                    for part, used in parts:
                        r1, p1 = _fill(part, TS, used)
                        rates.update(r1)
                        popped.update(p1)
            else:
                parts = [(S, A)]
                rates, popped = _fill(S, TS, A)
            # A resource outside T saturated in the fill, and a class outside the closure runs
            # faster on it: that class must slow down too -- widen the closure and fill again.
            for r, share in popped.items():
                if r in T:
                    continue
                lim = share * (1 + 1e-12)
                for c in r._cls:
                    if c.rate > lim and c not in S:
                        grow_r.append(r)
                        T[r] = None
                        break
            # A class that speeds up may overload a resource the fill did not apply (one that was no
            # one's bottleneck): apply it and fill again.
            inc: dict[Resource, float] = {}
            for c in S:
                d = rates[c] - c.rate
                if d > 0:
                    for r, w in c.res.items():
                        if r not in A:
                            inc[r] = inc.get(r, 0.0) + w * d
            over = False
            for r, x in inc.items():
                if r.load + x > r.capacity - r.side_load:
                    A[r] = None
                    over = True
            if not grow_r and not over:
                break
        self.solves += len(parts)
        n = 0
        for c in S:
            n += len(c.members)
        self.solved_activities += n
        for r in A:
            r.bottleneck = r in popped
        # Side loads move with the new rates; whether that matters is judged once all are applied.
        self._deferred = deferred = self._dbuf
        for c in S:
            new = rates[c]
            if new != c.rate:
                self._set_class_rate(c, new, now)
        self._deferred = None
        if deferred:
            changed = list(deferred)
            deferred.clear()
            for r in changed:
                self._available_changed(r)

    def _set_class_rate(self, c: _Class, new: float, now: float) -> None:
        """Change class ``c``'s rate now: settle each member's progress, update the loads the class
        puts on resources, re-plan its completions."""
        old = c.rate
        c.rate = new
        tmin = _INF
        for m in c.members:
            if old:
                m.remaining -= old * (now - m._last)
            m._last = now
            m.rate = new
            if new > 0:
                rem = m.remaining
                t = now + (rem if rem > 0 else 0.0) / new
                if t < tmin:
                    tmin = t
            else:
                t = _INF
            m._t = t
        delta = new - old
        record = self.record
        for r, w in c.res.items():  # _add_load(r, w * delta, now, record), inlined
            load = r.load
            side = r.side_load
            total_old = load + side
            r.carried += total_old * (now - r._last_t)
            r._last_t = now
            load += w * delta
            if load <= 0 or not r.users:
                load = 0.0
            r.load = load
            if record and load + side != total_old:
                tl = r.timeline
                if tl and tl[-1][0] == now:
                    tl[-1] = (now, load + side)
                else:
                    tl.append((now, load + side))
        for r in c.side:
            self._refresh_side_load(r, now)
        self._schedule_class(c, tmin)

    def _refresh_side_load(self, r: Resource, now: float) -> None:
        side = 0.0
        for c, w in r._side_cls.items():
            side += w * c.rate
        if side != r.side_load:
            rose = side < r.side_load
            self._set_load(r, r.load, side, now)
            self._available_changed(r, rose)

    def _set_load(self, r: Resource, load: float, side: float, now: float) -> None:
        total_old = r.load + r.side_load
        r.carried += total_old * (now - r._last_t)
        r._last_t = now
        r.load, r.side_load = load, side
        if self.record and load + side != total_old:
            tl = r.timeline
            if tl and tl[-1][0] == now:
                tl[-1] = (now, load + side)
            else:
                tl.append((now, load + side))

    # -- internals: completions -----------------------------------------------------------------
    def _schedule_class(self, c: _Class, t: float) -> None:
        """The next completion of a member of ``c`` is at ``t`` (s; inf: none planned)."""
        c.version += 1
        c.t_next = t
        if t == _INF:
            return
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, c.version, c))
        if t < self._wake_at:
            self._wake_at = t
            self._wake_gen += 1
            gen = self._wake_gen
            self.env.timeout(t - self.env.now).callbacks.append(lambda _ev: self._wake(gen))

    def _wake(self, gen: int) -> None:
        if gen != self._wake_gen:
            return
        now = self.env.now
        heap = self._heap
        self._wake_at = _INF
        limit = now + 1e-12 * max(1.0, now)
        solve = False
        while heap:
            t, _, ver, c = heap[0]
            if ver != c.version or not c.alive:
                heapq.heappop(heap)
                continue
            if t > limit:
                break
            heapq.heappop(heap)
            due = self._due  # (a list kept for this: fewer allocations)
            for m in c.members:
                if m._t <= limit:
                    due.append(m)
            for m in due:
                if self._finish(m):
                    solve = True
            due.clear()
            if c.alive:
                tmin = _INF
                for m in c.members:
                    if m._t < tmin:
                        tmin = m._t
                self._schedule_class(c, tmin)
        if solve:
            self._request_solve()
        if heap and heap[0][0] < self._wake_at:  # (re-planned classes above may have set a later wake)
            t = heap[0][0]
            self._wake_at = t
            self._wake_gen += 1
            gen = self._wake_gen
            self.env.timeout(max(t - now, 0.0)).callbacks.append(lambda _ev: self._wake(gen))


def _add_load(r: Resource, delta: float, now: float, record: bool) -> None:
    """``r.load += delta`` now (exactly 0 once no activity uses ``r``), with the byte counter and the
    timeline kept up to date (what ``FluidSystem._set_load`` does, inlined for the hot paths)."""
    load = r.load
    side = r.side_load
    total_old = load + side
    r.carried += total_old * (now - r._last_t)
    r._last_t = now
    load += delta
    if load <= 0 or not r.users:
        load = 0.0
    r.load = load
    if record and load + side != total_old:
        tl = r.timeline
        if tl and tl[-1][0] == now:
            tl[-1] = (now, load + side)
        else:
            tl.append((now, load + side))


def _merge(items: Iterable[tuple[Resource, float]], name: str) -> dict[Resource, float]:
    merged: dict[Resource, float] = {}
    for r, w in items:
        if not w > 0:
            raise ValueError(f"activity {name!r}: weight on {r.name!r} must be > 0, got {w!r}")
        if r in merged:
            merged[r] += w
        else:
            merged[r] = w
    return merged


def _closure(S: dict[_Class, None], T: dict[Resource, None], grow_r: list[Resource],
             grow_c: list[_Class], lo: float | None = None) -> None:
    """Close ``S`` (classes) and ``T`` (resources) in place: every user of a resource in ``T`` is in
    ``S`` (every user running at ``lo`` or faster, if given), and every bottleneck resource of a class
    in ``S`` is in ``T``. ``grow_r``/``grow_c`` are the members just added (consumed)."""
    while grow_r or grow_c:
        while grow_r:
            r = grow_r.pop()
            for c in r._cls:
                if c not in S and (lo is None or c.rate >= lo):
                    S[c] = None
                    grow_c.append(c)
        while grow_c:
            c = grow_c.pop()
            for r in c.res:
                if r.bottleneck and r not in T:
                    T[r] = None
                    grow_r.append(r)


def _bound_of(c: _Class) -> float:
    return c.bound


def _parts(S: dict[_Class, None], A: dict[Resource, None]
           ) -> list[tuple[dict[_Class, None], dict[Resource, None]]]:
    """``S`` split into the groups of classes linked through shared resources of ``A``, each with the
    resources of ``A`` it uses (each group is filled on its own: progressive filling of disjoint
    problems is independent)."""
    seen: dict[_Class, None] = {}
    parts = []
    for c in S:
        if c in seen:
            continue
        part = {c: None}
        used: dict[Resource, None] = {}
        seen[c] = None
        stack = [c]
        while stack:
            x = stack.pop()
            for r in x.res:
                if r in A and r not in used:
                    used[r] = None
                    for y in r._cls:
                        if y not in seen and y in S:
                            seen[y] = None
                            part[y] = None
                            stack.append(y)
        parts.append((part, used))
    return parts


def _fill(S: dict[_Class, None], T: dict[Resource, None], A: dict[Resource, None]  # noqa: C901
          ) -> tuple[dict[_Class, float], dict[Resource, float]]:
    """Progressive filling (SimGrid ``maxmin_solve``) over the classes ``S`` and the constraints
    ``A``, the classes outside ``S`` held at their rates: each resource offers what they leave of
    ``available()``. Every user of a resource in ``T`` (a subset of ``A``) is in ``S``; every class in
    ``S`` has a resource in ``A``.

    Returns:
        (class -> rate, resource -> fair share at which it was popped as a bottleneck).
    """
    if len(S) == 1:  # one class (e.g. the kernels of one GPU): the tightest of its bound and offers
        for c in S:
            best = c.bound
            arg = None
            for r, w in c.res.items():
                if r not in A:
                    continue
                a = r.capacity - r.side_load
                if r not in T:
                    for c2, w2 in r._cls.items():
                        if c2 is not c:
                            a -= w2 * c2.rate
                if a < 0:
                    a = 0.0
                x = a / w
                if x < best or x == best and arg is not None and r.index < arg.index:
                    best, arg = x, r
            if arg is None:
                return {c: best}, {}
            return {c: best}, {arg: best}
    usage: dict[Resource, float] = {}
    count: dict[Resource, int] = {}
    mine: dict[_Class, list[tuple[Resource, float]]] = {}  # each class's weights on A
    for r in A:
        u = 0.0
        n = 0
        for c, w in r._cls.items():
            if c in S:
                u += w
                n += 1
                cw = mine.get(c)
                if cw is None:
                    mine[c] = [(r, w)]
                else:
                    cw.append((r, w))
        if n:
            usage[r] = u
            count[r] = n
    # What a resource offers S is its available capacity less the load of the classes outside S. That
    # sum is taken lazily: a resource outside T enters the heap with a lower bound on its share (its
    # whole load taken off) and is summed exactly only if it reaches the top.
    rem: dict[Resource, float] = {}
    lazy: dict[Resource, None] = {}
    heap = []
    for r, u in usage.items():
        if r in T:
            a = r.capacity - r.side_load
            if a < 0:
                a = 0.0
        else:
            a = r.capacity - r.side_load - r.load
            lazy[r] = None
        rem[r] = a
        heap.append((a / u, r.index, r))
    heapq.heapify(heap)
    rates: dict[_Class, float] = {}
    popped: dict[Resource, float] = {}
    bounded = [c for c in S if c.bound != _INF]
    if len(bounded) > 1:
        bounded.sort(key=_bound_of)
    bi = 0
    nb = len(bounded)
    left = len(S)
    while left:
        share = _INF
        while heap:  # drop resources without unfixed users; refresh stale shares
            key, idx, r = heap[0]
            if not count[r]:
                heapq.heappop(heap)
                continue
            if r in lazy:  # the exact offer: others' load, then what S has been fixed at so far
                del lazy[r]
                a = r.capacity - r.side_load
                fixed = 0.0
                for c, w in r._cls.items():
                    if c not in S:
                        a -= w * c.rate
                    elif c in rates:
                        fixed += w * rates[c]
                if a < 0:
                    a = 0.0
                rem[r] = a - fixed
            cur = rem[r] / usage[r]
            if cur > key * (1 + 1e-12) + 1e-300:
                heapq.heapreplace(heap, (cur, idx, r))
                continue
            share = cur
            break
        while bi < nb and bounded[bi] in rates:
            bi += 1
        if bi < nb and bounded[bi].bound <= share:
            c = bounded[bi]
            fix = (c,)
            val = c.bound
        elif heap:
            r = heapq.heappop(heap)[2]
            val = share if share > 0 else 0.0
            popped[r] = val
            fix = [c for c in r._cls if c not in rates and c in S]  # type: ignore[assignment]
        else:  # cannot happen: every class in S has a resource in A
            for c in S:
                if c not in rates:
                    rates[c] = c.bound if c.bound != _INF else 0.0
            break
        for c in fix:
            rates[c] = val
            left -= 1
            for r2, w in mine[c]:
                rem[r2] -= w * val
                usage[r2] -= w
                count[r2] -= 1
    return rates, popped


def maxmin(acts: list[Activity], resources: Iterable[Resource]) -> dict[Activity, float]:
    """Weighted max-min fair rates by progressive filling (SimGrid ``maxmin_solve``), from scratch.

    The reference for the engine's incremental solves. Each resource ``r`` offers ``r.available()``;
    activity ``a`` consumes ``w[a, r] * x[a]`` on it. The result maximises the minimum rate, then the
    next, ...: repeatedly the resource with the smallest fair share ``remaining / sum(unfixed
    weights)`` saturates and its activities are fixed at that share; an activity whose ``rate_bound``
    is below the current share is fixed at its bound. ``acts`` must hold every activity on
    ``resources`` that constrains them (a connected component).

    Fixing activities at the smallest share can only raise the other resources' shares, so a lazy
    min-heap of shares (stale entries re-pushed when popped) finds each bottleneck in O(log R):
    O((R + W) log R) per solve for R resources and W weights.

    Returns:
        activity -> rate (work units per second); 0 for activities on a zero-capacity resource.
    """
    rem: dict[Resource, float] = {}
    usage: dict[Resource, float] = {}
    for r in resources:
        rem[r] = r.available()
        usage[r] = 0.0
    for a in acts:
        for r, w in a.weights:
            usage[r] += w
    heap = [(rem[r] / u, i, r) for i, (r, u) in enumerate(usage.items()) if u > _EPS]
    heapq.heapify(heap)
    seq = len(usage)  # past every index above: entries never tie on (share, seq)
    rates: dict[Activity, float] = {}
    bounded = sorted((a for a in acts if a.rate_bound is not None), key=lambda a: a.rate_bound)
    bi = 0
    left = len(acts)
    while left:
        share = math.inf
        while heap:  # drop resources without unfixed users; refresh stale shares
            key, _, r = heap[0]
            u = usage[r]
            if u <= _EPS:
                heapq.heappop(heap)
                continue
            cur = rem[r] / u
            if cur > key * (1 + 1e-12) + 1e-300:
                heapq.heapreplace(heap, (cur, seq, r))
                seq += 1
                continue
            share = cur
            break
        while bi < len(bounded) and bounded[bi] in rates:
            bi += 1
        if bi < len(bounded) and bounded[bi].rate_bound <= share:  # type: ignore[operator]
            fix = [bounded[bi]]
            val = bounded[bi].rate_bound
        elif heap:
            r = heapq.heappop(heap)[2]
            fix = [a for a in r.users if a not in rates]
            val = max(share, 0.0)
        else:  # only bounded activities on no constraining resource (cannot happen with weights)
            for a in acts:
                if a not in rates:
                    rates[a] = a.rate_bound or 0.0
            break
        for a in fix:
            rates[a] = val  # type: ignore[assignment]
            left -= 1
            for r2, w in a.weights:
                rem[r2] -= w * val  # type: ignore[operator]
                usage[r2] -= w
    return rates
