"""Trace one training step of a torch module into an :class:`OpGraph`, on the meta device.

The recipe (``reference/style_ecosystem.md`` §2.3): build the model on ``torch.device("meta")`` (no
memory, no init cost), run forward, backward and an ``AdamW`` step under a
:class:`~torch.utils._python_dispatch.TorchDispatchMode` that records every aten op, while a
:class:`~torch.utils.module_tracker.ModuleTracker` says which module issued it. Per op we keep the
name, shapes, dtype, FLOPs (``torch.utils.flop_counter.flop_registry``), bytes read + written
(views skipped, stride-0 dims counted once, as ``torch/utils/_runtime_estimation.py``), module path,
phase and the producers of its inputs (dependency edges).

Two reroutes (a :class:`~torch.overrides.TorchFunctionMode`) make the trace look like a GPU run rather
than the meta/CPU fallback: ``F.scaled_dot_product_attention`` becomes one
``aten._scaled_dot_product_flash_attention`` op (and one ``..._backward``) instead of the math path
with its ``B·H·T·T`` score tensor, and ``F.rms_norm`` becomes one ``aten._fused_rms_norm``.

**Layer dedup.** A model whose ``layers`` attribute is an ``nn.ModuleList`` of identical blocks (same
class, same parameter and buffer shapes) is traced with only its first block; the block's forward,
backward and optimizer ops are then cloned once per layer with renamed module paths and re-wired
dependencies. A 96-layer model therefore costs about one layer to trace.

**FLOP convention.** :attr:`OpRecord.flops` are *model* FLOPs, the count of Megatron-LM's formula
(Narayanan et al., SC'21, arXiv:2104.04473, eq. 3): 2 FLOPs per multiply-accumulate, the backward
pass twice the forward, attention counted over the full ``s × s`` score matrix (causality ignored).
:attr:`OpRecord.kernel_flops` is what the kernel executes: FlashAttention's backward recomputes
``QKᵀ`` (2.5× its forward, the registry's count). :meth:`OpGraph.to_compute_tasks` hands the kernel
count to the hardware model, halved for causal attention (FlashAttention-2 skips the masked blocks).
"""

from __future__ import annotations

import copy
import importlib
import importlib.util
import math
import sys
import zlib
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import flop_registry
from torch.utils.module_tracker import ModuleTracker
from torch.utils.weak import WeakIdKeyDictionary

from hwmodel.ir import Compute

aten = torch.ops.aten

__all__ = [
    "FactoryError", "OpGraph", "OpRecord", "TraceError", "dtype_name", "load_factory", "trace_model",
]

Part = Literal["pre", "block", "post"]


class TraceError(RuntimeError):
    """A module could not be traced on the meta device; the message names the aten op and a fix."""


class FactoryError(ValueError):
    """A ``"package.module:factory"`` string is malformed or does not resolve to a callable."""


# ----------------------------------------------------------------------------------------------
# The records


@dataclass(frozen=True, slots=True)
class OpRecord:
    """One aten op of a traced training step (one GPU kernel, unfused)."""

    index: int
    """Position in :attr:`OpGraph.ops` (issue order)."""
    name: str
    """aten op, e.g. ``aten.mm`` or ``aten._scaled_dot_product_flash_attention``."""
    kind: str
    """Kernel kind, one of :data:`hwmodel.ir.KERNEL_KINDS`."""
    phase: str
    """``fwd``, ``bwd`` or ``opt``."""
    layer: str
    """Module path that issued it, e.g. ``layers.3.attn.qkv``; ``""`` for the top-level module."""
    part: str
    """``pre`` (the part before the repeated blocks: embedding), ``block`` or ``post`` (final norm, head,
    loss) -- by model structure, so the bwd of the head is ``post`` though it is issued first."""
    block: int | None
    """Index of the repeated block (``layers.<i>``) it belongs to; ``None`` outside the blocks."""
    flops: float
    """Model FLOPs (FLOP), Megatron's convention (see the module docstring)."""
    kernel_flops: float
    """FLOPs the kernel executes (FLOP), causality ignored; differs from ``flops`` for attention bwd."""
    bytes_accessed: float
    """Bytes read + written (B), unfused; stride-0 (broadcast) dims counted once."""
    dtype: str
    """Math dtype: fp32, bf16, fp16, ... (first floating input)."""
    shape: tuple[int, ...]
    """gemm: (batch, m, n, k); attention: (batch, heads, seq_q, seq_kv, head_dim); else ()."""
    in_shapes: tuple[tuple[int, ...], ...]
    out_shapes: tuple[tuple[int, ...], ...]
    deps: tuple[int, ...]
    """Indices of the ops that produced this op's inputs."""
    causal: bool = False
    """Attention only: causal mask (the useful work is about half of ``kernel_flops``)."""

    def to_compute(self, *, causal_discount: bool = True) -> Compute:
        """This op as a :class:`hwmodel.ir.Compute` kernel (FLOPs = executed kernel FLOPs)."""
        flops = self.kernel_flops * (0.5 if causal_discount and self.causal else 1.0)
        return Compute(name=self.name, kind=self.kind, flops=flops, bytes_accessed=self.bytes_accessed,
                       dtype=self.dtype, shape=self.shape, layer=self.layer, phase=self.phase)


