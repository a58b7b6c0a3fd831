"""A fluid (flow-level) model of contended resources on a SimPy clock.

Every contended thing in the machine -- a directed link, a GPU's HBM bandwidth, its pool of SMs -- is
a :class:`Resource` with a capacity per second. Everything that uses them -- a network transfer, a
collective, a kernel -- is an :class:`Activity`: an amount of work and, per resource, a weight (the
resource units it consumes per unit of work progress). Active activities share resources by weighted
**max-min fairness**, computed by progressive filling exactly as SimGrid's LMM solver
(``src/kernel/lmm/maxmin.cpp``, ``maxmin_solve``): find the most constrained resource, fix the
activities on it at its fair share, subtract, repeat; an activity whose own rate bound is lower than
its share is fixed at its bound first.

Rates are re-solved only when something changes (an activity starts or ends, a capacity changes), only
over the connected component of resources and activities the change touches (SimGrid's lazy
"selective update"), and all changes at one instant are batched into one solve. An activity first
pays its latency -- during which it loads nothing (SimGrid: "the latency is paid beforehand") -- and
then drains at its current rate.

*Side loads* give one-way coupling: an activity may declare resources it loads at ``w x rate`` without
being limited by them; that load is taken off the resource's capacity for everyone else. NCCL's HBM
traffic is modelled this way: a collective's speed is set by its links, and the HBM bandwidth it uses
is no longer available to kernels on that GPU. It keeps components GPU-local, which is what makes a
1,000-GPU simulation affordable (see ``docs/DESIGN.md``).

Units are the caller's, consistently: for links, work in bytes, capacity in bytes/s, weight in bytes
on the link per byte of progress.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Mapping

import simpy

_EPS = 1e-12


class Resource:
    """A shared capacity (a linear constraint ``sum(w_i * x_i) <= capacity``).

    Keeps a byte (unit) counter and, when recording, a step function of its load over time.
    """

    __slots__ = ("name", "capacity", "nominal_capacity", "users", "side_users", "load", "side_load",
                 "carried", "_last_t", "timeline", "meta")

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
                 "start_time", "active_time", "end_time", "_last", "_version", "tag")

    def __init__(self, env: simpy.Environment, name: str, work: float,
                 weights: tuple[tuple[Resource, float], ...],
                 side: tuple[tuple[Resource, float], ...], rate_bound: float | None) -> None:
        self.name = name
        self.work = work
        """Total units of work (bytes for a transfer, solo seconds for a kernel)."""
        self.remaining = work
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
        self._version = 0
        self.tag: object = None
        """Free slot for the caller."""

    def __repr__(self) -> str:
        return f"Activity({self.name!r}, remaining={self.remaining:g}, rate={self.rate:g})"


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
        self._dirty: set[Resource] = set()
        self._solve_pending = False
        self._heap: list[tuple[float, int, int, Activity]] = []
        self._seq = 0
        self._wake_at = math.inf
        self._wake_gen = 0
        self.solves = 0
        """Number of component solves so far (for benchmarks)."""
        self.solved_activities = 0
        """Sum over solves of the component sizes (activities), for benchmarks."""

    # -- building ---------------------------------------------------------------------------
    def add_resource(self, name: str, capacity: float, meta: object = None) -> Resource:
        """Create a resource with ``capacity`` units per second."""
        r = Resource(name, capacity, meta)
        r._last_t = self.env.now
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
        w = _merge(weights.items() if isinstance(weights, Mapping) else weights, name)
        s = _merge(side_loads.items(), name) if side_loads else ()
        if not w and rate_bound is None:
            raise ValueError(f"activity {name!r}: needs at least one resource or a rate_bound")
        act = Activity(self.env, name, float(work), w, s, rate_bound)
        if latency_s > 0:
            self.env.timeout(latency_s).callbacks.append(lambda _ev: self._join(act))
        else:
            self._join(act)
        return act

    def set_capacity(self, resource: Resource, capacity: float) -> None:
        """Change a resource's capacity now (e.g. SMs held by a communication kernel)."""
        if not capacity >= 0:
            raise ValueError(f"resource {resource.name!r}: capacity must be >= 0, got {capacity!r}")
        resource.capacity = float(capacity)
        self._mark(resource)

    def active(self) -> list[Activity]:
        """Activities currently draining (in no particular order)."""
        seen: dict[Activity, None] = {}
        for r in self.resources:
            for a in r.users:
                seen[a] = None
        return list(seen)

    # -- internals ------------------------------------------------------------------------------
    def _join(self, act: Activity) -> None:
        act.active_time = act._last = self.env.now
        if act.work <= _EPS:
            self._finish(act)
            return
        for r, w in act.side:
            r.side_users[act] = w
        if not act.weights:  # bounded only by itself: no solve needed
            act.rate = act.rate_bound  # type: ignore[assignment]
            self._schedule(act)
            for r, _ in act.side:
                self._refresh_side_load(r, self.env.now)
            return
        for r, w in act.weights:
            r.users[act] = w
            self._dirty.add(r)
        self._request_solve()

    def _mark(self, r: Resource) -> None:
        self._dirty.add(r)
        self._request_solve()

    def _request_solve(self) -> None:
        if not self._solve_pending:
            self._solve_pending = True
            # A zero-delay event runs after everything already scheduled for this instant, so
            # simultaneous starts and ends are solved once.
            self.env.timeout(0).callbacks.append(self._solve_dirty)

    def _solve_dirty(self, _ev: object = None) -> None:
        self._solve_pending = False
        now = self.env.now
        dirty = self._dirty
        while dirty:
            comp_res, comp_acts = self._component(dirty.pop())
            dirty -= comp_res
            if comp_acts:
                self._solve(comp_res, comp_acts, now)

    def _component(self, seed: Resource) -> tuple[set[Resource], list[Activity]]:
        """Resources and activities connected to ``seed`` through shared activities."""
        stack = [seed]
        res: set[Resource] = {seed}
        acts: dict[Activity, None] = {}
        while stack:
            r = stack.pop()
            for a in r.users:
                if a in acts:
                    continue
                acts[a] = None
                for r2, _ in a.weights:
                    if r2 not in res:
                        res.add(r2)
                        stack.append(r2)
        return res, list(acts)

    def _solve(self, comp_res: set[Resource], acts: list[Activity], now: float) -> None:
        self.solves += 1
        self.solved_activities += len(acts)
        if len(acts) == 1:  # alone on its resources: the tightest of its bound and capacities
            a = acts[0]
            new = math.inf if a.rate_bound is None else a.rate_bound
            for r, w in a.weights:
                v = r.available() / w
                if v < new:
                    new = v
            if new != a.rate:
                self._set_rate(a, new, now)
            return
        rates = maxmin(acts, comp_res)
        for a in acts:
            new = rates[a]
            if new != a.rate:
                self._set_rate(a, new, now)

    def _set_rate(self, a: Activity, new: float, now: float) -> None:
        """Change ``a``'s rate now: settle its progress, update the loads it puts on resources
        (incrementally), re-plan its completion."""
        old = a.rate
        if old:
            a.remaining -= old * (now - a._last)
        a._last = now
        a.rate = new
        delta = new - old
        for r, w in a.weights:
            load = r.load + w * delta
            self._set_load(r, load if load > 0 and r.users else 0.0, r.side_load, now)
        for r, _w in a.side:
            self._refresh_side_load(r, now)
        self._schedule(a)

    def _refresh_side_load(self, r: Resource, now: float) -> None:
        side = sum(w * a.rate for a, w in r.side_users.items())
        if side != r.side_load:
            self._set_load(r, r.load, side, now)
            if r.users:  # only constrained users care about the capacity left
                self._mark(r)

    def _set_load(self, r: Resource, load: float, side: float, now: float) -> None:
        total_old = r.load + r.side_load
        r.carried += total_old * (now - r._last_t)
        r._last_t = now
        r.load, r.side_load = load, side
        if self.record and load + side != total_old:
            if r.timeline and r.timeline[-1][0] == now:
                r.timeline[-1] = (now, load + side)
            else:
                r.timeline.append((now, load + side))

    def _schedule(self, a: Activity) -> None:
        a._version += 1
        if a.rate <= 0:
            return
        t = self.env.now + max(a.remaining, 0.0) / a.rate
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, a._version, a))
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
        self._wake_at = math.inf
        while heap:
            t, _, ver, a = heap[0]
            if ver != a._version or a.end_time is not None:
                heapq.heappop(heap)
                continue
            if t > now + 1e-12 * max(1.0, now):
                break
            heapq.heappop(heap)
            a.remaining = 0.0
            self._finish(a)
        if heap:
            t = heap[0][0]
            self._wake_at = t
            self._wake_gen += 1
            gen = self._wake_gen
            self.env.timeout(max(t - now, 0.0)).callbacks.append(lambda _ev: self._wake(gen))

    def _finish(self, a: Activity) -> None:
        now = self.env.now
        a.end_time = now
        a._version += 1
        a.remaining = 0.0
        rate = a.rate
        for r, w in a.weights:
            r.users.pop(a, None)
            load = r.load - w * rate
            self._set_load(r, load if load > 0 and r.users else 0.0, r.side_load, now)
            self._dirty.add(r)
        a.rate = 0.0
        for r, _ in a.side:
            r.side_users.pop(a, None)
            self._refresh_side_load(r, now)
        if a.weights:
            self._request_solve()
        a.done.succeed(a)


def _merge(items: Iterable[tuple[Resource, float]], name: str) -> tuple[tuple[Resource, float], ...]:
    merged: dict[Resource, float] = {}
    for r, w in items:
        if not w > 0:
            raise ValueError(f"activity {name!r}: weight on {r.name!r} must be > 0, got {w!r}")
        merged[r] = merged.get(r, 0.0) + w
    return tuple(merged.items())


def maxmin(acts: list[Activity], resources: Iterable[Resource]) -> dict[Activity, float]:
    """Weighted max-min fair rates by progressive filling (SimGrid ``maxmin_solve``).

    Each resource ``r`` offers ``r.available()``; activity ``a`` consumes ``w[a, r] * x[a]`` on it.
    The result maximises the minimum rate, then the next, ...: repeatedly the resource with the
    smallest fair share ``remaining / sum(unfixed weights)`` saturates and its activities are fixed at
    that share; an activity whose ``rate_bound`` is below the current share is fixed at its bound.

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
    seq = len(heap)
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
