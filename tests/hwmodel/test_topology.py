"""Tests of hwmodel.topology: node layout, fabrics, routing (closed forms), save/load, errors."""

import time
from pathlib import Path

import pytest

from hwmodel import systems
from hwmodel.specs import UnknownNameError, get_gpu, get_nic, get_switch, load_gpu_file
from hwmodel.systems import SystemSpec
from hwmodel.topology import (
    Topology,
    build_cluster,
    build_system,
    dgx_a100,
    dgx_h100,
    generic_node,
    get_system,
    known_systems,
    load_cluster_file,
)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture(scope="module")
def a100x2() -> Topology:
    return dgx_a100(2)


def _uplink_capacity(t: Topology, leaf: str) -> float:
    return sum(d["bandwidth_Bps"] for _, v, d in t.graph.out_edges(leaf, data=True)
               if t.graph.nodes[v].get("tier") == "spine")


def test_dgx_a100_layout(a100x2):
    t = a100x2
    assert t.num_nodes == 2 and t.gpus_per_node == 8 and t.num_gpus == 16
    assert t.gpus()[:3] == ["n0.gpu0", "n0.gpu1", "n0.gpu2"] and t.gpus()[8] == "n1.gpu0"
    assert t.gpu_index("n1.gpu3") == 11 and t.node_of("n1.gpu3") == 1 and t.local_index("n1.gpu3") == 3
    assert t.gpu_name(1, 3) == "n1.gpu3"
    assert t.gpu_spec is get_gpu("A100-SXM4-80GB") and t.nic_spec is get_nic("ConnectX-6-HDR")
    assert t.nic_of("n1.gpu5") == "n1.nic5"
    # 4 PCIe Gen4 switches, each with 2 GPUs and 2 NICs; GPU and its NIC under the same switch.
    for k in range(4):
        below = sorted(u for u in t.graph.predecessors(f"n0.pcie{k}")
                       if t.graph.nodes[u]["kind"] in ("gpu", "nic"))
        assert below == [f"n0.gpu{2 * k}", f"n0.gpu{2 * k + 1}", f"n0.nic{2 * k}", f"n0.nic{2 * k + 1}"]
    for g in t.gpus():
        nic = t.nic_of(g)
        assert t.graph.has_edge(nic, t.pcie_switch_of(g))
        assert t.link(g, t.pcie_switch_of(g))["bandwidth_Bps"] == pytest.approx(32e9)
    assert t.host_of("n0.gpu0") == "n0.cpu0" and t.host_of("n0.gpu7") == "n0.cpu1"
    # One aggregated NVSwitch per node standing for 6 chips; each GPU edge carries 12 x 25 GB/s.
    assert t.graph.nodes["n0.nvswitch"]["count"] == 6
    assert t.link("n0.gpu0", "n0.nvswitch")["bandwidth_Bps"] == pytest.approx(300e9)
    assert t.link("n0.nvswitch", "n0.gpu0")["kind"] == "nvlink"
    # Rail-optimised: 8 leaves (one per rail) in one SU; NIC r of each node on leaf r.
    assert t.nodes_of_kind("ib_switch", tier="leaf") == [f"su0.leaf{r}" for r in range(8)]
    assert t.graph.has_edge("n1.nic5", "su0.leaf5") and t.graph.has_edge("su0.leaf5", "n1.nic5")


