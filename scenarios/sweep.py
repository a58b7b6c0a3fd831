"""Parameter sweeps: a scenario run at every point of a cartesian product of varied keys.

A sweep varies scenario keys, named as for ``--set`` (``section.key``, nested tables with more dots:
``system.gpu_overrides.nvlink_links``). On the command line::

    trainsim sweep default --vary parallel.tensor_model_parallel_size=2,4,8 --vary training.micro_batch_size=1,2

or in a *sweep file*: a scenario TOML with a ``[sweep]`` table::

    [sweep]
    x_label = "NIC bandwidth (Gb/s)"      # optional: x-axis label of the plot
    x_values = [200, 400, 800]            # optional: plotted x for the first varied key's values
    [sweep.vary]                          # key -> values, tried in this order
    "system.nic" = ["ConnectX-6-HDR", "ConnectX-7-NDR", "ConnectX-8-XDR"]

Points are the cartesian product with the first varied key outermost, in the order given; results
come back in that order whatever the number of worker processes. A point that does not fit in GPU
memory is not simulated (its row says OOM); a point whose configuration is invalid carries its error.
"""

from __future__ import annotations

import copy
import itertools
import math
import sys
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from scenarios.catalog import (  # the catalog's names stay importable from here (__all__)
    catalog_dir,
    catalog_entries,
    catalog_names,
    display_source,
    is_sweep_file,
    scenario_path,
)
from scenarios.runner import DEFAULT_MAX_TASKS, memory_for, prepare, run_prepared
from scenarios.scenario import DEFAULT_SCENARIO, apply_overrides, parse_scenario, read_toml_file

__all__ = [
    "SWEEP_KEYS", "Sweep", "catalog_dir", "catalog_entries", "catalog_names", "display_source", "format_rows",
    "is_sweep_file", "load_sweep", "parse_vary", "plot_rows", "run_point", "run_sweep", "x_axis",
]

SWEEP_KEYS = ("vary", "x_label", "x_values")
"""Keys allowed in a ``[sweep]`` table."""


# ----------------------------------------------------------------------------------------------------
# Describing a sweep


def _toml_value(raw: str) -> Any:
    raw = raw.strip()
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw


def parse_vary(text: str) -> tuple[str, list[Any]]:
    """``"parallel.tensor_model_parallel_size=2,4,8"`` -> ``("parallel.tensor_model_parallel_size", [2, 4, 8])``.

    Each value is read as TOML (numbers, booleans, quoted strings), anything else as a plain string.

    Raises:
        ValueError: not of the form ``section.key=v1,v2,...``.
    """
    if "=" not in text:
        raise ValueError(f"--vary {text!r}: expected section.key=v1,v2,..., e.g. system.nodes=1,2,4")
    key, raw = text.split("=", 1)
    key = key.strip()
    if "." not in key or not all(key.split(".")):
        raise ValueError(f"--vary {text!r}: the key must be section.key, e.g. system.nodes")
    values = [_toml_value(v) for v in raw.split(",") if v.strip()]
    if not values:
        raise ValueError(f"--vary {text!r}: no values")
    return key, values


@dataclass
class Sweep:
    """A base scenario (as TOML data) and the keys to vary."""

    base: dict[str, Any]
    """The scenario's TOML data, without the ``[sweep]`` table."""
    vary: list[tuple[str, list[Any]]]
    """(dotted key, values) in order; the first key is the outermost loop and the plot's x axis."""
    source: str = ""
    x_label: str | None = None
    x_values: list[float] | None = None
    """Plotted x for the first key's values (for keys whose values are names)."""

    @property
    def name(self) -> str:
        return str(self.base.get("name") or (Path(self.source).stem if self.source else "sweep"))

    @property
    def keys(self) -> list[str]:
        return [k for k, _ in self.vary]

    def points(self) -> list[dict[str, Any]]:
        """Every point as ``{key: value}``, first key outermost."""
        return [dict(zip(self.keys, combo, strict=True)) for combo in itertools.product(*(v for _, v in self.vary))]


