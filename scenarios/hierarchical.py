"""The hierarchical engine (ParallelSim's idea): simulate intra-stage work in detail once, then the
inter-stage schedule with one macro task per layer pass.

Step 1 runs each distinct pass -- the embedding, one transformer layer and the head, forward and
backward (recomputation included) -- for ONE micro-batch on the tensor/context-parallel ranks of stage
0, on the real cluster model: kernels sharing SMs and HBM, TP collectives on NVLink. Step 2 builds the
usual per-rank programs with each layer pass replaced by a macro task of that duration
(:attr:`hwmodel.ir.Compute.fixed_time_s`), keeping pipeline send/recv, data-parallel buckets and the
optimizer as separate tasks, so the pipeline schedule, bubbles and gradient overlap are still
simulated on the fabric. Identical layers make step 1 exact up to contention between a layer and
concurrent traffic (data-parallel buckets still take SMs from a macro task). With TP overlap the chunk
pipelines of one layer pass run on into the next, so a block pass is timed as the second of two in a row
(both passes less the first alone). Step 2 simulates one rank per stage: the CP ring lies inside the passes.

A macro task is one compute task to the runtime, but the pass it stands for also holds the layer's
tensor/context-parallel collectives. Step 1 therefore also splits each pass, on one of its ranks, the
way :func:`scenarios.analysis.breakdown` splits an iteration: time computing, communication exposed
(no kernel running) and communication hidden under compute. The macro task carries that split
(:class:`PassProfile`, as :attr:`hwmodel.ir.Compute.pass_profile_s`) and the breakdown
lays it out inside the macro task's interval, so that TP communication counts as communication
(exposed or hidden, as the per-op simulation would) and not as compute.

It lives in ``scenarios`` because it needs both the workload (programs) and the hardware model (the
step-1 probe).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial

from hwmodel.cluster import Cluster
from hwmodel.costmodel import KernelCostModel
from hwmodel.ir import Compute
from hwmodel.runtime import Runtime
from scenarios.analysis import breakdown
from workload.parallel.builder import BuildResult, ModelTrace, RankBuilder, TracedOps, build_programs
from workload.parallel.config import ParallelConfig
from workload.parallel.placement import Layout
from workload.parallel.recompute import not_recomputed

PASSES = (("pre", "fwd"), ("block", "fwd"), ("post", "fwd"), ("post", "bwd"), ("block", "bwd"), ("pre", "bwd"))
"""The distinct layer passes step 1 times, as (part, phase)."""


@dataclass(frozen=True)
class PassProfile:
    """One layer pass of step 1 on one rank, in seconds: its duration and how
    :func:`scenarios.analysis.breakdown` splits it (the rest of ``time_s`` is launch gaps)."""

    time_s: float
    compute_s: float = 0.0
    exposed_comm_s: float = 0.0
    hidden_comm_s: float = 0.0

    def as_tuple(self) -> tuple[float, float, float, float]:
        """``(time_s, compute_s, exposed_comm_s, hidden_comm_s)``, a macro task's ``pass_profile_s``."""
        return (self.time_s, self.compute_s, self.exposed_comm_s, self.hidden_comm_s)


def pass_times(trace: ModelTrace, cfg: ParallelConfig, topology, engine_factory: Callable,
               host_launch_overhead_s: float, cost_model: KernelCostModel | None = None
               ) -> dict[tuple[str, str], float]:
    """Seconds of each layer pass for one micro-batch on stage 0's TP x CP ranks (step 1)."""
    return {k: p.time_s for k, p in pass_profiles(trace, cfg, topology, engine_factory,
                                                  host_launch_overhead_s, cost_model).items()}


