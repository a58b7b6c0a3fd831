"""Published all-reduce sweeps with their NCCL version (Azure AI-benchmarking-guide, one 8-GPU VM,
``NCCL_ALGO=NVLS ./build/all_reduce_perf -b 8 -e 8G -f 2 -g 8 -n 40``, in-place busbw) against the simulator:
out of sample, nothing fitted to them. Rows: ``tests/data/nccl_tests_azure_sweeps.csv``. Each (sweep, band)
is one test with the issue's tolerance (5 % from 64 MiB, 15 % at 1-64 MiB, 30 % below); a band the model
misses is a strict xfail whose reason gives the worst row and every row's error is in ``test_errors``'s
message when it fails. Measured on this code (flow fidelity, -g 8 host term included)."""

import csv
from pathlib import Path

import pytest

from hwmodel.nccl.engine import simulate_nccl_tests
from hwmodel.topology import build_system

DATA = Path(__file__).resolve().parents[2] / "data" / "nccl_tests_azure_sweeps.csv"
ROWS = list(csv.DictReader(DATA.open(encoding="utf-8")))
MiB = 1 << 20
BANDS = {"below-1MiB": (0, MiB, 0.30), "1-64MiB": (MiB, 64 * MiB, 0.15), "from-64MiB": (64 * MiB, 1 << 62, 0.05)}
_CACHE: dict = {}

KNOWN = {  # (sweep, band) -> the worst row, simulated vs measured busbw
    ("azure-nd-a100-v4", "below-1MiB"): "512 KiB: 11.3 vs 19.2 GB/s (-41 %): the -g 8 host term (41.3 us + "
                                        "2.5 us x 24 channels, fitted to another A100 log) is 2x this host's",
    ("azure-nd-a100-v4", "1-64MiB"): "16 MiB: 196.8 vs 109.2 GB/s (+80 %); 1 MiB -50 % (host term)",
    ("azure-nd-a100-v4", "from-64MiB"): "64 MiB: 229.5 vs 166.6 GB/s (+38 %); 256 MiB +9.2 %, 512 MiB +5.7 %",
    ("azure-nd-h100-v5", "below-1MiB"): "1 KiB: 0.02 vs 0.07 GB/s (-69 %): host term 81.3 us vs ~26 us measured",
    ("azure-nd-h100-v5", "1-64MiB"): "1 MiB -48 % (host term); from 8 MiB within 9 % (test below)",
    ("azure-nd-h200-v5", "below-1MiB"): "1 KiB: 0.02 vs 0.06 GB/s (-63 %): host term",
    ("azure-nd-h200-v5", "1-64MiB"): "1 MiB -57 % (host term); from 8 MiB within 7 % (test below)",
}
"""Two structural misses. Small sizes: nccl-tests -g 8 is host-bound and the host term's constants
(calibration.toml [nccl] host_*) come from the 8x A100 log of unknown NCCL version; the A100 here takes
half that at 1 MiB (50.7 vs 101.9 us), the H100/H200 hosts a third at 1 KiB. Mid sizes on A100 (8-256 MiB,
Ring): real NCCL is slower than the chunk pipeline both fidelities simulate (docs/DESIGN.md, NCCL's chunk
pipeline); the A100's P2P-read slice cost accounts for 32-64 MiB and from 512 MiB but is opt-in, since alone
it contradicts NCCL's protocol choices (docs/DESIGN.md, "Ring Simple on A100: the P2P-read slice"). NVLS
(H100, H200) pays NCCL's per-step cost for chunks below nvlsChunkSize (docs/DESIGN.md, "NVLS per-step cost")
and is within the tolerances from 8 MiB."""


def _errors(sweep: str, lo: int, hi: int) -> list[tuple[int, float, float]]:
    out = []
    for row in ROWS:
        size = int(row["size_bytes"])
        if row["sweep"] != sweep or not lo <= size < hi:
            continue
        key = (row["system"], size, row["nccl_algo"])
        if key not in _CACHE:
            topo = _CACHE.setdefault(row["system"], build_system(row["system"], 1))
            _CACHE[key] = simulate_nccl_tests(topo, row["collective"], [size], gpus=topo.gpus()[:int(row["ranks"])],
                                              gpus_per_thread=int(row["gpus_per_thread"]),
                                              algorithm=row["nccl_algo"] or None)[0].busbw_Bps / 1e9
        measured = float(row["busbw_GBps"])
        out.append((size, _CACHE[key], _CACHE[key] / measured - 1.0))
    return out


def _cases():
    for sweep in sorted({r["sweep"] for r in ROWS}):
        for band in BANDS:
            why = KNOWN.get((sweep, band))
            yield pytest.param(sweep, band, marks=[pytest.mark.xfail(strict=True, reason=why)] if why else [],
                               id=f"{sweep}-{band}")


def test_the_sweeps_name_their_nccl_version():
    versions = {r["sweep"]: r["nccl_version"] for r in ROWS}
    assert versions == {"azure-nd-a100-v4": "2.18.5", "azure-nd-h100-v5": "2.18.5", "azure-nd-h200-v5": "2.20.5"}
    assert all(len([r for r in ROWS if r["sweep"] == s]) == 24 for s in versions)  # 1 KiB .. 8 GiB


@pytest.mark.parametrize(("sweep", "band"), list(_cases()))
def test_errors(sweep, band):
    lo, hi, tol = BANDS[band]
    errs = _errors(sweep, lo, hi)
    assert errs
    bad = [f"{s} B: {b:.2f} GB/s ({e:+.1%})" for s, b, e in errs if abs(e) > tol]
    assert not bad, bad


@pytest.mark.parametrize("sweep", ["azure-nd-h100-v5", "azure-nd-h200-v5"])
def test_nvls_gpu_bound_mid_band_within_15_percent(sweep):
    # 8-32 MiB: where -g 8's host term no longer binds, NVLS's 32 KiB chunks (nBytes < 8 x nChannels x
    # nHeads x 64 KiB) pay the per-step cost; without it these rows were +20..+23 % (16 and 32 MiB)
    errs = _errors(sweep, 8 * MiB, 64 * MiB)
    assert len(errs) == 3
    assert max(abs(e) for _, _, e in errs) <= 0.15, errs


@pytest.mark.parametrize("sweep", ["azure-nd-h100-v5", "azure-nd-h200-v5"])
def test_nvls_rate_steps_where_the_chunk_grows(sweep):
    # The measured NVLS time per byte drops where NCCL 2.18/2.20 grows the chunk (64 KiB below 1 GiB, 128 KiB
    # from it; concurrentOps 16 x 8): 512 MiB -> 1 GiB busbw rises 5-6 %; the model rises by the per-step cost
    errs = {s: e for s, _, e in _errors(sweep, 512 * MiB, 2 << 30)}
    assert abs(errs[512 * MiB]) <= 0.02 and abs(errs[1 << 30]) <= 0.02, errs


@pytest.mark.parametrize("sweep", ["azure-nd-a100-v4", "azure-nd-h100-v5", "azure-nd-h200-v5"])
def test_the_plateau_from_1_GiB_is_within_3_percent(sweep):
    errs = _errors(sweep, 1 << 30, 1 << 62)
    assert len(errs) == 4
    assert max(abs(e) for _, _, e in errs) <= 0.03, errs
