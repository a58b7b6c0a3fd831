"""The model-family interface: everything the runner and the rank tracer need to know about a kind of model.

A *family* (GPT, Llama, Mixtral, BERT, ResNet, Qwen3-MoE, a user's own ``nn.Module``) lives in its own
module, next to the ``nn.Module`` that builds it, and is listed in :mod:`workload.zoo.registry`. A
configuration names its family in ``architecture`` (``TransformerConfig.architecture``,
``ResNetConfig.architecture``, ``CustomModel.architecture``); :func:`workload.zoo.registry.family_of`
looks it up. Nothing outside a family's module switches on the configuration's type.

A family says:

* ``config_type``: its configuration dataclass;
* :meth:`ModelFamily.build`: one tensor/expert-parallel rank's shard, an ``nn.Module`` (meta device
  under ``torch.device("meta")``);
* :meth:`ModelFamily.flops`: model and hardware FLOPs per iteration and the formula's name/source;
* :meth:`ModelFamily.memory`: the per-GPU memory model (:func:`transformer_memory`, the closed forms of
  :mod:`workload.memory`, for transformers; :func:`saved_tensor_memory`, the traced forward's saved
  tensors, for the others);
* :meth:`ModelFamily.unsupported`: the parallelisms (:data:`PARALLELISMS`) it cannot run, each with a
  one-line reason;
* for rank tracing: ``block_attr`` (its repeated blocks), :meth:`ModelFamily.expert_elements` (its
  experts), :meth:`ModelFamily.attention` (its attention heads) and :meth:`ModelFamily.tied_embedding_elements`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, replace
from typing import Any, ClassVar, NamedTuple

from torch import nn

from workload.memory import MemoryBreakdown, memory_per_gpu
from workload.parallel.config import ParallelConfig
from workload.parallel.deepspeed_memory import with_deepspeed_stage3

PARALLELISMS = {"tp": "tensor_model_parallel_size", "sp": "sequence_parallel", "cp": "context_parallel_size",
                "ep": "expert_model_parallel_size", "pp": "pipeline_model_parallel_size"}
"""The model-parallel strategies a family may decline, by short name -> ``[parallel]`` field. (Data
parallelism, ZeRO and FSDP apply to every family.)"""

TRACED_FLOPS_FORMULA = "traced model FLOPs (forward + backward of every op, 2 per multiply-accumulate)"


class Flops(NamedTuple):
    """FLOPs of one training iteration (all ranks)."""

    model: float
    """The model's FLOPs (forward + backward, no recomputation): what MFU counts."""
    hardware: float
    """What the GPUs execute, recomputation included."""
    formula: str
    """The formula's name and source, as printed in the report."""


@dataclass(frozen=True)
class Attention:
    """A family's attention heads: what tensor parallelism splits and the head width."""

    query_heads: int
    kv_heads: int
    """Key/value heads (query groups; = ``query_heads`` without grouped-query attention)."""
    head_dim: int
    """Channels per head; need not be ``hidden_size / query_heads`` (Qwen3: 128 with h = 2048, a = 32)."""


def state_bytes(dtype: str) -> tuple[int, int]:
    """(bytes per parameter, bytes per gradient) for a training dtype: fp32 parameters only for fp32
    training; fp32 main gradients (Megatron's ``accumulate_allreduce_grads_in_fp32``) except fp16."""
    return (4 if dtype == "fp32" else 2), (2 if dtype == "fp16" else 4)


