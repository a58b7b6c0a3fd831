"""NCCL 2.30.7 tuning model, search channels and runtime channels (hwmodel.nccl.tuner / channels)."""

import pytest

from hwmodel.nccl import channels as C
from hwmodel.nccl import tuner as T
from hwmodel.nccl.channels import CommTopology, SearchGraph, nccl_channels

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30


@pytest.fixture(scope="module")
def a100x1():
    return CommTopology.from_system("ampere", 1, 8, 240.0, 25.0, 8, "amd")


@pytest.fixture(scope="module")
def h100x1():
    return CommTopology.from_system((9, 0), 1, 8, 18 * 20.6, 50.0, 8, "intel")


@pytest.fixture(scope="module")
def a100x16():
    return CommTopology.from_system("sm80", 16, 8, 240.0, 25.0, 8, "amd")


@pytest.fixture(scope="module")
def h100x16():
    return CommTopology.from_system("hopper", 16, 8, 370.8, 50.0, 8, "intel")


# ---------------------------------------------------------------- search graphs and channels (§3.2)


def test_search_graphs_match_reference(a100x1, h100x1, a100x16, h100x16):
    assert a100x1.ring == SearchGraph(12, 20e9, 20e9) and a100x1.n_channels == 24
    assert h100x1.ring == SearchGraph(12, 30e9, 30e9) and h100x1.n_channels == 24
    assert a100x16.ring == SearchGraph(8, 24e9, 24e9) and a100x16.n_channels == 16
    assert h100x16.ring == SearchGraph(8, 48e9, 48e9) and h100x16.n_channels == 16
    # NVLS: 8 heads on one H100 node, bwIntra 40 (9 x 40 <= 370.8), bwInter raised to 60; 16 runtime channels.
    assert h100x1.nvls == SearchGraph(8, 40e9, 60e9) and h100x1.nvls_channels == 16
    assert h100x1.nvls_available and not a100x1.nvls_available and not h100x16.nvls_available


def test_channel_count_variants():
    # sm90 multi-node, 4 NICs: 4 @ 48 is duplicated (nCh <= 4) to 8 @ 24, then x2 = 16.
    t = CommTopology.from_system("hopper", 2, 4, 370.8, 50.0, 4, "intel")
    assert t.ring == SearchGraph(8, 24e9, 24e9) and t.n_channels == 16
    # 6 NICs: 6 @ 48 (no dup) -> x2 = 12 -> x2 again (sm90, bwIntra 48 > 45, < 16 channels) = 24.
    t = CommTopology.from_system("hopper", 2, 6, 370.8, 50.0, 6, "intel")
    assert t.ring == SearchGraph(6, 48e9, 48e9) and t.n_channels == 24
    # NCCL_MAX_NCHANNELS-style cap.
    assert CommTopology.from_system("ampere", 1, 8, 240.0, max_channels=8).n_channels == 8
    # PCIe-only node: no LL128, PCI latency row.
    pci = CommTopology.from_system("ampere", 1, 4, 0.0)
    assert pci.intra_link == "pci" and not pci.ll128_enabled
    assert not T.is_enabled("all_reduce", "ring", "ll128", pci)


def test_arch_from_compute_capability():
    assert C.arch_from_compute_capability(8.0) == "ampere"
    assert C.arch_from_compute_capability("9.0") == "hopper"
    assert C.arch_from_compute_capability(100) == "blackwell"
    assert C.arch_from_compute_capability((7, 0)) == "volta"
    with pytest.raises(ValueError):
        C.arch_from_compute_capability(6.0)


def test_runtime_channels_threads(a100x1, h100x1):
    # §3.1 worked example: Ring Simple keeps 24 channels only from 24*512*64 B = 768 KiB; 64 KiB uses 2.
    assert nccl_channels("ring", "simple", 64 * KiB, a100x1) == (2, 512 + 32)
    assert nccl_channels("ring", "simple", 768 * KiB, a100x1) == (24, 544)
    assert nccl_channels("ring", "simple", 768 * KiB - 1, a100x1) == (23, 544)
    # Ring LL threshold is 8 B x nRanks per thread: 1 KiB -> 1 channel, threads halved to 3 warps.
    assert nccl_channels("ring", "ll", 1 * KiB, a100x1) == (1, 96)
    assert nccl_channels("ring", "ll128", 64 * MiB, a100x1) == (24, 640)
    assert nccl_channels("tree", "ll", 32 * KiB, a100x1).n_threads == 640
    assert nccl_channels("nvls", "simple", 1 * KiB, h100x1) == (16, 640)
    with pytest.raises(ValueError, match="tree, ring, nvls"):
        nccl_channels("collnet", "simple", 1, a100x1)


