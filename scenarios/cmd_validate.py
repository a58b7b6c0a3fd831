"""``trainsim validate``: predicted vs published measurements, with the errors.

Tables (``scenarios/data/``, copied with their sources from the project's validation set; loaders and
the assumptions each row makes in :mod:`scenarios.validation.tables`):

* ``sc21``: Narayanan et al. SC'21 Table 1, TFLOP/s per GPU of GPT 1.7B-1T on 32-3,072 A100 (catalog
  ``sc21-gpt-*``);
* ``t5``: Korthikanti et al. 2022 Table 5, iteration time of 22B-1T (catalog ``korthikanti-*``);
* ``t4``: Korthikanti et al. 2022 Table 4, forward and backward time of one 22B layer, TP 8;
* ``sc21t2``: SC'21 Table 2, the PTD-P rows on 175B / 530B;
* ``sc21t2-zero3``: SC'21 Table 2, the DeepSpeed ZeRO-3 rows (``zero_impl = "deepspeed"``; slow: opt-in);
* ``megascale``: MegaScale Table 2, Megatron-LM 175B on 256-12,288 GPUs (slow: opt-in);
* ``readme2020``: Megatron-LM README 2020, 1.2B-8.3B, one node and 128-way data parallel;
* ``torchtitan``: torchtitan Llama 3 on H100 96 GB / 500 W (not expressible; listed).

No row is tuned. Rows named by a ``fitted_to`` list in ``hwmodel/data/calibration.toml`` are
in-sample; the report splits every table's error into in- and out-of-sample, gives the
leave-one-source-out error (:mod:`scenarios.validation.provenance`), Kendall's tau between predicted
and measured per group of plans (one model on one cluster, or one scaling series), and the error trend
per doubling of GPUs of each scaling series (MegaScale's two global batches, SC'21 Table 2's models);
a series of iteration times is also fitted as a line in micro-batches per pipeline (per micro-batch and
per iteration cost, measured and predicted).
"""

from __future__ import annotations

import fnmatch
import json
import math
import sys
from pathlib import Path
from typing import Any

from scenarios.validation import provenance, stats
from scenarios.validation.runs import layer_times_22b, predict
from scenarios.validation.tables import TABLE4, TABLES, Row, rows

__all__ = ["TABLE4", "DEFAULT_TABLES", "Row", "layer_times_22b", "predict", "ranking", "report", "rows",
           "summary"]

DEFAULT_TABLES = ("sc21", "t5", "t4", "sc21t2", "readme2020", "torchtitan")
"""Tables run without ``--tables``; ``megascale`` (8 runs of 256-12,288 GPUs) is opt-in for speed."""
RANKED_TABLES = {"SC'21 Table 2": False, "MegaScale Table 2": False, "Korthikanti Table 5": True,
                 "Korthikanti Table 4": True, "torchtitan H100 BF16": True}
"""Tables holding several plans of one model -> whether a group of plans is also split by GPU count (one
cluster). SC'21 Table 2 and MegaScale are scaling series (one model, one software stack, growing
clusters): their groups are ranked whole and also get an error slope per doubling of GPUs."""


def _errors(rs: list[Row]) -> dict[str, float]:
    errs = [r.error for r in rs]
    return {"rows": len(errs), "mape": stats.mape(errs), "max_abs_error": stats.max_abs(errs)}


def summary(rows_: list[Row]) -> dict[str, dict[str, Any]]:
    """Per table: ``rows``, ``mape``, ``max_abs_error`` (fractions) over the predicted rows, the same
    split into ``in_sample`` / ``out_of_sample``, and ``not_expressible`` (a row count)."""
    out: dict[str, dict[str, Any]] = {}
    for table in dict.fromkeys(r.table for r in rows_):
        done = [r for r in rows_ if r.table == table and r.expressible]
        out[table] = {**_errors(done),
                      "in_sample": _errors([r for r in done if r.in_sample]),
                      "out_of_sample": _errors([r for r in done if not r.in_sample]),
                      "not_expressible": sum(1 for r in rows_ if r.table == table and not r.expressible)}
    return out


