"""``[training] compile = true``: torch.compile's fusion of pointwise chains, as a rewrite of the op graph.

TorchInductor fuses consecutive pointwise (and concatenation/copy) ops into one generated Triton kernel
that reads the chain's inputs and writes its outputs once; intermediates stay in registers (PyTorch 2
paper, Ansel et al. ASPLOS'24 §4.3 "fusion"; torchtitan compiles each transformer block). Here a *chain*
is a maximal run of consecutive ``aten`` ops of kind ``elementwise`` or ``copy`` with the same phase and
module path (so selective recomputation, which picks the attention core's ops by module, sees the same
ops fused); library kernels (GEMMs, attention, the ``trainsim::`` RMSNorm and dropout, Transformer
Engine's FP8 casts) are not compiled and break chains.

The fused kernel's bytes are the chain's unfused bytes less the traffic of its intermediates: each read
of an op's output by a later op of the chain, and the op's write when nothing outside the chain (a later
kernel, a backward op reading a saved tensor) reads it. Output sizes come from the traced shapes in the
op's dtype. FLOPs and dependencies are the chain's (external producers only). Not modelled: inductor's
fusion of reductions (norms, softmax) into their neighbours, its memory planning (fewer saved
intermediates), CUDA graphs, and compile-time cost.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import replace

from hwmodel.dtypes import ELEMENT_BYTES

FUSABLE_KINDS = ("elementwise", "copy")
"""Kernel kinds inductor fuses into one pointwise kernel."""
FUSED_NAME = "triton_fused_pointwise"
"""Name of a fused kernel (inductor names its kernels ``triton_poi_fused_<ops>``)."""


def _fusable(o) -> bool:
    return o.kind in FUSABLE_KINDS and o.name.startswith("aten.")


def _out_bytes(o) -> float:
    if not o.out_shapes:
        return 0.0
    return float(math.prod(o.out_shapes[0])) * ELEMENT_BYTES.get(o.dtype, 2)


def _chains(ops) -> list[list]:
    """Consecutive fusable ops of one phase and module path, in issue order."""
    chains: list[list] = []
    for o in ops:
        last = chains[-1] if chains else None
        if (last and _fusable(o) and _fusable(last[-1]) and o.phase == last[-1].phase
                and o.layer == last[-1].layer and o.part == last[-1].part and o.block == last[-1].block):
            last.append(o)
        else:
            chains.append([o])
    return chains


def fuse_pointwise(graph):
    """The op graph with every chain of two or more pointwise ops replaced by one fused kernel.

    Args:
        graph: a :class:`workload.trace.OpGraph`.

    Returns:
        A new ``OpGraph`` (indices and dependencies renumbered; everything but the chains unchanged).
    """
    from workload.trace import OpGraph

    consumers: dict[int, list[int]] = defaultdict(list)
    for o in graph.ops:
        for d in o.deps:
            consumers[d].append(o.index)
    ops: list = []
    remap: dict[int, int] = {}
    for chain in _chains(graph.ops):
        idx = len(ops)
        members = {o.index for o in chain}
        deps = sorted({remap[d] for o in chain for d in o.deps if d not in members})
        if len(chain) == 1:
            new = replace(chain[0], index=idx, deps=tuple(deps))
        else:
            saved = 0.0
            for o in chain:
                inside = [c for c in consumers[o.index] if c in members]
                outside = len(consumers[o.index]) - len(inside)
                out = _out_bytes(o)
                saved += out * len(inside) + (out if inside and not outside else 0.0)
            first, last = chain[0], chain[-1]
            new = replace(first, index=idx, name=FUSED_NAME, kind="elementwise",
                          flops=sum(o.flops for o in chain), kernel_flops=sum(o.kernel_flops for o in chain),
                          bytes_accessed=max(sum(o.bytes_accessed for o in chain) - saved, _out_bytes(last)),
                          out_shapes=last.out_shapes, deps=tuple(deps))
        for o in chain:
            remap[o.index] = idx
        ops.append(new)
    out = OpGraph(ops=ops, num_blocks=graph.num_blocks, block_attr=graph.block_attr, info=dict(graph.info))
    out.info.update(compiled=True)
    return out


__all__ = ["FUSABLE_KINDS", "FUSED_NAME", "fuse_pointwise"]