# ---------------------------------------------------------------- worked example (§3.3)

WORKED = [
    # (fixture, algo, proto, lat_us, busbw_GBps, algbw_GBps)
    ("a100x1", "ring", "ll", 15.0, 87.7, 50.1),
    ("a100x1", "ring", "ll128", 40.6, 220.8, 126.2),
    ("a100x1", "ring", "simple", 56.0, 240.0, 137.1),
    ("a100x1", "tree", "ll", 15.2, 58.1, 29.1),
    ("a100x1", "tree", "ll128", 31.5, 171.7, 85.9),
    ("a100x1", "tree", "simple", 64.4, 220.8, 110.4),
    ("h100x1", "ring", "ll", 15.0, 141.0, 80.6),
    ("h100x1", "ring", "ll128", 40.6, 331.2, 189.3),
    ("h100x1", "ring", "simple", 56.0, 360.0, 205.7),
    ("h100x1", "tree", "ll", 15.2, 87.2, 43.6),
    ("h100x1", "tree", "ll128", 31.5, 257.6, 128.8),
    ("h100x1", "tree", "simple", 64.4, 331.2, 165.6),
    ("a100x16", "ring", "ll", 535.6, 19.0, 9.6),
    ("a100x16", "ring", "ll128", 582.0, 160.0, 80.6),
    ("a100x16", "ring", "simple", 1772.4, 192.0, 96.8),
    ("a100x16", "tree", "ll", 55.2, 19.0, 9.5),
    ("a100x16", "tree", "ll128", 99.5, 133.5, 66.8),
    ("a100x16", "tree", "simple", 176.4, 142.4, 71.2),
    ("h100x16", "ring", "ll", 311.6, 20.4, 10.3),
    ("h100x16", "ring", "ll128", 559.6, 293.6, 148.0),
    ("h100x16", "ring", "simple", 1190.0, 384.0, 193.5),
    ("h100x16", "tree", "ll", 55.2, 20.4, 10.2),
    ("h100x16", "tree", "ll128", 99.5, 232.0, 116.0),
    ("h100x16", "tree", "simple", 176.4, 288.0, 144.0),
]


@pytest.mark.parametrize(("system", "algo", "proto", "lat_us", "bus", "alg"), WORKED)
def test_worked_example(request, system, algo, proto, lat_us, bus, alg):
    topo = request.getfixturevalue(system)
    assert T.latency_s("all_reduce", algo, proto, topo) * 1e6 == pytest.approx(lat_us, abs=0.05)
    assert T.bus_bandwidth_Bps("all_reduce", algo, proto, topo) / 1e9 == pytest.approx(bus, abs=0.05)
    assert T.algo_bandwidth_Bps("all_reduce", algo, proto, topo) / 1e9 == pytest.approx(alg, abs=0.06)


def test_nvls_model(h100x1):
    # busBw = 8 ch x min(40*0.85*7/8*2, 60) = 476 GB/s (measured ~480, nccl-tests #212); algBw = 476*8/14.
    assert T.bus_bandwidth_Bps("all_reduce", "nvls", "simple", h100x1) / 1e9 == pytest.approx(476.0)
    assert T.algo_bandwidth_Bps("all_reduce", "nvls", "simple", h100x1) / 1e9 == pytest.approx(272.0)
    assert T.latency_s("all_reduce", "nvls", "simple", h100x1) == pytest.approx(25e-6)


