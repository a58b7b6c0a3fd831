"""Adaptive routing (``[simulation] nccl_ib_adaptive_routing``, :data:`hwmodel.ecmp.ADAPTIVE`): every NIC
pair's traffic split evenly over every equal-cost path, so no hash collides.

Closed form: on a 1:1 fat tree of 4 DGX H100 (one leaf per node) a leaf's uplink capacity is the same
whatever the spine count (each of n leaf-spine links has 1/n of it), so the 1 GiB all-reduce takes the
1-spine time exactly with n spines under adaptive routing; static ECMP is slower by its collision
overload (tests/hwmodel/test_ecmp.py)."""

import pytest

from hwmodel import ecmp
from hwmodel.cluster import Cluster
from hwmodel.ir import Collective
from hwmodel.nccl import mirrors as mirrors_module
from hwmodel.nccl.engine import NcclEngine
from hwmodel.topology import build_system
from scenarios.cmd_run import load
from scenarios.runner import run_scenario

GiB = 1 << 30


def _tree(spines: int):
    return build_system("dgx-h100", 4, fabric="fat_tree", nodes_per_leaf=1, num_spines=spines)


def _all_reduce_s(topo, adaptive: bool) -> float:
    cluster = Cluster(topo, record=False)
    eng = NcclEngine(cluster, ib_adaptive_routing=adaptive)
    gpus = tuple(topo.gpus())
    done = eng.start(eng.plan(Collective("all_reduce", GiB, tuple(range(len(gpus)))), gpus))
    cluster.env.run(until=done)
    return cluster.env.now


@pytest.mark.parametrize("spines", [2, 4, 8])
def test_adaptive_all_reduce_takes_the_one_spine_time(spines):
    one = _all_reduce_s(_tree(1), adaptive=False)
    assert _all_reduce_s(_tree(spines), adaptive=True) == pytest.approx(one, rel=1e-9)
    assert _all_reduce_s(_tree(spines), adaptive=False) >= one * (1 - 1e-9)  # (hash collisions only slow it)


def test_spread_shares_every_path_evenly_on_two_and_three_tiers():
    two = _tree(4)
    clos = two.constructed_fabric()
    route = clos.adaptive_between("n0.nic0", "n1.nic0")
    assert route[0] == ("n0.nic0", "leaf0") and route[-1] == ("leaf1", "n1.nic0")
    (spread,) = route[1:-1]
    assert sorted(spread) == sorted([(("leaf0", f"spine{s}"), 0.25) for s in range(4)]
                                    + [((f"spine{s}", "leaf1"), 0.25) for s in range(4)])
    assert clos.adaptive_between("n0.nic0", "n0.nic0") is None
    three = build_system("dgx-h100", 64, leaves_per_pod=8)
    clos3 = three.constructed_fabric()
    a, b = "n0.nic0", "n63.nic0"
    assert clos3.pod_of[clos3.leaf_of[a]] != clos3.pod_of[clos3.leaf_of[b]]
    (spread3,) = clos3.adaptive_between(a, b)[1:-1]
    by_tier: dict[str, float] = {}
    for (u, v), share in spread3:
        tier = f"{three.graph.nodes[u].get('tier')}->{three.graph.nodes[v].get('tier')}"
        by_tier[tier] = by_tier.get(tier, 0.0) + share
    # each tier's hops carry the pair's traffic once: up to the spines, to the cores, down, down
    assert by_tier == pytest.approx({"leaf->spine": 1.0, "spine->core": 1.0, "core->spine": 1.0, "spine->leaf": 1.0})
    ups = [share for (u, v), share in spread3 if u == clos3.leaf_of[a]]
    assert len(ups) == len(clos3.spines[clos3.leaf_of[a]]) and max(ups) == pytest.approx(min(ups))


def test_merged_mirrors_equal_the_merge_of_whole_adaptive_routes(monkeypatch):
    topo_build = lambda: build_system("dgx-h100", 16, su_size=4)  # noqa: E731

    def merge(whole: bool):
        topo = topo_build()
        eng = NcclEngine(Cluster(topo, record=False), ib_adaptive_routing=True)
        g = topo.gpus()
        plans = [eng.plan(Collective("all_reduce", 64 << 20, tuple(range(16))), tuple(g[k * 8 + i] for k in range(16)))
                 for i in range(8)]
        assert ecmp.plan_subflows(eng, plans[0]) == ecmp.ADAPTIVE
        with monkeypatch.context() as m:
            if whole:
                m.setattr(mirrors_module, "_routes", lambda t, pairs, own, ends, subflows=1, owners=None:
                          [t.route_spread(x, y, subflows) for x, y in pairs])
            weights = mirrors_module.merged_weights(eng, plans, eng.edge_weights(plans[0]), set(plans[0].gpus))
        return [(f"{u}->{v}", x) for r, x in weights.items() for u, v in eng.cluster.link_classes.edges_of(r)]

    kept = merge(whole=False)
    assert kept == merge(whole=True)
    spine_loads = {round(x, 12) for name, x in kept if "spine" in name}
    assert len(spine_loads) == 1  # (evenly spread: every leaf-spine link of the merge carries the same)


def test_sends_spread_and_modes_agree_under_adaptive_routing():
    overrides = ['system.fabric="fat_tree"', "system.nodes_per_leaf=1", "system.oversubscription=2",
                 "system.spines=4", "simulation.nccl_ib_adaptive_routing=true"]
    times = {mode: run_scenario(load(None, [*overrides, f'simulation.mode="{mode}"'])).metrics["iteration_time_s"]
             for mode in ("full", "symmetric")}
    assert times["full"] == pytest.approx(times["symmetric"], rel=1e-3)
    hashed = run_scenario(load(None, [*overrides[:-1], 'simulation.mode="full"'])).metrics["iteration_time_s"]
    assert times["full"] < hashed  # (the default scenario's DP all-reduce collides on 4 spines when hashed)


@pytest.mark.parametrize(("overrides", "message"), [
    (["simulation.nccl_ib_adaptive_routing=1"], "nccl_ib_adaptive_routing must be bool"),
    (["simulation.nccl_ib_adaptive_routing=true", 'simulation.fidelity="chunked"'], 'needs fidelity = "flow"'),
])
def test_bad_adaptive_routing_is_one_line(overrides, message):
    with pytest.raises(ValueError, match=message):
        run_scenario(load(None, overrides))
