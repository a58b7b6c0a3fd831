"""Link utilisation: the busiest links of a run as filled step lines over time.

A link is any object with ``name``, ``nominal_capacity`` (bytes/s), ``timeline`` -- a step function
``[(t_s, bytes_per_s), ...]`` whose value holds until the next point (zero before the first) -- and
optionally ``carried`` (bytes). ``hwmodel.fluid.Resource`` is one; plain namespaces do as well. Which
links are busiest is decided by :func:`scenarios.metrics.link_groups` (the text report's and the JSON's
ranking, links of equal load as one group); this module only draws.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import matplotlib
from matplotlib.figure import Figure

from plots.gantt import TIME_UNITS
from scenarios.metrics import link_groups

__all__ = ["plot_link_utilisation"]


def plot_link_utilisation(links: Iterable[Any], path: str | Path, *, top: int = 8, title: str = "",
                          end_time_s: float | None = None, time_unit: str = "ms",
                          dpi: int = 120) -> list[str]:
    """Plot the ``top`` busiest links' utilisation (percent of nominal capacity) over time.

    Args:
        links: link objects (see module doc).
        path: PNG to write.
        top: how many groups of links (busiest by mean utilisation; links of equal load are one panel).
        title: figure title.
        end_time_s: end of the x axis (s); default the last timeline point of any link.
        time_unit: ``s``, ``ms`` or ``us``.
        dpi: PNG resolution.

    Returns:
        The names of the links drawn (a group's first), busiest first.
    """
    if time_unit not in TIME_UNITS:
        raise ValueError(f"time_unit must be one of {sorted(TIME_UNITS)}, got {time_unit!r}")
    scale = TIME_UNITS[time_unit]
    links = list(links)
    if end_time_s is None:
        end_time_s = max((lk.timeline[-1][0] for lk in links if lk.timeline), default=0.0)
    by_name = {lk.name: lk for lk in links}
    # one panel per group of links with the same load, as the text report's "name (+k)" rows: a large run's
    # symmetric traffic filled every panel with the same picture
    rows = [(name, count, carried, mean) for name, count, carried, mean, _peak in
            link_groups(links, end_time_s or 1.0, top) if carried > 0]

    # One lane per link (small multiples, filled): overlapping step lines of many links are unreadable.
    n = max(len(rows), 1)
    fig = Figure(figsize=(12, 1.0 + 0.75 * n), layout="constrained")
    axes = fig.subplots(n, 1, sharex=True, squeeze=False)[:, 0]
    cmap = matplotlib.colormaps["tab10"]
    for k, (name, count, carried, mean) in enumerate(rows):
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
        more = f" (+{count - 1} alike)" if count > 1 else ""
        ax.text(1.005, 0.5, f"{name}{more}\n{cap / 1e9:g} GB/s, {carried / 1e9:.3g} GB, mean {100 * mean:.0f} %",
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

