"""A collective merged with its symmetric mirrors (hwmodel.nccl.mirrors, NcclEngine.start_mirrored)."""

from hwmodel.cluster import Cluster
from hwmodel.ir import Collective
from hwmodel.nccl.engine import NcclEngine
from hwmodel.topology import build_system

MiB = 1 << 20


def _reference_merge(eng: NcclEngine, plans, ends):
    """The merge rule on link resources, mirror by mirror (what the engine did before laying mirrors out
    as edges): add weights per link; keep the first plan's links, shared links, links between fabric
    switches and links touching ``ends``."""
    kinds = eng.cluster.topology.graph.nodes
    own = eng._link_weights(plans[0])
    weights, users = {}, {}
    for i, p in enumerate(plans):
        for r, x in (own if i == 0 else eng._link_weights(p)).items():
            weights[r] = weights.get(r, 0.0) + x
            users[r] = users.get(r, 0) + 1
    return {r: x for r, x in weights.items() if r in own or users[r] > 1
            or kinds[r.meta[1]]["kind"] == kinds[r.meta[2]]["kind"] == "ib_switch"
            or r.meta[1] in ends or r.meta[2] in ends}


def test_pipeline_send_and_mirrors_merge_as_link_by_link_and_make_no_mirror_only_link():
    topo = build_system("dgx-h100", 8)
    gpus = topo.gpus()
    eng = NcclEngine(Cluster(topo, record=False))
    first = eng.plan_p2p(gpus[0], gpus[32], 4 * MiB)  # node 0 -> node 4: over a spine
    mirrors = [eng.plan_p2p(gpus[i], gpus[32 + i], 4 * MiB) for i in range(1, 32)]
    (work, lat, bound, weights, side, has_first), = eng._merged_groups([first, *mirrors])
    assert has_first and work == 4 * MiB and lat == first.latency_s and side
    classes = eng.cluster.link_classes
    per_link = {f"{u}->{v}": x for r, x in weights.items() for u, v in classes.edges_of(r)}
    made = {lk.name for lk in eng.cluster.link_resources()}
    ref_eng = NcclEngine(Cluster(topo, record=False))
    ref = _reference_merge(ref_eng, [ref_eng.plan_p2p(p.gpus[0], p.gpus[1], p.size_bytes)
                                     for p in [first, *mirrors]], set(first.gpus))
    # every kept link with the same weight as link by link, float for float; links alike are one resource
    assert sorted(per_link.items()) == sorted((r.name, x) for r, x in ref.items())
    assert len(weights) < len(per_link)
    # a mirror's own NIC uplink carries nothing the merge keeps: it gets no resource
    assert "n1.nic0->su0.leaf0" not in made and "n0.nic0->su0.leaf0" in made
    assert len(made) == len(per_link) < len(ref_eng.cluster.links.made())


def test_start_mirrored_caches_by_list_and_matches_start_together():
    topo = build_system("dgx-h100", 4)
    gpus = topo.gpus()
    times = []
    for mirrored in (False, True):
        eng = NcclEngine(Cluster(topo, record=False))
        coll = Collective("all_reduce", 64 * MiB, tuple(range(4)))
        first = eng.plan(coll, (gpus[0], gpus[8], gpus[16], gpus[24]))
        mirrors = [eng.plan(coll, (gpus[i], gpus[8 + i], gpus[16 + i], gpus[24 + i])) for i in range(1, 8)]
        for _ in range(2):
            done = eng.start_mirrored(first, mirrors) if mirrored else eng.start_together([first, *mirrors])
            eng.cluster.env.run()
            assert done.processed
            times.append(eng.cluster.env.now)
        if mirrored:
            assert len(eng._mirrored_cache) == 1
    assert times[:2] == times[2:] and times[1] > times[0] > 0


def _merged_in_order(topo, pairs, size, *, counted: bool, monkeypatch):
    """``merged_weights`` of sends ``pairs`` (the first is the representative) as [(link, weight)] in order,
    counted per edge (``counted``) or laid out flow by flow (the general merge)."""
    from hwmodel.nccl import mirrors as mirrors_module

    eng = NcclEngine(Cluster(topo, record=False))
    plans = [eng.plan_p2p(a, b, size) for a, b in pairs]
    with monkeypatch.context() as m:
        if not counted:
            m.setattr(mirrors_module, "_sends_kept", lambda *a: None)
        weights = mirrors_module.merged_weights(eng, plans, eng.edge_weights(plans[0]), set(plans[0].gpus))
    classes = eng.cluster.link_classes
    return [(f"{u}->{v}", x) for r, x in weights.items() for u, v in classes.edges_of(r)]


def test_sends_counted_per_edge_merge_as_laid_out_flow_by_flow(monkeypatch):
    # three tiers, oversubscribed; 4 NICs for 8 GPUs (two sends share each NIC uplink); sends into one
    # node from several (shared downlinks), one back the other way, one inside a node
    topo = build_system("dgx-h100", 64, leaves_per_pod=4, oversubscription=2.0, nics_per_node=4)
    g = topo.gpus()
    pairs = [(g[0], g[8 * 40]), *((g[i], g[8 * 40 + i]) for i in range(1, 8)),
             *((g[8 * n + 3], g[8 * 63 + 5]) for n in range(1, 30)), (g[8 * 63 + 1], g[2]), (g[9], g[12])]
    for size in (4 * MiB, 4096):  # the Simple and the LL protocol
        counted = _merged_in_order(topo, pairs, size, counted=True, monkeypatch=monkeypatch)
        laid_out = _merged_in_order(topo, pairs, size, counted=False, monkeypatch=monkeypatch)
        assert counted == laid_out  # the same links, in the same order, float for float
        assert any(name.startswith("pod") and "core" in name for name, _ in counted)  # crosses the core


def test_mirrored_sends_from_gpu_pairs_equal_those_from_plans_and_cache_by_the_list():
    """``start_mirrored_sends(plan, pairs)`` (the mirrors' plans made for the merge only) ends at the same
    instants and puts the same bytes on every link as ``start_mirrored`` of the mirrors' plans; a repeat
    with the same list reuses its merge. Mirrors inside the sender's node (another channel count and
    latency: a group of their own) and across the fabric are both in the list."""
    topo = build_system("dgx-h100", 8)
    gpus = topo.gpus()
    pairs = [(gpus[i], gpus[32 + i]) for i in range(1, 16)] + [(gpus[40 + i], gpus[48 + i]) for i in range(4)] \
        + [(gpus[16], gpus[17])]
    out = []
    for by_pairs in (False, True):
        eng = NcclEngine(Cluster(topo, record=False))
        first = eng.plan_p2p(gpus[0], gpus[32], 16 * MiB)
        mirrors = [eng.plan_p2p(a, b, 16 * MiB) for a, b in pairs]
        ends = []
        for _ in range(2):
            done = eng.start_mirrored_sends(first, pairs) if by_pairs else eng.start_mirrored(first, mirrors)
            eng.cluster.env.run()
            assert done.processed
            ends.append(eng.cluster.env.now)
        assert len(eng._mirrored_cache) == 1
        out.append((ends, sorted((lk.name, lk.carried) for lk in eng.cluster.link_resources())))
    assert out[0] == out[1] and out[0][0][1] > out[0][0][0] > 0
    assert len({eng.plan_p2p(a, b, 16 * MiB).latency_s for a, b in pairs}) == 2  # (two groups)
