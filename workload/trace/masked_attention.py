"""Attention with a sliding window, attention sinks or ALiBi: what SDPA cannot say, as one call.

``F.scaled_dot_product_attention`` takes a causal flag or a dense mask; FlashAttention-2 takes
``window_size`` and ``alibi_slopes`` and skips the key blocks a window masks. A model calls
:func:`masked_attention` with an :class:`AttentionPattern`; under the tracer
(:class:`workload.trace.reroutes.FusedKernels`) it becomes the same fused flash-attention op as plain
SDPA, with the pattern attached to the op (and to its backward), so that the cost model prices the
blocks the window keeps (:mod:`hwmodel.attention_masks`). Run eagerly (no tracer) it is SDPA with the
equivalent additive mask, so the module computes what it claims.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.overrides import handle_torch_function, has_torch_function


@dataclass(frozen=True, slots=True)
class AttentionPattern:
    """Which keys each query sees besides the causal mask, and the bias added to its scores."""

    window: int = 0
    """Causal sliding window: keys visible per query, counting itself (Hugging Face ``sliding_window``);
    0: none."""
    sinks: int = 0
    """Attention sinks (StreamingLLM, Xiao et al. 2023, arXiv:2309.17453): the first keys every query
    also sees; only with a window."""
    alibi: bool = False
    """ALiBi (Press et al. 2022, arXiv:2108.12409): a per-head linear distance bias on the scores."""

    def __bool__(self) -> bool:
        return bool(self.window or self.sinks or self.alibi)


def alibi_slopes(num_heads: int) -> list[float]:
    """ALiBi's per-head slopes (Press et al. 2022 §3; BLOOM's ``build_alibi_tensor`` for a head count
    that is not a power of two): ``2^(-8 i / n)`` for the nearest power of two n, then every other slope
    of the 2n series."""
    n = 2 ** math.floor(math.log2(num_heads))
    slopes = [2.0 ** (-8.0 * (i + 1) / n) for i in range(n)]
    return slopes + [2.0 ** (-4.0 * (2 * i + 1) / n) for i in range(num_heads - n)]


def masked_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, pattern: AttentionPattern,
                     is_causal: bool = True, enable_gqa: bool = False) -> torch.Tensor:
    """SDPA over (B, H, T, D) query and (B, Hkv, S, D) key/value with ``pattern``'s window, sinks and
    ALiBi bias; returns (B, H, T, D). The causal mask is bottom-right aligned (query i at position
    ``i + S - T``), as FlashAttention-2's.

    Raises:
        ValueError: a window or sinks without ``is_causal``.
    """
    if has_torch_function((query, key, value)):  # the tracer's FusedKernels (any torch-function mode)
        return handle_torch_function(masked_attention, (query, key, value), query, key, value, pattern,
                                     is_causal=is_causal, enable_gqa=enable_gqa)
    if (pattern.window or pattern.sinks) and not is_causal:
        raise ValueError("masked_attention: a sliding window is causal; is_causal must be true")
    t, s = query.shape[-2], key.shape[-2]
    pos = torch.arange(t, device=query.device)[:, None] + (s - t)  # (T, 1)
    j = torch.arange(s, device=query.device)[None, :]  # (1, S)
    allowed = j <= pos if is_causal else torch.ones(t, s, dtype=torch.bool, device=query.device)
    if pattern.window:
        allowed = allowed & ((j > pos - pattern.window) | (j < pattern.sinks))
    bias = torch.zeros(t, s, device=query.device).masked_fill(~allowed, float("-inf"))  # (T, S)
    if pattern.alibi:
        slopes = torch.tensor(alibi_slopes(query.shape[-3]), device=query.device)[:, None, None]
        bias = bias + slopes * (j - pos).float()  # (H, T, S)
    return F.scaled_dot_product_attention(query, key, value, attn_mask=bias.to(query.dtype),
                                          enable_gqa=enable_gqa)
