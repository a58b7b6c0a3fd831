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
    from scenarios.metrics import link_groups, link_kind

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
    def kind_of(name):
        return link_kind(topo.graph, name, topo)

    for top in (1, 4, 100):
        assert link_groups(cl.link_bundles(), end, top) == link_groups(cl.link_resources(), end, top)
        assert link_groups(cl.link_bundles(), end, top, kind_of) == link_groups(cl.link_resources(), end, top, kind_of)
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


def test_a_class_of_nic_and_fabric_links_is_one_row_per_kind():
    """Two SUs of 2 DGX H100 under 2 spines: a leaf's uplink to a spine is one 50 GB/s cable, a NIC's link's
    bandwidth, and the data-parallel rings load 8 NIC-leaf links and 2 links each way between a leaf and a
    spine alike: one link class, once printed as ``n0.nic0->su0.leaf0 (+11) nic 12``. Each kind is its own
    row now, named by a link of it and counting its own links, in the JSON as in the text; the row counts
    stay within the per-kind counts."""
    from scenarios.cmd_run import load
    from scenarios.metrics import link_groups, link_kind
    from scenarios.report import format_report
    from scenarios.runner import run_scenario

    rep = run_scenario(load(None, ['system.name="dgx-h100"', "system.nodes=4", "system.su_size=2", "system.spines=2",
                                   "parallel.pipeline_model_parallel_size=1", "training.global_batch_size=8"]))
    cl = rep.result.cluster
    assert link_groups(cl.link_bundles(), rep.result.end_time_s, 1)[0][:2] == ("n0.nic0->su0.leaf0", 12)
    rows = rep.metrics["busiest_links"]
    assert [(r["link"], r["kind"], r["links"]) for r in rows[:3]] == [
        ("n0.nic0->su0.leaf0", "nic", 8), ("spine0->su1.leaf0", "spine-leaf", 2),
        ("su0.leaf0->spine0", "leaf-spine", 2)]
    assert len({(r["carried_bytes"], r["capacity_Bps"]) for r in rows[:3]}) == 1  # one load, one class
    text = format_report(rep).splitlines()
    assert any(ln.split()[:3] == ["spine0->su1.leaf0", "(+1)", "spine-leaf"] for ln in text)
    for r in rows:  # a row's kind is its named link's, and no kind's rows outnumber its links that carried traffic
        assert link_kind(cl.topology.graph, r["link"], cl.topology) == r["kind"]
    label = {"nic": "network (NIC and leaf)", "leaf-spine": "fabric (leaf to spine)"}
    for kind, name in label.items():
        used = int(next(ln for ln in text if name in ln).split("(")[-1].split()[0])
        assert sum(r["links"] for r in rows if r["kind"] == kind) <= used
    assert not any("cables aggregated" in ln for ln in text)  # one cable a spine: nothing aggregated


def test_aggregated_fabric_capacities_say_how_many_cables():
    """A leaf's 2 uplinks (2 DGX H100 an SU at 1:1) to one spine are one 100 GB/s edge: the report says
    it is 2 cables of 50 GB/s (ConnectX-7's 400 Gb/s); 1:3 makes it 2/3 of a cable, a fraction it explains."""
    from scenarios.cmd_run import load
    from scenarios.report import format_report
    from scenarios.runner import run_scenario

    base = ['system.name="dgx-h100"', "system.nodes=4", "system.su_size=2", "parallel.pipeline_model_parallel_size=1",
            "training.global_batch_size=8", "simulation.record_links=false"]
    line = next(ln for ln in format_report(run_scenario(load(None, base))).splitlines() if "aggregated" in ln)
    assert line.strip() == "fabric capacities are per switch pair, its parallel cables aggregated: leaf-spine " \
                           "100 GB/s = 2 x 50 GB/s"
    text = format_report(run_scenario(load(None, [*base, "system.oversubscription=3"])))
    assert "leaf-spine 33 GB/s = 0.67 x 50 GB/s (a fraction: the model spreads a switch's uplink capacity, " \
        "downlinks / oversubscription, evenly over the switches above)" in text
