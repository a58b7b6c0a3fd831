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

``[simulation] steady_state = "auto"`` (default) extrapolates where :func:`plan_for` applies,
``"off"`` simulates every micro-batch. The ``m2`` run is what ``--trace`` and ``--plots`` draw
(``RunReport.simulated``). Measured against the full simulation in ``docs/DESIGN.md``; tested in
``tests/scenarios/test_steady_state.py``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from operator import itemgetter
from typing import Any, cast

from hwmodel.runtime import RunResult
from scenarios.analysis import RankBreakdown
from scenarios.metrics import run_metrics

__all__ = ["MIN_MICROBATCHES", "MIN_PIPELINE_M1", "STEADY_M1_PIPELINES", "SteadyPlan", "extrapolated", "plan_for"]

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


@dataclass(frozen=True)
class SteadyPlan:
    """Which micro-batch counts to simulate for an iteration of ``of`` micro-batches per pipeline."""

    simulated: tuple[int, int]
    """``(m1, m2)``: both in the steady regime, ``m2 - m1`` a whole number of periods, ``m1 = of`` mod it."""
    of: int
    period: str
    """What repeats, for the report: "1F1B", "interleaved 1F1B", "GPipe" or "gradient accumulation"."""


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
    return SteadyPlan((m1, m2), m, what)


def extrapolated(prep: Any, plan: SteadyPlan, flops: tuple[float, float, str],
                 simulate: Callable[[Any], Any]) -> Any:
    """The :class:`scenarios.runner.RunReport` of ``prep``'s iteration, from ``simulate`` (the runner's
    simulation of a prepared scenario, in the real run's mode) at ``plan.simulated``.

    Args:
        prep: the real :class:`scenarios.runner.Prepared`; each simulated count runs it with only
            ``global_batch_size`` changed (``micro_batch_size x dp x count``), the ``m1`` run also without
            link timelines (``record_links = false``: only its links' carried bytes are read).
        plan: from :func:`plan_for`.
        flops: the real configuration's ``(model, hardware FLOPs, formula)``.
        simulate: ``Prepared -> RunReport``.

    Returns:
        A report whose ``result`` is the extrapolated iteration (the ``m2`` run's events, a cluster view
        of extrapolated links) and ``simulated`` the ``m2`` run; its metrics carry
        ``simulation.steady_state``.
    """
    cfg = prep.config
    runs = []
    for count in plan.simulated:
        sub = dataclasses.replace(cfg, global_batch_size=count * cfg.micro_batch_size * cfg.dp)
        run = dataclasses.replace(prep, config=sub)
        if count != plan.simulated[-1]:  # only its links' carried bytes are read, which do not need timelines
            scenario = prep.scenario
            run = dataclasses.replace(run, scenario=dataclasses.replace(
                scenario, simulation={**scenario.simulation, "record_links": False}))
        runs.append(simulate(run))
    first, last = runs
    (m1, m2), m = plan.simulated, plan.of

    def affine(x1: float, x2: float) -> float:
        return x2 + (m - m2) * (x2 - x1) / (m2 - m1)

    r1, r2 = first.result, last.result
    end_s = affine(r1.end_time_s, r2.end_time_s)
    result = RunResult(end_s, {r: affine(r1.rank_end_s.get(r, 0.0), t) for r, t in r2.rank_end_s.items()},
                       r2.events, cast(Any, ExtrapolatedCluster(r1.cluster, r2.cluster, affine)),
                       r2.placement, dict(r2.stats))
    per_rank = {r: RankBreakdown(*(affine(getattr(first.per_rank[r], f.name), getattr(b, f.name))
                                   for f in dataclasses.fields(RankBreakdown)))
                for r, b in last.per_rank.items()}
    report = dataclasses.replace(last, prepared=prep, result=result, per_rank=per_rank, simulated=r2)
    report.metrics = run_metrics(report, flops)
    sim = report.metrics["simulation"]
    sim["tasks"] = round(affine(first.metrics["simulation"]["tasks"], last.metrics["simulation"]["tasks"]))
    sim["fluid_solves"] = first.metrics["simulation"]["fluid_solves"] + last.metrics["simulation"]["fluid_solves"]
    sim["steady_state"] = {"simulated_microbatches": [m1, m2], "of": m, "period": plan.period}
    if "warnings" in last.metrics:
        report.metrics["warnings"] = list(last.metrics["warnings"])
    return report


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
    ``m2`` run with their bytes extrapolated (a link the ``m1`` run did not use counts 0 there)."""

    def __init__(self, c1: Any, c2: Any, affine: Callable[[float, float], float]) -> None:
        self.topology = c2.topology
        before = {lk.name: float(lk.carried) for lk in c1.link_resources()}
        self._links = [ExtrapolatedLink(lk, max(affine(before.get(lk.name, 0.0), float(lk.carried)), 0.0))
                       for lk in c2.link_resources()]

    def link_resources(self) -> list[ExtrapolatedLink]:
        return self._links
