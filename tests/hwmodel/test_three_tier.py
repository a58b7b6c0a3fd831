"""Three-tier Clos fabrics (leaf / spine / core): structure, capacities, routes, presets, errors."""

import random

import pytest

from hwmodel.fabric import _spines_for
from hwmodel.routing import ClosRoutes
from hwmodel.specs import get_nic, get_switch
from hwmodel.topology import Topology, build_system

NDR_Bps = get_nic("ConnectX-7-NDR").bandwidth_Bps

CASES = {
    "rail-pods": lambda: build_system("dgx-h100", 12, su_size=2, leaves_per_pod=16),
    "rail-pods-partial": lambda: build_system("dgx-h100", 11, su_size=2, leaves_per_pod=16,
                                              core_oversubscription=3.0),
    "rail-pods-11-spines": lambda: build_system("dgx-a100", 24, su_size=11, leaves_per_pod=16, num_spines=11),
    "fat-tree-pods": lambda: build_system("dgx-a100", 9, fabric="fat_tree", nodes_per_leaf=1, leaves_per_pod=2),
    "fat-tree-pods-oversub": lambda: build_system("dgx-h100", 13, fabric="fat_tree", nodes_per_leaf=1,
                                                  leaves_per_pod=3, oversubscription=2.0,
                                                  core_oversubscription=7.0),
    "meta-preset": lambda: build_system("meta-llama3-roce-24k", 6, leaves_per_pod=1),
}


def _switches(t: Topology, tier: str) -> list[str]:
    return sorted(n for n, d in t.graph.nodes(data=True) if d["kind"] == "ib_switch" and d.get("tier") == tier)


def _searched(t: Topology) -> Topology:
    ref = Topology(t.graph, t.gpu_spec, t.nic_spec)
    ref.route_by_construction = False
    return ref


def _outcome(t: Topology, a: str, b: str):
    try:
        return t.route(a, b)
    except ValueError as exc:  # e.g. a GPU to another PCIe switch's NIC: GPUs and NICs do not forward
        return str(exc)


@pytest.mark.parametrize("case", sorted(CASES))
def test_constructed_routes_equal_searched_on_three_tiers(case):
    t = CASES[case]()
    assert _switches(t, "core"), "the case must have a core layer"
    ref = _searched(t)
    ends = t.gpus() + t.nodes_of_kind("nic")
    rng = random.Random(3)
    pairs = [(rng.choice(ends), rng.choice(ends)) for _ in range(300)]
    pairs += [(g, h) for g in t.gpus()[:8] for h in t.gpus()[-8:]]
    for a, b in pairs:
        assert _outcome(t, a, b) == _outcome(ref, a, b), (case, a, b)
    assert isinstance(t._clos, ClosRoutes) and t._clos.cores is not None  # constructed, not searched


def test_route_between_pods_climbs_to_a_core_of_the_spines_plane():
    t = build_system("dgx-h100", 12, su_size=2, leaves_per_pod=16)  # 2 SUs per pod, 3 pods
    r = t.route("n0.gpu2", "n11.gpu2")
    fabric = r[2:-2]
    hops = [u for u, _ in fabric] + [fabric[-1][1]]
    assert len(hops) == 7 and hops[:2] == ["n0.nic2", "su0.leaf2"] and hops[-2:] == ["su5.leaf2", "n11.nic2"]
    spine, core, down = hops[2:5]
    assert spine.startswith("pod0.spine") and down.startswith("pod2.spine")
    plane = int(spine.removeprefix("pod0.spine"))
    assert core.startswith(f"core{plane}.") and down == f"pod2.spine{plane}"
    # inside a pod the route stays below the core: nic -> leaf -> spine -> leaf -> nic
    inside = t.route("n0.nic2", "n3.nic2")
    assert len(inside) == 4 and inside[1][1].startswith("pod0.spine")


