"""The steady pipeline period: simulate a few micro-batches, extrapolate the rest exactly.

In the steady phase of a pipeline schedule every micro-batch does the same simulated work: 1F1B
alternates one forward and one backward per stage (Narayanan et al. SC'21 §2.2.1), the interleaved
schedule repeats a block of ``p`` micro-batches over its ``v`` chunks (§2.2.2), and data-parallel
gradient accumulation (no pipeline) repeats one micro-batch. Warm-up, cool-down, the last
micro-batch's gradient reduction and the optimizer step happen once whatever the count. So from the
micro-batch count ``m`` on, once the schedule is in its steady state, every additive quantity of an
iteration is affine in ``m``:

    X(m) = X(m2) + (m - m2) (X(m2) - X(m1)) / (m2 - m1)

for two simulated counts ``m1 < m2`` in the steady regime with ``m2 - m1`` a whole number of periods
(:func:`plan_for` chooses them by rule, never per scenario). Additive: the iteration time, each rank's
finish time, compute / exposed communication / bubble / idle / communication seconds
(:class:`scenarios.analysis.RankBreakdown`), each link's carried bytes and the task count. A link's
mean utilisation is then its bytes over capacity x extrapolated time; ratios -- peak link utilisation,
the compute slowdown from contention -- are the ``m2`` run's. Memory (analytic, for the real ``m``:
GPipe's depends on it) and FLOPs come from the real configuration, as for any run
(:func:`scenarios.metrics.run_metrics`).

With a pipeline (1F1B, interleaved) the increment over ``SteadyPlan.window`` micro-batches is measured
inside the ``m2`` run instead (:func:`steady_window`: the interleaved schedule's first stage has 1.5
periods of steady phase at ``m2 >= 3p``, 1F1B's ``p + 1`` forwards at ``m2 >= 2p``, room for half a
period), and ``m1`` is simulated only where that run's steady phase does not repeat to
:data:`PERIOD_RTOL` (a pipeline still settling; the hierarchical engine's deep pipelines repeat to float
rounding). One run instead of two.

``[simulation] steady_state = "auto"`` (default) extrapolates where :func:`plan_for` applies,
``"off"`` simulates every micro-batch. The ``m2`` run is what ``--trace`` and ``--plots`` draw
(``RunReport.simulated``). Measured against the full simulation in ``docs/DESIGN.md``; tested in
``tests/scenarios/test_steady_state.py``.
"""

from __future__ import annotations

import dataclasses
import math
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Any, cast

from hwmodel.runtime import RunResult
from scenarios.analysis import RankBreakdown, is_comm, window_breakdown
from scenarios.metrics import run_metrics

__all__ = ["MIN_MICROBATCHES", "MIN_PIPELINE_M1", "PERIOD_RTOL", "STEADY_M1_PIPELINES", "SteadyPlan", "SteadyWindow",
           "extrapolated", "plan_for", "steady_window"]

MIN_MICROBATCHES = 32
"""Fewer micro-batches per pipeline than this are simulated in full (the saving would be small)."""
MIN_PIPELINE_M1 = 16
"""The fewest micro-batches of the smaller simulated count with a pipeline. Two stages that differ (the
embedding on the first, the loss on the last) and share the fabric with data-parallel traffic settle
into their period slowly: sc21-gpt-39b (PP 2, v 2, DP 32) gains 0.288362, 0.288560, 0.288678 s per
micro-batch from 12 to 24 micro-batches against 0.288741 s from 48 on, so (4, 8) missed its 48-micro-batch
iteration by 0.26 % and rank 0's bubble by 0.5 % of the iteration; from 16 on the miss is < 0.05 %."""
STEADY_M1_PIPELINES = 2
"""The smaller simulated count is at least this many pipelines' worth (``2p``) with the interleaved
schedule (and GPipe, not measured at ``p``); with 1F1B one pipeline's worth (``p``) is steady (measured
at PP 16 to 64 in ``tests/scenarios/test_steady_state_deep.py``). Interleaved, at ``m = p`` the iteration
time is already on the steady line (PP 16 x DP 2 on A100, v 2: 0.234897 s per 16 micro-batches from 16
to 80, to 1e-9), but the first stages, whose warm-up then covers every forward, hold SMs for posted
receives longer: rank 0 computed 0.1840 s more from 16 to 32 micro-batches against 0.1894 s per period
from 32 on, so (16, 32) missed its compute at 80 by 1.3 % of the iteration, and (32, 48) by 1e-6."""


