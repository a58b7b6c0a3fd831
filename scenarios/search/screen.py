"""Tier 1 of the search: an analytic estimate of a plan's iteration time and memory, no SimPy.

Built from the same pieces as a simulation, composed in closed form instead of simulated:

* the traced model (:func:`workload.parallel.rank_trace.trace_rank`), traced once per distinct shard
  -- (TP, SP, CP, EP, micro-batch) -- with one layer (the zoo's layers are identical, the tracer would
  clone the first anyway) and reused for every plan with that shard;
* the kernel cost model (:class:`hwmodel.costmodel.KernelCostModel`, sustained clock, as
  :class:`hwmodel.cluster.Cluster` prices kernels), each kernel at its solo time;
* NCCL 2.30.7's tuner (:func:`hwmodel.nccl.tuner.choose`) for every collective, on the communicator
  the plan's :class:`workload.parallel.placement.Layout` gives rank 0 (all-to-all and pipeline p2p:
  the p2p latency plus bytes over the NVLink or NIC bandwidth);
* the pipeline bubble closed form, ``(p - 1) / v`` stage-micro-batch times (SC'21 §2.2);
* the memory model and the framework's memory, by the function ``trainsim run`` uses for its verdict
  (:func:`scenarios.runner.memory_of`): the same figure and the same usable HBM;
* DeepSpeed ZeRO-3 by its coordinator's fetch plan (:mod:`scenarios.search.screen_deepspeed`).

Composition (times per micro-batch of the slowest stage ``t_mb``, ``m`` micro-batches, ``p`` stages of
``v`` chunks): ``T = m t_mb + (p-1)/v t_mb + 2 (p v - 1) t_p2p + max over stages (exposed gradient
reduction + optimizer + exposed parameter all-gather)``. TP/EP collectives are on the compute stream
(synchronous, as in Megatron); a ring-attention K/V step is exposed beyond its attention chunk; FSDP
gathers (prefetched one unit ahead) are exposed beyond the unit's compute; with ``overlap_grad_reduce``
the buckets hide behind one micro-batch's backward of the stage (the last bucket never hides). Not
modelled: contention between overlapped communication and compute, and link sharing between
concurrent collectives -- the simulation (tier 2) has both.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from hwmodel.cluster import Cluster
from hwmodel.costmodel import KernelCostModel
from hwmodel.ir import Compute
from hwmodel.nccl import tuner as nccl_tuner
from hwmodel.nccl.engine import NcclEngine
from hwmodel.nccl.tuner_config import TunerConfigError, load_tuner_config
from hwmodel.variation import DEFAULT_GPU_SPEED_SPREAD, straggler_slowdown
from scenarios.metrics import peak_dtype_for
from scenarios.runner import build_model_config, build_topology, check_dtype, memory_of, system_gpu
from scenarios.scenario import Scenario
from scenarios.search.estimate import Estimate
from scenarios.search.overlap import chunked_exposed
from scenarios.search.screen_deepspeed import deepspeed_passes_s, hook_segments
from scenarios.search.screen_fsdp import foreach_adamw_s, fsdp_copies_s, fsdp_once_s, fsdp_pass_s
from scenarios.search.space import Candidate, ModelFacts
from workload.custom import CustomModel
from workload.fp8 import DEFAULT_RECIPE
from workload.fp8.params import layer_weight_kernels
from workload.memory import MemoryBreakdown
from workload.parallel.builder import (
    ELEM_BYTES,
    GRAD_REDUCE_BYTES,
    SELECTIVE_KINDS,
    TracedCollective,
    TracedOps,
)
from workload.parallel.config import ParallelConfig
from workload.parallel.optimizer import ADAM_BYTES_PER_PARAM, ADAM_FLOPS_PER_PARAM
from workload.parallel.placement import Layout
from workload.parallel.rank_trace import trace_rank
from workload.parallel.recompute import recomputed_layers
from workload.parallel.sac import op_sac_recomputed
from workload.parallel.tp_overlap import Pipelined, n_chunks, pair_collectives
from workload.zoo.gpt import sc21_applies
from workload.zoo.gpt import sc21_flops_per_iteration as megatron_flops_per_iteration

DEFAULT_BUCKET_BYTES = ParallelConfig().grad_bucket_size_bytes


@dataclass(frozen=True)
class Group:
    """A communicator as NCCL's model sees it: ranks, its :class:`CommTopology`, and the key (nodes,
    ranks per node, ranks) that is all the model depends on."""

    n: int
    ct: Any
    key: tuple[int, int, int]


@dataclass
class ShardCosts:
    """One traced shard's per-micro-batch costs (seconds of solo kernel time; collectives unpriced)."""

    compute: dict[tuple[str, str], float]
    """(part, phase) -> kernel time; part ``pre``, ``block`` (one layer), ``post``."""
    colls: dict[tuple[str, str], list[TracedCollective]]
    selective_s: float
    """One layer's attention core, re-run by selective recomputation."""
    attn: dict[str, tuple[float, float]]
    """phase -> (one attention kernel's time, its K/V block bytes) for ring attention."""
    flops: dict[str, float]
    """part -> model FLOPs of fwd + bwd for one micro-batch; ``attention`` for the CP correction."""
    params: dict[str, int]
    act_bytes: int
    dtype: str
    tp_pairs: dict[tuple[str, str], list[tuple[str, int, float]]] = field(default_factory=dict)
    """(mode, phase) -> one layer's TP collectives pipelined with their GEMM under ``tp_comm_overlap``
    (mode ``userbuffers``) or ``async_tp`` (``async``): (op, bytes, the GEMM's solo time)."""
    sac_s: float = 0.0
    """One layer's kernels per-op SAC re-runs (``selective_op``, :func:`workload.parallel.sac.op_sac_recomputed`)."""
    weight_cast_s: dict[tuple[str, bool], float] = field(default_factory=dict)
    """(phase, ZeRO-3) -> one layer's FP8 weight kernels (:func:`workload.fp8.params.layer_weight_kernels`)."""
    ds_segments: dict[str, list[tuple[str, tuple[int, ...], float, list[TracedCollective]]]] = field(
        default_factory=dict)
    """phase -> one layer's pass split at DeepSpeed's module hooks: (module, its parameters' elements, kernel
    seconds, TP collectives) (:func:`workload.parallel.deepspeed_zero.module_order`, ``segment_starts``)."""


