"""FP8 training as NVIDIA Transformer Engine (TE) and Megatron-Core run it (``--fp8-format hybrid``).

The *hybrid* recipe (TE ``DelayedScaling(fp8_format=Format.HYBRID)``): forward GEMM operands
(activations and weights) in E4M3, backward gradients in E5M2, one scaling factor per tensor taken from
the amax history of earlier iterations (*delayed scaling*). What runs in FP8, and what does not:

- **FP8**: the GEMMs of the Linear layers inside the transformer blocks -- fused QKV, attention output
  projection, MLP fc1 and fc2 (MoE experts' grouped GEMMs too) -- forward (fprop), data gradient
  (dgrad) and weight gradient (wgrad). In Megatron-Core these are TE modules
  (``TELayerNormColumnParallelLinear``, ``TERowParallelLinear``, ``TEGroupedLinear``).
- **bf16 / fp32**: everything else. The attention core (FlashAttention) stays bf16: TE's FP8
  dot-product attention is a separate switch (``--fp8-dot-product-attention``), off by default. Norms,
  softmax, elementwise kernels and the loss stay bf16/fp32; the optimizer keeps fp32 master weights
  and Adam moments. The embedding and the LM head (output layer) stay bf16: Megatron-Core's
  ``GPTModel`` builds its output layer from ``tensor_parallel.ColumnParallelLinear``, not a TE
  module, so it never runs in FP8, and the embedding is a lookup. Every transformer layer runs its
  Linears in FP8 (Megatron-Core's ``--first-last-layers-bf16``, which keeps some of the first and last
  *transformer layers* in bf16, is off by default). The MoE router GEMM stays bf16.
- **Communication** is unchanged: tensor-parallel collectives move bf16 activations, data-parallel
  gradient reductions fp32 (bf16 runs force ``accumulate_allreduce_grads_in_fp32``), pipeline
  activations bf16. (TE can all-gather FP8 inputs under sequence parallelism and Megatron-Core can
  gather FP8 parameters, ``--fp8-param-gather``; neither is modelled -- both default off or are
  version-dependent.)

**Quantisation kernels** (what keeps the speed-up below 2x besides the bf16 parts). On Hopper the FP8
tensor cores take only the "TN" operand layout, so every FP8 operand is needed both as is and
transposed (TE's *rowwise* and *columnwise* usages, TE docs "Performance considerations: handling
transposes"); TE produces both in one fused *cast-transpose* kernel that also records the amax. Each is
memory-bound: it reads the bf16 tensor once and writes two FP8 copies, :data:`CAST_TRANSPOSE_BYTES` =
4 bytes per element:

- forward, per FP8 GEMM: the input activation ``X`` (``b x m x k`` of the fprop GEMM) -> E4M3;
- backward, per FP8 module: the output gradient ``dY`` (the fprop output's elements) -> E5M2, shared
  by dgrad and wgrad;
- weights: ``W`` -> E4M3 once per iteration, on the first micro-batch's forward (TE's
  ``is_first_microbatch`` weight caching, which Megatron-Core uses), or on every forward pass under
  ZeRO-3/FSDP, where the gathered bf16 weights are freed after use (see
  :mod:`workload.parallel.builder`).

Not modelled: TE fuses the QKV/fc1 input cast into the preceding norm kernel (a slightly optimistic
extra kernel here, about 1 % of a layer); the per-micro-batch amax all-reduce and the per-iteration
scale update of delayed scaling (a few kB, latency-bound).

FP8 GEMMs have 1-byte operands and a bf16 output, so their HBM traffic is ``b*(m*k + k*n) + 2*b*m*n``
bytes. Memory per GPU (FP8 weight copies, FP8 saved activations) is in :mod:`workload.memory`.

Sources: TE user guide "Using FP8 with Transformer Engine" (recipe, formats, weight caching);
Micikevicius et al. 2022, "FP8 Formats for Deep Learning" (arXiv:2209.05433) for E4M3/E5M2;
Megatron-Core ``transformer_engine.py`` / ``gpt_model.py`` for which layers are TE modules.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection
from dataclasses import replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported where it is used, so the builder can import the constants cheaply
    from torch import nn

    from workload.trace import OpGraph

FP8_FORMAT = "hybrid"
"""TE's recipe: E4M3 forward (activations, weights), E5M2 backward (gradients)."""

CAST_TRANSPOSE_BYTES = 2 + 1 + 1
"""HBM bytes per element of one TE cast-transpose kernel: read bf16 (2), write the FP8 tensor (1) and
its transpose (1)."""

FP8_WEIGHT_COPY_BYTES = 2
"""Bytes per FP8-GEMM weight element that TE keeps beside the bf16 parameter: the cached E4M3 weight
(1) and its transpose (1) that Hopper's dgrad GEMM needs (TE "handling transposes"; TE PR #1596
ensures the weight's columnwise copy is kept for backward)."""

CAST_FWD_NAME = "te.cast_transpose_fp8_e4m3"
"""Kernel name of the forward input quantisation."""
CAST_BWD_NAME = "te.cast_transpose_fp8_e5m2"
"""Kernel name of the backward output-gradient quantisation."""
CAST_WEIGHT_NAME = "te.cast_transpose_fp8_weights"
"""Kernel name of the weight quantisation (once per iteration per layer)."""