PERIOD_RTOL = 1e-6
"""The period measured inside one run (:func:`steady_window`) is used only where every simulated rank's
steady phase repeats with it to this relative tolerance; otherwise the ``m1`` run is simulated too."""


@dataclass(frozen=True)
class SteadyPlan:
    """Which micro-batch counts to simulate for an iteration of ``of`` micro-batches per pipeline."""

    simulated: tuple[int, int]
    """``(m1, m2)``: both in the steady regime, ``m2 - m1`` a whole number of periods, ``m1 = of`` mod it."""
    of: int
    period: str
    """What repeats, for the report: "1F1B", "interleaved 1F1B", "GPipe" or "gradient accumulation"."""
    window: int = 0
    """Micro-batches whose increment is measured inside the ``m2`` run (:func:`steady_window`) instead of
    simulating ``m1`` (0: none). The interleaved schedule: ``m2 - m1`` (its first stage has 1.5 periods of
    steady phase at ``m2 = 3p``); 1F1B, which repeats every micro-batch: half a period (its first stage has
    ``m2 - p + 1 >= p + 1`` forwards in its steady phase). The ``m1`` run is simulated where the window does
    not fit or repeat."""

    @property
    def cost_microbatches(self) -> int:
        """Micro-batches simulated (``m2`` alone with a window that fits)."""
        m1, m2 = self.simulated
        return m2 if self.window else m1 + m2


