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
and measured per group of plans, and MegaScale's error trend per doubling of GPUs.
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import Any

from scenarios.validation import provenance, stats
from scenarios.validation.tables import TABLE4, TABLES, Row, rows

__all__ = ["TABLE4", "DEFAULT_TABLES", "Row", "layer_times_22b", "predict", "ranking", "report", "rows",
           "summary"]

DEFAULT_TABLES = ("sc21", "t5", "t4", "sc21t2", "readme2020", "torchtitan")
"""Tables run without ``--tables``; ``megascale`` (8 runs of 256-12,288 GPUs) is opt-in for speed."""
RANKED_TABLES = ("SC'21 Table 2", "MegaScale Table 2")
"""Tables holding several plans of one model on one cluster: Kendall's tau per group."""


def _simulate(row: Row) -> float:
    """The model's value of one scenario row (catalog or built), in the row's unit (one simulation)."""
    from scenarios.runner import run_scenario, scenario_path
    from scenarios.scenario import load_scenario, parse_scenario

    sc = parse_scenario(row.scenario) if row.scenario is not None else load_scenario(scenario_path(row.name))
    m = run_scenario(sc).metrics
    if row.measured_memory_gib is not None and m["memory"] and "reserved_bytes" in m["memory"]:
        row.predicted_memory_gib = m["memory"]["reserved_bytes"] / 2**30  # torchtitan logs reserved GiB
    if row.unit == "tokens/s":  # per GPU
        return m["tokens_per_s"] / m["system"]["gpus"]
    return m["tflops_per_gpu"] if row.unit == "TFLOP/s" else m["iteration_time_s"]


def _row_value(row: Row, f: float, table4: dict[tuple[str, float], tuple[float, float]]) -> float:
    """The model's value of ``row`` at sustained clock fraction ``f``; Table 4's forward and backward
    come from one simulation, kept in ``table4``."""
    with provenance.clock_fraction(f):
        if row.key != "t4":
            return _simulate(row)
        if (row.name, f) not in table4:
            table4[(row.name, f)] = layer_times_22b(TABLE4[row.name])
    fwd, bwd = table4[(row.name, f)]
    return 1e3 * (fwd if row.metric == "layer forward" else bwd)


def _predict_group(group: list[Row], refit: bool) -> list[tuple[float, tuple[float, float] | None, float]]:
    """``(predicted, clock curve or None, wall seconds, predicted reserved GiB)`` of each row of ``group``
    (rows sharing a simulation: Table 4's forward and backward of one setting). Runs in a worker process,
    too, hence the memory figure in the result rather than only on the row."""
    f0 = provenance.shipped_clock()
    table4: dict[tuple[str, float], tuple[float, float]] = {}
    out = []
    for row in group:
        t0 = time.perf_counter()
        row.predicted = _row_value(row, f0, table4)
        if refit and row.in_sample:
            provenance.set_curve(row, f0, row.predicted, provenance.REFIT_PROBE,
                                 _row_value(row, provenance.REFIT_PROBE, table4))
        out.append((row.predicted, row.curve, time.perf_counter() - t0, row.predicted_memory_gib))
    return out


def predict(rows_: list[Row], progress=None, *, refit: bool = False, jobs: int = 1) -> list[Row]:
    """Fill ``predicted`` for every expressible row (one simulation each; Table 4's forward and backward
    share one). With ``refit``, in-sample rows are simulated once more at ``provenance.REFIT_PROBE`` and
    get their clock curve (``Row.curve``) for the leave-one-source-out error. ``jobs`` > 1 runs the rows
    in that many worker processes (results do not depend on it; ``progress`` is then called in order of
    completion)."""
    groups: dict[tuple[str, str], list[Row]] = {}
    for row in rows_:
        if row.expressible:
            groups.setdefault((row.key, row.name) if row.key == "t4" else (row.key, f"{id(row)}"), []).append(row)

    def done(group: list[Row], results) -> None:
        for row, (pred, curve, wall, memory_gib) in zip(group, results, strict=True):
            row.predicted, row.curve, row.wall_s, row.predicted_memory_gib = pred, curve, wall, memory_gib
            if progress is not None:
                progress(row)

    if jobs <= 1 or len(groups) <= 1:
        for group in groups.values():
            done(group, _predict_group(group, refit))
        return rows_
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    # spawn, not fork: the parent has torch (and its thread pools) loaded
    with ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        # the slowest rows (most GPUs) first, so that two workers finish together
        order = sorted(groups.values(), key=lambda g: -g[0].gpus)
        futures = {pool.submit(_predict_group, g, refit): g for g in order}
        for fut in as_completed(futures):
            done(futures[fut], fut.result())
    return rows_


