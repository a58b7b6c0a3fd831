"""The parallel configuration, with Megatron-LM's names.

:class:`ParallelConfig` is a frozen, keyword-only dataclass; :meth:`ParallelConfig.validate` checks it
against a model and a world size and raises ``ValueError`` naming the fields and values that conflict
(torchtitan ``ParallelDims._validate`` style, not asserts).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from workload.parallel.recompute import check_chunks, check_recompute_keys, recomputed_layers

DEFAULT_RANK_ORDER = "tp-cp-ep-dp-pp"
"""Megatron-LM's rank order (innermost first); torchtitan's device mesh lays ranks out the same way."""
RECOMPUTE = ("none", "selective", "full")
"""Megatron-LM's ``--recompute-granularity`` (and none); the strategy search explores these."""
RECOMPUTE_ALL = (*RECOMPUTE, "selective_op")
"""Every accepted value: also torchtitan's per-op selective checkpointing (:mod:`workload.parallel.sac`)."""
SCHEDULES = ("gpipe", "1f1b", "interleaved_1f1b")
AXES = ("tp", "cp", "ep", "dp", "pp")
ZERO_IMPLS = ("megatron", "deepspeed")
"""How ``zero_stage = 3`` runs: ``megatron``, one unit per layer gathered whole with the next unit
prefetched and gradients reduce-scattered per layer in Megatron's reduction dtype (the behaviour since
ZeRO-3 was added; PyTorch FSDP and Megatron-Core's FSDP run it this way); ``deepspeed``, DeepSpeed's
per-module parameter fetch and gradient buckets (:mod:`workload.parallel.deepspeed_zero`)."""


DDP_BUCKET_ELEMENTS_PER_DP_RANK = 1_000_000
"""Megatron-Core ``DistributedDataParallelConfig.bucket_size``: unset, max(40M, 1M x dp) parameters."""


