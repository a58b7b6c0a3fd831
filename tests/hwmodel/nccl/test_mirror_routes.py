"""Merges lay out only the node-local segments they keep (hwmodel.nccl.mirrors._routes,
Topology.private_ends): the merged weights are those of every mirror's whole route, link for link, in the
same order, float for float."""

import pytest

from hwmodel.cluster import Cluster
from hwmodel.ir import Collective
from hwmodel.nccl import mirrors as mirrors_module
from hwmodel.nccl.engine import NcclEngine
from hwmodel.node import generic_node
from hwmodel.topology import build_cluster, build_system

MiB = 1 << 20


def _whole_routes(topo, pairs, own, ends, subflows=1, owners=None):
    return [topo.route_spread(a, b, subflows) for a, b in pairs]


def _merge(topo, make_plans, *, whole: bool, monkeypatch):
    """[(link, weight)] of the merge of ``make_plans(engine)`` (the first is the representative), in order,
    with the mirrors' routes laid out in full (``whole``) or as far as the merge keeps them."""
    eng = NcclEngine(Cluster(topo, record=False))
    plans = make_plans(eng)
    with monkeypatch.context() as m:
        if whole:
            m.setattr(mirrors_module, "_routes", _whole_routes)
        weights = mirrors_module.merged_weights(eng, plans, eng.edge_weights(plans[0]), set(plans[0].gpus))
    classes = eng.cluster.link_classes
    return [(f"{u}->{v}", x) for r, x in weights.items() for u, v in classes.edges_of(r)]


def _sends(shift_nodes: int, extra=()):
    """A send from each GPU of the first ``shift_nodes`` nodes to the same GPU ``shift_nodes`` nodes on,
    plus ``extra`` (pairs of GPU indices)."""
    def make(eng):
        g = eng.cluster.topology.gpus()
        n = 8 * shift_nodes
        pairs = [(g[i], g[i + n]) for i in range(n)] + [(g[a], g[b]) for a, b in extra]
        return [eng.plan_p2p(a, b, 4 * MiB) for a, b in pairs]
    return make


def _rings(nodes: int, per_node: int = 1, op: str = "all_reduce"):
    """A ring over GPU 0 of every node (``per_node`` GPUs of each), and its mirrors on the node's other
    GPUs (as the DP rings of the TP ranks)."""
    def make(eng):
        g = eng.cluster.topology.gpus()
        gpn = len(g) // nodes
        coll = Collective(op, 64 * MiB, tuple(range(nodes * per_node)))
        return [eng.plan(coll, tuple(g[k * gpn + j + i] for k in range(nodes) for j in range(per_node)))
                for i in range(0, gpn, per_node)]
    return make


CASES = {  # three tiers: pods of one SU's 8 rail leaves (a rail pod holds whole SUs, hwmodel.fabric)
    "rail, sends": (lambda: build_system("dgx-h100", 16, su_size=4), _sends(4, extra=((3, 70), (70, 5)))),
    "rail, rings": (lambda: build_system("dgx-h100", 16, su_size=4), _rings(16)),
    "three tiers, sends": (lambda: build_system("dgx-h100", 64, leaves_per_pod=8, oversubscription=2.0),
                           _sends(32)),
    "three tiers, rings": (lambda: build_system("dgx-h100", 64, leaves_per_pod=8), _rings(64, op="all_gather")),
    "shared NICs, sends": (lambda: build_system("dgx-h100", 8, nics_per_node=4, su_size=2), _sends(2)),
    "shared NICs, rings": (lambda: build_system("dgx-h100", 8, nics_per_node=4, su_size=2), _rings(8)),
    "two GPUs of a node per ring": (lambda: build_system("dgx-a100", 8, su_size=2), _rings(8, per_node=2)),
    "PCIe-only nodes, rings": (lambda: build_cluster(
        generic_node("A100-SXM4-80GB", gpus_per_node=4, nvlink_links=0, nic="ConnectX-6-HDR"), 6,
        fabric="fat_tree", nodes_per_leaf=2), _rings(6, per_node=2)),
    "a GPU ending two sends": (lambda: build_system("dgx-h100", 8, su_size=2), _sends(2, extra=((1, 40), (2, 41)))),
}


