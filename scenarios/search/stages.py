"""Uneven pipeline stages the search tries: the balanced ``(first, last)`` layer counts of the end stages.

Megatron-LM sets them with ``--decoder-first-pipeline-num-layers`` / ``--decoder-last-pipeline-num-layers``
(Megatron-Core's ``TransformerConfig.num_layers_in_first/last_pipeline_stage``); the middle stages split
the rest evenly, every stage holds at least one layer, and with ``vpp`` model chunks per stage every
stage's count is a multiple of ``vpp`` (each chunk an equal share). ``ParallelConfig.stage_layers`` checks
the same rules, so every split here is one ``trainsim run`` takes. A split is ``(first, last)`` with ``0``
for an end that takes the middle stages' count, ``(0, 0)`` for an even split.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["balanced_ends", "end_splits"]


def balanced_ends(num_layers: int, pp: int) -> tuple[int, int]:
    """(first, last) stage layers when ``pp`` does not divide ``num_layers``: the middle stages take
    ``ceil(num_layers / pp)`` layers each, the first and last share the rest (the first the smaller
    half, as it also holds the embedding); ``(0, 0)`` if that leaves an end stage without a layer."""
    if pp < 2 or num_layers % pp == 0:
        return 0, 0
    per = -(-num_layers // pp)
    rest = num_layers - (pp - 2) * per
    first, last = rest // 2, rest - rest // 2
    return (first, last) if first >= 1 else (0, 0)


def end_splits(num_layers: int, pp: int, vpp: int = 1) -> list[tuple[int, int]]:
    """The balanced ``(first, last)`` splits of ``num_layers`` over ``pp`` stages, each once:

    * as even as the layers allow: every stage takes ``floor(L / pp)`` or ``ceil(L / pp)`` layers, the
      ends smaller or larger than the middle (5 layers on 4 stages: 2/1/1/1 and 1/1/1/2);
    * Megatron recipes' split for the LM head and loss on the last stage: the last stage one layer
      fewer than the middle ones, the first taking the rest within one layer of them (32 layers on 4
      stages: 9/8/8/7; Llama 3 405B's 126 on 16: 7/8 x 14/7, Dubey et al. 2024 §3.3.2);
    * :func:`balanced_ends` (the middle stages ``ceil(L / pp)``, the ends sharing the rest; 105 layers
      on 8 stages: 10/14 x 6/11), the search's only split before.

    Interleaved (``vpp`` chunks per stage): only the first kind, in groups of ``vpp`` layers (126 layers
    on 16 stages of 2 chunks: 6/8 x 15 and 8 x 15/6); a split that moves a whole group per chunk off an
    even one would be far from balanced.

    At most a few splits per depth (126 layers: two at PP 2 and 4, one deeper), so the space grows
    little. ``[(0, 0)]`` when ``pp`` is 1 or no split exists (``ParallelConfig`` then says why)."""
    if vpp > 1:
        if num_layers % vpp:
            return [(0, 0)]
        return [(f * vpp, last * vpp) for f, last in _splits(num_layers // vpp, pp, recipes=False)]
    return _splits(num_layers, pp, recipes=True)


def _splits(num_layers: int, pp: int, *, recipes: bool) -> list[tuple[int, int]]:
    """:func:`end_splits` without chunks; ``recipes``: also the last-stage-one-fewer and
    :func:`balanced_ends` splits."""
    if pp < 2 or num_layers < pp:
        return [(0, 0)]
    lo, hi = num_layers // pp, -(-num_layers // pp)
    lists: list[tuple[int, ...]] = []
    for mid in dict.fromkeys((lo, hi)):
        rest = num_layers - (pp - 2) * mid
        ends = [(f, rest - f) for f in (lo, hi) if rest - f in (lo, hi)]  # as even as it gets
        if recipes and mid - 1 >= 1 and abs(rest - (mid - 1) - mid) <= 1:  # the last stage one layer fewer
            ends.append((rest - (mid - 1), mid - 1))
        lists += [(f, *[mid] * (pp - 2), last) for f, last in ends if f >= 1 and last >= 1]
    first, last = balanced_ends(num_layers, pp)
    if recipes and first:
        lists.append((first, *[-(-num_layers // pp)] * (pp - 2), last))
    return list(dict.fromkeys(_as_ends(n) for n in lists)) or [(0, 0)]


def _as_ends(stages: Sequence[int]) -> tuple[int, int]:
    """``(first, last)`` of a stage list whose middle stages are equal: ``(0, 0)`` when all are, else each
    end that differs from the middle (both ends with two stages)."""
    if len(set(stages)) == 1:
        return 0, 0
    if len(stages) == 2:
        return stages[0], stages[1]
    mid = stages[1]
    return (stages[0] if stages[0] != mid else 0), (stages[-1] if stages[-1] != mid else 0)