def layer_times_22b(parallel: dict) -> tuple[float, float]:
    """Forward and backward seconds of one 22B layer (h 6144, 64 heads, s 2048, micro-batch 4), TP 8 on
    one DGX A100, Megatron 2022 kernels (unfused attention, dropout 0.1), as Korthikanti Table 4."""
    from hwmodel.nccl.engine import NcclEngine
    from hwmodel.runtime import DEFAULT_HOST_LAUNCH_OVERHEAD_S
    from scenarios.hierarchical import pass_times
    from scenarios.runner import prepare, run_cost_model
    from scenarios.scenario import parse_scenario
    from workload.parallel.rank_trace import trace_rank

    sc = parse_scenario({
        "name": "korthikanti-table4", "system": {"name": "dgx-a100", "nodes": 1},
        "model": {"name": "gpt-18b", "num_layers": 1, "hidden_size": 6144, "num_attention_heads": 64,
                  "attention_backend": "unfused", "hidden_dropout": 0.1, "attention_dropout": 0.1},
        "parallel": {"tensor_model_parallel_size": 8, **parallel},
        "training": {"global_batch_size": 4, "micro_batch_size": 4}})
    prep = prepare(sc)
    tr = trace_rank(prep.model_cfg, prep.config)
    t = pass_times(tr, prep.config, prep.topology, NcclEngine, DEFAULT_HOST_LAUNCH_OVERHEAD_S, run_cost_model(prep))
    return t[("block", "fwd")], t[("block", "bwd")]


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


def ranking(rows_: list[Row]) -> dict[str, dict[str, Any]]:
    """Kendall's tau-b between predicted and measured per group of plans (one model, one cluster) of the
    ``RANKED_TABLES``, ``"<table> / <group>"`` -> ``{"tau", "rows"}``; plus MegaScale's slope of signed
    error per doubling of GPUs (percentage points), under ``"MegaScale Table 2"``."""
    out: dict[str, dict[str, Any]] = {}
    for table in RANKED_TABLES:
        done = [r for r in rows_ if r.table == table and r.expressible]
        for group in dict.fromkeys(r.group for r in done):
            g = [r for r in done if r.group == group]
            out[f"{table} / {group}"] = {"tau": stats.kendall_tau_b([r.predicted for r in g],
                                                                     [r.measured for r in g]), "rows": len(g)}
        if table == "MegaScale Table 2" and done:
            out[table] = {"slope_points_per_doubling": stats.slope_per_doubling([r.gpus for r in done],
                                                                                 [r.error for r in done]),
                          "rows": len(done)}
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
    """The human report: rows, then per-table errors, leave-one-source-out, ranking."""
    rep = report(rows_)
    lines = [f"{'table':22s} {'row':36s} {'metric':16s} {'sample':6s} {'measured':>10s} {'predicted':>10s} "
             f"{'error':>8s}"]
    for r in rows_:
        head = f"{r.table:22s} {r.name:36s} {r.metric:16s} {'in' if r.in_sample else 'out':6s} {r.measured:>10.4g}"
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
        lines.append(f"{name}: error slope {rk['slope_points_per_doubling']:+.2f} points per doubling of GPUs "
                     f"({rk['rows']} rows)" if "slope_points_per_doubling" in rk
                     else f"{name}: Kendall tau (predicted vs measured) {rk['tau']:+.2f} over {rk['rows']} plans")
    return "\n".join(lines)


def _no_nan(x: Any) -> Any:
    """``x`` with every NaN float replaced by ``None`` (JSON has no NaN)."""
    if isinstance(x, dict):
        return {k: _no_nan(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_no_nan(v) for v in x]
    return None if isinstance(x, float) and math.isnan(x) else x


def _default_jobs() -> int:
    import os

    return max(1, min(4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1))


def register(sub) -> None:
    p = sub.add_parser("validate", help="compare predictions with published measurements",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("--tables", default=",".join(DEFAULT_TABLES),
                   help=f"comma list of: {', '.join(f'{k} ({v[0]})' for k, v in TABLES.items())}; "
                        f"default all but megascale and sc21t2-zero3 (slow), 'all' for every table")
    p.add_argument("--only", default=None, help="only rows whose name contains this text")
    p.add_argument("--json", metavar="PATH", help="write rows, summary, leave-one-source-out and ranking as JSON")
    p.add_argument("--jobs", type=int, default=_default_jobs(),
                   help="worker processes simulating rows side by side (default: the CPUs this process may use, "
                        "at most 4); 1 runs them in this process")
    p.set_defaults(func=_main)


def _main(args) -> int:
    tables = tuple(TABLES) if args.tables.strip() == "all" else tuple(
        t.strip() for t in args.tables.split(",") if t.strip())
    rs = [r for r in rows(tables) if args.only is None or args.only in r.name]
    if not rs:
        raise ValueError(f"--only {args.only!r} matches no row")
    if args.jobs < 1:
        raise ValueError(f"--jobs must be >= 1, got {args.jobs}")
    provenance.mark_in_sample(rs, provenance.fitted_to())

    from tqdm import tqdm

    # rows done of all, with an ETA, on a terminal only (as run and sweep); stdout does not change
    bar = tqdm(total=len(rs), desc="validate", unit="row", file=sys.stderr, leave=False) \
        if sys.stderr.isatty() else None

    def show(r: Row) -> None:
        line = (f"  {r.table:22s} {r.name:36s} measured {r.measured:8.4g} {r.unit:8s} predicted "
                f"{r.predicted:8.4g}  {100 * r.error:+6.1f}%  ({r.wall_s:.1f} s)")
        if bar is None:
            print(line, flush=True)
        else:
            bar.write(line, file=sys.stdout)
            bar.update()

    try:
        predict(rs, progress=show, refit=True, jobs=args.jobs)
    finally:
        if bar is not None:
            bar.close()
    print()
    print(format_table(rs))
    if args.json:
        Path(args.json).write_text(json.dumps(_no_nan(report(rs)), indent=1, sort_keys=True) + "\n")
    return 0
