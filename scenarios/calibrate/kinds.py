"""What a profiled GPU kernel is, in the cost model's kernel kinds (:data:`hwmodel.ir.KERNEL_KINDS`).

An op instance takes the kind of the aten op that launched it (so cuDNN's helper kernels -- offset
computation, layout transforms, Winograd transforms -- count with their convolution); work no op claims
is named by its kernel name. Kernel-name families (NVIDIA's and PyTorch's naming):

- GEMM: cuBLAS/cuBLASLt (``*gemm*``, ``sm80_xmma_*``, ``sm90_xmma_*``, ``ampere_*gemm*``,
  ``volta_sgemm_*``, ``splitKreduce``), CUTLASS (``cutlass*``), cuDNN convolutions (``*scudnn*``,
  ``implicit_gemm``, ``winograd``, ``dgrad``/``wgrad`` engines, ``fprop``);
- attention: FlashAttention (``flash_fwd``/``flash_bwd``), cuDNN/TE fused attention (``fmha``,
  ``cudnn_generated_fort_native_sdpa``), PyTorch's memory-efficient kernel (``fmha_cutlass``);
- norms (``bn_fw``/``bn_bw``, ``layer_norm``, ``rms_norm``, ``group_norm``), softmax, reductions and
  pooling (``reduce_kernel``, ``pool``), the optimizer (``multi_tensor_apply_kernel``, fused Adam),
  copies (``Memcpy``, ``Memset``, ``copy``, ``CatArrayBatchedCopy``), else elementwise.
"""

from __future__ import annotations

import re

_GEMM_OPS = {"mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "_scaled_mm", "convolution", "_convolution",
             "cudnn_convolution", "convolution_backward", "cudnn_convolution_backward", "conv2d", "conv1d",
             "conv3d", "cudnn_convolution_relu", "cudnn_convolution_add_relu"}
_NORM_OPS = {"batch_norm", "cudnn_batch_norm", "cudnn_batch_norm_backward", "native_batch_norm",
             "native_batch_norm_backward", "_batch_norm_impl_index", "layer_norm", "native_layer_norm",
             "native_layer_norm_backward", "rms_norm", "_fused_rms_norm", "_fused_rms_norm_backward",
             "group_norm", "native_group_norm", "native_group_norm_backward", "_batch_norm_with_update",
             "batch_norm_backward"}
_SOFTMAX_OPS = {"_softmax", "softmax", "_softmax_backward_data", "_safe_softmax"}
_LOSS_OPS = {"_log_softmax", "log_softmax", "_log_softmax_backward_data", "nll_loss", "nll_loss_forward",
             "nll_loss_backward", "nll_loss2d_forward", "nll_loss2d_backward", "cross_entropy_loss", "mse_loss",
             "mse_loss_backward"}
_REDUCTION_OPS = {"max_pool2d_with_indices", "max_pool2d_with_indices_backward", "avg_pool2d",
                  "avg_pool2d_backward", "adaptive_avg_pool2d", "_adaptive_avg_pool2d",
                  "_adaptive_avg_pool2d_backward", "mean", "sum", "amax", "max", "min", "var_mean",
                  "linalg_vector_norm", "norm", "topk", "sort", "cumsum", "argmax"}
_EMBEDDING_OPS = {"embedding", "embedding_dense_backward", "embedding_backward", "index_select", "gather",
                  "scatter_add_", "index_add_"}
_COPY_OPS = {"copy_", "_to_copy", "to", "clone", "cat", "stack", "contiguous", "constant_pad_nd"}

_KERNEL_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("copy", re.compile(r"^Mem(cpy|set)|CatArrayBatchedCopy|direct_copy_kernel", re.I)),
    ("optimizer", re.compile(r"multi_tensor_apply|fused_adam|adam_|sgd_", re.I)),
    ("attention", re.compile(r"flash_(fwd|bwd)|fmha|sdpa|attention", re.I)),
    ("gemm", re.compile(r"gemm|xmma|cutlass|cublas|scudnn|implicit_gemm|winograd|dgrad|wgrad|fprop|"
                        r"splitKreduce|conv", re.I)),
    ("norm", re.compile(r"bn_fw|bn_bw|batch_norm|layer_norm|rms_?norm|group_norm", re.I)),
    ("softmax", re.compile(r"softmax", re.I)),
    ("reduction", re.compile(r"reduce_kernel|pool|reduction", re.I)),
    ("embedding", re.compile(r"embedding|index_select|indexSelect", re.I)),
)


def kernel_name_kind(name: str) -> str:
    """The kind a kernel's name says (``elementwise`` when no family matches)."""
    for kind, pattern in _KERNEL_PATTERNS:
        if pattern.search(name):
            return kind
    return "elementwise"


def op_kind(op: str, phase: str, main_kernel: str) -> str:
    """The kind of an op instance: from its aten op (``aten::cudnn_convolution`` -> ``gemm``), the
    optimizer phase, else its longest kernel's name."""
    if phase == "opt":
        return "optimizer"
    name = op.removeprefix("aten::").strip()
    if not name:
        return kernel_name_kind(main_kernel)
    if name in _GEMM_OPS:
        return "gemm"
    if "scaled_dot_product" in name or "flash_attention" in name or "efficient_attention" in name:
        return "attention"
    for kind, names in (("norm", _NORM_OPS), ("softmax", _SOFTMAX_OPS), ("loss", _LOSS_OPS),
                        ("reduction", _REDUCTION_OPS), ("embedding", _EMBEDDING_OPS), ("copy", _COPY_OPS)):
        if name in names:
            return kind
    if name.startswith("_foreach_") or name.startswith("_fused_adam"):
        return "optimizer"
    named = kernel_name_kind(main_kernel)
    return named if named in ("gemm", "attention", "norm", "softmax") else "elementwise"
