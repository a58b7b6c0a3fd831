"""The steady pipeline period (``scenarios/steady_state.py``): two short simulations, extrapolated, give
the full simulation's iteration.

Each case runs 32-56 micro-batches per pipeline in full (``steady_state = "off"``) and extrapolated from the
counts :func:`scenarios.steady_state.plan_for` picks; the iteration time, every rank's compute /
exposed communication / bubble / idle seconds and every busy link's bytes agree within 0.5 % (the
issue's bound), on the schedules and overlaps whose steady phase differs: 1F1B, interleaved 1F1B,
data-parallel overlap with the distributed optimizer across nodes, TP communication overlap, and
data-parallel gradient accumulation without a pipeline. Small models (2-4 layers, short sequences) keep
the full runs to seconds. A closed form checks the premise: with free communication a 1F1B iteration is
(m + p - 1)(t_f + t_b) per stage, affine in m, and the extrapolation reproduces the full run.
"""

import functools
from dataclasses import dataclass

import pytest

from hwmodel.cluster import Cluster
from hwmodel.ir import Compute
from hwmodel.runtime import Runtime
from hwmodel.topology import build_system
from scenarios.report import format_report, write_plots
from scenarios.runner import run_scenario
from scenarios.scenario import parse_scenario
from scenarios.steady_state import plan_for
from workload.parallel.builder import ModelTrace, build_programs
from workload.parallel.config import ParallelConfig

TOL = 0.005
SMALL = {"name": "llama3-8b", "num_layers": 4, "vocab_size": 32000}
TRAIN = {"micro_batch_size": 1, "seq_length": 256}

