"""Trace one rank's share of a model for a parallel configuration.

Asks the model's family (:mod:`workload.zoo.family`) to build one tensor-parallel rank's shard (heads,
FFN, vocabulary divided by TP; the sequence divided by CP; experts divided by EP), traces one
micro-batch on the meta device with layer deduplication of the family's blocks, and counts this rank's
parameters per part (embedding / one block / head; the family says which are experts and whether the
output layer is tied). A family may trace itself (a user's own module, :class:`workload.custom.CustomModel`).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from hwmodel.dtypes import TRAINING_DTYPES as _DTYPE_TABLE
from hwmodel.dtypes import training_dtype
from workload.compile import fuse_pointwise
from workload.fp8 import DEFAULT_RECIPE, fp8_modules, get_recipe, to_fp8
from workload.parallel.builder import ModelTrace, attention_kernel
from workload.parallel.config import ParallelConfig
from workload.parallel.tp import TPContext
from workload.trace import trace_model
from workload.zoo.family import ModelFamily
from workload.zoo.registry import family_of

TORCH_DTYPES = {n: getattr(torch, d.torch_name) for n, d in _DTYPE_TABLE.items() if d.traced_as == n}
"""Training dtypes traced as such."""
TRAINING_DTYPES = tuple(_DTYPE_TABLE)
"""Allowed training dtypes; ``fp8`` is bf16 training with FP8 Linear GEMMs (:mod:`workload.fp8`)."""


def trace_rank(model_cfg, config: ParallelConfig, *, dtype: str = "bf16", compile: bool = False,
               fp8_recipe: str = DEFAULT_RECIPE, fp8_param_gather: bool = False) -> ModelTrace:
    """The :class:`ModelTrace` of one tensor/context/expert-parallel rank for ``config``.

    ``dtype="fp8"`` traces the bf16 model and hands it to :func:`workload.fp8.to_fp8` (``fp8_recipe``,
    :data:`workload.fp8.RECIPES`, on the blocks' Linear layers; sequence-parallel all-gathers move FP8
    where the recipe does, under ``tp_comm_overlap``/``async_tp`` for ``delayed``). ``fp8_param_gather``:
    FP8 parameter all-gathers (:mod:`workload.fp8.params`). ``compile``: torch.compile's fusion of
    pointwise chains (:func:`workload.compile.fuse_pointwise`). ``fsdp = true`` is PyTorch's own stack
    (torchtitan): its model's separate projections (``separate_projections``), and eager, its RMSNorm
    runs as PyTorch's unfused decomposition (``fused_rms_norm=False`` of :func:`workload.trace.trace_model`)
    and its RoPE in fp32 complex numbers (``rotary_complex``); Megatron's TE/apex RMSNorm and
    torch.compile fuse them.

    Raises:
        ValueError: the parallel sizes do not divide the model (naming the fields and numbers), an
            unknown dtype, or ``fp8`` for a model without transformer blocks.
    """
    traced_as = training_dtype(dtype).traced_as
    config.validate_model(model_cfg)
    family = family_of(model_cfg)
    own = family.own_trace(model_cfg, config, dtype)  # a user's own nn.Module traces itself
    if own is not None:
        return own
    if dtype == "fp8" and not family.transformer:
        raise ValueError(f"dtype 'fp8' runs the Linear layers of transformer blocks in FP8 (Transformer "
                         f"Engine); {getattr(model_cfg, 'name', 'this model')} is not a transformer")
    family.check_parallel(model_cfg, config)
    traced_cfg = family.shard_config(model_cfg, config)
    if config.fsdp and hasattr(traced_cfg, "separate_projections"):  # torchtitan's model: wq, wk, wv; w1, w3
        if traced_cfg.separate_projections is None:  # unset: the stack's own; an explicit value is kept
            traced_cfg = replace(traced_cfg, separate_projections=True)
        if (not compile and traced_cfg.rotary_complex is None
                and getattr(traced_cfg, "position_embedding_type", "") == "rope"):  # its fp32 complex RoPE
            traced_cfg = replace(traced_cfg, rotary_complex=True)
    # torchtitan's TP is DTensor over PyTorch's dim-0 functional collectives: each sequence-parallel
    # all-gather / reduce-scatter pays a layout copy, except those Inductor's async-TP pass fuses into
    # fused_all_gather_matmul / fused_matmul_reduce_scatter (which take the gather/scatter dim themselves)
    dim0 = config.fsdp and config.sequence_parallel and not config.async_tp
    tp = TPContext(config.tp, config.sequence_parallel, dim0_collectives=dim0) if family.transformer else None
    with torch.device("meta"):
        model = family.build(traced_cfg, tp=tp, ep=config.ep)
    graph = trace_model(model, micro_batch_size=config.micro_batch_size, block_attr=family.block_attr,
                        dtype=TORCH_DTYPES[traced_as], fused_rms_norm=compile or not config.fsdp)
    pre, block, post, expert = _param_counts(model, graph, family)
    fp8_params = 0
    if dtype == "fp8":
        paths, fp8_params = fp8_modules(getattr(model, graph.block_attr)[0])
        gather = config.sequence_parallel and config.tp > 1 and get_recipe(fp8_recipe).gathers_fp8(
            config.tp_comm_overlap or config.async_tp)
        graph = to_fp8(graph, paths, fp8_recipe, fp8_gather=gather)
    if compile:
        graph = fuse_pointwise(graph)
    tied = 0
    embedding = family.tied_embedding_elements(model, model_cfg)
    if embedding and post < embedding:  # the output layer reuses the input embedding (GPT, BERT)
        if config.pp > 1:
            post += pre  # Megatron keeps a copy of the tied embedding on the last stage
        else:  # one stage: the output layer reuses the embedding, which "pre" owns
            tied = embedding
    hidden, seq = family.trace_dims(traced_cfg)
    return ModelTrace(
        graph=graph,
        num_layers=graph.num_blocks,
        hidden_size=hidden,
        seq_length=seq,
        micro_batch_size=config.micro_batch_size,
        params_pre=pre, params_block=block, params_post=post, params_block_expert=expert, params_post_tied=tied,
        dtype="bf16" if dtype == "fp8" else dtype, fp8_params_block=fp8_params, fp8_recipe=fp8_recipe,
        fp8_param_gather=fp8_param_gather and dtype == "fp8", block_modules=_block_modules(model, graph),
        attention_kernel=attention_kernel(model_cfg))


def _block_modules(model: torch.nn.Module, graph) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """The first block's modules that own parameters: (path inside the block, elements per parameter)."""
    layers = getattr(model, graph.block_attr, None)
    if layers is None or not len(layers):
        return ()
    return tuple((name, tuple(p.numel() for p in m.parameters(recurse=False)))
                 for name, m in layers[0].named_modules() if next(m.parameters(recurse=False), None) is not None)


def _param_counts(model: torch.nn.Module, graph, family: ModelFamily) -> tuple[int, int, int, int]:
    """Elements of this rank's parameters: (before the blocks, one block, after, experts in a block)."""
    layers = getattr(model, graph.block_attr, None)
    block = expert = 0
    if layers is not None and len(layers):
        block = sum(p.numel() for p in layers[0].parameters())
        expert = family.expert_elements(layers[0])
    # Modules used before the blocks (in forward) are "pre", the rest "post".
    pre_modules = {o.layer.split(".")[0] for o in graph.pre_ops("fwd") if o.layer}
    pre = post = 0
    for name, child in model.named_children():
        if name == graph.block_attr:
            continue
        n = sum(p.numel() for p in child.parameters())
        if name in pre_modules:
            pre += n
        else:
            post += n
    n_top = sum(p.numel() for p in model.parameters(recurse=False))
    post += n_top
    return pre, block, post, expert
