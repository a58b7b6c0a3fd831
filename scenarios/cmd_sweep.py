"""``trainsim sweep``: run a scenario at every point of a cartesian product of varied keys.

    trainsim sweep default --vary parallel.tensor_model_parallel_size=4,8 --vary training.micro_batch_size=1,2
    trainsim sweep whatif-nic-bandwidth --plot nic.png --workers 3

SCENARIO is a TOML file or catalog name; a *sweep file* (a scenario with a ``[sweep]`` table, see
``scenarios/sweep.py``) brings its own varied keys, which ``--vary`` extends or replaces. Prints one row
per point in order: the varied values, iteration time, TFLOP/s per GPU, MFU and the memory verdict
(points that do not fit in GPU memory are not simulated). ``--plot`` draws the first varied key against
iteration time (PATH) and TFLOP/s per GPU (PATH with ``_tflops`` added), one line per value of the
second varied key.

A sweep file is data, except for ``[model] factory`` (see ``trainsim run``): it runs only with
``--trust-code`` (or ``TRAINSIM_TRUST_CODE=1``); the shipped catalog is trusted.

Exit status: 0 when every point ran (points that do not fit in memory included: their rows say OOM);
2 for bad input, and when some points failed (invalid configurations: the other points still run and
print, each failed row shows its error, and stderr names the first).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from scenarios.cli import UserError, add_trust_code, output_file
from scenarios.report import write_json

EXIT_BAD_POINT = 2
"""Exit status when some points of a sweep failed: their configuration is bad input, as for ``run``."""


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "sweep", help="run a scenario over a grid of parameter values and tabulate the results",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("scenario", help="scenario or sweep file, or a catalog name ('default': the built-in one)")
    p.add_argument("--vary", action="append", default=[], metavar="SECTION.KEY=V1,V2,...",
                   help="values to try for one key, e.g. --vary system.nodes=1,2,4 (repeatable: cartesian product)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override a key of the base scenario (repeatable)")
    p.add_argument("--json", metavar="PATH", default=None, help="write the rows (and each point's metrics) as JSON")
    p.add_argument("--plot", metavar="PATH", default=None,
                   help="PNG of iteration time vs the first varied key (and PATH_tflops.png)")
    p.add_argument("--workers", type=int, default=1, metavar="N", help="worker processes (default 1)")
    p.add_argument("--simulate-oom", action="store_true", help="simulate points that do not fit in memory too")
    add_trust_code(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # deferred: the sweep module imports the runner, hence torch, which every trainsim command would
    # otherwise pay for
    from scenarios.sweep import format_rows, load_sweep, plot_rows, point_scenario, run_sweep

    if args.workers < 1:
        raise UserError(f"--workers must be >= 1, got {args.workers}")
    from scenarios.scenario import shipped_and_unchanged
    from scenarios.user_code import check_trusted

    json_path = output_file("--json", args.json) if args.json else None
    plot_path = output_file("--plot", args.plot) if args.plot else None
    name = None if args.scenario == "default" and not Path("default").exists() else args.scenario
    sweep = load_sweep(name, args.vary, args.overrides)
    trusted = args.trust_code or shipped_and_unchanged(None if name is None else sweep.source,
                                                       [*args.overrides, *args.vary])
    base_dir = Path(sweep.source).parent if name is not None else None
    # Check that every point may run its code before spending time simulating; a point whose
    # configuration is invalid is not an error of the sweep: its row carries the error (run_point) --
    # unless every point's scenario is refused alike (an unknown key, a wrong type: no value of the varied
    # key helps), which is bad input of the sweep, said once.
    refused: list[str] = []
    for values in sweep.points():
        try:
            sc = point_scenario(sweep.base, values, sweep.source)
        except ValueError as exc:
            refused.append(str(exc))
            continue
        if "factory" in sc.model:
            check_trusted(sc.model["factory"], trusted, base_dir)
    if refused and len(refused) == len(sweep.points()) and len(set(refused)) == 1:
        raise UserError(f"every point: {refused[0]}")
    rows = run_sweep(sweep, workers=args.workers, simulate_oom=args.simulate_oom, progress=sys.stderr.isatty())
    print(format_rows(sweep, rows))
    written = []
    if json_path:
        doc = {"sweep": sweep.name, "source_scenario": sweep.base, "vary": dict(sweep.vary),
               "rows": [r.to_json() for r in rows]}
        written.append(write_json(json_path, doc))
    if plot_path:
        written += plot_rows(sweep, rows, plot_path)
    if written:
        print("\nWrote " + ", ".join(str(p) for p in written))
    if rows and all(r.error for r in rows):
        raise UserError(f"every point failed; first error: {rows[0].error}")
    failed = [r for r in rows if r.error]
    if failed:
        print(f"trainsim sweep: {len(failed)} of {len(rows)} points failed; first: {failed[0].error}",
              file=sys.stderr)
        return EXIT_BAD_POINT
    return 0