CASES = {
    "1f1b": {
        "system": {"name": "dgx-h100", "nodes": 1}, "model": SMALL,
        "parallel": {"tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 4},
        "training": {**TRAIN, "global_batch_size": 56}},
    "interleaved": {
        "system": {"name": "dgx-h100", "nodes": 1}, "model": SMALL,
        "parallel": {"tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 2,
                     "virtual_pipeline_model_parallel_size": 2},
        "training": {**TRAIN, "global_batch_size": 112}},
    "dp-overlap-distributed-optimizer": {
        "system": {"name": "dgx-a100", "nodes": 2}, "model": SMALL,
        "parallel": {"tensor_model_parallel_size": 4, "pipeline_model_parallel_size": 2,
                     "use_distributed_optimizer": True, "overlap_grad_reduce": True, "overlap_param_gather": True},
        "training": {**TRAIN, "global_batch_size": 112}},
    "tp-comm-overlap": {
        "system": {"name": "dgx-h100", "nodes": 1}, "model": SMALL,
        "parallel": {"tensor_model_parallel_size": 4, "pipeline_model_parallel_size": 2, "sequence_parallel": True,
                     "tp_comm_overlap": True},
        "training": {**TRAIN, "global_batch_size": 56, "seq_length": 512}},
    "grad-accumulation": {
        "system": {"name": "dgx-a100", "nodes": 2}, "model": {**SMALL, "num_layers": 2},
        "parallel": {"tensor_model_parallel_size": 8, "overlap_grad_reduce": True},
        "training": {**TRAIN, "global_batch_size": 64}},
}


@functools.cache
def _report(case: str, steady: str):
    spec = CASES[case]
    data = {"name": case, **{k: dict(v) for k, v in spec.items()}, "simulation": {"steady_state": steady}}
    return run_scenario(parse_scenario(data, source=case))


def _link_bytes(rep) -> dict[str, float]:
    return {lk.name: float(lk.carried) for lk in rep.result.cluster.link_resources()}


@pytest.mark.parametrize("case", sorted(CASES))
def test_extrapolated_equals_full(case):
    full_rep, fast_rep = _report(case, "off"), _report(case, "auto")
    full, fast = full_rep.metrics, fast_rep.metrics
    assert full["simulation"]["steady_state"] is None  # every micro-batch simulated
    counts = fast["simulation"]["steady_state"]["simulated_microbatches"]  # one where the window served
    m = full["parallel"]["num_microbatches"]
    assert fast["simulation"]["steady_state"]["of"] == m and 4 * sum(counts) < 3 * m
    T = full["iteration_time_s"]
    assert fast["iteration_time_s"] == pytest.approx(T, rel=TOL)
    assert fast["per_rank"].keys() == full["per_rank"].keys()
    for rank, parts in full["per_rank"].items():
        for key, seconds in parts.items():  # against the iteration: a bubble of microseconds has no relative bound
            assert abs(fast["per_rank"][rank][key] - seconds) <= TOL * T, (rank, key)
    full_links, fast_links = _link_bytes(full_rep), _link_bytes(fast_rep)
    busiest = max(full_links.values())
    assert busiest > 0
    for name, carried in full_links.items():  # every link, by name: groups of equal links may tie-break apart
        assert abs(fast_links.get(name, 0.0) - carried) <= TOL * max(carried, 1e-3 * busiest), name
    top = full["busiest_links"][0]
    assert fast["busiest_links"][0]["mean_utilisation"] == pytest.approx(top["mean_utilisation"], rel=TOL)
    assert fast["simulation"]["tasks"] == full["simulation"]["tasks"]
    assert fast["parallel"] == full["parallel"] and fast["memory"] == full["memory"]
    assert fast["mfu"] == pytest.approx(full["mfu"], rel=TOL)


def test_report_says_what_was_simulated():
    rep = _report("1f1b", "auto")
    text = format_report(rep)
    assert "simulated 20 of 56 micro-batches; the steady 1F1B period measured over 2 of them" in text
    assert "simulated 20 of 56 micro-batches; the steady interleaved 1F1B period measured over 4 of them" in \
        format_report(_report("interleaved", "auto"))
    assert rep.simulated is not None and rep.simulated.end_time_s < rep.result.end_time_s
    assert "simulated" not in format_report(_report("1f1b", "off")).split("Simulation", 1)[1]


def test_plan_rule():
    """m1 >= p with 1F1B and 2p interleaved (and >= 16), m1 = m (mod the period), m2 one period on; none
    where it would save under a quarter."""
    def cfg(p, m, v=None):
        return ParallelConfig(pipeline_model_parallel_size=p, virtual_pipeline_model_parallel_size=v,
                              global_batch_size=m).resolve(p)

    assert plan_for(cfg(8, 768, 3), {}).simulated == (16, 24)
    assert plan_for(cfg(64, 512, 2), {}).simulated == (128, 192)  # interleaved: two pipelines' worth
    assert plan_for(cfg(64, 512), {}).simulated == (64, 128)  # 1F1B: one
    assert plan_for(cfg(35, 280, 3), {}).simulated == (70, 105)
    assert plan_for(cfg(16, 80), {}).simulated == (16, 32)
    assert plan_for(cfg(16, 112, 2), {}).simulated == (32, 48)
    assert plan_for(cfg(3, 100), {}).simulated == (16, 22)  # period 6, m1 >= 16: 100 = 16 = 22 (mod 6)
    assert plan_for(cfg(1, 32), {}).simulated == (4, 8)
    # the interleaved schedule measures the period inside the m2 run: one run's cost where it repeats
    assert plan_for(cfg(64, 512, 2), {}).window and plan_for(cfg(64, 512, 2), {}).cost_microbatches == 192
    assert plan_for(cfg(64, 512, 2), {}).window == 64
    assert plan_for(cfg(64, 512), {}).window == 32 and plan_for(cfg(64, 512), {}).cost_microbatches == 128
    assert plan_for(cfg(1, 32), {}).window == 0 and plan_for(cfg(1, 32), {}).cost_microbatches == 12
    assert plan_for(cfg(8, 768, 3), {"steady_state": "off"}) is None
    assert plan_for(cfg(1, 16), {}) is None  # below MIN_MICROBATCHES
    assert plan_for(cfg(8, 48), {}) is None  # 16 + 24 micro-batches would save too little
    assert plan_for(cfg(4, 32), {}) is None  # 16 + 20 as well
    assert plan_for(cfg(8, 56), {}).simulated == (16, 24)  # 40 < 3/4 x 56


def test_bad_value_is_one_line():
    data = {"system": {"name": "dgx-h100"}, "model": {"name": "llama3-8b"}, "simulation": {"steady_state": "on"}}
    with pytest.raises(ValueError, match=r"^\[simulation\] steady_state: unknown 'on'; allowed: auto, off$"):
        parse_scenario(data)


# -- the premise, in closed form: with free communication, 1F1B is (m + p - 1)(t_f + t_b) per stage -------


@dataclass(frozen=True)
class _Pass:
    """One layer pass as a fixed-duration kernel."""

    name: str
    phase: str
    seconds: float
    layer: str

    def to_compute(self) -> Compute:
        return Compute(self.name, "macro", 1.0, 1.0, layer=self.layer, phase=self.phase, fixed_time_s=self.seconds)


class _Layers:
    """A synthetic op graph of 8 layers: 10 ms forward, 20 ms backward each."""

    num_blocks = 8

    def block_ops(self, i, phase):
        return [_Pass(f"L{i}_{phase}", phase, 10e-3 if phase == "fwd" else 20e-3, f"layers.{i}")]

    def pre_ops(self, phase):
        return []

    def post_ops(self, phase):
        return []


def _iteration_s(p: int, m: int, schedule: str, v: int) -> float:
    cfg = ParallelConfig(pipeline_model_parallel_size=p, pipeline_schedule=schedule,
                         virtual_pipeline_model_parallel_size=v if v > 1 else None, global_batch_size=m).resolve(p)
    trace = ModelTrace(graph=_Layers(), num_layers=8, hidden_size=16, seq_length=16, micro_batch_size=1,
                       params_pre=0, params_block=0, params_post=0)
    topo = build_system("dgx-a100", 1)
    programs = build_programs(trace, cfg).programs
    gpus = topo.gpus()
    run = Runtime(Cluster(topo), programs, placement={r: gpus[r] for r in range(p)}, host_launch_overhead_s=0.0).run()
    return run.end_time_s


@pytest.mark.parametrize("schedule,v,affine_rel",
                         [("1f1b", 1, 1e-9), ("gpipe", 1, 1e-9), ("interleaved_1f1b", 2, 2e-3)])
def test_free_communication_closed_form(schedule, v, affine_rel):
    """T(m) = (m + (p - 1) / v)(t_f + t_b) per stage (SC'21 eq. 1-2), affine: for 1F1B and GPipe the
    extrapolation from the plan's two counts is the full run's to 1e-9. Interleaved, the sends' latency
    settles slowly (the time per micro-batch grows 0.0601 to 0.0604 s from 12 to 48 micro-batches, each
    period's increase 0.88 of the last): -0.14 % at 56 from (16, 20), inside the 0.5 % bound."""
    p, m = 4, 56
    cfg = ParallelConfig(pipeline_model_parallel_size=p, pipeline_schedule=schedule,
                         virtual_pipeline_model_parallel_size=v if v > 1 else None, global_batch_size=m).resolve(p)
    (m1, m2) = plan_for(cfg, {}).simulated
    t1, t2, full = (_iteration_s(p, count, schedule, v) for count in (m1, m2, m))
    per_microbatch = (10e-3 + 20e-3) * 8 / p
    for count, t in ((m1, t1), (m2, t2), (m, full)):
        # (the rest is the sends' latency on the critical path: up to 0.4 % interleaved, whose micro-batches
        # cross 2p - 1 stage boundaries)
        assert t == pytest.approx((count + (p - 1) / v) * per_microbatch, rel=5e-3)
    assert t2 + (m - m2) * (t2 - t1) / (m2 - m1) == pytest.approx(full, rel=affine_rel)


def test_plot_titles_say_what_each_plot_shows(tmp_path, monkeypatch):
    """The timeline and links plots show the longer simulated run, the breakdown the extrapolated iteration;
    each title says which (and a run that was not extrapolated says neither)."""
    import plots.bars
    import plots.gantt
    import plots.links

    titles: dict[str, str] = {}
    monkeypatch.setattr(plots.gantt, "plot_gantt", lambda *a, title="", **k: titles.__setitem__("gantt", title))
    monkeypatch.setattr(plots.links, "plot_link_utilisation",
                        lambda *a, title="", **k: titles.__setitem__("links", title))
    monkeypatch.setattr(plots.bars, "plot_breakdown", lambda *a, title="", **k: titles.__setitem__("bars", title))
    rep = _report("1f1b", "auto")
    assert rep.metrics["simulation"]["steady_state"]["simulated_microbatches"] == [20]  # the period inside it
    write_plots(rep, tmp_path)
    assert titles["gantt"].endswith("(the simulated 20 of 56 micro-batches)")
    assert titles["links"].endswith("(the simulated 20 of 56 micro-batches)")
    assert titles["bars"].endswith("(extrapolated from the simulated 20 of 56 micro-batches)")
    write_plots(_report("interleaved", "auto"), tmp_path)
    assert titles["bars"].endswith("(extrapolated from the simulated 20 of 56 micro-batches)")
    write_plots(_report("1f1b", "off"), tmp_path)
    assert not any("simulated" in t for t in titles.values())
    assert "PP\u00a04 DP" in titles["gantt"] and "interleaved" not in titles["gantt"]  # no-break spaces
    write_plots(_report("interleaved", "off"), tmp_path)
    assert "x\u00a02 (interleaved) DP" in titles["gantt"]


def test_window_breakdown_and_link_integral_closed_form():
    """A window's split counts what the whole run's would inside it (gaps are bubble), and a link's bytes
    over a window are its step function's integral there."""
    from hwmodel.events import TraceEvent
    from scenarios.analysis import window_breakdown
    from scenarios.steady_state import _integral

    events = [TraceEvent(0, "compute", 0, "f0", "gemm", 0.0, 1.0, "fwd"),
              TraceEvent(0, "compute", 2, "b0", "gemm", 2.0, 3.0, "bwd"),
              TraceEvent(0, "comm", 1, "send", "send", 0.2, 1.5, xfer_start_s=0.5)]
    b = window_breakdown(events, {0: (0.25, 2.5)})[0]
    # compute [0.25, 1] + [2, 2.5]; communication [0.5, 1.5], hidden under compute [0.5, 1]; busy 1.75 of 2.25
    assert (b.compute_s, b.comm_total_s, b.comm_hidden_s) == pytest.approx((1.25, 1.0, 0.5))
    assert (b.exposed_comm_s, b.bubble_s, b.idle_s) == pytest.approx((0.5, 0.5, 0.0))
    assert b.compute_s + b.exposed_comm_s + b.bubble_s + b.idle_s == pytest.approx(2.25)
    timeline = [(1.0, 2.0), (3.0, 5.0), (4.0, 0.0), (6.0, 1.0)]
    assert _integral(timeline, 0.0, 10.0) == pytest.approx(2 * 2 + 5 * 1 + 1 * 4)
    assert _integral(timeline, 2.0, 3.5) == pytest.approx(2 * 1 + 5 * 0.5)
    assert _integral(timeline, 0.0, 0.5) == 0.0 and _integral(timeline, 4.5, 5.5) == 0.0
    assert _integral(timeline, 7.0, 8.0) == pytest.approx(1.0) and _integral([], 0.0, 1.0) == 0.0


def test_two_runs_where_no_window_repeats(monkeypatch):
    """Where the run's forwards one period apart are not evenly spaced (``steady_window`` finds none: the
    catalog's 145B, whose periods vary 1.908-2.052 s), both counts are simulated and extrapolated as before;
    the report line of a window run names the one count and the measured period."""
    import scenarios.steady_state as steady_state
    from scenarios.report import _steady_lines

    monkeypatch.setattr(steady_state, "steady_window", lambda *a, **k: None)
    spec = CASES["interleaved"]
    data = {"name": "interleaved", **{k: dict(v) for k, v in spec.items()}, "simulation": {"steady_state": "auto"}}
    rep = run_scenario(parse_scenario(data, source="interleaved"))
    steady = rep.metrics["simulation"]["steady_state"]
    assert steady["simulated_microbatches"] == [16, 20] and "window_microbatches" not in steady
    assert "simulated 16 and 20 of 56 micro-batches; the steady interleaved 1F1B period extrapolated" in \
        format_report(rep)
    assert rep.metrics["iteration_time_s"] == pytest.approx(_report("interleaved", "off").metrics[
        "iteration_time_s"], rel=TOL)
    line = _steady_lines({"steady_state": {"simulated_microbatches": [192], "of": 512, "window_microbatches": 64,
                                           "period": "interleaved 1F1B"}})[0]
    assert "simulated 192 of 512 micro-batches; the steady interleaved 1F1B period measured over 64 of them" in line
