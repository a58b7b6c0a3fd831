"""``trainsim calibrate``: fit the model's constants to your own measurements; write a profile.

    trainsim calibrate --kineto trace.json.gz --scenario my-model.toml [--output cluster.toml]
    trainsim calibrate --nccl-log all_reduce_perf.log ... --system dgx-a100
    trainsim calibrate --measured iteration_time_s=1.23 --scenario my-model.toml

``--kineto``: a PyTorch profiler trace of the scenario's model on one GPU of the scenario's kind. Its
steady step's kernels are paired with the traced model's tasks, and the kernel efficiencies (GEMM by
shape class, attention by head dim, memory-bound kinds) and the launch overhead are fitted
(:mod:`scenarios.calibrate.fit_kernels`); the simulated iteration is then compared with the step, and the
fit is repeated with a third of the kernels (by name) held out (out-of-sample error).
``--nccl-log``: nccl-tests output; fits the NCCL constants of ``calibration.toml [nccl]``
(:mod:`scenarios.calibrate.fit_nccl`) against the collective model of ``--fidelity`` (default flow; use
the fidelity you will run at: the busbw correction records it, and ``run``/``nccl-tests`` warn under
another). ``--measured iteration_time_s=X``: one end-to-end number; it moves
only what the other inputs leave free (the GPU's sustained clock fraction, unless a trace fitted the
kernels, in which case it is compared, not fitted) and says by how much.

No fitted kernel beats the GPU's datasheet peak: a constant whose kernels ran faster (above 4x for
unit-stride 3x3 convolutions, Winograd's saving) points at misread shapes or dtype, and is fitted to the
peak, its note saying so. The profile (``--output``, default beside the first input:
``<input>.calibration.toml``) holds the fitted values in calibration.toml's layout, the rows they were
fitted to, the residuals and the unmatched kernels; it is checked as ``--calibration`` checks it (keys,
ranges) and written atomically. Apply it with ``--calibration PATH`` on any command or
``[simulation] calibration = "PATH"``. The shipped calibration.toml is never changed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from hwmodel.nccl.engine import FIDELITIES
from scenarios.cli import UserError, add_trust_code, output_file

FIT_RESIDUAL_WARN = 0.10
"""A fitted step further than this from the measured one is warned about: with every kernel constant free,
a fit of the same run lands within a few per cent (HTA's ResNet-50 trace: +0.2 %)."""


def register(subparsers) -> None:
    p = subparsers.add_parser("calibrate", help="fit the model's constants to a Kineto trace, nccl-tests logs or a "
                                                "measured iteration time; write a calibration profile",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kineto", metavar="TRACE", default=None,
                   help="PyTorch profiler (Kineto) Chrome-trace JSON, .json or .json.gz, of the model on one GPU")
    p.add_argument("--scenario", default=None, help="the traced model's scenario (a TOML file or catalog name)")
    p.add_argument("--nccl-log", metavar="FILE", nargs="+", default=None, help="nccl-tests output file(s)")
    p.add_argument("--system", default=None, help="the system the nccl-tests ran on (trainsim list systems)")
    p.add_argument("--fidelity", default=None, choices=FIDELITIES,
                   help="the collective model the --nccl-log fit is made against, as [simulation] fidelity: flow "
                        "(default), step or chunked; the fitted busbw correction reproduces the log under it")
    p.add_argument("--measured", metavar="iteration_time_s=X", default=None,
                   help="a measured end-to-end iteration time of --scenario, seconds")
    p.add_argument("--output", metavar="PATH", default=None, help="the profile to write (default beside the input)")
    add_trust_code(p)
    p.set_defaults(func=run)


def _measured(text: str | None) -> float | None:
    if text is None:
        return None
    key, _, value = text.partition("=")
    if key.strip() != "iteration_time_s":
        raise UserError(f"--measured: expected iteration_time_s=SECONDS, got {text!r}")
    try:
        x = float(value)
    except ValueError:
        raise UserError(f"--measured: iteration_time_s must be a number of seconds, got {value!r}") from None
    if not x > 0:
        raise UserError(f"--measured: iteration_time_s must be > 0, got {x:g}")
    return x


def _output(args: argparse.Namespace) -> Path:
    if args.output:
        return output_file("--output", args.output)
    first = args.kineto or (args.nccl_log[0] if args.nccl_log else None) or args.scenario
    src = Path(first)
    name = src.name.removesuffix(".gz").removesuffix(".json").removesuffix(".toml").removesuffix(".log")
    folder = src.parent if src.parent.is_dir() and src.exists() else Path()
    return folder / f"{name}.calibration.toml"


def run(args: argparse.Namespace) -> int:
    from scenarios.calibrate import CalibrationInputError

    measured = _measured(args.measured)
    if not (args.kineto or args.nccl_log or measured is not None):
        raise UserError("give --kineto TRACE, --nccl-log FILE... or --measured iteration_time_s=X")
    if (args.kineto or measured is not None) and not args.scenario:
        raise UserError("--kineto and --measured need --scenario (the measured model)")
    if args.nccl_log and not args.system:
        raise UserError("--nccl-log needs --system (the system the nccl-tests ran on)")
    if args.fidelity and not args.nccl_log:
        raise UserError("--fidelity applies to --nccl-log fits only (a trace or a measured time is simulated "
                        "at the scenario's [simulation] fidelity)")
    out = _output(args)
    try:
        return _calibrate(args, measured, out)
    except CalibrationInputError as exc:
        raise UserError(str(exc)) from None


def _calibrate(args: argparse.Namespace, measured: float | None, out: Path) -> int:
    from hwmodel.calibration_overlay import MODEL_SECTIONS, load_overlay, merge
    from hwmodel.calibration_schema import check_profile
    from scenarios.calibrate.profile import write_profile

    doc: dict[str, Any] = {"profile": {"name": out.stem, "created_by": "trainsim calibrate",
                                       "inputs": [str(x) for x in [args.kineto, *(args.nccl_log or [])] if x]}}
    sections: dict[str, Any] = {}
    scenario = prep = None
    kernels_fitted = False
    if args.scenario:
        from scenarios.cmd_run import load

        scenario = load(args.scenario, [], args.trust_code)
        doc["profile"]["scenario"] = scenario.name
    if args.kineto:
        from scenarios.calibrate.pipeline import pair_trace

        paired = pair_trace(args.kineto, scenario)
        prep = paired.prep
        kernel_doc, kernel_sections = _kernels(paired)
        doc.update(kernel_doc)
        sections = merge(sections, kernel_sections)
        kernels_fitted = True
    if args.nccl_log:
        sections = merge(sections, _nccl(args.nccl_log, args.system, args.fidelity or "flow", doc))
    if measured is not None:
        from scenarios.runner import prepare

        prep = prep or prepare(scenario)
        sections = merge(sections, _end_to_end(prep, measured, sections, kernels_fitted, doc))
    doc.update(sections)
    try:  # what --calibration would refuse is not written (a fit out of range: the inputs are at fault)
        check_profile(doc, MODEL_SECTIONS)
    except ValueError as exc:
        raise UserError(f"the fit gives {exc}; {out} not written (check that the inputs are this GPU's "
                        f"and this model's)") from None
    write_profile(out, doc)
    back = load_overlay(out)  # reads what was written, as --calibration will
    print(f"\nWrote {out} ({len(back.changed)} constant(s): {', '.join(back.changed[:8])}"
          + (", ..." if len(back.changed) > 8 else "") + ")")
    return 0


def _kernels(paired: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """Fit the kernel constants; print the comparison; return the profile's tables and model sections."""
    from hwmodel.calibration_overlay import Overlay
    from scenarios.calibrate.compare import pair_rows
    from scenarios.calibrate.fit_kernels import (
        fit_kernels,
        held_out_misses,
        holdout_names,
        holdout_splits,
        predicted_step_s,
    )
    from scenarios.calibrate.pipeline import simulate
    from scenarios.calibrate.profile import nested

    tr, m, gpu = paired.trace, paired.matching, paired.prep.topology.gpu_spec.name
    fit = fit_kernels(m, paired.model, tr.step_time_s, tr.busy_s)
    held = holdout_names(m)
    fit_out = fit_kernels(m, paired.model, tr.step_time_s, tr.busy_s, holdout=held)

    def sections_of(f: Any) -> dict[str, Any]:
        return nested({("gpu", gpu, *path): value for path, value in f.values().items()})

    before = simulate(paired.prep, None)
    after = simulate(paired.prep, Overlay("(fit)", "fit", sections_of(fit), ()))
    out_of_sample = simulate(paired.prep, Overlay("(holdout)", "holdout", sections_of(fit_out), ()))
    T = tr.step_time_s
    split_fits = {name: fit_kernels(m, paired.model, T, tr.busy_s, holdout=h) for name, h in holdout_splits(m).items()}
    splits = {name: predicted_step_s(m, paired.model, f.cal) / T - 1 for name, f in split_fits.items()}
    worst = max(splits, key=lambda n: abs(splits[n]))
    misses = held_out_misses(m, paired.model, split_fits[worst])
    print(f"# trainsim calibrate: {tr.path}, {tr.step_name} of {len(tr.steps)} step(s) on {tr.gpu_name or gpu}")
    print(f"  measured step          {T * 1e3:10.3f} ms  ({len(tr.ops)} op instances, "
          f"{sum(len(o.events) for o in tr.ops)} GPU events)")
    print(f"  simulated, shipped     {before * 1e3:10.3f} ms  ({before / T - 1:+.1%})")
    print(f"  simulated, fitted      {after * 1e3:10.3f} ms  ({after / T - 1:+.1%})")
    if abs(after / T - 1) > FIT_RESIDUAL_WARN:
        print(f"warning: the fitted model still misses the measured step by {after / T - 1:+.1%}: every kernel "
              f"constant was free to move, so the trace and the scenario likely differ in what runs (batch or "
              f"sequence size, dtype, parallelism); check [training] and [parallel] against the traced run",
              file=sys.stderr)
    print(f"  out of sample          {out_of_sample * 1e3:10.3f} ms  ({out_of_sample / T - 1:+.1%}; fitted "
          f"without {len(held)} of {len({p.op.main_kernel for p in m.pairs if p.op.events})} kernel names)")
    print(f"  over {len(splits)} held-out splits: mean |error| {sum(map(abs, splits.values())) / len(splits):.1%}, "
          f"max {max(map(abs, splits.values())):.1%} (each a third of the names; step as the sum of task times)")
    print(f"  worst split {worst} ({splits[worst]:+.1%}), its largest held-out misses: " + "; ".join(
        f"{n[:48]} ({k}) {(a - b) * 1e3:+.2f} ms" for n, k, a, b in misses[:3]))
    print(f"  {'constant':42s} {'shipped':>8s} {'fitted':>8s} {'rows':>5s} {'measured':>11s} {'before':>11s}")
    for c in fit.constants:
        print(f"  {'.'.join(c.path):42s} {c.shipped:8.4f} {c.fitted:8.4f} {c.rows:5d} {c.measured_s * 1e3:8.3f} ms "
              f"{c.predicted_before_s * 1e3:8.3f} ms {c.note}")
    print(f"  {'launch_overhead_s':42s} {fit.shipped_launch_overhead_s:8.2e} {fit.launch_overhead_s:8.2e}")
    clamped = [".".join(c.path) for c in fit.constants if c.note.startswith("clamped")]
    if clamped:
        print(f"  {len(clamped)} constant(s) fitted faster than the datasheet peak, clamped to it (see their "
              f"notes): {', '.join(clamped[:4])}" + (", ..." if len(clamped) > 4 else ""))
    unmatched = m.unmatched_kernels()
    if unmatched:
        print(f"  unmatched trace work: {len(unmatched)} kernel name(s), "
              f"{sum(r[2] for r in unmatched) * 1e3:.3f} ms (listed in the profile)")
    doc = {"fit": {"kernels": {
        "trace": tr.path, "step": tr.step_name, "measured_step_s": T, "simulated_shipped_s": before,
        "simulated_fitted_s": after, "error": after / T - 1, "simulated_out_of_sample_s": out_of_sample,
        "out_of_sample_error": out_of_sample / T - 1, "held_out_kernel_names": len(held),
        "out_of_sample_splits": splits,
        "worst_split": {"name": worst, "error": splits[worst], "misses": [
            {"kernel": n, "kind": k, "modelled_s": a, "measured_s": b} for n, k, a, b in misses[:10]]},
        "launch_overhead_terms": dict(fit.launch_terms),
        "constants": [{"path": ".".join(("gpu", gpu, *c.path)), "shipped": c.shipped, "fitted": c.fitted,
                       "rows": c.rows, "measured_s": c.measured_s, "predicted_shipped_s": c.predicted_before_s,
                       "predicted_fitted_s": c.predicted_after_s, "note": c.note} for c in fit.constants]}},
        "rows": pair_rows(m, paired.model, fit.cal),
        "unmatched": [{"kernel": n, "launches": k, "total_s": s} for n, k, s in unmatched]
        + [{"model_task": t.name, "layer": t.layer, "kind": t.kind} for t in m.unmatched_tasks]}
    return doc, sections_of(fit)


def _nccl(paths: list[str], system: str, fidelity: str, doc: dict[str, Any]) -> dict[str, Any]:
    from hwmodel.calibration_overlay import merge
    from scenarios.calibrate.fit_nccl import COMPARED_FROM_BYTES, fit_nccl
    from scenarios.calibrate.nccl_log import read_nccl_log

    sections: dict[str, Any] = {}
    fits = []
    for path in paths:
        log = read_nccl_log(path)
        f = fit_nccl(log, system, fidelity)
        if not log.gpu_name:
            print(f"note: {path}: no Rank line names the GPU; not checked against {system}", file=sys.stderr)
        for number, text in log.skipped:
            print(f"warning: {path}:{number}: not a complete nccl-tests result row, left out of the fit: "
                  f"{text[:60]!r}", file=sys.stderr)
        sections = merge(sections, f.sections)
        print(f"# trainsim calibrate: {path}: {log.collective}, {log.ranks} ranks on {log.nodes} node(s) of {system}"
              + (f", NCCL {log.nccl_version}" if log.nccl_version else "") + f"; fitted under fidelity {fidelity}")
        for key, a, b in f.changed:
            print(f"  {key:40s} {a:.4g} -> {b:.4g}")
        for line in f.not_fitted:
            print(f"  {line}")
        _group_size_note(log, f)
        print(f"  {'size':>12s} {'measured':>9s} {'simulated':>9s} {'error':>7s} {'held out':>9s} {'error':>7s}"
              "  (busbw GB/s; held out: fitted without the sizes marked)")
        for c in f.comparison:
            out = (f" {c['held_out_simulated_busbw_GBps']:9.2f} {c['held_out_error']:+7.1%}" if c["held_out"] else "")
            print(f"  {c['size_bytes']:12d} {c['measured_busbw_GBps']:9.2f} {c['simulated_busbw_GBps']:9.2f} "
                  f"{c['error']:+7.1%}{out}")
        band = [c for c in f.comparison if c["size_bytes"] >= COMPARED_FROM_BYTES]
        if band:
            print(f"  from 1 MiB: in-sample max {max(abs(c['error']) for c in band):.1%}, held-out max "
                  f"{max((abs(c['held_out_error']) for c in band if c['held_out']), default=0.0):.1%}"
                  f" ({f.curve_knots} busbw correction knot(s))")
        if f.curve_knots:
            sizes = [c["size_bytes"] for c in f.comparison]
            print(f"  the busbw correction covers {min(sizes)}-{max(sizes)} B; other sizes take its end values")
        fits.append({"log": path, "system": system, "collective": log.collective, "ranks": log.ranks,
                     "nodes": log.nodes, "gpus_per_thread": log.gpus_per_thread, "nccl_version": log.nccl_version,
                     "fidelity": fidelity, "not_fitted": f.not_fitted,
                     "skipped_lines": [n for n, _ in log.skipped],
                     "changed": [{"path": k, "shipped": a, "fitted": b, "fitted_ranks": log.ranks,
                                  "fitted_nodes": log.nodes} for k, a, b in f.changed],
                     "sizes": f.comparison})
    doc.setdefault("fit", {})["nccl"] = fits
    return {"nccl": sections}


def _group_size_note(log: Any, f: Any) -> None:
    """Say which group size the fitted bandwidth fraction was measured on: it applies to collectives of every
    size, and busbw is not the same at every size (NCCL picks channels and algorithms per communicator: 8x
    H100 NVLS all_reduce_perf, busbw 367.5 GB/s on 2-4 GPUs, 480 GB/s on 8, NVIDIA/nccl#1455). Warn when the
    log ran on part of a node."""
    for key, _, _ in f.changed:
        if not key.startswith(("nccl.nvlink_efficiency.", "nccl.ib_app_efficiency")):
            continue
        print(f"  {key} measured on {log.ranks}-rank {log.collective} ({log.nodes} node(s)); applied to "
              f"collectives of every group size")
        if log.nodes == 1 and log.ranks < f.gpus_per_node:
            print(f"warning: {log.path}: {key} was fitted to {log.ranks} of the node's {f.gpus_per_node} GPUs and "
                  f"will price collectives of every group size (a full-node data- or tensor-parallel group "
                  f"included) at it: fit a log of the group size you train with (all_reduce_perf -g "
                  f"{f.gpus_per_node})", file=sys.stderr)


def _end_to_end(prep: Any, measured: float, sections: dict[str, Any], kernels_fitted: bool,
                doc: dict[str, Any]) -> dict[str, Any]:
    from hwmodel.calibration_overlay import Overlay
    from hwmodel.costmodel import Calibration
    from scenarios.calibrate.fit_measured import fit_clock
    from scenarios.calibrate.pipeline import simulate

    gpu = prep.topology.gpu_spec
    if kernels_fitted:
        t = simulate(prep, Overlay("(fit)", "fit", sections, ()))
        print(f"# measured iteration {measured:.6g} s, simulated with the fitted kernels {t:.6g} s "
              f"({t / measured - 1:+.1%}); the trace fixed the kernel constants: nothing moved")
        doc.setdefault("fit", {})["measured"] = {"iteration_time_s": measured, "simulated_s": t, "moved": ""}
        return {}
    shipped = Calibration.load().for_gpu(gpu).sustained_clock_fraction
    value, t0, t1 = fit_clock(prep, measured, sections, shipped)
    print(f"# measured iteration {measured:.6g} s: simulated {t0:.6g} s before, {t1:.6g} s after; moved "
          f"gpu.{gpu.name}.sustained_clock_fraction {shipped:.4f} -> {value:.4f} ({value / shipped - 1:+.1%})")
    doc.setdefault("fit", {})["measured"] = {"iteration_time_s": measured, "simulated_before_s": t0,
                                             "simulated_after_s": t1,
                                             "moved": f"gpu.{gpu.name}.sustained_clock_fraction",
                                             "shipped": shipped, "fitted": value}
    return {"gpu": {gpu.name: {"sustained_clock_fraction": value}}}
