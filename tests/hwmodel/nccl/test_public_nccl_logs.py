"""nccl-tests busbw of public issue-tracker pastes against the simulator (out of sample: no constant is
fitted to them). Rows: ``tests/data/nccl_tests_public_points.csv`` (source URL, NCCL version when the
paste prints it, GPUs, ``NCCL_ALGO`` when set). Tolerances are the issue's bands of busbw: 5 % at >= 64 MiB,
15 % at 1-64 MiB, 30 % below; a row's quoted spread ("about 365-370") widens its band by that much.
Rows the model misses are strict xfails whose reason carries the measured error."""

import csv
from pathlib import Path

import pytest

from hwmodel.nccl.engine import simulate_nccl_tests
from hwmodel.topology import build_system

DATA = Path(__file__).resolve().parents[2] / "data" / "nccl_tests_public_points.csv"
ROWS = list(csv.DictReader(DATA.open(encoding="utf-8")))
MiB = 1 << 20
_TOPOS: dict = {}

GiB4 = 1 << 32
NVLS_ON_TWO_GPUS_SINCE = "2025-10"
"""NCCL 2.28.7 (2025-10-17) enabled NVLS on 2-GPU communicators; a paste older than that whose
version is not stated ran a release that had it off."""
KNOWN_MISSES = {  # (source, ranks, nccl_algo, size) -> why; errors measured on this code
    ("nccl-1455", 4, "nvls", GiB4): "NVLS at 4 GPUs: simulated 239.8 vs 367.5 GB/s (-34.8 %)",
    ("nccl-1455", 5, "nvls", GiB4): "NVLS at 5 GPUs: simulated 299.7 vs 420 GB/s (-28.6 %)",
    ("nccl-1455", 6, "nvls", GiB4): "NVLS at 6 GPUs: simulated 359.5 vs 440 GB/s (-18.3 %)",
    ("nccl-1455", 7, "nvls", GiB4): "NVLS at 7 GPUs: simulated 407.4 vs 460 GB/s (-11.4 %)",
    ("nccl-1047", 8, "ring", 128 * MiB): "Ring reduce-scatter at 128 MiB: simulated 347.4 vs 311.34 GB/s "
                                         "(+11.6 %)",
    ("nccl-1047", 8, "ring", 256 * MiB): "Ring reduce-scatter at 256 MiB: simulated 353.6 vs 330.94 GB/s "
                                         "(+6.8 %; 512 MiB +4.6 %, within)",
}
"""NVLS forced on 4-7 of 8 H100s: the collective's rate is NCCL's tuning figure for NVLS
(``nCh x bwIntra x 0.85 x (nCh-1)/nCh x 2``, with the NVLS graph's one channel per GPU and
``(nCh+1) x bwIntra <= 370.8 GB/s``), which is below the hardware's for small groups; no link binds.
On 8 GPUs the same formula is within 1 %. NCCL itself (this formula) picks Ring there, whose busbw the
model matches within 2.3 %. Ring reduce-scatter at 128-256 MiB: the chunk pipeline's ramp (max(transfer,
latency) per step) reaches the plateau early (the mid-band slowness of real NCCL, docs/DESIGN.md, chunked
pipeline)."""


def band_tolerance(size_bytes: int) -> float:
    """The issue's busbw tolerance for a size: 5 % from 64 MiB, 15 % from 1 MiB, 30 % below."""
    return 0.05 if size_bytes >= 64 * MiB else 0.15 if size_bytes >= MiB else 0.30


def _simulate(row: dict, algorithm: str | None):
    system, ranks = row["system"], int(row["ranks"])
    if system not in _TOPOS:
        _TOPOS[system] = build_system(system, 1)
    topo = _TOPOS[system]
    return simulate_nccl_tests(topo, row["collective"], [int(row["size_bytes"])], gpus=topo.gpus()[:ranks],
                               gpus_per_thread=int(row["gpus_per_thread"]), algorithm=algorithm)[0]


def _cases():
    for row in ROWS:
        key = (row["source"], int(row["ranks"]), row["nccl_algo"], int(row["size_bytes"]))
        why = KNOWN_MISSES.get(key)
        marks = [pytest.mark.xfail(strict=True, reason=why)] if why else []
        yield pytest.param(row, marks=marks, id=f"{key[0]}-{row['collective']}-{key[1]}gpu-"
                                                f"{key[2] or 'auto'}-{row['size_bytes']}")


def test_the_table_names_its_sources():
    assert len(ROWS) >= 15
    for row in ROWS:
        assert row["url"].startswith("https://github.com/NVIDIA/"), row
        assert row["nccl_version"] and row["gpu"] and int(row["ranks"]) >= 2, row
    assert {r["nccl_version"] for r in ROWS if r["source"] == "nccl-tests-272"} == {"2.20.3"}


@pytest.mark.parametrize("row", list(_cases()))
def test_busbw_within_the_band(row):
    measured = float(row["busbw_GBps"])
    algorithm = row["nccl_algo"] or None
    if algorithm == "nvls" and int(row["ranks"]) <= 2 and row["date"] < NVLS_ON_TWO_GPUS_SINCE:
        # NCCL 2.18.1-2.28.6 kept NVLS off on <= 2 GPUs (ncclNvlsInit ``gpuCount <= 2``): that run was
        # Ring's. The model follows NCCL 2.30.7, where NVLS exists on 2 GPUs (``gpuCount < 2``).
        algorithm = "ring"
    sim = _simulate(row, algorithm)
    err = sim.busbw_Bps / 1e9 / measured - 1.0
    tol = band_tolerance(int(row["size_bytes"])) + float(row["busbw_spread_GBps"]) / measured
    assert abs(err) <= tol, f"{sim.algorithm}/{sim.protocol}: {sim.busbw_Bps / 1e9:.1f} vs {measured} GB/s ({err:+.1%})"


def test_two_gpus_pick_ring_though_nvls_exists():
    """NCCL 2.30.7 enables NVLS on 2 GPUs, but its model gives NVLS a quarter of Ring's busbw there (one
    channel per GPU, ``(nCh+1) x bwIntra <= 370.8 GB/s``), so the tuner picks Ring, as older releases had to."""
    topo = build_system("dgx-h100", 1)
    auto = simulate_nccl_tests(topo, "all_reduce", [1 << 30], gpus=topo.gpus()[:2])[0]
    nvls = simulate_nccl_tests(topo, "all_reduce", [1 << 30], gpus=topo.gpus()[:2], algorithm="nvls")[0]
    assert auto.algorithm == "ring"
    assert nvls.busbw_Bps < 0.3 * auto.busbw_Bps
