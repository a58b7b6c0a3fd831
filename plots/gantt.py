"""Timeline (Gantt) PNG of a run: one lane per (GPU, stream), GPU 0 on top.

Bars are coloured by what ran: compute kernels in blues (GEMM), greens (attention) and pinks (other
kinds: a hue far from the GEMM blues), forward light and backward dark; the hierarchical mode's layer
passes (one bar for a whole layer's kernels and its tensor-parallel collectives, timed once in detail:
``scenarios.hierarchical``) in browns, so they do not read as "other" kernels; NCCL collectives in oranges
and reds; send/recv in purples; copies in grey; optimizer kernels olive. Idle time is the pale lane
background showing through, so pipeline bubbles are gaps, and a collective overlapped with compute
shows on its comm lane under the compute lane of the same GPU.

A communication task is drawn solid from when its data started to move (``xfer_start_s``); the time
before, when it was posted but waited for its peers (a receive posted early, a collective waiting for
the slowest rank), is drawn faint and hatched, so waiting does not read as communication.

Fast for big traces: one ``broken_barh`` per (lane, colour) with ``linewidth=0`` (20 000 bars render
and save in well under a second). Takes plain event objects, no SimPy.
"""

from __future__ import annotations

import textwrap
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure
from matplotlib.patches import Patch

from plots.chrome_trace import stream_tids

__all__ = ["GanttInfo", "category_style", "select_ranks", "plot_gantt", "TIME_UNITS"]

TIME_UNITS = {"s": 1.0, "ms": 1e3, "us": 1e6, "µs": 1e6}
"""Seconds -> display unit factors accepted by ``time_unit``."""

_SHADES = {  # family -> (fwd, bwd, other phase)
    "gemm": ("#9ecae1", "#2171b5", "#6baed6"),
    "attention": ("#a1d99b", "#238b45", "#74c476"),
    "other compute": ("#f1b6da", "#c51b7d", "#de77ae"),  # pinks: teals read as the GEMM blues
    "layer pass (kernels + TP comm)": ("#dfc27d", "#8c510a", "#bf812d"),  # browns: hierarchical macro tasks
}
_FAMILY_OF = {"gemm": "gemm", "attention": "attention", "macro": "layer pass (kernels + TP comm)"}
"""Kernel kind -> colour family; every other kind is "other compute"."""
_NCCL = {
    "all_reduce": "#d62728",
    "reduce_scatter": "#e6550d",
    "all_gather": "#fd8d3c",
    "all_to_all": "#a50f15",
    "broadcast": "#fdae6b",
    "reduce": "#f16913",
}
_FIXED = {
    "optimizer": "#bcbd22",
    "send": "#6a51a3",
    "recv": "#9e9ac8",
    "memcpy": "#969696",
}
TITLE_WRAP_CHARS = 95
"""A title longer than this (characters) wraps onto further lines: the figure is 13 inches wide and a
longer single line ran off both edges."""
_WAIT_ALPHA = 0.35
"""Opacity of the waiting part of a communication task."""
_LEGEND_ORDER = (
    [f"{fam} {ph}" for fam in _SHADES for ph in ("fwd", "bwd", "other")]
    + ["optimizer"] + [f"nccl {op}" for op in _NCCL] + ["nccl other", "send", "recv", "memcpy"]
)


def category_style(category: str, phase: str = "") -> tuple[str, str]:
    """Legend label and colour for an event's ``category`` (kernel kind, ``nccl:<op>``, ``send``,
    ``recv`` or ``memcpy``) and ``phase`` (fwd, bwd, opt, ...)."""
    if category.startswith("nccl:"):
        op = category[5:]
        if op in _NCCL:
            return f"nccl {op}", _NCCL[op]
        return "nccl other", "#ff7f0e"
    if category in ("send", "recv", "memcpy"):
        return category, _FIXED[category]
    if category == "optimizer" or phase == "opt":
        return "optimizer", _FIXED["optimizer"]
    family = _FAMILY_OF.get(category, "other compute")
    fwd, bwd, other = _SHADES[family]
    if phase == "fwd":
        return f"{family} fwd", fwd
    if phase == "bwd":
        return f"{family} bwd", bwd
    return f"{family} other", other


