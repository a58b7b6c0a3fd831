"""Benchmark: P²'s three findings on DGX A100 systems of 4, 8 and 16 nodes, as trainsim sees them.

For every node count, axes set and reduction (``scenarios.p2.report.default_axes_sets``): enumerate
the placements (parallelism matrices), synthesise every reduction program of up to ``--max-len``
steps, simulate each on the hardware model and report the all-reduce spread across placements, the
share of cases a synthesised program beats the default all-reduce, the max and mean speedup, and how
often the analytical pre-screen's top 10 holds the simulator's best -- beside P²'s 448x / 69 % /
2.04x / 1.27x / > 90 %. About a minute with the defaults.

    .venv/bin/python bench/bench_p2.py [--nodes 4,8,16] [--size-mib 64] [--max-len 3]
                                       [--fidelity flow] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without install


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", default="4,8,16", help="comma-separated node counts (default 4,8,16)")
    ap.add_argument("--size-mib", type=float, default=64.0, help="per-device buffer in MiB (default 64)")
    ap.add_argument("--max-len", type=int, default=3, help="program length bound (default 3)")
    ap.add_argument("--fidelity", default="flow", choices=("flow", "step"))
    ap.add_argument("--system", default="dgx-a100")
    ap.add_argument("--json", default=None, help="also write the full report as JSON here")
    args = ap.parse_args(argv)

    from scenarios.p2.report import p2_findings

    t0 = time.perf_counter()
    nodes = tuple(int(x) for x in args.nodes.split(",") if x)
    rep = p2_findings(nodes, int(args.size_mib * 2**20), system=args.system, max_len=args.max_len,
                      fidelity=args.fidelity,
                      progress=lambda s: print(f"  [{time.perf_counter() - t0:6.1f} s] {s}", flush=True))
    print()
    print(rep.to_text())
    n_sim = sum(c.simulated for r in rep.rows for c in r.cases)
    print(f"\n{n_sim} simulations, total wall {time.perf_counter() - t0:.1f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(rep.to_json(), indent=1))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