def plan_for(cfg: Any, simulation: dict[str, Any]) -> SteadyPlan | None:
    """The counts to simulate for the resolved :class:`workload.parallel.config.ParallelConfig` ``cfg``,
    or ``None``: ``steady_state = "off"``, or too few micro-batches for a saving.

    The rule (the same for every scenario): a period is ``p`` micro-batches (the interleaved schedule's
    block; 1F1B and GPipe repeat each micro-batch, but the same ``p`` keeps each stage's phase), at
    least 4 micro-batches. ``m1`` is the smallest count congruent to ``m`` modulo the period that is
    >= ``p`` with 1F1B (the warm-up of stage ``s`` is ``p - s - 1`` forwards: from ``p`` on every stage
    has a steady phase) and >= ``2p`` otherwise (interleaved, the warm-up ``2(p - s - 1) + (v - 1)p``
    virtual micro-batches, covers all ``vp`` of the first stages at ``m = p``: the iteration time is then
    already on the steady line, but their compute / bubble split is not -- :data:`STEADY_M1_PIPELINES`),
    and, with a pipeline, >= 16 (:data:`MIN_PIPELINE_M1`); ``m2 = m1 + period``. It applies when
    ``m >= MIN_MICROBATCHES`` and ``m1 + m2 < 3m / 4``: over a quarter fewer micro-batches, since each run
    has its fixed costs (the hierarchical engine's step 1, the metrics); sc21-gpt-39b's 16 + 20 of 48 was
    no faster."""
    if simulation.get("steady_state", "auto") == "off":
        return None
    p, m = cfg.pp, cfg.num_microbatches
    period = p * -(-4 // p)  # whole pipelines' worth, at least 4 micro-batches
    pipelines = 1 if cfg.schedule == "1f1b" else STEADY_M1_PIPELINES
    m1 = max(pipelines * p, MIN_PIPELINE_M1 if p > 1 else 4)
    m1 += (m - m1) % period
    m2 = m1 + period
    if m < MIN_MICROBATCHES or 4 * (m1 + m2) >= 3 * m:
        return None
    if p == 1:
        what = "gradient accumulation"
    else:
        what = {"interleaved_1f1b": "interleaved 1F1B", "gpipe": "GPipe"}.get(cfg.schedule, "1F1B")
    window = 0 if p == 1 or cfg.schedule == "gpipe" else period if cfg.schedule == "interleaved_1f1b" else \
        period // 2 if period % 2 == 0 else 0
    return SteadyPlan((m1, m2), m, what, window)


def extrapolated(prep: Any, plan: SteadyPlan, flops: tuple[float, float, str],
                 simulate: Callable[[Any], Any]) -> Any:
    """The :class:`scenarios.runner.RunReport` of ``prep``'s iteration, from ``simulate`` (the runner's
    simulation of a prepared scenario, in the real run's mode) at ``plan.simulated``.

    Args:
        prep: the real :class:`scenarios.runner.Prepared`; each simulated count runs it with only
            ``global_batch_size`` changed (``micro_batch_size x dp x count``), the ``m1`` run also without
            link timelines (``record_links = false``: only its links' carried bytes are read). With
            ``plan.window`` the ``m2`` run keeps link timelines (the window's link bytes are read from
            them; dropped afterwards where the scenario does not record them) and ``m1`` runs only where
            :func:`steady_window` finds no repeating window.
        plan: from :func:`plan_for`.
        flops: the real configuration's ``(model, hardware FLOPs, formula)``.
        simulate: ``Prepared -> RunReport``.

    Returns:
        A report whose ``result`` is the extrapolated iteration (the ``m2`` run's events, a cluster view
        of extrapolated links) and ``simulated`` the ``m2`` run; its metrics carry
        ``simulation.steady_state``.
    """
    cfg, scenario = prep.config, prep.scenario
    (m1, m2), m = plan.simulated, plan.of

    def sub_run(count: int, record_links: bool | None) -> Any:
        sub = dataclasses.replace(cfg, global_batch_size=count * cfg.micro_batch_size * cfg.dp)
        run = dataclasses.replace(prep, config=sub)
        if record_links is not None:
            run = dataclasses.replace(run, scenario=dataclasses.replace(
                scenario, simulation={**scenario.simulation, "record_links": record_links}))
        return simulate(run)

    records = bool(scenario.simulation.get("record_links", True))
    last = sub_run(m2, True if plan.window and not records else None)
    r2 = last.result
    window = steady_window(r2, m2, plan.window, pipeline=cfg.pp > 1) if plan.window else None
    if not records and plan.window:
        for lk in r2.cluster.link_resources():  # (recorded for the window only)
            lk.timeline.clear()

    span = plan.window if window is not None else m2 - m1

    def grow(x2: float, dx: float) -> float:  # X(m) from X(m2) and the increment over ``span`` micro-batches
        return x2 + (m - m2) * dx / span

    if window is not None:
        d_end = window.period_s
        d_rank = {r: dataclasses.astuple(b) for r, b in window.per_rank.items()}
        d_links = window.link_bytes
        d_tasks = float(window.tasks)
        solves = last.metrics["simulation"]["fluid_solves"]
        simulated = [m2]
    else:  # only its links' carried bytes are read, which do not need timelines
        first = sub_run(m1, False)
        r1 = first.result
        d_end = r2.end_time_s - r1.end_time_s
        d_rank = {r: tuple(getattr(b, f.name) - getattr(first.per_rank[r], f.name)
                           for f in dataclasses.fields(RankBreakdown)) for r, b in last.per_rank.items()}
        before = {lk.name: float(lk.carried) for lk in r1.cluster.link_resources()}
        d_links = {lk.name: float(lk.carried) - before.get(lk.name, 0.0) for lk in r2.cluster.link_resources()}
        d_tasks = last.metrics["simulation"]["tasks"] - first.metrics["simulation"]["tasks"]
        solves = first.metrics["simulation"]["fluid_solves"] + last.metrics["simulation"]["fluid_solves"]
        simulated = [m1, m2]
        d_rank_end = {r: t - r1.rank_end_s.get(r, 0.0) for r, t in r2.rank_end_s.items()}
    end_s = grow(r2.end_time_s, d_end)
    rank_end = {r: grow(t, d_end if window is not None else d_rank_end[r]) for r, t in r2.rank_end_s.items()}
    result = RunResult(end_s, rank_end, r2.events, cast(Any, ExtrapolatedCluster(r2.cluster, d_links, grow)),
                       r2.placement, dict(r2.stats))
    per_rank = {r: RankBreakdown(*(grow(x2, dx) for x2, dx in zip(dataclasses.astuple(b), d_rank[r], strict=True)))
                for r, b in last.per_rank.items()}
    report = dataclasses.replace(last, prepared=prep, result=result, per_rank=per_rank, simulated=r2)
    report.metrics = run_metrics(report, flops)
    sim = report.metrics["simulation"]
    sim["tasks"] = round(grow(last.metrics["simulation"]["tasks"], d_tasks))
    sim["fluid_solves"] = solves
    sim["steady_state"] = {"simulated_microbatches": simulated, "of": m, "period": plan.period}
    if window is not None:
        sim["steady_state"]["window_microbatches"] = plan.window
    if "warnings" in last.metrics:
        report.metrics["warnings"] = list(last.metrics["warnings"])
    return report


@dataclass(frozen=True)
class SteadyWindow:
    """One steady period measured inside a run: its length and what each simulated rank, each link
    and the programs add over it."""

    period_s: float
    """Simulated seconds the iteration grows by per period (``count`` micro-batches)."""
    per_rank: dict[int, RankBreakdown]
    """Each rank's breakdown over its own window of ``period_s`` (:func:`scenarios.analysis.window_breakdown`)."""
    link_bytes: dict[str, float]
    """Each used link's bytes over one window of ``period_s`` in which every rank is steady."""
    tasks: int
    """Tasks per period, summed over the simulated ranks."""


def steady_window(result: RunResult, microbatches: int, count: int, *, pipeline: bool = True
                  ) -> SteadyWindow | None:
    """What ``count`` more micro-batches add to a run of ``microbatches`` per pipeline, measured inside
    it, or ``None`` where no window fits or the steady phase does not repeat.

    A rank's *steady phase* runs from the start of its first backward kernel to the end of its last
    forward one (forwards and backwards alternate; before it the warm-up, after it the cool-down).
    Each rank runs the same forward tasks per micro-batch, so ``count`` micro-batches are ``k`` of its
    forward kernels; in the middle of its steady phase the start of forward ``i + k`` minus that of
    forward ``i`` is the period (the rank with the most room gives it), and the task-id difference its
    tasks per period. Every rank's must agree within :data:`PERIOD_RTOL` (the schedule repeats), and
    each rank's window ``[start of forward i, + period]`` is counted like the whole run
    (:func:`scenarios.analysis.window_breakdown`). The links are integrated over one period centred in
    the time every rank is steady (their traffic then repeats too).

    Args:
        result: the simulated run (its ``cluster`` keeps link timelines).
        microbatches: micro-batches per pipeline it simulated.
        count: micro-batches of the increment (a whole number of schedule periods).
        pipeline: ``False`` without a pipeline (no steady phase to find: ``None``).
    """
    if not pipeline:
        return None
    fwd: dict[int, list[tuple[float, float, int]]] = {r: [] for r in result.rank_end_s}
    first_bwd: dict[int, float] = {}
    for ev in result.events:
        if ev.phase == "fwd" and not is_comm(ev):
            fwd.setdefault(ev.rank, []).append((ev.start_s, ev.end_s, ev.task_id))
        elif ev.phase == "bwd" and not is_comm(ev) and ev.start_s < first_bwd.get(ev.rank, float("inf")):
            first_bwd[ev.rank] = ev.start_s
    pairs: dict[int, tuple[int, tuple[float, int], tuple[float, int]]] = {}
    spans: dict[int, tuple[float, float]] = {}
    for rank, events in fwd.items():
        if not events or rank not in first_bwd or len(events) % microbatches:
            return None
        events.sort()
        k = len(events) // microbatches * count
        lo, hi = first_bwd[rank], max(e for _, e, _ in events)
        i0 = next((i for i, ev in enumerate(events) if ev[0] >= lo), len(events))
        room = len(events) - 1 - i0 - k
        if room < 0:
            return None
        i = i0 + room // 2
        pairs[rank] = (room, events[i][::2], events[i + k][::2])
        spans[rank] = (lo, hi)
    best = max(pairs, key=lambda r: (pairs[r][0], -r))
    period = pairs[best][2][0] - pairs[best][1][0]
    if not period > 0 or any(abs((b[0] - a[0]) - period) > PERIOD_RTOL * period for _, a, b in pairs.values()):
        return None
    lo = max(a for a, _ in spans.values())
    hi = min(b for _, b in spans.values())
    if hi - lo < period:
        return None
    a = lo + (hi - lo - period) / 2
    per_rank = window_breakdown(result.events, {r: (x[1][0], x[1][0] + period) for r, x in pairs.items()})
    integrals: dict[int, tuple[Sequence[tuple[float, float]], float]] = {}  # by timeline: a link class's is shared
    links = {}
    for lk in result.cluster.link_resources():
        timeline = lk.timeline
        hit = integrals.get(id(timeline))
        if hit is None:  # (the value keeps the timeline, so its id is not reused meanwhile)
            hit = integrals[id(timeline)] = (timeline, _integral(timeline, a, a + period))
        links[lk.name] = hit[1]
    return SteadyWindow(period, per_rank, links, sum(b[1] - x[1] for _, x, b in pairs.values()))


def _integral(timeline: Sequence[tuple[float, float]], a: float, b: float) -> float:
    """The step function ``timeline`` (``[(t_s, value)]`` in time order, each value holding until the next
    point, 0 before the first) integrated over ``[a, b]``."""
    points = timeline[max(bisect_right(timeline, (a, math.inf)) - 1, 0):bisect_left(timeline, (b, -math.inf))]
    if not points:
        return 0.0
    total = 0.0
    for (t, value), (t_next, _) in zip(points, [*points[1:], (b, 0.0)], strict=True):
        total += value * max(t_next - max(t, a), 0.0)
    return total


_load = itemgetter(1)
"""A timeline point's load."""


class ExtrapolatedLink:
    """A link of the extrapolated iteration: its ``carried`` bytes extrapolated, and as ``timeline`` a
    step function with those bytes at the simulated run's peak rate -- what
    :func:`scenarios.metrics.link_stats` integrates (mean = bytes / (capacity x time), peak = the
    ``m2`` run's), not a load history to draw (the plots draw the ``m2`` run)."""

    __slots__ = ("name", "index", "nominal_capacity", "carried", "timeline")

    def __init__(self, link: Any, carried: float) -> None:
        self.name, self.index, self.nominal_capacity = link.name, link.index, link.nominal_capacity
        self.carried = carried
        peak = max(link.timeline, key=_load, default=(0.0, 0.0))[1]
        self.timeline = [(0.0, peak), (carried / peak, 0.0)] if peak > 0 and carried > 0 else []


class ExtrapolatedCluster:
    """The cluster view the metrics and the text report read: the topology, and the links of the
    ``m2`` run with their bytes extrapolated by ``grow(bytes, increment)`` (``increment``: from
    ``increments``, by link name; a link the ``m1`` run did not use counts 0 there)."""

    def __init__(self, c2: Any, increments: dict[str, float], grow: Callable[[float, float], float]) -> None:
        self.topology = c2.topology
        self._links = [ExtrapolatedLink(lk, max(grow(float(lk.carried), increments.get(lk.name, 0.0)), 0.0))
                       for lk in c2.link_resources()]

    def link_resources(self) -> list[ExtrapolatedLink]:
        return self._links

    def link_bundles(self) -> list[ExtrapolatedLink]:
        """:meth:`link_resources`: each link is extrapolated by its own increment, so none is bundled."""
        return self._links