def select_ranks(ranks: Sequence[int], max_ranks: int) -> list[int]:
    """At most ``max_ranks`` of the sorted ``ranks``: the first half and the last half (so the first
    and last pipeline stages are both visible)."""
    ranks = sorted(ranks)
    if max_ranks <= 0 or len(ranks) <= max_ranks:
        return ranks
    head = (max_ranks + 1) // 2
    return ranks[:head] + ranks[len(ranks) - (max_ranks - head):]


def _ranges_label(ranks: Sequence[int]) -> str:
    """``[0, 1, 2, 5, 6]`` -> ``"0-2, 5-6"``."""
    parts: list[str] = []
    start = prev = None
    for r in ranks:
        if start is None:
            start = prev = r
        elif r == prev + 1:
            prev = r
        else:
            parts.append(f"{start}" if start == prev else f"{start}-{prev}")
            start = prev = r
    if start is not None:
        parts.append(f"{start}" if start == prev else f"{start}-{prev}")
    return ", ".join(parts)


@dataclass
class GanttInfo:
    """What :func:`plot_gantt` drew."""

    path: Path
    """The PNG written."""
    lanes: list[tuple[int, str]]
    """(rank, stream) of each lane, top to bottom."""
    ranks_shown: list[int]
    """Ranks with lanes (a subset when the run has more than ``max_ranks``)."""
    n_bars: int
    """Events drawn."""
    groups: list[str] = field(default_factory=list)
    """Legend labels (colour groups present), in legend order."""

    @property
    def n_lanes(self) -> int:
        return len(self.lanes)


def plot_gantt(events: Iterable[Any], path: str | Path, *, ranks: Iterable[int] | None = None,
               max_ranks: int = 16, title: str = "", time_unit: str = "ms", dpi: int = 120,
               t_range_s: tuple[float, float] | None = None) -> GanttInfo:
    """Draw the run's timeline to a PNG.

    Args:
        events: ``TraceEvent``-like objects (``rank``, ``stream``, ``category``, ``start_s``, ``end_s``,
            ``phase``; seconds).
        path: PNG file to write (parent directories are created).
        ranks: ranks to show (default: all ranks with events, capped by ``max_ranks``).
        max_ranks: show at most this many ranks, the first and last ones; the title says which.
        title: figure title.
        time_unit: x-axis unit: ``s``, ``ms`` or ``us``.
        dpi: PNG resolution.
        t_range_s: (start, end) window in seconds to show (default: the whole run).

    Returns:
        :class:`GanttInfo` (lanes, ranks shown, bar count, legend groups).
    """
    if time_unit not in TIME_UNITS:
        raise ValueError(f"time_unit must be one of {sorted(TIME_UNITS)}, got {time_unit!r}")
    scale = TIME_UNITS[time_unit]
    evs = list(events)
    all_ranks = sorted({e.rank for e in evs})
    wanted = sorted(set(ranks)) if ranks is not None else all_ranks
    shown = select_ranks(wanted, max_ranks)
    lanes = _lanes(evs, shown)
    bars = _bars(evs, {lane: i for i, lane in enumerate(lanes)}, scale)

    n = max(len(lanes), 1)
    fig = Figure(figsize=(13, min(2.0 + 0.32 * n, 40)), layout="constrained")
    ax = fig.add_subplot()
    x_max = bars.t_end_s * scale if bars.t_end_s > 0 else 1.0
    _draw_lanes(ax, lanes, bars, x_max, all_ranks)
    ax.set_yticks(range(len(lanes)), [f"GPU {r} {s}" for r, s in lanes], fontsize=8 if n > 24 else 9)
    ax.set_ylim(len(lanes) - 0.5, -0.5)  # GPU 0 on top
    if t_range_s is not None:
        ax.set_xlim(t_range_s[0] * scale, t_range_s[1] * scale)
    else:
        ax.set_xlim(0, x_max * 1.005)
    ax.set_xlabel(f"time ({time_unit})")
    ax.grid(axis="x", color="#dddddd", linewidth=0.5, zorder=1)
    ax.set_axisbelow(True)

    full_title = title or "Timeline"
    if len(shown) < len(wanted):
        full_title += f"  (GPUs {_ranges_label(shown)} of {len(wanted)} shown)"
    ax.set_title("\n".join(textwrap.wrap(full_title, TITLE_WRAP_CHARS)) or full_title)
    groups = _legend(ax, bars)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    return GanttInfo(path=path, lanes=lanes, ranks_shown=shown, n_bars=bars.n_bars, groups=groups)


