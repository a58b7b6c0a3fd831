"""Clusters built without networkx's per-call overhead give networkx's graph: servers as renamed copies of
one (``hwmodel.node.add_nodes``) and links written into its dicts (``hwmodel.node.add_link``).

The order of devices, of each device's successors and predecessors and of the edges is part of the
result (a link's solver tie-break index is its position in edge order), so it is compared too.
"""

import networkx as nx
import pytest

from hwmodel import fabric, node
from hwmodel.node import add_node, add_nodes, generic_node
from hwmodel.systems import build_system, get_system, known_systems, node_shape


def _networkx_link(g, u, v, bandwidth_Bps, kind, lat_uv, lat_vu=None):
    """The reference: a full-duplex link through networkx's own ``add_edge``."""
    g.add_edge(u, v, bandwidth_Bps=float(bandwidth_Bps), latency_s=float(lat_uv), kind=kind)
    g.add_edge(v, u, bandwidth_Bps=float(bandwidth_Bps), latency_s=float(lat_uv if lat_vu is None else lat_vu),
               kind=kind)


def _one_by_one(g, spec, num_nodes):
    return [add_node(g, spec, i, i * spec.gpus_per_node) for i in range(num_nodes)]


def _node_spec(system: str, gpus_per_node: int | None = None):
    s = get_system(system)
    shape = node_shape(s, gpus_per_node, num_nodes=3)
    return generic_node(s.gpu, gpus_per_node=shape.gpus_per_node, nvswitch=s.nvswitch,
                        nvlink_links=None if shape.gpus_per_node > 1 else 0,
                        nvswitch_count=shape.nvswitch_count, nics_per_node=shape.nics_per_node, nic=s.nic,
                        pcie_switches=shape.pcie_switches, pcie_generation=s.pcie_generation, cpus=shape.cpus)


def _assert_same(a: nx.DiGraph, b: nx.DiGraph) -> None:
    assert list(a.nodes(data=True)) == list(b.nodes(data=True))
    for n in a:
        assert list(a.succ[n].items()) == list(b.succ[n].items()), n
        assert list(a.pred[n].items()) == list(b.pred[n].items()), n
        for v in b.succ[n]:  # one data dict per link, seen from both ends (as add_edge makes it)
            assert b.succ[n][v] is b.pred[v][n]
    assert list(a.edges(data=True)) == list(b.edges(data=True))


@pytest.mark.parametrize("system", known_systems())
@pytest.mark.parametrize("gpus_per_node", [None, 1, 2])
def test_copies_equal_one_server_at_a_time(system, gpus_per_node, monkeypatch):
    spec = _node_spec(system, gpus_per_node)
    one_by_one, copied = nx.DiGraph(), nx.DiGraph()
    with monkeypatch.context() as m:
        m.setattr(node, "add_link", _networkx_link)
        nics = _one_by_one(one_by_one, spec, 5)
    assert add_nodes(copied, spec, 5) == nics
    _assert_same(one_by_one, copied)
    assert copied.nodes["n4.gpu0"]["rank"] == 4 * spec.gpus_per_node
    if spec.nics_per_node:
        assert copied.nodes[f"n3.gpu{spec.gpus_per_node - 1}"]["nic"].startswith("n3.nic")
    # the copies are independent: changing one server's link leaves the others'
    copied.edges["n1.gpu0", "n1.pcie0"]["bandwidth_Bps"] = 1.0
    link = ("n2.gpu0", "n2.pcie0")
    assert copied.edges[link]["bandwidth_Bps"] == one_by_one.edges[link]["bandwidth_Bps"]