def _check_sweep_table(table: Any, where: str) -> tuple[list[tuple[str, list[Any]]], str | None, list | None]:
    if not isinstance(table, dict):
        raise ValueError(f"{where}: [sweep] must be a table")
    unknown = sorted(set(table) - set(SWEEP_KEYS))
    if unknown:
        raise ValueError(f"{where}: [sweep] unknown key(s) {', '.join(unknown)}; allowed: {', '.join(SWEEP_KEYS)}")
    vary = table.get("vary", {})
    if not isinstance(vary, dict):
        raise ValueError(f"{where}: [sweep] vary must be a table of \"section.key\" = [values]")
    items = []
    for k, v in vary.items():
        if "." not in k:
            raise ValueError(f"{where}: [sweep.vary] key {k!r} must be section.key (quote it: \"system.nic\")")
        if not isinstance(v, list) or not v:
            raise ValueError(f"{where}: [sweep.vary] {k} must be a non-empty list of values")
        items.append((k, v))
    x_label = table.get("x_label")
    if x_label is not None and not isinstance(x_label, str):
        raise ValueError(f"{where}: [sweep] x_label must be a string")
    x_values = table.get("x_values")
    if x_values is not None:
        if not isinstance(x_values, list) or not all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                                      for x in x_values):
            raise ValueError(f"{where}: [sweep] x_values must be a list of numbers")
        if not items or len(x_values) != len(items[0][1]):
            raise ValueError(f"{where}: [sweep] x_values needs one number per value of the first varied key")
    return items, x_label, x_values


def load_sweep(name: str | None, vary: Sequence[str] = (), overrides: Sequence[str] = ()) -> Sweep:
    """The sweep of a scenario or sweep file (a path or catalog name; ``None``: the default scenario).

    ``vary`` (``--vary`` texts) add keys, or replace a sweep file's values of the same key; ``overrides``
    (``--set`` texts) change the base scenario.

    Raises:
        FileNotFoundError, ValueError: missing file, malformed TOML, bad ``[sweep]`` table, nothing to vary.
    """
    if name is None:
        data, source = tomllib.loads(DEFAULT_SCENARIO), "<default>"
    else:
        path = scenario_path(name)
        if not path.exists() and Path(name).suffix != ".toml" and "/" not in name:
            raise ValueError(f"no scenario file or catalog scenario {name!r}; catalog: {', '.join(catalog_names())}")
        data, source = read_toml_file(path), str(path)
    items, x_label, x_values = _check_sweep_table(data.pop("sweep", {}), source)
    given: set[str] = set()
    for text in vary:
        key, values = parse_vary(text)
        if key in given:
            raise ValueError(f"--vary {key}: given twice; give each key once, with all its values (v1,v2,...)")
        given.add(key)
        for i, (k, _) in enumerate(items):
            if k == key:
                items[i] = (key, values)
                if i == 0:
                    x_values = None
                break
        else:
            items.append((key, values))
    if not items:
        raise ValueError(f"{name or 'the default scenario'}: nothing to vary; give --vary section.key=v1,v2,... "
                         f"or use a sweep file (trainsim list scenarios)")
    data = apply_overrides(data, list(overrides))
    return Sweep(data, items, source, x_label, x_values)


# ----------------------------------------------------------------------------------------------------
# Running


def _assign(data: dict[str, Any], key: str, value: Any) -> None:
    node = data
    parts = key.split(".")
    for p in parts[:-1]:
        node = node.setdefault(p, {})
        if not isinstance(node, dict):
            raise ValueError(f"--vary {key}: {p} is not a section")
    node[parts[-1]] = value


def point_scenario(base: Mapping[str, Any], values: Mapping[str, Any], source: str = ""):
    """The :class:`~scenarios.scenario.Scenario` of one sweep point (checked)."""
    data = copy.deepcopy(dict(base))
    for k, v in values.items():
        _assign(data, k, v)
    return parse_scenario(data, source)


@dataclass
class PointResult:
    """One row of a sweep."""

    values: dict[str, Any]
    iteration_time_s: float | None = None
    tokens_per_s: float | None = None
    tflops_per_gpu: float | None = None
    mfu: float | None = None
    oom: bool = False
    peak_allocated_bytes: float | None = None
    """The caching allocator's peaks (``torch.cuda.max_memory_allocated`` / ``max_memory_reserved``), as
    ``run --json`` names them."""
    peak_reserved_bytes: float | None = None
    verdict: str = ""
    verdict_need_bytes: float | None = None
    """What the verdict compares (``MemoryBreakdown.need_and_capacity``): device use, as ``run`` reports it."""
    verdict_capacity_bytes: float | None = None
    """What it is compared with: the usable HBM."""
    error: str = ""
    metrics: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"values": self.values, "iteration_time_s": self.iteration_time_s, "tokens_per_s": self.tokens_per_s,
                "tflops_per_gpu": self.tflops_per_gpu, "mfu": self.mfu, "oom": self.oom,
                "peak_allocated_bytes": self.peak_allocated_bytes, "peak_reserved_bytes": self.peak_reserved_bytes,
                "verdict": self.verdict, "verdict_need_bytes": self.verdict_need_bytes,
                "verdict_capacity_bytes": self.verdict_capacity_bytes,
                "error": self.error or None, "metrics": self.metrics or None}


