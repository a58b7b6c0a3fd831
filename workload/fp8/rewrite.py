"""The FP8 op-graph rewrite: which GEMMs run in FP8, and the quantisation kernels a recipe puts before them.

What runs in FP8, and what does not (Megatron-Core with Transformer Engine; torchao's ``Float8Linear``
converts the same ``nn.Linear`` layers of the blocks in torchtitan):

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
  Linears in FP8 (Megatron-Core's ``--first-last-layers-bf16`` is off by default). The MoE router GEMM
  stays bf16.
- **Communication**: data-parallel gradient reductions stay fp32 (bf16 runs force
  ``accumulate_allreduce_grads_in_fp32``), pipeline activations bf16. Sequence-parallel all-gathers that
  feed an FP8 GEMM move FP8 where the recipe does (:attr:`workload.fp8.recipe.Fp8Recipe.tp_gather`): the
  quantisation then runs on the local shard before the all-gather (TE's userbuffers and sequence-parallel
  gathers take a quantiser; torchtitan's float8 TP casts the DTensor shard), which lets
  ``tp_comm_overlap`` pair the all-gather with its GEMM again. Parameter all-gathers: ``fp8_param_gather``
  (:mod:`workload.parallel.builder`).

**Quantisation kernels** (what keeps the speed-up below 2x besides the bf16 parts) are the recipe's
(:mod:`workload.fp8.delayed`, ``tensorwise``, ``rowwise``, ``mxfp8``), memory-bound:

- forward, per FP8 GEMM: the input activation ``X`` (``b x m x k`` of the fprop GEMM);
- backward, per FP8 module: the output gradient ``dY`` (the fprop output's elements), shared by dgrad and
  wgrad;
- weights: once per iteration, on the first micro-batch's forward (TE's ``is_first_microbatch`` weight
  caching, which Megatron-Core uses), or on every forward pass under ZeRO-3/FSDP, where the gathered
  weights are freed after use (see :mod:`workload.parallel.builder`).

Not modelled: TE fuses the QKV/fc1 input cast into the preceding norm kernel (a slightly optimistic
extra kernel here, about 1 % of a layer); with FP8 sequence-parallel gathers, the transpose of the gathered
FP8 input that the weight-gradient GEMM reads.

FP8 GEMMs have 1-byte operands and a bf16 output, so their HBM traffic is ``b*(m*k + k*n) + 2*b*m*n``
bytes. Memory per GPU (FP8 weight copies, FP8 saved activations) is in :mod:`workload.memory`.

Sources: TE user guide "Using FP8 with Transformer Engine" (recipe, formats, weight caching);
Micikevicius et al. 2022, "FP8 Formats for Deep Learning" (arXiv:2209.05433) for E4M3/E5M2;
Megatron-Core ``transformer_engine.py`` / ``gpt_model.py`` for which layers are TE modules.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Collection
from dataclasses import replace
from typing import TYPE_CHECKING

from workload.fp8.recipe import DEFAULT_RECIPE, Fp8Recipe, QuantKernel, get_recipe

if TYPE_CHECKING:  # torch is imported where it is used, so the builder can import the constants cheaply
    from torch import nn

    from workload.trace import OpGraph, OpRecord

FP8_FORMAT = "hybrid"
"""TE's recipe: E4M3 forward (activations, weights), E5M2 backward (gradients)."""

FP8_WEIGHT_COPY_BYTES = 2
"""Bytes per FP8-GEMM weight element that TE keeps beside the bf16 parameter: the cached E4M3 weight
(1) and its transpose (1) that Hopper's dgrad GEMM needs (TE "handling transposes"; TE PR #1596
ensures the weight's columnwise copy is kept for backward)."""


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


def _kernel_op(k: QuantKernel, index: int, elems: int, o: OpRecord, deps: set[int]) -> OpRecord:
    from workload.trace import OpRecord
    outs = ((elems,),) * k.copies if k.copies else ((1,),)
    return OpRecord(index=index, name=k.name, kind=k.kind, phase=o.phase, layer=o.layer, part=o.part,
                    block=o.block, flops=0.0, kernel_flops=0.0, bytes_accessed=float(k.bytes_per_element * elems),
                    dtype="bf16", shape=(), in_shapes=((elems,),), out_shapes=outs, deps=tuple(sorted(deps)))


