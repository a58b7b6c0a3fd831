"""Per-rank programs from a traced micro-batch and a parallel configuration.

Input: the op graph of ONE micro-batch on ONE tensor-parallel rank (the model built with its TP shard,
so TP/SP/EP collectives are already ops of the graph, see :mod:`workload.parallel.tp`), and a resolved
:class:`ParallelConfig`. Output: one :class:`hwmodel.ir.Program` per rank with the streams Megatron-LM
and PyTorch use:

* ``compute``: kernels and the tensor/expert-parallel collectives (synchronous in Megatron: they
  block the compute stream);
* ``pp_fwd_recv`` / ``pp_fwd_send`` / ``pp_bwd_recv`` / ``pp_bwd_send``: pipeline activations and
  gradients (asynchronous p2p; one stream per direction so no send waits behind an unrelated receive),
  or with ``overlap_p2p_comm = false`` Megatron's batched, synchronised exchanges (:mod:`.p2p_batched`);
* ``cp_send`` / ``cp_recv``: ring-attention K/V blocks (context parallelism);
* ``dp``: data-parallel gradient buckets (all-reduce, or reduce-scatter + all-gather with the
  distributed optimizer); with ``overlap_grad_reduce`` each bucket starts as soon as the last
  micro-batch's backward has produced it (Megatron's ``DistributedDataParallel``);
* ``fsdp_ag`` / ``fsdp_rs``: ZeRO-3/FSDP per-unit parameter all-gathers (prefetching one unit) and
  gradient reduce-scatters. The units are the layers and, on the stages that hold them, the parts
  before and after the layers ("pre": embeddings; "post": final norm and output layer) -- PyTorch FSDP
  wraps the root module's remaining parameters as the root unit, DeepSpeed ZeRO-3 and Megatron-FSDP
  shard them too. A tied output layer on a single stage gathers the embedding for "post" as well
  (:attr:`ModelTrace.params_post_tied`); its gradient is reduce-scattered once, with "pre".
  FSDP with pipeline stages (:attr:`ParallelConfig.fsdp_keeps_unsharded`, torchtitan's FSDP2 + PP)
  gathers each unit once per iteration, at its first forward, and reduce-scatters it once, after its
  last backward; ``zero_stage = 3`` with PP gathers and reduces per micro-batch;
* ``tp_overlap`` / ``tp_async``: with ``tp_comm_overlap`` or ``async_tp``, the chunks of the TP
  collectives pipelined with their GEMMs (:mod:`workload.parallel.tp_overlap`).

FP8 training (:mod:`workload.fp8`) arrives as a bf16 trace whose Linear GEMMs already run in FP8 with
their activation and gradient casts; the builder adds the recipe's weight casts (:attr:`ModelTrace.fp8_params_block`)
on the layer's first forward of the iteration (Transformer Engine caches the FP8 weights across
micro-batches), or on every pass under ZeRO-3/FSDP, whose gathered weights are freed after use; with
``fp8_param_gather`` the parameter all-gathers move FP8 (:mod:`workload.fp8.params`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from hwmodel.dtypes import ELEMENT_BYTES, TRAINING_DTYPES
from hwmodel.ir import Collective, Compute, Program, SendRecv
from workload.fp8 import params as fp8p
from workload.parallel import fsdp2, p2p_batched
from workload.parallel.config import DDP_BUCKET_ELEMENTS_PER_DP_RANK, ParallelConfig
from workload.parallel.deepspeed_zero import DeepSpeedStage3
from workload.parallel.optimizer import fused_adam, optimizer_kernel
from workload.parallel.placement import Layout
from workload.parallel.recompute import rerun_before_backward
from workload.parallel.sac import op_sac_recomputed
from workload.parallel.schedules import recv_posts, schedule
from workload.parallel.tp import COLLECTIVE_PREFIX

if TYPE_CHECKING:  # annotation only: the tracer is not needed to build programs
    from workload.trace.graph import OpGraph
from workload.parallel.tp_overlap import Pipelined, emit_pipelined, pair_collectives

SELECTIVE_KINDS = ("attention", "softmax", "elementwise", "gemm")
"""Kernel kinds of the attention core re-run by selective recomputation, among the ops of the core
attention module (``.attn``) -- QK^T, softmax, dropout and attention x V, not the QKV or output
projections (those are GEMMs of ``.attn.qkv`` / ``.attn.proj``)."""

TRACED_COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
"""Ops of :mod:`workload.parallel.tp` that are communication, not kernels."""

ELEM_BYTES = dict(ELEMENT_BYTES)
"""Bytes per element of each math dtype (:data:`hwmodel.dtypes.ELEMENT_BYTES`)."""
GRAD_REDUCE_BYTES = {n: d.grad_reduce_bytes for n, d in TRAINING_DTYPES.items()}
"""Bytes per gradient element in the data-parallel reduction, by training dtype: Megatron-LM reduces
bf16 runs' gradients in fp32 (it forces ``accumulate_allreduce_grads_in_fp32`` for bf16) and fp16
runs' in fp16 (the flag's default); see :mod:`hwmodel.dtypes`. Parameters are gathered in the training dtype."""


@dataclass
class ModelTrace:
    """What the builder needs from tracing one TP rank's model for one micro-batch.

    Parameter counts are elements of this rank's shard.
    """

    graph: OpGraph
    """A :class:`workload.trace.OpGraph` (fwd, bwd, opt; blocks deduplicated)."""
    num_layers: int
    hidden_size: int
    seq_length: int
    """Sequence length of the traced micro-batch (already divided by CP)."""
    micro_batch_size: int
    params_pre: int
    params_block: int
    params_post: int
    params_block_expert: int = 0
    """Of ``params_block``, the expert (MoE) parameters, reduced over the expert-data-parallel group."""
    dtype: str = "bf16"
    """Parameter, activation and communication dtype (``bf16`` for FP8 training, whose FP8 GEMMs are
    marked in the graph)."""
    fp8_params_block: int = 0
    """Of ``params_block``, the weight elements of FP8 GEMMs (0: no FP8 training); the builder adds
    their per-iteration weight casts."""
    fp8_recipe: str = "delayed"
    """FP8 training: the recipe (:data:`workload.fp8.RECIPES`) whose weight kernels the builder adds."""
    fp8_param_gather: bool = False
    """FP8 training: parameter all-gathers move the FP8-GEMM weights in FP8 (:mod:`workload.fp8.params`)."""
    params_post_tied: int = 0
    """Of ``params_pre``, the elements the "post" part uses too (an output layer tied to the input
    embedding on the same stage): ZeRO-3/FSDP gathers them for "post" as well."""
    params_per_block: tuple[int, ...] | None = None
    """Blocks that differ (a custom module's top-level children): elements of each; ``None``: every
    block has ``params_block``."""
    block_modules: tuple[tuple[str, tuple[int, ...]], ...] = ()
    """The modules of one block that own parameters: (path inside the block, e.g. ``attn.qkv``; elements
    of each of its own parameters), for DeepSpeed's per-module fetch
    (:mod:`workload.parallel.deepspeed_zero`); ``()``: one module with ``params_block``."""
    attention_kernel: str = ""
    """The attention kernel the model's ``attention_backend`` names (:func:`attention_kernel`), set on
    every traced attention op (:attr:`hwmodel.ir.Compute.attention_kernel`); ``""``: the default."""

    def block_params(self, layer: int) -> int:
        """Parameter elements of block ``layer`` on this rank."""
        return self.params_block if self.params_per_block is None else self.params_per_block[layer]


@dataclass
class BuildResult:
    """Programs for every rank plus facts reports need."""

    programs: dict[int, Program]
    layout: Layout
    config: ParallelConfig
    stage_layers: list[int]
    info: dict = field(default_factory=dict)


NAMED_ATTENTION_KERNELS = ("flash2", "flash3", "cudnn", "efficient")
"""``attention_backend`` values that name one kernel; ``flash`` is the framework's default for the GPU
generation and ``unfused`` is no attention kernel at all."""


def attention_kernel(model_cfg) -> str:
    """The :attr:`hwmodel.ir.Compute.attention_kernel` of a model config's ``attention_backend``."""
    backend = getattr(model_cfg, "attention_backend", "flash")
    return backend if backend in NAMED_ATTENTION_KERNELS else ""


class TracedOps:
    """The traced ops of one micro-batch, converted once to IR operations per (part, phase)."""

    def __init__(self, trace: ModelTrace) -> None:
        self.t = trace
        self._cache: dict[tuple, list] = {}

    def get(self, part: str, phase: str, block: int | None = None) -> list[TracedItem]:
        """The ops of ``part`` (``pre``, ``block`` or ``post``) in ``phase`` (``fwd``, ``bwd``);
        ``block``: the layer, for ``part == "block"``."""
        key = (part, phase, block)
        hit = self._cache.get(key)
        if hit is None:
            g = self.t.graph
            if part == "block":
                if block is None:
                    raise ValueError("part 'block' needs the block (layer) index")
                recs = g.block_ops(block, phase)
            else:
                recs = g.pre_ops(phase) if part == "pre" else g.post_ops(phase)
            hit = [_convert(o, self.t.attention_kernel) for o in recs]
            self._cache[key] = hit
        return hit


@dataclass(frozen=True, slots=True)
class TracedCollective:
    """A tensor- or expert-parallel collective of the traced graph, before its group is known (the
    group depends on the rank: :meth:`RankBuilder.emit` makes it a :class:`hwmodel.ir.Collective`)."""

    op: str
    """One of :data:`TRACED_COLLECTIVES`."""
    size_bytes: int
    """nccl-tests' ``S``: the gathered output for all_gather, the input otherwise."""
    axis: str
    """The parallel dimension whose group runs it: ``tp``, or ``ep`` for all_to_all."""
    dtype: str


TracedItem = Compute | TracedCollective
"""What :class:`TracedOps` gives per op: a kernel, or a collective to place on the rank's group."""


def _convert(o, kernel: str = "") -> TracedItem:
    """An op record as a Compute (an attention op run by ``kernel``, if named), or a
    :class:`TracedCollective` for a traced collective."""
    op = o.name[len(COLLECTIVE_PREFIX):].split(".")[0] if o.name.startswith(COLLECTIVE_PREFIX) else ""
    if op in TRACED_COLLECTIVES:
        eb = ELEM_BYTES.get(o.dtype, 2)
        size = math.prod(o.out_shapes[0]) * eb if op == "all_gather" else math.prod(o.in_shapes[0]) * eb
        return TracedCollective(op, int(size), "ep" if op == "all_to_all" else "tp", o.dtype)
    c = o.to_compute()
    return replace(c, attention_kernel=kernel) if kernel and c.kind == "attention" else c


def build_programs(trace: ModelTrace, config: ParallelConfig, *, ranks: list[int] | None = None,
                   ops: object | None = None) -> BuildResult:
    """Programs of ``ranks`` (default: all) for one training iteration.

    ``ops`` replaces the traced ops per (part, phase, block) -- the hierarchical engine passes one
    macro task per layer pass (recomputation included in the backward macro).

    Raises:
        ValueError: the configuration does not fit the model (names the fields).
    """
    cfg = config
    layout = Layout(cfg)
    p, v, m = cfg.pp, cfg.vpp, cfg.num_microbatches
    per_vstage = cfg.stage_layers(trace.num_layers)
    if len(per_vstage) != p * v:
        raise AssertionError("stage_layers must give one entry per virtual stage")
    macro = ops is not None
    ops = ops or TracedOps(trace)
    eb = ELEM_BYTES.get(trace.dtype, 2)
    # Each TP rank sends its 1/tp slice of the activation: sharded along the sequence with SP, else
    # Megatron's scatter/gather optimisation (SC'21 §4.1) all-gathers it over NVLink on arrival.
    act_bytes = trace.micro_batch_size * trace.seq_length * trace.hidden_size * eb // cfg.tp
    ranks = list(range(layout.world_size)) if ranks is None else ranks
    programs = {}
    for r in ranks:
        rb = RankBuilder(r, trace=trace, config=cfg, layout=layout, ops=ops, stage_layers=per_vstage,
                         act_bytes=act_bytes, macro=macro)
        programs[r] = rb.build(p, v, m)
    info = {"activation_p2p_bytes": act_bytes, "num_microbatches": m}
    return BuildResult(programs, layout, cfg, per_vstage, info)


class RankBuilder:
    """The program of one rank, built task by task.

    :func:`build_programs` calls :meth:`build` for a whole iteration; the hierarchical engine
    (``scenarios.hierarchical``) times one layer pass at a time with :meth:`add_pass` and reads
    :attr:`program`.

    Args:
        rank: the global rank.
        trace: the traced micro-batch.
        config: the resolved parallel configuration.
        layout: ``Layout(config)``.
        ops: the ops per (part, phase, block): a :class:`TracedOps`, or a stand-in with its ``get``.
        stage_layers: layers per virtual pipeline stage (``config.stage_layers(trace.num_layers)``).
        act_bytes: bytes of one pipeline send of activations or gradients (this rank's 1/tp slice).
        macro: ``ops`` gives macro tasks whose backward already includes recomputation.
    """

    def __init__(self, rank: int, *, trace: ModelTrace, config: ParallelConfig, layout: Layout, ops,
                 stage_layers: list[int], act_bytes: int = 0, macro: bool = False) -> None:
        cfg = config
        self.rank = rank
        self.t = trace
        self.cfg = cfg
        self.L = layout
        self.ops = ops
        self.per_vstage = stage_layers
        self.offsets = [0]
        for n in stage_layers:
            self.offsets.append(self.offsets[-1] + n)
        self.act_bytes = act_bytes
        self.c = layout.coords(rank)
        self.prog = Program(rank)
        self.groups = {
            "tp": layout.group(rank, "tp"),
            "ep": layout.group(rank, "ep"),
            "dp": layout.group(rank, ("dp", "cp")),
            "edp": layout.group(rank, ("edp", "cp")),
            "cp": layout.group(rank, "cp"),
        }
        s, p = self.c["pp"], cfg.pp
        self.next_rank = layout.rank(**{**self.c, "pp": (s + 1) % p})
        self.prev_rank = layout.rank(**{**self.c, "pp": (s - 1) % p})
        cp_g = self.groups["cp"]
        i = cp_g.index(rank)
        self.cp_next, self.cp_prev = cp_g[(i + 1) % len(cp_g)], cp_g[(i - 1) % len(cp_g)]
        self.zero = cfg.effective_zero_stage
        self.last_compute: int | None = None
        self.dp_tasks: list[int] = []
        self.macro = macro
        self.grad_bytes = GRAD_REDUCE_BYTES.get(trace.dtype, 4)
        self.grad_dtype = "fp16" if self.grad_bytes == 2 else "fp32"
        self.fp8_cast_chunks: set[int] = set()
        self.tp_overlap = "userbuffers" if cfg.tp_comm_overlap else "async" if cfg.async_tp else ""
        """How TP collectives are pipelined with their GEMMs ("": not at all)."""
        self.overlap_carry: list[int] = []
        """A pipelined reduce-scatter's last chunk, which the next compute task waits for."""
        self.deepspeed: DeepSpeedStage3 | None = None
        """DeepSpeed's ZeRO-3 program structure (``zero_impl = "deepspeed"``), made by :meth:`build`."""

    # -- public ----------------------------------------------------------------------------------
    @property
    def program(self) -> Program:
        """The tasks added so far."""
        return self.prog

    def add_pass(self, part: str, phase: str, block: int | None = None) -> None:
        """Add one micro-batch's pass of ``part`` (``pre``, ``block`` or ``post``) in ``phase``
        (``fwd``, ``bwd``) to the compute stream: its kernels and TP/EP collectives, a block's
        backward preceded by its recomputation (``recompute_granularity``). No pipeline, data-parallel
        or FSDP communication: the pass alone."""
        deps = self.recompute(block or 0, []) if part == "block" and phase == "bwd" else []
        self.emit(self.ops.get(part, phase, block), deps, blocks=part == "block")

    # -- helpers -------------------------------------------------------------------------------
    def add(self, op, stream="compute", deps=()) -> int:
        deps = tuple(d for d in deps if d is not None)
        tid = self.prog.add(op, stream, deps)
        if stream == "compute":
            self.last_compute = tid
        return tid

    def emit(self, items: list, deps=(), scale: float = 1.0, *, blocks: bool = False) -> int | None:
        """Put kernels and TP/EP collectives on the compute stream; the first waits for ``deps``.

        With ``tp_comm_overlap`` or ``async_tp`` the TP all-gathers and reduce-scatters of the
        transformer blocks' ops (``blocks``) next to their GEMMs are pipelined with them
        (:mod:`workload.parallel.tp_overlap`): TE userbuffers serve TE's layers in the blocks, not the
        embedding or Megatron-Core's plain ``ColumnParallelLinear`` output layer."""
        first = True
        if self.tp_overlap:
            if blocks:
                items = pair_collectives(items, hidden=self.t.hidden_size, tp=self.cfg.tp, mode=self.tp_overlap)
            deps, self.overlap_carry = list(deps) + self.overlap_carry, []
        for it in items:
            if isinstance(it, Pipelined):
                self.overlap_carry = emit_pipelined(self, it, list(deps) if first else self.overlap_carry,
                                                    mode=self.tp_overlap)
                first = False
                continue
            if self.overlap_carry:  # what a pipelined reduce-scatter's consumer waits for
                deps, first, self.overlap_carry = self.overlap_carry, True, []
            if isinstance(it, TracedCollective):
                task = Collective(it.op, it.size_bytes, self.groups[it.axis], dtype=it.dtype,
                                  name=f"{it.axis}_{it.op}")
            else:
                task = it
                if scale != 1.0:
                    task = replace(it, flops=it.flops * scale, bytes_accessed=it.bytes_accessed * scale)
                if self.cfg.cp > 1 and task.kind == "attention":
                    self._ring_attention(task, deps if first else ())
                    first = False
                    continue
            self.add(task, "compute", deps if first else ())
            first = False
        if first and deps:  # nothing emitted: keep the dependency on the compute stream
            if self.tp_overlap:
                self.overlap_carry = list(deps)
            return None
        return self.last_compute

    def _ring_attention(self, task: Compute, deps) -> None:
        """Context parallelism: cp attention steps, K/V blocks passed around the CP ring
        (Megatron-Core ``AttnFuncWithCPAndKVP2P``); backward also returns dK/dV. Step j posts its send
        and receive together as it starts: a receive posted earlier would hold its SMs from the pass before."""
        cp = self.cfg.cp
        b, h, sq, skv, d = task.shape if len(task.shape) == 5 else (1, 1, 1, 1, 1)
        kv_bytes = 2 * b * (task.attention_kv_heads or h) * skv * d * ELEM_BYTES.get(task.dtype, 2)  # K and V
        block = kv_bytes * (2 if task.phase == "bwd" else 1)
        recv_prev = None
        for j in range(cp):
            if j < cp - 1:
                after, tag = (recv_prev if j else self.last_compute,), f"cp{task.phase}"  # both posted as step j starts
                self.add(SendRecv("send", self.cp_next, block, name="cp_kv", tag=tag), "cp_send", after)
                nxt = self.add(SendRecv("recv", self.cp_prev, block, name="cp_kv", tag=tag), "cp_recv", after)
            self.add(replace(task, name=f"{task.name}[cp{j}]"), "compute",
                     tuple(deps) + ((recv_prev,) if recv_prev is not None else ()))
            deps = ()
            recv_prev = nxt if j < cp - 1 else None

    # -- layers ----------------------------------------------------------------------------------
    def chunk_layers(self, chunk: int) -> range:
        vs = chunk * self.cfg.pp + self.c["pp"]
        return range(self.offsets[vs], self.offsets[vs + 1])

    def layer_param_bytes(self, eb: int, layer: int = 0) -> int:
        return self.t.block_params(layer) * eb

    def fsdp_gather(self, layer: int, phase: str, after: int | None) -> int:
        """ZeRO-3/FSDP all-gather of a layer (nccl-tests' S: the whole layer, each rank holding 1/dp), with
        FSDP2's copies (:func:`workload.parallel.fsdp2.unshard`); the task the layer's pass waits for."""
        n, eb = self.t.block_params(layer), ELEM_BYTES.get(self.t.dtype, 2)
        size, dtype, fp8 = n * eb, self.t.dtype, self.t.fp8_param_gather
        if fp8:  # the FP8 weights cast on the shard, then gathered in FP8
            after, dtype = fp8p.shard_casts(self, layer, phase, after), fp8p.GATHER_DTYPE
            size = fp8p.param_gather_bytes(n, self.t.fp8_params_block, eb, self.t.fp8_recipe)
        return fsdp2.unshard(self, Collective("all_gather", size, self.groups["dp"], dtype=dtype,
                                              name=f"fsdp_ag_{phase}_L{layer}"),
                             n / self.cfg.dp, f"layers.{layer}", phase, after, copy_in=not fp8)

    def fsdp_gather_part(self, part: str, phase: str, after: int | None) -> list[int]:
        """ZeRO-3/FSDP all-gather of the "pre" or "post" unit's parameters (training dtype; nccl-tests'
        S, the whole gathered buffer); nothing for a unit without parameters."""
        n = fsdp2.root_elements(self, part, phase)  # FSDP2's root unit: gathered once, before the forward
        if n <= 0:
            return []
        return [fsdp2.unshard(self, Collective("all_gather", n * ELEM_BYTES.get(self.t.dtype, 2), self.groups["dp"],
                                               dtype=self.t.dtype, name=f"fsdp_ag_{phase}_{part}"),
                              n / self.cfg.dp, part, phase, after)]

    def fp8_weight_cast(self, layer: int, phase: str) -> list[Compute]:
        """The recipe's kernels over one layer's FP8 GEMM weights (:func:`workload.fp8.params.layer_weight_kernels`),
        or nothing without FP8 training."""
        return fp8p.layer_weight_kernels(self.t, layer, phase, zero3=self.zero == 3)

    def forward(self, mb: int, chunk: int, first_v: bool, last_v: bool, deps: list) -> int | None:
        if self.deepspeed is not None:  # DeepSpeed's per-module fetch (no pipeline stages)
            return self.deepspeed.forward(first_v, last_v, deps)
        zero3 = self.zero == 3
        first_pass = chunk not in self.fp8_cast_chunks  # the chunk's first forward of the iteration
        self.fp8_cast_chunks.add(chunk)
        # ZeRO-3/FSDP gathers before every forward; FSDP with PP once per iteration (kept unsharded)
        gather = zero3 and (first_pass or not self.cfg.fsdp_keeps_unsharded)
        if first_v:
            ag = self.fsdp_gather_part("pre", "fwd", None) if gather else []
            self.emit(self.ops.get("pre", "fwd"), deps + self.gathered("pre") + ag)
            deps = []
        layers = self.chunk_layers(chunk)
        # FP8: weights are cast on the chunk's first forward (TE caches them), every pass under
        # ZeRO-3, whose gathered weights are freed after use
        cast = gather or first_pass
        prev_prev = None
        for layer in layers:
            d = list(deps) + self.gathered(layer)
            if gather:
                d.append(self.fsdp_gather(layer, "fwd", prev_prev))
            before = self.last_compute
            if cast and (kernels := self.fp8_weight_cast(layer, "fwd")):
                self.emit(kernels, d)
                d = []
            self.emit(self.ops.get("block", "fwd", layer), d, blocks=True)
            prev_prev = before
            deps = []
        if last_v:
            ag = self.fsdp_gather_part("post", "fwd", prev_prev) if gather else []
            self.emit(self.ops.get("post", "fwd"), list(deps) + ag)
        return self.last_compute

    def backward(self, mb: int, chunk: int, first_v: bool, last_v: bool, deps: list, last_mb: bool) -> None:
        if self.deepspeed is not None:
            self.deepspeed.backward(first_v, last_v, deps)
            return
        zero3 = self.zero == 3
        once = self.cfg.fsdp_keeps_unsharded  # FSDP with PP: no gathers; one reduce-scatter, last
        gather = zero3 and not once
        if last_v:
            ag = self.fsdp_gather_part("post", "bwd", None) if gather else []
            self.emit(self.ops.get("post", "bwd"), list(deps) + ag)
            deps = []
            self._gradients_done("post", self.t.params_post, last_mb)
        layers = list(self.chunk_layers(chunk))
        rerun = rerun_before_backward(self.cfg.recompute_method, self.cfg.recompute_num_layers, layers)
        prev_prev = None
        for layer in reversed(layers):
            d = list(deps)
            if gather and fsdp2.gathers_for_backward(self, layer):
                d.append(self.fsdp_gather(layer, "bwd", prev_prev))
            before = self.last_compute
            if gather and (kernels := self.fp8_weight_cast(layer, "bwd")):
                self.emit(kernels, d)
                d = []
            if not self.macro:
                d = self.recompute(layer, d, rerun.get(layer, ()))
            self.emit(self.ops.get("block", "bwd", layer), d, blocks=True)
            prev_prev = before
            deps = []
            self._gradients_done(layer, self.t.block_params(layer), last_mb)
        if first_v:
            ag = self.fsdp_gather_part("pre", "bwd", prev_prev) if gather else []
            self.emit(self.ops.get("pre", "bwd"), list(deps) + ag)
            # the tied output layer's gradient is accumulated into the embedding's by now
            self._gradients_done("pre", self.t.params_pre, last_mb)

    def _gradients_done(self, key, n: int, last_mb: bool) -> None:
        """A unit's backward has just been emitted: ZeRO-3/FSDP reduce-scatters its gradients (FSDP with
        PP only after the last micro-batch); otherwise its bucket learns it is ready (last micro-batch)."""
        done = self.last_compute
        if self.zero == 3:
            if last_mb or not self.cfg.fsdp_keeps_unsharded:
                fsdp2.reduce(self, key, fsdp2.root_reduce_elements(self, key, n), done)
        elif last_mb:
            self.grad_ready(key, done)

    def gather_received(self, deps: list) -> list:
        """Scatter/gather: without sequence parallelism the received 1/tp slices are all-gathered
        over the TP group before use (synchronously, on the compute stream)."""
        if not deps or self.cfg.tp == 1 or self.cfg.sequence_parallel:
            return deps
        self.add(Collective("all_gather", self.act_bytes * self.cfg.tp, self.groups["tp"], dtype=self.t.dtype,
                            name="pp_gather"), "compute", deps)
        return []

    def recompute(self, layer: int, deps: list, rerun: list[int] | tuple[int, ...] | None = None) -> list:
        """Recomputation before a layer's backward: the forward of the layers ``rerun`` (full, TP collectives
        in; default the layer, :func:`workload.parallel.recompute.rerun_before_backward`), the attention core
        (selective: Korthikanti §5) or per-op SAC's kernels (selective_op); returns the deps still to honour."""
        g = self.cfg.recompute_granularity
        if g == "none":
            return deps
        layers = rerun if g == "full" and rerun is not None else (layer,)
        fwd = [o for i in layers for o in self.ops.get("block", "fwd", i)]
        if g == "selective":
            fwd = [replace(o, name=f"recompute:{o.name}") for o in fwd
                   if isinstance(o, Compute) and o.kind in SELECTIVE_KINDS and o.layer.endswith(".attn")]
        elif g == "selective_op":  # torchtitan's per-op SAC (workload.parallel.sac), TP all-gathers too
            fwd = [replace(o, name=f"recompute:{o.name}") if isinstance(o, Compute) else o
                   for o in op_sac_recomputed(o for o in fwd if isinstance(o, Compute | TracedCollective))]
        if not fwd:
            return deps
        self.emit(fwd, deps, blocks=True)
        return []

    # -- data-parallel gradient buckets -----------------------------------------------------------
    def plan_buckets(self) -> None:
        """Group this stage's parameters into buckets in backward order (Megatron's DDP)."""
        cfg, p, v, s = self.cfg, self.cfg.pp, self.cfg.vpp, self.c["pp"]
        order: list[tuple[object, int, int]] = []  # (key, params, expert params)
        for chunk in reversed(range(v)):
            vs = chunk * p + s
            if vs == p * v - 1:
                order.append(("post", self.t.params_post, 0))
            for layer in reversed(self.chunk_layers(chunk)):
                order.append((layer, self.t.block_params(layer), self.t.params_block_expert))
            if vs == 0:
                order.append(("pre", self.t.params_pre, 0))
        # Megatron-Core's default bucket holds max(40M, 1M x dp) parameters
        # (DistributedDataParallelConfig.bucket_size): at least 1M elements per DP rank, so that a large
        # data-parallel group's collectives do not become latency-bound
        cap = max(cfg.grad_bucket_size_bytes, DDP_BUCKET_ELEMENTS_PER_DP_RANK * cfg.dp * self.grad_bytes)
        self.buckets: list[list[object]] = []
        self.bucket_bytes: list[tuple[int, int]] = []
        self.key_bucket: dict[object, int] = {}
        cur, dense, expert = [], 0, 0
        for key, n, ne in order:
            cur.append(key)
            dense += (n - ne) * self.grad_bytes
            expert += ne * self.grad_bytes
            if dense + expert >= cap:
                self._close_bucket(cur, dense, expert)
                cur, dense, expert = [], 0, 0
        if cur:
            self._close_bucket(cur, dense, expert)
        self.pending = {i: set(b) for i, b in enumerate(self.buckets)}
        self.param_ag: dict[object, int] = {}

    def _close_bucket(self, keys, dense, expert) -> None:
        i = len(self.buckets)
        self.buckets.append(list(keys))
        self.bucket_bytes.append((dense, expert))
        for k in keys:
            self.key_bucket[k] = i

    def grad_ready(self, key, task: int | None) -> None:
        i = self.key_bucket.get(key)
        if i is None:
            return
        self.pending[i].discard(key)
        if not self.pending[i] and self.cfg.overlap_grad_reduce:
            self.reduce_bucket(i, task)

    def reduce_bucket(self, i: int, after: int | None) -> None:
        dense, expert = self.bucket_bytes[i]
        op = "reduce_scatter" if self.zero in (1, 2) else "all_reduce"
        for size, group in ((dense, "dp"), (expert, "edp")):
            if size <= 0 or len(self.groups[group]) == 1:
                continue
            self.dp_tasks.append(self.add(Collective(op, size, self.groups[group], dtype=self.grad_dtype,
                                                     name=f"dp_grad_bucket{i}"), "dp", (after,)))

    # -- the iteration -------------------------------------------------------------------------------
    def build(self, p: int, v: int, m: int) -> Program:
        """The whole iteration: ``config.schedule``'s forward and backward steps for ``m``
        micro-batches on ``p`` stages of ``v`` virtual stages each, the data-parallel gradient
        buckets, the optimizer. Returns the program."""
        cfg, s = self.cfg, self.c["pp"]
        self.plan_buckets()
        if cfg.zero_impl == "deepspeed":
            self.deepspeed = DeepSpeedStage3(self)
        if self.zero in (1, 2) and cfg.overlap_param_gather:
            self._prefetch_param_gathers()
        if batched := not cfg.overlap_p2p_comm and p > 1:  # Megatron's batched, synchronised exchanges
            p2p_batched.emit(self, p, v, m)
        steps = [] if batched else schedule(cfg.schedule, p, m, s, v)
        last_b = {st.chunk: idx for idx, st in enumerate(steps) if st.kind == "B"}
        # Megatron's interleaved schedule posts a pass's receive one pass early (recv_posts); else when reached
        posts = recv_posts(steps, p, v, s) if cfg.schedule == "interleaved_1f1b" and p > 1 else {}
        pre = {i: self._recv(steps[i].kind) for i in posts.get(-1, ())}  # step index -> its posted receive
        for idx, st in enumerate(steps):
            vs = st.chunk * p + s
            first_v, last_v = vs == 0, vs == p * v - 1
            self._step(st, first_v, last_v, pre.pop(idx, None), st.kind == "B" and idx == last_b[st.chunk])
            pre.update({i: self._recv(steps[i].kind) for i in posts.get(idx, ())})
        if self.zero != 3:
            self._reduce_remaining_buckets()
        self.optimizer()
        return self.prog

    def _prefetch_param_gathers(self) -> None:
        """Steady state of the distributed optimizer: the previous step's parameter all-gathers
        overlap this forward pass; each layer's first forward waits for its bucket (Megatron
        ``--overlap-param-gather``)."""
        for i in reversed(range(len(self.buckets))):
            for t in self.gather_bucket(i, None):
                for key in self.buckets[i]:
                    self.param_ag[key] = t

    def _recv(self, kind: str) -> int:
        """Post the receive of a forward's activations (``F``) or a backward's gradients after the last compute."""
        peer, name, tag = (self.prev_rank, "pp_act", "fwd") if kind == "F" else (self.next_rank, "pp_grad", "bwd")
        return self.add(SendRecv("recv", peer, self.act_bytes, name=name, tag=tag), f"pp_{tag}_recv",
                        (self.last_compute,))

    def _step(self, st, first_v: bool, last_v: bool, recv: int | None, last_mb: bool) -> None:
        """One pass of the schedule: receive its input (a forward's activations but on the first virtual
        stage, a backward's gradients but on the last; ``recv``: the receive if posted earlier, else posted
        now, as Megatron's p2p calls are in order), the pass, send its output on (but from the last
        virtual stage, resp. the first)."""
        fwd = st.kind == "F"
        deps = [] if (first_v if fwd else last_v) else [self._recv(st.kind) if recv is None else recv]
        deps = self.gather_received(deps)
        if fwd:
            done = self.forward(st.microbatch, st.chunk, first_v, last_v, deps)
        else:
            self.backward(st.microbatch, st.chunk, first_v, last_v, deps, last_mb)
            done = self.last_compute
        if not (last_v if fwd else first_v):
            peer, name, tag = (self.next_rank, "pp_act", "fwd") if fwd else (self.prev_rank, "pp_grad", "bwd")
            self.add(SendRecv("send", peer, self.act_bytes, name=name, tag=tag), f"pp_{tag}_send", (done,))

    def _reduce_remaining_buckets(self) -> None:
        """After the last backward: every bucket without ``overlap_grad_reduce``, else the buckets
        that never completed (e.g. empty keys)."""
        if not self.cfg.overlap_grad_reduce:
            for i in range(len(self.buckets)):
                self.reduce_bucket(i, self.last_compute)
            return
        for i, pend in self.pending.items():
            if pend:
                self.reduce_bucket(i, self.last_compute)

    def optimizer(self) -> None:
        """Mixed-precision Adam as Megatron runs it: one fused multi-tensor kernel per layer's
        parameters (apex/TE ``FusedAdam``), over this rank's shard (1/dp of it with ZeRO >= 1); PyTorch's
        foreach AdamW under ``fsdp``."""
        cfg = self.cfg
        scale = 1.0 / cfg.dp if self.zero >= 1 else 1.0
        items: list = []
        s, p, v = self.c["pp"], cfg.pp, cfg.vpp
        shards = []
        for chunk in range(v):
            vs = chunk * p + s
            if vs == 0:
                shards.append((self.t.params_pre * scale, "pre"))
            shards += [(self.t.block_params(layer) * scale, f"layers.{layer}") for layer in self.chunk_layers(chunk)]
            if vs == p * v - 1:
                shards.append((self.t.params_post * scale, "post"))
        shards = [(n, layer) for n, layer in shards if n > 0]
        # Megatron's optimizer step, in order: (fp16: unscale the gradients and check for inf/nan),
        # the gradient norm for clipping, Adam, copy the fp32 master weights to the model's dtype,
        # zero the gradient buffers for the next iteration.
        passes = [("grad_norm", 4)] + ([("unscale_grads", 8)] if self.t.dtype == "fp16" else [])
        items = [optimizer_kernel(name, n * b, layer) for name, b in passes for n, layer in shards]
        items += [fused_adam(n, layer) for n, layer in shards]
        items += [optimizer_kernel(name, n * b, layer) for name, b in (("copy_main_to_model_params", 6),
                                                                       ("zero_grad_buffers", 4))
                  for n, layer in shards]
        if cfg.fsdp:  # PyTorch's clip_grad_norm_ and foreach AdamW (workload.parallel.fsdp2)
            items = fsdp2.optimizer_kernels(shards, fsdp2.norm_reduce_axes(self))
        wait = list(self.dp_tasks)
        if self.zero == 3:
            wait += [i for i, t in enumerate(self.prog.tasks) if t.stream == "fsdp_rs"][-1:]
        self.emit(items, wait)
        fp8p.amax_all_reduce(self, sum(len(self.chunk_layers(c)) for c in range(v)), "dp")
        if self.zero in (1, 2) and not cfg.overlap_param_gather:
            for i in range(len(self.bucket_bytes)):
                self.gather_bucket(i, self.last_compute)

    def gather_bucket(self, i: int, after: int | None) -> list[int]:
        """Distributed optimizer: all-gather bucket ``i``'s updated parameters (training dtype)."""
        eb, t = ELEM_BYTES.get(self.t.dtype, 2), self.t
        dense, expert = self.bucket_bytes[i]
        layers = sum(1 for k in self.buckets[i] if isinstance(k, int))  # FP8 weights: the layers' (fp8_param_gather)
        fp8 = {"dp": max(0, t.fp8_params_block - t.params_block_expert) * layers,
               "edp": min(t.fp8_params_block, t.params_block_expert) * layers} if t.fp8_param_gather else {}
        out = []
        for size, group in ((dense, "dp"), (expert, "edp")):
            if size <= 0 or len(self.groups[group]) == 1:
                continue
            n, dtype = size // self.grad_bytes, fp8p.GATHER_DTYPE if fp8 else self.t.dtype
            nbytes = fp8p.param_gather_bytes(n, fp8[group], eb, t.fp8_recipe) if fp8 else n * eb
            out.append(self.add(Collective("all_gather", nbytes, self.groups[group], dtype=dtype,
                                           name=f"dp_param_gather{i}"), "dp", (after,)))
        return out

    def gathered(self, key) -> list[int]:
        """The parameter all-gather a layer's first forward waits for (overlap_param_gather)."""
        t = self.param_ag.pop(key, None)
        return [t] if t is not None else []
