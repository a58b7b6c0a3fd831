"""What an aten op is for the hardware model: its kernel kind, GEMM/attention shape and bytes moved."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from hwmodel.dtypes import MATH_DTYPES

_DTYPE_NAMES = {getattr(torch, t): m.name for m in MATH_DTYPES.values() for t in m.torch_names}
"""torch dtype -> IR name, from :data:`hwmodel.dtypes.MATH_DTYPES`."""


def dtype_name(dtype: torch.dtype) -> str:
    """Short dtype name used by the IR: ``torch.bfloat16`` -> ``"bf16"``."""
    return _DTYPE_NAMES.get(dtype, str(dtype).removeprefix("torch."))


GEMM_OPS = {"mm", "addmm", "bmm", "baddbmm", "convolution", "convolution_backward", "_scaled_mm",
            "linear", "matmul"}
ATTENTION_FWD_OPS = {"_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
                     "_scaled_dot_product_cudnn_attention", "_flash_attention_forward",
                     "_efficient_attention_forward"}
ATTENTION_BWD_OPS = {n + "_backward" for n in ATTENTION_FWD_OPS} | {"_flash_attention_backward",
                                                                      "_efficient_attention_backward"}
_NORM = {"rms_norm", "rms_norm_backward", "native_layer_norm", "native_layer_norm_backward", "_fused_rms_norm",
         "_fused_rms_norm_backward",
         "native_batch_norm", "_native_batch_norm_legit", "_native_batch_norm_legit_functional",
         "native_batch_norm_backward", "native_group_norm", "native_group_norm_backward",
         "_batch_norm_with_update", "batch_norm_backward"}
_SOFTMAX = {"_softmax", "_softmax_backward_data", "_safe_softmax"}
_LOSS = {"nll_loss_forward", "nll_loss_backward", "nll_loss2d_forward", "nll_loss2d_backward",
         "_log_softmax", "_log_softmax_backward_data", "mse_loss", "mse_loss_backward"}
_EMBEDDING = {"embedding", "embedding_dense_backward", "index_select", "index_add", "index_add_",
              "gather", "scatter", "scatter_add", "scatter_add_", "index", "index_put", "index_put_"}
_COPY = {"_to_copy", "copy_", "clone", "cat", "stack", "constant_pad_nd", "_unsafe_index", "slice_backward",
         "select_backward"}
_REDUCTION = {"sum", "mean", "amax", "amin", "max", "min", "var_mean", "var", "argmax", "topk",
              "sort", "cumsum", "linalg_vector_norm", "norm", "prod", "max_pool2d_with_indices",
              "max_pool2d_with_indices_backward", "avg_pool2d", "avg_pool2d_backward"}
# Ops that launch no kernel: aliases, and allocations (memory comes from the caching allocator).
NO_KERNEL_OPS = {"detach", "t", "lift_fresh", "alias", "_unsafe_view", "empty", "empty_like",
                 "empty_strided", "new_empty", "new_empty_strided", "set_", "_reshape_alias",
                 "resize_", "_local_scalar_dense"}


def kernel_kind(name: str, func: Any, phase: str) -> str:
    if phase == "opt":
        return "optimizer"
    if name in GEMM_OPS:
        return "gemm"
    if name in ATTENTION_FWD_OPS or name in ATTENTION_BWD_OPS:
        return "attention"
    for kind, names in (("norm", _NORM), ("softmax", _SOFTMAX), ("loss", _LOSS),
                        ("embedding", _EMBEDDING), ("copy", _COPY), ("reduction", _REDUCTION)):
        if name in names:
            return kind
    if torch.Tag.pointwise in func.tags or name.endswith(("_like", "fill_", "zero_")) or name in (
            "fill", "zeros", "ones", "full", "arange", "where", "new_zeros", "new_ones", "floor_divide",
            "threshold_backward", "gelu_backward",
            "silu_backward", "native_dropout", "native_dropout_backward", "dropout", "dropout_backward"):
        return "elementwise"
    if torch.Tag.reduction in func.tags:
        return "reduction"
    return "other"


def gemm_shape(name: str, args: Sequence[Any], out: Any) -> tuple[int, ...]:
    """(batch, m, n, k) of a GEMM; convolutions as implicit GEMMs (one per computed gradient in bwd)."""
    if name in ("mm", "addmm", "_scaled_mm"):
        a, b = (args[1], args[2]) if name == "addmm" else (args[0], args[1])
        return (1, a.shape[0], b.shape[1], a.shape[1])
    if name in ("bmm", "baddbmm"):
        a, b = (args[1], args[2]) if name == "baddbmm" else (args[0], args[1])
        return (a.shape[0], a.shape[1], b.shape[2], a.shape[2])
    if name == "convolution":
        x, w, groups = args[0], args[1], args[8]
        return _conv_gemm(x, w, out, groups, 1)
    if name == "convolution_backward":
        grad_out, x, w, groups, mask = args[0], args[1], args[2], args[9], args[10]
        return _conv_gemm(x, w, grad_out, groups, max(1, int(mask[0]) + int(mask[1])))
    return ()


def _conv_gemm(x: torch.Tensor, w: torch.Tensor, y: torch.Tensor, groups: int, n_gemms: int) -> tuple:
    # Implicit GEMM: m = N·H_out·W_out, n = C_out/g, k = C_in/g·kh·kw; batch = gemms × groups.
    m = y.shape[0] * math.prod(y.shape[2:])
    k = w.shape[1] * math.prod(w.shape[2:])
    return (n_gemms * groups, m, w.shape[0] // groups, k)


# Position of ``is_causal`` in the positional arguments of the fused attention ops (ATen's
# native_functions.yaml signatures).
_CAUSAL_ARG = {"_scaled_dot_product_flash_attention": 4, "_scaled_dot_product_flash_attention_backward": 11,
               "_scaled_dot_product_efficient_attention": 6,
               "_scaled_dot_product_efficient_attention_backward": 11}


def attention_info(name: str, args: Sequence[Any], kwargs: dict) -> tuple[tuple[int, ...], bool]:
    """((batch, heads, seq_q, seq_kv, head_dim), causal) of a fused attention op."""
    pos = _CAUSAL_ARG.get(name)
    causal = bool(args[pos]) if pos is not None and len(args) > pos else bool(kwargs.get("is_causal", False))
    q, k = (args[1], args[2]) if name in ATTENTION_BWD_OPS else (args[0], args[1])
    if q.dim() == 4 and name.startswith("_scaled_dot_product"):  # (B, H, S, D)
        return (q.shape[0], q.shape[1], q.shape[2], k.shape[2], q.shape[3]), causal
    return (q.shape[0], q.shape[2], q.shape[1], k.shape[1], q.shape[3]), causal  # (B, S, H, D)


def attention_kv_heads(name: str, args: Sequence[Any]) -> int:
    """Key/value heads of a fused attention op as its kernel reads them: fewer than the query heads under
    grouped-query attention passed as such (``enable_gqa``, Megatron-Core's layout), as many when the
    model copied K/V to the query heads first (torchtitan's ``repeat_kv``)."""
    k = args[2] if name in ATTENTION_BWD_OPS else args[1]
    return int(k.shape[1] if k.dim() == 4 and name.startswith("_scaled_dot_product") else k.shape[2])


def tensor_bytes(t: torch.Tensor) -> int:
    """Bytes of a tensor's storage footprint, broadcast (stride-0) dims counted once."""
    n = t.element_size()
    for size, stride in zip(t.shape, t.stride(), strict=True):
        if stride != 0:
            n *= size
    return n
