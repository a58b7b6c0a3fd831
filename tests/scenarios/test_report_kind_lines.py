"""The links report's busiest link of each edge kind (``scenarios.report._kind_lines``) is the first link of
that kind in ``busiest_links`` order over every link, with its mean utilisation and its kind's count."""

from types import SimpleNamespace

from hwmodel.cluster import Cluster
from hwmodel.ir import Collective
from hwmodel.nccl.engine import NcclEngine
from hwmodel.topology import build_system
from scenarios.metrics import busiest_links
from scenarios.report import _kind_lines

MiB = 1 << 20


def _reference(cluster, end_time_s):
    """kind -> (mean, carried, name, count): every link ranked, as the report did it before."""
    graph, best, used = cluster.topology.graph, {}, {}
    for name, carried, mean, _ in busiest_links(cluster.link_resources(), 10**9, end_time_s):
        if carried <= 0:
            continue
        kind = graph.edges[tuple(name.split("->", 1))].get("kind", "other")
        used[kind] = used.get(kind, 0) + 1
        best.setdefault(kind, (mean, carried, name))
    return {k: (*v, used[k]) for k, v in best.items()}


def _mirrored_rings(topo, nodes_first_gpu):
    """A 256 MiB all-reduce over one GPU of each listed node, mirrored on the other 7 GPUs of each node."""
    gpus = topo.gpus()
    cl = Cluster(topo)
    eng = NcclEngine(cl)
    coll = Collective("all_reduce", 256 * MiB, tuple(range(4)))
    first = eng.plan(coll, tuple(gpus[i] for i in nodes_first_gpu))
    mirrors = [eng.plan(coll, tuple(gpus[i + j] for i in nodes_first_gpu)) for j in range(1, 8)]
    eng.start_mirrored(first, mirrors)
    return gpus, cl, eng


def test_each_kinds_busiest_link_is_the_first_of_its_kind_over_all_links():
    topo = build_system("dgx-h100", 4, oversubscription=2.0)
    gpus, cl, eng = _mirrored_rings(topo, (0, 8, 16, 24))
    eng.start(eng.plan(Collective("all_gather", 64 * MiB, tuple(range(8))), tuple(gpus[8:16])))
    cl.env.run()
    rep = SimpleNamespace(result=SimpleNamespace(cluster=cl, end_time_s=cl.env.now))
    lines = _kind_lines(rep, cl.link_resources())
    ref = _reference(cl, cl.env.now)
    assert set(ref) == {"nvlink", "pcie", "ib"} and len(lines) == 1 + len(ref)
    for line in lines[1:]:
        kind = next(k for k, label in (("nvlink", "NVLink"), ("pcie", "PCIe"), ("ib", "network"))
                    if line.strip().startswith(label))
        mean, carried, name, count = ref[kind]
        assert name in line.split()
        assert f"{100 * mean:>6.1f}%" in line and f"({count} such links carried traffic)" in line


def test_the_report_of_link_bundles_is_the_report_of_every_link():
    """``Cluster.link_bundles()`` (a link class as one entry) gives the links table's groups and the
    per-kind lines that ``link_resources()`` (a view per link) gives, on mirrored rings whose merges load
    links of the fabric in classes."""
    from scenarios.metrics import link_groups

    topo = build_system("dgx-h100", 8, nodes_per_leaf=2, oversubscription=2.0)
    gpus, cl, eng = _mirrored_rings(topo, (0, 16, 40, 56))
    eng.start_mirrored(eng.plan_p2p(gpus[8], gpus[48], 64 * MiB),
                       [eng.plan_p2p(gpus[8 + j], gpus[48 + j], 64 * MiB) for j in range(1, 8)])
    cl.env.run()
    bundles = [lk for lk in cl.link_bundles() if getattr(lk, "count", 1) > 1]
    assert bundles and sum(b.count for b in bundles) > len(bundles)  # classes of several links were loaded
    assert sorted(n for lk in cl.link_bundles() for n in getattr(lk, "names", lambda lk=lk: [lk.name])()) == \
        sorted(lk.name for lk in cl.link_resources())
    end = cl.env.now
    for top in (1, 4, 100):
        assert link_groups(cl.link_bundles(), end, top) == link_groups(cl.link_resources(), end, top)
    rep = SimpleNamespace(result=SimpleNamespace(cluster=cl, end_time_s=end))
    assert _kind_lines(rep, cl.link_bundles()) == _kind_lines(rep, cl.link_resources())


def test_a_bundle_of_leaf_up_and_spine_down_links_counts_each_kind_apart():
    """A link class may hold links of two kinds loaded alike (leaf -> spine and spine -> leaf of one
    bandwidth): each kind counts its own links -- 4 leaves x 4 spines, 16 each way, not a class's 28."""
    from scenarios.cmd_run import load
    from scenarios.report import format_report
    from scenarios.runner import run_scenario

    rep = run_scenario(load(None, ['system.fabric="fat_tree"', "system.nodes_per_leaf=1", "system.oversubscription=2",
                                   "system.spines=4", 'simulation.mode="full"']))
    text = format_report(rep)
    up = next(line for line in text.splitlines() if "fabric (leaf to spine)" in line)
    down = next(line for line in text.splitlines() if "fabric (spine to leaf)" in line)
    assert "(16 such links carried traffic)" in up and "(16 such links carried traffic)" in down
