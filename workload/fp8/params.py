"""FP8 parameter all-gathers: ``[training] fp8_param_gather`` (Megatron-Core ``--fp8-param-gather``,
torchtitan ``enable_fsdp_float8_all_gather``).

With the distributed optimizer (ZeRO-1/2) or ZeRO-3/FSDP the updated parameters are all-gathered before
use. With this flag the FP8-GEMM weights travel in FP8, 1 byte per element instead of bf16's 2 (per-tensor
scales are not gathered: every rank derives the same scale from the all-reduced amax), the other
parameters (norms, embedding, head, biases) in bf16; the collective moves a ``uint8`` buffer, as both
frameworks do. The cast then happens on the shard, before the gather:

- ZeRO-3/FSDP (torchao's float8 all-gather, ``fsdp_pre_all_gather``): the recipe's weight kernels over
  the local 1/dp shard, on the all-gather stream before each gather; after a backward gather, a transpose
  of the gathered FP8 weight (read 1, write 1 byte per element) for the dgrad GEMM, instead of the cast
  of the whole bf16 weight after every gather. Per-tensor current scaling all-reduces the weights' amaxes
  over the data-parallel group once per iteration (``precompute_float8_dynamic_scale_for_fsdp``: one
  all-reduce of 4 bytes per FP8 weight). Memory keeps the bf16 sharded parameter (torchao's
  ``WeightWithDynamicFloat8CastTensor`` wraps it), so the per-GPU figures do not change.
- Distributed optimizer (Megatron-Core): the model's FP8 weights *are* its parameters (TE ``Float8Tensor``,
  1 byte) and the optimizer writes the updated fp32 master shard straight into them (TE
  ``cast_master_weights_to_fp8``); a layer's first forward only transposes the gathered FP8 weight (read
  1, write 1) instead of the cast-transpose of a bf16 weight. Memory: the bf16 copy of the FP8-GEMM
  weights is gone (1 byte instead of 2) and the FP8 copy TE kept beside it shrinks to the transpose (1
  byte instead of 2) -- :func:`with_fp8_params`. Not modelled: the optimizer's copy writing 1 byte
  instead of 2 for those weights.

Recipes: ``delayed`` and ``tensorwise`` (per-tensor scales, whose FP8 transpose is exact); ``rowwise`` is
refused (torchao: "enable_fsdp_float8_all_gather only supports tensorwise scaling granularity"), ``mxfp8``
too (its columnwise copy cannot be derived from the gathered rowwise one; not modelled).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from hwmodel.ir import Collective, Compute
from workload.fp8.recipe import get_recipe

FP8_TRANSPOSE_NAME = "fp8.transpose_weights"
"""Kernel name of the transpose of a gathered FP8 weight."""
FP8_TRANSPOSE_BYTES = 1 + 1
"""Read the FP8 weight, write its transpose (B per element)."""
GATHER_DTYPE = "uint8"
"""Dtype of an FP8 parameter all-gather (a byte buffer, as Megatron's and FSDP2's)."""


def check_param_gather(recipe: str, dtype: str, zero_stage: int) -> None:
    """Whether ``fp8_param_gather`` applies.

    Raises:
        ValueError: one line naming the key: not ``dtype = "fp8"``, no sharded-parameter gather
            (``zero_stage`` 0: no distributed optimizer, ZeRO or FSDP), or a recipe without FP8 parameter
            gathers.
    """
    if dtype != "fp8":
        raise ValueError(f"[training] fp8_param_gather all-gathers FP8 weights; it needs dtype = 'fp8', got {dtype!r}")
    if zero_stage == 0:
        raise ValueError("[training] fp8_param_gather changes the parameter all-gather of the distributed optimizer "
                         "or ZeRO-3/FSDP; this run gathers no parameters (set [parallel] "
                         "use_distributed_optimizer, zero_stage or fsdp)")
    if not get_recipe(recipe).param_gather:
        have = ", ".join(n for n in ("delayed", "tensorwise") if get_recipe(n).param_gather)
        raise ValueError(f"[training] fp8_param_gather is not available with fp8_recipe {recipe!r} "
                         f"(per-tensor scaled recipes only: {have})")


def param_gather_bytes(elements: int, fp8_elements: int, elem_bytes: int, recipe: str) -> int:
    """Bytes of an all-gather of ``elements`` parameters of which ``fp8_elements`` travel in FP8
    (the rest in ``elem_bytes``, the training dtype's)."""
    per = get_recipe(recipe).gather_bytes_per_element
    return int((elements - fp8_elements) * elem_bytes + fp8_elements * per)


def layer_weight_kernels(trace: Any, layer: int, phase: str, *, zero3: bool) -> list[Compute]:
    """The kernels before a layer's FP8 GEMMs on the compute stream, when the weights are prepared
    (``trace``: a :class:`workload.parallel.builder.ModelTrace`): the recipe's weight kernels over the
    layer's FP8 weights; with ``fp8_param_gather`` a transpose of the gathered FP8 weight (none on a
    ZeRO-3 forward, whose GEMM reads the gathered weight as it is)."""
    n = trace.fp8_params_block
    if not n:
        return []
    name = f"layers.{layer}"
    if not trace.fp8_param_gather:
        return get_recipe(trace.fp8_recipe).kernels("weight", n, layer=name, phase=phase)
    if zero3 and phase == "fwd":
        return []
    return [Compute(FP8_TRANSPOSE_NAME, "copy", 0.0, float(FP8_TRANSPOSE_BYTES * n), dtype="bf16", layer=name,
                    phase=phase)]


def shard_casts(rb: Any, layer: int, phase: str, after: int | None) -> int | None:
    """ZeRO-3/FSDP with ``fp8_param_gather``: the recipe's weight kernels over this rank's shard of layer
    ``layer``, on the all-gather stream (``rb``: a :class:`workload.parallel.builder.RankBuilder`). Returns
    the last task, which the gather waits for (``after`` when there is nothing to cast)."""
    t = rb.t
    if not (t.fp8_param_gather and t.fp8_params_block):
        return after
    n = t.fp8_params_block // len(rb.groups["dp"])
    for k in get_recipe(t.fp8_recipe).kernels("weight", n, layer=f"layers.{layer}", phase=phase):
        after = rb.add(k, "fsdp_ag", (after,))
    return after


def amax_all_reduce(rb: Any, layers: int, stream: str) -> None:
    """Per-tensor current scaling with ``fp8_param_gather``: one all-reduce of the FP8 weights' amaxes (4
    bytes each, fp32 MAX) over the data-parallel group per iteration, after the optimizer step."""
    t = rb.t
    if not (t.fp8_param_gather and get_recipe(t.fp8_recipe).shard_amax_all_reduce) or len(rb.groups["dp"]) == 1:
        return
    tensors = len(t.graph.info.get("fp8_modules", ())) * layers
    if tensors:
        rb.add(Collective("all_reduce", 4 * tensors, rb.groups["dp"], dtype="fp32", name="fp8_weight_amax"),
               stream, (rb.last_compute,))


def with_fp8_params(mem: Any, zero_stage: int) -> Any:
    """A :class:`workload.memory.MemoryBreakdown` with Megatron's FP8 parameters (distributed optimizer,
    ``zero_stage`` 1 or 2): the FP8-GEMM weights held in 1 byte instead of bf16's 2, the FP8 copy beside
    them reduced to the transpose. Unchanged under ZeRO-3/FSDP (module docstring)."""
    if zero_stage >= 3 or not mem.fp8_weights:
        return mem
    from workload.fp8.rewrite import FP8_WEIGHT_COPY_BYTES
    n = mem.fp8_weights / FP8_WEIGHT_COPY_BYTES  # FP8-GEMM weight elements on this GPU
    return replace(mem, parameters=mem.parameters - n, fp8_weights=n * 1.0)  # 2 -> 1 B; copies: the transpose


__all__ = ["FP8_TRANSPOSE_BYTES", "FP8_TRANSPOSE_NAME", "GATHER_DTYPE", "amax_all_reduce", "check_param_gather",
           "layer_weight_kernels", "param_gather_bytes", "shard_casts", "with_fp8_params"]
