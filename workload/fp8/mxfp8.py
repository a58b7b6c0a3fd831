"""``mxfp8``: MX block scaling, Transformer Engine ``MXFP8BlockScaling`` (Megatron-Core ``--fp8-recipe
mxfp8``), Blackwell only.

Every 1x32 block of elements shares one E8M0 (power-of-two, 1-byte) scale, computed in the quantisation
kernel itself (a block fits in registers: no amax pass, no history). Blackwell's tensor cores read the
operand along both GEMM axes with blocks along the reduction dimension, so TE's quantiser writes a rowwise
and a columnwise copy, each with its scales, in one kernel: read bf16 (2 bytes per element), write
2 x (1 + 1/32) -- :data:`MXFP8_QUANTIZE_BYTES`. E4M3 for all tensors (TE's MXFP8 default).

GEMMs are cuBLAS' block-scaled FP8 GEMM at the Blackwell FP8 tensor-core rate (``fp8_gemm_time_factor``
has no ``mxfp8`` entry: factor 1). Hopper and Ampere have no block-scaled MMA: refused. Sequence-parallel
all-gathers move MXFP8 data (its 1/32 scale bytes not counted there); FP8 parameter all-gathers
(``fp8_param_gather``) are not modelled for MXFP8 and refused.
"""

from __future__ import annotations

from workload.fp8.recipe import Fp8Recipe, QuantKernel

MX_BLOCK = 32
"""Elements sharing one E8M0 scale (OCP Microscaling Formats v1.0, MXFP8)."""
MXFP8_QUANTIZE_BYTES = 2 + 2 * (1 + 1 / MX_BLOCK)
"""HBM bytes per element of TE's MXFP8 quantiser: read bf16, write the rowwise and columnwise copies
with one scale byte per 32 elements each (4.0625)."""


def _mx(what: str) -> tuple[QuantKernel, ...]:
    return (QuantKernel(f"te.quantize_mxfp8_{what}", "elementwise", MXFP8_QUANTIZE_BYTES, 2),)


MXFP8 = Fp8Recipe(
    name="mxfp8",
    summary="Transformer Engine MXFP8BlockScaling, Megatron-Core --fp8-recipe mxfp8",
    activation=_mx("input"), gradient=_mx("grad_output"), weight=_mx("weight"),
    gemm_scaling="mxfp8", architectures=("blackwell",), tp_gather="always")
