"""The fabric router a builder makes (``hwmodel.fabric``: leaf of each NIC, spines, pods and cores as it
lays them out) is the one ``ClosRoutes.detect`` reads off the finished graph, on every fabric kind and
named system: so a built cluster is routed as a topology file of the same shape."""

import pytest

from hwmodel.routing import ClosRoutes
from hwmodel.systems import build_system, known_systems


def _detected(topo) -> ClosRoutes | None:
    kinds, _, pred_cost = topo._tables()
    return ClosRoutes.detect(kinds, topo._succ_cost(), pred_cost)


def _canonical(r: ClosRoutes) -> tuple:
    """The router's answers, not its pod numbering (detect numbers pods in leaf-name order, the builder
    in build order): each leaf's pod as the set of its pod's leaves, and the spine below each core per
    leaf."""
    pods: dict[int, set[str]] = {}
    for leaf, p in r.pod_of.items():
        pods.setdefault(p, set()).add(leaf)
    pod_of = {leaf: frozenset(pods[p]) for leaf, p in r.pod_of.items()}
    below = {(c, leaf): r.spine_to_pod[(c, p)] for (c, p0) in r.spine_to_pod for leaf, p in r.pod_of.items()
             if p == p0}
    return r.leaf_of, r.spines, r.cores, pod_of, below


CASES = [
    ("dgx-h100", 64, {}),  # rail-optimised, two SUs
    ("dgx-h100", 1, {}),  # one server: eight leaves, spines above
    ("dgx-a100", 45, {"oversubscription": 2.0}),  # a partly filled SU
    ("dgx-h100", 8, {"fabric": "fat_tree", "nodes_per_leaf": 2}),
    ("dgx-h100", 1, {"fabric": "fat_tree"}),  # one leaf, no spine
    ("dgx-h100", 3, {"fabric": "fat_tree", "num_spines": 1}),
    ("dgx-h100", 6, {"fabric": "single_switch"}),
    ("dgx-h100", 96, {"leaves_per_pod": 8}),  # three tiers, rail-optimised
    ("dgx-h100", 20, {"fabric": "fat_tree", "nodes_per_leaf": 2, "leaves_per_pod": 3,
                      "core_oversubscription": 2.0}),  # three tiers, a partly filled last pod
] + [(name, 9, {}) for name in known_systems()]


@pytest.mark.parametrize(("system", "nodes", "kw"), CASES)
def test_builder_router_is_the_detected_one(system, nodes, kw):
    topo = build_system(system, nodes, **kw)
    built = topo._clos
    found = _detected(topo)
    if found is None:
        assert built is False  # (no fabric: nothing handed over, detect finds nothing either)
        assert topo.constructed_fabric() is None
        return
    assert isinstance(built, ClosRoutes)
    assert _canonical(built) == _canonical(found)
    # and the routes: every NIC pair's fabric hops, hashed as a route between two of their GPUs
    nics = sorted(found.leaf_of)
    nics = nics[::max(1, len(nics) // 30)]  # (across SUs and pods)
    for a in nics:
        for b in nics:
            assert built.route_between(a, b, "x" + a, "y" + b) == found.route_between(a, b, "x" + a, "y" + b)


def test_a_changed_graph_forgets_the_builders_router():
    topo = build_system("dgx-h100", 4)
    assert isinstance(topo._clos, ClosRoutes)
    topo.graph.remove_edge("su0.leaf0", "spine0")
    topo.clear_route_cache()
    assert topo.constructed_fabric() is None  # detect: no longer a Clos (a leaf misses a spine)


@pytest.mark.parametrize("spines", [0, 9, 1000])
def test_spine_count_outside_a_leafs_uplink_ports_is_refused(spines):
    """A leaf of one DGX H100 (8 NICs down, 1:1) has 8 uplink ports, one per spine at least: 1..8 spines."""
    with pytest.raises(ValueError, match=r"^spines = -?\d+: a leaf has 8 uplink port\(s\) .*; allowed 1\.\.8$"):
        build_system("dgx-h100", 4, fabric="fat_tree", nodes_per_leaf=1, num_spines=spines)


@pytest.mark.parametrize("spines", [1, 8])
def test_spine_count_inside_a_leafs_uplink_ports_builds(spines):
    topo = build_system("dgx-h100", 4, fabric="fat_tree", nodes_per_leaf=1, num_spines=spines)
    assert len([n for n, d in topo.graph.nodes(data=True) if d.get("tier") == "spine"]) == spines
