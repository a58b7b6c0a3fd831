"""FP8 training: which GEMMs run in FP8 (:mod:`workload.fp8.rewrite`) and the recipes that quantise their
operands (``[training] fp8_recipe``; :mod:`workload.fp8.recipe`).

Recipes (one module each, registered here):

- ``delayed`` (:mod:`workload.fp8.delayed`): Transformer Engine delayed scaling, hybrid format -- the
  default, Megatron-Core ``--fp8-recipe delayed``;
- ``tensorwise`` (:mod:`workload.fp8.tensorwise`): current per-tensor scaling (torchao float8
  ``tensorwise``, TE ``Float8CurrentScaling``);
- ``rowwise`` (:mod:`workload.fp8.rowwise`): torchao float8 ``rowwise`` (per-row scales, CUTLASS
  row-wise scaled GEMM);
- ``mxfp8`` (:mod:`workload.fp8.mxfp8`): TE ``MXFP8BlockScaling`` (1x32 blocks, E8M0 scales), Blackwell.

``fp8_param_gather`` (Megatron-Core ``--fp8-param-gather``, torchtitan ``enable_fsdp_float8_all_gather``):
:func:`param_gather_bytes` and :func:`with_fp8_params`.
"""

from __future__ import annotations

from workload.fp8.delayed import CAST_BWD_NAME, CAST_FWD_NAME, CAST_TRANSPOSE_BYTES, CAST_WEIGHT_NAME, DELAYED
from workload.fp8.mxfp8 import MXFP8
from workload.fp8.params import check_param_gather, param_gather_bytes, with_fp8_params
from workload.fp8.recipe import (
    DEFAULT_RECIPE,
    RECIPES,
    Fp8Recipe,
    QuantKernel,
    check_recipe_gpu,
    get_recipe,
    register,
)
from workload.fp8.rewrite import FP8_FORMAT, FP8_WEIGHT_COPY_BYTES, fp8_gemm_bytes, fp8_modules, to_fp8
from workload.fp8.rowwise import ROWWISE
from workload.fp8.tensorwise import TENSORWISE

for _recipe in (DELAYED, TENSORWISE, ROWWISE, MXFP8):
    register(_recipe)

__all__ = ["CAST_BWD_NAME", "CAST_FWD_NAME", "CAST_TRANSPOSE_BYTES", "CAST_WEIGHT_NAME", "DEFAULT_RECIPE",
           "FP8_FORMAT", "FP8_WEIGHT_COPY_BYTES", "RECIPES", "Fp8Recipe", "QuantKernel", "check_param_gather",
           "check_recipe_gpu", "fp8_gemm_bytes", "fp8_modules", "get_recipe", "param_gather_bytes", "register",
           "to_fp8", "with_fp8_params"]
