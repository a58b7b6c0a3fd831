"""Pipeline schedules: the order of forward and backward micro-batch passes on each stage.

A schedule is a list of :class:`Step` per stage. Sources:

* GPipe (Huang et al. 2019): all forwards, then all backwards (in reverse micro-batch order).
* 1F1B (PipeDream-Flush, Narayanan et al. SC'21 §2.2.1, Megatron-LM
  ``forward_backward_pipelining_without_interleaving``): stage *s* of *p* runs
  ``min(p - s - 1, m)`` warm-up forwards, then alternates one forward and one backward, then drains
  the remaining backwards.
* Interleaved 1F1B (SC'21 §2.2.2, Megatron-LM ``forward_backward_pipelining_with_interleaving``):
  each stage holds *v* model chunks; virtual micro-batch *k* maps to chunk ``(k // p) % v`` and
  micro-batch ``(k // (p v)) p + k % p``; warm-up is ``(p - s - 1) * 2 + (v - 1) * p`` (capped at
  ``m v``). Requires ``m % p == 0``.

With uniform stages and free communication the bubble fraction is (p-1)/(m+p-1) for GPipe and 1F1B,
and (p-1)/(v m + p - 1)... i.e. divided by *v* for the interleaved schedule (SC'21 eq. 1-2).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Step:
    """One pass of one micro-batch through one model chunk of a stage."""

    kind: str
    """``F`` (forward) or ``B`` (backward)."""
    microbatch: int
    chunk: int = 0
    """Model chunk (virtual stage) index on this stage, 0 unless interleaved."""


def gpipe(p: int, m: int, stage: int) -> list[Step]:
    """GPipe: all forwards then all backwards on ``stage`` of ``p`` with ``m`` micro-batches."""
    _check(p, m, stage)
    return [Step("F", i) for i in range(m)] + [Step("B", i) for i in reversed(range(m))]


def one_f_one_b(p: int, m: int, stage: int) -> list[Step]:
    """1F1B (PipeDream-Flush) on ``stage`` of ``p`` with ``m`` micro-batches."""
    _check(p, m, stage)
    warmup = min(p - stage - 1, m)
    steps = [Step("F", i) for i in range(warmup)]
    f, b = warmup, 0
    for _ in range(m - warmup):
        steps.append(Step("F", f))
        f += 1
        steps.append(Step("B", b))
        b += 1
    steps += [Step("B", i) for i in range(b, m)]
    return steps


def interleaved_1f1b(p: int, m: int, stage: int, v: int) -> list[Step]:
    """Interleaved 1F1B with ``v`` model chunks per stage (Megatron-LM's schedule).

    Raises:
        ValueError: ``m`` is not a multiple of ``p``.
    """
    _check(p, m, stage)
    if v < 1:
        raise ValueError(f"virtual stages must be >= 1, got {v}")
    if m % p:
        raise ValueError(f"interleaved 1F1B needs micro-batches ({m}) to be a multiple of pipeline stages ({p})")
    total = m * v
    warmup = min((p - stage - 1) * 2 + (v - 1) * p, total)

    def fwd(k: int) -> Step:
        return Step("F", (k // (p * v)) * p + k % p, (k // p) % v)

    def bwd(k: int) -> Step:
        return Step("B", (k // (p * v)) * p + k % p, v - 1 - (k // p) % v)

    steps = [fwd(k) for k in range(warmup)]
    for i in range(total - warmup):
        steps.append(fwd(warmup + i))
        steps.append(bwd(i))
    steps += [bwd(k) for k in range(total - warmup, total)]
    return steps


def interleaved_in_flight(p: int, stage: int, v: int, m: int | None = None) -> float:
    """Micro-batches' worth of forward activations stage ``stage`` holds at its peak under the interleaved
    schedule (:func:`interleaved_1f1b`), in whole-stage units (a model chunk is 1/v of the stage): its
    warm-up forwards, ``(p - stage - 1) * 2 + (v - 1) * p`` chunks (Megatron-LM's
    ``num_warmup_microbatches``), plus the first steady-state forward, capped by the ``m * v`` chunks, over
    ``v``. Stage 0 holds ``p (1 + (p - 1) / (p v))`` (Korthikanti et al. 2022, sec. 4.2.3); the last stage
    ``p - (p - 1) / v``, not the one micro-batch of plain 1F1B: its chunks' warm-up spans the other chunks."""
    chunks = (p - stage - 1) * 2 + (v - 1) * p + 1
    if m is not None:
        chunks = min(chunks, m * v)
    return chunks / v


def schedule(name: str, p: int, m: int, stage: int, v: int = 1) -> list[Step]:
    """The named schedule (gpipe, 1f1b, interleaved_1f1b) for one stage."""
    if name == "gpipe":
        return gpipe(p, m, stage)
    if name == "1f1b":
        return one_f_one_b(p, m, stage)
    if name == "interleaved_1f1b":
        return interleaved_1f1b(p, m, stage, v)
    raise ValueError(f"pipeline_schedule: unknown {name!r}; allowed: gpipe, 1f1b, interleaved_1f1b")


def recv_posts(steps: list[Step], p: int, v: int, stage: int) -> dict[int, list[int]]:
    """Where Megatron-LM's interleaved schedule with ``overlap_p2p_comm`` posts each receive of a stage:
    ``{after: [step, ...]}``, the indices of the steps whose input (``F``: activations from the
    previous virtual stage; ``B``: their gradients from the next one) is received by an ``irecv``
    posted right after step ``after`` (-1: before the first step). Steps without a receive (the
    first virtual stage's forwards, the last one's backwards) are not listed.

    Rule (``megatron/core/pipeline_parallel/schedules.py``, ``forward_backward_pipelining_with_interleaving``,
    2026-08): a forward's activations are received by the call that follows the previous forward
    (``send_forward_recv_forward`` / ``pp_post_forward``: one pass ahead in the steady state, where a
    backward runs between them; in the warm-up the call is synchronous, which is the same instant); a
    backward's gradients by the call that follows the previous backward (``pp_post_backward``), the
    first backward's by the call after the last warm-up forward (or, when every forward is in the
    warm-up, by ``recv_backward`` after it). Each is waited for just before its step (``pp_pre_forward``
    / ``pp_pre_backward``). So: after the latest earlier step of the same kind; the first forward at the
    start; the first backward after the last warm-up forward (two steps before it when a steady phase
    puts a forward between them).

    Raises:
        ValueError: a step of a kind other than ``F`` and ``B``.
    """
    posts: dict[int, list[int]] = {}
    last = {"F": -1, "B": -1}
    last_f = max((i for i, st in enumerate(steps) if st.kind == "F"), default=-1)
    for idx, st in enumerate(steps):
        if st.kind not in last:
            raise ValueError(f"step {idx}: kind must be F or B, got {st.kind!r}")
        vs = st.chunk * p + stage
        if (vs != 0) if st.kind == "F" else (vs != p * v - 1):
            if last[st.kind] >= 0 or st.kind == "F":
                after = last[st.kind]
            else:  # the first backward: after the warm-up, which a steady forward may follow
                after = idx - 1 if idx > last_f else idx - 2
            posts.setdefault(after, []).append(idx)
        last[st.kind] = idx
    return posts


def bubble_fraction(p: int, m: int, v: int = 1) -> float:
    """Ideal bubble time over ideal compute time, (p - 1) / (v m) (SC'21 §2.2), as a share of the
    iteration: (p - 1) / (v m + p - 1)."""
    return (p - 1) / (v * m + p - 1)


def _check(p: int, m: int, stage: int) -> None:
    if p < 1 or m < 1:
        raise ValueError(f"pipeline stages and micro-batches must be >= 1, got p={p}, m={m}")
    if not 0 <= stage < p:
        raise ValueError(f"stage {stage} out of range for {p} pipeline stages")
