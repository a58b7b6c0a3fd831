"""ECMP spreading of a NIC pair's traffic over NCCL's sub-flows (channels per NIC x QPs per connection).

Closed forms: on a 1:1 fat tree of 4 DGX H100 (one leaf per node), the ring all-reduce between two
nodes is 8 rails x k sub-flows = m flows from one leaf to the next, each on one of n spines; a leaf-spine
link has 1/n of the leaf's uplink, so the most loaded one is overloaded n x (most sub-flows on a spine)
/ m times, and the all-reduce's bus bandwidth is the 1-spine figure over that overload (when above 1).
"""

import math
import random
import zlib
from collections import Counter
from functools import cache

import pytest

from hwmodel import ecmp
from hwmodel.cluster import Cluster
from hwmodel.ir import Collective
from hwmodel.nccl.engine import NcclEngine, simulate_nccl_tests
from hwmodel.topology import Topology, build_system
from scenarios.scenario import load_scenario

GiB = 1 << 30
NODES = 4


def _tree(spines: int) -> Topology:
    return build_system("dgx-h100", NODES, fabric="fat_tree", nodes_per_leaf=1, num_spines=spines)


def _plan(eng: NcclEngine):
    gpus = tuple(eng.cluster.topology.gpus())
    return eng.plan(Collective("all_reduce", GiB, tuple(range(len(gpus)))), gpus)


def _spine_weights(topo: Topology, weights: dict) -> dict:
    return {e: w for e, w in weights.items() if topo.graph.nodes[e[0]].get("tier") == "spine"
            or topo.graph.nodes[e[1]].get("tier") == "spine"}


def _hashed_counts(topo: Topology, k: int) -> dict[tuple[int, int], Counter]:
    """(leaf i, spine s) -> sub-flows of ring rails from node i to node i+1 on spine s, recomputed from the
    documented key (:func:`hwmodel.ecmp.subflow_hkey`, CRC32 at the source leaf) for k sub-flows per
    NIC pair, or the per-pair key f"{src}|{dst}|{leaf}" when k == 1."""
    n = len([v for v, d in topo.graph.nodes(data=True) if d.get("tier") == "spine"])
    out: dict[tuple[int, int], Counter] = {}
    for i in range(NODES):
        c = Counter()
        for rail in range(8):
            src, dst = f"n{i}.gpu{rail}", f"n{(i + 1) % NODES}.gpu{rail}"
            keys = [f"{src}|{dst}"] if k == 1 else [ecmp.subflow_hkey(src, dst, j) for j in range(k)]
            for key in keys:
                c[zlib.crc32(f"{key}|leaf{i}".encode()) % n] += 1
        out[i] = c
    return out


def test_one_subflow_per_pair_is_the_per_flow_hash():
    """With 1 channel per NIC and 1 QP the route is the former one: each pair's whole traffic on the
    spine CRC32(src|dst|leaf) picks."""
    topo = _tree(4)
    clos = topo.constructed_fabric()
    for a, b in [("n0.gpu3", "n1.gpu3"), ("n2.gpu0", "n3.gpu7"), ("n3.gpu5", "n0.gpu5")]:
        assert topo.route_spread(a, b, 1) == topo.route_edges(a, b)
        na, nb = topo.nic_of(a), topo.nic_of(b)
        assert clos.spread_between(na, nb, a, b, 1) == clos.route_between(na, nb, a, b)
    eng = NcclEngine(Cluster(topo, record=False))
    plan = _plan(eng)
    plan.n_channels = 8  # one channel per rail
    assert ecmp.plan_subflows(eng, plan) == 1
    spines = _spine_weights(topo, eng.edge_weights(plan))
    counts = _hashed_counts(topo, 1)
    per_flow = 1.0 / 8 * eng.proto_weight(plan) / eng.link_efficiency_of_kind("ib")
    for i, c in counts.items():
        for s in range(4):
            assert spines.get((f"leaf{i}", f"spine{s}"), 0.0) == pytest.approx(c[s] * per_flow)


