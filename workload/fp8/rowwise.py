"""``rowwise``: torchao float8 ``recipe_name = "rowwise"`` (torchtitan ``--float8.recipe_name rowwise``).

One scale per row of each GEMM operand (per token of ``X`` and ``dY``, per output/input feature of ``W``),
so each operand is quantised twice, once along each axis (the two GEMMs that read it scale it along
different axes). The kernels follow torchao's roofline model (``benchmarks/float8/utils/roofline_utils.py``,
``get_tensor_memory_traffic_ovhd_s``, rowwise, no fusion with the previous op): activations and
gradients: "x_bf16_dim0 -> x_float8_dim0, x_bf16_dim1" (read 2, write 1 + 2 bytes per element) then
"x_bf16_dim1 -> x_float8_dim1" (read 2, write 1); weights: cast (2 + 1), transpose the bf16 weight
(2 + 2), cast the transpose (2 + 1). Per-row fp32 scales (4 bytes per row) are not counted (under 0.1 %
of the traffic at hidden sizes of 4096 and up).

GEMMs are the CUTLASS row-wise scaled GEMM of ``torch._scaled_mm`` (cuBLAS has no row-wise scaling on
Hopper), slower than cuBLAS' per-tensor kernel by the calibration's ``fp8_gemm_time_factor.rowwise``.
Communication stays bf16: torchtitan uses float8 TP all-gathers only with tensorwise ("For rowwise recipes,
we use regular TP and all-gather happens in high precision", ``parallelize.py``), and torchao refuses FP8
parameter all-gathers for it ("enable_fsdp_float8_all_gather only supports tensorwise scaling
granularity", ``Float8LinearConfig``). Memory is bf16 training's: torchao's ``Float8Linear`` saves the
bf16 input and weight for backward (``matmul_with_hp_or_float8_args``) and keeps no FP8 weight copy.
"""

from __future__ import annotations

from workload.fp8.recipe import Fp8Recipe, QuantKernel


def _axiswise(what: str) -> tuple[QuantKernel, ...]:
    return (QuantKernel(f"fp8.rowwise_cast_dim0_{what}", "elementwise", 2 + 1 + 2, 1),
            QuantKernel(f"fp8.rowwise_cast_dim1_{what}", "elementwise", 2 + 1, 1))


ROWWISE = Fp8Recipe(
    name="rowwise",
    summary="torchao float8 rowwise (per-row scales, CUTLASS row-wise scaled GEMM)",
    activation=_axiswise("input"), gradient=_axiswise("grad_output"),
    weight=(QuantKernel("fp8.rowwise_cast_dim0_weight", "elementwise", 2 + 1, 1),
            QuantKernel("fp8.rowwise_transpose_weight", "copy", 2 + 2, 0),
            QuantKernel("fp8.rowwise_cast_dim1_weight", "elementwise", 2 + 1, 1)),
    gemm_scaling="rowwise", tp_gather="never", fp8_saved_state=False)
