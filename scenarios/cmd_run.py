"""``trainsim run``: simulate one training iteration of a scenario and print the report.

    trainsim run                                   # the built-in default scenario
    trainsim run sc21-gpt-1.7b                     # a catalog scenario (trainsim list scenarios)
    trainsim run my.toml --set parallel.tensor_model_parallel_size=4 --json out.json --plots figs/

SCENARIO is a TOML file or a catalog name; ``--set section.key=value`` overrides one key (the value is
read as TOML: ``8``, ``true``, ``"ring"``; anything else is a string), and may be repeated.

Exit status: 0 on success; 2 for bad input (one line on stderr), and for a run estimated above
``--max-tasks`` tasks (the data-parallel rings' mirrored route hops counted as tasks of the same wall
time; it says how many and how long, before simulating); 3 when the configuration
does not fit in GPU memory (the report shows the memory verdict; ``OOM: ...`` on stderr). An OOM
configuration is not simulated unless ``--simulate-oom`` is given; then it exits 0 with the verdict as
a warning on stderr.

A scenario file is data, except for ``[model] factory``, which imports a module or runs a Python file:
it runs only with ``--trust-code`` (or ``TRAINSIM_TRUST_CODE=1``); the shipped catalog is trusted.
Output files need an existing folder; ``--plots DIR`` creates DIR (and its missing parents only when
written ``DIR/``).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from scenarios.catalog import catalog_names, is_sweep_file, scenario_path
from scenarios.cli import UserError, add_trust_code, output_dir, output_file
from scenarios.report import format_memory_only, format_report, write_json, write_plots, write_trace
from scenarios.scenario import load_scenario

EXIT_OOM = 3
"""Exit status of a configuration that does not fit in GPU memory."""


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "run", help="simulate one training iteration of a scenario and print the report",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("scenario", nargs="?", default=None,
                   help="scenario TOML file or catalog name (default: the built-in default scenario)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override a scenario key, e.g. --set parallel.tensor_model_parallel_size=4 (repeatable)")
    p.add_argument("--json", metavar="PATH", default=None,
                   help="write the metrics as JSON (SI units, sorted keys; reproducible byte for byte)")
    p.add_argument("--trace", metavar="PATH", default=None,
                   help="write a Chrome/Perfetto (Kineto) trace; .json.gz is compressed")
    p.add_argument("--plots", metavar="DIR", default=None, help="write gantt.png, links.png, breakdown.png to DIR")
    p.add_argument("--simulate-oom", action="store_true",
                   help="simulate even when the configuration does not fit in GPU memory (exit 0, the verdict "
                        "as a warning)")
    p.add_argument("--max-tasks", type=float, default=None, metavar="N",
                   help="refuse a run estimated above N simulated tasks (mirrored ring route hops counted "
                        "as tasks of the same time), saying how many and how long "
                        "(default 2,000,000: minutes; the catalog's largest is about 524,000)")
    add_trust_code(p)
    p.set_defaults(func=run)


def load(name: str | None, overrides: list[str], trust_code: bool = False):
    """The :class:`~scenarios.scenario.Scenario` named on the command line (a path or a catalog name,
    ``None`` or ``"default"``: the built-in default), with ``--set`` overrides applied.

    Raises:
        UserError: unknown catalog name, or a sweep file (which ``trainsim sweep`` runs).
        FileNotFoundError, ValueError: from :func:`scenarios.scenario.load_scenario`.
    """
    if name is None or name == "default" and not Path(name).exists():  # "default" names it, as sweep takes it
        return load_scenario(None, overrides, trust_code=trust_code)
    path = scenario_path(name)
    if not path.exists():
        if Path(name).suffix == ".toml" or "/" in name:
            raise FileNotFoundError(f"scenario file not found: {name}")
        raise UserError(f"no scenario file or catalog scenario {name!r}; catalog: {', '.join(catalog_names())}")
    if is_sweep_file(path):
        raise UserError(f"{name} is a sweep file (it has a [sweep] table): run it with 'trainsim sweep {name}'")
    return load_scenario(path, overrides, trust_code=trust_code)


def run(args: argparse.Namespace) -> int:
    # deferred: the runner imports torch, which every trainsim command would otherwise pay for
    from scenarios.runner import DEFAULT_MAX_TASKS, memory_for, prepare, run_prepared

    t0 = time.perf_counter()
    max_tasks = DEFAULT_MAX_TASKS if args.max_tasks is None else args.max_tasks
    if not max_tasks > 0:
        raise UserError(f"--max-tasks must be a positive number, got {args.max_tasks:g}")
    json_path = output_file("--json", args.json) if args.json else None
    trace_path = output_file("--trace", args.trace) if args.trace else None
    plots_dir = output_dir("--plots", args.plots) if args.plots else None
    scenario = load(args.scenario, args.overrides, args.trust_code)
    prep = prepare(scenario)  # once: the memory verdict and the run share it
    mem = memory_for(prep)
    gpu = prep.topology.gpu_spec
    if mem is not None and not mem.fits(gpu) and not args.simulate_oom:
        print(format_memory_only(prep, mem))
        print(f"OOM: {scenario.name}: {mem.verdict(gpu).removeprefix('OOM: ')}", file=sys.stderr)
        return EXIT_OOM
    rep = run_prepared(prep, mem, progress=sys.stderr.isatty(), started_s=t0, max_tasks=max_tasks)
    print(format_report(rep))
    if rep.metrics.get("warnings"):  # what-ifs that change nothing (scenarios.notes)
        print("\nWarnings\n" + "\n".join(f"  {note}" for note in rep.metrics["warnings"]))
    written = []
    if json_path:
        written.append(write_json(json_path, rep.to_json()))
    if trace_path:
        written.append(write_trace(rep, trace_path))
    if plots_dir:
        written += write_plots(rep, plots_dir)
    if written:
        print("\nWrote " + ", ".join(str(p) for p in written))
    if rep.metrics.get("oom"):  # simulated on request (--simulate-oom): a warning, not a failure
        print(f"warning: OOM: {scenario.name}: {rep.metrics['memory']['verdict'].removeprefix('OOM: ')} "
              f"(simulated anyway: --simulate-oom)", file=sys.stderr)
    return 0
