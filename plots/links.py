"""Link utilisation: the busiest links of a run as a table and as step lines over time.

A link is any object with ``name``, ``nominal_capacity`` (bytes/s), ``timeline`` -- a step function
``[(t_s, bytes_per_s), ...]`` whose value holds until the next point (zero before the first) -- and
optionally ``carried`` (bytes). ``hwmodel.fluid.Resource`` is one; plain namespaces do as well.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import matplotlib
from matplotlib.figure import Figure

from plots.gantt import TIME_UNITS

__all__ = ["link_stats", "busiest_links", "plot_link_utilisation"]


def link_stats(timeline: Sequence[tuple[float, float]], capacity: float,
               end_time_s: float) -> tuple[float, float, float]:
    """Integrate a step function over ``[0, end_time_s]``.

    Args:
        timeline: ``[(t_s, units_per_s)]``, each value holding until the next point; 0 before the first.
        capacity: nominal capacity (units/s) the utilisation is relative to.
        end_time_s: end of the window (s); the last value holds until then.

    Returns:
        ``(units carried, mean utilisation, peak utilisation)``; utilisations are fractions of
        ``capacity`` (mean over the whole window, peak over points inside it).
    """
    total = 0.0
    peak = 0.0
    for i, (t, u) in enumerate(timeline):
        if t >= end_time_s:
            break
        t_next = timeline[i + 1][0] if i + 1 < len(timeline) else end_time_s
        total += u * (min(t_next, end_time_s) - t)
        peak = max(peak, u)
    cap = capacity if capacity > 0 else 1.0
    mean = total / (cap * end_time_s) if end_time_s > 0 else 0.0
    return total, mean, peak / cap


def busiest_links(links: Iterable[Any], top: int, end_time_s: float) -> list[tuple[str, float, float, float]]:
    """The ``top`` busiest links: highest mean utilisation (carried bytes / capacity), then most bytes.

    Args:
        links: link objects (see module doc). ``carried`` is used when present, else the timeline's
            integral.
        top: how many to return.
        end_time_s: length of the run (s), the window of the mean utilisation.

    Returns:
        ``[(name, carried_bytes, mean_utilisation, peak_utilisation)]``, busiest first (ties by bytes, name);
        utilisations are fractions 0..1 of ``nominal_capacity``.
    """
    def carried_of(lk: Any) -> float:
        c = getattr(lk, "carried", None)
        return float(c) if c is not None else link_stats(lk.timeline, float(lk.nominal_capacity), end_time_s)[0]

    # busiest = highest mean utilisation (bytes / capacity): the bottlenecks, not merely the fattest
    # pipes; timelines are integrated only for the links returned
    def key(r: tuple[float, Any]) -> tuple[float, float, str]:
        cap = float(r[1].nominal_capacity) or 1.0
        return (-r[0] / cap, -r[0], r[1].name)

    ranked = sorted(((carried_of(lk), lk) for lk in links), key=key)[:max(top, 0)]
    rows = []
    for carried, lk in ranked:
        _, mean, peak = link_stats(lk.timeline, float(lk.nominal_capacity), end_time_s)
        rows.append((lk.name, carried, mean, peak))
    return rows


def plot_link_utilisation(links: Iterable[Any], path: str | Path, *, top: int = 8, title: str = "",
                          end_time_s: float | None = None, time_unit: str = "ms",
                          dpi: int = 120) -> list[str]:
    """Plot the ``top`` busiest links' utilisation (percent of nominal capacity) over time.

    Args:
        links: link objects (see module doc).
        path: PNG to write.
        top: how many links (busiest by mean utilisation).
        title: figure title.
        end_time_s: end of the x axis (s); default the last timeline point of any link.
        time_unit: ``s``, ``ms`` or ``us``.
        dpi: PNG resolution.

    Returns:
        The names of the links drawn, busiest first.
    """
    if time_unit not in TIME_UNITS:
        raise ValueError(f"time_unit must be one of {sorted(TIME_UNITS)}, got {time_unit!r}")
    scale = TIME_UNITS[time_unit]
    links = list(links)
    if end_time_s is None:
        end_time_s = max((lk.timeline[-1][0] for lk in links if lk.timeline), default=0.0)
    by_name = {lk.name: lk for lk in links}
    rows = [r for r in busiest_links(links, top, end_time_s or 1.0) if r[1] > 0]

    # One lane per link (small multiples, filled): overlapping step lines of many links are unreadable.
    n = max(len(rows), 1)
    fig = Figure(figsize=(12, 1.0 + 0.75 * n), layout="constrained")
    axes = fig.subplots(n, 1, sharex=True, squeeze=False)[:, 0]
    cmap = matplotlib.colormaps["tab10"]
    for k, (name, carried, mean, _peak) in enumerate(rows):
        ax = axes[k]
        lk = by_name[name]
        cap = float(lk.nominal_capacity) or 1.0
        ts = [0.0] + [t * scale for t, _ in lk.timeline] + [end_time_s * scale]
        us = [0.0] + [100.0 * u / cap for _, u in lk.timeline]
        us.append(us[-1])
        ax.fill_between(ts, us, step="post", color=cmap(k % 10), alpha=0.85, linewidth=0)
        ax.set_ylim(0, 105)
        ax.set_yticks([0, 50, 100])
        ax.tick_params(labelsize=7)
        ax.grid(color="#dddddd", linewidth=0.5)
        ax.text(1.005, 0.5, f"{name}\n{cap / 1e9:g} GB/s, {carried / 1e9:.3g} GB, mean {100 * mean:.0f} %",
                transform=ax.transAxes, fontsize=8, va="center", ha="left")
    if not rows:
        axes[0].text(0.5, 0.5, "no link traffic", ha="center", va="center", transform=axes[0].transAxes)
    axes[-1].set_xlim(0, max(end_time_s * scale, 1e-12))
    axes[-1].set_xlabel(f"time ({time_unit})")
    fig.supylabel("utilisation (% of capacity)", fontsize=9)
    fig.suptitle(_wrap(title or f"Busiest {len(rows)} links (by mean utilisation)"), fontsize=11)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    return [r[0] for r in rows]


def _wrap(text: str, width: int = 90) -> str:
    import textwrap

    return "\n".join(textwrap.wrap(text, width)) or text