@dataclass(frozen=True, kw_only=True)
class ParallelConfig:
    """How one training iteration is split over GPUs (Megatron-LM argument names)."""

    tensor_model_parallel_size: int = 1
    """TP: Megatron column/row-parallel linears inside a layer."""
    pipeline_model_parallel_size: int = 1
    """PP: consecutive layers on consecutive stages."""
    data_parallel_size: int | None = None
    """DP: model replicas; derived as world / (tp * cp * pp) when omitted."""
    virtual_pipeline_model_parallel_size: int | None = None
    """Model chunks per pipeline stage for the interleaved 1F1B schedule."""
    context_parallel_size: int = 1
    """CP: the sequence split over GPUs, attention by ring send/recv of K/V blocks."""
    expert_model_parallel_size: int = 1
    """EP: MoE experts split over GPUs (carved out of the data-parallel ranks)."""
    sequence_parallel: bool = False
    """With TP: LayerNorm/dropout split along the sequence; all-gather + reduce-scatter replace the
    all-reduces (Korthikanti et al. 2022)."""
    micro_batch_size: int = 1
    global_batch_size: int | None = None
    """Sequences per iteration; default micro_batch_size * data_parallel_size (one micro-batch)."""
    recompute_granularity: str = "none"
    """none, selective (attention core only), full (every layer's forward re-run) or selective_op
    (torchtitan's per-op SAC: every second GEMM and the non-GEMM kernels re-run)."""
    recompute_method: str | None = None
    """With ``recompute_granularity = "full"``, Megatron-LM's ``--recompute-method``: ``uniform``
    (checkpoints of ``recompute_num_layers`` consecutive layers) or ``block`` (only the first
    ``recompute_num_layers`` layers of each pipeline stage's chunk); unset: every layer
    (:mod:`workload.parallel.recompute`). A ``[training]`` key of a scenario, as Megatron's flag is."""
    recompute_num_layers: int | None = None
    """Megatron-LM's ``--recompute-num-layers``, with ``recompute_method``."""
    zero_stage: int = 0
    """0: DDP; 1: distributed optimizer (optimizer states sharded); 2: + gradients; 3: + parameters."""
    use_distributed_optimizer: bool = False
    """Megatron's flag; equivalent to zero_stage = 1."""
    zero_impl: str = "megatron"
    """Which implementation runs ``zero_stage = 3``: one of :data:`ZERO_IMPLS`."""
    fsdp: bool = False
    """PyTorch FSDP (= ZeRO-3 with per-layer all-gather / reduce-scatter and prefetch)."""
    pipeline_schedule: str | None = None
    """gpipe, 1f1b or interleaved_1f1b; default 1f1b, or interleaved_1f1b when virtual stages > 1."""
    grad_bucket_size_bytes: int = 40_000_000 * 2
    """DDP gradient bucket (Megatron: 40M parameters, bf16 gradients reduced as fp32 -> here bytes)."""
    overlap_grad_reduce: bool = False
    """Launch each bucket's reduction as soon as backward has produced it, overlapping compute."""
    overlap_param_gather: bool = False
    """With the distributed optimizer: overlap the parameter all-gather with the next forward."""
    overlap_p2p_comm: bool = True
    """Pipeline sends and receives overlap compute (Megatron-LM ``--overlap-p2p-communication``: added
    2023-05 for the interleaved schedule, its default since 2023-10). False: Megatron's batched,
    synchronised exchanges, the only mode before (:mod:`workload.parallel.p2p_batched`); 1f1b and
    interleaved_1f1b schedules only."""
    rank_order: str = DEFAULT_RANK_ORDER
    """Axis order from innermost (fastest-varying rank) to outermost, Megatron's RankGenerator."""
    num_layers_in_first_pipeline_stage: int | None = None
    """Uneven pipeline: layers on the first stage (the rest split evenly)."""
    num_layers_in_last_pipeline_stage: int | None = None
    """Uneven pipeline: layers on the last stage."""
    moe_tokens_per_expert: str = "uniform"
    """Routing assumption for MoE all-to-all and expert GEMMs (data-dependent on real GPUs)."""
    tp_comm_overlap: bool = False
    """Megatron-Core ``--tp-comm-overlap`` (TE userbuffers): the sequence-parallel all-gathers and
    reduce-scatters run in ``tp`` chunks pipelined with their GEMMs (:mod:`workload.parallel.tp_overlap`).
    Needs ``sequence_parallel``."""
    async_tp: bool = False
    """torchtitan's async (micro-pipelined) TP: the same pipelining with copy-engine peer copies.
    Needs ``sequence_parallel`` (torchtitan's TP always shards the sequence)."""

    # -- derived ---------------------------------------------------------------------------
    @property
    def tp(self) -> int:
        return self.tensor_model_parallel_size

    @property
    def pp(self) -> int:
        return self.pipeline_model_parallel_size

    @property
    def cp(self) -> int:
        return self.context_parallel_size

    @property
    def ep(self) -> int:
        return self.expert_model_parallel_size

    @property
    def dp(self) -> int:
        if self.data_parallel_size is None:
            raise ValueError("data_parallel_size is not set: call ParallelConfig.resolve(world_size) first")
        return self.data_parallel_size

    @property
    def vpp(self) -> int:
        return self.virtual_pipeline_model_parallel_size or 1

    @property
    def schedule(self) -> str:
        if self.pipeline_schedule:
            return self.pipeline_schedule
        return "interleaved_1f1b" if self.vpp > 1 else "1f1b"

    @property
    def effective_zero_stage(self) -> int:
        if self.fsdp:
            return 3
        return max(self.zero_stage, 1 if self.use_distributed_optimizer else 0)

    @property
    def fsdp_keeps_unsharded(self) -> bool:
        """FSDP with pipeline stages, as torchtitan runs FSDP2 + PP: ``reshard_after_forward`` is off
        with PP (torchtitan's "default" policy, ``parallelize.py``: ``reshard_after_forward = not
        pp_enabled``) and PyTorch's pipeline schedules turn gradient sync and reshard-after-backward off
        for every micro-batch but the last (``torch.distributed.pipelining``,
        ``backward_maybe_with_nosync``). So each unit is all-gathered once per step, at its first
        forward, stays unsharded, and its fp32 gradients accumulate unsharded until one reduce-scatter
        after its last backward."""
        return self.fsdp and self.pp > 1

    @property
    def memory_zero_stage(self) -> int:
        """The ZeRO stage of what is still sharded at the memory peak: 1 under
        :attr:`fsdp_keeps_unsharded` (parameters and gradients resident whole, optimizer states
        sharded), :attr:`effective_zero_stage` otherwise."""
        return 1 if self.fsdp_keeps_unsharded else self.effective_zero_stage

    @property
    def world_size(self) -> int:
        return self.tp * self.cp * self.dp * self.pp

    @property
    def num_microbatches(self) -> int:
        """Micro-batches per pipeline per iteration: global_batch / (micro_batch * dp)."""
        gbs = self.global_batch_size or self.micro_batch_size * self.dp
        return gbs // (self.micro_batch_size * self.dp)

    def __post_init__(self) -> None:
        self._check_types()
        self._check_values()
        self._check_combinations()

    def _check_types(self) -> None:
        for name in ("tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size",
                     "expert_model_parallel_size", "micro_batch_size"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        for name in ("data_parallel_size", "global_batch_size", "virtual_pipeline_model_parallel_size",
                     "num_layers_in_first_pipeline_stage", "num_layers_in_last_pipeline_stage"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
                raise ValueError(f"{name} must be a positive integer or unset, got {v!r}")
        for name in ("sequence_parallel", "use_distributed_optimizer", "fsdp", "overlap_grad_reduce",
                     "overlap_param_gather", "overlap_p2p_comm", "tp_comm_overlap", "async_tp"):
            v = getattr(self, name)
            if not isinstance(v, bool):
                raise ValueError(f"{name} must be true or false, got {v!r}")
        for name in ("recompute_granularity", "rank_order", "moe_tokens_per_expert", "zero_impl"):
            if not isinstance(getattr(self, name), str):
                raise ValueError(f"{name} must be a string, got {getattr(self, name)!r}")
        if not isinstance(self.zero_stage, int) or isinstance(self.zero_stage, bool):
            raise ValueError(f"zero_stage must be 0, 1, 2 or 3, got {self.zero_stage!r}")
        if not isinstance(self.grad_bucket_size_bytes, int) or isinstance(self.grad_bucket_size_bytes, bool):
            raise ValueError(f"grad_bucket_size_bytes must be an integer, got {self.grad_bucket_size_bytes!r}")

    def _check_values(self) -> None:
        if self.recompute_granularity not in RECOMPUTE_ALL:
            raise ValueError(f"recompute_granularity: unknown value {self.recompute_granularity!r}; "
                             f"allowed: {', '.join(RECOMPUTE_ALL)}")
        if self.pipeline_schedule is not None and self.pipeline_schedule not in SCHEDULES:
            raise ValueError(f"pipeline_schedule: unknown value {self.pipeline_schedule!r}; "
                             f"allowed: {', '.join(SCHEDULES)}")
        if self.zero_stage not in (0, 1, 2, 3):
            raise ValueError(f"zero_stage must be 0, 1, 2 or 3, got {self.zero_stage!r}")
        if self.zero_impl not in ZERO_IMPLS:
            raise ValueError(f"zero_impl: unknown value {self.zero_impl!r}; allowed: {', '.join(ZERO_IMPLS)}")
        if self.grad_bucket_size_bytes <= 0:
            raise ValueError(f"grad_bucket_size_bytes must be > 0, got {self.grad_bucket_size_bytes}")
        order = self.rank_order.split("-")
        if sorted(order) != sorted(AXES):
            raise ValueError(f"rank_order {self.rank_order!r} must be a permutation of {'-'.join(AXES)}")

    def _check_combinations(self) -> None:  # noqa: C901 -- a flat list of independent conflict checks
        check_recompute_keys(self.recompute_granularity, self.recompute_method, self.recompute_num_layers,
                             zero_impl=self.zero_impl)
        if self.fsdp and self.zero_stage not in (0, 3):
            raise ValueError(f"fsdp=true is ZeRO stage 3; it conflicts with zero_stage={self.zero_stage}")
        if self.use_distributed_optimizer and self.zero_stage in (2, 3):
            raise ValueError(f"use_distributed_optimizer=true is ZeRO stage 1 (Megatron-LM's distributed optimizer); "
                             f"it conflicts with zero_stage={self.zero_stage}; choose one")
        if self.fsdp and self.use_distributed_optimizer:
            raise ValueError("fsdp=true conflicts with use_distributed_optimizer=true (ZeRO-1); choose one")
        if not self.overlap_p2p_comm and self.pp > 1 and self.schedule == "gpipe":
            raise ValueError("overlap_p2p_comm = false needs pipeline_schedule 1f1b or interleaved_1f1b "
                             "(Megatron's batched exchanges); got gpipe")
        if self.zero_impl == "deepspeed":
            self._check_deepspeed()
        if self.zero_stage == 2 and not self.fsdp:
            self._check_zero2()
        if self.zero_stage == 3 and not self.fsdp and self.zero_impl != "deepspeed" and self.pp > 1:
            raise ValueError("zero_stage=3 with pipeline_model_parallel_size > 1: Megatron-LM's --use-torch-fsdp2 and "
                             "DeepSpeed refuse pipeline parallelism; set fsdp = true (torchtitan's FSDP2 with PP)")
        if self.sequence_parallel and self.tp == 1:
            raise ValueError("sequence_parallel=True needs tensor_model_parallel_size > 1")
        if self.tp_comm_overlap and not self.sequence_parallel:
            raise ValueError("tp_comm_overlap=true needs sequence_parallel=true (as Megatron-Core's "
                             "--tp-comm-overlap requires --sequence-parallel)")
        if self.async_tp and not self.sequence_parallel:
            raise ValueError("async_tp=true needs sequence_parallel=true (and tensor_model_parallel_size > 1)")
        if self.async_tp and self.tp_comm_overlap:
            raise ValueError("async_tp=true (torchtitan) conflicts with tp_comm_overlap=true (Megatron-Core); "
                             "choose one")
        if self.overlap_param_gather and not (self.effective_zero_stage == 1 and self.overlap_grad_reduce):
            # Megatron-LM's arguments.py asserts both: the gathers are the distributed optimizer's buckets
            raise ValueError("overlap_param_gather=true needs the distributed optimizer (use_distributed_optimizer="
                             "true) and overlap_grad_reduce=true, as Megatron-LM's --overlap-param-gather does")
        self._check_one_stack()
        if self.vpp > 1 and self.pp == 1:
            raise ValueError("virtual_pipeline_model_parallel_size > 1 needs pipeline_model_parallel_size > 1")
        if self.schedule == "interleaved_1f1b" and self.vpp == 1:
            raise ValueError("pipeline_schedule='interleaved_1f1b' needs virtual_pipeline_model_parallel_size > 1")
        if self.vpp > 1 and self.schedule != "interleaved_1f1b":
            raise ValueError(f"virtual_pipeline_model_parallel_size={self.vpp} needs pipeline_schedule="
                             f"'interleaved_1f1b', got {self.schedule!r}")

    def _check_one_stack(self) -> None:
        """torchtitan's features (async TP, per-op SAC, FSDP with PP) beside Megatron-LM's or DeepSpeed's: no
        stack runs the plan. torchtitan's data parallelism is FSDP2 (``dp_shard``) or DDP/HSDP (``dp_replicate``), its
        device mesh ``["pp", "dp_replicate", "dp_shard", "cp", "tp"]`` (Megatron's default order), its TP
        overlap async TP and its activation checkpointing per layer or per op (``torchtitan/config/
        job_config.py``, ``torchtitan/distributed/parallel_dims.py``)."""
        titan = self._torchtitan_keys()
        if not titan:
            return
        other = [k for k, on in (
            ("use_distributed_optimizer / zero_stage 1-2 (Megatron-LM, DeepSpeed)",
             self.zero_stage in (1, 2) or self.use_distributed_optimizer),
            ("zero_impl='deepspeed'", self.zero_impl == "deepspeed"),
            ("tp_comm_overlap=true (Megatron-Core)", self.tp_comm_overlap),
            (f"rank_order={self.rank_order!r} (torchtitan's device mesh orders ranks {DEFAULT_RANK_ORDER})",
             self.rank_order != DEFAULT_RANK_ORDER),
            ("recompute_granularity='selective' (Megatron-LM's core-attention recompute)",
             self.recompute_granularity == "selective"),
            ("sequence_parallel=false with tensor_model_parallel_size > 1 (torchtitan's TP shards the sequence)",
             self.tp > 1 and not self.sequence_parallel)) if on]
        if other:
            raise ValueError(f"{titan[0]} is torchtitan's, which runs FSDP2 (fsdp=true) or plain data parallelism; "
                             f"it conflicts with {other[0]}")

    def _torchtitan_keys(self) -> list[str]:
        """The keys that make this plan torchtitan's (empty: any stack may run it)."""
        return [k for k, on in (("async_tp=true", self.async_tp),
                                ("recompute_granularity='selective_op'", self.recompute_granularity == "selective_op"),
                                # Megatron-LM asserts --use-torch-fsdp2 "not supported with pipeline parallelism"
                                ("fsdp=true with pipeline_model_parallel_size > 1", self.fsdp and self.pp > 1))
                if on]

    def _check_torchtitan_ep(self) -> None:
        """torchtitan's expert parallelism borrows its ranks from FSDP's ``dp_shard`` and from ``cp``
        (``torchtitan/distributed/parallel_dims.py``: ``ep = dp_shard_in_ep x cp``, experts sharded over TP as
        here), never from ``dp_replicate``: ``ep`` must divide ``dp_shard x cp`` and ``cp`` divide ``ep``."""
        titan = self._torchtitan_keys()
        if self.ep == 1 or not titan:
            return
        dp_shard = self.dp if self.effective_zero_stage == 3 else 1
        if (dp_shard * self.cp) % self.ep or self.ep % self.cp:
            raise ValueError(f"{titan[0]} is torchtitan's, whose expert parallelism borrows FSDP's and CP's ranks "
                             f"(ep = dp_shard_in_ep x cp): expert_model_parallel_size={self.ep} must divide "
                             f"dp_shard x context_parallel_size = {dp_shard} x {self.cp} (dp_shard is "
                             f"data_parallel_size with fsdp/zero_stage 3, else 1) and be a multiple of the latter")

    def _check_zero2(self) -> None:
        """ZeRO stage 2 (sharded gradients) is DeepSpeed's, run through Megatron-DeepSpeed: its pipeline
        engine asserts "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism"
        (``deepspeed/runtime/pipe/engine.py``), and Megatron-Core's context parallelism and TE userbuffer
        overlap (``--tp-comm-overlap``) are not in it."""
        other = [k for k, on in (("pipeline_model_parallel_size > 1 (DeepSpeed's pipeline engine runs ZeRO "
                                  "stage 0-1 only)", self.pp > 1),
                                 ("context_parallel_size > 1 (Megatron-Core's)", self.cp > 1),
                                 ("tp_comm_overlap=true (Megatron-Core's)", self.tp_comm_overlap)) if on]
        if other:
            raise ValueError(f"zero_stage=2 is DeepSpeed's ZeRO-2 (Megatron-DeepSpeed); it conflicts with {other[0]}")

    def _check_deepspeed(self) -> None:
        if self.fsdp:
            raise ValueError("zero_impl='deepspeed' conflicts with fsdp=true (PyTorch FSDP); set zero_stage = 3 "
                             "without fsdp")
        if self.zero_stage != 3:
            raise ValueError(f"zero_impl='deepspeed' models DeepSpeed ZeRO stage 3; it needs zero_stage = 3, "
                             f"got zero_stage={self.zero_stage}")
        if self.pp > 1:
            raise ValueError(f"zero_impl='deepspeed' needs pipeline_model_parallel_size = 1, got {self.pp} "
                             f"(DeepSpeed's pipeline engine does not run ZeRO stage 3)")

    # -- resolution against a world and a model ------------------------------------------------
    def resolve(self, world_size: int) -> ParallelConfig:
        """Fill ``data_parallel_size`` and ``global_batch_size`` for ``world_size`` GPUs.

        Raises:
            ValueError: the product of the parallel sizes does not match ``world_size``, or the global
                batch is not divisible by micro_batch_size x data_parallel_size.
        """
        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        model_par = self.tp * self.cp * self.pp
        if self.data_parallel_size is None:
            if world_size % model_par:
                raise ValueError(
                    f"world_size={world_size} is not divisible by tensor_model_parallel_size={self.tp} x "
                    f"context_parallel_size={self.cp} x pipeline_model_parallel_size={self.pp} = {model_par}")
            cfg = replace(self, data_parallel_size=world_size // model_par)
        else:
            cfg = self
            if cfg.world_size != world_size:
                raise ValueError(
                    f"tensor_model_parallel_size={self.tp} x context_parallel_size={self.cp} x "
                    f"data_parallel_size={cfg.dp} x pipeline_model_parallel_size={self.pp} = "
                    f"{cfg.world_size}, but the cluster has world_size={world_size} GPUs")
        if cfg.dp % cfg.ep:
            raise ValueError(f"expert_model_parallel_size={cfg.ep} must divide data_parallel_size={cfg.dp}")
        cfg._check_torchtitan_ep()
        gbs = cfg.global_batch_size or cfg.micro_batch_size * cfg.dp
        if gbs % (cfg.micro_batch_size * cfg.dp):
            raise ValueError(
                f"global_batch_size={gbs} is not divisible by micro_batch_size={cfg.micro_batch_size} x "
                f"data_parallel_size={cfg.dp} = {cfg.micro_batch_size * cfg.dp}")
        cfg = replace(cfg, global_batch_size=gbs)
        if cfg.schedule == "interleaved_1f1b" and cfg.num_microbatches % cfg.pp:
            raise ValueError(
                f"interleaved_1f1b needs the number of micro-batches ({cfg.num_microbatches} = "
                f"global_batch_size / (micro_batch_size x data_parallel_size)) to be a multiple of "
                f"pipeline_model_parallel_size={cfg.pp} (Megatron-LM's requirement)")
        return cfg

    def validate_model(self, model: Any) -> None:
        """Check divisibility against a transformer config (Megatron names).

        Tensor parallelism splits what the column/row-parallel linears split: the query heads, the
        key/value heads (``num_query_groups``) and the MLP width. ``hidden_size`` is never split (the
        attention width is heads x ``head_dim``, which need not be ``hidden_size``: Qwen3), so TP need
        not divide it. A sliding window with context parallelism is refused: ring attention's
        windowed schedule is not modelled; so is context parallelism with the unfused attention backend
        (Megatron-Core's local ``DotProductAttention`` asserts ``context_parallel_size == 1``: CP runs in
        Transformer Engine's fused attention only).

        Raises:
            ValueError: naming the model field, its value and the parallel size that does not divide it.
        """
        tp = self.tp
        # (and the vocabulary: the zoo's VocabParallelEmbedding shards V unpadded, so a run would fail at trace)
        for fname in ("num_attention_heads", "num_query_groups", "ffn_hidden_size", "vocab_size"):
            v = getattr(model, fname, None)
            if v and v % tp:
                raise ValueError(f"tensor_model_parallel_size={tp} does not divide {fname}={v}")
        if self.cp > 1 and getattr(model, "attention_backend", None) == "unfused":
            # Megatron-Core's local DotProductAttention asserts context_parallel_size == 1: CP is TE's only
            raise ValueError(f"context_parallel_size={self.cp} with attention_backend = \"unfused\": context "
                             f"parallelism runs only in a fused attention kernel; use another backend or "
                             f"context_parallel_size = 1")
        if self.cp > 1 and getattr(model, "sliding_window", None) is not None:
            raise ValueError(f"context_parallel_size={self.cp} with sliding_window: ring attention over a "
                             f"sliding window is not modelled; use context_parallel_size = 1")
        seq = getattr(model, "seq_length", None)
        if seq and self.cp > 1 and seq % (2 * self.cp):
            raise ValueError(f"context_parallel_size={self.cp}: seq_length={seq} must be divisible by "
                             f"2 x context_parallel_size = {2 * self.cp} (load-balanced causal split)")
        if seq and self.sequence_parallel and (seq // self.cp) % tp:
            raise ValueError(f"sequence_parallel: seq_length={seq} (per context-parallel rank) is not "
                             f"divisible by tensor_model_parallel_size={tp}")
        experts = getattr(model, "num_moe_experts", None)
        if self.ep > 1 and not experts:
            raise ValueError(f"expert_model_parallel_size={self.ep} needs a mixture-of-experts model; "
                             f"{getattr(model, 'name', 'this model')} has no experts (num_moe_experts unset)")
        if self.ep > 1 and experts and experts % self.ep:
            raise ValueError(f"expert_model_parallel_size={self.ep} must divide num_moe_experts={experts}")
        layers = getattr(model, "num_layers", None)
        if layers:
            check_chunks(self.recompute_method, self.recompute_num_layers, self.stage_layers(layers))

    def recomputed_layer_fraction(self, num_layers: int) -> float:
        """The share of the ``num_layers`` layers whose forward full recomputation re-runs: 1 without
        ``recompute_method`` (every layer), else what ``uniform``/``block`` select per model chunk."""
        if self.recompute_method is None or self.recompute_num_layers is None:
            return 1.0
        return recomputed_layers(self.recompute_method, self.recompute_num_layers,
                                 self.stage_layers(num_layers)) / num_layers

    def stage_layers(self, num_layers: int) -> list[int]:
        """Layers per pipeline stage (per model chunk when interleaved: ``len == pp * vpp``).

        Raises:
            ValueError: the layers cannot be split as asked.
        """
        pp, v = self.pp, self.vpp
        first, last = self.num_layers_in_first_pipeline_stage, self.num_layers_in_last_pipeline_stage
        if first is None and last is None:
            if num_layers % (pp * v):
                what = "pipeline_model_parallel_size" + (" x virtual_pipeline_model_parallel_size" if v > 1 else "")
                raise ValueError(f"{what} = {pp * v} does not divide num_layers={num_layers}; set "
                                 f"num_layers_in_first_pipeline_stage / num_layers_in_last_pipeline_stage "
                                 f"for uneven stages")
            return [num_layers // (pp * v)] * (pp * v)
        if pp == 1:
            raise ValueError("num_layers_in_first/last_pipeline_stage need pipeline_model_parallel_size > 1")
        rest_stages = pp - (first is not None) - (last is not None)
        rest_layers = num_layers - (first or 0) - (last or 0)
        if rest_layers < rest_stages or (rest_stages and rest_layers % rest_stages) or (
                not rest_stages and rest_layers):
            given = " and ".join(f"num_layers_in_{w}_pipeline_stage={n}" for w, n in (("first", first), ("last", last))
                                 if n is not None)
            if not rest_stages:
                why = f"with pipeline_model_parallel_size={pp} there is no other stage, so they must add up to it"
            else:
                which = ("the last stage" if last is None and rest_stages == 1 else
                         "the first stage" if first is None and rest_stages == 1 else
                         "the middle stage" if rest_stages == 1 else f"the other {rest_stages} stages")
                need = ("needs at least one layer" if rest_stages == 1 else
                        "need at least one layer each" if rest_layers < rest_stages else
                        f"split them evenly, and {rest_layers} is not a multiple of {rest_stages}")
                why = f"leaves {rest_layers} layers for {which} (pipeline_model_parallel_size={pp}), which {need}"
            raise ValueError(f"num_layers={num_layers} with {given}: {why}")
        mid = rest_layers // rest_stages if rest_stages else 0
        out = [mid] * pp
        if first is not None:
            out[0] = first
        if last is not None:
            out[-1] = last
        if v == 1:
            return out
        # interleaved: each stage's layers split evenly over its v model chunks (Megatron-Core's
        # TransformerConfig: the end counts and the middle stages' count multiples of v)
        for what, n in (("num_layers_in_first_pipeline_stage", first), ("num_layers_in_last_pipeline_stage", last),
                        ("the middle stages' layers", mid if rest_stages else None)):
            if n is not None and n % v:
                raise ValueError(f"{what} = {n} is not a multiple of virtual_pipeline_model_parallel_size={v}: "
                                 f"each of a stage's {v} model chunks takes an equal share")
        return [out[s] // v for _ in range(v) for s in range(pp)]
