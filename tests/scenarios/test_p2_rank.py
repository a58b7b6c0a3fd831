"""P² lowering, the analytical pre-screen, simulation (stub and real engine) and the reports."""

import json
from types import SimpleNamespace

import pytest

from hwmodel.ir import Collective
from scenarios.p2.cost import QuickCost
from scenarios.p2.hierarchy import Hierarchy
from scenarios.p2.placement import Placement
from scenarios.p2.programs import Step
from scenarios.p2.rank import evaluate_case, lower, lower_steps, quick_cost_s, simulate, synth_space
from scenarios.p2.report import p2_findings, plot_spread, run_synth

MiB = 2**20
H24 = Hierarchy((("node", 2), ("gpu", 4)))
RS_AR_AG = (Step("ReduceScatter", 1, 2), Step("AllReduce", 0, 1), Step("AllGather", 1, 2))


def test_lowering_sizes_follow_the_semantics():
    p = Placement(H24, (("dp", 8),), ((2, 4),))
    steps = lower_steps(p, ["dp"], RS_AR_AG, 8 * MiB)
    assert steps == [
        ("reduce_scatter", [((0, 1, 2, 3), 8 * MiB), ((4, 5, 6, 7), 8 * MiB)]),    # whole input buffer
        ("all_reduce", [((0, 4), 2 * MiB), ((1, 5), 2 * MiB), ((2, 6), 2 * MiB), ((3, 7), 2 * MiB)]),
        ("all_gather", [((0, 1, 2, 3), 8 * MiB), ((4, 5, 6, 7), 8 * MiB)]),        # whole gathered buffer
    ]
    progs = lower(p, ["dp"], RS_AR_AG, 8 * MiB)
    ops = [t.op for t in progs[5].tasks]
    assert ops == [Collective("reduce_scatter", 8 * MiB, (4, 5, 6, 7), name="p2.s0"),
                   Collective("all_reduce", 2 * MiB, (1, 5), name="p2.s1"),
                   Collective("all_gather", 8 * MiB, (4, 5, 6, 7), name="p2.s2")]
    assert all(t.stream == "comm" for t in progs[5].tasks)


def test_lowering_with_masters_and_several_groups():
    # dp=4 x tp=2 on node[2] > gpu[4], dp = node 2 x gpu 2, tp inside the node: two dp groups.
    p = Placement(H24, (("dp", 4), ("tp", 2)), ((2, 2), (1, 2)))
    assert p.reduction_groups(["dp"]) == [(0, 2, 4, 6), (1, 3, 5, 7)]
    prog = (Step("Reduce", 1, 2), Step("AllReduce", 1, 2, "Master"), Step("Broadcast", 1, 2))
    steps = lower_steps(p, ["dp"], prog, 4 * MiB)
    assert steps[0] == ("reduce", [((0, 2), 4 * MiB), ((1, 3), 4 * MiB), ((4, 6), 4 * MiB), ((5, 7), 4 * MiB)])
    assert steps[1] == ("all_reduce", [((0, 4), 4 * MiB), ((1, 5), 4 * MiB)])     # only the masters
    progs = lower(p, ["dp"], prog, 4 * MiB)
    assert len(progs[2].tasks) == 2 and len(progs[0].tasks) == 3                   # rank 2 idles in step 1


def _cost():
    # 2 nodes x 4 GPUs, 240 GB/s NVLink, 4 NICs of 23.5 GB/s per node
    return QuickCost(node_of=(0, 0, 0, 0, 1, 1, 1, 1), intra_Bps=240e9, nic_Bps=23.5e9, nics_per_node=4)


def test_quick_cost_prefers_hierarchy_across_nodes():
    c = _cost()
    S = 64 * MiB
    assert c.collective_s("all_reduce", S, (0, 1, 2, 3)) < c.collective_s("all_reduce", S, (0, 4))
    p = Placement(H24, (("dp", 8),), ((2, 4),))
    flat = quick_cost_s(c, lower_steps(p, ["dp"], (Step("AllReduce", 0, 2),), S))
    hier = quick_cost_s(c, lower_steps(p, ["dp"], RS_AR_AG, S))
    # flat: 1.75 S / min(240, 4 x 23.5) GB/s; hierarchical: 2 x 0.75 S / 240 + S/4 / 23.5 -> faster
    assert hier < flat
    # cheapest protocol: LL128 (14 us base, 14 steps x 4 us, 120/128 payload) beats Simple here
    simple = 8.4e-6 + 14 * 14e-6 + 1.75 * S / 94e9
    ll128 = 14e-6 + 14 * 4e-6 + 1.75 * S / (94e9 * 120 / 128)
    assert flat == pytest.approx(min(simple, ll128), rel=1e-6)
    # NIC sharing: two crossing communicators of 2 members per node each get half the 4 NICs
    one = c.step_s("all_reduce", [((0, 1, 4, 5), S)])
    two = c.step_s("all_reduce", [((0, 1, 4, 5), S), ((2, 3, 6, 7), S)])
    assert two == pytest.approx(one)                      # 2 + 2 = 4 NICs: no contention
    c2 = QuickCost(node_of=c.node_of, intra_Bps=240e9, nic_Bps=23.5e9, nics_per_node=2)
    assert c2.step_s("all_reduce", [((0, 1, 4, 5), S), ((2, 3, 6, 7), S)]) > \
        c2.step_s("all_reduce", [((0, 1, 4, 5), S)])
    with pytest.raises(ValueError, match="op 'all_to_all'"):
        c.collective_s("all_to_all", S, (0, 1))


