"""The screen's price of PyTorch FSDP2's own kernels (``fsdp = true``, every ZeRO-3 plan the search makes
but DeepSpeed's): the copies around its collectives and its optimizer step, no SimPy.

The kernels are :mod:`workload.parallel.fsdp2`'s, reused rather than re-modelled, and priced by the same
cost model as the rest of the screen (solo times):

* per unit gathered, the all-gather copy-out on the compute stream (``split_with_sizes_copy`` of the
  gathered buffer: read and write its bytes) -- before the unit's forward and its backward;
* per unit reduced, the reduce-scatter copy-in on the compute stream (``torch._chunk_cat`` widening the
  gradients to fp32: read the training dtype, write the reduce dtype) -- after its backward;
* the optimizer step as ``clip_grad_norm_`` and ``AdamW(foreach=True)`` run it
  (:data:`workload.parallel.fsdp2.FOREACH_ADAMW_PASSES`, fp32 bytes per parameter per pass), instead of
  Megatron's fused Adam.

The all-gather copy-in runs on the all-gather stream before its collective, so it is not on the compute
stream's path (prefetched behind the previous unit), as the collectives' own times are in the screen's
FSDP pass.
"""

from __future__ import annotations

from typing import Any

from hwmodel.ir import Compute
from workload.parallel.fsdp2 import FOREACH_ADAMW_PASSES
from workload.parallel.optimizer import optimizer_kernel

__all__ = ["fsdp_copies_s", "foreach_adamw_s"]


def _copy_s(ctx: Any, name: str, nbytes: float) -> float:
    key = ("fsdp_copy", name, nbytes)
    hit = ctx._opt.get(key)
    if hit is None:
        k = Compute(name, "copy", 0.0, float(nbytes), dtype=ctx.dtype if ctx.dtype != "fp8" else "bf16")
        hit = ctx._opt[key] = ctx.cost_model.cost(k).solo_time_s if nbytes > 0 else 0.0
    return hit


def fsdp_copies_s(ctx: Any, units: list[tuple[float, float]], phase: str) -> float:
    """FSDP2's compute-stream copies in one pass over ``units`` ((elements gathered, elements reduced) of
    each unit on this rank, before sharding over data parallelism), in seconds: a copy-out per unit
    gathered, and in the backward a reduce-scatter copy-in per unit reduced (``ctx``: the screen's
    :class:`~scenarios.search.screen.ScreenContext`, whose ``eb`` and ``grad_bytes`` are the training and
    gradient-reduction element sizes)."""
    total = sum(_copy_s(ctx, "fsdp_all_gather_copy_out", 2 * n * ctx.eb) for n, _ in units)
    if phase == "bwd":
        total += sum(_copy_s(ctx, "fsdp_reduce_scatter_copy_in", n * (ctx.eb + ctx.grad_bytes)) for _, n in units)
    return total


def foreach_adamw_s(ctx: Any, params: float) -> float:
    """``clip_grad_norm_`` and foreach AdamW over one unit's ``params`` fp32 shard elements, in seconds (the
    gradient norm's scalar all-reduces are left out: a few microseconds)."""
    key = ("foreach_adamw", params)
    hit = ctx._opt.get(key)
    if hit is None:
        hit = ctx._opt[key] = sum(ctx.cost_model.cost(optimizer_kernel(name, params * b, "")).solo_time_s
                                  for name, b in FOREACH_ADAMW_PASSES) if params > 0 else 0.0
    return hit