def test_routes_closed_forms(a100x2):
    t = a100x2
    intra = t.route("n0.gpu0", "n0.gpu5")
    assert intra == [("n0.gpu0", "n0.nvswitch"), ("n0.nvswitch", "n0.gpu5")]
    assert t.bottleneck_Bps(intra) == pytest.approx(300e9)
    inter = t.route("n0.gpu2", "n1.gpu2")
    assert inter == [("n0.gpu2", "n0.pcie1"), ("n0.pcie1", "n0.nic2"), ("n0.nic2", "su0.leaf2"),
                     ("su0.leaf2", "n1.nic2"), ("n1.nic2", "n1.pcie1"), ("n1.pcie1", "n1.gpu2")]
    assert t.bottleneck_Bps(inter) == pytest.approx(25e9)  # the HDR NIC
    nic, leaf, pcie = get_nic("hdr"), get_switch("QM8700"), get_switch("PCIe-Gen4-switch")
    assert t.path_latency_s(inter) == pytest.approx(
        nic.latency_s + leaf.hop_latency_s + 2 * pcie.hop_latency_s)
    cross_rail = t.route("n0.gpu0", "n1.gpu3")
    nodes = [u for u, _ in cross_rail] + [cross_rail[-1][1]]
    assert nodes[:3] == ["n0.gpu0", "n0.pcie0", "n0.nic0"]
    assert nodes[-3:] == ["n1.nic3", "n1.pcie1", "n1.gpu3"]
    assert nodes[3] == "su0.leaf0" and nodes[4].startswith("spine") and nodes[5] == "su0.leaf3"
    assert t.bottleneck_Bps(cross_rail) == pytest.approx(25e9)
    assert t.path_latency_s(cross_rail) == pytest.approx(
        nic.latency_s + 3 * leaf.hop_latency_s + 2 * pcie.hop_latency_s)
    assert t.route("n0.gpu1", "n0.gpu1") == [] and t.bottleneck_Bps([]) == float("inf")
    assert t.route("n0.gpu1", "n0.cpu0") == [("n0.gpu1", "n0.pcie0"), ("n0.pcie0", "n0.cpu0")]


def test_routes_are_deterministic(a100x2):
    t = a100x2
    r1 = t.route("n0.gpu0", "n1.gpu3")
    assert t.route("n0.gpu0", "n1.gpu3") == r1
    fresh = dgx_a100(2)
    pairs = [(a, b) for a in t.gpus() for b in t.gpus()]
    assert all(fresh.route(a, b) == t.route(a, b) for a, b in pairs)
    r1.append(("x", "y"))  # returned lists are copies: the cache stays intact
    assert t.route("n0.gpu0", "n1.gpu3")[-1] == ("n1.pcie1", "n1.gpu3")


def test_ecmp_spreads_pairs_over_spines():
    t = dgx_h100(4)
    spines = t.nodes_of_kind("ib_switch", tier="spine")
    assert len(spines) == 4  # H100 RA: 1 SU -> 8 leaves, 4 spines
    used: dict[str, int] = {}
    for a in t.gpus_of_node(0):
        for b in t.gpus()[8:]:
            for _, v in t.route(a, b):
                if v in spines:
                    used[v] = used.get(v, 0) + 1
    assert set(used) == set(spines)
    assert min(used.values()) > 0.1 * sum(used.values())


def test_oversubscription_halves_leaf_uplinks():
    full = dgx_a100(4)
    half = dgx_a100(4, oversubscription=2.0)
    # 1:1 -> SU of 20 nodes x 25 GB/s of uplink per leaf, spread over the spines as one edge each.
    assert _uplink_capacity(full, "su0.leaf0") == pytest.approx(20 * 25e9)
    assert _uplink_capacity(half, "su0.leaf0") == pytest.approx(10 * 25e9)
    spines = full.nodes_of_kind("ib_switch", tier="spine")
    assert all(full.graph.has_edge(leaf, s) for leaf in full.nodes_of_kind("ib_switch", tier="leaf")
               for s in spines)  # every leaf joins every spine, one edge each
    with pytest.raises(ValueError, match="oversubscription must be a number >= 1"):
        dgx_a100(2, oversubscription=0.5)


def test_multi_su_rail_fabric():
    t = dgx_a100(41, su_size=20)
    leaves = t.nodes_of_kind("ib_switch", tier="leaf")
    assert len(leaves) == 3 * 8 and "su2.leaf7" in leaves
    r = t.route("n0.gpu0", "n40.gpu0")  # same rail, different SUs: through a spine
    hops = [v for _, v in r]
    assert "su0.leaf0" in hops and "su2.leaf0" in hops and any(h.startswith("spine") for h in hops)


