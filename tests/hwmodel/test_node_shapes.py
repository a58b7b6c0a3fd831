"""Nodes of any shape: GPUs per node, NICs shared by GPUs, NVLink domains larger than a server."""

import pytest

from hwmodel import systems
from hwmodel.cluster import Cluster
from hwmodel.ir import Collective
from hwmodel.nccl import tuner
from hwmodel.nccl.engine import NVLINK_EFFICIENCY_FIT, NcclEngine
from hwmodel.systems import get_system, known_systems, node_shape
from hwmodel.topology import build_system, iter_links

GiB = 1 << 30


def _all_reduce(topo, gpus, size, *, algo=None, proto=None):
    """One collective alone on ``topo``: (time_s, plan, cluster)."""
    cl = Cluster(topo)
    eng = NcclEngine(cl)
    plan = eng.plan(Collective("all_reduce", size, tuple(range(len(gpus))), algorithm=algo, protocol=proto),
                    tuple(gpus))
    done = eng.start(plan)
    cl.env.run()
    assert done.processed
    return cl.env.now, plan, cl


def _carried(cl, kind):
    """Bytes carried per directed link of ``kind`` (nvlink, pcie, ib)."""
    g = cl.topology.graph
    return {f"{u}->{v}": cl.links[(u, v)].carried for u, v, d in g.edges(data=True) if d["kind"] == kind}


# -- the node shape --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", known_systems())
def test_default_shape_is_the_systems_table(name):
    s = get_system(name)
    shape = node_shape(s)
    assert (shape.gpus_per_node, shape.nics_per_node, shape.pcie_switches, shape.nvswitch_count) == \
        (s.gpus_per_node, s.nics_per_node, s.pcie_switches, s.nvswitch_count)
    assert shape.cpus == s.cpus


def test_smaller_nodes_keep_the_design_per_gpu():
    s = get_system("dgx-h100")  # 8 GPUs, 8 NICs, 4 PCIe switches, 2 CPUs
    two = node_shape(s, 2)
    assert (two.gpus_per_node, two.nics_per_node, two.pcie_switches, two.cpus) == (2, 2, 1, 1)
    one = node_shape(s, 1)
    assert (one.nics_per_node, one.nvswitch_count) == (1, 0)
    assert node_shape(get_system("dgx-2-v100"), 4).nics_per_node == 2  # DGX-2: a NIC per 2 GPUs


def test_one_gpu_node_has_no_nvlink_and_its_own_nic():
    t = build_system("dgx-h100", 2, gpus_per_node=1)
    assert t.num_gpus == 2 and t.gpus_per_node == 1 and t.nics_per_node == 1
    assert not t.nodes_of_kind("nvswitch") and not list(iter_links(t, "nvlink"))
    route = t.route("n0.gpu0", "n1.gpu0")
    assert [t.graph.edges[e]["kind"] for e in route] == ["pcie", "pcie", "ib", "ib", "pcie", "pcie"]


def test_eight_gpus_share_four_nics_in_pairs_under_their_pcie_switch():
    t = build_system("dgx-h100", 2, nics_per_node=4)
    assert [t.nic_of(f"n0.gpu{j}") for j in range(8)] == [f"n0.nic{j // 2}" for j in range(8)]
    for j in range(8):  # the GPU and its NIC hang off the same PCIe switch: no CPU hop
        assert t.pcie_switch_of(f"n0.gpu{j}") == f"n0.pcie{j // 2}"
        assert f"n0.pcie{j // 2}" in {v for u, v in t.route(f"n0.gpu{j}", f"n1.gpu{j}")}


@pytest.mark.parametrize("kw, match", [
    ({"gpus_per_node": 16}, r"gpus_per_node must be an integer in 1\.\.8 \(a dgx-h100 node holds 8 GPUs\), got 16"),
    ({"gpus_per_node": 0}, r"gpus_per_node must be an integer in 1\.\.8 .*got 0"),
    ({"gpus_per_node": True}, r"gpus_per_node must be an integer .*got True"),
    ({"gpus_per_node": 2.0}, r"gpus_per_node must be an integer .*got 2\.0"),
    ({"nics_per_node": 3}, r"nics_per_node = 3 does not divide gpus_per_node = 8: .*allowed: 2, 4, 8"),
    # one NIC on socket 0 of a two-socket DGX: socket 1's GPUs have no PCIe path to it (no inter-socket link)
    ({"nics_per_node": 1}, r"nics_per_node = 1 leaves GPUs of the node's 2 CPU sockets without a NIC .*: 2, 4, 8"),
    ({"gpus_per_node": 4, "nics_per_node": 8}, r"nics_per_node must be an integer in 0\.\.4 .*got 8"),
    ({"nics_per_node": -1}, r"nics_per_node must be an integer in 0\.\.8 .*got -1"),
    ({"nics_per_node": 0}, r"nics_per_node = 0 leaves 2 nodes without a fabric"),
])
def test_bad_node_shapes_are_refused_in_one_line_naming_the_key(kw, match):
    with pytest.raises(ValueError, match=match) as exc:
        build_system("dgx-h100", 2, **kw)
    assert "\n" not in str(exc.value)