def _amax_all_reduce(index: int, o: OpRecord, dep: int) -> OpRecord:
    """A 4-byte fp32 all-reduce (MAX) of a shard's amax over the TP group, as a traced collective."""
    from workload.parallel.tp import COLLECTIVE_PREFIX
    from workload.trace import OpRecord
    return OpRecord(index=index, name=f"{COLLECTIVE_PREFIX}all_reduce", kind="other", phase=o.phase,
                    layer=o.layer, part=o.part, block=o.block, flops=0.0, kernel_flops=0.0, bytes_accessed=8.0,
                    dtype="fp32", shape=(), in_shapes=((1,),), out_shapes=((1,),), deps=(dep,))


def to_fp8(graph: OpGraph, modules: Collection[str], recipe: str = DEFAULT_RECIPE, *,
           fp8_gather: bool = False) -> OpGraph:
    """The op graph of an FP8 training step under ``recipe``, from the bf16 trace of the same model.

    GEMMs of the blocks' FP8 ``modules`` (paths relative to a block, see :func:`fp8_modules`) get dtype
    ``fp8``, FP8 operand bytes and the recipe's :attr:`~workload.trace.OpRecord.fp8_scaling`; the recipe's
    activation kernels are inserted before each forward FP8 GEMM (its input, ``b*m*k`` elements) and its
    gradient kernels before the first backward GEMM of each FP8 module (its output gradient: the elements
    of the module's forward outputs). The kernels are memory-bound, with no model FLOPs.

    ``fp8_gather``: a tensor-parallel all-gather whose output is such a quantised operand moves FP8 (dtype
    ``fp8``, 1 byte per element) and the kernels run before it on the local shard (its input); a recipe
    with :attr:`~workload.fp8.recipe.Fp8Recipe.shard_amax_all_reduce` all-reduces the shard's amax over
    the TP group after its amax pass. Everything else -- FLOPs, the other ops, blocks and parts -- is
    unchanged; indices and dependencies are renumbered.

    Raises:
        ValueError: no GEMM of the graph belongs to ``modules`` (nothing would run in FP8), or an unknown
            recipe.
    """
    from workload.trace import OpGraph

    rw = _Rewrite(graph, set(modules), get_recipe(recipe), fp8_gather)
    for o in graph.ops:
        rw.visit(o)
    out = OpGraph(ops=rw.ops, num_blocks=graph.num_blocks, block_attr=graph.block_attr, info=dict(graph.info))
    out.info.update(dtype="fp8", fp8_format=FP8_FORMAT, fp8_modules=sorted(modules))
    if recipe != DEFAULT_RECIPE:  # the delayed recipe's graph info stays as it was
        out.info["fp8_recipe"] = recipe
    return out