def test_time_corrections(a100x1, a100x16):
    # Ring plateau: multi-node Ring Simple all-reduce latency x1.4 once nBytes/(16 ch * 128 ranks) >= 64.
    edge = 64 * 16 * 128
    assert T.latency_s("all_reduce", "ring", "simple", a100x16, edge - 1) == pytest.approx(1772.4e-6)
    assert T.latency_s("all_reduce", "ring", "simple", a100x16, edge) == pytest.approx(1.4 * 1772.4e-6)
    t = T.predict_time_s("all_reduce", "ring", "simple", GiB, a100x16)
    assert t == pytest.approx(1.4 * 1772.4e-6 + GiB / (192e9 * 128 / 254), rel=1e-6)
    # Tree correction factor: Simple at 1 MiB (log2(2^20/64) = 14) is 0.5.
    t_tree = T.predict_time_s("all_reduce", "tree", "simple", MiB, a100x1)
    assert t_tree == pytest.approx(64.4e-6 + MiB / (0.5 * 110.4e9), rel=1e-6)
    # No correction from 2^(23+6) bytes up.
    bw = T.algo_bandwidth_Bps("all_reduce", "tree", "simple", a100x1, 512 * MiB)
    assert bw / 1e9 == pytest.approx(110.4)
    # FP8 ring penalty with more than 8 ranks.
    t8 = T.predict_time_s("all_reduce", "ring", "ll", KiB, a100x16, dtype="fp8")
    assert t8 == pytest.approx(1024 * T.predict_time_s("all_reduce", "ring", "ll", KiB, a100x16))


def test_other_collectives(a100x1):
    # AllGather ring: nsteps = n-1 = 7, algBw = 240*8/7, latency 8.4 + 7*3.4.
    assert T.algo_bandwidth_Bps("all_gather", "ring", "simple", a100x1) / 1e9 == pytest.approx(240 * 8 / 7)
    assert T.latency_s("all_gather", "ring", "simple", a100x1) == pytest.approx((8.4 + 7 * 3.4) * 1e-6)
    # Broadcast (sameChannels): base + one hop; algBw = busBw * n/n.
    assert T.latency_s("broadcast", "ring", "ll", a100x1) == pytest.approx((6.6 + 0.6) * 1e-6)
    assert not T.is_enabled("broadcast", "tree", "simple", a100x1)
    assert not T.is_enabled("all_gather", "tree", "ll", a100x1)
    with pytest.raises(ValueError, match="p2p"):
        T.choose("all_to_all", MiB, a100x1)


# ---------------------------------------------------------------- decisions


def test_choose_single_node(a100x1, h100x1):
    small = T.choose("all_reduce", 32 * KiB, a100x1)
    assert small.protocol in ("ll", "ll128") and small.algorithm == "ring"
    assert small.n_channels == 1 and small.latency_s == pytest.approx(15e-6)
    big = T.choose("all_reduce", GiB, a100x1)
    assert (big.algorithm, big.protocol, big.n_channels, big.n_threads) == ("ring", "simple", 24, 544)
    assert big.predicted_time_s == pytest.approx(56e-6 + GiB / (240e9 * 8 / 14), rel=1e-6)
    assert T.choose("all_reduce", 4 * MiB, a100x1).protocol == "ll128"
    # H100: Ring LL for small, NVLS (NVLink SHARP) from a few MB.
    assert T.choose("all_reduce", 32 * KiB, h100x1).protocol == "ll"
    assert T.choose("all_reduce", 64 * MiB, h100x1).algorithm == "nvls"


def test_choose_multi_node(a100x16):
    for size in (1 * KiB, 32 * KiB):
        c = T.choose("all_reduce", size, a100x16)
        assert (c.algorithm, c.protocol) == ("tree", "ll")
    for size in (256 * KiB, 4 * MiB, 64 * MiB):
        c = T.choose("all_reduce", size, a100x16)
        assert (c.algorithm, c.protocol) == ("tree", "ll128")
    c = T.choose("all_reduce", GiB, a100x16)
    assert (c.algorithm, c.protocol, c.n_channels) == ("ring", "simple", 16)
    two = CommTopology.from_system("ampere", 2, 8, 240.0, 25.0, 8, "amd")
    assert T.choose("all_reduce", 1 * MiB, two).algorithm == "tree"
    c = T.choose("all_reduce", 256 * MiB, two)
    assert (c.algorithm, c.protocol) == ("ring", "simple")