def test_a_single_node_may_have_no_nic():
    t = build_system("dgx-h100", 1, gpus_per_node=1, nics_per_node=0)
    assert t.num_gpus == 1 and not t.nodes_of_kind("nic")


def test_cluster_files_take_the_node_shape(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text('system = "dgx-a100"\nnum_nodes = 2\ngpus_per_node = 4\nnics_per_node = 2\n')
    t = systems.load_cluster_file(f)
    assert t.num_gpus == 8 and t.nics_per_node == 2


# -- closed forms on the new shapes -------------------------------------------------------------------


def test_two_gpu_node_all_reduce_bus_bandwidth_is_nvlink():
    # Ring all-reduce over n = 2: each GPU sends 2(n-1)/n x S = S over its NVLink (450 GB/s line rate per
    # direction on H100, times NCCL's achieved fraction); busBw = algBw x 2(n-1)/n = S / transfer time.
    t = build_system("dgx-h100", 1, gpus_per_node=2)
    size = GiB
    time_s, plan, cl = _all_reduce(t, t.gpus(), size, algo="ring", proto="simple")
    assert "hopper" not in NVLINK_EFFICIENCY_FIT  # no fit: NCCL's SM90_NVLINK_BW 20.6 / 25 GB/s line rate
    link_Bps = 18 * 25e9 * (20.6 / 25)
    rate = min(link_Bps, plan.rate_bound_Bps)
    assert time_s == pytest.approx(plan.latency_s + size / rate, rel=1e-9)
    bus_bw = size / (time_s - plan.latency_s) * 2 * (2 - 1) / 2
    assert bus_bw == pytest.approx(rate, rel=1e-9)
    assert rate > 300e9  # NVLink-class, not PCIe (64 GB/s) or a NIC (50 GB/s)
    assert all(v == 0 for v in _carried(cl, "pcie").values())
    # each direction of each GPU's NVLink carries S at the line rate's share NCCL achieves: S / (20.6/25)
    assert sorted(_carried(cl, "nvlink").values()) == pytest.approx([size / (20.6 / 25)] * 4, rel=1e-9)


def test_eight_gpus_on_four_nics_two_flows_per_nic_at_half_rate_each():
    t = build_system("dgx-h100", 2, nics_per_node=4)
    cl = Cluster(t)
    size = 1e9
    acts = [cl.transfer(f"n0.gpu{j}", f"n1.gpu{j}", size) for j in range(8)]
    cl.env.run()
    nic_Bps = 50e9  # NDR 400 Gb/s, QM9700 port 400 Gb/s
    lat = t.path_latency_s(t.route("n0.gpu0", "n1.gpu0"))
    for a in acts:
        assert a.done.processed
    assert cl.env.now == pytest.approx(lat + size / (nic_Bps / 2), rel=1e-9)
    for j in range(4):
        assert cl.links[(f"n0.nic{j}", f"su0.leaf{j}")].carried == pytest.approx(2 * size)


def test_ring_all_reduce_on_shared_nics_uses_every_nic_equally():
    # 4 rails (one ring per NIC): the NICs bound it, 2(n-1)/n x S / (4 x 50 GB/s x NCCL's IB efficiency).
    t = build_system("dgx-h100", 2, nics_per_node=4)
    n, size = 16, GiB
    time_s, plan, cl = _all_reduce(t, t.gpus(), size, algo="ring", proto="simple")
    b = 4 * 50e9 * tuner.IB_APP_EFFICIENCY
    assert time_s == pytest.approx(plan.latency_s + 2 * (n - 1) / n * size / b, rel=1e-9)
    out = [cl.links[(f"n0.nic{j}", f"su0.leaf{j}")].carried for j in range(4)]
    # each NIC: a quarter of the ring's 2(n-1)/n x S, on the wire at NCCL's achieved IB fraction
    assert out == pytest.approx([2 * (n - 1) / n * size / 4 / tuner.IB_APP_EFFICIENCY] * 4, rel=1e-9)


def test_nvl72_all_reduce_inside_the_domain_is_nvls_and_never_touches_a_nic():
    t = build_system("gb200-nvl72", 2)
    assert t.gpus_per_node == 72 and t.nics_per_node == 72
    assert t.graph.nodes["n0.nvswitch"]["count"] == 18
    assert t.bottleneck_Bps(t.route("n0.gpu0", "n0.gpu71")) == pytest.approx(900e9)  # 1.8 TB/s bidirectional
    for gpus in (t.gpus_of_node(0), t.gpus_of_node(0)[:8]):  # the whole rack, and a TP 8 group
        _, plan, cl = _all_reduce(t, gpus, GiB)
        assert plan.algorithm == "nvls"
        assert all(v == 0 for v in _carried(cl, "ib").values())
        assert all(cl.links[(u, v)].carried == 0 for u, v in cl.links if "nic" in u or "nic" in v)
    # between racks the NICs carry it
    _, plan, cl = _all_reduce(t, [t.gpus_of_node(0)[0], t.gpus_of_node(1)[0]], GiB)
    assert cl.links[("n0.nic0", "su0.leaf0")].carried > 0


def test_nvl36_is_half_a_rack():
    t = build_system("gb200-nvl36", 1)
    assert t.num_gpus == 36 and t.nics_per_node == 36 and t.gpu_spec.name == "B200-GB200"


def test_dgx2_sixteen_v100_on_nvswitch_gen1_and_eight_edr_nics():
    t = build_system("dgx-2-v100", 2)
    assert t.gpus_per_node == 16 and t.nics_per_node == 8 and t.gpu_spec.hbm_capacity_bytes == 32e9
    assert t.graph.nodes["n0.nvswitch"]["spec"] == "NVSwitch-gen1"
    assert t.bottleneck_Bps(t.route("n0.gpu0", "n0.gpu15")) == pytest.approx(6 * 25e9)
    assert t.bottleneck_Bps(t.route("n0.gpu0", "n1.gpu0")) == pytest.approx(12.5e9)  # EDR 100 Gb/s
    assert t.nic_of("n0.gpu0") == t.nic_of("n0.gpu1") == "n0.nic0"
    ct = NcclEngine(Cluster(t)).comm_topology(tuple(t.gpus_of_node(0)))
    assert ct.nvls is None  # NVLink SHARP needs NVSwitch gen3


def test_a100_nodes_with_four_100g_nics_for_eight_gpus():
    # e.g. a cluster of 8-A100 servers with 4 x 100 Gb/s EDR NICs: two GPUs per NIC, 12.5 GB/s each way
    t = build_system("dgx-a100", 2, nic_override="ConnectX-5-EDR", nics_per_node=4)
    assert t.nics_per_node == 4 and t.nic_spec.name == "ConnectX-5-EDR"
    assert t.bottleneck_Bps(t.route("n0.gpu1", "n1.gpu1")) == pytest.approx(100e9 / 8)
    assert t.nic_of("n0.gpu6") == t.nic_of("n0.gpu7") == "n0.nic3"


def test_one_gpu_per_node_all_reduce_is_one_nic_ring():
    # 4 nodes of 1 GPU: one rail; each GPU sends 2(n-1)/n x S through its only NIC (50 GB/s NDR x NCCL's
    # achieved IB fraction), no NVLink anywhere
    t = build_system("dgx-h100", 4, gpus_per_node=1)
    n, size = 4, GiB
    time_s, plan, cl = _all_reduce(t, t.gpus(), size, algo="ring", proto="simple")
    assert time_s == pytest.approx(plan.latency_s + 2 * (n - 1) / n * size / (50e9 * tuner.IB_APP_EFFICIENCY),
                                   rel=1e-9)
    for algo in (None, "tree", "pat"):  # NCCL's own choice and the other one-GPU-per-node algorithms run
        op = "reduce_scatter" if algo == "pat" else "all_reduce"
        cl = Cluster(t)
        eng = NcclEngine(cl)
        plan = eng.plan(Collective(op, 16 << 20, tuple(range(n)), algorithm=algo), tuple(t.gpus()))
        done = eng.start(plan)
        cl.env.run()
        assert done.processed and cl.env.now > 0
