"""Routes by construction (hwmodel.routing) equal the graph search's, link for link, on every fabric."""

import random

import networkx as nx
import pytest

from hwmodel.routing import ClosRoutes
from hwmodel.topology import Topology, build_cluster, build_system, generic_node

CASES = {
    "rail-1su": lambda: build_system("dgx-a100", 4),
    "rail-3su-oversub": lambda: build_system("dgx-h100", 9, su_size=4, oversubscription=2.0),
    "rail-5-spines": lambda: build_system("dgx-h100", 12, su_size=5, num_spines=5),
    "rail-11-spines": lambda: build_system("dgx-a100", 13, su_size=11, num_spines=11),  # spine10 sorts early
    "fat-tree": lambda: build_system("dgx-a100", 7, fabric="fat_tree", nodes_per_leaf=2),
    "fat-tree-oversub": lambda: build_system("dgx-h100", 5, fabric="fat_tree", nodes_per_leaf=1,
                                             oversubscription=3.0),
    "single-switch": lambda: build_system("dgx-b200", 3, fabric="single_switch"),
    "no-fabric": lambda: build_system("dgx-h100", 1, fabric="none"),
    "pcie-only": lambda: build_cluster(
        generic_node("A100-SXM4-80GB", gpus_per_node=4, nvlink_links=0, nic="ConnectX-6-HDR"), 3,
        fabric="fat_tree", nodes_per_leaf=1),
}


def _endpoints(t: Topology) -> list[str]:
    return t.gpus() + t.nodes_of_kind("nic")


def _searched(t: Topology) -> Topology:
    ref = Topology(t.graph, t.gpu_spec, t.nic_spec)
    ref.route_by_construction = False
    return ref


@pytest.mark.parametrize("case", sorted(CASES))
def test_constructed_routes_equal_searched(case):
    t = CASES[case]()
    ref = _searched(t)
    ends = _endpoints(t)
    rng = random.Random(14)
    pairs = [(rng.choice(ends), rng.choice(ends)) for _ in range(400)]
    pairs += [(g, h) for g in t.gpus()[:8] for h in t.gpus()[-8:]]  # first node to last node
    for a, b in pairs:
        assert _outcome(t, a, b) == _outcome(ref, a, b), (case, a, b)


def _outcome(t: Topology, a: str, b: str):
    try:
        return t.route(a, b)
    except ValueError as exc:  # e.g. NIC -> GPU of one node where GPUs and NICs do not forward
        return str(exc)


def test_clos_detected_on_built_fabrics_and_routes_in_four_hops():
    t = build_system("dgx-h100", 9, su_size=4)
    t.route("n0.gpu0", "n8.gpu3")
    assert isinstance(t._clos, ClosRoutes)
    assert len(t._clos.spines) >= 1 and len(t._clos.leaf_of) == 9 * 8
    fabric = [e for e in t.route("n0.gpu0", "n8.gpu3") if "leaf" in e[0] or "leaf" in e[1] or "spine" in e[0]]
    assert len(fabric) == 4  # nic -> leaf -> spine -> leaf -> nic
    assert fabric[0] == ("n0.nic0", "su0.leaf0") and fabric[-1] == ("su2.leaf3", "n8.nic3")
    assert fabric[1][1] in t._clos.spines and fabric[2] == (fabric[1][1], "su2.leaf3")


def test_unstructured_fabric_falls_back_to_search():
    """A leaf-to-leaf cable breaks the two-level shape: the search routes it (one hop between leaves)."""
    t = build_system("dgx-a100", 4, fabric="fat_tree", nodes_per_leaf=2)
    g = t.graph.copy()
    g.add_edge("leaf0", "leaf1", bandwidth_Bps=50e9, latency_s=1e-7, kind="ib")
    g.add_edge("leaf1", "leaf0", bandwidth_Bps=50e9, latency_s=1e-7, kind="ib")
    u = Topology(g, t.gpu_spec, t.nic_spec)
    route = u.route("n0.nic0", "n3.nic0")
    assert u._clos is None
    assert route == [("n0.nic0", "leaf0"), ("leaf0", "leaf1"), ("leaf1", "n3.nic0")]
    assert route == _searched(u).route("n0.nic0", "n3.nic0")


def test_unlike_nodes_do_not_share_segments():
    """A node with an extra PCIe hop routes its own way; the others still share their class's segments."""
    t = build_system("dgx-a100", 3)
    g: nx.DiGraph = t.graph.copy()
    g.remove_edge("n2.gpu0", "n2.pcie0")
    g.add_node("n2.retimer", kind="pcie_switch", node=2, index=9)
    g.add_edge("n2.gpu0", "n2.retimer", bandwidth_Bps=32e9, latency_s=0.0, kind="pcie")
    g.add_edge("n2.retimer", "n2.pcie0", bandwidth_Bps=32e9, latency_s=0.0, kind="pcie")
    u = Topology(g, t.gpu_spec, t.nic_spec)
    r = u.route("n2.gpu0", "n0.gpu0")
    assert r[:3] == [("n2.gpu0", "n2.retimer"), ("n2.retimer", "n2.pcie0"), ("n2.pcie0", "n2.nic0")]
    assert r == _searched(u).route("n2.gpu0", "n0.gpu0")
    assert u.route("n1.gpu0", "n0.gpu0")[0] == ("n1.gpu0", "n1.pcie0")


@pytest.mark.parametrize("case", ["rail-3su-oversub", "fat-tree", "pcie-only"])
def test_uncached_routes_reuse_node_segments_and_equal_searched(case):
    # route_edges does not cache whole routes; the node-local segments it keeps by (source,
    # destination) must give the searched route again when a GPU ends many routes (as mirrors do)
    t = CASES[case]()
    ref = _searched(t)
    gpus = t.gpus()
    pairs = [(g, h) for g in gpus[:16] for h in gpus[-16:]] + [(h, g) for g in gpus[:16] for h in gpus[-16:]]
    for _ in range(2):
        for a, b in pairs:
            assert _uncached_outcome(t, a, b) == _outcome(ref, a, b), (case, a, b)
    assert not t._routes  # (the routes themselves were not cached)


def _uncached_outcome(t: Topology, a: str, b: str):
    try:
        return list(t.route_edges(a, b))
    except ValueError as exc:
        return str(exc)
