"""Tier 1b of the search: the screen's fastest plans re-priced with the simulator's own passes.

The analytic screen (:mod:`scenarios.search.screen`) prices a layer pass from its kernels' solo times and
NCCL's predicted collective times. What it cannot see is what happens between them on the GPU and the
fabric: a TP-overlap chunk pipeline's collectives holding SMs beside the GEMMs they overlap (userbuffers,
async TP), ring-attention sends of every data-parallel replica's CP ring sharing the NICs and the
fabric (a CP 8 ring across 4 nodes slows as the replicas grow), ZeRO-3's per-unit gathers and
reduce-scatters sharing SMs, streams and NICs with the passes they wrap, launch gaps. This tier re-prices
the plans the screen ranks fastest with the simulator itself, in one of two ways, both of them its own
engine on the real cluster:

* **Sampled layers** (no pipeline, ``pp = 1``: plain data parallelism, distributed optimizer, FSDP2 and
  DeepSpeed ZeRO-3). Without pipeline stages an iteration is ``m`` micro-batches of the same passes over
  identical layers, so every additive quantity is affine in the layer count ``L`` once the per-layer
  pattern is steady (FSDP2's prefetch has built its lead; DeepSpeed's coordinator repeats every two layers):
  ``T(L) = T(k2) + (L - k2) (T(k2) - T(k1)) / (k2 - k1)``. The plan is simulated with ``k1`` and ``k2``
  layers (:data:`SAMPLED_LAYERS`) and its real micro-batch count (which the runner itself extrapolates,
  :mod:`scenarios.steady_state`), as ``trainsim run`` would run it: per-unit gathers, reduce-scatters,
  gradient buckets, the optimizer and every collective's SMs and links are the simulation's. This is the
  steady-state rule of :mod:`scenarios.steady_state` applied to layers instead of micro-batches.
* **Step-1 passes** (pipelines, ``pp > 1``). The hierarchical engine's step 1
  (:func:`scenarios.hierarchical.pass_profiles`: one micro-batch of each layer pass on stage 0's TP x CP
  ranks of the real cluster, every data-parallel replica mirrored) times each distinct (shard, layout,
  recomputation, TP overlap) once, and the plan's iteration is composed as the screen composes it
  (:class:`scenarios.search.screen._StageTimes` with ``measured``). Its data-parallel collectives are
  simulated too, with every stage's and replica's rings on the fabric at once (:func:`dp_probe`); the
  pipeline schedule and the overlap of the data-parallel tail (FSDP with PP gathers once per step, in
  the tail) stay analytic.

A plan whose re-pricing fails (the simulator refuses it) keeps its analytic estimate.

The sampled-layer runs are whole simulations (about a second of CPU each, two or three per plan, so
hundreds for the 300 plans): given an executor (``trainsim search``'s process pool of ``--workers``),
:func:`refine` runs them there, as the top K's simulations run, while this process times the pipelines'
step-1 passes, whose caches it holds. Each run is cached by :func:`scenarios.search.simulate.scenario_key`,
so plans that share one (a block-recomputation plan and its every-layer twin) run it once.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Executor, Future, as_completed
from dataclasses import replace
from pathlib import Path
from typing import Any

from hwmodel.cluster import Cluster
from hwmodel.ir import Collective, Program
from hwmodel.runtime import DEFAULT_HOST_LAUNCH_OVERHEAD_S, Runtime
from scenarios.hierarchical import PassProfile, pass_profiles, step2_mirror
from scenarios.runner import _engine_factory, scenario_dir, trace_options
from scenarios.search.estimate import Estimate
from scenarios.search.simulate import append_cache, candidate_data, load_cache, scenario_key, simulate_plan
from scenarios.search.space import Candidate
from workload.parallel.placement import Layout
from workload.parallel.rank_trace import trace_rank
from workload.parallel.recompute import recomputed_layers

REFINE_PLANS = 300
"""How many of the screen's fastest fitting plans :func:`refine` re-prices (docs/DESIGN.md, "Search: every
plan family re-priced by the simulator")."""