def test_quick_cost_from_topology():
    from hwmodel.topology import build_system

    topo = build_system("dgx-a100", 2)
    h = Hierarchy.from_topology(topo)
    assert h.levels == (("node", 2), ("gpu", 8)) and h.gpu_names[9] == "n1.gpu1"
    c = QuickCost.from_topology(topo, h.gpu_names)
    assert c.intra_Bps == pytest.approx(240e9, rel=0.01)          # 12 x 20 GB/s app-level NVLink
    assert 20e9 < c.nic_Bps <= 25e9 and c.nics_per_node == 8
    hs = Hierarchy.from_topology(topo, nodes_per_unit=1)
    assert hs.names == ("su", "node", "gpu")


class StubEngine:
    """A collective engine for the runtime: every collective takes 1 us + bytes / 1 GB/s."""

    def __init__(self, cluster, fidelity="flow"):
        self.env = cluster.env
        self.calls = []

    def plan(self, coll, gpus):
        self.calls.append((coll.op, coll.size_bytes, gpus))
        return SimpleNamespace(n_channels=1, algorithm="ring", protocol="simple",
                               t=1e-6 + coll.size_bytes / 1e9)

    def start(self, plan):
        return self.env.timeout(plan.t)

    def start_together(self, plans):
        return self.start(plans[0])

    def start_mirrored(self, plan, mirrors):
        return self.start(plan)


def test_simulate_with_a_stub_engine_runs_steps_in_order():
    from hwmodel.topology import build_system

    topo = build_system("dgx-a100", 1)
    h = Hierarchy.from_topology(topo)
    p = Placement(h, (("dp", 8),), ((1, 8),))
    engines = []

    def factory(cluster, fidelity):
        engines.append(StubEngine(cluster, fidelity))
        return engines[-1]

    prog = (Step("ReduceScatter", 0, 1), Step("AllGather", 0, 1))
    t = simulate(topo, p, lower(p, ["dp"], prog, 8 * MiB), engine_factory=factory)
    # host issue of the first task (4 us) + two collectives of 8 MiB each
    assert t == pytest.approx(4e-6 + 2 * (1e-6 + 8 * MiB / 1e9), rel=1e-6)
    assert [c[0] for c in engines[0].calls] == ["reduce_scatter", "all_gather"]


def test_evaluate_case_with_the_stub_ranks_by_simulated_time():
    from hwmodel.topology import build_system

    topo = build_system("dgx-a100", 2)
    h = Hierarchy.from_topology(topo)
    p = Placement(h, (("dp", 16),), ((2, 8),))
    cost = QuickCost.from_topology(topo, h.gpu_names)
    case = evaluate_case(p, ["dp"], 4 * MiB, cost=cost, topology=topo, simulate_top=4, max_len=3,
                         engine_factory=lambda cl, f: StubEngine(cl, f))
    assert case.simulated == 5 or case.simulated == 4       # top 4 by quick cost + the default
    sims = [c for c in case.candidates if c.sim_s is not None]
    assert case.candidates[:len(sims)] == sorted(sims, key=lambda c: c.sim_s)
    assert case.default.sim_s is not None and case.best.sim_s <= case.default.sim_s
    assert 1 <= case.quick_rank_of_best() <= len(case.candidates)
    assert synth_space(p, ["dp"]).sizes == (2, 8)


def test_run_synth_on_the_simulator_and_reports(tmp_path):
    rep = run_synth("dgx-a100", 4, {"dp": 16, "tp": 2}, ["dp"], 16 * MiB, top_k=3, max_len=2)
    # dp=16, tp=2 on node[4] > gpu[8]: tp's row (t0, t1), t0 * t1 = 2 -> 2 placements
    assert len(rep.cases) == 2
    for case in rep.cases:
        assert case.default.sim_s is not None and case.default.sim_s > 0
        assert case.best.time_s <= case.default.time_s
        assert case.simulated <= 4
    assert rep.allreduce_spread >= 1.0
    text = rep.to_text()
    assert "all-reduce spread" in text and "(default)" in text and "AllReduce(" in text
    js = rep.to_json()
    json.dumps(js)
    assert js["axes"] == {"dp": 16, "tp": 2} and len(js["cases"]) == 2 and len(js["cases"][0]["top"]) <= 3
    png = plot_spread(rep, tmp_path / "spread.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_run_synth_analytical_only_and_bad_input():
    rep = run_synth("dgx-a100", 4, {"dp": 32}, ["dp"], 16 * MiB, simulate=False, max_len=3)
    assert len(rep.cases) == 1 and rep.cases[0].simulated == 0
    assert len(rep.cases[0].candidates) == 30
    with pytest.raises(ValueError, match=r"dp=8 x tp=2 multiply to 16.*32 devices"):
        run_synth("dgx-a100", 4, {"dp": 8, "tp": 2}, ["dp"], MiB)
    with pytest.raises(ValueError, match=r"unknown axis \['pp'\]"):
        run_synth("dgx-a100", 4, {"dp": 16, "tp": 2}, ["pp"], MiB)
    with pytest.raises(ValueError, match="size_bytes"):
        run_synth("dgx-a100", 4, {"dp": 32}, ["dp"], 0)


def test_p2_findings_small():
    rep = p2_findings((4,), 16 * MiB, [({"dp": 16, "tp": 2}, [["dp"]])], max_len=2)
    s = rep.summary()
    assert s["cases"] == 2 and s["spread_x"] >= 1.0
    assert 0.0 <= s["beats_default_share"] <= 1.0 and s["max_speedup_x"] >= 1.0
    assert s["top10_accuracy"] == 1.0                     # at most 10 programs of <= 2 steps per case
    text = rep.to_text()
    assert "448x" in text and "69%" in text and "2.04x" in text and "1.27x" in text
    json.dumps(rep.to_json())
