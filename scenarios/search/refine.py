"""Tier 1b of the search: the screen's fastest plans re-priced with layer passes the simulator times.

The analytic screen (:mod:`scenarios.search.screen`) prices a layer pass from its kernels' solo times and
NCCL's predicted collective times. What it cannot see is what happens between them on the GPU and the
fabric: a TP-overlap chunk pipeline's collectives holding SMs beside the GEMMs they overlap (userbuffers,
async TP), ring-attention sends of every data-parallel replica's CP ring sharing the NICs and the
fabric (a CP 8 ring across 4 nodes slows as the replicas grow), launch gaps. The simulator's
hierarchical engine times exactly that once per distinct pass (step 1,
:func:`scenarios.hierarchical.pass_profiles`: one micro-batch of each layer pass on stage 0's TP x CP
ranks of the real cluster, every data-parallel replica mirrored), and so does this tier, for the plans
the screen ranks fastest: each distinct (shard, layout, recomputation) is timed once and the plan's
iteration composed as the screen composes it (:class:`scenarios.search.screen._StageTimes` with
``measured``). The step-1 passes are the ones every hierarchical run uses, so a refined plan's layer
passes are the simulation's own; what stays analytic is the pipeline schedule and the data-parallel
tail.

Not refined: ZeRO-3 plans (FSDP2 and DeepSpeed), whose per-unit gathers the screen composes around
the pass itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from hwmodel.runtime import DEFAULT_HOST_LAUNCH_OVERHEAD_S
from scenarios.hierarchical import PassProfile, pass_profiles
from scenarios.runner import _engine_factory, scenario_dir, trace_options
from scenarios.search.estimate import Estimate
from scenarios.search.space import Candidate
from workload.parallel.rank_trace import trace_rank

REFINE_PLANS = 300
"""How many of the screen's fastest fitting plans :func:`refine` re-prices (the CPU it costs grows with
the distinct passes among them, not the plans: see docs/DESIGN.md, "Search: the screen's fastest plans
re-priced with step-1 layer passes")."""

Profiles = dict[tuple[str, str], PassProfile]


def refinable(c: Candidate) -> bool:
    """Whether the plan's layer passes can be timed alone: not a ZeRO-3 plan (FSDP2 or DeepSpeed gather
    per unit around the pass, which the screen composes)."""
    return c.zero != 3


def pass_key(ctx, c: Candidate) -> tuple:
    """What a plan's step-1 passes depend on: the shard (:meth:`ScreenContext.shard_key`), the layout
    (TP, CP, EP, PP, DP and the rank order place the mirrored replicas), and the recomputation."""
    return (ctx.shard_key(c), c.tp, c.cp, c.ep, c.pp, c.dp, c.rank_order, c.recompute, c.tp_comm_overlap,
            c.async_tp)


def step1_profiles(ctx, c: Candidate) -> Profiles:
    """The hierarchical engine's step-1 :class:`PassProfile` of each layer pass of plan ``c`` (cached in
    ``ctx`` by :func:`pass_key`). Traced with one layer per virtual stage and even stages: step 1 runs
    layer 0 of stage 0, whatever the split (Megatron's ``--recompute-method`` is priced by the screen)."""
    key = pass_key(ctx, c)
    cache = ctx.__dict__.setdefault("_step1", {})
    hit = cache.get(key)
    if hit is None:
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
        ctx.refine_traces = getattr(ctx, "refine_traces", 0) + 1
    return hit


def refined_estimate(ctx, c: Candidate) -> Estimate:
    """The screen's estimate of ``c`` with its layer passes timed by step 1 (:func:`step1_profiles`); the
    analytic one for a plan that does not fit or is not :func:`refinable`."""
    e = ctx.estimate(c)
    if not e.fits or not refinable(c):
        return e
    mem = ctx.memory(c)
    need, cap = ctx.hbm_limit(mem)
    return ctx._timed(c, mem, need, cap, step1_profiles(ctx, c))


def refine(ctx, fit: Sequence[Estimate], n: int = REFINE_PLANS) -> list[Estimate]:
    """``fit`` (fitting estimates, fastest first) with its first ``n`` re-priced by
    :func:`refined_estimate`, fastest first again."""
    head = [refined_estimate(ctx, e.candidate) for e in fit[:n]]
    return sorted(head, key=lambda e: (e.iteration_time_s, e.candidate)) + list(fit[n:])