@dataclass
class OpGraph:
    """The ops of one training step for one micro-batch, in issue order, with dependency edges."""

    ops: list[OpRecord]
    num_blocks: int = 0
    """Number of repeated blocks (``len(model.layers)``); 0 when the model has none."""
    block_attr: str = "layers"
    """Attribute of the model holding the repeated blocks."""
    info: dict[str, Any] = field(default_factory=dict)
    """Free-form facts about the trace (model class, micro-batch shape, dedup used, ...)."""
    _index: dict[tuple[Any, str], list[OpRecord]] | None = field(default=None, init=False, repr=False,
                                                                  compare=False)

    def __len__(self) -> int:
        return len(self.ops)

    def select(self, phase: str | None = None) -> list[OpRecord]:
        """Ops of one phase (``fwd``/``bwd``/``opt``), or all."""
        return [o for o in self.ops if phase is None or o.phase == phase]

    def total_flops(self, phase: str | None = None, *, kernel: bool = False) -> float:
        """Model FLOPs (or executed kernel FLOPs) of one phase, or of the whole step (FLOP)."""
        return float(sum(o.kernel_flops if kernel else o.flops for o in self.select(phase)))

    def total_bytes(self, phase: str | None = None) -> float:
        """Unfused bytes read + written (B)."""
        return float(sum(o.bytes_accessed for o in self.select(phase)))

    def by_layer(self, phase: str | None = None) -> dict[str, list[OpRecord]]:
        """Ops grouped by module path, in first-issue order."""
        out: dict[str, list[OpRecord]] = defaultdict(list)
        for o in self.select(phase):
            out[o.layer].append(o)
        return dict(out)

    def _lookup(self, key: Any, phase: str) -> list[OpRecord]:
        if self._index is None:
            idx: dict[tuple[Any, str], list[OpRecord]] = defaultdict(list)
            for o in self.ops:
                k = o.block if o.part == "block" else o.part
                idx[(k, o.phase)].append(o)
                idx[(k, "*")].append(o)
            self._index = dict(idx)
        return list(self._index.get((key, phase or "*"), []))

    def block_ops(self, i: int, phase: str | None = None) -> list[OpRecord]:
        """Ops of repeated block ``i`` (``layers.i``), e.g. ``block_ops(3, "bwd")``."""
        if not 0 <= i < self.num_blocks:
            raise IndexError(f"block {i} out of range: the graph has {self.num_blocks} blocks")
        return self._lookup(i, phase or "*")

    def pre_ops(self, phase: str | None = None) -> list[OpRecord]:
        """Ops of the part before the blocks: the embedding (in ``bwd``: its backward, issued last)."""
        return self._lookup("pre", phase or "*")

    def post_ops(self, phase: str | None = None) -> list[OpRecord]:
        """Ops of the part after the blocks: final norm, output head, loss (in ``bwd``: issued first)."""
        return self._lookup("post", phase or "*")

    def recompute_flops(self, granularity: Literal["full", "selective"] = "full") -> float:
        """Extra model FLOPs of activation recomputation for one micro-batch (FLOP).

        ``full`` re-runs every block's forward before its backward (Megatron ``--recompute-granularity
        full``): fwd+bwd+recompute of a GPT then equals Megatron's ``96·B·s·l·h²·(1 + s/6h +
        V/16lh)`` (SC'21 eq. 3; the logit layer is not recomputed). ``selective`` re-runs only the
        attention core (Korthikanti et al. 2022, arXiv:2205.05198).
        """
        fwd = [o for o in self.ops if o.phase == "fwd" and o.part == "block"]
        if not fwd and self.num_blocks == 0:
            fwd = self.select("fwd")
        if granularity == "full":
            return float(sum(o.flops for o in fwd))
        if granularity == "selective":
            return float(sum(o.flops for o in fwd if o.kind == "attention"))
        raise ValueError(f"granularity must be 'full' or 'selective', got {granularity!r}")

    def to_compute_tasks(self, phase: str | None = None, *, causal_discount: bool = True) -> list[Compute]:
        """The ops as :class:`hwmodel.ir.Compute` kernels (see :meth:`OpRecord.to_compute`)."""
        return [o.to_compute(causal_discount=causal_discount) for o in self.select(phase)]


# ----------------------------------------------------------------------------------------------
# Op classification


_DTYPE_NAMES = {
    torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16", torch.float64: "fp64",
    torch.float8_e4m3fn: "fp8", torch.float8_e5m2: "fp8",
}


def dtype_name(dtype: torch.dtype) -> str:
    """Short dtype name used by the IR: ``torch.bfloat16`` -> ``"bf16"``."""
    return _DTYPE_NAMES.get(dtype, str(dtype).removeprefix("torch."))


_GEMM = {"mm", "addmm", "bmm", "baddbmm", "convolution", "convolution_backward", "_scaled_mm",
         "linear", "matmul"}
_ATTENTION_FWD = {"_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
                  "_scaled_dot_product_cudnn_attention", "_flash_attention_forward",
                  "_efficient_attention_forward"}
