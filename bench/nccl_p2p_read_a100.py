"""The A100 P2P-read slice cost (``NcclEngine(p2p_read_cost=True)``) against the two public 8x A100 all-reduce
sweeps, and what it does to NCCL's protocol choice in the simulator.

Measured rows: ``tests/data/nccl_tests_azure_sweeps.csv`` (ND A100 v4, NCCL 2.18.5, ``-g 8``) and
``tests/data/nccl_tests_a100_8gpu.csv`` (stas00/ml-engineering, ``-g 8``, NCCL version not stated). Nothing is
fitted to either. Prints each row's busbw error without and with the cost (flow fidelity; chunked is equal),
then, with the cost, every A100 group and size where NCCL's pick is simulated > 10 % slower than another
enabled (algorithm, protocol) pair (the check of ``tests/hwmodel/nccl/test_tuner_choice_in_sim.py``).

    .venv/bin/python bench/nccl_p2p_read_a100.py
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without install

from hwmodel.cluster import Cluster  # noqa: E402
from hwmodel.nccl import tuner  # noqa: E402
from hwmodel.nccl.engine import NcclEngine, simulate_nccl_tests  # noqa: E402
from hwmodel.topology import build_system  # noqa: E402

MiB = 1 << 20
SIZES = [1 << 10, 1 << 16, 1 << 20, 4 * MiB, 16 * MiB, 32 * MiB, 64 * MiB, 256 * MiB, 1 << 31]


def _measured() -> dict[str, dict[int, float]]:
    out: dict[str, dict[int, float]] = {"azure-nd-a100-v4 (2.18.5)": {}, "stas00 8x A100": {}}
    with (ROOT / "tests" / "data" / "nccl_tests_azure_sweeps.csv").open(encoding="utf-8") as fh:
        for r in csv.DictReader(fh):
            if r["sweep"] == "azure-nd-a100-v4":
                out["azure-nd-a100-v4 (2.18.5)"][int(r["size_bytes"])] = float(r["busbw_GBps"])
    with (ROOT / "tests" / "data" / "nccl_tests_a100_8gpu.csv").open(encoding="utf-8") as fh:
        for r in csv.DictReader(fh):
            out["stas00 8x A100"][int(r["size_bytes"])] = float(r["busbw_GBps"])
    return out


def _tuner_misses(topo, gpus, coll: str) -> list[str]:
    ct = NcclEngine(Cluster(topo, record=False)).comm_topology(gpus)
    bad = []
    for size in SIZES:
        run = {"gpus": gpus, "p2p_read_cost": True}
        chosen = simulate_nccl_tests(topo, coll, [size], **run)[0]
        best = min((simulate_nccl_tests(topo, coll, [size], algorithm=a, protocol=p, **run)[0].time_s, a, p)
                   for a, p in tuner.enabled_pairs(coll, ct))
        if chosen.time_s > 1.1 * best[0]:
            bad.append(f"{size // 1024} KiB {chosen.algorithm}/{chosen.protocol} {chosen.time_s * 1e6:.1f} us vs "
                       f"{best[1]}/{best[2]} {best[0] * 1e6:.1f} us")
    return bad


def main() -> None:
    topo = build_system("dgx-a100", 1)
    for name, rows in _measured().items():
        print(f"# {name}: busbw error, without / with the P2P-read slice cost")
        for size in sorted(s for s in rows if s >= MiB):
            off, on = (simulate_nccl_tests(topo, "all_reduce", [size], gpus_per_thread=8, p2p_read_cost=c)[0]
                       for c in (False, True))
            err_off, err_on = (r.busbw_Bps / 1e9 / rows[size] - 1 for r in (off, on))
            print(f"{size:>12d}  {off.protocol:6s}  {rows[size]:7.2f} GB/s  {err_off:+7.1%}  {err_on:+7.1%}")
    print("# with the cost: NCCL's pick > 10 % slower than another pair (GPU time, one GPU per thread)")
    for k in (8, 4, 2):
        gpus = tuple(topo.gpus()[:k])
        for coll in ("all_reduce", "all_gather", "reduce_scatter"):
            print(f"a100-{k} {coll}: {_tuner_misses(topo, gpus, coll) or 'none'}")


if __name__ == "__main__":
    main()
