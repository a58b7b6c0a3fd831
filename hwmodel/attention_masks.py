"""Which keys a masked attention pass scores: causal sliding windows, attention sinks, ALiBi's bias.

Closed forms for the useful work (:func:`attended_keys`) and the key blocks a FlashAttention-2 style
kernel runs (:func:`attention_key_blocks`), read by :mod:`hwmodel.costmodel` and by ``workload.trace``
(the executed FLOPs it hands over). Definitions: a window of ``W`` keys counts the query itself
(Hugging Face Mistral's ``sliding_window``: key j is visible from query i when ``i - W < j <= i``;
FlashAttention's ``window_size = (W - 1, 0)``); sinks are StreamingLLM's (Xiao et al. 2023,
arXiv:2309.17453): the first N keys stay visible to every query.
"""

from __future__ import annotations

import math

ALIBI_FLOPS_PER_SCORE = 2.0
"""CUDA-core FP32 FLOPs ALiBi adds per computed score, each pass: one fused multiply-add of the head's
slope by the key index onto the score, in registers (FlashAttention-2 ``flash::Alibi::apply_alibi``,
``csrc/flash_attn/src/alibi.h``; the backward recomputes the scores, so it adds them again)."""


def attended_keys(seq_q: int, seq_kv: int, *, causal: bool = True, window: int = 0, sinks: int = 0) -> int:
    """Query-key pairs an attention pass scores usefully, summed over the queries (closed form).

    Query row p (0-based) sits at position ``pos = p + seq_kv - seq_q`` (bottom-right aligned, as the
    causal masks of FlashAttention-2 and SDPA) and sees the ``pos + 1`` keys up to itself; with a causal
    sliding window of ``W`` keys (counting itself) and ``N`` attention sinks (StreamingLLM, Xiao et al.
    2023, arXiv:2309.17453: the first N keys stay visible), the keys ``[pos - W + 1, pos]`` and
    ``[0, N)``, i.e. ``min(pos + 1, W + N)``. Summed: ``c(seq_kv) - c(seq_kv - seq_q)`` with
    ``c(n) = sum_{x=1..n} min(x, W + N)``. Non-causal: ``seq_q * seq_kv``.

    Raises:
        ValueError: a window or sinks without a causal mask, or negative values.
    """
    if window < 0 or sinks < 0 or (sinks and not window):
        raise ValueError(f"attention window={window}, sinks={sinks}: need window >= 0, sinks >= 0 and "
                         f"sinks only with a window")
    if not causal:
        if window:
            raise ValueError("a sliding window is modelled for causal attention only")
        return seq_q * seq_kv
    cap = min(window + sinks, seq_kv) if window else seq_kv

    def c(n: int) -> int:
        n = max(n, 0)
        return n * (n + 1) // 2 if n <= cap else cap * (cap + 1) // 2 + (n - cap) * cap

    return c(seq_kv) - c(seq_kv - seq_q)


def attention_key_blocks(seq_q: int, seq_kv: int, block: int, *, causal: bool, window: int = 0,
                         sinks: int = 0) -> int:
    """Key-block iterations of one (batch, head), summed over its ``block``-row query blocks: the blocks
    a FlashAttention-2 style kernel computes, skipping those wholly masked (tile granularity ``block``:
    a partly masked block is computed in full).

    No window: every block, or for causal the blocks on and below the (bottom-right aligned) diagonal.
    With a window ``W`` (and ``N`` sinks), query block i, positions ``[lo, hi]``, runs the key blocks
    from the one holding ``lo - W + 1`` to the one holding ``hi``, plus the ``ceil(N / block)`` sink
    blocks before them; at least one block each (the kernel's prologue writes its output)."""
    n_q, n_kv = math.ceil(seq_q / block), math.ceil(seq_kv / block)
    if not window:
        if causal:  # bottom-right aligned mask: query block i sees n_kv - n_q + i + 1 key blocks
            return sum(max(min(n_kv, n_kv - n_q + i + 1), 1) for i in range(n_q))
        return n_q * n_kv
    attended_keys(seq_q, seq_kv, causal=causal, window=window, sinks=sinks)  # checks the arguments
    off, sink_blocks, iters = seq_kv - seq_q, math.ceil(sinks / block), 0
    for i in range(n_q):
        lo, hi = off + i * block, off + min((i + 1) * block, seq_q) - 1
        if hi < 0:
            iters += 1
            continue
        first = max(0, lo - window + 1) // block
        last = min(hi // block, n_kv - 1)
        iters += max(last - first + 1, 1) + min(sink_blocks, first)
    return iters