def test_forced_and_overrides(a100x1, h100x1):
    c = T.choose("all_reduce", GiB, a100x1, algo="tree", proto="LL")
    assert (c.algorithm, c.protocol) == ("tree", "ll")
    assert T.choose("all_reduce", 32 * KiB, a100x1, proto="simple").protocol == "simple"
    assert T.choose("all_reduce", 32 * KiB, a100x1, proto="^ll").protocol == "ll128"
    with pytest.raises(ValueError, match="tree, ring, nvls"):
        T.choose("all_reduce", 1, a100x1, algo="collnet")
    with pytest.raises(ValueError, match="simple, ll, ll128"):
        T.choose("all_reduce", 1, a100x1, proto="ll64")
    with pytest.raises(ValueError, match="algorithm/protocol: none of .* available"):
        T.choose("all_reduce", 1, a100x1, algo="nvls")
    with pytest.raises(ValueError):
        T.predict_time_s("broadcast", "tree", "simple", 1, a100x1)
    with T.overrides(algo="ring", proto="simple"):
        assert T.get_default_overrides() == (frozenset({"ring"}), frozenset({"simple"}))
        c = T.choose("all_reduce", 32 * KiB, h100x1)
        assert (c.algorithm, c.protocol) == ("ring", "simple")
        # A per-call value replaces the default for its dimension only.
        assert T.choose("all_reduce", 32 * KiB, h100x1, proto="ll").algorithm == "ring"
    assert T.get_default_overrides() == (None, None)
    T.set_default_overrides(algo="tree")
    try:
        assert T.choose("all_reduce", GiB, a100x1).algorithm == "tree"
    finally:
        T.set_default_overrides()
    with pytest.raises(ValueError):
        T.set_default_overrides(proto="fast")


def test_single_rank_is_free():
    t = CommTopology.from_system("ampere", 1, 1, 240.0)
    c = T.choose("all_reduce", GiB, t)
    assert (c.algorithm, c.protocol, c.predicted_time_s) == ("ring", "simple", 0.0)


def test_p2p_helpers(a100x1, a100x16):
    assert C.p2p_channels_per_peer(a100x1, "nvlink") == 32  # 2 x 12 links -> pow2 32, <= p2pnChannels 32
    assert C.p2p_channels_per_peer(a100x1, "pci") == 2
    plan = C.p2p_plan(1 * MiB, a100x1, "nvlink", n_peers=1)
    assert plan == (16, "simple", 512 * KiB, pytest.approx((8.4 + 3.4) * 1e-6))
    small = C.p2p_plan(4 * KiB, a100x1, "nvlink", n_peers=1)
    assert small.protocol == "ll" and small.n_channels == 1
    # Multi-node: per-peer channels shrink so 128 peers fit the 16 p2p channels; 128 KiB chunks.
    net = C.p2p_plan(1 * MiB, a100x16, "net")
    assert net.n_channels == 1 and net.chunk_bytes == 128 * KiB and net.protocol == "simple"
    with pytest.raises(ValueError):
        C.p2p_plan(1, a100x1, "ib")


def test_efficiency_constants():
    assert {"ll": 0.5, "ll128": pytest.approx(0.9375), "simple": 1.0} == T.PROTOCOL_EFFICIENCY
    assert T.NVLINK_APP_EFFICIENCY["ampere"] == pytest.approx(0.8)
    assert T.NVLINK_APP_EFFICIENCY["hopper"] == pytest.approx(0.824)
    assert 0.92 <= T.IB_APP_EFFICIENCY <= 0.96
    assert T.NCCL_VERSION == "2.30.7"