@pytest.mark.parametrize("qps", [1, 4])
def test_spread_weights_are_the_hashed_subflow_loads_and_sum_to_the_pairs_traffic(qps):
    topo = _tree(4)
    eng = NcclEngine(Cluster(topo, record=False), ib_qps_per_connection=qps)
    plan = _plan(eng)
    k = ecmp.plan_subflows(eng, plan)
    assert k == -(-plan.n_channels // 8) * qps and k > 1
    weights = eng.edge_weights(plan)
    spines = _spine_weights(topo, weights)
    counts = _hashed_counts(topo, k)
    for i, c in counts.items():
        nxt = (i + 1) % NODES
        pair = sum(w for (u, v), w in weights.items() if u.startswith(f"n{i}.nic") and v == f"leaf{i}")
        up = [spines.get((f"leaf{i}", f"spine{s}"), 0.0) for s in range(4)]
        down = [spines.get((f"spine{s}", f"leaf{nxt}"), 0.0) for s in range(4)]
        assert sum(up) == pytest.approx(pair) and sum(down) == pytest.approx(pair)  # nothing lost or added
        assert up == pytest.approx([pair * c[s] / (8 * k) for s in range(4)])  # the exact hashed loads
        assert up == pytest.approx(down)


def test_searched_routes_spread_as_the_constructed_ones():
    """The constructed router and the graph search hash a sub-flow's key alike (two and three tiers)."""
    for topo in (_tree(4), build_system("dgx-h100", 9, fabric="fat_tree", nodes_per_leaf=1, leaves_per_pod=2)):
        ref = Topology(topo.graph, topo.gpu_spec, topo.nic_spec)
        ref.route_by_construction = False
        gpus = topo.gpus()
        rng = random.Random(5)
        for _ in range(40):
            a, b = rng.choice(gpus), rng.choice(gpus)
            for k in (2, 3, 8):
                assert topo.route_spread(a, b, k) == ref.route_spread(a, b, k), (a, b, k)


@cache
def _p_max_at_most(balls: int, bins: int, t: int) -> float:
    """P(no bin holds more than t of ``balls`` thrown uniformly into ``bins``): the number of sequences
    with every bin <= t, by the exponential generating function, over bins**balls."""
    # coefficient of x^balls / balls! in (sum_{c<=t} x^c / c!)^bins, by a DP over bins
    poly = [1.0] + [0.0] * balls
    for _ in range(bins):
        new = [0.0] * (balls + 1)
        for have, p in enumerate(poly):
            if p:
                for c in range(min(t, balls - have) + 1):
                    new[have + c] += p / math.factorial(c)
        poly = new
    return poly[balls] * math.factorial(balls) / bins ** balls


def test_exact_max_load_formula():
    assert _p_max_at_most(2, 2, 1) == pytest.approx(0.5)
    assert _p_max_at_most(3, 3, 1) == pytest.approx(6 / 27)
    assert _p_max_at_most(4, 2, 4) == pytest.approx(1.0)


@pytest.mark.parametrize("qps", [1, 8])
def test_busbw_falls_with_spines_by_the_hashed_collision_share_only(qps):
    """1 GiB all-reduce over 4 nodes: busbw(n spines) = busbw(1 spine) / overload, overload = n x (most
    sub-flows on one leaf-spine link) / m; and that overload is within the 99th percentile of the largest
    of 4 leaf pairs' maxima of m balls into n bins (the pairs hash independently)."""
    def busbw(spines: int) -> tuple[float, int]:
        topo = _tree(spines)
        row = simulate_nccl_tests(topo, "all_reduce", [GiB], ib_qps_per_connection=qps)[0]
        return row.busbw_Bps, topo

    ref, _ = busbw(1)
    eng = NcclEngine(Cluster(_tree(1), record=False), ib_qps_per_connection=qps)
    k = ecmp.plan_subflows(eng, _plan(eng))
    m = 8 * k
    for n in (2, 4, 8):
        got, topo = busbw(n)
        worst = max(max(c.values()) for c in _hashed_counts(topo, k).values())
        overload = max(1.0, n * worst / m)
        assert got == pytest.approx(ref / overload, rel=0.02), (n, worst, m)
        t99 = next(t for t in range(m + 1) if _p_max_at_most(m, n, t) ** NODES >= 0.99)
        assert worst <= t99
        assert got >= ref / max(1.0, n * t99 / m) * 0.98


def test_subflow_keys_pick_spines_uniformly_and_independently():
    """The sub-flow keys' spine choices behave as balls into bins (CRC32 of keys differing in one digit
    would not): chi-square of 8,000 choices over 8 spines, and the mean largest load of 16 sub-flows."""
    rng = random.Random(11)
    n, k = 8, 16
    picks, maxima = Counter(), []
    for _ in range(500):
        src, dst = f"n{rng.randrange(4096)}.gpu{rng.randrange(8)}", f"n{rng.randrange(4096)}.gpu{rng.randrange(8)}"
        c = Counter(zlib.crc32(f"{ecmp.subflow_hkey(src, dst, j)}|leaf0".encode()) % n for j in range(k))
        picks.update(c)
        maxima.append(max(c.values()))
    expected = 500 * k / n
    chi2 = sum((picks[s] - expected) ** 2 / expected for s in range(n))
    assert chi2 < 24.3  # 7 degrees of freedom, p = 0.001
    mean_max = sum(t * (_p_max_at_most(k, n, t) - _p_max_at_most(k, n, t - 1)) for t in range(1, k + 1))
    assert sum(maxima) / len(maxima) == pytest.approx(mean_max, abs=0.25)


def test_combine_keeps_shared_hops_and_spreads_the_rest():
    r1 = [("a", "l0"), ("l0", "s0"), ("s0", "l1"), ("l1", "b")]
    r2 = [("a", "l0"), ("l0", "s1"), ("s1", "l1"), ("l1", "b")]
    out = ecmp.combine([r1, r1, r2, r1])
    assert out[0] == ("a", "l0") and out[2] == ("l1", "b") and len(out) == 3
    assert dict(out[1]) == {("l0", "s0"): 0.75, ("s0", "l1"): 0.75, ("l0", "s1"): 0.25, ("s1", "l1"): 0.25}
    assert ecmp.combine([r1, r1]) == tuple(r1)
    into: dict = {}
    ecmp.expand_into({out[0]: 2.0, out[1]: 2.0}, into)
    assert into == {("a", "l0"): 2.0, ("l0", "s0"): 1.5, ("s0", "l1"): 1.5, ("l0", "s1"): 0.5, ("s1", "l1"): 0.5}


@pytest.mark.parametrize("bad", [0, 129, -1, 2.0, True])
def test_qps_per_connection_out_of_range_is_refused_in_one_line(bad):
    with pytest.raises(ValueError, match=r"nccl_ib_qps_per_connection.*allowed: an integer 1\.\.128") as exc:
        ecmp.check_qps_per_connection(bad)
    assert "\n" not in str(exc.value)
    if not isinstance(bad, float):
        with pytest.raises(ValueError, match="nccl_ib_qps_per_connection"):
            load_scenario(None, [f"simulation.nccl_ib_qps_per_connection={str(bad).lower()}"])