@pytest.mark.parametrize("system,nodes,keys", [
    ("dgx-h100", 70, {}),  # rail-optimised, 3 SUs (the last partly filled)
    ("dgx-h100", 40, {"fabric": "fat_tree", "oversubscription": 2.0, "nodes_per_leaf": 4}),
    ("dgx-h100", 64, {"leaves_per_pod": 8, "core_oversubscription": 2.0}),  # three tiers
    ("dgx-a100", 3, {"fabric": "single_switch"}),
    *((name, 4, {}) for name in known_systems()),
])
def test_clusters_equal_networkx_built(system, nodes, keys, monkeypatch):
    fast = build_system(system, nodes, **keys)
    with monkeypatch.context() as m:
        m.setattr(node, "add_link", _networkx_link)
        m.setattr(fabric, "add_link", _networkx_link)
        m.setattr(fabric, "add_nodes", _one_by_one)
        m.setattr(fabric, "ON_DEMAND", False)
        reference = build_system(system, nodes, **keys)
    assert fast.graph.graph == reference.graph.graph
    _assert_same(reference.graph, fast.graph)
    assert fast == reference
    assert fast.route("n0.gpu0", f"n{nodes - 1}.gpu3") == reference.route("n0.gpu0", f"n{nodes - 1}.gpu3")


@pytest.mark.parametrize("system,nodes,keys", [
    ("dgx-h100", 70, {}),
    ("dgx-h100", 40, {"fabric": "fat_tree", "oversubscription": 2.0, "nodes_per_leaf": 4}),
    ("dgx-h100", 8, {"nics_per_node": 4}),  # two GPUs per NIC: not private ends
    *((name, 3, {}) for name in known_systems()),
])
def test_copied_servers_are_in_server_0s_node_class(system, nodes, keys):
    """A cluster built of copies (``Topology(..., node_copies=n)``) puts every server in server 0's node
    class without building its signature; a topology of the same graph that builds every signature finds
    the same classes, private ends and node-local segments."""
    from hwmodel.topology import Topology

    fast = build_system(system, nodes, **keys)
    ref = Topology(fast.graph, fast.gpu_spec, fast.nic_spec)
    assert fast._node_copies == nodes and ref._node_copies == 0
    for n in range(nodes):
        assert fast.private_ends(n) == ref.private_ends(n)
    assert {fast._classes().class_of(n)[0] for n in range(nodes)} == {0}
    assert len(fast._classes()._classes) == 1  # (server 0's signature only)
    assert len(ref._classes()._classes) == 1 and len(ref._classes()._class_of) == nodes
    gpus = fast.gpus()
    for a, b in ((gpus[0], gpus[-1]), (gpus[-1], gpus[1]), (gpus[len(gpus) // 2], gpus[0])):
        assert fast.route(a, b) == ref.route(a, b)
    fast.clear_route_cache()  # (the graph may have changed: every signature is built again)
    assert fast._node_copies == 0


def test_a_changed_copy_after_clear_route_cache_is_a_class_of_its_own():
    t = build_system("dgx-h100", 3)
    g = t.graph
    data = g.edges["n2.gpu0", "n2.pcie0"]
    g.remove_edge("n2.gpu0", "n2.pcie0")
    g.add_edge("n2.gpu0", "n2.pcie0", **data)  # (same link, last in n2.gpu0's order: another signature)
    t.clear_route_cache()
    classes = t._classes()
    assert classes.class_of(1)[0] == classes.class_of(0)[0] != classes.class_of(2)[0]


def test_add_link_rejects_the_links_a_topology_rejects():
    """``build_cluster`` tells its Topology that every link was checked here (``links_checked``): so a
    bandwidth not > 0 (NaN included) or a negative latency fails at once, naming the directed link."""
    g = nx.DiGraph()
    g.add_nodes_from(["a", "b"], kind="cpu")
    for bw in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match=r"edge 'a'->'b': bandwidth_Bps must be > 0 and latency_s >= 0"):
            node.add_link(g, "a", "b", bw, "pcie", 1e-6)
    with pytest.raises(ValueError, match=r"edge 'b'->'a': bandwidth_Bps must be > 0"):
        node.add_link(g, "a", "b", 1e9, "pcie", 1e-6, -1e-6)
    assert g.number_of_edges() == 0
    node.add_link(g, "a", "b", 1e9, "pcie", 0.0)
    assert g.edges["b", "a"] == {"bandwidth_Bps": 1e9, "latency_s": 0.0, "kind": "pcie"}
