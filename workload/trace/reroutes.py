"""Torch-function reroutes that make a meta trace look like a GPU run (fused attention, RMSNorm,
dropout) rather than the meta/CPU fallback."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from workload.trace.fused_ops import dropout, rms_norm
from workload.trace.masked_attention import masked_attention

if TYPE_CHECKING:
    from workload.trace.recorder import Recorder

aten = torch.ops.aten


class FusedKernels(TorchFunctionMode):
    """Reroute SDPA to a fused attention op, ``F.rms_norm`` to one fused RMSNorm op and ``F.dropout``
    to one dropout kernel (as CUDA's ``native_dropout``).

    ``aten._fused_rms_norm`` is CompositeImplicit on CPU/meta (it decomposes before a dispatch mode
    sees it), hence our own ``trainsim::rms_norm`` custom op with a fake (meta) kernel and a backward.

    *Attention.* :func:`~workload.trace.masked_attention.masked_attention` (a sliding window, sinks,
    ALiBi) becomes the flash op below, marked with its pattern by the recorder.
    ``F.scaled_dot_product_attention`` without a mask becomes
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

    *RMSNorm* is rerouted only with ``fused_rms_norm`` (TE/apex/compiled); without it ``F.rms_norm``
    decomposes on meta exactly as PyTorch eager runs it on CUDA (see :func:`workload.trace.trace_model`).
    """

    def __init__(self, recorder: Recorder, *, fused_rms_norm: bool = True) -> None:
        super().__init__()
        self.recorder = recorder
        self.fused_rms_norm = fused_rms_norm

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            return self._sdpa(*args, **kwargs)
        if func is F.multi_head_attention_forward:
            return self._mha(func, args, kwargs)
        if func is masked_attention:
            return self._masked(*args, **kwargs)
        if func is F.dropout:
            x = args[0]
            p = args[1] if len(args) > 1 else kwargs.get("p", 0.5)
            training = args[2] if len(args) > 2 else kwargs.get("training", True)
            if training and 0.0 < p < 1.0:  # on meta F.dropout decomposes into 3 kernels; CUDA runs one
                return dropout(x, float(p))[0]
        if func is F.rms_norm and self.fused_rms_norm:
            x, shape = args[0], args[1]
            weight = args[2] if len(args) > 2 else kwargs.get("weight")
            eps = args[3] if len(args) > 3 else kwargs.get("eps")
            if weight is not None and len(shape) == 1:
                eps = torch.finfo(x.dtype).eps if eps is None else eps
                return rms_norm(x, weight, float(eps))[0]
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

    def _masked(self, query, key, value, pattern, is_causal=True, enable_gqa=False):
        """:func:`~workload.trace.masked_attention.masked_attention`: the fused flash op of plain causal
        SDPA, which the recorder marks with ``pattern`` (FlashAttention-2 takes ``window_size`` and
        ``alibi_slopes`` and needs no dense mask)."""
        if (pattern.window or pattern.sinks) and not is_causal:
            raise ValueError("masked_attention: a sliding window is causal; is_causal must be true")
        self.recorder.pending_pattern = pattern
        try:
            return self._sdpa(query, key, value, is_causal=is_causal, enable_gqa=enable_gqa)
        finally:
            self.recorder.pending_pattern = None

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
        self.recorder.alias_storage(relaid, out)
        return relaid