def test_128_gpu_rail_fabric_is_fast():
    t0 = time.perf_counter()
    t = dgx_h100(16)
    gpus = t.gpus()
    assert len(gpus) == 128
    for a in gpus[::8]:
        for b in gpus:
            t.route(a, b)
    assert time.perf_counter() - t0 < 1.0


def test_dgx_h100_figures():
    t = dgx_h100(2)
    assert t.bottleneck_Bps(t.route("n0.gpu0", "n0.gpu7")) == pytest.approx(450e9)
    assert t.bottleneck_Bps(t.route("n0.gpu0", "n1.gpu0")) == pytest.approx(50e9)
    assert t.link("n0.gpu0", "n0.pcie0")["bandwidth_Bps"] == pytest.approx(64e9)
    assert t.graph.nodes["n0.nvswitch"]["count"] == 4


def test_other_fabrics():
    ft = dgx_a100(6, fabric="fat_tree")  # QM8700: 20 downlink ports -> 2 nodes (16 NICs) per leaf
    assert ft.nodes_of_kind("ib_switch", tier="leaf") == ["leaf0", "leaf1", "leaf2"]
    same_leaf = ft.route("n0.gpu0", "n1.gpu5")
    assert ("n0.nic0", "leaf0") in same_leaf and ("leaf0", "n1.nic5") in same_leaf
    assert any(v.startswith("spine") for _, v in ft.route("n0.gpu0", "n2.gpu0"))
    ss = dgx_h100(3, fabric="single_switch")
    assert [v for _, v in ss.route("n0.gpu1", "n2.gpu4")][2:4] == ["switch0", "n2.nic4"]
    with pytest.raises(ValueError, match="not to 'single_switch'"):
        dgx_h100(2, fabric="single_switch", oversubscription=2)
    with pytest.raises(ValueError, match="fabric must be one of rail_optimized, fat_tree"):
        dgx_h100(2, fabric="torus")


def test_no_route_and_unknown_names():
    t = dgx_a100(2, fabric="none")
    with pytest.raises(ValueError, match=r"no route from 'n0.gpu0' to 'n1.gpu0'"):
        t.route("n0.gpu0", "n1.gpu0")
    assert len(t.route("n0.gpu0", "n0.gpu1")) == 2
    with pytest.raises(ValueError, match=r"unknown GPU 'n9.gpu0'; GPUs are named like n0.gpu0, n0.gpu1"):
        t.route("n9.gpu0", "n0.gpu0")
    with pytest.raises(ValueError, match="unknown GPU"):
        t.node_of("gpu0")
    with pytest.raises(ValueError, match="unknown device 'spine7'"):
        t.route("n0.gpu0", "spine7")
    with pytest.raises(UnknownNameError, match=r"unknown system 'dgx-z100'; known system names: dgx-a100"):
        build_system("dgx-z100", 2)
    with pytest.raises(ValueError, match="num_nodes must be an integer >= 1"):
        build_system("dgx-a100", 0)
    with pytest.raises(KeyError, match="no link"):
        t.link("n0.gpu0", "n1.gpu0")


def test_build_system_registry_and_overrides():
    assert {"dgx-a100", "dgx-h100", "hgx-h200", "dgx-b200"} <= set(known_systems())
    assert build_system("DGX-A100", 2) == dgx_a100(2)
    b200 = build_system("dgx-b200", 1)
    assert b200.bottleneck_Bps(b200.route("n0.gpu0", "n0.gpu1")) == pytest.approx(900e9)
    whatif = load_gpu_file(EXAMPLES / "whatif_a100_2x_nvlink.toml")
    t = build_system("dgx-a100", 2, gpu_override=whatif, nic_override="ndr")
    assert t.gpu_spec.name == "A100-2xNVLink"
    assert t.bottleneck_Bps(t.route("n0.gpu0", "n0.gpu1")) == pytest.approx(600e9)
    assert t.nic_spec.name == "ConnectX-7-NDR"
    assert t.link("n0.nic0", "n0.pcie0")["bandwidth_Bps"] == pytest.approx(32e9)  # Gen5 NIC in a Gen4 slot
    # the system keeps its HDR QM8700 switches: 25 GB/s ports bound the NDR NIC
    assert t.bottleneck_Bps(t.route("n0.gpu0", "n1.gpu0")) == pytest.approx(25e9)