def time_vs_microbatches(series: list[Row]) -> dict[str, dict[str, float]] | None:
    """Measured and predicted iteration time of a strong-scaling series as a straight line in the
    micro-batches per pipeline m (least squares): ``{"measured" | "predicted": {"per_microbatch_s",
    "per_iteration_s"}}``, the slope and the intercept. At a fixed global batch, m halves as the GPUs
    double, so an error that grows with the GPU count is a per-iteration cost (intercept) or a
    per-micro-batch cost (slope) the model gets wrong; this says which. ``None`` unless every row is an
    iteration time (unit ``s``) of a built scenario and the series has two distinct m."""
    ms = [r.microbatches for r in series]
    if any(r.unit != "s" for r in series) or None in ms or len(set(ms)) < 2:
        return None
    xs = [float(m) for m in ms if m is not None]
    out = {}
    for side in ("measured", "predicted"):
        a, b = stats.line_fit(xs, [getattr(r, side) for r in series])
        out[side] = {"per_microbatch_s": a, "per_iteration_s": b}
    return out


def ranking(rows_: list[Row]) -> dict[str, dict[str, Any]]:
    """Kendall's tau-b between predicted and measured per group of plans (one model on one cluster, or
    one scaling series) of the ``RANKED_TABLES`` with at least two rows, ``"<table> / <group>"`` (``"... on
    N GPUs"`` where split by GPU count) -> ``{"tau", "rows"}``; a scaling series also gets
    ``slope_points_per_doubling`` (signed error in percentage points per doubling of GPUs) and, for
    iteration times, ``time_vs_microbatches`` (:func:`time_vs_microbatches`). Under
    ``"MegaScale Table 2"``: the slope and the line over all its rows (both series pooled)."""
    out: dict[str, dict[str, Any]] = {}
    for table, by_gpus in RANKED_TABLES.items():
        done = [r for r in rows_ if r.table == table and r.expressible]
        keys = dict.fromkeys((r.group, r.gpus if by_gpus else 0) for r in done)
        for group, gpus in keys:
            g = [r for r in done if r.group == group and (not by_gpus or r.gpus == gpus)]
            if len(g) < 2:
                continue
            entry: dict[str, Any] = {"tau": stats.kendall_tau_b([r.predicted for r in g], [r.measured for r in g]),
                                     "rows": len(g)}
            if not by_gpus:
                entry["slope_points_per_doubling"] = stats.slope_per_doubling([r.gpus for r in g],
                                                                              [r.error for r in g])
                if (line := time_vs_microbatches(g)) is not None:
                    entry["time_vs_microbatches"] = line
            out[f"{table} / {group}" + (f" on {gpus} GPUs" if by_gpus else "")] = entry
        if table == "MegaScale Table 2" and done:
            out[table] = {"slope_points_per_doubling": stats.slope_per_doubling([r.gpus for r in done],
                                                                                 [r.error for r in done]),
                          "rows": len(done)}
            if (line := time_vs_microbatches(done)) is not None:
                out[table]["time_vs_microbatches"] = line
    return out


def report(rows_: list[Row]) -> dict[str, Any]:
    """Everything ``--json`` writes: rows, per-table summary, leave-one-source-out, ranking."""
    fits = provenance.fitted_to()
    loso = provenance.leave_one_source_out(rows_, fits)
    return {"rows": [{"table": r.table, "row": r.name, "metric": r.metric, "unit": r.unit,
                      "measured": r.measured, "in_sample": r.in_sample, "gpus": r.gpus,
                      **({"clock_curve_a_b": list(r.curve)} if r.curve is not None else {}),
                      **({"reserved_memory_gib": {"measured": r.measured_memory_gib,
                                                  "predicted": r.predicted_memory_gib}}
                         if r.measured_memory_gib is not None and r.expressible else {}),
                      **({"predicted": r.predicted, "error": r.error} if r.expressible
                         else {"not_expressible": r.not_expressible})} for r in rows_],
            "summary": summary(rows_),
            "leave_one_source_out": loso,
            "leave_one_source_out_all_tables": provenance.pooled(loso),
            "ranking": ranking(rows_),
            "calibration": {"shipped_clock_fraction": provenance.shipped_clock(),
                            "refit_probe_clock_fraction": provenance.REFIT_PROBE,
                            "end_to_end_constants": {c: sorted(ids) for c, ids in
                                                     provenance.end_to_end_constants(fits).items()}}}


