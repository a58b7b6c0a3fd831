"""NCCL's chunk/slice pipeline (hwmodel.nccl.chunked) and ``fidelity = "chunked"``.

Closed forms of the recurrence, NCCL's buffer and chunk sizes (src/include/device.h, src/enqueue.cc
2.30.7), the engine's use of it, the flow fidelity against it at large sizes, and the measured
8x A100 sweep (tests/data/nccl_tests_a100_8gpu.csv, see tests/scenarios/test_nccl_tests_cli.py)."""

import csv
from pathlib import Path

import pytest

from hwmodel.cluster import Cluster
from hwmodel.ir import Collective
from hwmodel.nccl import chunked
from hwmodel.nccl.chunked import Pipeline, chunk_size_bytes, pipeline_time
from hwmodel.nccl.engine import NcclEngine, simulate_nccl_tests
from hwmodel.nccl.nccltests import size_sweep
from hwmodel.topology import build_system

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
DATA = Path(__file__).resolve().parents[2] / "data" / "nccl_tests_a100_8gpu.csv"


def _pipe(*, ring, hops, items, slices=None, slots=8, saf=True, lat=0.0, base=0.0, rate=1e9):
    return Pipeline(ring=ring, hops=hops, loop_bytes=tuple(items), slices_per_item=tuple(slices or [1] * len(items)),
                    fifo_slots=slots, store_and_forward=saf, step_latency_s=lat, base_latency_s=base,
                    channel_rate_Bps=rate)


# -- NCCL's constants ------------------------------------------------------------------------------

def test_buffer_sizes_are_nccls():
    assert chunked.NCCL_STEPS == 8
    assert {"simple": 4 * MiB, "ll": 8 * 512 * 8 * 16, "ll128": 120 * 640 * 8 * 8} == chunked.BUFFSIZE_BYTES


def _a100_8():
    eng = NcclEngine(Cluster(build_system("dgx-a100", 1), record=False))
    return eng.comm_topology(tuple(eng.cluster.topology.gpus()))


@pytest.mark.parametrize(("algo", "proto", "expected"), [
    ("ring", "simple", 2 * MiB),     # stepSize 512 KiB x ALLREDUCE_CHUNKSTEPS 4
    ("ring", "ll", 32 * KiB),        # 64 KiB step of 16-byte lines, half of it data
    ("ring", "ll128", 576000),       # 614,400 B step x 15/16 data words
    ("tree", "simple", 512 * KiB),   # one step, no shrinking for Tree Simple in 2.30
])
def test_chunk_sizes_of_a_large_buffer(algo, proto, expected):
    assert chunk_size_bytes("all_reduce", algo, proto, 16 * GiB, 24, _a100_8()) == expected


def test_tree_ll128_chunk_shrinks_for_small_buffers():
    # one node, ppn 8: nstepsLL128 = 1 + 0 + 0.8; halve while nBytes/(nch*chunk) < 14.4 and chunk > 128 KiB
    # (576000 -> 72000), then while < 3.6 and chunk > 32 KiB (-> 18000), aligned down to 1920 B: 17280
    ct = _a100_8()
    assert chunk_size_bytes("all_reduce", "tree", "ll128", 1 * MiB, 24, ct) == 17280
    assert chunk_size_bytes("all_reduce", "tree", "ll128", 16 * GiB, 24, ct) == 576000


# -- the recurrence's closed forms -----------------------------------------------------------------

def test_chain_without_latency_is_the_classic_pipeline():
    # K items of s seconds through H store-and-forward hops: (K + H - 1) s
    t = pipeline_time(_pipe(ring=False, hops=5, items=[1e6] * 40)).time_s
    assert t == pytest.approx((40 + 5 - 1) * 1e-3, rel=1e-12)


def test_one_item_pays_every_hop_latency_and_transfer():
    t = pipeline_time(_pipe(ring=False, hops=6, items=[2e6], lat=3e-6, base=8e-6)).time_s
    assert t == pytest.approx(8e-6 + 6 * (2e-3 + 3e-6), rel=1e-12)


def test_ring_without_latency_keeps_the_link_busy():
    # 14 ring steps x 2 slices of 0.5 ms per loop, 3 loops: the link never idles
    p = _pipe(ring=True, hops=14, items=[1e6] * 3, slices=[2] * 3, slots=4)
    assert pipeline_time(p).time_s == pytest.approx(3 * 14 * 2 * 0.5e-3, rel=1e-12)


def test_small_simple_chunk_sends_a_minimum_first_slice():
    # a 40 KiB chunk goes as 32 KiB (sliceSize/32) + 8 KiB (prims_simple.h genericOp); two ring steps
    # with a long latency: slice 0, its latency, slice 0 and 1 of step 1, the final latency
    p = Pipeline(ring=True, hops=2, loop_bytes=(40 * KiB,), slices_per_item=(2,), fifo_slots=4,
                 store_and_forward=True, step_latency_s=100e-6, base_latency_s=0.0, channel_rate_Bps=1e9,
                 min_slice_bytes=32 * KiB)
    s0, s1 = 32 * KiB / 1e9, 8 * KiB / 1e9
    assert pipeline_time(p).time_s == pytest.approx(2 * s0 + s1 + 2 * 100e-6, rel=1e-12)