def pass_profiles(trace: ModelTrace, cfg: ParallelConfig, topology, engine_factory: Callable,
                  host_launch_overhead_s: float, cost_model: KernelCostModel | None = None
                  ) -> dict[tuple[str, str], PassProfile]:
    """:class:`PassProfile` of each layer pass for one micro-batch on stage 0's TP x CP ranks (step 1),
    split on the lowest of those ranks; ``cost_model``: the run's (default: the cluster's own)."""
    layout = Layout(cfg)
    ops = TracedOps(trace)
    ranks = sorted({layout.rank(tp=t, cp=c) for t in range(cfg.tp) for c in range(cfg.cp)})
    gpus = topology.gpus()
    placement = {r: gpus[r] for r in range(cfg.world_size)}
    per_vstage = cfg.stage_layers(trace.num_layers)
    out = {}
    # Megatron's --recompute-method: layers outside every checkpoint run a backward without recomputation
    plain = replace(cfg, recompute_granularity="none", recompute_method=None, recompute_num_layers=None)
    extra = [("block", "bwd_plain")] if not_recomputed(cfg.recompute_method, cfg.recompute_num_layers, per_vstage) \
        else []
    # TP overlap's chunk pipelines run on into the next layer pass (its first all-gather chunks under the
    # previous pass's last reduce-scatter): a block pass is then timed as the second of two in a row
    repeat = 2 if cfg.tp_comm_overlap or cfg.async_tp else 1

    def profile(part: str, phase: str, passes: int) -> PassProfile | None:
        programs = {}
        for r in ranks:
            b = RankBuilder(r, trace=trace, config=plain if phase == "bwd_plain" else cfg, layout=layout, ops=ops,
                            stage_layers=per_vstage)
            for _ in range(passes):
                b.add_pass(part, "bwd" if phase == "bwd_plain" else phase, 0 if part == "block" else None)
            programs[r] = b.program
        if not any(p.tasks for p in programs.values()):
            return None
        cluster = Cluster(topology, record=False, cost_model=cost_model)
        res = Runtime(cluster, programs, placement=placement, host_launch_overhead_s=host_launch_overhead_s,
                      nccl=engine_factory(cluster), mirror=partial(layout.mirror, fixed=("tp",))).run()
        t = max(res.end_time_s - host_launch_overhead_s, 0.0)
        split = breakdown(res.events, res.end_time_s, pipeline=False).get(ranks[0])
        if split is None:
            return PassProfile(t)
        compute = min(split.compute_s, t)
        exposed = min(split.exposed_comm_s, t - compute)
        return PassProfile(t, compute, exposed, min(split.comm_hidden_s, compute))

    for part, phase in [*PASSES, *extra]:
        one = profile(part, phase, 1)
        if one is not None and part == "block" and repeat > 1:
            one = _marginal(one, profile(part, phase, repeat))
        out[(part, phase)] = one if one is not None else PassProfile(0.0)
    return out


def _marginal(one: PassProfile, two: PassProfile | None) -> PassProfile:
    """The second of two passes in a row: ``two`` (both passes) less ``one`` (the first alone), term by term."""
    if two is None:
        return one
    t = max(two.time_s - one.time_s, 0.0)
    compute = min(max(two.compute_s - one.compute_s, 0.0), t)
    exposed = min(max(two.exposed_comm_s - one.exposed_comm_s, 0.0), t - compute)
    return PassProfile(t, compute, exposed, min(max(two.hidden_comm_s - one.hidden_comm_s, 0.0), compute))


def step2_mirror(layout: Layout) -> Callable[..., list[tuple[int, ...]]]:
    """Step 2's mirror: its programs (:func:`macro_programs`) simulate one rank per stage, so the
    context-parallel coordinate is shifted too (no ring-attention send needs its receiver simulated)."""
    return partial(layout.mirror, shift_cp=True)


class _MacroOps:
    """Stands in for the traced ops: one macro task per (part, phase, block)."""

    def __init__(self, trace: ModelTrace, times: dict[tuple[str, str], PassProfile], plain: set[int]) -> None:
        self.ops = TracedOps(trace)
        self.times = times
        self.plain = plain
        """Layers outside every checkpoint of Megatron's ``--recompute-method`` (their backward: ``bwd_plain``)."""
        self._cache: dict[tuple, list] = {}

    def get(self, part: str, phase: str, block: int | None = None) -> list:
        key = (part, phase, block)
        hit = self._cache.get(key)
        if hit is None:
            plain = part == "block" and phase == "bwd" and block in self.plain
            prof = self.times.get((part, "bwd_plain" if plain else phase), PassProfile(0.0))
            real = [o for o in self.ops.get(part, phase, block) if isinstance(o, Compute)]
            layer = f"layers.{block}" if part == "block" else part
            hit = [Compute(f"{part}_{phase}", "macro", sum(o.flops for o in real),
                           sum(o.bytes_accessed for o in real), layer=layer, phase=phase,
                           fixed_time_s=prof.time_s, pass_profile_s=prof.as_tuple())] if prof.time_s > 0 else []
            self._cache[key] = hit
        return hit


def macro_programs(trace: ModelTrace, cfg: ParallelConfig, topology, engine_factory: Callable, *,
                   host_launch_overhead_s: float, cost_model: KernelCostModel | None = None) -> BuildResult:
    """Representative-rank programs with macro layer passes (step 2), one rank per pipeline stage; run
    them in symmetry mode with ``Layout.mirror(..., shift_cp=True)`` (:func:`step2_mirror`)."""
    profiles = pass_profiles(trace, cfg, topology, engine_factory, host_launch_overhead_s, cost_model)
    plain = not_recomputed(cfg.recompute_method, cfg.recompute_num_layers, cfg.stage_layers(trace.num_layers))
    # one rank per stage: the CP ring lies inside the macro passes, so CP peers are mirrored as DP replicas are
    res = build_programs(trace, cfg, ranks=Layout(cfg).representatives(every_cp=False),
                         ops=_MacroOps(trace, profiles, plain))
    res.info["pass_times_s"] = {f"{p}_{ph}": prof.time_s for (p, ph), prof in profiles.items()}
    return res