@pytest.mark.parametrize("case", list(CASES))
def test_merge_with_segments_left_out_equals_merge_of_whole_routes(case, monkeypatch):
    build, make_plans = CASES[case]
    kept = _merge(build(), make_plans, whole=False, monkeypatch=monkeypatch)
    whole = _merge(build(), make_plans, whole=True, monkeypatch=monkeypatch)
    assert kept == whole  # the same links, in the same order, float for float
    assert any("spine" in name for name, _ in kept)
    if case.startswith("three tiers"):
        assert any("core" in name for name, _ in kept)


def test_private_ends_need_fixed_disjoint_segments_and_the_class_nics():
    assert all(build_system("dgx-h100", 4).private_ends(n) for n in range(4))
    # two GPUs per NIC: their segments share the PCIe switch's link to the NIC
    assert not build_system("dgx-h100", 4, nics_per_node=4).private_ends(1)
    t = build_system("dgx-h100", 4)
    t.graph.nodes["n2.gpu0"]["nic"] = "n2.nic1"  # a node whose GPUs use other NICs than its class's first
    assert t.private_ends(1) and not t.private_ends(2)
    t.route_by_construction = False
    t.clear_route_cache()
    assert not t.private_ends(1)


def test_far_sends_are_laid_out_as_their_fabric_hops_only():
    topo = build_system("dgx-h100", 16, su_size=4)
    eng = NcclEngine(Cluster(topo, record=False))
    plans = _sends(4)(eng)
    own = eng.edge_weights(plans[0])
    routes = mirrors_module._routes(topo, [p.gpus for p in plans[1:]], own, set(plans[0].gpus))
    whole = [topo.route_edges(*p.gpus) for p in plans[1:]]
    far = [r for r, w in zip(routes, whole, strict=True) if r != w]
    # every mirror's node-local segments (GPU -> PCIe switch -> NIC and back: 2 + 2 links) left out, even
    # in the representative's nodes (its GPUs' segments are not theirs)
    assert len(far) == 31
    assert all(r == w[2:-2] and len(r) in (2, 4) for r, w in zip(routes, whole, strict=True))


def test_nodes_with_other_routes_or_own_links_off_its_segments_route_in_full():
    topo = build_system("dgx-h100", 4)
    g = topo.gpus()
    own = dict.fromkeys(topo.route(g[0], g[8]), 1.0)
    # a route inside node 2 and one from node 3's NIC: those nodes' segments are laid out in full
    busy, own_nodes = mirrors_module._nodes_in_full(topo, [(g[1], g[9]), (g[16], g[17]), ("n3.nic0", g[26])],
                                                    own, {g[0], g[8]})
    assert busy == {2, 3} and own_nodes == set()  # (own: its GPUs' segments and the fabric only)
    own[("n1.gpu3", "n1.nvswitch")] = 1.0  # a link of node 1 off its GPUs' segments
    assert mirrors_module._nodes_in_full(topo, [(g[1], g[9])], own, {g[0], g[8]}) == (set(), {1})


def _groups(groups):
    return [(work, lat, bound, [(r.name, w) for r, w in weights.items()], [r.name for r in side], first)
            for work, lat, bound, weights, side, first in groups]


@pytest.mark.parametrize(("build", "make_plans", "merged"), [
    (lambda: build_system("dgx-h100", 16, su_size=4), _sends(4, extra=((3, 70), (70, 5))), True),
    (lambda: build_system("dgx-h100", 64, leaves_per_pod=8, oversubscription=2.0), _sends(32), True),
    (lambda: build_system("dgx-h100", 8, nics_per_node=4, su_size=2), _sends(2), True),
    # a mirror inside a node: another latency, another group -- left to the plans' merge
    (lambda: build_system("dgx-h100", 8, su_size=2), _sends(2, extra=((1, 3),)), False),
])
def test_mirrored_sends_merged_from_pairs_equal_the_merge_of_their_plans(build, make_plans, merged):
    eng = NcclEngine(Cluster(build(), record=False))
    plans = make_plans(eng)
    from_pairs = mirrors_module.merged_sends(eng, plans[0], [p.gpus for p in plans[1:]])
    ref = NcclEngine(Cluster(build(), record=False))
    from_plans = ref._merged_groups(make_plans(ref))
    if not merged:
        assert from_pairs is None and len(from_plans) == 2
        return
    assert from_pairs is not None
    assert _groups(from_pairs) == _groups(from_plans)  # the same links, in the same order, float for float
