"""Trace one rank's share of a model for a parallel configuration.

Builds the zoo model as one tensor-parallel rank's shard (heads, FFN, vocabulary divided by TP; the
sequence divided by CP; experts divided by EP), traces one micro-batch on the meta device with layer
deduplication, and counts this rank's parameters per part (embedding / one block / head). A user's
own module (:class:`workload.custom.CustomModel`) is traced whole, by its own ``trace``.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from hwmodel.dtypes import TRAINING_DTYPES as _DTYPE_TABLE
from hwmodel.dtypes import training_dtype
from workload.custom import CustomModel
from workload.fp8 import fp8_modules, to_fp8
from workload.parallel.builder import ModelTrace
from workload.parallel.config import ParallelConfig
from workload.parallel.tp import TPContext
from workload.trace import trace_model
from workload.zoo import build_model_from_config
from workload.zoo.gpt import VocabParallelEmbedding

TORCH_DTYPES = {n: getattr(torch, d.torch_name) for n, d in _DTYPE_TABLE.items() if d.traced_as == n}
"""Training dtypes traced as such."""
TRAINING_DTYPES = tuple(_DTYPE_TABLE)
"""Allowed training dtypes; ``fp8`` is bf16 training with FP8 Linear GEMMs (:mod:`workload.fp8`)."""


def trace_rank(model_cfg, config: ParallelConfig, *, dtype: str = "bf16") -> ModelTrace:
    """The :class:`ModelTrace` of one tensor/context/expert-parallel rank for ``config``.

    ``dtype="fp8"`` traces the bf16 model and hands it to :func:`workload.fp8.to_fp8` (Transformer
    Engine's hybrid FP8 recipe on the blocks' Linear layers).

    Raises:
        ValueError: the parallel sizes do not divide the model (naming the fields and numbers), an
            unknown dtype, or ``fp8`` for a model without transformer blocks.
    """
    traced_as = training_dtype(dtype).traced_as
    config.validate_model(model_cfg)
    transformer = hasattr(model_cfg, "num_attention_heads")
    if isinstance(model_cfg, CustomModel):  # a user's own nn.Module
        return model_cfg.trace(config, dtype)
    if dtype == "fp8" and not transformer:
        raise ValueError(f"dtype 'fp8' runs the Linear layers of transformer blocks in FP8 (Transformer "
                         f"Engine); {getattr(model_cfg, 'name', 'this model')} is not a transformer")
    if transformer:
        seq = model_cfg.seq_length // config.cp
        traced_cfg = replace(model_cfg, seq_length=seq)
        tp = TPContext(config.tp, config.sequence_parallel)
        model = build_model_from_config(traced_cfg, tensor_parallel=tp, expert_model_parallel_size=config.ep)
    else:
        if config.tp > 1 or config.cp > 1 or config.pp > 1:
            raise ValueError(f"{model_cfg.name}: only data parallelism is supported for this model "
                             f"(tensor/context/pipeline parallel sizes must be 1)")
        seq = 1
        traced_cfg = model_cfg
        model = build_model_from_config(model_cfg)
    graph = trace_model(model, micro_batch_size=config.micro_batch_size,
                        dtype=TORCH_DTYPES[traced_as])
    pre, block, post, expert = _param_counts(model, graph)
    fp8_params = 0
    if dtype == "fp8":
        paths, fp8_params = fp8_modules(getattr(model, graph.block_attr)[0])
        graph = to_fp8(graph, paths)
    tied = 0
    embedding = sum(m.weight.numel() for m in model.modules() if isinstance(m, VocabParallelEmbedding))
    # tied: the output layer reuses the input embedding (GPT, BERT; Llama keeps its own output layer)
    if transformer and not getattr(model_cfg, "untie_embeddings_and_output_weights", True) and post < embedding:
        if config.pp > 1:
            post += pre  # Megatron keeps a copy of the tied embedding on the last stage
        else:  # one stage: the output layer reuses the embedding, which "pre" owns
            tied = embedding
    return ModelTrace(
        graph=graph,
        num_layers=graph.num_blocks,
        hidden_size=getattr(traced_cfg, "hidden_size", 0),
        seq_length=seq,
        micro_batch_size=config.micro_batch_size,
        params_pre=pre, params_block=block, params_post=post, params_block_expert=expert, params_post_tied=tied,
        dtype="bf16" if dtype == "fp8" else dtype, fp8_params_block=fp8_params)


def _param_counts(model: torch.nn.Module, graph) -> tuple[int, int, int, int]:
    """Elements of this rank's parameters: (before the blocks, one block, after, experts in a block)."""
    layers = getattr(model, graph.block_attr, None)
    block = expert = 0
    if layers is not None and len(layers):
        for name, p in layers[0].named_parameters():
            block += p.numel()
            if ".fc1" in f".{name}" and p.dim() == 3 or ".fc2" in f".{name}" and p.dim() == 3:
                expert += p.numel()
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