def _lanes(evs: Sequence[Any], shown: Sequence[int]) -> list[tuple[int, str]]:
    """(rank, stream) lanes of the ``shown`` ranks, top to bottom: by rank, then by stream tid."""
    tids = stream_tids(e.stream for e in evs)
    shown_set = set(shown)
    streams_of: dict[int, set[str]] = defaultdict(set)
    for e in evs:
        if e.rank in shown_set:
            streams_of[e.rank].add(e.stream)
    return [(r, s) for r in shown for s in sorted(streams_of.get(r, ()), key=lambda s: tids[s])]


@dataclass
class _Bars:
    """Bars to draw, by (lane index, colour group): ``(start, width)`` in display units."""

    solid: dict[tuple[int, str], list[tuple[float, float]]] = field(default_factory=lambda: defaultdict(list))
    waits: dict[tuple[int, str], list[tuple[float, float]]] = field(default_factory=lambda: defaultdict(list))
    """The time communication tasks spent waiting for their peers before data moved."""
    colours: dict[str, str] = field(default_factory=dict)
    n_bars: int = 0
    t_end_s: float = 0.0


def _bars(evs: Iterable[Any], lane_index: dict[tuple[int, str], int], scale: float) -> _Bars:
    """The bars of the events on the lanes in ``lane_index``; times multiplied by ``scale``."""
    out = _Bars()
    for e in evs:
        i = lane_index.get((e.rank, e.stream))
        if i is None:
            continue
        label, colour = category_style(e.category, getattr(e, "phase", "") or "")
        out.colours[label] = colour
        moved = getattr(e, "xfer_start_s", None)
        start = e.start_s
        if moved is not None and e.start_s < moved <= e.end_s:
            out.waits[(i, label)].append((e.start_s * scale, (moved - e.start_s) * scale))
            start = moved
        out.solid[(i, label)].append((start * scale, (e.end_s - start) * scale))
        out.n_bars += 1
        out.t_end_s = max(out.t_end_s, e.end_s)
    return out


def _draw_lanes(ax: Any, lanes: list[tuple[int, str]], bars: _Bars, x_max: float, all_ranks: list[int]) -> None:
    """Lane backgrounds, the bars, and lines between GPUs (thick, dashed, red where ranks were left out)."""
    # Pale lane backgrounds: idle time (bubbles) shows as gaps in the colour.
    for i in range(len(lanes)):
        ax.broken_barh([(0.0, x_max)], (i - 0.42, 0.84), facecolors="#f2f2f2", linewidth=0, zorder=0)
    for (i, label), xr in bars.waits.items():
        ax.broken_barh(xr, (i - 0.25, 0.5), facecolors=bars.colours[label], alpha=_WAIT_ALPHA, hatch="////",
                       edgecolor="white", linewidth=0, zorder=2)
    for (i, label), xr in bars.solid.items():
        ax.broken_barh(xr, (i - 0.4, 0.8), facecolors=bars.colours[label], linewidth=0, zorder=2)
    pos = {r: k for k, r in enumerate(all_ranks)}
    for i in range(1, len(lanes)):
        prev, cur = lanes[i - 1][0], lanes[i][0]
        if cur != prev:
            skipped = pos[cur] - pos[prev] > 1
            ax.axhline(i - 0.5, color="#c00000" if skipped else "#555555", linewidth=1.6 if skipped else 0.6,
                       linestyle="--" if skipped else "-", zorder=3)


def _legend(ax: Any, bars: _Bars) -> list[str]:
    """Draw the legend of the colour groups present (and of waiting, if any); returns the groups."""
    groups = [g for g in _LEGEND_ORDER if g in bars.colours]
    if groups:
        handles = [Patch(facecolor=bars.colours[g], label=g) for g in groups]
        if bars.waits:
            handles.append(Patch(facecolor="#888888", alpha=_WAIT_ALPHA, hatch="////", edgecolor="white",
                                 label="waiting for peers\n(posted, no data moving)"))
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8,
                  frameon=False)
    return groups
