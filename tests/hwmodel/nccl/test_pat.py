"""PAT (Parallel Aggregated Trees): tuner terms, availability, choice and engine bytes, by hand."""

import pytest

from hwmodel.cluster import Cluster
from hwmodel.ir import Collective
from hwmodel.nccl import tuner as T
from hwmodel.nccl.algorithms import ALGORITHMS
from hwmodel.nccl.algorithms.pat import blocks_per_dimension
from hwmodel.nccl.channels import CommTopology, nccl_channels
from hwmodel.nccl.engine import NcclEngine
from hwmodel.topology import build_system

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30


def _h100(nodes, ppn, **kw):
    # DGX H100 NICs (NDR 50 GB/s, PCIe Gen5 48): with 1 GPU per node the ring search keeps one channel at
    # 48 GB/s, duplicated to 2 @ 24 GB/s (search.cc ncclTopoDupChannels); the tree graph is the ring's.
    return CommTopology.from_system("hopper", nodes, ppn, 370.8, nic_bw_GBps=50, nics_per_node=8, **kw)


@pytest.mark.parametrize("coll", ["all_gather", "reduce_scatter"])
@pytest.mark.parametrize("nodes", [2, 12, 16])
def test_pat_tuner_terms_closed_form(coll, nodes):
    t = _h100(nodes, 1)
    assert (t.tree.n_channels, t.tree.bw_intra_GBps, t.tree.bw_inter_GBps, t.n_channels) == (2, 24, 24, 4)
    # tuning.cc 2.30.7: busBw = nChannels * bw * 0.75, no bus->alg conversion for AG/RS.
    assert T.bus_bandwidth_Bps(coll, "pat", "simple", t) == pytest.approx(2 * 24e9 * 0.75, rel=1e-12)
    assert T.algo_bandwidth_Bps(coll, "pat", "simple", t, 1 * MiB) == pytest.approx(36e9, rel=1e-12)
    # latency = base 8 + log2i(nNodes) * interLat/3.5 + nRanks * 2.8, interLat = Tree NET Simple 14 (ppn 1).
    log2 = {2: 1, 12: 3, 16: 4}[nodes]
    assert T.latency_s(coll, "pat", "simple", t, 1 * MiB) == pytest.approx(
        (8.0 + log2 * 14.0 / 3.5 + nodes * 2.8) * 1e-6, rel=1e-12)
    # A NIC latency counts twice for Simple (GDR flush): interLat = 14 + 2 * 2 us.
    t2 = _h100(nodes, 1, latency_inter_s=2e-6)
    assert T.latency_s(coll, "pat", "simple", t2) == pytest.approx(
        (8.0 + log2 * 18.0 / 3.5 + nodes * 2.8) * 1e-6, rel=1e-12)
    # 16 x 1 GPU, 1 MiB: 68.8 us + 1 MiB / 36 GB/s.
    if nodes == 16:
        assert T.predict_time_s(coll, "pat", "simple", MiB, t) == pytest.approx(68.8e-6 + MiB / 36e9, rel=1e-12)


def test_pat_availability():
    one_per_node, full = _h100(16, 1), _h100(16, 8)
    for proto in ("ll", "ll128"):
        assert not T.is_enabled("all_gather", "pat", proto, one_per_node)
    for coll in ("all_reduce", "broadcast", "reduce"):
        assert not T.is_enabled(coll, "pat", "simple", one_per_node)
    assert T.is_enabled("all_gather", "pat", "simple", one_per_node)
    assert T.is_enabled("reduce_scatter", "pat", "simple", one_per_node)
    # ncclPatEnable: "PAT only supports 1 GPU per node" (nNodes == nRanks).
    assert not T.is_enabled("all_gather", "pat", "simple", full)
    assert not T.is_enabled("all_gather", "pat", "simple", _h100(1, 8))
    assert not T.is_enabled("all_gather", "pat", "simple", _h100(2, 8, n_ranks=3))
    with pytest.raises(ValueError, match="pat/simple is not available"):
        T.latency_s("all_gather", "pat", "simple", full)
    # topoGetAlgoInfo: every channel (maxThreads[PAT] is never set), 640 threads.
    assert nccl_channels("pat", "simple", 1 * KiB, one_per_node) == (4, 640)
    assert list(ALGORITHMS)[-1] == "pat" and ALGORITHMS["pat"].nccl_index == 6