def test_generic_node_pcie_only():
    node = generic_node("A100-SXM4-80GB", gpus_per_node=4, nvlink_links=0, nics_per_node=2, nic="hdr",
                        pcie_switches=2)
    t = build_cluster(node, 2, fabric="single_switch", fabric_switch="QM8700")
    assert "n0.nvswitch" not in t.graph
    assert t.route("n0.gpu0", "n0.gpu1") == [("n0.gpu0", "n0.pcie0"), ("n0.pcie0", "n0.gpu1")]
    assert t.nic_of("n0.gpu3") == "n0.nic1"
    with pytest.raises(ValueError, match="field 'nic' is required"):
        generic_node("A100", nics_per_node=2)


def test_save_load_roundtrip(tmp_path):
    t = dgx_h100(3, oversubscription=2.0)
    p = tmp_path / "cluster.json"
    t.save(p)
    u = Topology.load(p)
    assert u == t and u.gpus() == t.gpus() and u.gpu_spec == t.gpu_spec and u.nic_spec == t.nic_spec
    assert all(u.route(a, b) == t.route(a, b) for a in t.gpus()[::5] for b in t.gpus())
    whatif = build_system("dgx-a100", 1, gpu_override=load_gpu_file(EXAMPLES / "whatif_a100_2x_nvlink.toml"))
    whatif.save(p)
    assert Topology.load(p).gpu_spec.nvlink_links == 24
    p.write_text('{"format": "other"}')
    with pytest.raises(ValueError, match="not a trainsim topology"):
        Topology.load(p)


def test_cluster_files():
    t = load_cluster_file(EXAMPLES / "cluster_dgx_a100_4node.toml")
    assert t.num_nodes == 4 and _uplink_capacity(t, "su0.leaf0") == pytest.approx(10 * 25e9)
    w = load_cluster_file(EXAMPLES / "cluster_whatif_a100_2x_nvlink.toml")
    assert w.gpu_spec.nvlink_links == 24 and w.num_nodes == 2


