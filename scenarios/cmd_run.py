"""``trainsim run``: simulate one training iteration of a scenario and print the report.

    trainsim run                                   # the built-in default scenario
    trainsim run sc21-gpt-1.7b                     # a catalog scenario (trainsim list scenarios)
    trainsim run my.toml --set parallel.tensor_model_parallel_size=4 --json out.json --plots figs/

SCENARIO is a TOML file or a catalog name; ``--set section.key=value`` overrides one key (the value is
read as TOML: ``8``, ``true``, ``"ring"``; anything else is a string), and may be repeated.

Exit status: 0 on success; 2 for bad input (one line on stderr); 3 when the configuration does not fit
in GPU memory (the report shows the memory verdict; ``OOM: ...`` on stderr). An OOM configuration is
not simulated unless ``--simulate-oom`` is given.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from scenarios.catalog import catalog_names, is_sweep_file, scenario_path
from scenarios.cli import UserError
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
                   help="simulate even when the configuration does not fit in GPU memory")
    p.set_defaults(func=run)


def load(name: str | None, overrides: list[str]):
    """The :class:`~scenarios.scenario.Scenario` named on the command line (a path or a catalog name,
    ``None``: the default), with ``--set`` overrides applied.

    Raises:
        UserError: unknown catalog name, or a sweep file (which ``trainsim sweep`` runs).
        FileNotFoundError, ValueError: from :func:`scenarios.scenario.load_scenario`.
    """
    if name is None:
        return load_scenario(None, overrides)
    path = scenario_path(name)
    if not path.exists():
        if Path(name).suffix == ".toml" or "/" in name:
            raise FileNotFoundError(f"scenario file not found: {name}")
        raise UserError(f"no scenario file or catalog scenario {name!r}; catalog: {', '.join(catalog_names())}")
    if is_sweep_file(path):
        raise UserError(f"{name} is a sweep file (it has a [sweep] table): run it with 'trainsim sweep {name}'")
    return load_scenario(path, overrides)


def run(args: argparse.Namespace) -> int:
    # deferred: the runner imports torch, which every trainsim command would otherwise pay for
    from scenarios.runner import memory_for, prepare, run_prepared

    t0 = time.perf_counter()
    scenario = load(args.scenario, args.overrides)
    prep = prepare(scenario)  # once: the memory verdict and the run share it
    mem = memory_for(prep)
    gpu = prep.topology.gpu_spec
    if mem is not None and not mem.fits(gpu) and not args.simulate_oom:
        print(format_memory_only(prep, mem))
        print(f"OOM: {scenario.name}: {mem.verdict(gpu).removeprefix('OOM: ')}", file=sys.stderr)
        return EXIT_OOM
    rep = run_prepared(prep, mem, progress=sys.stderr.isatty(), started_s=t0)
    print(format_report(rep))
    written = []
    if args.json:
        written.append(write_json(args.json, rep.to_json()))
    if args.trace:
        written.append(write_trace(rep, args.trace))
    if args.plots:
        written += write_plots(rep, args.plots)
    if written:
        print("\nWrote " + ", ".join(str(p) for p in written))
    if rep.metrics.get("oom"):
        print(f"OOM: {scenario.name}: {rep.metrics['memory']['verdict'].removeprefix('OOM: ')}", file=sys.stderr)
        return EXIT_OOM
    return 0
