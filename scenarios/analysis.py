"""From a run's trace to the numbers people read: time breakdown, overlap and contention.

Per rank, over the iteration ``[0, T]``:

* ``compute_s``: time with at least one compute kernel running (union of kernel intervals);
* ``exposed_comm_s``: time moving data (collectives, send/recv, copies) with no kernel running.
  A communication task counts from when its data started to move -- time spent waiting for peers is
  not communication;
* ``bubble_s``: with pipeline parallelism, time with nothing running from the start of the iteration
  to the end of the rank's last forward/backward kernel (waiting on other stages; the warm-up wait
  of a later stage before its first forward counts as bubble);
* ``idle_s``: the rest (host launch gaps, waiting for peers outside the pipeline, head and tail).

A macro task of the hierarchical engine (kind ``macro``: one layer pass) stands for kernels *and* the
layer's tensor/context-parallel collectives. Its ``info`` (a :class:`hwmodel.events.MacroInfo`)
carries the pass's split measured in the engine's step 1 (:class:`scenarios.hierarchical.PassProfile`);
it is laid out inside the task's interval, scaled to its actual duration: compute from the start, the
exposed communication right after it, the hidden communication overlapping the end of the compute part.
So the breakdown counts TP communication as communication, as a per-op run does (where inside the pass
it lies is not known; only the amounts are).

They add up to ``T``. Overlap statistics: the share of communication time hidden under compute, and
how much contention slowed compute: sum of (actual - solo) kernel time over the sum of solo time,
where *solo* is the cost model's time for the kernel alone on an idle GPU.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from hwmodel.dtypes import TRAINING_DTYPES
from hwmodel.events import CollectiveInfo, KernelInfo, MacroInfo, TraceEvent

COMM_PREFIXES = ("nccl:", "send", "recv", "memcpy")


def is_comm(ev: TraceEvent) -> bool:
    return ev.category.startswith(COMM_PREFIXES)


def _merge(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for a, b in sorted(intervals):
        if b <= a:
            continue
        if out and a <= out[-1][1]:
            if b > out[-1][1]:
                out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out


def _length(iv: Iterable[tuple[float, float]]) -> float:
    return sum(b - a for a, b in iv)


def _intersect(x: list[tuple[float, float]], y: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out, i, j = [], 0, 0
    while i < len(x) and j < len(y):
        a, b = max(x[i][0], y[j][0]), min(x[i][1], y[j][1])
        if a < b:
            out.append((a, b))
        if x[i][1] < y[j][1]:
            i += 1
        else:
            j += 1
    return out


@dataclass(frozen=True)
class RankBreakdown:
    """Where one rank's iteration time went, in seconds (the four parts sum to the iteration)."""

    compute_s: float
    exposed_comm_s: float
    bubble_s: float
    idle_s: float
    comm_total_s: float
    comm_hidden_s: float

    def as_dict(self) -> dict[str, float]:
        return {"compute_s": self.compute_s, "exposed_comm_s": self.exposed_comm_s,
                "bubble_s": self.bubble_s, "idle_s": self.idle_s}


def macro_intervals(ev: TraceEvent) -> tuple[tuple[float, float], tuple[float, float] | None]:
    """(compute interval, communication interval or ``None``) of a hierarchical macro task (see the
    module docstring); a task without a split is all compute."""
    info = ev.info
    if ev.category != "macro" or not isinstance(info, MacroInfo) or info.pass_time_s <= 0:
        return (ev.start_s, ev.end_s), None
    compute, exposed, hidden = info.pass_compute_s, info.pass_exposed_comm_s, info.pass_hidden_comm_s
    k = (ev.end_s - ev.start_s) / info.pass_time_s
    c_end = min(ev.start_s + compute * k, ev.end_s)
    comm = (c_end - hidden * k, min(c_end + exposed * k, ev.end_s))
    return (ev.start_s, c_end), (comm if comm[1] > comm[0] else None)