def test_cluster_file_errors(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text('system = "dgx-a100"\nnodes = 2\n')
    with pytest.raises(ValueError, match=r"unknown keys \['nodes'\]; allowed keys: system, num_nodes"):
        load_cluster_file(p)
    p.write_text("num_nodes = 2\n")
    with pytest.raises(ValueError, match="key 'system' is required"):
        load_cluster_file(p)


# ----------------------------------------------------------------------------------------------------
# Named systems as data (hwmodel/data/systems.toml)

_A100_TABLE = {"gpu": "A100-SXM4-80GB", "gpus_per_node": 8, "nvswitch": "NVSwitch-gen2", "nvswitch_count": 6,
               "nic": "ConnectX-6-HDR", "nics_per_node": 8, "pcie_switches": 4, "pcie_generation": 4, "cpus": 2,
               "fabric_switch": "QM8700", "su_size": 20}


def test_every_system_figure_has_a_source_and_names_known_parts():
    figures = set(_A100_TABLE)
    for name in known_systems():
        s = get_system(name)
        fabric_defaults = {"fabric", "nodes_per_leaf", "oversubscription", "leaves_per_pod", "core_oversubscription"}
        given = {k for k in fabric_defaults if getattr(s, k) != SystemSpec.__dataclass_fields__[k].default}
        assert figures <= set(s.sources) <= figures | fabric_defaults, name
        assert given <= set(s.sources), name  # a published layout's figures have sources too
        assert all(src.startswith(("[SRC]", "[2ND]", "[DERIVED]", "[UNCERTAIN]")) for src in s.sources.values())
        assert get_gpu(s.gpu).name == s.gpu and get_nic(s.nic).name == s.nic
        assert get_switch(s.nvswitch).kind == "nvswitch" and get_switch(s.fabric_switch).kind == "ib"


def test_systems_toml_figures_reach_the_topology():
    t = build_system("dgx-h100", 2)
    assert t.graph.nodes["n0.nvswitch"]["count"] == 4 and t.graph.nodes["n0.nvswitch"]["spec"] == "NVSwitch-gen3"
    assert t.graph.graph["fabric_switch"] == "QM9700" and t.graph.graph["su_size"] == 32
    assert t.gpus_per_node == 8 and t.nics_per_node == 8
    assert len(t.nodes_of_kind("pcie_switch", node=0)) == 4 and len(t.nodes_of_kind("cpu", node=0)) == 2
    assert t.link("n0.gpu0", "n0.pcie0")["bandwidth_Bps"] == pytest.approx(64e9)  # PCIe Gen5 x16 per direction
    a = build_system("dgx-a100", 1)
    assert a.graph.nodes["n0.nvswitch"]["count"] == 6 and a.graph.graph["su_size"] == 20


def test_a_new_system_is_one_table(monkeypatch):
    table = dict(_A100_TABLE, gpu="H100-SXM5", gpus_per_node=4, nvswitch="NVSwitch-gen3", nvswitch_count=2,
                 nics_per_node=2, pcie_switches=2, pcie_generation=5, cpus=1, description="a 4-GPU box")
    before = known_systems()
    monkeypatch.setitem(systems._SYSTEMS, "box-4", systems.system_from_table("box-4", table))
    t = build_system("box-4", 3, fabric="fat_tree")
    assert t.name == "box-4" and t.num_gpus == 12 and t.gpus_per_node == 4 and t.nics_per_node == 2
    assert t.nic_of("n0.gpu3") == "n0.nic1" and t.graph.nodes["n0.nvswitch"]["count"] == 2
    assert t.bottleneck_Bps(t.route("n0.gpu0", "n0.gpu3")) == pytest.approx(18 * 25e9)
    assert t.bottleneck_Bps(t.route("n0.gpu0", "n1.gpu0")) == pytest.approx(25e9)  # HDR ports of QM8700
    assert known_systems() == [*before, "box-4"]


def test_system_table_errors_name_the_key():
    with pytest.raises(ValueError, match=r"\[x\]: unknown keys \['gpus'\]; allowed keys: description, gpu, "):
        systems.system_from_table("x", {**_A100_TABLE, "gpus": 8})
    with pytest.raises(ValueError, match=r"\[x\]: missing keys \['su_size'\]"):
        systems.system_from_table("x", {k: v for k, v in _A100_TABLE.items() if k != "su_size"})
    with pytest.raises(ValueError, match=r"\[x\]: key 'gpus_per_node' must be an integer >= 1, got 0"):
        systems.system_from_table("x", {**_A100_TABLE, "gpus_per_node": 0})
    with pytest.raises(ValueError, match=r"\[x\]: key 'nic' must be a non-empty string, got 8"):
        systems.system_from_table("x", {**_A100_TABLE, "nic": 8})
    with pytest.raises(ValueError, match=r"sources has unknown keys \['gpu_count'\]"):
        systems.system_from_table("x", {**_A100_TABLE, "sources": {"gpu_count": "[SRC] x"}})


def test_builders_are_re_exported_from_topology():
    from hwmodel import fabric, node, topology

    assert topology.build_system is systems.build_system and topology.build_cluster is fabric.build_cluster
    assert topology.NodeSpec is node.NodeSpec and topology.FABRICS == ("rail_optimized", "fat_tree",
                                                                        "single_switch", "none")
