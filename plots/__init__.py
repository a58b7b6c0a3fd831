"""Figures and trace export from a run's plain outputs (event lists, link timelines, result rows).

Nothing here knows how results were computed or imports SimPy; every function takes plain objects.
Matplotlib is used through ``matplotlib.figure.Figure`` only (no pyplot, no global state), writing PNGs.

* :func:`plot_gantt` -- timeline per (GPU, stream).
* :func:`plot_link_utilisation` -- link load (ranked by :func:`scenarios.metrics.busiest_links`).
* :func:`plot_breakdown` -- compute / exposed communication / bubble / idle per GPU.
* :func:`plot_sweep` -- a metric against a swept parameter.
* :func:`to_chrome_trace`, :func:`write_chrome_trace`, :func:`write_per_rank_traces` -- Kineto-compatible
  Chrome trace JSON (Perfetto, chrome://tracing, HTA).
"""

from plots.bars import plot_breakdown
from plots.chrome_trace import to_chrome_trace, write_chrome_trace, write_per_rank_traces
from plots.gantt import GanttInfo, plot_gantt
from plots.links import plot_link_utilisation
from plots.sweep import plot_sweep

__all__ = [
    "GanttInfo",
    "plot_breakdown",
    "plot_gantt",
    "plot_link_utilisation",
    "plot_sweep",
    "to_chrome_trace",
    "write_chrome_trace",
    "write_per_rank_traces",
]
