"""How much of a stage's data-parallel bucket traffic hides behind its passes, with model chunks."""

from __future__ import annotations

import math


def chunked_exposed(total_s: float, last_s: float, t_pass_s: float, vpp: int, pp: int) -> float:
    """Seconds of ``total_s`` of bucket collectives on one stream left exposed after the stage's passes.

    Args:
        total_s: all the stage's gradient reductions (or parameter all-gathers), seconds.
        last_s: the last bucket's (the first gather's), which nothing hides.
        t_pass_s: one micro-batch's backward (forward) of the stage, all its chunks.
        vpp: model chunks per stage; pp: pipeline stages.

    Megatron-Core keeps one DDP grad buffer per model chunk and launches a chunk's buckets during its
    last micro-batch's backward (with ``overlap_param_gather``, its gathers before its first forward).
    The interleaved 1F1B schedule (Narayanan et al. SC'21 §2.2) runs the passes in groups of ``pp``
    micro-batches per chunk, so chunk ``k``'s reductions have ``k x pp`` chunk passes left to hide behind,
    and chunk 0's only its own last pass. Each chunk holds ``total_s / vpp`` (equal chunks). Without chunks
    this is ``max(last_s, total_s - t_pass_s)``.
    """
    t_chunk, share, end = t_pass_s / vpp, total_s / vpp, -math.inf
    for k in reversed(range(vpp)):
        done = -k * pp * t_chunk  # chunk k's last pass ends here (0: the stage's last pass ends)
        end = max(end + share, done - t_chunk + share, done + last_s)
    return max(end, 0.0)
