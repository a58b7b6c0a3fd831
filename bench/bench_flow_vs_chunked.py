"""Flow vs chunked NCCL fidelity on nccl-tests sizes: relative difference per collective, topology, size.

The chunked fidelity (``hwmodel/nccl/chunked.py``) is the reference; the flow fidelity must agree with it
within 2 % at every size >= 64 KiB. Prints one table per (system, GPUs) case: rows are sizes 64 KiB ..
8 GiB, columns the collectives, each cell ``flow / chunked - 1`` of the GPU time (one GPU per thread,
so the host launch term of ``-g`` does not hide anything), with the algorithm/protocol the tuner chose;
then the worst cell per case and the wall time of each fidelity.

    .venv/bin/python bench/bench_flow_vs_chunked.py [--max-size 8G] [--cases a100x8,h100x16]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without install

from hwmodel.nccl.engine import simulate_nccl_tests  # noqa: E402
from hwmodel.nccl.nccltests import size_sweep  # noqa: E402
from hwmodel.topology import build_system  # noqa: E402

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all")
CASES: dict[str, tuple[str, int, int]] = {  # name -> (system, nodes, GPUs of the communicator)
    "a100x8": ("dgx-a100", 1, 8), "a100x16": ("dgx-a100", 2, 16), "a100x32": ("dgx-a100", 4, 32),
    "a100x2": ("dgx-a100", 1, 2), "a100x4": ("dgx-a100", 1, 4),
    "h100x8": ("dgx-h100", 1, 8), "h100x16": ("dgx-h100", 2, 16),
    "h100x2": ("dgx-h100", 1, 2), "h100x4": ("dgx-h100", 1, 4),
}


def differences(system: str, nodes: int, n_gpus: int, coll: str, sizes: list[int]
                ) -> tuple[dict[int, tuple[float, str]], float, float]:
    """size -> (flow / chunked - 1, algo/proto), and the wall time of each fidelity's sweep (s)."""
    topo = build_system(system, nodes)
    gpus = topo.gpus()[:n_gpus]
    t0 = time.perf_counter()
    flow = simulate_nccl_tests(topo, coll, sizes, gpus=gpus, fidelity="flow")
    t1 = time.perf_counter()
    chk = simulate_nccl_tests(topo, coll, sizes, gpus=gpus, fidelity="chunked")
    t2 = time.perf_counter()
    out = {c.size_bytes: (f.time_s / c.time_s - 1, f"{c.algorithm}/{c.protocol}")
           for f, c in zip(flow, chk, strict=True)}
    return out, t1 - t0, t2 - t1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--min-size", default="64K")
    ap.add_argument("--max-size", default="8G")
    ap.add_argument("--cases", default=",".join(CASES), help="comma-separated, of: " + ", ".join(CASES))
    ap.add_argument("--collectives", default=",".join(COLLECTIVES))
    args = ap.parse_args()
    sizes = size_sweep(args.min_size, args.max_size, 2)
    worst_all = 0.0
    for case in args.cases.split(","):
        system, nodes, n = CASES[case]
        colls = args.collectives.split(",")
        table: dict[str, dict[int, tuple[float, str]]] = {}
        walls = [0.0, 0.0]
        for coll in colls:
            table[coll], tf, tc = differences(system, nodes, n, coll, sizes)
            walls[0] += tf
            walls[1] += tc
        print(f"\n## {case}: {system} x {nodes} node(s), {n} GPUs  (flow / chunked - 1)   "
              f"wall: flow {walls[0]:.2f} s, chunked {walls[1]:.2f} s")
        print(f"{'size':>8s}" + "".join(f"  {c:>22s}" for c in colls))
        for s in sizes:
            cells = []
            for c in colls:
                d, ap_ = table[c][s]
                cells.append(f"{100 * d:+7.2f}% {ap_:>14s}")
            print(f"{_fmt(s):>8s}" + "".join(f"  {x:>22s}" for x in cells))
        worst = max(((abs(d), c, s) for c in colls for s, (d, _) in table[c].items()))
        worst_all = max(worst_all, worst[0])
        print(f"worst: {100 * worst[0]:.2f} % ({worst[1]} at {_fmt(worst[2])})")
    print(f"\nworst over all cases: {100 * worst_all:.2f} % (target <= 2 %)")
    return 0


def _fmt(s: int) -> str:
    for unit, k in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if s >= k and s % k == 0:
            return f"{s // k}{unit}"
    return str(s)


if __name__ == "__main__":
    sys.exit(main())