SAMPLED_LAYERS = (6, 8)
"""The layer counts a plan without pipeline stages is simulated with (:func:`sampled_time_s`): past the
first layers, where FSDP2's one-ahead prefetch is still building its lead (Llama 3 70B, TP 4 x DP 8
with async TP on 4 DGX H100: 105.5, 103.1, 102.9, 102.5, 99.8 ms per layer from the third layer, then
100.5 ms from the seventh on), and two apart, since DeepSpeed ZeRO-3's coordinator repeats every two
layers (its prefetch bucket; Llama 3 8B on one DGX H100: 28.4 and 30.0 ms per layer in turn). On a
GPT-3 175B DeepSpeed plan (96 layers, 1,024 A100), 2 and 3 layers extrapolate 4.3 % fast, 4 and 6 to
0.01 %."""

Profiles = dict[tuple[str, str], PassProfile]


def sampled(c: Candidate) -> bool:
    """Whether plan ``c`` is re-priced by sampled layers (no pipeline stages) rather than step-1 passes."""
    return c.pp == 1


def pass_key(ctx, c: Candidate) -> tuple:
    """What a plan's step-1 passes depend on: the shard (:meth:`ScreenContext.shard_key`), the layout
    (TP, CP, EP, PP, DP and the rank order place the mirrored replicas), and the recomputation."""
    return (ctx.shard_key(c), c.tp, c.cp, c.ep, c.pp, c.dp, c.rank_order, c.recompute, c.tp_comm_overlap,
            c.async_tp)