def test_pod_and_core_capacities_follow_the_oversubscriptions():
    """Closed forms: a leaf's uplinks carry its downlinks / k; a spine's core uplinks its downlinks / k'."""
    k, k2 = 2.0, 7.0
    t = build_system("dgx-h100", 13, fabric="fat_tree", nodes_per_leaf=1, leaves_per_pod=3,
                     oversubscription=k, core_oversubscription=k2)
    g = t.graph
    leaves, spines, cores = _switches(t, "leaf"), _switches(t, "spine"), _switches(t, "core")
    assert len(leaves) == 13
    pods = sorted({g.nodes[s]["pod"] for s in spines})
    assert pods == list(range(5))  # ceil(13 / 3)
    down_Bps = 8 * NDR_Bps  # a leaf's 8 NIC links
    for leaf in leaves:
        up = sum(g.edges[leaf, s]["bandwidth_Bps"] for s in g.succ[leaf] if s in spines)
        assert up == pytest.approx(down_Bps / k)
    per_pod = len([s for s in spines if g.nodes[s]["pod"] == 0])
    for s in spines:
        below = sum(g.edges[leaf, s]["bandwidth_Bps"] for leaf in g.pred[s] if leaf in leaves)
        up = sum(g.edges[s, c]["bandwidth_Bps"] for c in g.succ[s] if c in cores)
        full = 3 * down_Bps / k / per_pod  # a full pod's cabling, also in the partly filled last pod
        assert up == pytest.approx(full / k2)
        if g.nodes[s]["pod"] < 4:
            assert below == pytest.approx(full)
    for c in cores:  # one spine of every pod, all of one plane
        below = [s for s in g.pred[c] if s in spines]
        assert sorted(g.nodes[s]["pod"] for s in below) == pods
        assert len({g.nodes[s]["index"] for s in below}) == 1


def test_few_leaves_stay_two_tier():
    """No more leaves than one pod: the fabric is the two-tier tree, node for node and link for link."""
    t = build_system("dgx-h100", 4, leaves_per_pod=32)
    u = build_system("dgx-h100", 4)
    assert sorted(t.graph.edges(data=True)) == sorted(u.graph.edges(data=True))


def test_meta_preset_is_the_llama3_cluster():
    """arXiv:2407.21783 sec. 3.3.1: 2 servers (16 GPUs) per ToR, 192 racks (3,072 GPUs) per pod at 1:1,
    pods joined at 1:7. Built at 2 pods (768 servers) to keep the test small."""
    t = build_system("meta-llama3-roce-24k", 768)
    g = t.graph
    leaves, spines, cores = _switches(t, "leaf"), _switches(t, "spine"), _switches(t, "core")
    assert len(leaves) == 384 and {g.nodes[s]["pod"] for s in spines} == {0, 1}
    assert sum(1 for n in g.succ["leaf0"] if g.nodes[n]["kind"] == "nic") == 16
    def pod_of(gpu: str) -> int:
        nic = g.nodes[gpu]["nic"]
        return next(g.nodes[v]["pod"] for v in g.succ[nic] if v in g.nodes and g.nodes[v]["kind"] == "ib_switch")

    assert sum(1 for gpu in t.gpus() if pod_of(gpu) == 0) == 3072
    s0 = "pod0.spine0"
    below = sum(g.edges[leaf, s0]["bandwidth_Bps"] for leaf in g.pred[s0] if leaf in leaves)
    up = sum(g.edges[s0, c]["bandwidth_Bps"] for c in g.succ[s0] if c in cores)
    assert up == pytest.approx(below / 7)
    leaf_up = sum(g.edges["leaf0", s]["bandwidth_Bps"] for s in g.succ["leaf0"] if s in spines)
    assert leaf_up == pytest.approx(16 * NDR_Bps)  # no oversubscription inside a pod
    # across pods, a route climbs to the aggregation layer; inside a pod it does not
    assert any(v in cores for _, v in t.route("n0.gpu0", "n700.gpu0"))
    assert not any(v in cores for _, v in t.route("n0.gpu0", "n383.gpu0"))


def test_superpod_preset_adds_a_core_above_four_sus():
    radix = get_switch("QM9700").radix
    two = build_system("dgx-superpod-h100", 128)
    assert not _switches(two, "core") and len(_switches(two, "spine")) == 16  # H100 RA: 4 SU, 32 leaf, 16 spine
    three = build_system("dgx-superpod-h100", 160)  # 5 SUs: two pods
    spines, cores = _switches(three, "spine"), _switches(three, "core")
    assert len(spines) == 2 * 16
    assert len(cores) == 16 * _spines_for(2, 32 * 32 / 16, radix)


@pytest.mark.parametrize("kwargs, message", [
    ({"leaves_per_pod": 0}, "leaves_per_pod must be an integer >= 1"),
    ({"leaves_per_pod": 2, "core_oversubscription": 0.5}, "core_oversubscription must be a number >= 1"),
    ({"core_oversubscription": 2.0}, "core_oversubscription needs leaves_per_pod"),
    ({"fabric": "single_switch", "leaves_per_pod": 2}, "apply to tree fabrics"),
])
def test_bad_pod_arguments_name_the_key(kwargs, message):
    with pytest.raises(ValueError, match=message):
        build_system("dgx-h100", 3, **kwargs)


def test_scenario_keys_reach_the_fabric(tmp_path):
    from scenarios.runner import build_topology

    t = build_topology({"name": "dgx-h100", "nodes": 6, "fabric": "fat_tree", "nodes_per_leaf": 1,
                        "leaves_per_pod": 2, "core_oversubscription": 4})
    assert len(_switches(t, "core")) >= 1 and t.graph.graph["core_oversubscription"] == 4.0