def run_point(base: Mapping[str, Any], values: Mapping[str, Any], source: str = "",
              simulate_oom: bool = False, progress: bool = False) -> PointResult:
    """Prepare and (unless it does not fit in memory) simulate one sweep point. Never raises for a bad
    configuration: the row carries the error (a point estimated above ``DEFAULT_MAX_TASKS`` tasks
    included). ``progress``: the run's progress bar (see :func:`scenarios.runner.run_prepared`).
    (Module-level, so worker processes can run it.)"""
    row = PointResult(dict(values))
    try:
        t0 = time.perf_counter()
        prep = prepare(point_scenario(base, values, source))
        mem = memory_for(prep)
        gpu = prep.topology.gpu_spec
        if mem is not None:
            row.oom, row.verdict = not mem.fits(gpu), mem.verdict(gpu)
            row.peak_allocated_bytes, row.peak_reserved_bytes = mem.allocated, mem.reserved
            row.verdict_need_bytes, row.verdict_capacity_bytes, _ = mem.need_and_capacity(gpu)
        if row.oom and not simulate_oom:
            return row
        rep = run_prepared(prep, mem, progress=progress, started_s=t0, max_tasks=DEFAULT_MAX_TASKS)
    except (ValueError, KeyError) as exc:
        row.error = str(exc.args[0] if isinstance(exc, KeyError) and exc.args else exc)
        return row
    m = rep.metrics
    row.iteration_time_s, row.tokens_per_s = m["iteration_time_s"], m["tokens_per_s"]
    row.tflops_per_gpu, row.mfu, row.metrics = m["tflops_per_gpu"], m["mfu"], m
    return row


def run_sweep(sweep: Sweep, *, workers: int = 1, simulate_oom: bool = False, progress: bool = False
              ) -> list[PointResult]:
    """Run every point of ``sweep``; ``workers > 1`` uses that many processes. Rows in point order.

    ``progress``: tqdm bars on stderr, one for the points and, with one worker, one below it for the
    point being simulated (callers pass ``sys.stderr.isatty()``; the rows do not change)."""
    points = sweep.points()
    args = [(sweep.base, p, sweep.source, simulate_oom) for p in points]
    bar = None
    if progress and len(points) > 1:
        bar = tqdm(total=len(points), desc=f"sweep {sweep.name}", unit="point", file=sys.stderr, leave=False)
    rows: list[PointResult] = []
    try:
        if workers > 1 and len(points) > 1:
            with ProcessPoolExecutor(max_workers=min(workers, len(points))) as pool:
                for row in pool.map(run_point, *zip(*args, strict=True)):
                    rows.append(row)
                    if bar:
                        bar.update()
        else:
            for a in args:
                rows.append(run_point(*a, progress=progress))
                if bar:
                    bar.update()
    finally:
        if bar:
            bar.close()
    return rows


# ----------------------------------------------------------------------------------------------------
# Output


def _fmt_value(v: Any) -> str:
    if isinstance(v, bool):  # as the scenario file and --vary spell it (TOML)
        return "true" if v else "false"
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def format_rows(sweep: Sweep, rows: Sequence[PointResult]) -> str:
    """The printed table: one row per point with the varied values, iteration time (ms), TFLOP/s per
    GPU, MFU and the memory verdict."""
    keys = sweep.keys
    widths = [max(len(k), *(len(_fmt_value(r.values[k])) for r in rows)) for k in keys]
    head = "  ".join(f"{k:<{w}}" for k, w in zip(keys, widths, strict=True))
    lines = [f"Sweep {sweep.name}: {len(rows)} point(s)  ({display_source(sweep.source)})",
             "", f"{head}  {'iteration':>11} {'TFLOP/s/GPU':>12} {'MFU':>7}  memory"]
    for r in rows:
        vals = "  ".join(f"{_fmt_value(r.values[k]):<{w}}" for k, w in zip(keys, widths, strict=True))
        if r.error:
            lines.append(f"{vals}  error: {r.error}")
            continue
        # the verdict's own comparison (device use of usable HBM), as run's and search's memory columns
        need, cap = r.verdict_need_bytes, r.verdict_capacity_bytes
        mem = "-" if need is None or cap is None else \
            f"{'OOM' if r.oom else 'fits'} ({need / 1e9:.1f} of {cap / 1e9:.1f} GB)"
        if r.iteration_time_s is None:
            lines.append(f"{vals}  {'-':>11} {'-':>12} {'-':>7}  {mem}, not simulated")
        else:
            lines.append(f"{vals}  {r.iteration_time_s * 1e3:>8.2f} ms {r.tflops_per_gpu:>12.1f} "
                         f"{100 * r.mfu:>6.1f}%  {mem}")
    return "\n".join(lines + _warning_lines(sweep, rows))


