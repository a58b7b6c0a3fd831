"""Per-GPU time breakdown as stacked bars: compute, exposed communication, pipeline bubble, idle."""

from __future__ import annotations

import textwrap
from collections.abc import Mapping
from pathlib import Path

from matplotlib.figure import Figure

__all__ = ["BREAKDOWN_KEYS", "downsample_ranks", "plot_breakdown"]

BREAKDOWN_KEYS = {
    "compute_s": ("compute", "#4878d0"),
    "exposed_comm_s": ("exposed communication", "#ee854a"),
    "bubble_s": ("pipeline bubble", "#956cb4"),
    "idle_s": ("idle", "#c8c8c8"),
}
"""Known keys (seconds) -> (legend label, colour), stacked bottom to top in this order."""

SECONDS_AXIS_FROM_S = 10.0
"""Iterations this long (seconds, the longest bar) are drawn in seconds, shorter ones in milliseconds."""

_EXTRA_COLOURS = ("#6acc64", "#d65f5f", "#8c613c", "#dc7ec0", "#82c6e2", "#d5bb67")


def downsample_ranks(ranks: list[int], max_ranks: int) -> list[int]:
    """At most ``max_ranks`` of ``ranks``, evenly spaced, always keeping the first and last."""
    ranks = sorted(ranks)
    if max_ranks <= 1 or len(ranks) <= max_ranks:
        return ranks if max_ranks > 1 or not ranks else ranks[:1]
    step = (len(ranks) - 1) / (max_ranks - 1)
    return sorted({ranks[round(i * step)] for i in range(max_ranks)})


def plot_breakdown(breakdown_per_rank: Mapping[int, Mapping[str, float]], path: str | Path, title: str = "",
                   *, max_ranks: int = 64, dpi: int = 120) -> list[int]:
    """Stacked bars of where each GPU's time went.

    Args:
        breakdown_per_rank: rank -> {``compute_s``, ``exposed_comm_s``, ``bubble_s``, ``idle_s``: seconds};
            other keys ending in ``_s`` are stacked on top in sorted order.
        path: PNG to write.
        title: figure title.
        max_ranks: draw at most this many ranks (evenly spaced, first and last kept; the title says so).
        dpi: PNG resolution.

    Returns:
        The ranks drawn.
    """
    ranks = downsample_ranks(list(breakdown_per_rank), max_ranks)
    keys = [k for k in BREAKDOWN_KEYS if any(k in breakdown_per_rank[r] for r in ranks)]
    extra = sorted({k for r in ranks for k in breakdown_per_rank[r]} - set(BREAKDOWN_KEYS))
    fig = Figure(figsize=(min(max(7.0, 4 + 0.28 * len(ranks)), 16), 4.8), layout="constrained")
    ax = fig.add_subplot()
    xs = list(range(len(ranks)))
    bottom = [0.0] * len(ranks)
    longest_s = max((sum(float(breakdown_per_rank[r].get(k, 0.0)) for k in keys + extra) for r in ranks), default=0.0)
    unit, scale = ("s", 1.0) if longest_s >= SECONDS_AXIS_FROM_S else ("ms", 1e3)
    for j, key in enumerate(keys + extra):
        default = (key.removesuffix("_s"), _EXTRA_COLOURS[j % len(_EXTRA_COLOURS)])
        label, colour = BREAKDOWN_KEYS.get(key, default)
        vals = [scale * float(breakdown_per_rank[r].get(key, 0.0)) for r in ranks]
        ax.bar(xs, vals, bottom=bottom, color=colour, label=label, width=0.8, linewidth=0)
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    step = max(1, len(ranks) // 32)
    labels = [str(r) for r in ranks[::step]]
    # long rank numbers (a 16k-GPU run's 114688, 122880) ran together when written across: stand them up
    rotate = len(labels) > 12 and max(map(len, labels)) > 3
    ax.set_xticks(xs[::step], labels, fontsize=8 if len(ranks) > 16 else 9, rotation=90 if rotate else 0)
    ax.set_xlabel("GPU (global rank)")
    ax.set_ylabel(f"time ({unit})")
    ax.grid(axis="y", color="#dddddd", linewidth=0.5)
    ax.set_axisbelow(True)
    full = title or "Time breakdown per GPU"
    if len(ranks) < len(breakdown_per_rank):
        full += f"  ({len(ranks)} of {len(breakdown_per_rank)} GPUs shown)"
    ax.set_title("\n".join(textwrap.wrap(full, 60)), fontsize=10)
    if keys or extra:
        ax.legend(loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8, frameon=False)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    return ranks
