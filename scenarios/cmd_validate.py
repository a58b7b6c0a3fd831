"""``trainsim validate``: predicted vs published measurements, with the errors.

Rows (``scenarios/data/``, copied with their sources from the project's validation set):

* Narayanan et al. SC'21 Table 1: TFLOP/s per GPU of GPT 1.7B-1T on 32-3,072 A100 (catalog
  ``sc21-gpt-*``);
* Korthikanti et al. 2022 Table 5: iteration time of 22B, 175B, 530B and 1T, full recomputation and
  sequence parallel + selective recomputation (catalog ``korthikanti-*``);
* Korthikanti et al. 2022 Table 4: forward and backward time of one 22B layer, TP 8, under five
  settings (simulated directly, one layer on one DGX A100).

No row is tuned: every scenario uses the same hardware specs and calibration (hwmodel/data). The
micro-batch size of SC'21 (not stated in the paper) is 1 and the interleaving depth is the catalog
file's choice for every row.
"""

from __future__ import annotations

import csv
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

DATA = Path(__file__).parent / "data"
SC21_MODELS = {"1.7": "gpt-1.7b", "3.6": "gpt-3.6b", "7.5": "gpt-7.5b", "18.4": "gpt-18b", "39.1": "gpt-39b",
               "76.1": "gpt-76b", "145.6": "gpt-145b", "310.1": "gpt-310b", "529.6": "gpt-530b", "1008.0": "gpt-1t"}
KORTHIKANTI_MODELS = {"22B": "22b", "175B (GPT-3)": "175b", "530B (MT-NLG)": "530b", "1T": "1t"}
TABLE4 = {"Baseline no recompute": {}, "Sequence Parallelism": {"sequence_parallel": True},
          "Baseline with (full) recompute": {"recompute_granularity": "full"},
          "Selective Recompute": {"recompute_granularity": "selective"},
          "Selective + Sequence": {"recompute_granularity": "selective", "sequence_parallel": True}}


@dataclass
class Row:
    table: str
    name: str
    metric: str
    unit: str
    measured: float
    predicted: float = float("nan")
    wall_s: float = 0.0

    @property
    def error(self) -> float:
        return self.predicted / self.measured - 1


def rows(tables: tuple[str, ...] = ("sc21", "t5", "t4")) -> list[Row]:
    """The published rows, not yet predicted."""
    out: list[Row] = []
    if "sc21" in tables:
        for r in csv.DictReader((DATA / "megatron_sc21_table1.csv").open()):
            out.append(Row("SC'21 Table 1", f"sc21-{SC21_MODELS[r['model_params_B']]}", "TFLOP/s per GPU",
                           "TFLOP/s", float(r["tflops_per_gpu"])))
    kort = list(csv.DictReader((DATA / "korthikanti2022.csv").open()))
    if "t5" in tables:
        for r in kort:
            if r["subtable"].startswith("Table 3"):
                size = KORTHIKANTI_MODELS[r["model"]]
                out.append(Row("Korthikanti Table 5", f"korthikanti-{size}-full-recompute", "iteration time", "s",
                               float(r["iter_time_full_recompute_s"])))
                out.append(Row("Korthikanti Table 5", f"korthikanti-{size}-sp-selective", "iteration time", "s",
                               float(r["iter_time_present_work_s"])))
    if "t4" in tables:
        for r in kort:
            if r["subtable"].startswith("Table 4"):
                out.append(Row("Korthikanti Table 4", r["configuration"], "layer forward", "ms",
                               float(r["forward_ms"])))
                out.append(Row("Korthikanti Table 4", r["configuration"], "layer backward", "ms",
                               float(r["backward_ms"])))
    return out


def predict(rows_: list[Row], progress=None) -> list[Row]:
    """Fill ``predicted`` for every row (simulating each scenario once)."""
    from scenarios.runner import run_scenario, scenario_path
    from scenarios.scenario import load_scenario

    table4: dict[str, tuple[float, float]] = {}
    for row in rows_:
        t0 = time.perf_counter()
        if row.table == "Korthikanti Table 4":
            if row.name not in table4:
                table4[row.name] = layer_times_22b(TABLE4[row.name])
            f, b = table4[row.name]
            row.predicted = 1e3 * (f if row.metric == "layer forward" else b)
        else:
            rep = run_scenario(load_scenario(scenario_path(row.name)))
            m = rep.metrics
            row.predicted = m["tflops_per_gpu"] if row.unit == "TFLOP/s" else m["iteration_time_s"]
        row.wall_s = time.perf_counter() - t0
        if progress is not None:
            progress(row)
    return rows_


