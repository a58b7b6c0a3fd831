"""The search end to end: enumerate, screen, pick the top K, simulate them, rank.

:func:`run_search` returns a :class:`SearchResult`; :mod:`scenarios.search.report` formats it.
The recommended plan is the fastest *simulated* plan among the screen's top K, the baseline and the
scenario's own plan, all of which fit by the memory model -- so it is never OOM by that model and never
slower than the baseline printed beside it, unless ``--fix``/``--space`` exclude the baseline or the
scenario's plan: those are simulated for comparison only and never recommended.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from tqdm import tqdm

from scenarios.scenario import Scenario, parallel_kwargs
from scenarios.search.screen import Estimate, ScreenContext
from scenarios.search.simulate import simulate_plans
from scenarios.search.space import (
    Candidate,
    Rejection,
    balanced_ends,
    check_plan,
    empty_space_reason,
    enumerate_space,
    normalise,
    parse_knobs,
    satisfies,
)
from workload.allocator import usable_hbm_bytes
from workload.fp8 import DEFAULT_RECIPE
from workload.parallel.config import ParallelConfig

DEFAULT_TOP_K = 20
NEAR_DUPLICATE_MARGIN = 0.01
"""Two plans of one shape (:func:`plan_shape`) whose screen estimates are within this fraction of each other
count as one for the top K: the knobs they differ in (ZeRO stage, overlaps, TP comm overlap, rank order,
uneven ends, FP8 recipe) move the screen's time by less than the screen's own error (1 % is below the
screen-vs-simulation gap of the search's published-plan checks), so simulating both spends a slot on
a plan the screen cannot tell apart. ``0`` simulates the screen's K fastest as they come."""


class NoFeasiblePlan(Exception):
    """No plan fits: the message names the closest one and what it lacks."""


@dataclass
class SearchResult:
    """Everything a search found (times in seconds, memory in bytes)."""

    scenario: Scenario
    estimates: list[Estimate]
    """Every valid plan's estimate, fastest first (plans that do not fit last, by memory)."""
    rejections: list[Rejection]
    simulated: dict[Candidate, dict[str, Any]]
    baseline: Candidate | None
    baseline_kind: str
    given: Candidate | None
    """The scenario's own plan, when it is a valid one."""
    screen_rate_per_s: float
    screen_wall_s: float
    traces: int
    trace_wall_s: float
    simulate_wall_s: float
    hbm_bytes: float
    """The GPU's usable HBM, the memory limit of the screen's verdict and ``run``'s (one function)."""
    world_size: int
    info: dict[str, Any] = field(default_factory=dict)
    near_duplicates: dict[Candidate, Candidate] = field(default_factory=dict)
    """Plans the screen ranked among the top K but not simulated, each with the simulated plan of its shape
    it is a near-duplicate of (:func:`pick_distinct`)."""
    outside: frozenset[Candidate] = frozenset()
    """Plans simulated for comparison only (the baseline or the scenario's plan outside ``--fix``/``--space``):
    never the recommendation."""

    def estimate_of(self, c: Candidate) -> Estimate | None:
        return self._by_plan.get(c)

    def __post_init__(self) -> None:
        self._by_plan = {e.candidate: e for e in self.estimates}

    @property
    def ranked(self) -> list[tuple[Candidate, dict[str, Any]]]:
        """Simulated plans that ran and fit, fastest first."""
        ok = [(c, r) for c, r in self.simulated.items() if not r.get("error") and not r.get("oom")]
        return sorted(ok, key=lambda cr: (cr[1]["iteration_time_s"], cr[0]))

    @property
    def best(self) -> tuple[Candidate, dict[str, Any]] | None:
        """The fastest simulated plan inside the space searched."""
        return next(((c, r) for c, r in self.ranked if c not in self.outside), None)


def given_plan(scenario: Scenario, world: int) -> Candidate | None:
    """The scenario's own ``[parallel]`` plan as a :class:`Candidate` (``None`` if it is not valid)."""
    try:
        cfg = ParallelConfig(**parallel_kwargs(scenario.parallel, scenario.training)).resolve(world)
    except (ValueError, TypeError):
        return None
    return normalise(Candidate(
        tp=cfg.tp, cp=cfg.cp, ep=cfg.ep, pp=cfg.pp, vpp=cfg.vpp, dp=cfg.dp, sp=cfg.sequence_parallel,
        zero=cfg.effective_zero_stage, mbs=cfg.micro_batch_size, recompute=cfg.recompute_granularity,
        overlap_grad_reduce=cfg.overlap_grad_reduce, overlap_param_gather=cfg.overlap_param_gather,
        tp_comm_overlap=cfg.tp_comm_overlap, async_tp=cfg.async_tp, rank_order=cfg.rank_order,
        first_layers=cfg.num_layers_in_first_pipeline_stage or 0,
        last_layers=cfg.num_layers_in_last_pipeline_stage or 0, zero_impl=cfg.zero_impl,
        recompute_method=cfg.recompute_method or "", recompute_num_layers=cfg.recompute_num_layers or 0,
        fp8_recipe=scenario.training.get("fp8_recipe", DEFAULT_RECIPE) if scenario.training.get("dtype") == "fp8"
        else ""))


def add_block_recompute(ctx: ScreenContext, cands: list[Candidate], knobs: dict[str, list[Any]]) -> list[Candidate]:
    """``cands`` with Megatron's ``--recompute-method block`` plans: memory falls and time grows with the
    layers recomputed (none ... every layer), so per full-recompute plan that fits the best block plan is
    the one with the fewest layers that fits -- added where the plan without recomputation does not fit
    (or, with ``training.recompute_method=block`` named, always, and the other plans dropped). A
    ``training.recompute_num_layers`` named by ``--fix``/``--space`` was enumerated as given instead."""
    if "recompute_num_layers" in knobs:
        return cands
    asked = "recompute_method" in knobs
    seen = set(cands)
    out = [c for c in cands if not asked or c.recompute_method in knobs["recompute_method"]]
    for c in cands:
        if c.recompute != "full" or c.recompute_method or c.zero_impl == "deepspeed" or ctx.oom_reason(ctx.memory(c)):
            continue
        if not asked and not ctx.oom_reason(ctx.memory(replace(c, recompute="none"))):
            continue
        lo, hi = 1, max(ctx.stage_layers(c)) - 1  # the fewest layers that fit, by bisection
        if hi < 1 or ctx.oom_reason(ctx.memory(replace(c, recompute_method="block", recompute_num_layers=hi))):
            continue
        while lo < hi:
            mid = (lo + hi) // 2
            fits = not ctx.oom_reason(ctx.memory(replace(c, recompute_method="block", recompute_num_layers=mid)))
            lo, hi = (lo, mid) if fits else (mid + 1, hi)
        block = replace(c, recompute_method="block", recompute_num_layers=lo)
        if block not in seen and check_plan(block, ctx.facts, ctx.model_cfg, ctx.base_parallel) is None:
            seen.add(block)
            out.append(block)
    return out


def baseline_plans(ctx: ScreenContext) -> list[tuple[str, Candidate]]:
    """Baselines in order of preference: plain data parallelism (DDP), FSDP, FSDP with full
    recomputation, then Megatron-LM's documented recipe (Narayanan et al. SC'21 §3.3, takeaway #1:
    tensor parallelism up to the GPUs of a node, pipeline parallelism across nodes; with sequence
    parallelism, selective recomputation and the distributed optimizer, Korthikanti et al. 2022) with
    the fewest pipeline stages. Where PP does not divide the layers the recipe's end stages take fewer
    (:func:`~scenarios.search.space.balanced_ends`, Megatron-LM's ``--num-layers-in-first-pipeline-stage``
    / ``--num-layers-in-last-pipeline-stage``; Llama 3 405B's 126 layers on 16 stages, Dubey et al. 2024
    §3.3.2, are balanced so), so that the recipe exists at every PP the space has."""
    f = ctx.facts
    dp = f.world_size
    out = [("plain DP (DDP)", Candidate(dp=dp, overlap_grad_reduce=dp > 1)),
           ("FSDP", Candidate(dp=dp, zero=3 if dp > 1 else 0)),
           ("FSDP + full recompute", Candidate(dp=dp, zero=3 if dp > 1 else 0, recompute="full"))]
    tp = min(f.gpus_per_node, f.world_size)
    pp = 1
    while pp <= min(f.num_layers, f.world_size // tp):
        d = f.world_size // (tp * pp)
        first, last = balanced_ends(f.num_layers, pp)
        out.append((f"Megatron-LM recipe (TP {tp} in the node, PP {pp})",
                    Candidate(tp=tp, sp=tp > 1, pp=pp, dp=d, zero=1 if d > 1 else 0, recompute="selective",
                              overlap_grad_reduce=d > 1, overlap_param_gather=d > 1, first_layers=first,
                              last_layers=last)))
        pp *= 2
    tr = ctx.scenario.training  # the scenario's FP8 recipe and ZeRO-3 implementation, as the enumerated plans
    recipe = tr.get("fp8_recipe", DEFAULT_RECIPE) if tr.get("dtype") == "fp8" else ""
    impl = ctx.facts.zero_impl
    return [(k, replace(c, fp8_recipe=recipe, zero_impl=impl if c.zero == 3 and c.pp == 1 else "megatron"))
            for k, c in out]


def pick_baseline(ctx: ScreenContext) -> tuple[str, Candidate | None, Estimate | None]:
    """The first baseline that is valid and fits (``("", None, None)`` if none)."""
    for kind, c in baseline_plans(ctx):
        c = normalise(c)
        if check_plan(c, ctx.facts, ctx.model_cfg, ctx.base_parallel) is None:
            est = ctx.estimate(c)
            if est.fits:
                return kind, c, est
    return "", None, None


def plan_shape(c: Candidate) -> tuple[Any, ...]:
    """The plan's shape: how the model and the batch are cut (TP, CP, EP, PP, VPP, DP, micro-batch size,
    recomputation with its method and layers). Plans of one shape differ only in ZeRO stage, overlaps,
    SP, TP comm overlap / async TP, rank order, uneven ends and FP8 recipe."""
    return (c.tp, c.cp, c.ep, c.pp, c.vpp, c.dp, c.mbs, c.recompute, c.recompute_method, c.recompute_num_layers)


def pick_distinct(fit: Sequence[Estimate], k: int, margin: float = NEAR_DUPLICATE_MARGIN
                  ) -> tuple[list[Candidate], dict[Candidate, Candidate]]:
    """The top ``k`` of ``fit`` (fitting estimates, fastest first) without near-duplicates.

    Walking the screen's order, a plan is skipped when a plan already picked has the same
    :func:`plan_shape` and a screen estimate within ``margin`` (a fraction) of its own; ``margin`` 0 skips
    none. Returns the ``k`` picks (fewer only when ``fit`` runs out) and, for each plan skipped on the
    way, the pick it duplicates.
    """
    picks: list[Candidate] = []
    folded: dict[Candidate, Candidate] = {}
    by_shape: dict[tuple[Any, ...], list[Estimate]] = {}
    for e in fit:
        if len(picks) >= k:
            break
        same = by_shape.setdefault(plan_shape(e.candidate), [])
        twin = next((p for p in same if e.iteration_time_s <= p.iteration_time_s * (1 + margin)), None) \
            if margin > 0 else None
        if twin is not None:
            folded[e.candidate] = twin.candidate
            continue
        same.append(e)
        picks.append(e.candidate)
    return picks, folded


def _bar(progress: bool, total: int, desc: str, unit: str):
    return tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, disable=not progress, leave=False,
                dynamic_ncols=True, mininterval=0.2)


def screen_all(ctx: ScreenContext, cands: Sequence[Candidate], progress: bool) -> tuple[list[Estimate], float, float]:
    """Estimates of ``cands`` (memory first; the fitting plans' shards traced before the timed pass),
    the screen's rate (plans/s, traces excluded) and the tracing wall time."""
    t0 = time.perf_counter()
    fitting = {ctx.shard_key(c): c for c in cands if not ctx.oom_reason(ctx.memory(c))}
    with _bar(progress, len(fitting), "tracing shards", "shard") as bar:
        for c in fitting.values():
            ctx.shard(c)
            bar.update()
    trace_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    with _bar(progress, len(cands), "screening plans", "plan") as bar:
        out = []
        for i, c in enumerate(cands):
            out.append(ctx.estimate(c))
            if i % 256 == 255:
                bar.update(256)
        bar.update(len(cands) - bar.n)
    dt = time.perf_counter() - t1
    return out, (len(cands) / dt if dt > 0 else math.inf), trace_s


def run_search(scenario: Scenario, *, fix: Sequence[str] = (), space: Sequence[str] = (), top_k: int = DEFAULT_TOP_K,
               executor: Executor | None = None, cache: str | Path | None = None, progress: bool = False,
               context: ScreenContext | None = None, near_duplicate_margin: float = NEAR_DUPLICATE_MARGIN
               ) -> SearchResult:
    """Search the parallel plans of ``scenario`` (its ``[parallel]`` is the plan to beat, not a constraint).

    The ``top_k`` plans simulated are the screen's fastest distinct plans (:func:`pick_distinct`, with
    ``near_duplicate_margin``), beside the baseline and the scenario's own plan.

    Raises:
        ValueError: bad ``fix``/``space`` (one line naming the key or value; also a space without a valid
            plan), or a scenario field at fault.
        NoFeasiblePlan: no valid plan fits in memory (the message names the closest and what it lacks).
    """
    knobs = parse_knobs(fix, space)
    ctx = context or ScreenContext(scenario)
    t_enum = time.perf_counter()
    cands, rejections = enumerate_space(ctx.facts, ctx.model_cfg, knobs, ctx.base_parallel)
    cands = add_block_recompute(ctx, cands, knobs)
    enumerate_s = time.perf_counter() - t_enum
    if not cands:  # bad input (exit 2), not a memory verdict
        if not rejections:  # the values given leave no factorisation of the cluster
            raise ValueError(empty_space_reason(ctx.facts, knobs))
        raise ValueError(f"no valid plan in the space ({sum(r.count for r in rejections)} rejected); "
                         f"the most common reason: {rejections[0].reason}")
    t0 = time.perf_counter()
    estimates, rate, trace_s = screen_all(ctx, cands, progress)
    screen_s = time.perf_counter() - t0
    fit = sorted((e for e in estimates if e.fits), key=lambda e: (e.iteration_time_s, e.candidate))
    if not fit:
        close = min(estimates, key=lambda e: (e.memory_bytes, e.candidate))
        raise NoFeasiblePlan(f"no plan fits in {close.hbm_bytes / 1e9:.1f} GB per GPU; closest: "
                             f"{close.candidate.megatron_flags()} -- {close.oom_reason}; it lacks "
                             f"{-close.headroom_bytes / 1e9:.1f} GB of HBM per GPU")
    unfit = sorted((e for e in estimates if not e.fits), key=lambda e: (e.memory_bytes, e.candidate))
    kind, base, _ = pick_baseline(ctx)
    given = given_plan(scenario, ctx.world)
    if given is not None and check_plan(given, ctx.facts, ctx.model_cfg, ctx.base_parallel) is not None:
        given = None  # e.g. the scenario's stages do not divide a model set with --set: no plan to compare
    if near_duplicate_margin < 0:
        raise ValueError(f"near-duplicate margin must be >= 0 (a fraction), got {near_duplicate_margin}")
    chosen, folded = pick_distinct(fit, top_k, near_duplicate_margin)
    picked = len(chosen)
    for extra in (base, given):
        if extra is not None and extra not in chosen and ctx.estimate(extra).fits:
            chosen.append(extra)
    t1 = time.perf_counter()
    simulated = simulate_plans(scenario, chosen, executor=executor, cache=cache, progress=progress)
    sim_s = time.perf_counter() - t1
    known = set(cands)
    extras = [ctx.estimate(c) for c in dict.fromkeys((base, given)) if c is not None and c not in known]
    ordered = sorted(fit + [e for e in extras if e.fits], key=lambda e: (e.iteration_time_s, e.candidate)) + \
        unfit + [e for e in extras if not e.fits]
    return SearchResult(scenario, ordered, rejections, simulated, base, kind, given, rate, screen_s,
                        ctx.traces, trace_s, sim_s, usable_hbm_bytes(ctx.gpu), ctx.world,
                        info={"candidates": len(cands), "fitting": len(fit), "top_k": top_k,
                              "near_duplicate_margin": near_duplicate_margin, "near_duplicates": len(folded),
                              "picked": picked,
                              "enumerate_s": enumerate_s, "usable_hbm_bytes": usable_hbm_bytes(ctx.gpu)},
                        near_duplicates=folded,
                        outside=frozenset(c for c in (base, given) if c is not None and not satisfies(c, knobs)))


def kendall_tau(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Kendall's tau-b between two sequences (ties counted as neither concordant nor discordant);
    ``nan`` with fewer than two pairs."""
    n = len(xs)
    conc = disc = tx = ty = 0
    for i in range(n):
        for j in range(i + 1, n):
            dx, dy = xs[i] - xs[j], ys[i] - ys[j]
            if dx == 0 and dy == 0:
                continue
            if dx == 0:
                tx += 1
            elif dy == 0:
                ty += 1
            elif (dx > 0) == (dy > 0):
                conc += 1
            else:
                disc += 1
    denom = math.sqrt((conc + disc + tx) * (conc + disc + ty))
    return (conc - disc) / denom if denom else math.nan
