"""``tensorwise``: current (dynamic) per-tensor scaling -- torchao float8 ``recipe_name = "tensorwise"``
(torchtitan's default float8 recipe), Transformer Engine ``Float8CurrentScaling`` (Megatron-Core
``--fp8-recipe tensorwise``).

The scale comes from this tensor's own amax, so an amax reduction reads the bf16 tensor before the cast
(2 bytes per element), then the cast writes the FP8 tensor and its transpose (4): torchao's roofline model
of its kernels, ``benchmarks/float8/utils/roofline_utils.py`` (``get_tensor_memory_traffic_ovhd_s``,
tensorwise: "kernel 1: x_bf16 -> max_abs_stage_1", "kernel 3: read in bf16, write twice in float8 (row-major
and col-major)"; the tiny second amax stage is not modelled). Weights take the same two kernels, once per
iteration (TE's weight caching; torchao re-casts every forward, as under ZeRO-3 here).

Communication: the sequence-parallel all-gather feeding an FP8 GEMM moves FP8, the cast running on the
local shard first (torchtitan's ``Float8ColwiseParallel``, on by default with tensorwise TP; TE quantises
before its sequence-parallel gather), which needs the global amax: a 4-byte all-reduce over the TP group
(TE's ``amax_reduction_group``; torchao's DTensor amax). FP8 parameter all-gathers
(``fp8_param_gather``: torchtitan ``enable_fsdp_float8_all_gather``) add one all-reduce of all the
weights' amaxes per iteration over the data-parallel group (``precompute_float8_dynamic_scale_for_fsdp``).
GEMMs are cuBLAS' per-tensor FP8 GEMM.
"""

from __future__ import annotations

from workload.fp8.recipe import Fp8Recipe, QuantKernel

AMAX_BYTES = 2
"""An amax pass reads the bf16 tensor once and writes a scalar (B per element)."""


def _current(what: str, fmt: str) -> tuple[QuantKernel, ...]:
    return (QuantKernel(f"fp8.amax_{what}", "reduction", AMAX_BYTES, 0),
            QuantKernel(f"fp8.cast_transpose_{fmt}_{what}", "elementwise", 2 + 1 + 1, 2))


TENSORWISE = Fp8Recipe(
    name="tensorwise",
    summary="current per-tensor scaling: torchao float8 tensorwise, TE Float8CurrentScaling",
    activation=_current("input", "e4m3"), gradient=_current("grad_output", "e5m2"),
    weight=_current("weight", "e4m3"),
    tp_gather="always", shard_amax_all_reduce=True, param_gather=True)