def test_engine_helpers(a100x1, a100x16):
    assert T.normalise_algorithm("Ring") == "ring" and T.normalise_protocol("LL128") == "ll128"
    assert T.normalise_algorithm("PAT") == "pat"  # modelled since the algorithm registry
    with pytest.raises(ValueError, match="tree, ring, nvls, nvls_tree, pat"):
        T.normalise_algorithm("collnet_direct")
    assert T.ring_steps("all_reduce", 8) == 14 and T.ring_steps("all_gather", 8) == 7
    assert T.arch_of(9.0) == "hopper" and T.NET_APP_EFFICIENCY == T.IB_APP_EFFICIENCY
    assert T.p2p_channels_and_latency(4 * KiB, a100x1, n_peers=1) == (1, pytest.approx(7.2e-6))
    nch, lat = T.p2p_channels_and_latency(1 * MiB, a100x16, same_node=False)
    assert nch == 1 and lat == pytest.approx(22.4e-6)
    # Uneven placement: 12 ranks on 2 nodes (8 + 4); no NVLS without an NVSwitch gen 3.
    t = CommTopology.from_system("hopper", 2, 8, 370.8, 50.0, 8, "intel", n_ranks=12)
    assert t.n_ranks == 12 and t.ppn == 6
    with pytest.raises(ValueError, match="outside"):
        CommTopology.from_system("hopper", 2, 8, 370.8, n_ranks=17)
    h = CommTopology.from_system("hopper", 1, 8, 370.8, nvswitch_gen=0)
    assert not h.nvls_available


# ---------------------------------------------------------------- NVLSTree (multi-node NVLS)


@pytest.fixture(scope="module")
def h100x2():
    return CommTopology.from_system("hopper", 2, 8, 370.8, 50.0, 8, "intel")


def test_nvls_graph_on_several_nodes(h100x2, h100x16, a100x16):
    # DGX H100 x N (channels.py worked example): sm90 inter speeds from min(NIC 50, PCIe 48) = 48 down;
    # k channels fit while (k+1)*s <= 370.8: 48 -> 6, 45 -> 7, 40 -> 8 = one per NIC (done); pass 2
    # raises bwInter 40 -> 48. Runtime: NVLS_NCHANNELS_SM90 = 16.
    for t in (h100x2, h100x16):
        assert t.nvls == SearchGraph(8, 40e9, 48e9)
        assert (t.nvls_channels, t.nvls_heads) == (16, 8)
        assert t.nvls_tree_available and not t.nvls_available  # NVLS itself needs CollNet off-node
    assert a100x16.nvls is None and not a100x16.nvls_tree_available  # NVSwitch gen2: no NVLink SHARP
    # DGX B200 x N: 721.8/48 - 1 = 14 >= 8 NICs at the first speed; bwInter cannot rise past the NIC.
    # Runtime channels (ncclNvlsTreeSm100Tuning, NIC path 48 GB/s): 32 on 2 nodes, 24 on more.
    b2 = CommTopology.from_system("blackwell", 2, 8, 18 * 40.1, 50.0, 8, "intel")
    b16 = CommTopology.from_system("blackwell", 16, 8, 18 * 40.1, 50.0, 8, "intel")
    assert b2.nvls == b16.nvls == SearchGraph(8, 48e9, 48e9)
    assert (b2.nvls_channels, b16.nvls_channels) == (32, 24)
    assert C.nvls_runtime_channels("blackwell", 4, 8, 100e9) == 24
    assert C.nvls_runtime_channels("blackwell", 4, 16, 100e9) == 32
    assert C.nvls_runtime_channels("blackwell", 1, 8, 50e9) == 24
    assert C.nvls_runtime_channels("ampere", 2, 8, 25e9) == 0
    with pytest.raises(ValueError, match="gpu_arch 'sm80'; allowed: volta, ampere, hopper, blackwell"):
        C.nvls_runtime_channels("sm80", 2, 8, 25e9)
    # 4 NICs for 8 GPUs: 4 heads; 4 channels fit at 48 (never 8), bwInter stays 48.
    four = CommTopology.from_system("hopper", 2, 8, 370.8, 50.0, 4, "intel")
    assert four.nvls == SearchGraph(4, 48e9, 48e9) and four.nvls_heads == 4
    # one GPU per node: ncclNvlsInit needs 2 local GPUs -> no NVLS, no NVLSTree.
    one = CommTopology.from_system("hopper", 2, 1, 370.8, 50.0, 8, "intel")
    assert one.nvls is None and not T.is_enabled("all_reduce", "nvls_tree", "simple", one)
    assert nccl_channels("nvls_tree", "simple", 1 * KiB, h100x16) == (16, 640)
    assert nccl_channels("NVLSTree", "simple", 1 * GiB, b16) == (24, 640)
    with pytest.raises(ValueError, match="NVLSTree is not available"):
        nccl_channels("nvls_tree", "simple", 1 * KiB, CommTopology.from_system("hopper", 1, 8, 370.8))