def _rank_intervals(events: Iterable[TraceEvent]) -> tuple[dict[int, list], dict[int, list], dict[int, list[float]]]:
    """Per rank: compute intervals, communication intervals (from when data moved) and the span of its
    forward/backward kernels, as :func:`breakdown` counts them."""
    comp: dict[int, list] = defaultdict(list)
    comm: dict[int, list] = defaultdict(list)
    pipe_span: dict[int, list[float]] = {}
    for ev in events:
        if is_comm(ev):
            start = ev.xfer_start_s if ev.xfer_start_s is not None else ev.start_s
            comm[ev.rank].append((start, ev.end_s))
        else:
            busy, moving = macro_intervals(ev)
            comp[ev.rank].append(busy)
            if moving is not None:
                comm[ev.rank].append(moving)
            if ev.phase in ("fwd", "bwd"):
                span = pipe_span.setdefault(ev.rank, [ev.start_s, ev.end_s])
                span[0] = min(span[0], ev.start_s)
                span[1] = max(span[1], ev.end_s)
    return comp, comm, pipe_span


def breakdown(events: Iterable[TraceEvent], iteration_s: float, *, pipeline: bool) -> dict[int, RankBreakdown]:
    """Per-rank :class:`RankBreakdown` of the iteration ``[0, iteration_s]``."""
    comp, comm, pipe_span = _rank_intervals(events)
    out = {}
    for rank in sorted(set(comp) | set(comm)):
        c = _merge(comp[rank])
        m = _merge(comm[rank])
        both = _intersect(c, m)
        compute = _length(c)
        comm_total = _length(m)
        hidden = _length(both)
        exposed = comm_total - hidden
        busy = _merge(c + m)
        gaps_total = max(iteration_s - _length(busy), 0.0)
        bubble = 0.0
        if pipeline and rank in pipe_span:
            hi = pipe_span[rank][1]
            lo = 0.0
            bubble = max((hi - lo) - _length(_intersect(busy, [(lo, hi)])), 0.0)
        out[rank] = RankBreakdown(compute, exposed, bubble, max(gaps_total - bubble, 0.0), comm_total, hidden)
    return out


def window_breakdown(events: Iterable[TraceEvent], windows: dict[int, tuple[float, float]]) -> dict[int, RankBreakdown]:
    """Per rank, what :func:`breakdown` would count inside ``windows[rank] = (start_s, end_s)``, a window
    that lies between the rank's first and last forward/backward kernel: a gap there is pipeline bubble,
    never idle (so ``idle_s`` is 0). Used to measure one steady pipeline period inside a run
    (:mod:`scenarios.steady_state`); the four parts add up to the window's length."""
    comp, comm, _ = _rank_intervals(events)
    out = {}
    for rank, (a, b) in windows.items():
        w = [(a, b)]
        c = _intersect(_merge(comp[rank]), w)
        m = _intersect(_merge(comm[rank]), w)
        compute, comm_total, hidden = _length(c), _length(m), _length(_intersect(c, m))
        bubble = max((b - a) - _length(_merge(c + m)), 0.0)
        out[rank] = RankBreakdown(compute, comm_total - hidden, bubble, 0.0, comm_total, hidden)
    return out


@dataclass(frozen=True)
class OverlapStats:
    """How much communication hid under compute, and how much contention slowed compute."""

    comm_hidden_fraction: float
    """Communication time overlapped with compute / all communication time (0..1)."""
    compute_slowdown: float
    """sum(actual - solo kernel time) / sum(solo kernel time): 0.1 means kernels ran 10 % slower than
    alone because of SM and HBM sharing. Exactly 0 where the two sums differ by no more than their
    rounding (``n`` kernels: ``n`` float epsilons of the sum), not a -5e-16 of summation noise."""
    kernels: int