def layer_times_22b(parallel: dict) -> tuple[float, float]:
    """Forward and backward seconds of one 22B layer (h 6144, 64 heads, s 2048, micro-batch 4), TP 8 on
    one DGX A100, Megatron 2022 kernels (unfused attention, dropout 0.1), as Korthikanti Table 4."""
    from hwmodel.nccl.engine import NcclEngine
    from hwmodel.runtime import DEFAULT_HOST_LAUNCH_OVERHEAD_S
    from scenarios.hierarchical import pass_times
    from scenarios.runner import prepare
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
    t = pass_times(tr, prep.config, prep.topology, NcclEngine, DEFAULT_HOST_LAUNCH_OVERHEAD_S)
    return t[("block", "fwd")], t[("block", "bwd")]


def summary(rows_: list[Row]) -> dict[str, dict[str, float]]:
    out = {}
    for table in dict.fromkeys(r.table for r in rows_):
        errs = [abs(r.error) for r in rows_ if r.table == table]
        out[table] = {"rows": len(errs), "mape": sum(errs) / len(errs), "max_abs_error": max(errs)}
    return out


def format_table(rows_: list[Row]) -> str:
    lines = [f"{'table':22s} {'row':34s} {'metric':16s} {'measured':>10s} {'predicted':>10s} {'error':>8s}"]
    for r in rows_:
        lines.append(f"{r.table:22s} {r.name:34s} {r.metric:16s} {r.measured:>10.3g} {r.predicted:>10.3g} "
                     f"{100 * r.error:>+7.1f}%")
    lines.append("")
    for table, s in summary(rows_).items():
        lines.append(f"{table:22s} rows {s['rows']:2d}  mean absolute error {100 * s['mape']:.1f} %  "
                     f"max {100 * s['max_abs_error']:.1f} %")
    return "\n".join(lines)


def register(sub) -> None:
    p = sub.add_parser("validate", help="compare predictions with published measurements (SC'21, Korthikanti)",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("--tables", default="sc21,t5,t4",
                   help="comma list of: sc21 (SC'21 Table 1), t5 (Korthikanti Table 5), t4 (Korthikanti Table 4)")
    p.add_argument("--only", default=None, help="only rows whose name contains this text")
    p.add_argument("--json", metavar="PATH", help="write rows and summary as JSON")
    p.set_defaults(func=_main)


def _main(args) -> int:
    tables = tuple(t.strip() for t in args.tables.split(",") if t.strip())
    bad = set(tables) - {"sc21", "t5", "t4"}
    if bad:
        raise ValueError(f"--tables: unknown {sorted(bad)}; allowed: sc21, t5, t4")
    rs = [r for r in rows(tables) if args.only is None or args.only in r.name]
    if not rs:
        raise ValueError(f"--only {args.only!r} matches no row")

    from tqdm import tqdm

    # rows done of all, with an ETA, on a terminal only (as run and sweep); stdout does not change
    bar = tqdm(total=len(rs), desc="validate", unit="row", file=sys.stderr, leave=False) \
        if sys.stderr.isatty() else None

    def show(r: Row) -> None:
        line = (f"  {r.table:22s} {r.name:34s} measured {r.measured:8.3g} {r.unit:8s} predicted "
                f"{r.predicted:8.3g}  {100 * r.error:+6.1f}%  ({r.wall_s:.1f} s)")
        if bar is None:
            print(line, flush=True)
        else:
            bar.write(line, file=sys.stdout)
            bar.update()

    try:
        predict(rs, progress=show)
    finally:
        if bar is not None:
            bar.close()
    print()
    print(format_table(rs))
    if args.json:
        data = {"rows": [{"table": r.table, "row": r.name, "metric": r.metric, "unit": r.unit,
                          "measured": r.measured, "predicted": r.predicted, "error": r.error} for r in rs],
                "summary": summary(rs)}
        Path(args.json).write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    return 0
