"""nccl-tests busbw of public logs with their NCCL version against the simulator, per size band.

Rows: ``tests/data/nccl_tests_azure_sweeps.csv`` (three 8-GPU all-reduce sweeps, 1 KiB-8 GiB, ``-g 8``) and
``tests/data/nccl_tests_public_points.csv`` (issue-thread figures); sources in ``tests/data/README.md``.
Nothing is fitted to them. Prints, for the flow and chunked fidelities, each sweep's busbw error range and
mean |error| in the issue's bands (below 1 MiB, 1-64 MiB, from 64 MiB), then every point's error.

    .venv/bin/python bench/nccl_public_logs.py
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without install

from hwmodel.nccl.engine import simulate_nccl_tests  # noqa: E402
from hwmodel.topology import build_system  # noqa: E402

MiB = 1 << 20
BANDS = (("< 1 MiB", 0, MiB), ("1-64 MiB", MiB, 64 * MiB), (">= 64 MiB", 64 * MiB, 1 << 62))
_TOPOS: dict = {}


def _busbw_GBps(row: dict, fidelity: str, algorithm: str | None) -> float:
    system = row["system"]
    topo = _TOPOS.setdefault(system, build_system(system, 1))
    return simulate_nccl_tests(topo, row["collective"], [int(row["size_bytes"])],
                               gpus=topo.gpus()[:int(row["ranks"])], gpus_per_thread=int(row["gpus_per_thread"]),
                               algorithm=algorithm, fidelity=fidelity)[0].busbw_Bps / 1e9


def _read(name: str) -> list[dict]:
    with (ROOT / "tests" / "data" / name).open(encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def main() -> None:
    sweeps = _read("nccl_tests_azure_sweeps.csv")
    print(f"{'sweep':18s} {'NCCL':7s} {'fidelity':8s} " + "  ".join(f"{b[0]:>26s}" for b in BANDS))
    for name in sorted({r["sweep"] for r in sweeps}):
        rows = [r for r in sweeps if r["sweep"] == name]
        for fidelity in ("flow", "chunked"):
            cells = []
            for _, lo, hi in BANDS:
                errs = [_busbw_GBps(r, fidelity, r["nccl_algo"] or None) / float(r["busbw_GBps"]) - 1
                        for r in rows if lo <= int(r["size_bytes"]) < hi]
                mean = sum(abs(e) for e in errs) / len(errs)
                cells.append(f"{min(errs):+6.1%}..{max(errs):+6.1%} ({mean:4.1%})")
            print(f"{name:18s} {rows[0]['nccl_version']:7s} {fidelity:8s} " + "  ".join(f"{c:>26s}" for c in cells))
    print()
    print(f"{'point':16s} {'NCCL':>12s} {'GPUs':>4s} {'collective':>14s} {'algo':>5s} {'size (B)':>11s} "
          f"{'measured':>8s} {'flow':>7s}")
    for r in _read("nccl_tests_public_points.csv"):
        algo = r["nccl_algo"] or None
        if algo == "nvls" and int(r["ranks"]) <= 2 and r["date"] < "2025-10":
            algo = "ring"  # NCCL 2.18.1-2.28.6 kept NVLS off on <= 2 GPUs
        err = _busbw_GBps(r, "flow", algo) / float(r["busbw_GBps"]) - 1
        print(f"{r['source']:16s} {r['nccl_version'][:12]:>12s} {r['ranks']:>4s} {r['collective']:>14s} "
              f"{r['nccl_algo'] or 'auto':>5s} {r['size_bytes']:>11s} {float(r['busbw_GBps']):8.1f} {err:+7.1%}")


if __name__ == "__main__":
    main()