class ScreenContext:
    """A scenario's cluster, model and pricing, built once; :meth:`estimate` prices one plan.

    Raises:
        ValueError: the model is not a zoo transformer (the screen needs its layers and shapes), or a
            field of the scenario is at fault (the runner's one-line messages).
    """

    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        src = Path(scenario.source) if scenario.source else None
        base_dir = src.parent if src is not None and src.is_file() else None
        system, tr = scenario.system, scenario.training
        gpu = system_gpu(system, base_dir)
        self.topology = build_topology(system, base_dir, gpu=gpu)
        self.gpu = self.topology.gpu_spec
        self.dtype = tr.get("dtype", "bf16")
        check_dtype(self.dtype, self.gpu)
        self.model_cfg = build_model_config(scenario.model, tr, base_dir, trust_code=scenario.trust_code)
        if isinstance(self.model_cfg, CustomModel) or not hasattr(self.model_cfg, "num_attention_heads"):
            raise ValueError(f"[model] trainsim search plans transformer models of the zoo (their layers, heads and "
                             f"shapes bound the plans); {getattr(self.model_cfg, 'name', 'this model')} is not one")
        self.gpus = self.topology.gpus()
        self.world = len(self.gpus)
        mc = self.model_cfg
        self.global_batch_size = int(tr.get("global_batch_size", self.world))
        self.training = dict(tr)
        self.compile = bool(tr.get("compile", False))
        self.fp8_recipe = tr.get("fp8_recipe", DEFAULT_RECIPE) if self.dtype == "fp8" else ""
        self.facts = ModelFacts(num_layers=mc.num_layers, num_attention_heads=mc.num_attention_heads,
                                seq_length=mc.seq_length, num_experts=getattr(mc, "num_moe_experts", None) or 0,
                                world_size=self.world, gpus_per_node=self.topology.gpus_per_node,
                                global_batch_size=self.global_batch_size, training=self.training, gpu=self.gpu,
                                zero_impl=scenario.parallel.get("zero_impl", "megatron"))
        sim = scenario.simulation
        tuner_rules = None
        if sim.get("nccl_tuner_config"):
            try:
                tuner_rules = load_tuner_config(sim["nccl_tuner_config"])
            except TunerConfigError as exc:
                raise ValueError(f"simulation.nccl_tuner_config: {exc}") from None
        self.engine = NcclEngine(Cluster(self.topology, record=False), algorithm=sim.get("nccl_algo"),
                                 protocol=sim.get("nccl_proto"), tuner_config=tuner_rules,
                                 ib_qps_per_connection=sim.get("nccl_ib_qps_per_connection", 1),
                                 ib_adaptive_routing=sim.get("nccl_ib_adaptive_routing", False))
        self.tuner_rules = tuner_rules
        # the run's clock: sustained, slowed by the expected slowest GPU (scenarios.runner.run_cost_model)
        spread = float(sim.get("gpu_speed_spread", DEFAULT_GPU_SPEED_SPREAD))
        self.cost_model = KernelCostModel(self.gpu, sustained=True,
                                          speed_scale=1.0 / straggler_slowdown(spread, self.world))
        self.peak_flops = float(self.gpu.peak_flops(peak_dtype_for(self.dtype)))
        self.grad_bytes = GRAD_REDUCE_BYTES.get("bf16" if self.dtype == "fp8" else self.dtype, 4)
        self.eb = ELEM_BYTES.get("bf16" if self.dtype == "fp8" else self.dtype, 2)
        self.bucket_bytes = int(scenario.parallel.get("grad_bucket_size_bytes", DEFAULT_BUCKET_BYTES))
        self.base_parallel = dict(scenario.parallel)
        self._shards: dict[tuple, ShardCosts] = {}
        self._memory: dict[tuple, MemoryBreakdown] = {}
        self._groups: dict[tuple, dict[str, tuple[str, ...]]] = {}
        self._coll: dict[tuple, tuple[float, int]] = {}
        self._opt: dict[int, float] = {}
        self._stage_layers: dict[tuple, list[int]] = {}
        self._tpo: dict[tuple, float] = {}
        self._dp: dict[tuple, tuple[float, float, float, float, int, int]] = {}
        self._ds: dict[tuple, float] = {}
        self.traces = 0
        self.model_flops = self._megatron_flops()

    # -- shards ------------------------------------------------------------------------------------
    def shard_key(self, c: Candidate) -> tuple:
        """What a shard's trace depends on: the sizes, torch.compile (async TP compiles), the FP8 recipe and,
        for FP8 (sequence-parallel all-gathers in FP8 under overlap), the TP overlap; and whether the plan
        runs PyTorch's FSDP2 (``fsdp = true``: torchtitan's model, :func:`workload.parallel.rank_trace.
        trace_rank`), with async TP then (DTensor's dim-0 layout copies stay unless the async pass fuses)."""
        recipe = c.fp8_recipe or self.fp8_recipe
        overlap = (c.tp_comm_overlap, c.async_tp) if recipe else ()
        fsdp = (c.async_tp,) if c.zero == 3 and c.zero_impl != "deepspeed" else None
        return (c.tp, c.sp, c.cp, c.ep, c.mbs, self.compile or c.async_tp, recipe, overlap, fsdp)

    def shard(self, c: Candidate) -> ShardCosts:
        """The traced costs of ``c``'s shard (traced on first use)."""
        key = self.shard_key(c)
        hit = self._shards.get(key)
        if hit is None:
            hit = self._shards[key] = self._trace(c)
        return hit

    def _trace(self, c: Candidate) -> ShardCosts:
        one_layer = replace(self.model_cfg, num_layers=1)
        key = self.shard_key(c)
        recipe = key[6] or DEFAULT_RECIPE
        cfg = ParallelConfig(tensor_model_parallel_size=c.tp, sequence_parallel=c.sp, context_parallel_size=c.cp,
                             expert_model_parallel_size=c.ep, micro_batch_size=c.mbs,
                             tp_comm_overlap=c.tp_comm_overlap and bool(key[6]),
                             async_tp=c.async_tp and (bool(key[6]) or key[8] is not None),
                             fsdp=key[8] is not None).resolve(c.tp * c.cp * c.ep)
        trace = trace_rank(one_layer, cfg, dtype=self.dtype, compile=key[5], fp8_recipe=recipe,
                           fp8_param_gather=bool(self.training.get("fp8_param_gather", False)))
        self.traces += 1
        ops = TracedOps(trace)
        compute: dict[tuple[str, str], float] = {}
        colls: dict[tuple[str, str], list[TracedCollective]] = {}
        attn: dict[str, tuple[float, float]] = {}
        times: dict[tuple[str, str], list[float]] = {}
        for part in ("pre", "block", "post"):
            for phase in ("fwd", "bwd"):
                items = ops.get(part, phase, 0 if part == "block" else None)
                colls[(part, phase)] = [it for it in items if isinstance(it, TracedCollective)]
                per = times[(part, phase)] = []
                for k in items:
                    if not isinstance(k, Compute):
                        per.append(0.0)
                        continue
                    s = self.cost_model.cost(k).solo_time_s
                    if k.kind == "attention" and c.cp > 1:  # ring attention: cp steps of the chunk
                        b, h, _, skv, d = k.shape if len(k.shape) == 5 else (1, 1, 1, 1, 1)
                        kv = (2 * b * (k.attention_kv_heads or h) * skv * d * ELEM_BYTES.get(k.dtype, 2)
                              * (2 if phase == "bwd" else 1))  # K and V of the kernel's heads, as the builder
                        attn[phase] = (s, kv)
                        s *= c.cp
                    per.append(s)
                compute[(part, phase)] = sum(per)
        sel = [k for k in ops.get("block", "fwd", 0) if isinstance(k, Compute) and k.kind in SELECTIVE_KINDS
               and k.layer.endswith(".attn")]
        selective = sum(self.cost_model.cost(k).solo_time_s * (c.cp if k.kind == "attention" else 1) for k in sel)
        block_fwd = [k for k in ops.get("block", "fwd", 0) if isinstance(k, Compute)]
        sac = sum(self.cost_model.cost(k).solo_time_s for k in op_sac_recomputed(block_fwd))
        casts = {(ph, z3): sum(self.cost_model.cost(k).solo_time_s
                               for k in layer_weight_kernels(trace, 0, ph, zero3=z3))
                 for ph in ("fwd", "bwd") for z3 in (False, True)}
        segments = {ph: hook_segments(trace, ops.get("block", ph, 0), times[("block", ph)]) for ph in ("fwd", "bwd")}
        g = trace.graph
        flops = {"pre": sum(o.flops for o in g.pre_ops() if o.phase != "opt"),
                 "block": sum(o.flops for o in g.block_ops(0) if o.phase != "opt"),
                 "post": sum(o.flops for o in g.post_ops() if o.phase != "opt"),
                 "attention": sum(o.flops for o in g.block_ops(0) if o.kind == "attention" and o.phase != "opt")}
        params = {"pre": trace.params_pre, "block": trace.params_block, "post": trace.params_post,
                  "expert": trace.params_block_expert, "tied": trace.params_post_tied,
                  "fp8_block": trace.fp8_params_block}
        act = trace.micro_batch_size * trace.seq_length * trace.hidden_size * ELEM_BYTES.get(trace.dtype, 2) // c.tp
        pairs: dict[tuple[str, str], list[tuple[str, int, float]]] = {}
        if c.sp and c.tp > 1:  # the builder's pairing (workload.parallel.tp_overlap), per mode
            for mode in ("userbuffers", "async"):
                for phase in ("fwd", "bwd"):
                    paired = pair_collectives(ops.get("block", phase, 0), hidden=trace.hidden_size, tp=c.tp, mode=mode)
                    pairs[(mode, phase)] = [(it.collective.op, it.collective.size_bytes,
                                             sum(self.cost_model.cost(g).solo_time_s for g in it.gemms))
                                            for it in paired if isinstance(it, Pipelined)]
        return ShardCosts(compute, colls, selective, attn, flops, params, act, trace.dtype, pairs, sac, casts, segments)

    # -- communication -------------------------------------------------------------------------------
    def groups(self, c: Candidate) -> dict[str, Group]:
        """Rank 0's communicators (tp, cp, dp = dp x cp, edp, ep) and its pipeline peer pair."""
        key = (c.tp, c.cp, c.ep, c.pp, c.dp, c.rank_order)
        hit = self._groups.get(key)
        if hit is None:
            cfg = ParallelConfig(tensor_model_parallel_size=c.tp, context_parallel_size=c.cp,
                                 expert_model_parallel_size=c.ep, pipeline_model_parallel_size=c.pp,
                                 data_parallel_size=c.dp, rank_order=c.rank_order)
            lay = Layout(cfg)
            names = {"tp": "tp", "cp": "cp", "ep": "ep", "dp": ("dp", "cp"), "edp": ("edp", "cp")}
            gpus = {k: tuple(self.gpus[r] for r in lay.group(0, ax)) for k, ax in names.items()}
            ring = gpus["cp"]  # ring attention: a send to the next CP rank; the steps go in lockstep, so the
            hops = [(ring[i], ring[(i + 1) % len(ring)]) for i in range(len(ring))]  # slowest hop sets the pace
            gpus["cp"] = next((h for h in hops if self._group(h).key[0] > 1), hops[0]) if len(ring) > 1 else ring
            gpus["pp"] = (self.gpus[0], self.gpus[lay.rank(pp=1)]) if c.pp > 1 else (self.gpus[0],)
            hit = {k: self._group(v) for k, v in gpus.items()}
            self._groups[key] = hit
        return hit

    def _group(self, gpus: tuple[str, ...]) -> Group:
        if len(gpus) == 1:
            return Group(1, None, (1, 1, 1))
        ct = self.engine.comm_topology(gpus)
        return Group(len(gpus), ct, (ct.n_nodes, max(1, round(ct.ppn)), len(gpus)))

    def coll_s(self, op: str, size_bytes: float, group: Group) -> float:
        """NCCL's predicted time of one collective on ``group`` (0 on one rank or no bytes)."""
        return self.coll(op, size_bytes, group)[0]

    def coll(self, op: str, size_bytes: float, group: Group) -> tuple[float, int]:
        """(NCCL's predicted time, channels = SMs it holds) of one collective on ``group``."""
        if group.n <= 1 or size_bytes <= 0:
            return 0.0, 0
        key = (op, int(size_bytes), group.key)
        hit = self._coll.get(key)
        if hit is None:
            if op in ("all_to_all", "p2p"):
                hit = self._p2p_s(op, int(size_bytes), group.ct, group.n), 0
            else:
                ch = nccl_tuner.choose(op, int(size_bytes), group.ct, self.engine.algorithm, self.engine.protocol,
                                       tuner=self.tuner_rules)
                hit = ch.predicted_time_s, ch.n_channels
            self._coll[key] = hit
        return hit

    def sm_tax(self, overlapped_s: float, channels: int) -> float:
        """Extra compute time while a collective holding ``channels`` SMs overlaps ``overlapped_s`` of
        kernels: they run on the SMs left (as the runtime holds a collective's SMs from launch)."""
        sm = self.gpu.sm_count
        return overlapped_s * channels / (sm - channels) if 0 < channels < sm else 0.0

    def _p2p_s(self, op: str, size: int, ct, n: int) -> float:
        """Send/recv and all-to-all: NCCL's p2p latency plus the bytes a rank sends over the slower of
        its NVLink (one node) or NIC (several nodes) bandwidths."""
        same_node = ct.n_nodes == 1
        per_peer = size // n if op == "all_to_all" else size
        _, lat = nccl_tuner.p2p_channels_and_latency(per_peer, ct, same_node=same_node)
        sent = size * (n - 1) / n if op == "all_to_all" else size
        bw = self.gpu.nccl_nvlink_bandwidth_Bps if same_node else self.topology.nic_spec.bandwidth_Bps
        return lat + sent / bw

    def _colls_s(self, items: Iterable[TracedCollective], groups: dict[str, Group]) -> float:
        return sum(self.coll_s(it.op, it.size_bytes, groups[it.axis]) for it in items)

    # -- memory ----------------------------------------------------------------------------------------
    def memory(self, c: Candidate) -> MemoryBreakdown:
        """Peak memory of the busiest GPU with the framework's own memory, by the function ``trainsim run``
        calls (:func:`scenarios.runner.memory_of`) on the plan's resolved configuration, so the screen's
        verdict (:meth:`oom_reason`) is ``run``'s on every plan."""
        m = self.global_batch_size // (c.mbs * c.dp)
        key = (c.tp, c.cp, c.ep, c.pp, c.vpp, c.dp, c.sp, c.zero, c.zero_impl, c.mbs, c.recompute, m, c.first_layers,
               c.last_layers, c.fp8_recipe, c.recompute_method, c.recompute_num_layers)
        hit = self._memory.get(key)
        if hit is None:
            cfg = c.config(self.global_batch_size, self.base_parallel)
            mem = memory_of(self.model_cfg, cfg, c.training_section(self.training), self.gpu)
            if mem is None:  # a zoo transformer always has one (checked in __init__)
                raise ValueError(f"[model] {self.model_cfg.name}: no memory model")
            hit = self._memory[key] = mem
        return hit

    def stage_layers(self, c: Candidate) -> list[int]:
        """Layers per pipeline stage (per model chunk when interleaved), as ``ParallelConfig.stage_layers``."""
        key = (c.pp, c.vpp, c.first_layers, c.last_layers)
        hit = self._stage_layers.get(key)
        if hit is None:
            cfg = ParallelConfig(pipeline_model_parallel_size=c.pp, virtual_pipeline_model_parallel_size=c.vpp,
                                 num_layers_in_first_pipeline_stage=c.first_layers or None,
                                 num_layers_in_last_pipeline_stage=c.last_layers or None)
            hit = self._stage_layers[key] = cfg.stage_layers(self.model_cfg.num_layers)
        return hit

    def hbm_limit(self, mem: MemoryBreakdown) -> tuple[float, float]:
        """(bytes compared, the limit) of ``run``'s verdict (``MemoryBreakdown.fits(gpu)``): the device's
        use (reserved + CUDA context + NCCL buffers) against the usable HBM."""
        if mem.usable_hbm:
            return mem.device_used, mem.usable_hbm
        return mem.total, float(self.gpu.hbm_capacity_bytes)

    def oom_reason(self, mem: MemoryBreakdown) -> str:
        """'' if ``mem`` fits the GPU (``run``'s verdict), else by how much it does not and its largest term."""
        if mem.fits(self.gpu):
            return ""
        need, cap = self.hbm_limit(mem)
        terms = {"parameters": mem.parameters, "gradients": mem.gradients, "optimizer states": mem.optimizer_states,
                 "activations": mem.activations, "recompute workspace": mem.workspace, "fp8 weights": mem.fp8_weights,
                 "fp32 gradient copies": mem.optimizer_step_grads}
        name, value = max(terms.items(), key=lambda kv: kv[1])
        when = " at the optimizer step" * (mem.total > mem.backward_peak)  # fp16's fp32 gradient copies
        return (f"OOM by {(need - cap) / 1e9:.2f} GB{when}: needs {need / 1e9:.2f} GB > {cap / 1e9:.1f} GB usable "
                f"HBM; largest term {name} {value / 1e9:.1f} GB (stage {mem.stage})")

    # -- time ------------------------------------------------------------------------------------------
    def _megatron_flops(self) -> float | None:
        mc = self.model_cfg
        if getattr(mc, "architecture", "") == "gpt" and sc21_applies(mc):  # as GPTFamily.flops
            return megatron_flops_per_iteration(batch=self.global_batch_size, seq=mc.seq_length, layers=mc.num_layers,
                                                hidden=mc.hidden_size, vocab=mc.vocab_size, full_recompute=False)
        return None

    def _optimizer_s(self, params: float) -> float:
        """Megatron's optimizer step over one unit's ``params`` elements (the builder's kernels, one
        each per unit: grad norm, fp16 unscale, fused Adam, copy to model params, zero the grad buffers)."""
        hit = self._opt.get(params)
        if hit is None:
            per = [4, 6, 4] + ([8] if self.dtype == "fp16" else [])
            ks = [Compute("opt", "optimizer", 0.0, b * params, dtype="fp32", phase="opt") for b in per]
            ks.append(Compute("fused_adam", "optimizer", ADAM_FLOPS_PER_PARAM * params, ADAM_BYTES_PER_PARAM * params,
                              dtype="fp32", phase="opt"))
            hit = self._opt[params] = sum(self.cost_model.cost(k).solo_time_s for k in ks) if params > 0 else 0.0
        return hit

    def estimate(self, c: Candidate) -> Estimate:
        """The screen's estimate of one plan (memory first: a plan that does not fit is not timed)."""
        mem = self.memory(c)
        need, cap = self.hbm_limit(mem)
        why = self.oom_reason(mem)
        if why:
            nan = math.nan
            return Estimate(c, nan, nan, nan, nan, need, cap, why, memory=mem)
        return self._timed(c, mem, need, cap)

    def _timed(self, c: Candidate, mem: MemoryBreakdown, need: float, cap: float,
               measured: dict | None = None) -> Estimate:
        sc = self.shard(c)
        g = self.groups(c)
        L = self.model_cfg.num_layers
        p, v = c.pp, c.vpp
        m = self.global_batch_size // (c.mbs * c.dp)
        per_stage = self.stage_layers(c)
        if v > 1:  # chunks: a stage's layers are its v chunks'
            per_stage = [sum(per_stage[k * p + s] for k in range(v)) for s in range(p)]
        # (layers, first, last) of the first, a middle (under uneven stages) and the last stage
        kinds = [(per_stage[0], True, p == 1)] + ([(per_stage[1], False, False)] if p > 2 and (
            c.first_layers or c.last_layers) else []) + ([(per_stage[-1], False, True)] if p > 1 else [])
        stage = _StageTimes(self, sc, c, g, measured)
        passes = [stage.pass_times(n, first=fi, last=la) for n, fi, la in kinds]
        t_mb = max(f + b for f, b, _, _ in passes)
        compute_mb = max(cf + cb for _, _, cf, cb in passes)
        bubble = (p - 1) / v * t_mb
        p2p = 2 * (p * v - 1) * self.coll_s("p2p", sc.act_bytes, g["pp"]) if p > 1 else 0.0
        tail, opt = max(stage.tail(n, first=fi, last=la, t_fwd=ps[0], t_bwd=ps[1])
                        for (n, fi, la), ps in zip(kinds, passes, strict=True))
        T = m * t_mb + bubble + p2p + tail + stage.fp8_casts(max(per_stage))
        if stage.deepspeed:  # the coordinator's replay replaces the per-micro-batch composition
            rc = {"selective": sc.selective_s, "selective_op": sc.sac_s}.get(c.recompute, 0.0) * stage.slow
            key = (self.shard_key(c), g["dp"].key, c.recompute, m)
            ds = self._ds.get(key)
            if ds is None:
                ds = self._ds[key] = deepspeed_passes_s(self, sc, c, g, stage.slow, rc, m)
            T = ds + tail + stage.fp8_casts(max(per_stage))
        compute = m * compute_mb + opt
        tokens = self.global_batch_size * self.model_cfg.seq_length
        flops = self.model_flops
        if flops is None:
            per_mb = sc.flops["pre"] + L * sc.flops["block"] + sc.flops["post"] + (c.cp - 1) * L * sc.flops["attention"]
            flops = per_mb * c.tp * c.cp * m * c.dp
        return Estimate(c, T, compute, bubble, max(T - compute - bubble, 0.0), need, cap, "",
                        tokens / T / self.world, flops / T / self.world / self.peak_flops, memory=mem)