def _pct(x: float) -> str:
    return "   -  " if math.isnan(x) else f"{100 * x:5.1f} %"


def format_table(rows_: list[Row]) -> str:
    """The human report: rows (measured and predicted in the row's unit, which tables mix: TFLOP/s, s,
    ms, tokens/s), then per-table errors, leave-one-source-out, ranking."""
    rep = report(rows_)
    lines = [f"{'table':22s} {'row':36s} {'metric':16s} {'unit':8s} {'sample':6s} {'measured':>10s} "
             f"{'predicted':>10s} {'error':>8s}"]
    for r in rows_:
        head = (f"{r.table:22s} {r.name:36s} {r.metric:16s} {r.unit:8s} {'in' if r.in_sample else 'out':6s} "
                f"{r.measured:>10.4g}")
        lines.append(f"{head} {r.predicted:>10.4g} {100 * r.error:>+7.1f}%" if r.expressible
                     else f"{head}   not expressible: {r.not_expressible}")
        if r.expressible and r.measured_memory_gib is not None and r.predicted_memory_gib == r.predicted_memory_gib:
            lines[-1] += (f"   reserved memory {r.measured_memory_gib:.1f} GiB, predicted {r.predicted_memory_gib:.1f} "
                          f"({100 * (r.predicted_memory_gib / r.measured_memory_gib - 1):+.1f}%)")
    lines += ["", f"{'table':22s} {'rows':>4s}  {'MAPE':>7s} {'max':>7s} | {'in-sample':^17s} | "
              f"{'out-of-sample':^17s} | {'LOSO MAPE':>9s} {'max':>7s}  note"]
    for table, s in rep["summary"].items():
        lo = rep["leave_one_source_out"].get(table, {"mape": float("nan"), "max_abs_error": float("nan"), "note": ""})
        ins, outs = s["in_sample"], s["out_of_sample"]
        skipped = f"; {s['not_expressible']} not expressible" if s["not_expressible"] else ""
        lines.append(f"{table:22s} {s['rows']:4d}  {_pct(s['mape'])} {_pct(s['max_abs_error'])} | "
                     f"{ins['rows']:2d} {_pct(ins['mape'])} {_pct(ins['max_abs_error'])} | "
                     f"{outs['rows']:2d} {_pct(outs['mape'])} {_pct(outs['max_abs_error'])} | "
                     f"{_pct(lo['mape']):>9s} {_pct(lo['max_abs_error'])}  {lo['note']}{skipped}")
    allt = rep["leave_one_source_out_all_tables"]
    lines.append(f"all tables, held out (leave-one-source-out): {allt['rows']} rows, MAPE {_pct(allt['mape'])}, "
                 f"max {_pct(allt['max_abs_error'])}")
    if rep["ranking"]:
        lines.append("")
    for name, rk in rep["ranking"].items():
        slope = rk.get("slope_points_per_doubling")
        slope_text = "   -  " if slope is None or math.isnan(slope) else f"{slope:+.2f}"
        if "tau" not in rk:
            lines.append(f"{name}: error slope {slope_text} points per doubling of GPUs ({rk['rows']} rows, pooled)")
        else:
            tau = "  -  " if math.isnan(rk["tau"]) else f"{rk['tau']:+.2f}"
            lines.append(f"{name}: Kendall tau (predicted vs measured) {tau} over {rk['rows']} plans"
                         + (f"; error slope {slope_text} points per doubling of GPUs" if slope is not None else ""))
        if (line := rk.get("time_vs_microbatches")) is not None:
            fits = [f"{side} {line[side]['per_microbatch_s']:.3f} s x m {line[side]['per_iteration_s']:+.2f} s"
                    for side in ("measured", "predicted")]
            lines.append(f"  iteration time vs micro-batches per pipeline m (least squares): {', '.join(fits)}")
    return "\n".join(lines)


