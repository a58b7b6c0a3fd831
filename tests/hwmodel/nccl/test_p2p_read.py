"""The A100's P2P-read slice cost (``NcclEngine(p2p_read_cost=True)``, hwmodel.nccl.chunked.P2P_READ_SLICE_SYNC_S).

Who reads (NCCL's ``ncclTopoCheckP2p`` rule), that the flow fidelity's closed form still equals the chunked
recurrence with the cost, and the two public 8x A100 all-reduce sweeps (nothing fitted to them: the cost is
two of NCCL's Simple NVLink step latencies). The option is off by default; docs/DESIGN.md ("Ring Simple on
A100: the P2P-read slice") says why."""

import csv
from pathlib import Path

import pytest

from hwmodel.cluster import Cluster
from hwmodel.nccl import chunked
from hwmodel.nccl.comm import CommTopology
from hwmodel.nccl.engine import NcclEngine, simulate_nccl_tests
from hwmodel.nccl.nccltests import size_sweep
from hwmodel.topology import build_system

MiB = 1 << 20
DATA = Path(__file__).resolve().parents[2] / "data"


def _comm(system: str) -> CommTopology:
    eng = NcclEngine(Cluster(build_system(system, 1), record=False))
    return eng.comm_topology(tuple(eng.cluster.topology.gpus()))


def test_only_sm80_nvlink_peers_read():
    # paths.cc: "Enable P2P Read for Ampere/NVLink only" (cudaCompCap == 80 on both ends)
    assert _comm("dgx-a100").p2p_read
    assert not _comm("dgx-h100").p2p_read
    a100 = {"n_nodes": 1, "ppn": 8, "nvlink_bw_per_gpu_GBps": 240.0}
    assert CommTopology.from_system("8.0", **a100).p2p_read
    assert CommTopology.from_system("ampere", **a100).p2p_read
    assert not CommTopology.from_system((8, 6), **a100).p2p_read  # sm86 writes
    assert not CommTopology.from_system("hopper", 1, 8, 370.8).p2p_read
    assert not CommTopology.from_system("8.0", 1, 8, 0.0).p2p_read  # PCIe only: no NVLink path
    assert not CommTopology.from_system("8.0", **a100, p2p_read=False).p2p_read


def test_the_cost_is_two_simple_nvlink_steps_below_a_full_slice():
    assert abs(chunked.P2P_READ_SLICE_SYNC_S - 6.8e-6) < 1e-15  # 2 x hwLat[NVLINK][RING][SIMPLE]
    ct = _comm("dgx-a100")
    kw = {"channel_rate_Bps": 10e9, "base_latency_s": 8e-6, "step_latency_total_s": 14 * 3.4e-6}
    off = chunked.pipeline_for("all_reduce", "ring", "simple", 32 * MiB, 24, ct, **kw)
    on = chunked.pipeline_for("all_reduce", "ring", "simple", 32 * MiB, 24, ct, **kw, p2p_read_cost=True)
    assert off.step_sync_s == 0.0
    assert on.step_sync_s == chunked.P2P_READ_SLICE_SYNC_S
    assert on.sync_free_bytes == 1 * MiB  # stepSize 512 KiB x ALLREDUCE_SLICESTEPS 2
    # 32 MiB on 24 channels and 8 ranks: one loop of 174,763 B chunks, 14 steps of two slices each
    slice_b = on.loop_bytes[0] / 2
    extra = 28 * chunked.P2P_READ_SLICE_SYNC_S * (1 - slice_b / MiB)
    assert chunked.pipeline_time(on).time_s - chunked.pipeline_time(off).time_s == pytest.approx(extra, rel=0.02)
    # LL/LL128 keep their buffers on the receiver (p2p.cc): no read, no cost
    ll128 = chunked.pipeline_for("all_reduce", "ring", "ll128", 32 * MiB, 24, ct, **kw, p2p_read_cost=True)
    assert ll128.step_sync_s == 0.0
    h100 = chunked.pipeline_for("all_reduce", "ring", "simple", 32 * MiB, 24, _comm("dgx-h100"), **kw,
                                p2p_read_cost=True)
    assert h100.step_sync_s == 0.0


@pytest.mark.parametrize("coll", ["all_reduce", "all_gather", "reduce_scatter", "broadcast"])
@pytest.mark.parametrize("n", [8, 2])
def test_flow_equals_chunked_with_the_cost(coll, n):
    topo = build_system("dgx-a100", 1)
    sizes = size_sweep("64K", "8G", 4)
    runs = {f: simulate_nccl_tests(topo, coll, sizes, gpus=topo.gpus()[:n], fidelity=f, protocol="simple",
                                   p2p_read_cost=True) for f in ("flow", "chunked")}
    for f, c in zip(runs["flow"], runs["chunked"], strict=True):
        assert f.time_s == pytest.approx(c.time_s, rel=1e-9), (f.size_bytes, f.algorithm)


def _sweeps() -> dict[str, dict[int, float]]:
    with (DATA / "nccl_tests_azure_sweeps.csv").open(encoding="utf-8") as fh:
        azure = {int(r["size_bytes"]): float(r["busbw_GBps"]) for r in csv.DictReader(fh)
                 if r["sweep"] == "azure-nd-a100-v4"}
    with (DATA / "nccl_tests_a100_8gpu.csv").open(encoding="utf-8") as fh:
        stas = {int(r["size_bytes"]): float(r["busbw_GBps"]) for r in csv.DictReader(fh)}
    return {"azure-nd-a100-v4": azure, "stas00": stas}


@pytest.mark.parametrize("sweep", ["azure-nd-a100-v4", "stas00"])
def test_ring_simple_mid_band_and_plateau_against_both_a100_sweeps(sweep):
    # Ring Simple rows of both public 8x A100 all-reduce sweeps (-g 8). Without the cost 32 MiB is
    # +62..+69 % and 64 MiB +34..+38 %; with it -2.8..+1.4 % and +2.1..+5.1 % (Azure's 64 MiB row is just
    # outside the 5 % band from 64 MiB, so 32-64 MiB are held to the 1-64 MiB band's 15 %).
    # From 512 MiB the plateau stays within 3 %. Not asserted: 128-256 MiB, +6..+18 % (a kink both logs
    # show and the pipeline does not), and 8-16 MiB, LL128, which the cost does not touch (+32..+85 %).
    meas = _sweeps()[sweep]
    sizes = [s for s in sorted(meas) if s in (32 * MiB, 64 * MiB) or 512 * MiB <= s <= 8 << 30]
    topo = build_system("dgx-a100", 1)
    rows = simulate_nccl_tests(topo, "all_reduce", sizes, gpus_per_thread=8, p2p_read_cost=True)
    errs = {r.size_bytes: r.busbw_Bps / 1e9 / meas[r.size_bytes] - 1 for r in rows}
    assert all(r.protocol == "simple" for r in rows)
    assert max(abs(errs[32 * MiB]), abs(errs[64 * MiB])) <= 0.15, errs
    assert max(abs(e) for s, e in errs.items() if s >= 512 * MiB) <= 0.03, errs
    off = simulate_nccl_tests(topo, "all_reduce", [32 * MiB, 64 * MiB], gpus_per_thread=8)
    assert all(r.busbw_Bps / 1e9 / meas[r.size_bytes] - 1 > 0.3 for r in off)  # what the cost removes
