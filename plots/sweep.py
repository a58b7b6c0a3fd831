"""Sweep curves: one metric against one parameter, a line per group (e.g. per parallel layout)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

__all__ = ["plot_sweep"]

_MARKERS = "osD^v<>ph*"


def _number(v: Any) -> float | None:
    """``v`` as a finite float, or None (missing, None, NaN, a failed run's text)."""
    if isinstance(v, bool) or v is None:
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def plot_sweep(rows: Iterable[Mapping[str, Any]], x: str, y: str, path: str | Path, *,
               group: str | None = None, xlabel: str | None = None, ylabel: str | None = None,
               logx: bool = False, title: str = "", dpi: int = 120,
               xticks: Mapping[float, str] | None = None) -> list[str]:
    """Lines with markers of ``row[y]`` against ``row[x]``, one line per value of ``row[group]``.

    Rows whose ``x`` or ``y`` is missing or not a finite number (an OOM run, say) are skipped; points are
    sorted by ``x`` within each line.

    Args:
        rows: one mapping per sweep point.
        x, y: keys of the plotted columns.
        path: PNG to write.
        group: key splitting rows into lines (default: one line).
        xlabel, ylabel: axis labels, with units (default: the key names).
        logx: logarithmic x axis (base 2 when every x is a positive power of two); up to 12 distinct x
            values are labelled with their own values.
        title: figure title.
        dpi: PNG resolution.
        xticks: x -> tick label: only these ticks, so labelled (a categorical axis: names at 0, 1, 2 ...).

    Returns:
        The line labels drawn (group values as strings), in legend order.
    """
    lines: dict[Any, list[tuple[float, float]]] = {}
    for row in rows:
        xv, yv = _number(row.get(x)), _number(row.get(y))
        if xv is None or yv is None:
            continue
        key = row.get(group) if group is not None else None
        lines.setdefault(key, []).append((xv, yv))
    # numbers by value, though spelled as text ("8" before "16"), then names
    keys = sorted(lines, key=lambda k: (_number(k) is None, _number(k) or 0.0, str(k)))

    fig = Figure(figsize=(8, 5), layout="constrained")
    ax = fig.add_subplot()
    labels = []
    for k, key in enumerate(keys):
        pts = sorted(lines[key])
        label = str(key) if group is not None else y
        labels.append(label)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=_MARKERS[k % len(_MARKERS)], markersize=5,
                linewidth=1.5, label=label)
    if logx:
        xs = [p[0] for pts in lines.values() for p in pts]
        pow2 = bool(xs) and all(v > 0 and math.log2(v).is_integer() for v in xs)
        ax.set_xscale("log", base=2 if pow2 else 10)
        ticks = sorted(set(xs))
        if 0 < len(ticks) <= 12:  # label the swept values themselves (8, 16, 32 rather than 2^3 ...)
            ax.set_xticks(ticks, [f"{v:g}" for v in ticks])
            ax.set_xticks([], minor=True)
    if xticks:
        ax.set_xticks(sorted(xticks), [xticks[v] for v in sorted(xticks)])
        ax.set_xticks([], minor=True)
        ax.margins(x=0.1)
    if not keys:
        ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
    import textwrap

    ax.set_xlabel("\n".join(textwrap.wrap(xlabel or x, 90)))
    ax.set_ylabel(ylabel or y)
    ax.grid(color="#dddddd", linewidth=0.5)
    ax.set_title(title or f"{ylabel or y} vs {xlabel or x}")
    if group is not None and keys:
        ax.legend(title=group, fontsize=8, title_fontsize=9)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    return labels