def _no_nan(x: Any) -> Any:
    """``x`` with every NaN float replaced by ``None`` (JSON has no NaN)."""
    if isinstance(x, dict):
        return {k: _no_nan(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_no_nan(v) for v in x]
    return None if isinstance(x, float) and math.isnan(x) else x


def _default_jobs() -> int:
    """The CPUs this process may use (``os.cpu_count()`` where affinity is unknown)."""
    import os

    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)


GLOB_CHARS = "*?["


def select(rows_: list[Row], only: str | None) -> list[Row]:
    """The rows named ``only``: an exact row name, or a shell-style glob (``fnmatch``, case-sensitive)
    when it holds ``*``, ``?`` or ``[`` (``"sc21-gpt-1*"``); ``None``: every row.

    Raises:
        ValueError: nothing matches (one line listing the valid row names).
    """
    if only is None:
        return rows_
    glob = any(c in only for c in GLOB_CHARS)
    chosen = [r for r in rows_ if (fnmatch.fnmatchcase(r.name, only) if glob else r.name == only)]
    if not chosen:
        names = ", ".join(dict.fromkeys(r.name for r in rows_))
        raise ValueError(f"--only {only!r} matches no row of the selected tables "
                         f"({'glob' if glob else 'exact name'}); valid row names: {names}")
    return chosen


def register(sub) -> None:
    p = sub.add_parser("validate", help="compare predictions with published measurements",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("--tables", default=",".join(DEFAULT_TABLES),
                   help=f"comma list of: {', '.join(f'{k} ({v[0]})' for k, v in TABLES.items())}; "
                        f"default all but megascale and sc21t2-zero3 (slow), 'all' for every table")
    p.add_argument("--only", default=None, metavar="NAME",
                   help="only the row of this exact name, or the rows matching it as a shell glob when it holds "
                        "*, ? or [ (e.g. 'sc21-gpt-1*')")
    p.add_argument("--json", metavar="PATH", help="write rows, summary, leave-one-source-out and ranking as JSON")
    p.add_argument("--jobs", type=int, default=_default_jobs(),
                   help="worker processes simulating side by side (default: the CPUs this process may use); "
                        "1 runs them in this process")
    p.set_defaults(func=_main)


def _bars(rs: list[Row]) -> dict[str, Any]:
    """One tqdm bar per table (rows done of the table's, with its ETA) on a terminal; none otherwise."""
    if not sys.stderr.isatty():
        return {}
    from tqdm import tqdm

    totals: dict[str, int] = {}
    for r in rs:
        if r.expressible:
            totals[r.table] = totals.get(r.table, 0) + 1
    return {t: tqdm(total=n, desc=f"{t:22s}", unit="row", file=sys.stderr, leave=False, position=i)
            for i, (t, n) in enumerate(totals.items())}


def _main(args) -> int:
    tables = tuple(TABLES) if args.tables.strip() == "all" else tuple(
        t.strip() for t in args.tables.split(",") if t.strip())
    rs = select(rows(tables), args.only)
    if args.jobs < 1:
        raise ValueError(f"--jobs must be >= 1, got {args.jobs}")
    provenance.mark_in_sample(rs, provenance.fitted_to())
    bars = _bars(rs)  # stdout does not change with them

    def show(r: Row) -> None:
        line = (f"  {r.table:22s} {r.name:36s} measured {r.measured:8.4g} "
                f"{r.unit:8s} predicted {r.predicted:8.4g}  {100 * r.error:+6.1f}%  ({r.wall_s:.1f} s)")
        if not bars:
            print(line, flush=True)
        else:
            bars[r.table].write(line, file=sys.stdout)
            bars[r.table].update()

    try:
        predict(rs, progress=show, refit=True, jobs=args.jobs)
    finally:
        for bar in bars.values():
            bar.close()
    print()
    print(format_table(rs))
    if args.json:
        Path(args.json).write_text(json.dumps(_no_nan(report(rs)), indent=1, sort_keys=True) + "\n")
    return 0
