"""Predicted against measured, per kernel kind, per layer and per op (``trainsim compare``).

Predictions are the model's execution times of the paired tasks (solo time less launch, as the fit
uses them), under the active calibration; the end-to-end line is the full simulation of the scenario
against the trace's steady step.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from hwmodel.costmodel import ArchCalibration, KernelCostModel
from scenarios.calibrate.fit_kernels import constant_of, exec_time
from scenarios.calibrate.matcher import Matching

TOP_DEVIATIONS = 10
OPTIMIZER_LAYER = "optimizer step"
"""The per-layer row of the optimizer step: its launches are paired as one group over every layer's
parameters (:class:`scenarios.calibrate.matcher.Pair`), so no one layer owns it (its first task's layer,
the embedding's ``pre``, did)."""


def pair_rows(m: Matching, model: KernelCostModel, cal: ArchCalibration) -> list[dict[str, Any]]:
    """One row per pair: op, model task, layer (:data:`OPTIMIZER_LAYER` for the optimizer step), kind,
    constant, longest kernel, measured and predicted seconds, and the residual (predicted / measured - 1)."""
    rows = []
    for p in m.pairs:
        pred = exec_time(model, cal, p.tasks)
        c = constant_of(p.task, cal)
        layer = OPTIMIZER_LAYER if p.kind == "optimizer" else p.task.layer
        rows.append({"op": p.op.op, "task": p.task.name, "layer": layer, "kind": p.kind,
                     "constant": ".".join(c[0]) if c else "", "kernel": p.op.main_kernel if p.op.events else "",
                     "kernels": len(p.op.events), "measured_s": p.op.dur_s, "predicted_s": pred,
                     "residual": pred / p.op.dur_s - 1 if p.op.dur_s > 0 else 0.0})
    return rows


def _layer_group(layer: str) -> str:
    parts = layer.split(".")
    return ".".join(parts[:3]) if len(parts) > 3 else (layer or "(no layer)")


def _table(title: str, sums: dict[str, list[float]]) -> list[str]:
    lines = [f"{title:34s} {'measured':>11s} {'predicted':>11s} {'error':>8s}"]
    for key in sorted(sums, key=lambda k: -sums[k][0]):
        meas, pred = sums[key]
        err = f"{pred / meas - 1:+8.1%}" if meas > 0 else "       -"
        lines.append(f"  {key[:32]:32s} {meas * 1e3:8.3f} ms {pred * 1e3:8.3f} ms {err}")
    return lines


def format_compare(rows: list[dict[str, Any]], m: Matching, step_s: float, simulated_s: float,
                   profile: str) -> str:
    """The text report of ``trainsim compare``."""
    by_kind: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    by_layer: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for r in rows:
        for table, key in ((by_kind, r["kind"]), (by_layer, _layer_group(r["layer"]))):
            table[key][0] += r["measured_s"]
            table[key][1] += r["predicted_s"]
    lines = [f"# calibration: {profile}", ""]
    lines += _table("per kernel kind", by_kind) + [""] + _table("per layer", by_layer) + [""]
    lines += [f"{TOP_DEVIATIONS} largest deviations (|predicted - measured|)",
              f"  {'layer':24s} {'task':26s} {'measured':>12s} {'predicted':>12s} {'error':>7s}  longest kernel"]
    for r in sorted(rows, key=lambda r: -abs(r["predicted_s"] - r["measured_s"]))[:TOP_DEVIATIONS]:
        lines.append(f"  {r['layer'][:24]:24s} {r['task'][:26]:26s} {r['measured_s'] * 1e6:9.1f} us "
                     f"{r['predicted_s'] * 1e6:9.1f} us {r['residual']:+7.1%}  {r['kernel'][:48]}")
    unmatched = m.unmatched_kernels()
    if unmatched or m.unmatched_tasks:
        lines += ["", f"unmatched: {len(unmatched)} trace kernel name(s), {sum(u[2] for u in unmatched) * 1e3:.3f} ms; "
                      f"{len(m.unmatched_tasks)} model task(s)"]
        lines += [f"  trace  {n[:70]:70s} x{k:<4d} {s * 1e3:8.3f} ms" for n, k, s in unmatched[:5]]
        lines += [f"  model  {t.name} ({t.layer or 'no layer'}, {t.kind})" for t in m.unmatched_tasks[:5]]
    lines += ["", f"end to end: measured step {step_s * 1e3:.3f} ms, simulated iteration {simulated_s * 1e3:.3f} ms "
                  f"({simulated_s / step_s - 1:+.1%})"]
    return "\n".join(lines) + "\n"
