"""Servers made on demand (``hwmodel.servers``) give the full graph's answers without making the servers.

Each cluster is built twice: on demand (``build_cluster``'s default) and every server up front
(``fabric.ON_DEMAND = False``, the graph of ``add_nodes``). The topology's tables, routes, link attributes
and link order must be the same, and reading them must not make the servers; a whole read of the
graph then gives the full graph, device order, link order and shared link dicts included.
"""

import copy
import pickle

import pytest

from hwmodel import fabric
from hwmodel.cluster import Cluster
from hwmodel.servers import servers_of
from hwmodel.topology import build_system

CASES = [
    ("dgx-h100", 70, {}),  # rail-optimised, 3 SUs (the last partly filled)
    ("dgx-h100", 40, {"fabric": "fat_tree", "oversubscription": 2.0, "nodes_per_leaf": 4}),
    ("dgx-h100", 64, {"leaves_per_pod": 8, "core_oversubscription": 2.0}),  # three tiers
    ("dgx-a100", 3, {"fabric": "single_switch"}),
    ("dgx-h100", 8, {"nics_per_node": 4}),  # two GPUs per NIC
    ("gb200-nvl72", 2, {}),
    ("dgx-a100", 5, {"fabric": "none"}),
]


def _full(system, nodes, keys, monkeypatch):
    with monkeypatch.context() as m:
        m.setattr(fabric, "ON_DEMAND", False)
        return build_system(system, nodes, **keys)


def _made(topo) -> int:
    return topo.graph.on_demand._count


def _made_servers(topo) -> set[int]:
    return {i for i in range(topo.num_nodes) if topo.graph.on_demand.made(i)}