NVLS_TREE = [
    # (fixture, lat_us, busbw_GBps, algbw_GBps); ncclTopoTuneModel, Hopper, NVLS graph 8 ch @ 40/48:
    # intraBw = 40*0.85*(7/8)*2 = 59.5, interBw = 48*(2 if nNodes <= 2 else 1),
    # bw = min(intraBw, interBw, perChMaxNVLSTreeBw[Hopper] = 57.7 (2 nodes) / 45.5 (> 2)),
    # busBw = 8*bw, algBw = busBw*n/(2(n-1)); lat = 0 + 25 + 2*log2(nNodes)*20.9.
    ("h100x2", 25 + 2 * 1 * 20.9, 8 * 57.7, 8 * 57.7 * 16 / 30),    # 66.8 us, 461.6, 246.19
    ("h100x16", 25 + 2 * 4 * 20.9, 8 * 45.5, 8 * 45.5 * 128 / 254),  # 192.2 us, 364.0, 183.43
]


@pytest.mark.parametrize(("system", "lat_us", "bus", "alg"), NVLS_TREE)
def test_nvls_tree_model(request, system, lat_us, bus, alg):
    topo = request.getfixturevalue(system)
    assert T.latency_s("all_reduce", "nvls_tree", "simple", topo) == pytest.approx(lat_us * 1e-6, rel=1e-12)
    assert T.bus_bandwidth_Bps("all_reduce", "nvls_tree", "simple", topo) == pytest.approx(bus * 1e9, rel=1e-6)
    assert T.algo_bandwidth_Bps("all_reduce", "nvls_tree", "simple", topo) == pytest.approx(alg * 1e9, rel=1e-6)
    # no size correction on Hopper, and the latency counts once per 8 aggregated operations
    assert T.predict_time_s("all_reduce", "nvls_tree", "simple", 1 * MiB, topo, n_pipe_ops=8) == pytest.approx(
        lat_us * 1e-6 + MiB / (alg * 1e9), rel=1e-6)


def test_nvls_tree_on_blackwell():
    # B200 graph 8 ch @ 48/48: intraBw = 48*0.74*(7/8)*2 = 62.16 < 96 (2 nodes: 2x48, perCh 96.0).
    b2 = CommTopology.from_system("blackwell", 2, 8, 18 * 40.1, 50.0, 8, "intel")
    assert T.bus_bandwidth_Bps("all_reduce", "nvls_tree", "simple", b2) == pytest.approx(8 * 62.16e9, rel=1e-6)
    # 16 nodes: min(62.16, 48, 80.0) = 48 -> busBw 384, algBw 384*128/254.
    b16 = CommTopology.from_system("blackwell", 16, 8, 18 * 40.1, 50.0, 8, "intel")
    full = 384e9 * 128 / 254
    assert T.algo_bandwidth_Bps("all_reduce", "nvls_tree", "simple", b16) == pytest.approx(full, rel=1e-6)
    # x86 Blackwell: treeCorrectionFactor[Simple][log2(nBytes/64)] for log < 24 (one more than Tree):
    # 1 MiB -> index 14 (0.5), 512 MiB -> index 23 (0.9), 1 GiB -> index 24 (none).
    for size, f in ((MiB, 0.5), (512 * MiB, 0.9), (GiB, 1.0)):
        assert T.algo_bandwidth_Bps("all_reduce", "nvls_tree", "simple", b16, size) == pytest.approx(f * full)
    # non-x86 host (e.g. Grace): no correction.
    arm = CommTopology.from_system("blackwell", 16, 8, 18 * 40.1, 50.0, 8, "other")
    assert T.algo_bandwidth_Bps("all_reduce", "nvls_tree", "simple", arm, MiB) == pytest.approx(full)