class ModelFamily(ABC):
    """One kind of model. Subclasses set the class attributes and implement :meth:`build`."""

    name: ClassVar[str]
    """Registry key, the value of the configuration's ``architecture`` (``"gpt"``, ``"qwen3_moe"``)."""
    config_type: ClassVar[type]
    """The configuration dataclass."""
    block_attr: ClassVar[str] = "layers"
    """Module path of the container of repeated blocks (pipeline stages, recomputation, FSDP units);
    a path the module does not have means no blocks (the model is traced whole)."""
    transformer: ClassVar[bool] = True
    """Built from the zoo's Megatron layers (column/row-parallel linears): one tensor-parallel rank's
    shard is traced, and FP8 training (Transformer Engine on the blocks' Linear layers) applies."""
    hf_model_types: ClassVar[tuple[str, ...]] = ()
    """Hugging Face ``model_type`` values :meth:`from_hf` reads."""
    activations: ClassVar[tuple[str, ...]] = ()
    """MLP non-linearities its modules build (``[model] activation``); empty: the family has no such key."""
    hf_positive_ints: ClassVar[tuple[str, ...]] = ()
    """Hugging Face keys of its own that must be positive integers (checked before :meth:`from_hf`,
    beside the common ones: ``num_hidden_layers``, ``hidden_size``, ...)."""

    # -- building -------------------------------------------------------------------------------
    @abstractmethod
    def build(self, cfg: Any, *, tp: Any = None, ep: int = 1) -> nn.Module:
        """The module of one rank: ``tp`` a :class:`workload.parallel.tp.TPContext` (``None``: no tensor
        parallelism), ``ep`` expert-parallel ranks. Built on the current default device.

        Raises:
            ValueError: the parallel sizes do not divide the model, or the family does not support them.
        """

    def shard_config(self, cfg: Any, parallel: ParallelConfig) -> Any:
        """The configuration one rank traces: a transformer's sequence is split by context parallelism."""
        return replace(cfg, seq_length=cfg.seq_length // parallel.cp) if self.transformer else cfg

    def trace_dims(self, traced_cfg: Any) -> tuple[int, int]:
        """(hidden size, tokens per sample) of a block's input in the rank's trace -- what a pipeline
        point-to-point message carries per sample: ``(h, s / cp)`` for a transformer, ``(0, 1)`` else."""
        return (traced_cfg.hidden_size, traced_cfg.seq_length) if self.transformer else (0, 1)

    # -- parallel strategies --------------------------------------------------------------------
    def unsupported(self, cfg: Any) -> dict[str, str]:
        """The parallelisms (keys of :data:`PARALLELISMS`) this family cannot run, each with a one-line
        reason. Default: everything is supported except expert parallelism without experts."""
        if self.transformer and not getattr(cfg, "num_moe_experts", None):
            return {"ep": "expert parallelism needs a mixture-of-experts model (num_moe_experts unset)"}
        return {}

    def check_parallel(self, cfg: Any, parallel: ParallelConfig) -> None:
        """Reject a strategy of :meth:`unsupported` that ``parallel`` uses.

        Raises:
            ValueError: one line naming the model, the ``[parallel]`` field, its value and the reason.
        """
        self.check_sizes(cfg, tp=parallel.tp, cp=parallel.cp, ep=parallel.ep, pp=parallel.pp,
                         sequence_parallel=parallel.sequence_parallel)

    def check_sizes(self, cfg: Any, *, sequence_parallel: bool = False, **sizes: int) -> None:
        """:meth:`check_parallel` for plain sizes (``tp=2, ep=4``); sizes of 1 are not checked. Also refuses an
        ``activation`` the family does not build (:attr:`activations`)."""
        act = getattr(cfg, "activation", None)
        if self.activations and act not in self.activations:  # the memory model would count an MLP not built
            raise ValueError(f"{getattr(cfg, 'name', self.name)}: activation = {act!r} is not built by the {self.name} "
                             f"family; allowed: {', '.join(map(repr, self.activations))}")
        used = {k: v for k, v in sizes.items() if v > 1}
        if sequence_parallel:
            used["sp"] = True
        reasons = self.unsupported(cfg)
        for key, value in used.items():
            if key in reasons:
                raise ValueError(f"{getattr(cfg, 'name', self.name)}: {PARALLELISMS[key]}={value} is not "
                                 f"supported: {reasons[key]}")

    # -- rank tracing ---------------------------------------------------------------------------
    def own_trace(self, cfg: Any, parallel: ParallelConfig, dtype: str) -> Any:
        """A :class:`~workload.parallel.builder.ModelTrace` for a family that traces its module itself
        (a user's module); ``None`` (the default): the rank tracer builds the shard and traces it."""
        return None

    def attention(self, cfg: Any) -> Attention | None:
        """The attention heads (``None``: the model has no attention)."""
        if not self.transformer:
            return None
        return Attention(cfg.num_attention_heads, cfg.num_query_groups, cfg.kv_channels)

    def expert_elements(self, block: nn.Module) -> int:
        """Elements of the expert weights in one block of this rank (sharded by expert parallelism;
        replicated over fewer data-parallel ranks). Default: the zoo's :class:`workload.zoo.moe.MoE`."""
        from workload.zoo.moe import MoE

        return sum(p.numel() for m in block.modules() if isinstance(m, MoE) for p in m.expert_parameters())

    def tied_embedding_elements(self, model: nn.Module, cfg: Any) -> int:
        """Elements of the input embedding that the output layer reuses (0: a separate output layer)."""
        if not self.transformer or getattr(cfg, "untie_embeddings_and_output_weights", True):
            return 0
        from workload.zoo.gpt import VocabParallelEmbedding

        return sum(m.weight.numel() for m in model.modules() if isinstance(m, VocabParallelEmbedding))

    # -- FLOPs and memory -----------------------------------------------------------------------
    def flops(self, cfg: Any, parallel: ParallelConfig, graph: Any) -> Flops:
        """FLOPs per iteration; default :func:`traced_flops` of the rank's trace ``graph``."""
        return traced_flops(parallel, graph)

    def memory(self, cfg: Any, parallel: ParallelConfig, dtype: str, *,
               compiled: bool = False) -> MemoryBreakdown | None:
        """Peak memory of the busiest GPU (``None``: no memory model). Default: the transformer closed
        forms (:func:`transformer_memory`) for a transformer; ``compiled``: ``[training] compile``."""
        return transformer_memory(cfg, parallel, dtype, compiled=compiled) if self.transformer else None

    # -- Hugging Face ---------------------------------------------------------------------------
    def from_hf(self, d: dict[str, Any], *, name: str, seq_length: int | None) -> Any:
        """The configuration of a Hugging Face ``config.json`` dict of one of :attr:`hf_model_types`.

        Raises:
            KeyError: a required field is missing (:func:`workload.zoo.hf.config_from_hf` names it).
        """
        raise ValueError(f"{self.name}: this model family reads no Hugging Face config")


def traced_flops(parallel: ParallelConfig, graph: Any) -> Flops:
    """FLOPs counted from one rank's traced forward and backward, scaled to the whole iteration:
    ``per micro-batch x tp x cp x micro-batches x dp`` (ring attention does ``s/cp x s`` per rank where
    the trace holds ``s/cp x s/cp``); the hardware figure adds the recomputed forward ops."""
    g = graph
    per_mb = g.total_flops("fwd") + g.total_flops("bwd")
    if parallel.cp > 1:
        per_mb += (parallel.cp - 1) * sum(o.flops for o in g.ops if o.kind == "attention" and o.phase != "opt")
    shards = parallel.tp * parallel.cp
    model = per_mb * shards * parallel.num_microbatches * parallel.dp
    granularity = parallel.recompute_granularity
    extra = g.recompute_flops(granularity) if granularity != "none" else 0.0
    if granularity == "full" and g.num_blocks:  # Megatron's --recompute-method: only some layers
        extra *= parallel.recomputed_layer_fraction(g.num_blocks)
    hw = (per_mb + extra) * shards * parallel.num_microbatches * parallel.dp
    return Flops(model, hw, TRACED_FLOPS_FORMULA)


def transformer_memory(cfg: Any, parallel: ParallelConfig, dtype: str, *, compiled: bool = False) -> MemoryBreakdown:
    """:func:`workload.memory.memory_per_gpu` (Korthikanti et al. 2022 closed forms, model states by ZeRO
    stage) for a transformer configuration under ``parallel``, training in ``dtype``. ``fsdp = true`` is
    PyTorch FSDP, torchtitan's stack: its loss is PyTorch's cross entropy on upcast logits
    (``unfused_loss``). ``compiled``: torch.compile of the blocks (``[training] compile``)."""
    p = parallel
    param_bytes, grad_bytes = state_bytes(dtype)
    flash = getattr(cfg, "attention_backend", "flash") != "unfused"
    mem = memory_per_gpu(
        cfg, tp=p.tp, pp=p.pp, dp=p.dp, cp=p.cp, ep=p.ep, micro_batch_size=p.micro_batch_size,
        num_microbatches=p.num_microbatches, virtual_pipeline_size=p.vpp, sequence_parallel=p.sequence_parallel,
        # GPipe runs every forward before any backward: the first stage holds all m micro-batches
        num_microbatches_in_flight=p.num_microbatches if p.schedule == "gpipe" else None,
        recompute=p.recompute_granularity, recompute_method=p.recompute_method,
        recompute_num_layers=p.recompute_num_layers, zero_stage=p.memory_zero_stage, param_bytes=param_bytes,
        grad_bytes=grad_bytes, flash_attention=flash,
        fp8=dtype == "fp8", unfused_loss=p.fsdp, stage_layers=p.stage_layers(cfg.num_layers), compiled=compiled)
    if p.zero_impl == "deepspeed":  # DeepSpeed's per-module buffers, not FSDP's per-layer ones
        mem = with_deepspeed_stage3(mem, cfg, p, param_bytes, grad_bytes, flash_attention=flash, fp8=dtype == "fp8")
    elif dtype == "fp16" and not p.fsdp:
        mem = replace(mem, optimizer_step_grads=fp16_optimizer_grad_copies(mem))
    return mem


def fp16_optimizer_grad_copies(mem: MemoryBreakdown) -> float:
    """Bytes of the fp32 gradient copies Megatron-LM's fp16 optimizer holds at its step, beside the fp16
    gradients (which stay until the next iteration's ``zero_grad``): ``main_param.grad =
    model_param.grad.float()`` for each fp16 parameter (``Float16OptimizerWithFloat16Params.
    _copy_model_grads_to_main_grads``, ``megatron/optimizer/optimizer.py``; v2.0's ``FP16OptimizerWithFP16Params``
    copies into fp32 ``.grad`` tensors it keeps; the distributed optimizer copies its shard): 4 bytes per
    element the fp32 master weights cover, a third of the 12-byte optimizer states, sharded as they are.
    With bf16 the main gradients are fp32 already and ``.float()`` copies nothing."""
    return mem.optimizer_states / 3


def saved_tensor_memory(module: nn.Module, name: str, parallel: ParallelConfig, dtype: str) -> MemoryBreakdown:
    """Memory of a module without closed forms: model states by ZeRO stage and the tensors autograd saves
    in its traced forward (:meth:`workload.custom.CustomModel.memory`), the module seen as a user's
    module with its own ``example_inputs``."""
    from workload.custom import CustomModel

    param_bytes, grad_bytes = state_bytes(dtype)
    cm = CustomModel.from_factory(module, name, {})
    return cm.memory(parallel, dtype=dtype, param_bytes=param_bytes, grad_bytes=grad_bytes)


__all__ = ["PARALLELISMS", "TRACED_FLOPS_FORMULA", "Attention", "Flops", "ModelFamily", "saved_tensor_memory",
           "state_bytes", "traced_flops", "transformer_memory"]