def _warning_lines(sweep: Sweep, rows: Sequence[PointResult]) -> list[str]:
    """The points' report warnings (what-ifs that change nothing, settings turned off), each once, with the
    points it applies to (none: no lines, so a sweep without warnings prints as before)."""
    where: dict[str, list[str]] = {}
    for r in rows:
        point = ", ".join(f"{k}={_fmt_value(r.values[k])}" for k in sweep.keys)
        for w in (r.metrics or {}).get("warnings", []):
            where.setdefault(w, []).append(point)
    same = same_result_note(sweep, rows)
    if same:
        where.setdefault(same, [])
    if not where:
        return []
    return ["", "Warnings"] + [f"  {w}" + (f" ({'every point' if len(p) == len(rows) else '; '.join(p)})" if p else "")
                               for w, p in where.items()]


def same_result_note(sweep: Sweep, rows: Sequence[PointResult]) -> str:
    """A note when every simulated point gave exactly the same iteration time (two or more points, none
    failed): the varied keys change nothing in this scenario (e.g. a fabric's shape where no link binds),
    which the per-key no-op checks do not always catch; else ``""``."""
    times = {r.iteration_time_s for r in rows}
    if len(rows) < 2 or any(r.error for r in rows) or None in times or len(times) != 1:
        return ""
    return (f"every point gives the same iteration time ({rows[0].iteration_time_s * 1e3:.2f} ms): "
            f"{', '.join(sweep.keys)} change{'s' if len(sweep.keys) == 1 else ''} nothing in this scenario")


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def x_axis(sweep: Sweep) -> tuple[list[float], str, dict[float, str] | None]:
    """``(x of each value of the first varied key, axis label, tick labels by x or None)`` of the plots.

    Numbers are plotted at themselves (or at ``x_values``). Names (systems, NICs, dtypes) are a
    categorical axis: at 0, 1, 2, ... each tick labelled with its name, or, where ``x_values`` give them
    a quantity (a NIC's Gb/s), at those values, each tick labelled with the value and the name."""
    key, values = sweep.vary[0]
    label = sweep.x_label or key
    if all(_is_number(v) for v in values):
        return list(sweep.x_values if sweep.x_values is not None else values), label, None
    names = [_fmt_value(v) for v in values]
    if sweep.x_values is not None:
        xs = [float(x) for x in sweep.x_values]
        return xs, label, {x: f"{x:g}\n{n}" for x, n in zip(xs, names, strict=True)}
    xs = [float(i) for i in range(len(values))]
    return xs, label, dict(zip(xs, names, strict=True))


def plot_rows(sweep: Sweep, rows: Sequence[PointResult], path: str | Path) -> list[Path]:
    """Plot iteration time (``path``) and TFLOP/s per GPU (``<stem>_tflops.png`` beside it) against the
    first varied key (:func:`x_axis`), one line per value of the second varied key (if any)."""
    from plots.sweep import plot_sweep  # deferred: matplotlib is slow to import, and most sweeps draw nothing

    key, values = sweep.vary[0]
    group = sweep.keys[1] if len(sweep.keys) > 1 else None
    xs, label, ticks = x_axis(sweep)
    xmap = dict(zip(map(repr, values), xs, strict=True))
    # named points at quantities spanning octaves (NICs at 100-800 Gb/s): a log axis keeps their names apart
    logx = bool(ticks) and sweep.x_values is not None and min(xs) > 0 and max(xs) >= 4 * min(xs)
    table = []
    for r in rows:
        table.append({"x": xmap[repr(r.values[key])],
                      "iteration_ms": None if r.iteration_time_s is None else r.iteration_time_s * 1e3,
                      "tflops": r.tflops_per_gpu,
                      **({group: _fmt_value(r.values[group])} if group else {})})
    path = Path(path)
    second = path.with_name(f"{path.stem}_tflops{path.suffix or '.png'}")
    try:
        plot_sweep(table, "x", "iteration_ms", path, group=group, xlabel=label, ylabel="iteration time (ms)",
                   title=f"{sweep.name}: iteration time", xticks=ticks, logx=logx)
        plot_sweep(table, "x", "tflops", second, group=group, xlabel=label, ylabel="TFLOP/s per GPU",
                   title=f"{sweep.name}: TFLOP/s per GPU", xticks=ticks, logx=logx)
    except OSError as exc:
        raise ValueError(f"cannot write {path}: {exc.strerror}") from None
    return [path, second]