def test_ll_ring_streams_max_of_latency_and_transfer_per_step():
    # LL (cut-through), one item per step: H x max(lat, s) + min(lat, s), not H x (lat + s)
    latency_bound = _pipe(ring=True, hops=14, items=[1e2], saf=False, lat=0.6e-6)  # s = 0.1 us
    assert pipeline_time(latency_bound).time_s == pytest.approx(14 * 0.6e-6 + 0.1e-6, rel=1e-12)
    bandwidth_bound = _pipe(ring=True, hops=14, items=[1e3], saf=False, lat=0.6e-6)  # s = 1 us
    assert pipeline_time(bandwidth_bound).time_s == pytest.approx(14 * 1e-6 + 0.6e-6, rel=1e-12)


def test_fifo_depth_bounds_a_latency_bound_chain():
    def t(slots):
        return pipeline_time(_pipe(ring=False, hops=4, items=[1e3] * 200, slots=slots, lat=5e-6)).time_s
    deep, shallow = t(8), t(1)
    assert shallow > 3 * deep  # one slot: every item waits for the credit of the one before
    # with one slot, an item starts only after the receiver forwarded the previous one and the credit
    # came back: at least s + lat + s + lat per item on the first hop
    assert shallow >= 199 * (2 * 1e-6 + 2 * 5e-6)


def test_many_loops_extrapolate_the_steady_state():
    loops = chunked.MAX_SIMULATED_LOOPS * 3
    p = _pipe(ring=True, hops=6, items=[1e4] * loops, slices=[2] * loops, slots=4, lat=2e-6)
    exact_per_loop = pipeline_time(_pipe(ring=True, hops=6, items=[1e4] * 40, slices=[2] * 40, slots=4,
                                         lat=2e-6)).time_s / 40
    assert pipeline_time(p).time_s == pytest.approx(exact_per_loop * loops, rel=0.01)


# -- the engine's chunked fidelity -------------------------------------------------------------------

def _run(fidelity, size, n_colls=1, system="dgx-a100"):
    topo = build_system(system, 1)
    cl = Cluster(topo, record=False)
    eng = NcclEngine(cl, fidelity=fidelity)
    plans = [eng.plan(Collective("all_reduce", size, tuple(range(8)), name=f"c{i}"), tuple(topo.gpus()))
             for i in range(n_colls)]
    for p in plans:
        eng.start(p)
    cl.env.run()
    return cl.env.now, plans[0]


@pytest.mark.parametrize("size", [64 * KiB, 8 * MiB, GiB])
def test_idle_machine_runs_the_pipelines_time(size):
    t, plan = _run("chunked", size)
    assert t == pytest.approx(plan.info["chunked_time_s"], rel=1e-9)


def test_contention_still_slows_a_chunked_collective():
    alone, _ = _run("chunked", GiB)
    both, _ = _run("chunked", GiB, n_colls=2)
    assert both == pytest.approx(2 * alone, rel=0.02)  # two 1 GiB rings share every NVLink


# -- flow against chunked on nccl-tests sizes ---------------------------------------------------------

SYSTEMS = ("dgx-a100", "dgx-h100", "hgx-h200", "dgx-b200")
COLLS = ("all_reduce", "all_gather", "reduce_scatter")
# (flow against chunked at every nccl-tests size: tests/hwmodel/nccl/test_pipeline_closed.py)


def _ratios(system, coll, lo, hi):
    topo = build_system(system, 1)
    sizes = size_sweep(lo, hi, 2)
    flow = simulate_nccl_tests(topo, coll, sizes, fidelity="flow")
    chk = simulate_nccl_tests(topo, coll, sizes, fidelity="chunked")
    return {f.size_bytes: c.time_s / f.time_s - 1 for f, c in zip(flow, chk, strict=True)}


@pytest.mark.parametrize("system", SYSTEMS)
def test_flow_and_chunked_share_the_asymptotic_bandwidth(system):
    for coll in COLLS:
        ratios = _ratios(system, coll, "1G", "16G")
        assert max(abs(d) for d in ratios.values()) < 0.02, (coll, ratios)


def test_large_sizes_against_the_measured_a100_sweep():
    """Out of sample except the 16 GiB row (the Ampere NVLink efficiency is fitted to it): >= 512 MiB
    within 6 %, the band where both public sweeps and NCCL's model agree on Ring/Simple."""
    with DATA.open() as fh:
        meas = {int(r["size_bytes"]): float(r["busbw_GBps"]) for r in csv.DictReader(fh)}
    sizes = [s for s in sorted(meas) if s >= 512 * MiB]
    rows = simulate_nccl_tests(build_system("dgx-a100", 1), "all_reduce", sizes, gpus_per_thread=8,
                               fidelity="chunked")
    errs = {r.size_bytes: r.busbw_Bps / 1e9 / meas[r.size_bytes] - 1 for r in rows}
    assert max(abs(e) for e in errs.values()) < 0.06, errs