def fp8_modules(block: nn.Module) -> tuple[list[str], int]:
    """The FP8 GEMM modules of one transformer block, and their weight elements.

    Returns (module paths relative to the block, e.g. ``["attn.qkv", "attn.proj", "mlp.fc1",
    "mlp.fc2"]``; the number of weight elements they hold). FP8 modules are the ``nn.Linear``
    submodules, except a MoE ``router``, and modules holding stacked 3-D expert weights (their grouped
    GEMM, traced as ``bmm``, is issued by that module itself). Biases stay bf16 and are not counted.
    """
    from torch import nn

    paths: list[str] = []
    weights = 0
    for name, mod in block.named_modules():
        if isinstance(mod, nn.Linear):
            if name.split(".")[-1] == "router":
                continue
            paths.append(name)
            weights += mod.weight.numel()
            continue
        experts = [p for p in mod.parameters(recurse=False) if p.dim() == 3]
        if experts:
            paths.append(name)
            weights += sum(p.numel() for p in experts)
    return paths, weights


def fp8_gemm_bytes(shape: tuple[int, ...]) -> float:
    """HBM bytes of an FP8 GEMM of shape ``(batch, m, n, k)``: 1-byte A and B, bf16 output C (B)."""
    b, m, n, k = shape
    return float(b * (m * k + k * n) + 2 * b * m * n)


def to_fp8(graph: OpGraph, modules: Collection[str]) -> OpGraph:
    """The op graph of an FP8 (hybrid) training step, from the bf16 trace of the same model.

    GEMMs of the blocks' FP8 ``modules`` (paths relative to a block, see :func:`fp8_modules`) get dtype
    ``fp8`` and FP8 operand bytes; a cast-transpose kernel is inserted before each forward FP8 GEMM
    (its input, ``b*m*k`` elements) and before the first backward GEMM of each FP8 module (its output
    gradient: the elements of the module's forward outputs). The kernels are ``elementwise``, with
    :data:`CAST_TRANSPOSE_BYTES` bytes per element and no model FLOPs. Everything else -- FLOPs, the
    other ops, blocks and parts -- is unchanged; indices and dependencies are renumbered.

    Raises:
        ValueError: no GEMM of the graph belongs to ``modules`` (nothing would run in FP8).
    """
    from workload.trace import OpGraph, OpRecord

    attr = graph.block_attr
    wanted = set(modules)

    def is_fp8(o: OpRecord) -> bool:
        if o.kind != "gemm" or o.part != "block" or o.block is None or len(o.shape) != 4:
            return False
        prefix = f"{attr}.{o.block}."
        return o.layer.startswith(prefix) and o.layer[len(prefix):] in wanted

    out_elems: dict[str, int] = defaultdict(int)
    for o in graph.ops:
        if o.phase == "fwd" and is_fp8(o):
            b, m, n, _ = o.shape
            out_elems[o.layer] += b * m * n
    if not out_elems:
        raise ValueError(f"FP8 training: no GEMM of the traced model belongs to an FP8 module "
                         f"({', '.join(sorted(wanted)) or 'none found'})")
    ops: list[OpRecord] = []
    remap: dict[int, int] = {}
    bwd_cast: dict[str, int] = {}  # module path -> index of its backward cast
    for o in graph.ops:
        deps = {remap[d] for d in o.deps}
        if is_fp8(o):
            b, m, n, k = o.shape
            cast_elems = 0
            if o.phase == "fwd":
                cast_elems, name = b * m * k, CAST_FWD_NAME
            elif o.phase == "bwd" and o.layer not in bwd_cast:
                cast_elems, name = out_elems[o.layer], CAST_BWD_NAME
            if cast_elems:
                idx = len(ops)
                ops.append(OpRecord(
                    index=idx, name=name, kind="elementwise", phase=o.phase, layer=o.layer, part=o.part,
                    block=o.block, flops=0.0, kernel_flops=0.0,
                    bytes_accessed=float(CAST_TRANSPOSE_BYTES * cast_elems), dtype="bf16", shape=(),
                    in_shapes=((cast_elems,),), out_shapes=((cast_elems,), (cast_elems,)),
                    deps=tuple(sorted(deps))))
                if o.phase == "bwd":
                    bwd_cast[o.layer] = idx
                deps.add(idx)
            if o.phase == "bwd":
                deps.add(bwd_cast[o.layer])
            new = replace(o, index=len(ops), dtype="fp8", bytes_accessed=fp8_gemm_bytes(o.shape),
                          deps=tuple(sorted(deps)))
        else:
            new = replace(o, index=len(ops), deps=tuple(sorted(deps)))
        remap[o.index] = new.index
        ops.append(new)
    out = OpGraph(ops=ops, num_blocks=graph.num_blocks, block_attr=attr, info=dict(graph.info))
    out.info.update(dtype="fp8", fp8_format=FP8_FORMAT, fp8_modules=sorted(wanted))
    return out


__all__ = ["CAST_BWD_NAME", "CAST_FWD_NAME", "CAST_TRANSPOSE_BYTES", "CAST_WEIGHT_NAME", "FP8_FORMAT",
           "FP8_WEIGHT_COPY_BYTES", "fp8_gemm_bytes", "fp8_modules", "to_fp8"]