_ATTENTION_BWD = {n + "_backward" for n in _ATTENTION_FWD} | {"_flash_attention_backward",
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
_NO_KERNEL = {"detach", "t", "lift_fresh", "alias", "_unsafe_view", "empty", "empty_like",
              "empty_strided", "new_empty", "new_empty_strided", "set_", "_reshape_alias",
              "resize_", "_local_scalar_dense"}


def _kind(name: str, func: Any, phase: str) -> str:
    if phase == "opt":
        return "optimizer"
    if name in _GEMM:
        return "gemm"
    if name in _ATTENTION_FWD or name in _ATTENTION_BWD:
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


def _gemm_shape(name: str, args: Sequence[Any], out: Any) -> tuple[int, ...]:
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


def _attention_info(name: str, args: Sequence[Any], kwargs: dict) -> tuple[tuple[int, ...], bool]:
    """((batch, heads, seq_q, seq_kv, head_dim), causal) of a fused attention op."""
    pos = _CAUSAL_ARG.get(name)
    causal = bool(args[pos]) if pos is not None and len(args) > pos else bool(kwargs.get("is_causal", False))
    q, k = (args[1], args[2]) if name in _ATTENTION_BWD else (args[0], args[1])
    if q.dim() == 4 and name.startswith("_scaled_dot_product"):  # (B, H, S, D)
        return (q.shape[0], q.shape[1], q.shape[2], k.shape[2], q.shape[3]), causal
    return (q.shape[0], q.shape[2], q.shape[1], k.shape[1], q.shape[3]), causal  # (B, S, H, D)


def _nbytes(t: torch.Tensor) -> int:
    """Bytes of a tensor's storage footprint, broadcast (stride-0) dims counted once."""
    n = t.element_size()
    for size, stride in zip(t.shape, t.stride(), strict=True):
        if stride != 0:
            n *= size
    return n


# ----------------------------------------------------------------------------------------------
# The recorder


# Ops whose output shape or value depends on tensor data (no meta kernel, or a meaningless one).
_DATA_DEPENDENT = {"nonzero", "bincount", "masked_select", "_unique", "_unique2", "unique_dim",
                   "unique_consecutive", "histc", "_local_scalar_dense"}
_DATA_DEPENDENT_HINT = (
    "data-dependent ops need an explicit assumption on the meta device (e.g. MoE routing: assume "
    "uniform tokens-per-expert with a capacity factor, as workload.zoo.moe does; replace .item()/"
    "nonzero/bincount with static-shape code)"
)


@torch.library.custom_op("trainsim::rms_norm", mutates_args=())
def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused RMSNorm kernel: (y, rstd); y = x · rsqrt(mean(x²) + eps) · weight, rstd (..., 1) fp32."""
    rstd = torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)
    return (x.float() * rstd * weight.float()).to(x.dtype), rstd


@_rms_norm.register_fake
def _(x, weight, eps):
    return torch.empty_like(x), x.new_empty((*x.shape[:-1], 1), dtype=torch.float32)


@torch.library.custom_op("trainsim::rms_norm_backward", mutates_args=())
def _rms_norm_backward(grad: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                       rstd: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(dx, dweight) of :func:`_rms_norm`."""
    xhat = x.float() * rstd
    gw = grad.float() * weight.float()
    dx = rstd * (gw - xhat * (gw * xhat).mean(-1, keepdim=True))
    dw = (grad.float() * xhat).reshape(-1, x.shape[-1]).sum(0)
    return dx.to(x.dtype), dw.to(weight.dtype)


@_rms_norm_backward.register_fake
def _(grad, x, weight, rstd):
    return torch.empty_like(x), torch.empty_like(weight)


def _rms_norm_setup(ctx, inputs, output):
    x, weight, _ = inputs
    ctx.save_for_backward(x, weight, output[1])


def _rms_norm_grad(ctx, grad_y, grad_rstd):
    x, weight, rstd = ctx.saved_tensors
    dx, dw = _rms_norm_backward(grad_y, x, weight, rstd)
    return dx, dw, None


_rms_norm.register_autograd(_rms_norm_grad, setup_context=_rms_norm_setup)


@torch.library.custom_op("trainsim::dropout", mutates_args=())
def _dropout(x: torch.Tensor, p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """One fused dropout kernel, as CUDA's ``native_dropout``: (y, keep-mask)."""
    mask = torch.rand_like(x, dtype=torch.float32) >= p
    return x * mask / (1 - p), mask


@_dropout.register_fake
def _(x, p):
    return torch.empty_like(x), torch.empty_like(x, dtype=torch.bool)


@torch.library.custom_op("trainsim::dropout_backward", mutates_args=())
def _dropout_backward(grad: torch.Tensor, mask: torch.Tensor, p: float) -> torch.Tensor:
    """dx = grad * mask / (1 - p): one elementwise kernel."""
    return grad * mask / (1 - p)


@_dropout_backward.register_fake
def _(grad, mask, p):
    return torch.empty_like(grad)


def _dropout_setup(ctx, inputs, output):
    ctx.p = inputs[1]
    ctx.save_for_backward(output[1])


def _dropout_grad(ctx, grad_y, grad_mask):
    (mask,) = ctx.saved_tensors
    return _dropout_backward(grad_y, mask, ctx.p), None


_dropout.register_autograd(_dropout_grad, setup_context=_dropout_setup)


class _FusedKernels(TorchFunctionMode):
    """Reroute SDPA to a fused attention op, ``F.rms_norm`` to one fused RMSNorm op and ``F.dropout``
    to one dropout kernel (as CUDA's ``native_dropout``).

    ``aten._fused_rms_norm`` is CompositeImplicit on CPU/meta (it decomposes before a dispatch mode
    sees it), hence our own ``trainsim::rms_norm`` custom op with a fake (meta) kernel and a backward.

    *Attention.* ``F.scaled_dot_product_attention`` without a mask becomes
    ``aten._scaled_dot_product_flash_attention`` (causal or not). With an ``attn_mask`` it becomes
    ``aten._scaled_dot_product_efficient_attention`` with the mask as its additive bias: PyTorch's
    SDPA documentation lists three CUDA implementations, FlashAttention-2, Memory-Efficient Attention
    and the C++ math path, and its backend table (``torch.nn.attention.SDPBackend``; ``sdp_utils.cpp``
    ``check_for_attn_mask`` disables only flash for a mask) lets the memory-efficient kernel take an
    arbitrary float or boolean mask, so a GPU run does not fall back to math. Its cost is that of a
    fused kernel of the same shape (no ``B·H·T·T`` score tensor in memory) plus the mask read once per
    pass, which the op's bytes count (a broadcast mask at its stored size). A boolean mask is first
    turned into an additive one (``convert_boolean_attn_mask``: ``where(~mask, -inf, 0)``, traced).
    Grouped-query attention with a mask keeps PyTorch's own path.

    ``F.multi_head_attention_forward`` (``nn.MultiheadAttention``, ``nn.TransformerEncoderLayer``)
    calls SDPA from inside ``torch.nn.functional`` when ``need_weights=False``, while this mode is
    disabled (a mode does not see the calls its own handler makes); its SDPA call is therefore routed
    here explicitly, so such a model costs the same attention kernel as one calling SDPA directly.
    ``need_weights=True`` returns the ``B·H·T·T`` weights and genuinely runs the math path (bmm,
    softmax), as on a GPU.
    """

    def __init__(self, recorder: _Recorder) -> None:
        super().__init__()
        self.recorder = recorder

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            return self._sdpa(*args, **kwargs)
        if func is F.multi_head_attention_forward:
            return self._mha(func, args, kwargs)
        if func is F.dropout:
            x = args[0]
            p = args[1] if len(args) > 1 else kwargs.get("p", 0.5)
            training = args[2] if len(args) > 2 else kwargs.get("training", True)
            if training and 0.0 < p < 1.0:  # on meta F.dropout decomposes into 3 kernels; CUDA runs one
                return _dropout(x, float(p))[0]
        if func is F.rms_norm:
            x, shape = args[0], args[1]
            weight = args[2] if len(args) > 2 else kwargs.get("weight")
            eps = args[3] if len(args) > 3 else kwargs.get("eps")
            if weight is not None and len(shape) == 1:
                eps = torch.finfo(x.dtype).eps if eps is None else eps
                return _rms_norm(x, weight, float(eps))[0]
        return func(*args, **kwargs)

    def _mha(self, func, args, kwargs):
        """``F.multi_head_attention_forward`` with its inner SDPA call routed to :meth:`_sdpa` (it looks
        the name up in ``torch.nn.functional``'s globals, which are patched for the call)."""
        module_globals = func.__globals__
        original = module_globals.get("scaled_dot_product_attention")
        module_globals["scaled_dot_product_attention"] = self._sdpa
        try:
            return func(*args, **kwargs)
        finally:
            module_globals["scaled_dot_product_attention"] = original

    def _sdpa(self, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
              enable_gqa=False):
        if attn_mask is None:
            # (B, H, T, D) each; GQA k/v with fewer heads are accepted by the flash meta kernel.
            out = aten._scaled_dot_product_flash_attention(query, key, value, dropout_p, is_causal,
                                                           scale=scale)[0]
            return self._relayout(out)
        if query.dim() != 4 or (enable_gqa and key.shape[-3] != query.shape[-3]):
            return F.scaled_dot_product_attention(query, key, value, attn_mask, dropout_p, is_causal,
                                                  scale=scale, enable_gqa=enable_gqa)
        if attn_mask.dtype == torch.bool:  # SDPA's convert_boolean_attn_mask
            attn_mask = torch.where(attn_mask.logical_not(), float("-inf"), 0.0).to(query.dtype)
        b, h, t = query.shape[:3]
        bias = attn_mask.expand(b, h, t, key.shape[-2])  # a view: the stored mask is read, not copied
        out = aten._scaled_dot_product_efficient_attention(query, key, value, bias, True, dropout_p,
                                                           is_causal, scale=scale)[0]
        return self._relayout(out)

    def _relayout(self, out: torch.Tensor) -> torch.Tensor:
        # The fused kernels write (B, T, H, D) memory; the meta kernels allocate (B, H, T, D). Relayout
        # unrecorded so that the caller's transpose(1, 2).reshape(B, T, C) costs no copy kernel.
        with self.recorder.paused():
            relaid = out.transpose(1, 2).contiguous().transpose(1, 2)
        self.recorder.alias(relaid, out)
        self.recorder.storage_alias[_storage_key(relaid)] = _storage_key(out)
        return relaid


class _Recorder(TorchDispatchMode):
    """Records aten ops as plain dicts (turned into :class:`OpRecord` s by :func:`_assemble`)."""

    def __init__(self, tracker: _Tracker, root: str) -> None:
        super().__init__()
        self.tracker, self.root = tracker, root
        self.ops: list[dict[str, Any]] = []
        self.producer: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self.phase = "fwd"
        self.layer_override: str | None = None
        self.storage_alias: dict[int, int] = {}
        """Storage key -> the storage it stands for (the flash output relaid out unrecorded)."""
        self._paused = False

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Run ops without recording them."""
        self._paused, was = True, self._paused
        try:
            yield
        finally:
            self._paused = was

    def alias(self, new: torch.Tensor, old: torch.Tensor) -> None:
        """Let ``new`` stand for ``old`` as a dependency source."""
        if old in self.producer:
            self.producer[new] = self.producer[old]

    def _layer(self) -> str:
        if self.layer_override is not None:
            return self.layer_override
        # the innermost module (see _Tracker); never by set order, which depends on PYTHONHASHSEED
        path = self.tracker.innermost()
        if path == self.root:
            return ""
        return path.removeprefix(self.root + ".")

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self._paused:
            return func(*args, **kwargs)
        name = func._overloadpacket.__name__
        ins = [a for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)]
        on_meta = any(t.device.type == "meta" for t in ins)
        if on_meta and (torch.Tag.data_dependent_output in func.tags or name in _DATA_DEPENDENT):
            what = "Tensor.item()" if name == "_local_scalar_dense" else f"aten.{name}"
            raise TraceError(f"{what} (aten.{name}) cannot run on the meta device: its result depends on "
                             f"tensor values. In module '{self._layer() or '<top>'}': {_DATA_DEPENDENT_HINT}")
        try:
            out = func(*args, **kwargs)
        except TraceError:
            raise
        except (NotImplementedError, RuntimeError) as e:
            raise TraceError(f"aten.{name} failed on the meta device in module '{self._layer() or '<top>'}'"
                             f" ({e.__class__.__name__}: {str(e).splitlines()[0] if str(e) else ''}). "
                             f"If it has no meta kernel, express it with ops that do; "
                             f"{_DATA_DEPENDENT_HINT}") from e
        outs = [o for o in tree_flatten(out)[0] if isinstance(o, torch.Tensor)]
        if func.namespace == "profiler" or not (on_meta or any(o.device.type == "meta" for o in outs)):
            return out  # host-side bookkeeping (the optimizer's CPU step counter) launches no kernel
        if func.is_view or name in _NO_KERNEL:
            src = self.producer.get(ins[0]) if ins else None
            if src is not None:
                for o in outs:
                    self.producer[o] = src
            return out
        pkt = func._overloadpacket
        flops = float(flop_registry[pkt](*args, **kwargs, out_val=out)) if pkt in flop_registry else 0.0
        kind = _kind(name, func, self.phase)
        shape: tuple[int, ...] = ()
        causal = False
        model_flops = flops
        if name in _GEMM:
            shape = _gemm_shape(name, args, out)
        elif name in _ATTENTION_FWD or name in _ATTENTION_BWD:
            shape, causal = _attention_info(name, args, kwargs)
            if name in _ATTENTION_BWD:
                model_flops = flops * 0.8  # 5 GEMMs incl. the recomputed QK^T -> the 4 of a plain bwd
        floats = [t for t in ins + outs if t.is_floating_point()]
        nbytes = float(sum(map(_nbytes, ins)) + sum(map(_nbytes, outs)))
        if name == "embedding":
            # a gather: the indices, the rows they select (as many bytes as the output) and the
            # output; not the whole table. Its backward (embedding_dense_backward) keeps the default
            # count, table-sized: CUDA's embedding_backward_cuda_kernel (ATen
            # native/cuda/EmbeddingBackwardKernel.cu) allocates the gradient with at::zeros({num_weights,
            # dim}), a write of the whole table, then reads the incoming gradient and adds its rows.
            nbytes = float(_nbytes(args[1]) + 2 * sum(map(_nbytes, outs)))
        idx = len(self.ops)
        self.tracker.ops += 1
        self.ops.append({
            "name": f"{func.namespace}.{name}", "kind": kind, "phase": self.phase, "layer": self._layer(),
            "flops": model_flops,
            "kernel_flops": flops, "bytes": nbytes,
            "dtype": dtype_name(floats[0].dtype) if floats else dtype_name((ins + outs)[0].dtype),
            "shape": tuple(int(s) for s in shape), "causal": causal,
            "in_shapes": tuple(tuple(t.shape) for t in ins), "out_shapes": tuple(tuple(t.shape) for t in outs),
            "deps": tuple(sorted({d for d in (self.producer.get(t) for t in ins) if d is not None})),
        })
        for o in outs:
            self.producer[o] = idx
        return out


class _Tracker(ModuleTracker):
    """A :class:`ModuleTracker` that also dates each entry into a module (``entered``: path -> the
    number of recorded ops before its latest entry), so that the module an op runs in is well defined.

    ``ModuleTracker.parents`` is a set. In forward the innermost module is also the longest path, but
    in backward modules are entered by gradient hooks and some are never left: a module whose inputs
    need no gradient (an embedding, fed integer indices) stays in the set after its backward. With
    ``x = wte(idx) + wpe(pos)`` both embeddings are then entered when their backward kernels run, two
    paths of equal length, and a longest-path rule picks one by set order (by the hash seed). The
    hooks run just before the autograd node of the module's output executes (a tensor hook is a
    pre-hook on its ``grad_fn``, ``torch/csrc/autograd/engine.cpp``), so the module entered last is the
    one whose backward is running; modules entered with no op in between (a block and its last child
    share one output tensor) are ranked by depth. A module whose backward is an identity (its output
    is its input, e.g. dropout with p = 0) is left before it is entered; such an entry is dropped.
    """

    def __init__(self) -> None:
        super().__init__()
        self.entered: dict[str, int] = {}
        self.ops = 0
        """Recorded ops so far (the recorder counts them)."""
        self._early_exits: dict[str, int] = defaultdict(int)

    def _get_append_fn(self, name, is_bw):
        fn = super()._get_append_fn(name, is_bw)

        def append(*args) -> None:
            if is_bw and self._early_exits[name] > 0:  # identity backward: already left
                self._early_exits[name] -= 1
                return
            fn(*args)
            self.entered[name] = self.ops

        return append

    def _get_pop_fn(self, name, is_bw):
        fn = super()._get_pop_fn(name, is_bw)

        def pop(*args) -> None:
            if is_bw and name not in self.parents:
                self._early_exits[name] += 1
                return
            fn(*args)

        return pop

    def innermost(self) -> str:
        """The module path the next op runs in (``""``: none but ``"Global"``)."""
        return max((p for p in self.parents if p != "Global"),
                   key=lambda p: (self.entered.get(p, -1), p.count("."), len(p), p), default="")


# ----------------------------------------------------------------------------------------------
# Tracing


def _block_signature(block: nn.Module) -> tuple:
    return (type(block),
            tuple((n, tuple(p.shape), p.dtype) for n, p in block.named_parameters()),
            tuple((n, tuple(b.shape), b.dtype) for n, b in block.named_buffers()),
            tuple(type(m).__name__ for m in block.modules()))


def _submodule(model: nn.Module, path: str) -> nn.Module | None:
    """``model.get_submodule(path)`` (``""``: the model itself), or ``None`` if there is none."""
    if not path:
        return model
    try:
        return model.get_submodule(path)
    except AttributeError:
        return None


def block_path(attr: str, name: str | int) -> str:
    """Module path of child ``name`` of the block container ``attr`` (``""``: the model's own children)."""
    return f"{attr}.{name}" if attr else str(name)


def _repeated_blocks(model: nn.Module, attr: str) -> nn.Module | None:
    """The container at ``attr`` if it is an ``nn.ModuleList``/``nn.Sequential`` of identical blocks named
    ``0, 1, ...`` (what layer dedup can clone), else ``None``."""
    blocks = _submodule(model, attr)
    if not isinstance(blocks, (nn.ModuleList, nn.Sequential)) or len(blocks) < 1:
        return None
    if list(blocks._modules) != [str(i) for i in range(len(blocks))]:
        return None
    sig = _block_signature(blocks[0])
    return blocks if all(_block_signature(b) == sig for b in blocks) else None


def _one_block_copy(model: nn.Module, attr: str) -> nn.Module:
    """A shallow copy of ``model`` whose container at ``attr`` holds only its first block (shared); the
    modules on the path to it are shallow-copied too, so the original keeps all its blocks."""
    def replaced(mod: nn.Module, parts: list[str]) -> nn.Module:
        reduced = copy.copy(mod)
        if not parts:  # the container itself
            reduced._modules = {"0": mod._modules["0"]}
            return reduced
        reduced._modules = dict(mod._modules)
        reduced._modules[parts[0]] = replaced(mod._modules[parts[0]], parts[1:])
        return reduced

    return replaced(model, attr.split(".") if attr else [])


def _default_loss(out: Any) -> torch.Tensor:
    if isinstance(out, torch.Tensor):
        return out if out.dim() == 0 else out.float().mean()
    if isinstance(out, dict) and "loss" in out:
        return out["loss"]
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        return _default_loss(out[0])
    raise TraceError(f"cannot derive a scalar loss from the model output of type {type(out).__name__}; "
                     f"pass loss_fn=")


def trace_model(  # noqa: C901
    model: nn.Module,
    inputs: Sequence[Any] | dict[str, Any] | None = None,
    *,
    micro_batch_size: int = 1,
    dtype: torch.dtype | None = torch.bfloat16,
    optimizer: bool = True,
    layer_dedup: bool = True,
    block_attr: str = "layers",
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
    master_dtype: torch.dtype = torch.float32,
    weight_decay: float = 0.1,
    saved_activations: bool = False,
) -> OpGraph:
    """Trace forward, backward and (optionally) one AdamW step of ``model`` into an :class:`OpGraph`.

    Args:
        model: a module on the meta device (moved there with ``to_empty`` if it is not). Its parameters
            are cast to ``dtype`` in place (free on meta).
        inputs: positional arguments (a sequence) or keyword arguments (a dict) for ``model(...)``;
            ``None`` calls ``model.example_inputs(micro_batch_size)`` (every zoo model has it).
        micro_batch_size: B, used only when ``inputs`` is ``None``.
        dtype: parameter/activation dtype (``None`` keeps the model's).
        optimizer: also trace ``torch.optim.AdamW.step()`` as phase ``opt``. Mixed precision as
            Megatron: fp32 (``master_dtype``) master weights and Adam moments; the step casts the
            gradient to fp32, updates, and copies the master back into the ``dtype`` parameter. We use
            the single-tensor implementation (``foreach=False``): it traces on meta and yields
            per-parameter kernels, attributable to a layer and shardable with it (``foreach=True``
            also traces but fuses all parameters into ``_foreach_*`` ops). The first step, which only
            allocates the moments, is run untraced.
        layer_dedup: trace one of identical ``model.<block_attr>`` blocks and clone it (see module doc).
        block_attr: module path of the block container (``"layers"``, ``"encoder.blocks"``; ``""``: the
            model's own children). An ``nn.ModuleList``/``nn.Sequential`` of identical blocks is
            deduplicated; any other container's children are the blocks, numbered in the order forward
            first calls them (:attr:`OpGraph.info` ``block_names``). No module at that path: no blocks.
        loss_fn: maps the model output to a scalar loss; default: the output if it is a scalar,
            ``output["loss"]``, ``output[0]``, else ``output.float().mean()``.
        saved_activations: also record the tensors autograd saves for backward
            (``torch.autograd.graph.saved_tensors_hooks``), once per storage, parameters and buffers
            excluded, into ``graph.info["saved_bytes"]``: ``{"pre": B, "post": B, "blocks": [B per
            block], "block_inputs": [B per block]}`` for one micro-batch (bytes), where
            ``block_inputs`` is the size of each block's first floating-point input (what full
            recomputation keeps).

    Raises:
        TraceError: an op has no meta kernel or is data-dependent (``nonzero``, ``.item()``...).
    """
    if any(p.device.type != "meta" for p in model.parameters()):
        model = model.to_empty(device="meta")
    if dtype is not None:
        model.to(dtype)
    model.train()
    container = _submodule(model, block_attr)
    blocks = _repeated_blocks(model, block_attr)
    dedup = layer_dedup and blocks is not None
    traced = _one_block_copy(model, block_attr) if dedup else model
    if inputs is None:
        if not hasattr(model, "example_inputs"):
            raise TraceError(f"{type(model).__name__} has no example_inputs(); pass inputs=")
        inputs = model.example_inputs(micro_batch_size)
    args, kwargs = ((), dict(inputs)) if isinstance(inputs, dict) else (tuple(inputs), {})

    tracker = _Tracker()
    rec = _Recorder(tracker, type(traced).__name__)
    params = [(n, p) for n, p in traced.named_parameters() if p.requires_grad]
    for _, p in params:
        p.grad = None
    block_inputs: set[int] = set()  # ops producing the first block's input activations
    call_order: list[str] = []  # children of the container, in the order forward first calls them
    input_bytes: dict[str, float] = {}  # child -> bytes of its first floating-point input

    def _note_block_input(module: nn.Module, args: tuple, kwargs: dict) -> None:
        for t in tree_flatten((args, kwargs))[0]:
            if isinstance(t, torch.Tensor) and t.is_floating_point() and t in rec.producer:
                block_inputs.add(rec.producer[t])
                break

    def _note_call(name: str) -> Callable:
        def hook(module: nn.Module, args: tuple, kwargs: dict) -> None:
            if name not in input_bytes:
                call_order.append(name)
                floats = [t for t in tree_flatten((args, kwargs))[0]
                          if isinstance(t, torch.Tensor) and t.is_floating_point()]
                input_bytes[name] = float(floats[0].numel() * floats[0].element_size()) if floats else 0.0
        return hook

    hooks = []
    if dedup:
        first = _submodule(traced, block_attr)[0]
        hooks.append(first.register_forward_pre_hook(_note_block_input, with_kwargs=True))
        hooks.append(first.register_forward_pre_hook(_note_call("0"), with_kwargs=True))
    elif container is not None:
        for name, child in container.named_children():
            hooks.append(child.register_forward_pre_hook(_note_call(name), with_kwargs=True))
    saved: list[tuple[str, float]] = []
    packing = _saved_tensors(rec, traced, saved) if saved_activations else nullcontext()
    try:
        with torch.device("meta"), tracker, _FusedKernels(rec), rec:
            with packing:
                loss = (loss_fn or _default_loss)(traced(*args, **kwargs))
            rec.phase = "bwd"
            loss.backward()
        if optimizer:
            _trace_adamw(rec, params, master_dtype, weight_decay)
    finally:
        for h in hooks:
            h.remove()
        for _, p in params:
            p.grad = None
    if dedup:
        num_blocks = len(blocks)
        graph = _assemble(rec.ops, num_blocks, block_attr, block_inputs)
        names = [str(i) for i in range(num_blocks)]
    else:
        names = call_order if container is not None else []
        num_blocks = len(names)
        graph = _assemble(rec.ops, 0, block_attr, block_inputs, names)
    graph.num_blocks = num_blocks
    graph.info.update(model=type(model).__name__, layer_dedup=dedup, dtype=dtype_name(dtype or torch.float32),
                      num_parameters=sum(p.numel() for p in model.parameters()))
    if container is not None and names:
        graph.info["block_names"] = names
    if saved_activations:
        graph.info["saved_bytes"] = _saved_by_part(saved, block_attr, names[:1] if dedup else names, input_bytes,
                                                   num_blocks, dedup)
    return graph


@contextmanager
def _saved_tensors(rec: _Recorder, model: nn.Module, out: list[tuple[str, float]]) -> Iterator[None]:
    """Record (module path, bytes) of each storage autograd saves for backward, once per storage;
    parameters and buffers (model state, counted elsewhere) excluded."""
    own = {_storage_key(t) for t in (*model.parameters(), *model.buffers())}
    seen: set[int] = set()

    def pack(t: torch.Tensor) -> torch.Tensor:
        try:
            key = rec.storage_alias.get(_storage_key(t), _storage_key(t))
            nbytes = t.untyped_storage().nbytes()
        except (RuntimeError, NotImplementedError, AttributeError):  # tensor subclasses without storage
            return t
        if key not in own and key not in seen:
            seen.add(key)
            out.append((rec._layer(), float(nbytes)))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield


def _storage_key(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata


def _saved_by_part(saved: list[tuple[str, float]], attr: str, names: list[str], input_bytes: dict[str, float],
                   num_blocks: int, dedup: bool) -> dict[str, Any]:
    """Saved bytes per part: before the blocks, per block, after (an entry outside the blocks between
    two block entries goes to the block before it, as :func:`_annotate` does with ops)."""
    index = {n: i for i, n in enumerate(names)}
    where = [index.get(_child_name(layer, attr)) for layer, _ in saved]
    known = [j for j, b in enumerate(where) if b is not None]
    pre = post = 0.0
    per_block = [0.0] * len(names)
    last = None
    for j, ((_, nbytes), b) in enumerate(zip(saved, where, strict=True)):
        if not known or j < known[0]:
            pre += nbytes
        elif j > known[-1]:
            post += nbytes
        else:
            last = b if b is not None else last
            per_block[last] += nbytes
    inputs = [input_bytes.get(n, 0.0) for n in names]
    if dedup:  # one block traced: every clone saves the same
        per_block, inputs = per_block * num_blocks, inputs * num_blocks
    return {"pre": pre, "post": post, "blocks": per_block, "block_inputs": inputs}


def _child_name(layer: str, attr: str) -> str | None:
    """The container child a module path lies in (``"blocks.3.attn"`` -> ``"3"`` for attr ``blocks``)."""
    if attr:
        if not layer.startswith(attr + "."):
            return None
        layer = layer[len(attr) + 1:]
    return layer.split(".")[0] or None


def _trace_adamw(rec: _Recorder, params: list[tuple[str, nn.Parameter]], master_dtype: torch.dtype,
                 weight_decay: float) -> None:
    """One AdamW step per parameter (foreach=False), each attributed to the parameter's module."""
    rec.phase = "opt"
    for name, p in params:
        if p.grad is None:
            continue
        master = nn.Parameter(torch.empty(p.shape, dtype=master_dtype, device="meta")) if p.dtype != master_dtype else p
        master.grad = torch.empty(p.shape, dtype=master_dtype, device="meta")
        # Megatron: no weight decay on biases and norm weights (1-D parameters).
        opt = torch.optim.AdamW([master], lr=1e-4, weight_decay=weight_decay if p.dim() > 1 else 0.0,
                                foreach=False)
        opt.step()  # allocates the moments; not part of a steady-state step
        rec.layer_override = name.rpartition(".")[0]
        with rec:
            with torch.no_grad():
                if master is not p:
                    master.grad = p.grad.to(master_dtype)  # (numel,) bf16 -> fp32 grad cast
            opt.step()
            if master is not p:
                with torch.no_grad():
                    p.copy_(master)  # fp32 master -> model dtype
        rec.layer_override = None


# ----------------------------------------------------------------------------------------------
# Assembling the graph (and cloning the traced block)


def _part_ranges(ops: list[dict], phase: str, prefix: str) -> tuple[list[int], tuple[int, int] | None]:
    """Indices of ``phase`` ops, and the (first, last) position among them of the block's ops."""
    idx = [i for i, o in enumerate(ops) if o["phase"] == phase]
    pos = [j for j, i in enumerate(idx) if _in_block(ops[i]["layer"], prefix)]
    return idx, ((pos[0], pos[-1]) if pos else None)


def _in_block(layer: str, prefix: str) -> bool:
    return layer == prefix or layer.startswith(prefix + ".")


# Positional segments in backward run head first: what precedes the blocks there is the "post" part.
_BWD_PART = {"pre": "post", "post": "pre"}


def _annotate(raw: list[dict], idx: list[int], attr: str,
              names: list[str] | None = None) -> list[tuple[str, int | None]]:
    """(part, block) of undeduplicated ops: block ``i`` is the container child ``names[i]`` (default
    ``<attr>.<i>`` module paths); ops between two ops of block i go to block i (backward ops the tracker
    attributes to no module)."""
    index = {n: i for i, n in enumerate(names)} if names is not None else None
    blocks: list[int | None] = []
    for i in idx:
        child = _child_name(raw[i]["layer"], attr)
        if index is not None:
            blocks.append(index.get(child) if child is not None else None)
        else:
            blocks.append(int(child) if child is not None and child.isdigit() else None)
    known = [j for j, b in enumerate(blocks) if b is not None]
    if not known:
        return [("pre", None)] * len(idx)
    out: list[tuple[str, int | None]] = []
    last = None
    for j, b in enumerate(blocks):
        if j < known[0]:
            out.append(("pre", None))
        elif j > known[-1]:
            out.append(("post", None))
        else:
            last = b if b is not None else last
            out.append(("block", last))
    return out


def _assemble(raw: list[dict], num_blocks: int, attr: str, block_inputs: set[int] | None = None,  # noqa: C901
              block_names: list[str] | None = None) -> OpGraph:
    """Turn recorded op dicts into an :class:`OpGraph`, cloning block 0 ``num_blocks`` times if > 0
    (else annotating blocks by ``block_names``, see :func:`_annotate`).

    Dependencies of clone ``c`` on ops before the block are re-wired to the previous clone's outputs
    (the ops whose results the following segment consumes) when they are the block's input
    activations (``block_inputs``, found by a forward pre-hook; all fwd inputs if unknown) or, in
    backward, the incoming gradient. Other inputs (RoPE tables, masks) keep their producer.
    """
    prefix = block_path(attr, 0)
    # Layout per phase: [pre][block][post]; entries are (template index, clone or None, part).
    order: list[tuple[int, int | None, str]] = []
    seg: dict[int, tuple[str, str]] = {}  # template index -> (phase, part)
    clones_in_order = {"fwd": range(num_blocks), "bwd": range(num_blocks - 1, -1, -1),
                       "opt": range(num_blocks)}
    boundary_out: dict[str, list[int]] = {}
    for phase in ("fwd", "bwd", "opt"):
        idx, rng = _part_ranges(raw, phase, prefix)
        if num_blocks == 0 or rng is None:
            for i, (part, block) in zip(idx, _annotate(raw, idx, attr, block_names), strict=True):
                order.append((i, block, part))
                seg[i] = (phase, "pre")
            continue
        a, b = rng
        pre, blk, post = idx[:a], idx[a:b + 1], idx[b + 1:]
        for part, ids in (("pre", pre), ("block", blk), ("post", post)):
            for i in ids:
                seg[i] = (phase, part)
        blk_set = set(blk)
        # block ops whose outputs the following segment consumes: the block's "output" in this phase
        boundary_out[phase] = sorted({d for i in post for d in raw[i]["deps"] if d in blk_set})
        order += [(i, None, "pre") for i in pre]
        for c in clones_in_order[phase]:
            order += [(i, c, "block") for i in blk]
        order += [(i, None, "post") for i in post]

    last_clone = {"fwd": num_blocks - 1, "bwd": 0, "opt": num_blocks - 1}
    new_index: dict[tuple[int, int | None], int] = {}
    ops: list[OpRecord] = []
    for n, (t, c, part) in enumerate(order):
        o = raw[t]
        deps: set[int] = set()
        if num_blocks == 0:  # no cloning: op t is op n
            new_index[(t, None)] = n
            deps = {new_index[(d, None)] for d in o["deps"]}
        for d in o["deps"] if num_blocks else ():
            dphase, dpart = seg[d]
            if dpart == "block":
                deps.add(new_index[(d, c if c is not None else last_clone[dphase])])
                continue
            prev = None
            boundary = dphase == "bwd" or not block_inputs or d in block_inputs
            if c is not None and dpart == "pre" and dphase in ("fwd", "bwd") and boundary:
                # an input from before the block: for later clones, the previous clone's output
                first = 0 if dphase == "fwd" else num_blocks - 1
                if c != first and boundary_out.get(dphase):
                    prev = c - 1 if dphase == "fwd" else c + 1
            if prev is not None:
                deps.update(new_index[(b, prev)] for b in boundary_out[dphase])
            else:
                deps.add(new_index[(d, None)])
        layer = o["layer"]
        if part == "block" and num_blocks:
            rest = layer[len(prefix):] if _in_block(layer, prefix) else ""
            layer = f"{block_path(attr, c)}{rest}"
        if num_blocks:
            new_index[(t, c)] = n
        ops.append(OpRecord(
            index=n, name=o["name"], kind=o["kind"], phase=o["phase"], layer=layer,
            part=_BWD_PART.get(part, part) if o["phase"] == "bwd" else part, block=c, flops=o["flops"],
            kernel_flops=o["kernel_flops"],
            bytes_accessed=o["bytes"], dtype=o["dtype"], shape=o["shape"], in_shapes=o["in_shapes"],
            out_shapes=o["out_shapes"], deps=tuple(sorted(deps)), causal=o["causal"]))
    return OpGraph(ops=ops, num_blocks=num_blocks, block_attr=attr)


# ----------------------------------------------------------------------------------------------
# User modules


def load_factory(spec: str, base_dir: str | Path | None = None) -> Callable[..., Any]:
    """Resolve ``"package.module:factory"`` (``factory`` may be dotted: ``"pkg.mod:Class.build"``), or
    ``"path/to/file.py:factory"``: a Python file, a relative path taken from ``base_dir`` (default: the
    working directory).

    Raises:
        FactoryError: malformed string, module or file not importable, attribute missing or not callable.
    """
    if not isinstance(spec, str) or spec.count(":") != 1 or not all(spec.split(":")):
        raise FactoryError(f"bad factory spec {spec!r}: expected 'package.module:factory' or "
                           f"'path/to/file.py:factory', e.g. 'workload.zoo:build_model'")
    mod_name, attr_path = spec.split(":")
    if mod_name.endswith(".py"):
        obj: Any = _load_file(mod_name, spec, base_dir)
    else:
        try:
            obj = importlib.import_module(mod_name)
        except ImportError as e:
            raise FactoryError(f"cannot import module {mod_name!r} of factory spec {spec!r}: {e}") from e
    for part in attr_path.split("."):
        if not hasattr(obj, part):
            public = sorted(n for n in dir(obj) if not n.startswith("_"))[:20]
            raise FactoryError(f"{getattr(obj, '__name__', obj)!r} has no attribute {part!r} "
                               f"(factory spec {spec!r}); available: {', '.join(public)}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise FactoryError(f"{spec!r} resolves to a {type(obj).__name__}, which is not callable")
    return obj


def _load_file(file: str, spec: str, base_dir: str | Path | None) -> Any:
    """Execute a Python file as a module, registered in ``sys.modules`` under a name unique to its path
    (as ``importlib``'s recipe does: dataclasses and pickling look the module up there)."""
    path = Path(file)
    if not path.is_absolute() and base_dir is not None:
        path = Path(base_dir) / path
    if not path.is_file():
        raise FactoryError(f"factory spec {spec!r}: file not found: {path}")
    tag = zlib.crc32(str(path.resolve()).encode())
    name = f"trainsim_factory_{''.join(c if c.isalnum() else '_' for c in path.stem)}_{tag:08x}"
    mod_spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(mod_spec)
    sys.modules[name] = module
    try:
        mod_spec.loader.exec_module(module)
    except Exception as e:  # the user's file: one line
        del sys.modules[name]
        first = str(e).splitlines()[0] if str(e) else ""
        raise FactoryError(f"factory spec {spec!r}: executing {path} raised {type(e).__name__}: {first}") from e
    return module
