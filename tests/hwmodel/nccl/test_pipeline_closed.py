"""The closed form of NCCL's chunk pipeline (hwmodel.nccl.pipeline_closed), the flow fidelity's time.

Against the exact recurrence (hwmodel.nccl.chunked, the chunked fidelity): on random pipelines of every
shape NCCL's chunking produces, and, the acceptance of the flow fidelity, on nccl-tests sweeps 64 KiB ..
8 GiB of every collective on 8x A100 (1, 2 and 4 DGX A100 nodes), 8x H100 (NVLS; 2 nodes: NVLSTree),
and 2- and 4-GPU groups: flow within 2 % of chunked at every size."""

import math
import random

import pytest

from hwmodel.cluster import Cluster
from hwmodel.ir import Collective
from hwmodel.nccl.chunked import Pipeline, item_time_s, pipeline_time
from hwmodel.nccl.engine import NcclEngine, simulate_nccl_tests
from hwmodel.nccl.nccltests import size_sweep
from hwmodel.nccl.pipeline_closed import closed_form_time
from hwmodel.topology import build_system

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
SLICE_MIN = 4 * MiB // 8 * 2 / 32  # sliceSize / 32 of a Ring Simple slice (prims_simple.h)


def _pipe(*, ring, saf, hops, items, lat, rate=1e9, sync=0.0, sync_free=math.inf):
    ring_simple = ring and saf
    slices = tuple((2 if b > SLICE_MIN else 1) if ring_simple else 1 for b in items)
    return Pipeline(ring=ring, hops=hops, loop_bytes=tuple(items), slices_per_item=slices,
                    fifo_slots=4 if ring_simple else 8, store_and_forward=saf, step_latency_s=lat,
                    base_latency_s=3e-6, channel_rate_Bps=rate, min_slice_bytes=SLICE_MIN if ring_simple else 0.0,
                    step_sync_s=sync, sync_free_bytes=sync_free)


def _random_pipelines(n, seed):
    rng = random.Random(seed)
    for _ in range(n):
        ring, saf = rng.random() < 0.5, rng.random() < 0.5
        hops = rng.choice([1, 2, 3, 4, 6, 7, 8, 14, 15, 31, 62])
        loops = rng.choice([1, 2, 3, 5, 8, 9, 10, 17, 40, 100])
        b = rng.choice([1e3, 1e4, 1e5, 2 * MiB])
        lat = b / 1e9 * rng.choice([0.01, 0.1, 0.5, 1, 2, 5, 20, 100])
        last = b * rng.choice([1, 0.9, 0.5, 0.3, 0.05, 0.001])
        yield _pipe(ring=ring, saf=saf, hops=hops, items=[b] * (loops - 1) + [last], lat=lat)


@pytest.mark.parametrize("seed", range(4))
def test_closed_form_is_the_recurrence_on_random_pipelines(seed):
    # rings and chains, Simple and LL/LL128, 1-62 hops, 1-100 loops, latency 0.01-100 x the transfer,
    # a last item down to 1/1000 of the others: the max-plus recurrence's longest paths, so equal
    # up to rounding
    for p in _random_pipelines(500, seed):
        exact, closed = pipeline_time(p).time_s, closed_form_time(p).time_s
        assert closed == pytest.approx(exact, rel=1e-9), p


@pytest.mark.parametrize("seed", range(2))
def test_closed_form_is_the_recurrence_with_a_per_step_sync(seed):
    # rings and chains whose items (slices, chunks) pay a per-step sync in series with the copy, below a
    # full item of 1-4 x theirs: the same longest paths
    rng = random.Random(100 + seed)
    for p in _random_pipelines(400, seed):
        b = p.loop_bytes[0]
        q = _pipe(ring=p.ring, saf=p.store_and_forward, hops=p.hops, items=p.loop_bytes, lat=p.step_latency_s,
                  sync=b / 1e9 * rng.choice([0.05, 0.5, 3]), sync_free=b * rng.choice([1, 2, 4]))
        assert closed_form_time(q).time_s == pytest.approx(pipeline_time(q).time_s, rel=1e-9), q


def test_per_step_sync_is_paid_only_below_the_full_item():
    # items of the full size run at the channel rate (NCCL's figure already holds their sync); a half
    # item pays half the sync on top of its bytes: b / r + sync (1 - b / full)
    full, sync = 1e6, 3.4e-6
    assert item_time_s(_pipe(ring=False, saf=True, hops=2, items=[full], lat=0.0, sync=sync, sync_free=full),
                       full) == pytest.approx(1e-3, rel=1e-12)
    half = _pipe(ring=False, saf=True, hops=2, items=[full / 2] * 40, lat=0.0, sync=sync, sync_free=full)
    assert item_time_s(half, full / 2) == pytest.approx(0.5e-3 + sync / 2, rel=1e-12)
    # 40 items through 2 hops, no latency: 39 items on the first link, then the last one's 2 hops
    assert closed_form_time(half).time_s == pytest.approx(3e-6 + 41 * (0.5e-3 + sync / 2), rel=1e-12)