class _StageTimes:
    """Per-stage pieces of one plan's time (see the module docstring's composition)."""

    def __init__(self, ctx: ScreenContext, sc: ShardCosts, c: Candidate, g: dict[str, Group],
                 measured: dict | None = None) -> None:
        self.ctx, self.sc, self.c, self.g, self.measured = ctx, sc, c, g, measured
        comp, co = sc.compute, sc.colls
        self.slow = self._ring_sm_slowdown()
        self.blk_cf, self.blk_cb = comp[("block", "fwd")] * self.slow, comp[("block", "bwd")] * self.slow
        self.blk_f = self.blk_cf + ctx._colls_s(co[("block", "fwd")], g) - self._tp_overlap_saved("fwd")
        self.blk_b = self.blk_cb + ctx._colls_s(co[("block", "bwd")], g) - self._tp_overlap_saved("bwd")
        self.deepspeed = c.zero == 3 and c.zero_impl == "deepspeed"
        self.fsdp2 = c.zero == 3 and not self.deepspeed  # the search's ZeRO-3 plans run PyTorch's FSDP2
        rc = {"none": 0.0, "selective": sc.selective_s * self.slow, "full": self.blk_f,
              "selective_op": sc.sac_s * self.slow}[c.recompute]
        self.rc_compute = {"none": 0.0, "selective": sc.selective_s * self.slow, "full": self.blk_cf,
                           "selective_op": sc.sac_s * self.slow}[c.recompute]
        self.blk_b += rc
        self.blk_f += self._ring_exposed("fwd")
        self.blk_b += self._ring_exposed("bwd") * (2 if c.recompute == "full" else 1)
        self.rc_layer = rc + (self._ring_exposed("bwd") if c.recompute == "full" else 0.0)
        """One layer's recomputation (seconds), of which Megatron's ``--recompute-method`` skips some layers."""
        if measured and ("block", "fwd") in measured:  # step-1 passes (scenarios.search.refine), recompute in
            bf, bb = measured[("block", "fwd")], measured[("block", "bwd")]
            self.blk_f, self.blk_b = bf.time_s, bb.time_s
            self.blk_cf, self.blk_cb = bf.compute_s, max(bb.compute_s - self.rc_compute, 0.0)
        eb = ctx.eb
        self.eb = eb
        # without SP the received 1/tp activation slices are all-gathered over TP before use
        self.recv_ag = ctx.coll_s("all_gather", sc.act_bytes * c.tp, g["tp"]) if c.pp > 1 and not c.sp else 0.0

    def _tp_overlap_saved(self, phase: str) -> float:
        """Time one layer's pass saves when its TP all-gathers and reduce-scatters are pipelined with
        their GEMMs (``tp_comm_overlap``, ``async_tp``; :mod:`workload.parallel.tp_overlap`): with the
        GEMM ``G`` and the collective ``C`` in ``n`` pieces, an all-gather pair takes
        ``max(G, (n-1) C/n + G/n)`` and a reduce-scatter pair ``max(G + C/n, C + G/n)`` instead of
        ``G + C``; userbuffers' reduce-scatter chunks hold their SMs beside the GEMM (the SM tax), async
        TP's reduce-scatter adds its reduction kernel. The copy engines' peer copies
        are priced as NCCL's collective (the simulation has the copies)."""
        c, ctx = self.c, self.ctx
        mode = "userbuffers" if c.tp_comm_overlap else "async" if c.async_tp else ""
        if not mode:
            return 0.0
        key = (mode, phase, ctx.shard_key(c), self.g["tp"].key)
        hit = ctx._tpo.get(key)
        if hit is None:
            hit = 0.0
            for op, size, gemm_s in self.sc.tp_pairs.get((mode, phase), []):
                comm, channels = ctx.coll(op, size, self.g["tp"])
                n = n_chunks(op, mode, c.tp)
                if op == "all_gather":
                    paired = max(gemm_s, comm * (n - 1) / n + gemm_s / n)
                else:
                    paired = max(gemm_s + comm / n, comm + gemm_s / n)
                    if mode == "userbuffers":  # NCCL chunks hold their SMs beside the GEMM pieces
                        paired += ctx.sm_tax(min(gemm_s, comm), channels)
                    else:
                        k = Compute("tp_async_reduce", "elementwise", 0.0, float(size // n * (n + 1)),
                                    dtype=self.sc.dtype)
                        paired += ctx.cost_model.cost(k).solo_time_s
                hit += gemm_s + comm - paired
            ctx._tpo[key] = hit
        return hit

    def _ring_sm_slowdown(self) -> float:
        """Kernel slowdown under context parallelism: the runtime launches a ring-attention receive as
        soon as its stream reaches it, and the receive holds its channels' SMs until the data arrives
        (hwmodel.runtime), so through the passes one receive is pending and kernels run on the SMs it
        leaves: ``sm / (sm - channels)`` (many-wave kernels; 132 / 116 = 1.14 on H100 with 16 p2p
        channels, as simulated)."""
        if self.c.cp == 1 or "fwd" not in self.sc.attn:
            return 1.0
        grp = self.g["cp"]
        nch, _ = nccl_tuner.p2p_channels_and_latency(int(self.sc.attn["fwd"][1]), grp.ct, same_node=grp.ct.n_nodes == 1)
        sm = self.ctx.gpu.sm_count
        return sm / (sm - nch) if 0 < nch < sm else 1.0

    def _ring_exposed(self, phase: str) -> float:
        if self.c.cp == 1 or phase not in self.sc.attn:
            return 0.0
        t_attn, kv = self.sc.attn[phase]
        step = self.ctx.coll_s("p2p", kv, self.g["cp"])
        return (self.c.cp - 1) * max(0.0, step - t_attn)

    def part_params(self, part: str) -> int:
        pr = self.sc.params
        if part == "post":
            return pr["post"] + (pr["pre"] if pr["tied"] and self.c.pp > 1 else 0)
        return pr[part]

    def pass_times(self, Ls: int, *, first: bool, last: bool) -> tuple[float, float, float, float]:
        """(forward, backward, forward compute, backward compute) of one micro-batch on a stage."""
        ctx, sc, g = self.ctx, self.sc, self.g
        f, b = Ls * self.blk_f, Ls * self.blk_b
        cf, cb = Ls * self.blk_cf, Ls * (self.blk_cb + self.rc_compute)
        if self.c.recompute_method:  # the layers outside every checkpoint re-run nothing
            v = self.c.vpp
            skip = Ls - recomputed_layers(self.c.recompute_method, self.c.recompute_num_layers, [Ls // v] * v)
            b, cb = b - skip * self.rc_layer, cb - skip * self.rc_compute
        for part, here in (("pre", first), ("post", last)):
            if not here:
                continue
            pf = sc.compute[(part, "fwd")] * self.slow
            pb = sc.compute[(part, "bwd")] * self.slow
            if self.measured and (part, "fwd") in self.measured:
                f, b = f + self.measured[(part, "fwd")].time_s, b + self.measured[(part, "bwd")].time_s
            else:
                f += pf + ctx._colls_s(sc.colls[(part, "fwd")], g)
                b += pb + ctx._colls_s(sc.colls[(part, "bwd")], g)
            cf, cb = cf + pf, cb + pb
        if self.fsdp2 and self.c.pp == 1:  # under PP: once per step (tail)
            pr = sc.params
            root, blk = pr["pre"] + pr["post"], pr["block"]  # FSDP2's root unit: gathered once, kept
            cpf = fsdp_copies_s(ctx, [(root, 0)] + [(blk, 0)] * Ls, "fwd")
            cpb = fsdp_copies_s(ctx, [(0, root), (0, blk)] + [(blk, blk)] * (Ls - 1), "bwd")  # last block kept
            f += fsdp_pass_s(self, Ls, "fwd") + cpf
            b += fsdp_pass_s(self, Ls, "bwd") + cpb
            cf, cb = cf + cpf, cb + cpb
        if not (first and last):
            f += self.recv_ag * (0 if first else 1)
            b += self.recv_ag * (0 if last else 1)
        return f, b, cf, cb

    def _buckets(self, Ls: int, first: bool, last: bool) -> list[tuple[int, int]]:
        """Gradient buckets in backward order, (dense bytes, expert bytes), as the builder forms them."""
        gb, cap, pr = self.ctx.grad_bytes, self.ctx.bucket_bytes, self.sc.params
        order = ([(self.part_params("post"), 0)] if last else []) + [(pr["block"], pr["expert"])] * Ls + (
            [(pr["pre"], 0)] if first else [])
        out, dense, expert = [], 0, 0
        for n, ne in order:
            dense += (n - ne) * gb
            expert += ne * gb
            if dense + expert >= cap:
                out.append((dense, expert))
                dense = expert = 0
        if dense + expert:
            out.append((dense, expert))
        return out

    def tail(self, Ls: int, *, first: bool, last: bool, t_fwd: float, t_bwd: float) -> tuple[float, float]:
        """(exposed data-parallel communication + optimizer, optimizer) after the last backward."""
        ctx, c, g = self.ctx, self.c, self.g
        scale = 1.0 / c.dp if c.zero >= 1 else 1.0
        step = (lambda n: foreach_adamw_s(ctx, n)) if self.fsdp2 else ctx._optimizer_s
        opt = Ls * step(self.sc.params["block"] * scale)
        if first:
            opt += step(self.sc.params["pre"] * scale)
        if last:
            opt += step(self.part_params("post") * scale)
        if c.zero == 3 and c.pp > 1 and g["dp"].n > 1:
            units = ([self.sc.params["pre"]] if first else []) + [self.sc.params["block"]] * Ls + (
                [self.part_params("post")] if last else [])
            copies = fsdp_copies_s(ctx, [(n, n) for n in units], "bwd") if self.fsdp2 else 0.0  # once a step
            return opt + copies + fsdp_once_s(self, Ls, first, last, t_bwd), opt + copies
        if c.zero == 3 or g["dp"].n == 1:
            return opt, opt
        red_total, red_last, ag_total, ag_last, red_ch, ag_ch = self._dp_comm(Ls, first, last)
        exposed = chunked_exposed(red_total, red_last, t_bwd, c.vpp, c.pp) if c.overlap_grad_reduce else red_total
        ag_exposed = 0.0
        if c.zero in (1, 2):
            ag_exposed = chunked_exposed(ag_total, ag_last, t_fwd, c.vpp, c.pp) if c.overlap_param_gather else ag_total
        # what overlaps compute slows it: the collectives hold their SMs
        tax = ctx.sm_tax(red_total - exposed, red_ch) + ctx.sm_tax(ag_total - ag_exposed, ag_ch)
        return exposed + opt + ag_exposed + tax, opt

    def _dp_comm(self, Ls: int, first: bool, last: bool) -> tuple[float, float, float, float, int, int]:
        """(all bucket reductions, the last one, all parameter all-gathers, the first one) in seconds,
        and the most channels a reduction and a gather hold."""
        ctx, c, g = self.ctx, self.c, self.g
        op = "reduce_scatter" if c.zero in (1, 2) else "all_reduce"
        key = (op, Ls, first, last, self.ctx.shard_key(c), g["dp"].key, g["edp"].key)
        hit = None if self.measured else ctx._dp.get(key)  # a probed plan's collectives are its own
        if hit is None:
            buckets = self._buckets(Ls, first, last)
            eb, gbytes, coll = ctx.eb, ctx.grad_bytes, self.dp_coll
            reds = [(coll(op, d, "dp"), coll(op, e, "edp")) for d, e in buckets]
            gathers = [] if op == "all_reduce" else [
                (coll("all_gather", d // gbytes * eb, "dp"), coll("all_gather", e // gbytes * eb, "edp"))
                for d, e in buckets]
            red = [a[0] + b[0] for a, b in reds]
            ags = [a[0] + b[0] for a, b in gathers]
            hit = (sum(red), red[-1] if red else 0.0, sum(ags), ags[-1] if ags else 0.0,
                   max((max(a[1], b[1]) for a, b in reds), default=0),
                   max((max(a[1], b[1]) for a, b in gathers), default=0))
            if not self.measured:
                ctx._dp[key] = hit
        return hit

    def dp_coll(self, op: str, size_bytes: float, axis: str, every_stage: bool = True) -> tuple[float, int]:
        """(seconds, channels) of one data-parallel collective (``axis`` dp or edp): NCCL's tuner on rank 0's
        communicator, or, for a re-priced plan, the collective simulated with every stage's groups at once
        (``measured["dp_coll"]``, :func:`scenarios.search.refine.dp_probe`)."""
        probe = self.measured.get("dp_coll") if self.measured else None
        return probe(op, size_bytes, axis, every_stage) if probe else self.ctx.coll(op, size_bytes, self.g[axis])

    def fp8_casts(self, Ls: int) -> float:
        """FP8 weight kernels (the recipe's, :func:`workload.fp8.params.layer_weight_kernels`): once per layer
        per iteration, or before every pass under ZeRO-3 (the weights are gathered for each)."""
        m = self.ctx.global_batch_size // (self.c.mbs * self.c.dp)
        w = self.sc.weight_cast_s
        if self.c.zero == 3:
            return Ls * m * (w.get(("fwd", True), 0.0) + w.get(("bwd", True), 0.0))
        return Ls * w.get(("fwd", False), 0.0)


def screen(scenario: Scenario | ScreenContext, candidates: Sequence[Candidate], *, progress=None) -> list[Estimate]:
    """The analytic screen of ``candidates`` for ``scenario``: one :class:`Estimate` each, in order.

    A public entry point for other search loops (Optuna, ...): build the
    :class:`ScreenContext` once and pass it instead of the scenario to reuse its traces.

    Args:
        scenario: the scenario (model, system, training) or a context built from it.
        candidates: plans from :func:`scenarios.search.space.enumerate_space` (or built by hand).
        progress: optional callable ``progress(n)`` called after each estimate (a tqdm ``update``).

    Raises:
        ValueError: the model is not a zoo transformer, or a plan does not fit the model (tracing).
    """
    ctx = scenario if isinstance(scenario, ScreenContext) else ScreenContext(scenario)
    out = []
    for c in candidates:
        out.append(ctx.estimate(c))
        if progress is not None:
            progress(1)
    return out