def overlap_stats(events: Iterable[TraceEvent], per_rank: dict[int, RankBreakdown]) -> OverlapStats:
    """:class:`OverlapStats` of a run: communication from ``per_rank`` (:func:`breakdown`), slowdown
    over the kernels whose event carries a :class:`hwmodel.events.KernelInfo` (macro tasks included:
    their solo time is the pass's step-1 duration)."""
    solo = actual = 0.0
    n = 0
    for ev in events:
        if not is_comm(ev) and isinstance(ev.info, KernelInfo):
            solo += ev.info.solo_time_s
            actual += ev.end_s - ev.start_s
            n += 1
    total = sum(b.comm_total_s for b in per_rank.values())
    hidden = sum(b.comm_hidden_s for b in per_rank.values())
    slower = actual - solo
    if abs(slower) <= n * sys.float_info.epsilon * max(actual, solo):  # summation noise, not a slowdown
        slower = 0.0
    return OverlapStats(hidden / total if total else 0.0, slower / solo if solo else 0.0, n)


LATENCY_BOUND_SHARE = 0.5
"""A collective is *latency-bound* where NCCL's latency term (:attr:`hwmodel.events.CollectiveInfo.latency_s`)
is at least this share of the time its data moved (peers' arrival to its end)."""
LATENCY_BOUND_MIN_SHARE_OF_ITERATION = 0.05
"""...and the report names it only where its moving time is at least this share of the iteration."""


@dataclass(frozen=True)
class LatencyBound:
    """Collectives of one rank with one plan shape (operation, communicator size, algorithm, protocol) whose
    time is mostly NCCL's per-step latency: ``names`` (the events', in order; gradient buckets are one
    each), ``count`` launches, ``moving_s`` summed from every peer's arrival to the end, ``latency_s`` of it
    the plans' latency terms (each at most its launch's moving time), and the last launch's ``info``."""

    names: tuple[str, ...]
    op: str
    count: int
    moving_s: float
    latency_s: float
    info: CollectiveInfo


def latency_bound(events: Iterable[TraceEvent], rank: int, iteration_s: float) -> list[LatencyBound]:
    """The latency-bound collectives of ``rank`` (:data:`LATENCY_BOUND_SHARE`), grouped by plan shape,
    that take at least :data:`LATENCY_BOUND_MIN_SHARE_OF_ITERATION` of ``iteration_s``, longest first: a
    data-parallel ring of many ranks moves small chunks in ``2 (n - 1)`` steps, each paying NCCL's step
    latency."""
    by: dict[tuple, list] = {}
    for ev in events:
        info = ev.info
        if ev.rank != rank or not isinstance(info, CollectiveInfo) or info.latency_s <= 0:
            continue
        moving = ev.end_s - (ev.xfer_start_s if ev.xfer_start_s is not None else ev.start_s)
        op = ev.category.removeprefix("nccl:")
        d = by.setdefault((op, info.ranks, info.algorithm, info.protocol), [{}, op, 0, 0.0, 0.0, info])
        d[0][ev.name] = None
        d[2] += 1
        d[3] += moving
        d[4] += min(info.latency_s, moving)
        d[5] = info
    out = [LatencyBound(tuple(d[0]), *d[1:]) for d in by.values()
           if d[3] >= LATENCY_BOUND_MIN_SHARE_OF_ITERATION * iteration_s and d[4] >= LATENCY_BOUND_SHARE * d[3]]
    return sorted(out, key=lambda lb: (-lb.moving_s, lb.names))


def mfu_peak_dtype(dtype: str) -> str:
    """The tensor-core peak MFU is taken against for a training dtype: its own, ``tf32`` for fp32
    (tensor-core math of fp32 training), and ``bf16`` for fp8. FP8 training runs only the Linear
    GEMMs in FP8 (:mod:`workload.fp8`); MFU against the bf16 peak keeps bf16 and fp8 runs of one model
    comparable (the ratio of their MFUs is the speed-up) where the fp8 peak would halve it."""
    return TRAINING_DTYPES[dtype].mfu_peak_key if dtype in TRAINING_DTYPES else dtype