def test_node_cap_counts_the_nodes_gpus():
    """131,072 GPUs at most: 16,384 DGX nodes, but 1,820 GB200 NVL72 racks (the cap once assumed 8 per node)."""
    from scenarios.runner import check_nodes

    assert check_nodes({"name": "gb200-nvl72", "nodes": 1820}) == 1820
    with pytest.raises(ValueError, match=r"nodes must be in 1\.\.1820, got 1821 \(1,820 nodes x 72 GPUs"):
        check_nodes({"name": "gb200-nvl72", "nodes": 1821})
    with pytest.raises(ValueError, match=r"nodes must be in 1\.\.16384, got 16385 \(16,384 nodes x 8 GPUs"):
        check_nodes({"name": "dgx-h100", "nodes": 16385})


def test_megascale_preset_is_the_papers_fabric():
    """MegaScale (arXiv:2402.15627 sec. 5): 64 servers under one set of 8 rail ToRs, each ToR's 64 x 200G
    downlinks carried by 32 x 400G uplinks (1:1), pods of 32 ToRs under a third tier, 1:1 there too."""
    hdr_Bps = get_nic("ConnectX-6-HDR").bandwidth_Bps
    t = build_system("megascale-ampere", 1536)  # 12,288 GPUs, MegaScale Table 2's largest run
    g = t.graph
    leaves, spines, cores = _switches(t, "leaf"), _switches(t, "spine"), _switches(t, "core")
    assert len(leaves) == 1536 // 64 * 8 and {g.nodes[s]["pod"] for s in spines} == set(range(6))
    assert sum(1 for n in g.succ["su0.leaf0"] if g.nodes[n]["kind"] == "nic") == 64
    leaf_up = sum(g.edges["su0.leaf0", s]["bandwidth_Bps"] for s in g.succ["su0.leaf0"] if s in spines)
    assert leaf_up == pytest.approx(64 * hdr_Bps) == pytest.approx(32 * 400e9 / 8)
    s0 = "pod0.spine0"
    below = sum(g.edges[leaf, s0]["bandwidth_Bps"] for leaf in g.pred[s0] if leaf in leaves)
    assert sum(g.edges[s0, c]["bandwidth_Bps"] for c in g.succ[s0] if c in cores) == pytest.approx(below)
    # one rail: under its ToR within 64 servers, over a spine within a pod of 256, over a core beyond
    hops = {b: [v for _, v in t.route("n0.gpu0", f"n{b}.gpu0")] for b in (63, 64, 300)}
    assert not any(v in spines for v in hops[63])
    assert any(v in spines for v in hops[64]) and not any(v in cores for v in hops[64])
    assert any(v in cores for v in hops[300])
    # 256 GPUs (MegaScale Table 2's smallest run) are one set of ToRs: same-rail traffic never climbs
    small = build_system("megascale-ampere", 32)
    assert not any(v in _switches(small, "spine") for _, v in small.route("n0.gpu3", "n31.gpu3"))


@pytest.mark.parametrize("subflows", [2, 4, 7])
def test_many_pairs_spread_as_each_pair_alone_on_three_tiers(subflows):
    """ClosRoutes.routes_between's three-tier loop (and spread_between, which is that loop for one pair)
    gives exactly each sub-flow's route combined (the same hashes, the same Spread), pairs under one leaf,
    in one pod and across pods alike."""
    import random

    from hwmodel.ecmp import combine, subflow_hkey

    topo = build_system("dgx-h100", 64, leaves_per_pod=8, fabric="fat_tree", nodes_per_leaf=2)
    clos = topo.constructed_fabric()
    assert clos.cores is not None
    nics = sorted(clos.leaf_of)
    rng = random.Random(7)
    a = [rng.choice(nics) for _ in range(600)]
    b = [rng.choice(nics) for _ in range(600)]
    srcs, dsts = [x.replace("nic", "gpu") for x in a], [x.replace("nic", "gpu") for x in b]
    fast = clos.routes_between(a, b, srcs, dsts, subflows)

    def reference(x, y, s, d):  # (each sub-flow's route, as the search hashes it, combined)
        if x == y:
            return None
        return combine([clos.route(x, y, subflow_hkey(s, d, j)) for j in range(subflows)])

    assert fast == [reference(*q) for q in zip(a, b, srcs, dsts, strict=True)]
    assert fast == [clos.spread_between(*q, subflows) for q in zip(a, b, srcs, dsts, strict=True)]
    assert sum(1 for r in fast if r is not None and len(r) > 2) > 500  # (most cross the spines)