@pytest.mark.parametrize("coll", ["all_gather", "reduce_scatter"])
def test_pat_chosen_as_nccl_2_23_would(coll):
    one_per_node = _h100(16, 1)
    # Small and medium sizes at one GPU per node: PAT/Simple beats Ring LL (81.6 us + S/21.76 GB/s) and
    # Ring Simple (218.4 us + S/51.2 GB/s) up to a few MB.
    for size in (1 * KiB, 64 * KiB, 1 * MiB, 4 * MiB):
        c = T.choose(coll, size, one_per_node)
        assert (c.algorithm, c.protocol, c.n_channels) == ("pat", "simple", 4), size
        assert c.predicted_time_s == pytest.approx(68.8e-6 + size / 36e9, rel=1e-12)
    # Large messages go back to Ring (bandwidth 36 < 51.2 GB/s).
    assert T.choose(coll, GiB, one_per_node).algorithm == "ring"
    # More than one GPU per node: never PAT.
    for size in (1 * KiB, 1 * MiB, 64 * MiB):
        assert T.choose(coll, size, _h100(16, 8)).algorithm != "pat"
    # NCCL_ALGO=^pat restores the Ring choice.
    assert T.choose(coll, 1 * MiB, one_per_node, algo="^pat").algorithm == "ring"


def test_pat_blocks_per_dimension():
    # Offsets 1 <= s < n by lowest set bit: n/2, n/4, ..., 1 for a power of two; always n-1 in all.
    assert blocks_per_dimension(2) == [1]
    assert blocks_per_dimension(16) == [8, 4, 2, 1]
    assert blocks_per_dimension(12) == [6, 3, 1, 1]
    assert blocks_per_dimension(5) == [2, 1, 1]
    for n in range(2, 70):
        assert sum(blocks_per_dimension(n)) == n - 1


@pytest.mark.parametrize("coll", ["all_gather", "reduce_scatter"])
def test_pat_engine_time_and_bytes_per_nic(coll):
    """16 DGX H100 nodes, one GPU each (rail 0): NCCL picks PAT; the activity takes NCCL's chunk
    pipeline's time, and every rank's NIC carries (n-1)/n * S each way, split over
    the log2(n) = 4 dimensions as 8:4:2:1 blocks of S/n to the peers 1, 2, 4, 8 ranks away."""
    nodes, size = 16, 1 * MiB
    topo = build_system("dgx-h100", nodes)
    cl = Cluster(topo)
    eng = NcclEngine(cl)
    gpus = tuple(f"n{k}.gpu0" for k in range(nodes))
    plan = eng.plan(Collective(coll, size, tuple(range(nodes))), gpus)
    assert (plan.algorithm, plan.protocol, plan.n_channels) == ("pat", "simple", 4)
    done = eng.start(plan)
    cl.env.run()
    assert done.processed
    # NCCL's chunk pipeline: 4 loops of one 60 KiB item per channel through log2(16) = 4 hops, store
    # and forward, no credit wait (4 items < NCCL_STEPS): base + 3 s + 4 (s + step latency), the
    # chunked fidelity's time (the tuner's formula, 68.8 us + S / 36 GB/s, adds every hop's latency and
    # pays no fill)
    pipe = eng.pipeline(plan, eng.comm_topology(gpus), plan.rate_bound_Bps / plan.n_channels)
    assert (pipe.hops, len(pipe.loop_bytes), pipe.loop_bytes[0]) == (4, 4, 15 / 16 * 64 * 1024)
    s, step = pipe.loop_bytes[0] / pipe.channel_rate_Bps, pipe.step_latency_s
    assert step == pytest.approx((68.8e-6 - pipe.base_latency_s) / 4, rel=1e-12)
    assert cl.env.now == pytest.approx(pipe.base_latency_s + 3 * s + 4 * (s + step), rel=1e-9)
    chunked = NcclEngine(Cluster(topo), fidelity="chunked")
    assert chunked.plan(Collective(coll, size, tuple(range(nodes))), gpus).info["chunked_time_s"] == \
        pytest.approx(cl.env.now, rel=1e-9)
    sign = -1 if coll == "all_gather" else 1
    flows = eng.flows(plan)
    assert len(flows) == 4 * nodes
    for d, blocks in enumerate((8, 4, 2, 1)):
        dim = [f for f in flows if f.frac == pytest.approx(blocks / (nodes - 1))]
        assert {(f.src, f.dst) for f in dim} == {(gpus[i], gpus[(i + sign * (1 << d)) % nodes])
                                                 for i in range(nodes)}
    expected = (nodes - 1) / nodes * size / T.IB_APP_EFFICIENCY
    for k in range(nodes):
        out = [r for (u, v), r in cl.links.items() if u.startswith(f"n{k}.nic") and "leaf" in v and r.carried]
        into = [r for (u, v), r in cl.links.items() if v.startswith(f"n{k}.nic") and "leaf" in u and r.carried]
        assert len(out) == len(into) == 1
        assert out[0].carried == pytest.approx(expected, rel=1e-9)
        assert into[0].carried == pytest.approx(expected, rel=1e-9)


def test_pat_never_on_full_nodes_in_the_engine():
    topo = build_system("dgx-h100", 2)
    eng = NcclEngine(Cluster(topo))
    gpus = tuple(topo.gpus())
    assert eng.plan(Collective("all_gather", 1 * MiB, tuple(range(16))), gpus).algorithm != "pat"
    with pytest.raises(ValueError, match="pat"):
        eng.plan(Collective("all_gather", 1 * MiB, tuple(range(16)), algorithm="pat"), gpus)
