"""Flow vs chunked NCCL fidelity against the measured 8x A100 nccl-tests sweep, per size band.

Measured rows: ``tests/data/nccl_tests_a100_8gpu.csv`` (stas00/ml-engineering, ``all_reduce_perf -b 32k
-e 16G -f 2 -g 8``, NCCL version not stated; its 8-256 MiB rows are of unknown configuration and not for
fitting, see ``../shared/validation/README.md`` in the project's data). Prints each row's busbw error of
both fidelities, then the range per band; also the wall time of each sweep.

    .venv/bin/python bench/nccl_chunked_vs_measured.py
"""

from __future__ import annotations

import csv
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without install

from hwmodel.nccl.engine import simulate_nccl_tests  # noqa: E402
from hwmodel.topology import build_system  # noqa: E402

MiB = 1 << 20
BANDS = (("32 KiB-4 MiB (host launch binds)", 0, 8 * MiB), ("8-256 MiB (not for fitting)", 8 * MiB, 512 * MiB),
         ("512 MiB-16 GiB", 512 * MiB, 1 << 40))


def main() -> None:
    with (ROOT / "tests" / "data" / "nccl_tests_a100_8gpu.csv").open() as fh:
        meas = {int(r["size_bytes"]): float(r["busbw_GBps"]) for r in csv.DictReader(fh)}
    sizes = sorted(meas)
    topo = build_system("dgx-a100", 1)
    errs: dict[str, dict[int, float]] = {}
    for fidelity in ("flow", "chunked"):
        t0 = time.perf_counter()
        rows = simulate_nccl_tests(topo, "all_reduce", sizes, gpus_per_thread=8, fidelity=fidelity)
        print(f"# {fidelity}: {time.perf_counter() - t0:.2f} s for {len(sizes)} sizes")
        errs[fidelity] = {r.size_bytes: r.busbw_Bps / 1e9 / meas[r.size_bytes] - 1 for r in rows}
    print(f"{'size (B)':>12s}  {'measured':>8s}  {'flow':>7s}  {'chunked':>7s}   (busbw error)")
    for s in sizes:
        print(f"{s:12d}  {meas[s]:8.2f}  {100 * errs['flow'][s]:+6.1f}%  {100 * errs['chunked'][s]:+6.1f}%")
    for name, lo, hi in BANDS:
        line = [f"{name:34s}"]
        for fidelity in ("flow", "chunked"):
            band = [e for s, e in errs[fidelity].items() if lo <= s < hi]
            line.append(f"{fidelity} {100 * min(band):+.1f} .. {100 * max(band):+.1f} %")
        print("  ".join(line))


if __name__ == "__main__":
    main()
