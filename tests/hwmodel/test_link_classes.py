"""Links that merged mirrored traffic loads alike, as one resource per class (hwmodel.link_classes):
the same rates, bytes and timelines as one resource per link, while classes split under running traffic."""

import math

import pytest

from hwmodel.cluster import Cluster
from hwmodel.ir import Collective
from hwmodel.nccl.engine import NcclEngine
from hwmodel.topology import build_system

MiB = 1 << 20


def _run(link_classes: bool):
    """Mirrored sends and rings over an oversubscribed rail-optimised fabric (2 nodes per leaf, 4:1), started
    while others run or pay their latency: each loads links that earlier merges' classes hold unevenly
    (other spines by the ECMP hash, other leaves), so classes split under running and waiting activities."""
    topo = build_system("dgx-h100", 8, nodes_per_leaf=2, oversubscription=4)
    gpus = topo.gpus()
    cluster = Cluster(topo, link_classes=link_classes)
    eng = NcclEngine(cluster)
    env = cluster.env

    def node(n: int, i: int) -> str:
        return gpus[8 * n + i]

    sends_a = [eng.plan_p2p(node(0, i), node(4, i), 64 * MiB) for i in range(8)]
    sends_b = [eng.plan_p2p(node(1, i), node(6, i), 32 * MiB) for i in range(8)]
    coll = Collective("all_reduce", 256 * MiB, tuple(range(4)))
    rings = [eng.plan(coll, (node(0, i), node(2, i), node(5, i), node(7, i))) for i in range(8)]
    sends_c = [eng.plan_p2p(node(0, i), node(5, i), 16 * MiB) for i in range(8)]
    ends: dict[str, float] = {}

    def op(name, delay, plans):
        yield env.timeout(delay)
        yield eng.start_mirrored(plans[0], plans[1:])
        ends[name] = env.now

    env.process(op("a", 0.0, sends_a))
    env.process(op("b", 2e-4, sends_b))
    env.process(op("ring", 0.0, rings))  # (while a pays its latency)
    env.process(op("c", 5e-4, sends_c))  # (while a, b and the ring run)
    env.process(op("a again", 1e-3, sends_a))
    env.run()
    links = {lk.name: (lk.carried, list(lk.timeline)) for lk in cluster.link_resources()}
    return cluster, ends, links


def test_classes_give_the_rates_bytes_and_timelines_of_one_resource_per_link():
    cluster, ends, links = _run(True)
    _, ref_ends, ref_links = _run(False)
    assert ends.keys() == ref_ends.keys() and len(ends) == 5
    for name, t in ref_ends.items():
        assert ends[name] == pytest.approx(t, rel=1e-12, abs=0)
    assert links.keys() == ref_links.keys()
    for name, (carried, timeline) in ref_links.items():
        assert math.isclose(links[name][0], carried, rel_tol=1e-12, abs_tol=1e-3), name
        assert [t for t, _ in links[name][1]] == pytest.approx([t for t, _ in timeline], rel=1e-12, abs=1e-15)
        assert [u for _, u in links[name][1]] == pytest.approx([u for _, u in timeline], rel=1e-12, abs=1e-3)
    # the classes did stand for several links, and some split while traffic ran. (Fewer than half of the
    # links' count before collectives were planned by NCCL's chunk pipeline; 28 of 33 since: the plans'
    # per-link weights tell more links apart, a loss of sharing to look into, not of exactness.)
    resources = {r for r in cluster.fs.resources if isinstance(r.meta, tuple) and r.meta[0] == "link"}
    assert len(resources) < len(links)
    assert any(len(cluster.link_classes.edges_of(r)) > 1 for r in resources)


def test_a_link_asked_for_by_name_leaves_its_class_with_its_bytes():
    cluster, _, links = _run(True)
    classes = cluster.link_classes
    rep = next(r for r in cluster.fs.resources if isinstance(r.meta, tuple) and r.meta[0] == "link"
               and len(classes.edges_of(r)) > 2)
    edges = classes.edges_of(rep)
    u, v = edges[1]
    lk = cluster.links[(u, v)]
    assert lk is not rep and lk.name == f"{u}->{v}" and (u, v) not in classes
    assert lk.carried == links[lk.name][0] > 0 and lk.timeline == links[lk.name][1]
    assert classes.edges_of(rep) == [edges[0], *edges[2:]]
    assert cluster.links[(u, v)] is lk