@pytest.mark.parametrize("system,nodes,keys", CASES)
def test_tables_and_routes_equal_the_full_graphs_without_making_a_server(system, nodes, keys, monkeypatch):
    lazy, full = build_system(system, nodes, **keys), _full(system, nodes, keys, monkeypatch)
    assert servers_of(lazy.graph) is not None and servers_of(full.graph) is None
    g = full.graph
    assert lazy.gpus() == full.gpus() and lazy.gpu_nodes() == full.gpu_nodes()
    assert lazy.num_links() == full.num_links() == g.number_of_edges()
    assert (lazy.num_nodes, lazy.gpus_per_node, lazy.nics_per_node) == \
        (full.num_nodes, full.gpus_per_node, full.nics_per_node)
    for kind in ("gpu", "nic", "cpu", "pcie_switch", "nvswitch", "ib_switch"):
        assert lazy.nodes_of_kind(kind) == full.nodes_of_kind(kind)
    offsets, kinds, node_of = lazy.edge_offsets(), lazy.device_kinds(), lazy.device_nodes()
    for u in g:
        assert offsets[u] == full.edge_offsets()[u], u
        assert kinds[u] == g.nodes[u]["kind"] and node_of[u] == g.nodes[u].get("node"), u
        assert list(lazy.link_rows()[u].items()) == list(g.succ[u].items()), u  # (links in order)
        for v, data in g.succ[u].items():
            assert lazy.link_data(u, v) == data, (u, v)
    gpus = lazy.gpus()
    pairs = [(gpus[0], gpus[-1]), (gpus[-1], gpus[1]), (gpus[len(gpus) // 2], gpus[0]), (gpus[3], gpus[2])]
    for a, b in pairs:
        try:
            route = full.route(a, b)
        except ValueError as exc:  # (no fabric: the same refusal)
            with pytest.raises(ValueError, match=str(exc).replace("(", r"\(").replace(")", r"\)")):
                lazy.route(a, b)
            continue
        assert lazy.route(a, b) == route
        assert lazy.path_latency_s(route) == full.path_latency_s(route)
        assert lazy.bottleneck_Bps(route) == full.bottleneck_Bps(route)
    assert lazy.private_ends(nodes - 1) == full.private_ends(nodes - 1)
    cl = Cluster(lazy, record=False)
    assert (gpus[0], gpus[-1]) not in cl.links and ("nowhere", gpus[0]) not in cl.links
    assert (gpus[-1], full.pcie_switch_of(gpus[-1])) in cl.links
    # only server 0, whose segments are searched for its class (no fabric: the refused routes search more)
    assert _made_servers(lazy) <= {0} or keys.get("fabric") == "none"
    assert len(lazy.graph) == len(g) and len(lazy.graph._succ) == len(g._succ)  # (counted, not made)


@pytest.mark.parametrize("system,nodes,keys", CASES)
def test_a_whole_read_gives_the_full_graph(system, nodes, keys, monkeypatch):
    lazy, full = build_system(system, nodes, **keys), _full(system, nodes, keys, monkeypatch)
    gpus = lazy.gpus()
    lazy.route(gpus[-1], gpus[-2])
    assert lazy.graph.nodes[gpus[-1]]["rank"] == len(gpus) - 1  # (the last server made first)
    a, b = lazy.graph, full.graph
    assert list(a.nodes(data=True)) == list(b.nodes(data=True))
    assert _made(lazy) == nodes and servers_of(a) is None
    for n in b:
        assert list(a.succ[n].items()) == list(b.succ[n].items()), n
        assert list(a.pred[n].items()) == list(b.pred[n].items()), n
        for v in a.succ[n]:  # one data dict per link, seen from both ends
            assert a.succ[n][v] is a.pred[v][n]
    assert list(a.edges(data=True)) == list(b.edges(data=True))
    assert lazy == full


def test_counts_and_copies_of_a_graph_on_demand(monkeypatch):
    lazy, full = build_system("dgx-h100", 12, su_size=4), _full("dgx-h100", 12, {"su_size": 4}, monkeypatch)
    assert lazy.graph.number_of_nodes() == full.graph.number_of_nodes()
    assert _made(lazy) == 0 and "n11.cpu1" in lazy.graph and "n12.cpu0" not in lazy.graph
    assert _made(lazy) == 1 and "n01.cpu0" not in lazy.graph and "n3.gpu99" not in lazy.graph
    for other in (pickle.loads(pickle.dumps(build_system("dgx-h100", 12, su_size=4).graph)),
                  copy.deepcopy(build_system("dgx-h100", 12, su_size=4).graph),
                  build_system("dgx-h100", 12, su_size=4).graph.copy()):
        assert list(other.edges(data=True)) == list(full.graph.edges(data=True))
    assert lazy.graph.number_of_edges() == full.graph.number_of_edges()
    topo = build_system("dgx-h100", 12, su_size=4)
    topo.route("n0.gpu0", "n11.gpu7")
    topo.gpu_nics()["n5.gpu1"]
    again = pickle.loads(pickle.dumps(topo))
    assert again == full and servers_of(again.graph) is None
    assert again.route("n0.gpu0", "n11.gpu7") == full.route("n0.gpu0", "n11.gpu7")


def test_a_changed_server_is_its_own_after_clear_route_cache():
    """Changing the graph and calling clear_route_cache (the documented contract) makes every server: the
    tables then follow the graph, not the template."""
    t = build_system("dgx-h100", 3)
    t.graph.edges["n2.gpu0", "n2.pcie0"]["bandwidth_Bps"] = 1.0
    t.clear_route_cache()
    assert servers_of(t.graph) is None and _made(t) == 3
    assert t.link_data("n2.gpu0", "n2.pcie0")["bandwidth_Bps"] == 1.0
    assert t.link_data("n1.gpu0", "n1.pcie0")["bandwidth_Bps"] > 1.0


def test_a_run_loads_the_same_bytes_on_the_same_links(monkeypatch):
    """Transfers between servers made and not made, and their per-link bytes, in link order."""
    out = []
    for on_demand in (True, False):
        with monkeypatch.context() as m:
            m.setattr(fabric, "ON_DEMAND", on_demand)
            cl = Cluster(build_system("dgx-h100", 40, su_size=8), record=False)
        for a, b, size in (("n0.gpu0", "n39.gpu5", 3e6), ("n17.gpu2", "n3.gpu2", 1e6), ("n5.gpu1", "n5.gpu6", 2e6),
                           ("n39.gpu5", "n0.gpu0", 5e5)):
            cl.transfer(a, b, size)
        cl.env.run()
        out.append(([(r.name, r.index, r.carried) for r in cl.link_resources()], cl.now, len(cl.links)))
        if on_demand:
            assert _made_servers(cl.topology) <= {0}
    assert out[0] == out[1]
