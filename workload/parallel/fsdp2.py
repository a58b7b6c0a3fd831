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
* *reduce-scatter copy-in* (``foreach_reduce``): the unsharded gradients (training dtype) cast to
  ``reduce_dtype`` (torchtitan's ``mixed_precision_reduce = "float32"``) and chunk-concatenated into the
  reduce-scatter input (``torch._chunk_cat``, which widens bf16 to fp32 itself): read the training dtype,
  write fp32, per element of the unit. It runs on the *compute* stream, before the reduce-scatter stream
  waits for it (pytorch/pytorch#129721, PyTorch 2.5 on: the large input is allocated in the default
  stream's memory pool), so it delays the next unit's backward by its own time.

No gradient division kernel: for an fp32 or bf16 ``reduce_dtype`` ``_get_gradient_divide_factors`` returns
no pre/post-divide factors and the reduce-scatter uses NCCL's ``ReduceOp.AVG`` (a pre-multiplied sum in
the same kernel), so ``_div_if_needed`` launches nothing.

*Units as torchtitan wraps them* (``apply_fsdp``, torchtitan 9dec370 and 820504e): ``fully_shard`` on each
transformer block, then on the whole model, whose own unit (the *root*) holds the embedding, the final
norm and the output layer; without pipeline stages every block but the last reshards after forward
(``reshard_after_forward = layer_id < n_layers - 1``: the last block would be prefetched at once for the
backward), and FSDP2 never reshards the root after forward (``_lazy_init`` clears the root's
``post_forward_mesh_info``). So the root is gathered once, before the embedding, kept to the end of the
backward and reduce-scattered there (its post-backward runs in the root's final callback: its forward
input, the token ids, needs no gradient), and the last block is not gathered again for its backward
(:func:`root_elements`, :func:`gathers_for_backward`).

The optimizer step is PyTorch's ``AdamW(foreach=True)`` (torchtitan's default, ``optimizer.fused =
false``) on the fp32 shards, after ``clip_grad_norm_`` (torchtitan's ``max_norm = 1.0``; the DTensor norm
all-reduced, :func:`norm_reduce_axes`):
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
                               dtype=rb.grad_dtype, layer=layer, phase="bwd"), "compute", (after,))
    rb.add(Collective("reduce_scatter", n * rb.grad_bytes, rb.groups["dp"], dtype=rb.grad_dtype, name=name),
           "fsdp_rs", (after,))


def root_unit(rb: RankBuilder) -> bool:
    """Whether the parts outside the blocks form FSDP2's one root unit, kept unsharded from its forward to
    the end of the backward (``fsdp`` without pipeline stages, as torchtitan wraps the model)."""
    return rb.cfg.fsdp and not rb.cfg.fsdp_keeps_unsharded


def root_elements(rb: RankBuilder, part: str, phase: str) -> int:
    """Parameters the "pre" or "post" unit all-gathers before its ``phase``: under :func:`root_unit` the
    whole root (embedding, final norm, output layer; a tied output weight is the embedding's) before the
    forward's "pre" and nothing else; otherwise each part's own (a tied output layer gathers the
    embedding again)."""
    t = rb.t
    if root_unit(rb):
        return t.params_pre + t.params_post if (part, phase) == ("pre", "fwd") else 0
    return t.params_pre if part == "pre" else t.params_post + t.params_post_tied


def root_reduce_elements(rb: RankBuilder, key, n: int) -> int:
    """Gradient elements reduce-scattered after unit ``key``'s backward (``n``: the unit's own): under
    :func:`root_unit` the root's, all after "pre" (the end of the backward), none after "post"."""
    if not root_unit(rb) or key not in ("pre", "post"):
        return n
    return rb.t.params_pre + rb.t.params_post if key == "pre" else 0


def gathers_for_backward(rb: RankBuilder, layer: int) -> bool:
    """Whether block ``layer`` is all-gathered again before its backward: not the model's last block under
    :func:`root_unit` (torchtitan keeps it unsharded after forward)."""
    return not (root_unit(rb) and layer == rb.offsets[-1] - 1)


def norm_reduce_axes(rb: RankBuilder) -> tuple[str, ...]:
    """The mesh dimensions ``clip_grad_norm_`` all-reduces the gradient norm over: the gradients are
    DTensors sharded over FSDP's (and TP's) mesh dimensions, so ``get_total_norm`` returns a
    ``_NormPartial`` DTensor that ``clip_grads_with_norm_`` makes replicated -- one all-reduce of one fp32
    scalar per sharded dimension (torchtitan ``utils.clip_grad_norm_``, 9dec370; torchtitan's extra
    all-reduce over the pipeline mesh is not modelled)."""
    return tuple(axis for axis in ("tp", "dp") if len(rb.groups[axis]) > 1)


def optimizer_kernels(shards: list[tuple[float, str]], norm_axes: tuple[str, ...] = ()) -> list:
    """The optimizer step's kernels over ``shards`` ((fp32 parameters, layer) per unit), pass by pass
    as ``foreach`` runs them (each ``_foreach_*`` op over every tensor before the next), with the
    gradient norm's all-reduces over ``norm_axes`` (:func:`norm_reduce_axes`) between the norm and the
    clipping scale, which waits for the total (on the compute stream, as DTensor issues them)."""
    from workload.parallel.builder import TracedCollective

    items: list = []
    for name, b in FOREACH_ADAMW_PASSES:
        items += [optimizer_kernel(name, n * b, layer) for n, layer in shards]
        if name == "clip_grad_norm":
            items += [TracedCollective("all_reduce", MASTER_BYTES, axis, "fp32") for axis in norm_axes]
    return items


def _elem_bytes(rb: RankBuilder) -> int:
    from workload.parallel.builder import ELEM_BYTES

    return ELEM_BYTES.get(rb.t.dtype, 2)


__all__ = ["FOREACH_ADAMW_PASSES", "MASTER_BYTES", "gathers_for_backward", "norm_reduce_axes", "optimizer_kernels",
           "reduce", "root_elements", "root_reduce_elements", "root_unit", "unshard"]
