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
from collections.abc import Collection, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from tqdm import tqdm

from scenarios.runner import DEFAULT_MAX_TASKS
from scenarios.scenario import Scenario, parallel_kwargs
from scenarios.search.refine import REFINE_PLANS, refine, refined_estimate
from scenarios.search.screen import Estimate, ScreenContext
from scenarios.search.simulate import simulate_plans
from scenarios.search.space import (
    Candidate,
    Rejection,
    check_plan,
    empty_space_reason,
    enumerate_space,
    normalise,
    parse_knobs,
    satisfies,
)
from scenarios.search.stages import balanced_ends
from workload.allocator import usable_hbm_bytes
from workload.fp8 import DEFAULT_RECIPE
from workload.parallel.config import ParallelConfig

DEFAULT_TOP_K = 20
TOP_K_RULES = ("shapes", "screen")
"""How the top K are picked (:func:`pick_top_k`): ``shapes`` (default) half by plan shape, half by
variants of the shapes that simulated fastest; ``screen``: the screen's K fastest as they come."""
MAX_EMPTY_REASONS = 3
"""A space without a valid plan is refused naming this many of its rejections' reasons, most common first."""
VARIANTS_PER_SHAPE = 4
"""Round 2 of the ``shapes`` rule simulates at most this many more variants of one shape."""


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
    picks: dict[Candidate, str] = field(default_factory=dict)
    """The top K, each with why it was simulated: ``shape`` (round 1), ``variant`` (round 2) or ``screen``
    (:func:`simulate_top_k`)."""
    num_layers: int = 0
    """The model's layers (torchtitan's stage-split flags spell the split out with it)."""
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
    (:func:`~scenarios.search.stages.balanced_ends`, Megatron-LM's ``--decoder-first-pipeline-num-layers``
    / ``--decoder-last-pipeline-num-layers``; Llama 3 405B's 126 layers on 16 stages, Dubey et al. 2024
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


def pick_shapes(fit: Sequence[Estimate], n: int) -> list[Candidate]:
    """Round 1 of the ``shapes`` rule: the screen's fastest plan of each of its ``n`` fastest shapes
    (``fit``: fitting estimates, fastest first), in the screen's order."""
    seen: set[tuple[Any, ...]] = set()
    out: list[Candidate] = []
    for e in fit:
        if len(out) >= n:
            break
        shape = plan_shape(e.candidate)
        if shape not in seen:
            seen.add(shape)
            out.append(e.candidate)
    return out


def pick_variants(fit: Sequence[Estimate], simulated: Mapping[Candidate, Mapping[str, Any]], n: int,
                  taken: Collection[Candidate]) -> list[Candidate]:
    """Round 2 of the ``shapes`` rule: ``n`` more plans. The shapes of the ``simulated`` plans, fastest
    simulated first, each give up to :data:`VARIANTS_PER_SHAPE` of their other plans in the screen's order
    (ZeRO stage, overlaps, SP, TP comm overlap, rank order, uneven ends, FP8 recipe: knobs the screen
    prices alike or not at all -- it prices both rank orders the same -- and the simulation tells apart);
    what that leaves of ``n`` goes to the screen's fastest plans not yet taken."""
    ok = sorted(((r["iteration_time_s"], c) for c, r in simulated.items()
                 if not r.get("error") and not r.get("oom")), key=lambda tc: tc[0])
    order = list(dict.fromkeys(plan_shape(c) for _, c in ok))
    by_shape: dict[tuple[Any, ...], list[Candidate]] = {s: [] for s in order}
    for e in fit:
        lst = by_shape.get(plan_shape(e.candidate))
        if lst is not None and len(lst) < VARIANTS_PER_SHAPE and e.candidate not in taken:
            lst.append(e.candidate)
    out = [c for s in order for c in by_shape[s]][:n]
    have = set(taken) | set(out)
    out += [e.candidate for e in fit if e.candidate not in have][:n - len(out)]
    return out


def simulate_top_k(scenario: Scenario, fit: Sequence[Estimate], k: int, extras: Sequence[Candidate], *,
                   rule: str = "shapes", executor: Executor | None = None, cache: str | Path | None = None,
                   progress: bool = False, max_tasks: float | None = None
                   ) -> tuple[dict[Candidate, dict[str, Any]], dict[Candidate, str]]:
    """Tier 2: simulate ``k`` plans of ``fit`` (fitting estimates, fastest first) and ``extras`` (the
    baseline and the scenario's plan). Returns the results by plan and the ``k`` picks with their round.

    ``rule`` ``screen``: the screen's ``k`` fastest. ``shapes``: round 1 simulates the fastest plan of
    each of the screen's ``ceil(k / 2)`` fastest shapes (:func:`pick_shapes`) with the extras, so that
    ``k`` slots are not spent on one plan in variants the screen cannot tell apart; round 2 the other
    ``floor(k / 2)``: variants of the shapes that simulated fastest (:func:`pick_variants`). A plan above
    ``max_tasks`` estimated tasks is not simulated (its result says so), as ``trainsim run`` refuses it."""
    kw: dict[str, Any] = {"executor": executor, "cache": cache, "progress": progress, "max_tasks": max_tasks}
    if rule == "screen":
        picks = {e.candidate: "screen" for e in fit[:k]}
        chosen = list(picks) + [c for c in extras if c not in picks]
        return simulate_plans(scenario, chosen, **kw), picks
    picks = dict.fromkeys(pick_shapes(fit, -(-k // 2)), "shape")
    first = list(picks) + [c for c in extras if c not in picks]
    out = simulate_plans(scenario, first, **kw)
    more = pick_variants(fit, {c: r for c, r in out.items() if c in picks}, k - len(picks), set(first))
    picks.update(dict.fromkeys(more, "variant"))
    if more:
        out.update(simulate_plans(scenario, more, **kw))
    return out, picks


def _bar(progress: bool, total: int, desc: str, unit: str):
    return tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, disable=not progress, leave=False,
                dynamic_ncols=True, mininterval=0.2)


def screen_all(ctx: ScreenContext, cands: Sequence[Candidate], progress: bool) -> tuple[list[Estimate], float, float]:
    """Estimates of ``cands`` (memory first; the fitting plans' shards traced before the timed pass),
    the screen's rate (plans per CPU second of this process, traces excluded) and the tracing wall time."""
    t0 = time.perf_counter()
    fitting = {ctx.shard_key(c): c for c in cands if not ctx.oom_reason(ctx.memory(c))}
    with _bar(progress, len(fitting), "tracing shards", "shard") as bar:
        for c in fitting.values():
            ctx.shard(c)
            bar.update()
    trace_s = time.perf_counter() - t0
    t1 = time.process_time()  # the rate in CPU time: one core's, whatever else the machine runs
    with _bar(progress, len(cands), "screening plans", "plan") as bar:
        out = []
        for i, c in enumerate(cands):
            out.append(ctx.estimate(c))
            if i % 256 == 255:
                bar.update(256)
        bar.update(len(cands) - bar.n)
    dt = time.process_time() - t1
    return out, (len(cands) / dt if dt > 0 else math.inf), trace_s


def run_search(scenario: Scenario, *, fix: Sequence[str] = (), space: Sequence[str] = (), top_k: int = DEFAULT_TOP_K,
               executor: Executor | None = None, cache: str | Path | None = None, progress: bool = False,
               context: ScreenContext | None = None, top_k_rule: str = "shapes",
               max_tasks: float | None = DEFAULT_MAX_TASKS) -> SearchResult:
    """Search the parallel plans of ``scenario`` (its ``[parallel]`` is the plan to beat, not a constraint).

    The ``top_k`` plans simulated beside the baseline and the scenario's own plan are picked by
    ``top_k_rule`` (:func:`simulate_top_k`); each simulation is bounded by ``max_tasks`` estimated tasks
    (``trainsim run``'s default; ``None``: unbounded).

    Raises:
        ValueError: bad ``fix``/``space`` (one line naming the key or value; also a space without a valid
            plan), an unknown ``top_k_rule``, or a scenario field at fault.
        NoFeasiblePlan: no valid plan fits in memory (the message names the closest and what it lacks).
    """
    if top_k_rule not in TOP_K_RULES:
        raise ValueError(f"top-k rule {top_k_rule!r}: unknown; allowed: {', '.join(TOP_K_RULES)}")
    knobs = parse_knobs(fix, space)
    ctx = context or ScreenContext(scenario)
    t_enum = time.perf_counter()
    cands, rejections = enumerate_space(ctx.facts, ctx.model_cfg, knobs, ctx.base_parallel)
    cands = add_block_recompute(ctx, cands, knobs)
    enumerate_s = time.perf_counter() - t_enum
    if not cands:  # bad input (exit 2), not a memory verdict
        if not rejections:  # the values given leave no factorisation of the cluster
            raise ValueError(empty_space_reason(ctx.facts, knobs))
        # every plan may fail for another reason than the most common one: the first few, with their counts
        shown = "; ".join(f"{r.reason} ({r.count:,} plan{'s' if r.count != 1 else ''})"
                          for r in rejections[:MAX_EMPTY_REASONS])
        more = f"; {len(rejections) - MAX_EMPTY_REASONS} more reasons" if len(rejections) > MAX_EMPTY_REASONS else ""
        raise ValueError(f"no valid plan in the space ({sum(r.count for r in rejections):,} rejected); "
                         f"the most common reasons: {shown}{more}")
    t0 = time.perf_counter()
    estimates, rate, trace_s = screen_all(ctx, cands, progress)
    screen_s = time.perf_counter() - t0
    fit = sorted((e for e in estimates if e.fits), key=lambda e: (e.iteration_time_s, e.candidate))
    t_refine, w_refine, c_workers = time.process_time(), time.perf_counter(), getattr(ctx, "refine_worker_cpu_s", 0.0)
    with _bar(progress, min(len(fit), REFINE_PLANS), "re-pricing the fastest plans", "plan") as bar:
        fit = refine(ctx, fit, progress=bar.update, executor=executor, cache=cache)  # as the simulator times them
    # CPU of this process and of the executor's runs (each run reports its own), whatever else the machine runs
    refine_cpu_s = time.process_time() - t_refine + getattr(ctx, "refine_worker_cpu_s", 0.0) - c_workers
    refine_wall_s = time.perf_counter() - w_refine
    if not fit:
        close = min(estimates, key=lambda e: (e.memory_bytes, e.candidate))
        raise NoFeasiblePlan(f"no plan fits in {close.hbm_bytes / 1e9:.1f} GB per GPU; closest: "
                             f"{close.candidate.flags(ctx.global_batch_size, ctx.facts.num_layers)} -- "
                             f"{close.oom_reason}; it lacks "
                             f"{-close.headroom_bytes / 1e9:.1f} GB of HBM per GPU")
    unfit = sorted((e for e in estimates if not e.fits), key=lambda e: (e.memory_bytes, e.candidate))
    kind, base, _ = pick_baseline(ctx)
    given = given_plan(scenario, ctx.world)
    if given is not None and check_plan(given, ctx.facts, ctx.model_cfg, ctx.base_parallel) is not None:
        given = None  # e.g. the scenario's stages do not divide a model set with --set: no plan to compare
    t1 = time.perf_counter()
    compare = [c for c in (base, given) if c is not None and ctx.estimate(c).fits]
    simulated, picks = simulate_top_k(scenario, fit, top_k, compare, rule=top_k_rule, executor=executor, cache=cache,
                                      progress=progress, max_tasks=max_tasks)
    sim_s = time.perf_counter() - t1
    known = set(cands)
    extras = [refined_estimate(ctx, c) for c in dict.fromkeys((base, given)) if c is not None and c not in known]
    n = min(len(fit), REFINE_PLANS)  # the refined head keeps its own order ahead of the analytic tail
    ordered = sorted(fit[:n] + [e for e in extras if e.fits], key=lambda e: (e.iteration_time_s, e.candidate)) + \
        fit[n:] + unfit + [e for e in extras if not e.fits]
    return SearchResult(scenario, ordered, rejections, simulated, base, kind, given, rate, screen_s,
                        ctx.traces, trace_s, sim_s, usable_hbm_bytes(ctx.gpu), ctx.world,
                        info={"candidates": len(cands), "fitting": len(fit), "top_k": top_k,
                              "top_k_rule": top_k_rule, "picked": len(picks), "max_tasks": max_tasks,
                              "shapes_picked": sum(1 for v in picks.values() if v == "shape"),
                              "enumerate_s": enumerate_s, "refine_cpu_s": refine_cpu_s, "refine_wall_s": refine_wall_s,
                              "refine_runs": getattr(ctx, "refine_runs", 0),
                              "refined": min(len(fit), REFINE_PLANS), "usable_hbm_bytes": usable_hbm_bytes(ctx.gpu)},
                        picks=picks, num_layers=ctx.facts.num_layers,
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