class _Rewrite:
    """The state of :func:`to_fp8`'s one pass: new ops, the old -> new index map, the kernels placed."""

    def __init__(self, graph: OpGraph, wanted: set[str], recipe: Fp8Recipe, fp8_gather: bool) -> None:
        self.attr, self.wanted, self.rcp = graph.block_attr, wanted, recipe
        self.ops: list[OpRecord] = []
        self.remap: dict[int, int] = {}
        self.cast_idx: dict[int, int] = {}  # GEMM index -> its last quantisation kernel (new index)
        self.bwd_cast: dict[str, int] = {}  # module path -> its backward quantisation (new index)
        self.by_index = {o.index: o for o in graph.ops}
        self.cast_of = self._operands(graph)
        self.gather_for = self._gathers() if fp8_gather else {}

    def is_fp8(self, o: OpRecord) -> bool:
        if o.kind != "gemm" or o.part != "block" or o.block is None or len(o.shape) != 4:
            return False
        prefix = f"{self.attr}.{o.block}."
        return o.layer.startswith(prefix) and o.layer[len(prefix):] in self.wanted

    def _operands(self, graph: OpGraph) -> dict[int, tuple[int, tuple[QuantKernel, ...]]]:
        """GEMM index -> (elements, kernels) of the operand it quantises: each forward GEMM's input, each
        module's first backward GEMM's output gradient."""
        out_elems: dict[str, int] = defaultdict(int)
        for o in graph.ops:
            if o.phase == "fwd" and self.is_fp8(o):
                b, m, n, _ = o.shape
                out_elems[o.layer] += b * m * n
        if not out_elems:
            raise ValueError(f"FP8 training: no GEMM of the traced model belongs to an FP8 module "
                             f"({', '.join(sorted(self.wanted)) or 'none found'})")
        cast_of: dict[int, tuple[int, tuple[QuantKernel, ...]]] = {}
        seen_bwd: set[str] = set()
        for o in graph.ops:
            if self.is_fp8(o) and o.phase == "fwd":
                cast_of[o.index] = (o.shape[0] * o.shape[1] * o.shape[3], self.rcp.activation)
            elif self.is_fp8(o) and o.phase == "bwd" and o.layer not in seen_bwd:
                seen_bwd.add(o.layer)
                cast_of[o.index] = (out_elems[o.layer], self.rcp.gradient)
        return cast_of

    def _gathers(self) -> dict[int, int]:
        """All-gather index -> the quantising GEMM that reads it, when it gathers exactly that operand."""
        from workload.parallel.tp import COLLECTIVE_PREFIX
        out = {}
        for gi, (elems, _) in self.cast_of.items():
            for d in self.by_index[gi].deps:
                a = self.by_index[d]
                if a.name.startswith(f"{COLLECTIVE_PREFIX}all_gather") and math.prod(a.out_shapes[0]) == elems:
                    out[d] = gi
        return out

    def quantise(self, gemm: OpRecord, elems: int, deps: set[int], *, shard: bool) -> int:
        """Append ``gemm``'s quantisation kernels over ``elems`` elements; returns the last one's index."""
        for k in self.cast_of[gemm.index][1]:
            self.ops.append(_kernel_op(k, len(self.ops), elems, gemm, deps))
            deps = {len(self.ops) - 1}
            if shard and self.rcp.shard_amax_all_reduce and k.kind == "reduction":
                self.ops.append(_amax_all_reduce(len(self.ops), gemm, len(self.ops) - 1))
                deps = {len(self.ops) - 1}
        if gemm.phase == "bwd":
            self.bwd_cast[gemm.layer] = len(self.ops) - 1
        self.cast_idx[gemm.index] = len(self.ops) - 1
        return len(self.ops) - 1

    def visit(self, o: OpRecord) -> None:
        deps = {self.remap[d] for d in o.deps}
        if o.index in self.gather_for:  # quantise the shard, then gather FP8
            gemm = self.by_index[self.gather_for[o.index]]
            deps = {self.quantise(gemm, math.prod(o.in_shapes[0]), deps, shard=True)}
            new = replace(o, index=len(self.ops), dtype="fp8", bytes_accessed=o.bytes_accessed / 2,
                          deps=tuple(sorted(deps)))
        elif self.is_fp8(o):
            if o.index in self.cast_idx:
                deps.add(self.cast_idx[o.index])
            elif o.index in self.cast_of:
                deps.add(self.quantise(o, self.cast_of[o.index][0], set(deps), shard=False))
            if o.phase == "bwd":
                deps.add(self.bwd_cast[o.layer])
            new = replace(o, index=len(self.ops), dtype="fp8", bytes_accessed=fp8_gemm_bytes(o.shape),
                          fp8_scaling=self.rcp.gemm_scaling, deps=tuple(sorted(deps)))
        else:
            new = replace(o, index=len(self.ops), deps=tuple(sorted(deps)))
        self.remap[o.index] = new.index
        self.ops.append(new)


__all__ = ["FP8_FORMAT", "FP8_WEIGHT_COPY_BYTES", "fp8_gemm_bytes", "fp8_modules", "to_fp8"]
