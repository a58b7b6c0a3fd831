"""``delayed``: Transformer Engine's delayed scaling, hybrid format (Megatron-Core ``--fp8-recipe delayed``,
the default; TE ``DelayedScaling(fp8_format=Format.HYBRID)``).

One scale per tensor from the amax history of earlier iterations, so no amax pass precedes the cast: one
fused *cast-transpose* kernel per operand reads the bf16 tensor and writes the FP8 tensor and its
transpose (Hopper's FP8 tensor cores take only the "TN" layout, TE docs "Performance considerations:
handling transposes"), recording the amax as it goes: :data:`CAST_TRANSPOSE_BYTES` per element. E4M3
forward, E5M2 gradients. Not modelled: the per-micro-batch amax all-reduce and the per-iteration scale
update (a few kB, latency-bound); the sequence-parallel all-gathers move bf16 except under
``tp_comm_overlap`` / ``async_tp`` (TE's userbuffers gather the FP8 shard: ``tp_gather = "overlap"``,
so runs without overlap keep their earlier figures).
"""

from __future__ import annotations

from workload.fp8.recipe import Fp8Recipe, QuantKernel

CAST_TRANSPOSE_BYTES = 2 + 1 + 1
"""HBM bytes per element of one TE cast-transpose kernel: read bf16 (2), write the FP8 tensor (1) and
its transpose (1)."""
CAST_FWD_NAME = "te.cast_transpose_fp8_e4m3"
"""Kernel name of the forward input quantisation."""
CAST_BWD_NAME = "te.cast_transpose_fp8_e5m2"
"""Kernel name of the backward output-gradient quantisation."""
CAST_WEIGHT_NAME = "te.cast_transpose_fp8_weights"
"""Kernel name of the weight quantisation (once per iteration per layer)."""

DELAYED = Fp8Recipe(
    name="delayed",
    summary="Transformer Engine DelayedScaling, Megatron-Core --fp8-recipe delayed",
    activation=(QuantKernel(CAST_FWD_NAME, "elementwise", CAST_TRANSPOSE_BYTES, 2),),
    gradient=(QuantKernel(CAST_BWD_NAME, "elementwise", CAST_TRANSPOSE_BYTES, 2),),
    weight=(QuantKernel(CAST_WEIGHT_NAME, "elementwise", CAST_TRANSPOSE_BYTES, 2),),
    tp_gather="overlap", param_gather=True)
