"""PyTorch FSDP2 (``fully_shard``, ``fsdp = true``: the stack torchtitan runs) as kernels around its
collectives, and ZeRO-3's gathers and reductions for the builder.

ZeRO-3 (``zero_stage = 3``) and FSDP share the collectives: one all-gather of a unit's parameters before
its forward and its backward, one reduce-scatter of its gradients after its backward
(:class:`workload.parallel.builder.RankBuilder` decides when). FSDP2 adds the copies that move tensors
between its flat communication buffers and the per-parameter tensors
(``torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py``, PyTorch 2.5-2.7):

* *all-gather copy-in* (``foreach_all_gather``, on the all-gather stream): the fp32 sharded parameters
  cast to ``param_dtype`` (``MixedPrecisionPolicy``; torchtitan: bf16) and copied into the all-gather
  input (``torch.ops.fsdp.all_gather_copy_in``): read 4 B, write and read the training dtype, write it
  into the buffer, per element of this rank's shard;
* *all-gather copy-out* (``foreach_all_gather_copy_out`` in ``wait_for_unshard``, on the compute stream
  before the unit's pass): ``split_with_sizes_copy`` of the whole gathered buffer into the unsharded
  parameters: read and write the gathered bytes (the training dtype; FP8 bytes with FP8 all-gathers);
* *reduce-scatter copy-in* (``foreach_reduce``, on the reduce-scatter stream): the unsharded gradients
  (training dtype) cast to ``reduce_dtype`` (torchtitan's ``mixed_precision_reduce = "float32"``) and
  chunk-concatenated into the reduce-scatter input (``torch._chunk_cat``): read the training dtype,
  write fp32, per element of the unit (one pass; a separate cast would add another fp32 round trip).

The optimizer step is PyTorch's ``AdamW(foreach=True)`` (torchtitan's default, ``optimizer.fused =
false``) on the fp32 shards, after ``clip_grad_norm_`` (torchtitan's ``max_norm = 1.0``):
:data:`FOREACH_ADAMW_PASSES`. No master-weight copy (the fp32 shards are the parameters; the cast to bf16
is the all-gather copy-in) and no gradient zeroing kernel (``zero_grad(set_to_none=True)``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hwmodel.ir import Collective, Compute
from workload.parallel.optimizer import optimizer_kernel

if TYPE_CHECKING:  # the builder imports this module
    from workload.parallel.builder import RankBuilder

MASTER_BYTES = 4
"""Bytes per element of FSDP2's sharded parameters (fp32, the optimizer's parameters)."""

FOREACH_ADAMW_PASSES = (
    ("clip_grad_norm", 4),  # torch._foreach_norm over the fp32 gradients (read)
    ("clip_grad_scale", 8),  # torch._foreach_mul_(grads, clip_coef_clamped): read, write
    ("adamw_weight_decay", 8),  # _foreach_mul_(params, 1 - lr * weight_decay)
    ("adamw_lerp_exp_avg", 12),  # _foreach_lerp_(exp_avgs, grads, 1 - beta1): read 2, write 1
    ("adamw_scale_exp_avg_sq", 8),  # _foreach_mul_(exp_avg_sqs, beta2)
    ("adamw_addcmul_exp_avg_sq", 12),  # _foreach_addcmul_(exp_avg_sqs, grads, grads, 1 - beta2)
    ("adamw_sqrt", 8),  # _foreach_sqrt(exp_avg_sqs)
    ("adamw_div_bias_correction", 8),  # _foreach_div_(denom, bias_correction2_sqrt)
    ("adamw_add_eps", 8),  # _foreach_add_(denom, eps)
    ("adamw_addcdiv", 16),  # _foreach_addcdiv_(params, exp_avgs, denom, step_size): read 3, write 1
)
"""(kernel, fp32 bytes per parameter) of one step: ``clip_grad_norm_`` and ``_multi_tensor_adamw``
(``torch/optim/adamw.py`` / ``adam.py``, PyTorch 2.5-2.7, ``capturable = False``: the bias corrections
are host scalars), each pass over this rank's fp32 shard."""


def unshard(rb: RankBuilder, gather: Collective, shard_elements: float, layer: str, phase: str,
            after: int | None, *, copy_in: bool = True) -> int:
    """Add a unit's parameter all-gather (``gather``) on ``fsdp_ag`` after ``after``, with FSDP2's
    copy-in before it (unless ``copy_in`` is false: FP8 all-gathers cast on their own) and its copy-out
    on the compute stream; returns the task the unit's pass waits for. Plain ZeRO-3 (not ``fsdp``): the
    collective alone."""
    if not rb.cfg.fsdp:
        return rb.add(gather, "fsdp_ag", (after,))
    eb = _elem_bytes(rb)
    if copy_in:
        cast = (MASTER_BYTES + eb) if eb != MASTER_BYTES else 0
        after = rb.add(Compute("fsdp_all_gather_copy_in", "copy", 0.0, shard_elements * (cast + 2 * eb),
                               dtype=rb.t.dtype, layer=layer, phase=phase), "fsdp_ag", (after,))
    ag = rb.add(gather, "fsdp_ag", (after,))
    return rb.add(Compute("fsdp_all_gather_copy_out", "copy", 0.0, 2 * gather.size_bytes, dtype=rb.t.dtype,
                          layer=layer, phase=phase), "compute", (ag,))


def reduce(rb: RankBuilder, key, n: int, after: int | None) -> None:
    """ZeRO-3/FSDP reduce-scatter of a unit's gradients (``n`` elements; the full gradient in, 1/dp
    out; nccl-tests' S is the full buffer), after FSDP2's copy-in under ``fsdp``."""
    if n <= 0:
        return
    name = f"fsdp_rs_L{key}" if isinstance(key, int) else f"fsdp_rs_{key}"
    if rb.cfg.fsdp:
        layer = f"layers.{key}" if isinstance(key, int) else str(key)
        after = rb.add(Compute("fsdp_reduce_scatter_copy_in", "copy", 0.0, n * (_elem_bytes(rb) + rb.grad_bytes),
                               dtype=rb.grad_dtype, layer=layer, phase="bwd"), "fsdp_rs", (after,))
    rb.add(Collective("reduce_scatter", n * rb.grad_bytes, rb.groups["dp"], dtype=rb.grad_dtype, name=name),
           "fsdp_rs", (after,))


def optimizer_kernels(shards: list[tuple[float, str]]) -> list[Compute]:
    """The optimizer step's kernels over ``shards`` ((fp32 parameters, layer) per unit), pass by pass
    as ``foreach`` runs them (each ``_foreach_*`` op over every tensor before the next)."""
    return [optimizer_kernel(name, n * b, layer) for name, b in FOREACH_ADAMW_PASSES for n, layer in shards]


def _elem_bytes(rb: RankBuilder) -> int:
    from workload.parallel.builder import ELEM_BYTES

    return ELEM_BYTES.get(rb.t.dtype, 2)


__all__ = ["FOREACH_ADAMW_PASSES", "MASTER_BYTES", "optimizer_kernels", "reduce", "unshard"]