def stored_key(ctx, kind: str, key: tuple) -> str:
    """The search cache's key of a step-1 or probe run (``kind``): the SHA-256 of the base scenario's run
    key (:func:`scenario_key`: the sections that define every run of the search) and ``key`` (what the
    run depends on beyond them: :func:`pass_key`, or a probe's layout, collective and size)."""
    base = ctx.__dict__.get("_base_key")
    if base is None:
        base = ctx._base_key = scenario_key(ctx.scenario.to_dict())
    doc = json.dumps([kind, base, key], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(doc.encode()).hexdigest()


def _stored(ctx) -> dict[str, dict[str, Any]]:
    """The step-1 and probe results read from the search's cache (:func:`refine`'s ``cache``), by
    :func:`stored_key`."""
    stored: dict[str, dict[str, Any]] = ctx.__dict__.setdefault("_stored", {})
    return stored


def _keep(ctx, key: str, plan: Candidate, result: dict[str, Any], kind: str) -> None:
    """Count one step-1 or probe simulation and append it to the search's cache (``ctx.run_cache``)."""
    ctx.refine_runs = getattr(ctx, "refine_runs", 0) + 1
    append_cache(getattr(ctx, "run_cache", None), key, plan, result, kind=kind)


def step1_profiles(ctx, c: Candidate) -> Profiles:
    """The hierarchical engine's step-1 :class:`PassProfile` of each layer pass of plan ``c`` (cached in
    ``ctx`` by :func:`pass_key`, and in the search's cache by its :func:`stored_key`: a resumed search
    reads them back). Traced with one layer per virtual stage and even stages: step 1 runs
    layer 0 of stage 0, whatever the split (Megatron's ``--recompute-method`` is priced by the screen).
    The passes alone: no FSDP gathers (with PP, FSDP2 gathers once per step, priced in the tail)."""
    key = pass_key(ctx, c)
    cache = ctx.__dict__.setdefault("_step1", {})
    hit = cache.get(key)
    if hit is not None:
        return hit
    h = stored_key(ctx, "step1", key)
    stored = _stored(ctx).get(h)
    if stored is not None:  # (floats through JSON come back bit for bit)
        hit = cache[key] = {(p, k): PassProfile(*t) for p, k, *t in stored["pass_profiles"]}
    else:
        cfg = replace(c.config(ctx.global_batch_size, ctx.base_parallel),
                      num_layers_in_first_pipeline_stage=None, num_layers_in_last_pipeline_stage=None,
                      recompute_method=None, recompute_num_layers=None, virtual_pipeline_model_parallel_size=None)
        model = replace(ctx.model_cfg, num_layers=cfg.pp)
        training = c.training_section(ctx.training)
        trace = trace_rank(model, cfg, **trace_options(training))
        sim = ctx.scenario.simulation
        host = float(sim.get("host_launch_overhead_s", DEFAULT_HOST_LAUNCH_OVERHEAD_S))
        engine = _engine_factory(sim, scenario_dir(ctx.scenario))
        hit = cache[key] = pass_profiles(trace, cfg, ctx.topology, engine, host, ctx.cost_model)
        _keep(ctx, h, c, {"pass_profiles": [[*k, *p.as_tuple()] for k, p in hit.items()]}, "step1")
    return hit


def dp_probe(ctx, c: Candidate) -> Callable[..., tuple[float, int]]:
    """Plan ``c``'s data-parallel collectives as the simulator runs them: ``probe(op, size_bytes, axis)``
    (``axis`` ``dp`` or ``edp``) -> (seconds, channels), one collective started at once on the group of
    one rank of every pipeline stage and on every group they mirror (``step2_mirror``: every TP and DP
    shift), so that the rings of all stages and replicas share the NICs and the fabric's switches as the
    buckets at the end of a step do (the stages' last backwards end close together); with
    ``every_stage=False`` stage 0's groups alone (FSDP's once-a-step gathers before each stage's first
    forward, which the schedule staggers). NCCL's tuner prices one ring alone: on 128 DGX A100 a 160 MB
    reduce-scatter over DP 64 takes 6.7 ms alone and 13.4 ms beside the other stage's. Channels are the
    tuner's. Cached in ``ctx`` by (layout, op, bytes, axis, stages), and in the search's cache by its
    :func:`stored_key` (a resumed search reads it back)."""
    cfg = c.config(ctx.global_batch_size, ctx.base_parallel)
    lay = Layout(cfg)
    ranks = [lay.rank(pp=s) for s in range(cfg.pp)]
    gpus = ctx.gpus
    placement = {r: gpus[r] for r in range(cfg.world_size)}
    sim = ctx.scenario.simulation
    engine = _engine_factory(sim, scenario_dir(ctx.scenario))
    groups = ctx.groups(c)
    cache = ctx.__dict__.setdefault("_dp_probe", {})
    layout_key = (c.tp, c.cp, c.ep, c.pp, c.dp, c.rank_order)

    def probe(op: str, size_bytes: float, axis: str, every_stage: bool = True) -> tuple[float, int]:
        if size_bytes <= 0 or groups[axis].n <= 1:
            return 0.0, 0
        key = (layout_key, op, int(size_bytes), axis, every_stage)
        hit = cache.get(key)
        if hit is not None:
            return hit
        h = stored_key(ctx, "dp_probe", key)
        stored = _stored(ctx).get(h)
        if stored is not None:
            hit = cache[key] = (float(stored["probe_s"]), int(stored["channels"]))
        else:
            programs = {}
            for r in ranks if every_stage else ranks[:1]:
                programs[r] = Program(r)
                programs[r].add(Collective(op, int(size_bytes), lay.group(r, (axis, "cp")),
                                           dtype="bf16" if op == "all_gather" else "fp32", name=f"probe_{axis}_{op}"))
            cluster = Cluster(ctx.topology, record=False, cost_model=ctx.cost_model)
            res = Runtime(cluster, programs, placement=placement, host_launch_overhead_s=0.0, nccl=engine(cluster),
                          mirror=step2_mirror(lay)).run()
            hit = cache[key] = (res.end_time_s, ctx.coll(op, size_bytes, groups[axis])[1])
            _keep(ctx, h, c, {"probe_s": hit[0], "channels": hit[1]}, "dp_probe")
        return hit

    return probe


def _sampled_data(ctx, c: Candidate, layers: int) -> dict[str, Any]:
    """The scenario dict of plan ``c`` with ``layers`` layers."""
    data: dict[str, Any] = candidate_data(ctx.scenario, c)
    data["model"] = dict(data["model"], num_layers=layers)
    return data


def _runs(ctx) -> dict[str, float | None]:
    """``ctx``'s sampled runs: run key -> iteration time (``None``: refused)."""
    runs: dict[str, float | None] = ctx.__dict__.setdefault("_runs", {})
    return runs


def _record_run(ctx, key: str, result: dict[str, Any], plan: Candidate, layers: int) -> float | None:
    """Keep one sampled run's iteration time in ``ctx`` (``None``: refused), count it, and append it to
    the search's cache (``ctx.run_cache``, :func:`refine`'s ``cache``)."""
    t = result.get("iteration_time_s")
    ctx.refine_runs = getattr(ctx, "refine_runs", 0) + 1
    if not result.get("over_budget"):
        append_cache(getattr(ctx, "run_cache", None), key, plan, result, sampled_layers=layers)
    hit = _runs(ctx)[key] = float(t) if t is not None else None
    return hit


def _simulated_s(ctx, c: Candidate, layers: int) -> float | None:
    """Simulated iteration time of plan ``c`` with ``layers`` layers (``None``: the simulator refused it);
    cached in ``ctx`` by the run's :func:`scenario_key`."""
    data = _sampled_data(ctx, c, layers)
    key = scenario_key(data)
    runs = _runs(ctx)
    if key in runs:
        return runs[key]
    return _record_run(ctx, key, simulate_plan(data, ctx.scenario.source or ""), c, layers)


def sampled_runs(ctx, c: Candidate) -> Iterator[tuple[Candidate, int]]:
    """The (plan, layers) runs :func:`sampled_time_s` simulates for plan ``c`` where none is refused."""
    layers = ctx.model_cfg.num_layers
    k1, k2 = SAMPLED_LAYERS
    if layers <= k2:
        yield c, layers
        return
    every = replace(c, recompute_method="", recompute_num_layers=0)
    yield every, k1
    yield every, k2
    rec = recomputed_layers(c.recompute_method, c.recompute_num_layers, [layers]) if c.recompute_method else layers
    if rec < layers:
        yield replace(c, recompute_method="block", recompute_num_layers=k1), k2


def sampled_time_s(ctx, c: Candidate) -> float | None:
    """Plan ``c``'s iteration time (seconds) extrapolated from simulations with :data:`SAMPLED_LAYERS`
    ``(k1, k2)`` layers (module docstring; a model with at most ``k2`` layers is simulated whole);
    ``None`` where the simulator refuses the plan. Cached in ``ctx`` by plan.

    With Megatron's ``--recompute-method`` only ``R`` of the ``L`` layers re-run their forward: the time
    is affine in both counts, ``T = T1 + (R - k1) s_full + (L - R) s_plain``, with ``T1``, ``T2`` every
    layer recomputed on ``k1``, ``k2`` layers (``s_full`` their slope) and ``T3`` ``k1`` of ``k2`` layers
    recomputed (``--recompute-method block``; ``s_plain = (T3 - T1) / (k2 - k1)``)."""
    cache = ctx.__dict__.setdefault("_sampled", {})
    if c in cache:
        return cache[c]
    layers = ctx.model_cfg.num_layers
    k1, k2 = SAMPLED_LAYERS
    runs = list(sampled_runs(ctx, c))
    t: float | None = None
    if len(runs) == 1:  # at most k2 layers: simulated whole
        t = _simulated_s(ctx, *runs[0])
    else:  # each layer as the plan recomputes, on k1 and k2 layers; then k1 of k2 recomputed
        rec = recomputed_layers(c.recompute_method, c.recompute_num_layers, [layers]) if c.recompute_method \
            else layers
        t1 = _simulated_s(ctx, *runs[0])
        t2 = _simulated_s(ctx, *runs[1]) if t1 is not None else None
        t3 = _simulated_s(ctx, *runs[2]) if t2 is not None and len(runs) > 2 else t2
        if t1 is not None and t2 is not None and t3 is not None:
            t = t1 + (rec - k1) * (t2 - t1) / (k2 - k1) + (layers - rec) * (t3 - t1) / (k2 - k1)
    cache[c] = t
    return t


def _retimed(e: Estimate, t: float) -> Estimate:
    """``e`` with iteration time ``t`` (its compute and bubble kept; exposed communication the rest)."""
    r = e.iteration_time_s / t
    return replace(e, iteration_time_s=t, exposed_comm_s=max(t - e.compute_s - e.bubble_s, 0.0),
                   tokens_per_s_per_gpu=e.tokens_per_s_per_gpu * r, mfu=e.mfu * r, priced="sampled")


def refined_estimate(ctx, c: Candidate) -> Estimate:
    """The screen's estimate of ``c`` re-priced by the simulator (module docstring); the analytic one for a
    plan that does not fit or that the simulator refuses."""
    e = ctx.estimate(c)
    if not e.fits:
        return e
    if sampled(c):
        t = sampled_time_s(ctx, c)
        return _retimed(e, t) if t is not None and t > 0 else e
    mem = ctx.memory(c)
    need, cap = ctx.hbm_limit(mem)
    measured: dict[Any, Any] = {**step1_profiles(ctx, c), "dp_coll": dp_probe(ctx, c)}
    return replace(ctx._timed(c, mem, need, cap, measured), priced="step1")


def refine(ctx, fit: Sequence[Estimate], n: int = REFINE_PLANS, progress: Callable[[int], Any] | None = None,
           executor: Executor | None = None, cache: str | Path | None = None) -> list[Estimate]:
    """``fit`` (fitting estimates, fastest first) with its first ``n`` re-priced by
    :func:`refined_estimate`, fastest first again; ``progress(1)`` after each plan (a tqdm ``update``).

    ``executor`` (``None``: all here, one after the other): the sampled-layer runs of the plans without
    pipeline stages are submitted to it first, the pipelines are re-priced here meanwhile, and then the
    runs are collected; the result is the same either way (each run is one deterministic simulation).
    ``cache``: the search's JSONL cache (:mod:`scenarios.search.simulate`): runs found there are read
    back, and each new one is appended as it arrives, so that a resumed search re-prices without
    simulating again (kept for the searches that follow on ``ctx``): the sampled-layer runs, the step-1
    passes and the data-parallel probes alike."""
    if cache is not None:
        ctx.run_cache = cache
        runs, stored = _runs(ctx), _stored(ctx)
        for key, result in load_cache(cache).items():
            if "pass_profiles" in result or "probe_s" in result:
                stored.setdefault(key, result)
                continue
            t = result.get("iteration_time_s")
            runs.setdefault(key, float(t) if t is not None else None)
    head = [e.candidate for e in fit[:n]]
    pooled = [c for c in head if sampled(c) and ctx.estimate(c).fits] if executor is not None else []
    waits, futures = _submit_sampled(ctx, pooled, executor) if executor is not None else ({}, {})
    out: dict[Candidate, Estimate] = {}
    for c in head:
        if c not in waits:
            out[c] = refined_estimate(ctx, c)
            if progress is not None:
                progress(1)
    _collect(ctx, waits, futures, progress)
    out.update((c, refined_estimate(ctx, c)) for c in waits)  # their runs are cached: nothing simulated here
    return sorted(out.values(), key=lambda e: (e.iteration_time_s, e.candidate)) + list(fit[n:])


def _submit_sampled(ctx, plans: Sequence[Candidate], executor: Executor
                    ) -> tuple[dict[Candidate, set[str]], dict[Future, tuple[str, Candidate, int]]]:
    """Submit the sampled-layer runs of ``plans`` (:func:`sampled_runs`; each distinct run once, none
    already cached in ``ctx``) to ``executor``. Returns plan -> the run keys it waits for, and the
    futures with their run keys and (plan, layers) runs."""
    runs = _runs(ctx)
    source = ctx.scenario.source or ""
    waits: dict[Candidate, set[str]] = {}
    futures: dict[Future, tuple[str, Candidate, int]] = {}
    submitted: set[str] = set()
    for c in plans:
        waits[c] = set()
        for p, layers in sampled_runs(ctx, c):
            data = _sampled_data(ctx, p, layers)
            key = scenario_key(data)
            if key in runs:
                continue
            waits[c].add(key)
            if key not in submitted:
                submitted.add(key)
                futures[executor.submit(simulate_plan, data, source)] = key, p, layers
    return waits, futures


def _collect(ctx, waits: dict[Candidate, set[str]], futures: dict[Future, tuple[str, Candidate, int]],
             progress: Callable[[int], Any] | None) -> None:
    """Cache the runs of ``futures`` in ``ctx`` as they finish (:func:`_submit_sampled`), adding their
    CPU to ``ctx.refine_worker_cpu_s``; ``progress(1)`` as each plan of ``waits`` has all of its runs."""
    plans_of: dict[str, list[Candidate]] = {}
    left = {c: len(keys) for c, keys in waits.items()}
    for c, keys in waits.items():
        for k in keys:
            plans_of.setdefault(k, []).append(c)
        if not keys and progress is not None:
            progress(1)
    for fut in as_completed(futures):
        (key, plan, layers), result = futures[fut], fut.result()
        _record_run(ctx, key, result, plan, layers)
        ctx.refine_worker_cpu_s = getattr(ctx, "refine_worker_cpu_s", 0.0) + float(result.get("cpu_s", 0.0))
        for c in plans_of[key]:
            left[c] -= 1
            if not left[c] and progress is not None:
                progress(1)