def test_nvls_tree_is_enabled_only_where_nccl_enables_it(h100x1, h100x2, a100x16):
    assert T.is_enabled("all_reduce", "nvls_tree", "simple", h100x2)
    assert not T.is_enabled("all_reduce", "nvls_tree", "ll128", h100x2)  # Simple only
    for coll in ("all_gather", "reduce_scatter", "broadcast", "reduce"):  # all-reduce only
        assert not T.is_enabled(coll, "nvls_tree", "simple", h100x2)
    assert not T.is_enabled("all_reduce", "nvls_tree", "simple", h100x1)  # "Disable NVLS Tree on a single node"
    assert not T.is_enabled("all_reduce", "nvls", "simple", h100x2)  # multi-node NVLS needs CollNet
    assert not T.is_enabled("all_reduce", "nvls_tree", "simple", a100x16)
    assert T.enabled_pairs("all_reduce", h100x2)[-1] == ("nvls_tree", "simple")  # NCCL_ALGO_* order
    assert ("nvls_tree", "simple") not in T.enabled_pairs("all_reduce", h100x1)


def test_ring_nvls_tree_tree_crossovers_on_16_h100_nodes(h100x16):
    """Where NCCL 2.30.7's model switches, worked by hand from the constants:

    * Tree/LL128: 99.5 us, algBw 116 GB/s x treeCorrectionFactor[LL128] (0.9 for 16-32 MiB, index
      18); NVLSTree: 192.2 us, 183.433 GB/s. Equal at
      S = (192.2 - 99.5) us / (1/104.4 - 1/183.433) ns/B = 92.7e-6 / 4.1269e-12 = 22.46 MB.
    * Ring/Simple: 1190 us x 1.4 (multi-node plateau) = 1666 us, algBw 384*128/254 = 193.512 GB/s.
      Equal to NVLSTree at S = (1666 - 192.2) us / (1/183.433 - 1/193.512) ns/B
      = 1473.8e-6 / 2.8401e-13 = 5.189 GB.
    Below 256 KiB Tree/LL wins (unchanged by NVLSTree).
    """
    lo = 92.7e-6 / (1 / 104.4e9 - 1 / (364e9 * 128 / 254))
    hi = (1666e-6 - 192.2e-6) / (1 / (364e9 * 128 / 254) - 1 / (384e9 * 128 / 254))
    assert lo == pytest.approx(22.46e6, rel=1e-3) and hi == pytest.approx(5.189e9, rel=1e-3)
    pick = {s: (c.algorithm, c.protocol) for s in (int(lo * 0.99), int(lo * 1.01), int(hi * 0.99),
                                                   int(hi * 1.01)) for c in [T.choose("all_reduce", s, h100x16)]}
    assert list(pick.values()) == [("tree", "ll128"), ("nvls_tree", "simple"), ("nvls_tree", "simple"),
                                   ("ring", "simple")]
    c = T.choose("all_reduce", 256 * MiB, h100x16)
    assert (c.algorithm, c.n_channels, c.n_threads) == ("nvls_tree", 16, 640)
    assert c.predicted_time_s == pytest.approx(192.2e-6 + 256 * MiB / (364e9 * 128 / 254), rel=1e-6)
    assert T.choose("all_reduce", 64 * KiB, h100x16).algorithm == "tree"


def test_nvls_tree_names_and_overrides(h100x1, h100x2):
    for name in ("nvls_tree", "NVLSTree", "nvlstree", "nvls-tree"):
        assert T.normalise_algorithm(name) == "nvls_tree"
        assert T.choose("all_reduce", 1 * KiB, h100x2, algo=name).algorithm == "nvls_tree"
    assert T.choose("all_reduce", GiB, h100x2, algo="^NVLSTree").algorithm != "nvls_tree"
    assert T.choose("all_reduce", GiB, h100x2, algo="ring,nvlstree").algorithm == "nvls_tree"
    with T.overrides(algo="NVLSTree"):
        assert T.get_default_overrides()[0] == frozenset({"nvls_tree"})
    with pytest.raises(ValueError, match="NVLSTree the same NVSwitch, several nodes"):
        T.choose("all_reduce", GiB, h100x1, algo="nvls_tree")
    with pytest.raises(ValueError, match="tree, ring, nvls, nvls_tree, pat"):
        T.normalise_algorithm("collnet")