def test_ring_streams_the_step_latency_under_the_transfer():
    # LL ring, one loop: H x max(lat, s) + min(lat, s) (the first step's transfer, the last arrival)
    p = _pipe(ring=True, saf=False, hops=14, items=[1e3], lat=0.6e-6)  # s = 1 us
    assert closed_form_time(p).time_s == pytest.approx(3e-6 + 14 * 1e-6 + 0.6e-6, rel=1e-12)
    # Simple, 2 MiB chunks as two 1 MiB slices, bandwidth-bound: the link never idles
    p = _pipe(ring=True, saf=True, hops=14, items=[2 * MiB] * 3, lat=1e-6)
    assert closed_form_time(p).time_s == pytest.approx(3e-6 + 3 * 14 * 2 * MiB / 1e9 + 1e-6, rel=1e-12)


def test_chain_fill_is_paid_once():
    # K store-and-forward items through H hops, credits never binding: (K - 1) s + H (s + lat)
    p = _pipe(ring=False, saf=True, hops=7, items=[1e6] * 40, lat=2e-6)
    assert closed_form_time(p).time_s == pytest.approx(3e-6 + 39e-3 + 7 * (1e-3 + 2e-6), rel=1e-12)


def test_chain_credit_bound():
    # latency 5 x the transfer: D = 8 items per credit cycle 2 (s + lat) = 12 s, not one per s
    s = 1e-3
    p = _pipe(ring=False, saf=True, hops=3, items=[1e6] * 33, lat=5 * s)
    # item 32 starts after 4 cycles, then 3 hops of s + lat
    assert closed_form_time(p).time_s == pytest.approx(3e-6 + 4 * 12 * s + 3 * 6 * s, rel=1e-12)


# -- the flow fidelity against the chunked one on nccl-tests sweeps --------------------------------------

CASES = {  # name -> (system, nodes, GPUs of the communicator)
    "a100x8": ("dgx-a100", 1, 8), "a100x16": ("dgx-a100", 2, 16), "a100x32": ("dgx-a100", 4, 32),
    "a100x2": ("dgx-a100", 1, 2), "a100x4": ("dgx-a100", 1, 4),
    "h100x8": ("dgx-h100", 1, 8), "h100x16": ("dgx-h100", 2, 16),
    "h100x2": ("dgx-h100", 1, 2), "h100x4": ("dgx-h100", 1, 4),
    "h200x8": ("hgx-h200", 1, 8), "b200x8": ("dgx-b200", 1, 8),
}
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all")
SIZES = size_sweep("64K", "8G", 2)


@pytest.fixture(scope="module")
def topologies():
    return {}


@pytest.mark.parametrize("coll", COLLECTIVES)
@pytest.mark.parametrize("case", list(CASES))
def test_flow_agrees_with_chunked_within_2_percent_from_64_KiB(case, coll, topologies):
    system, nodes, n = CASES[case]
    topo = topologies.get((system, nodes)) or topologies.setdefault((system, nodes), build_system(system, nodes))
    gpus = topo.gpus()[:n]
    flow = simulate_nccl_tests(topo, coll, SIZES, gpus=gpus, fidelity="flow")
    chunked = simulate_nccl_tests(topo, coll, SIZES, gpus=gpus, fidelity="chunked")
    bad = {f.size_bytes: f"{100 * (f.time_s / c.time_s - 1):+.2f}% {c.algorithm}/{c.protocol}"
           for f, c in zip(flow, chunked, strict=True) if abs(f.time_s / c.time_s - 1) > 0.02}
    assert not bad, bad


@pytest.mark.parametrize(("algo", "proto"), [("tree", "simple"), ("tree", "ll"), ("tree", "ll128"),
                                             ("ring", "ll"), ("ring", "ll128")])
def test_forced_algorithms_agree_too(algo, proto):
    # NCCL_ALGO / NCCL_PROTO choices the tuner does not make on 2 DGX A100 nodes
    topo = build_system("dgx-a100", 2)
    sizes = size_sweep("64K", "1G", 4)
    flow = simulate_nccl_tests(topo, "all_reduce", sizes, algorithm=algo, protocol=proto, fidelity="flow")
    chunked = simulate_nccl_tests(topo, "all_reduce", sizes, algorithm=algo, protocol=proto, fidelity="chunked")
    for f, c in zip(flow, chunked, strict=True):
        assert f.time_s == pytest.approx(c.time_s, rel=0.02), f.size_bytes


def test_flow_pays_the_pipeline_fill_of_a_broadcast():
    # 8 MiB broadcast on 8x A100, Ring Simple: each channel's 512 KiB step crosses 7 hops store-and-
    # forward, one item per channel, so the time is about 7 x the transfer, not 1 x (NCCL's formula)
    topo = build_system("dgx-a100", 1)
    eng = NcclEngine(Cluster(topo, record=False))
    plan = eng.plan(Collective("broadcast", 8 * MiB, tuple(range(8))), tuple(topo.gpus()))
    assert plan.algorithm == "ring" and plan.protocol == "simple"
    transfer = 8 * MiB / plan.rate_bound_Bps  # one channel's share at one channel's rate
    assert plan.latency_s + transfer > 6 * transfer
