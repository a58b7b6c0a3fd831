"""``trainsim synth``: P² parallelism placement and reduction-program synthesis (Xie et al., MLSys'22).

    trainsim synth --system dgx-a100 --nodes 4 --axes dp=16,tp=2 --reduce dp --size 1G

Enumerates every placement of the parallelism axes on the system's hierarchy (nodes > GPUs),
synthesises the reduction programs over the reduced axes for each, and ranks them (alpha-beta
pre-screen, then simulation of the best ``--top`` and the default all-reduce on the hardware model).
``--axes`` sizes must multiply to the number of GPUs; ``--size`` is the per-device buffer (K/M/G suffixes,
powers of 1024).
"""

from __future__ import annotations

import argparse

from scenarios.cli import UserError, output_file


def register(subparsers) -> None:
    from hwmodel.topology import known_systems

    p = subparsers.add_parser("synth", help="P2: rank placements and synthesised reduction programs",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--system", default="dgx-a100", help=f"one of {', '.join(known_systems())} (default dgx-a100)")
    p.add_argument("--nodes", type=int, default=1, help="nodes (default 1)")
    p.add_argument("--axes", required=True, metavar="NAME=SIZE,...",
                   help="parallelism axes, outermost first, e.g. dp=16,tp=2 (sizes multiply to the GPU count)")
    p.add_argument("--reduce", required=True, metavar="AXIS[,AXIS]", help="axes to reduce over, e.g. dp")
    p.add_argument("--size", default="1G", help="bytes per device, K/M/G suffix (default 1G)")
    p.add_argument("--top", type=int, default=10, metavar="K", help="programs listed and simulated per placement")
    p.add_argument("--analytical", action="store_true", help="rank by the alpha-beta cost only (no simulation)")
    p.add_argument("--fidelity", default="flow", choices=("flow", "step"), help="NCCL engine fidelity")
    p.add_argument("--json", metavar="PATH", default=None, help="write the report as JSON")
    p.add_argument("--plot", metavar="PATH", default=None, help="PNG of all-reduce vs best program per placement")
    p.set_defaults(func=run)


def parse_axes(text: str) -> dict[str, int]:
    """``"dp=16,tp=2"`` -> ``{"dp": 16, "tp": 2}`` (order kept).

    Raises:
        UserError: not of that form.
    """
    axes: dict[str, int] = {}
    for item in text.split(","):
        name, sep, size = item.partition("=")
        name = name.strip()
        if not sep or not name or not size.strip().isdigit():
            raise UserError(f"--axes {text!r}: expected name=size,..., e.g. dp=16,tp=2")
        if name in axes:
            raise UserError(f"--axes {text!r}: axis {name!r} given twice")
        axes[name] = int(size)
    return axes


def run(args: argparse.Namespace) -> int:
    from hwmodel.nccl.nccltests import parse_size
    from scenarios.p2 import plot_spread, run_synth
    from scenarios.report import write_json

    if args.nodes < 1:
        raise UserError(f"--nodes must be >= 1, got {args.nodes}")
    if args.top < 1:
        raise UserError(f"--top must be >= 1, got {args.top}")
    axes = parse_axes(args.axes)
    reduce = [a.strip() for a in args.reduce.split(",") if a.strip()]
    unknown = [a for a in reduce if a not in axes]
    if not reduce or unknown:
        raise UserError(f"--reduce {args.reduce!r}: unknown axis {', '.join(unknown) or '(none)'}; "
                        f"axes: {', '.join(axes)}")
    size = parse_size(args.size)
    json_path = output_file("--json", args.json) if args.json else None  # before the work, as run checks
    plot_path = output_file("--plot", args.plot) if args.plot else None
    report = run_synth(args.system, args.nodes, axes, reduce, size, top_k=args.top, simulate=not args.analytical,
                       fidelity=args.fidelity)
    print(report.to_text())
    written = []
    if json_path:
        written.append(write_json(json_path, report.to_json()))
    if plot_path:
        try:
            written.append(plot_spread(report, plot_path))
        except OSError as exc:
            raise UserError(f"cannot write {args.plot}: {exc.strerror}") from None
    if written:
        print("\nWrote " + ", ".join(str(p) for p in written))
    return 0
