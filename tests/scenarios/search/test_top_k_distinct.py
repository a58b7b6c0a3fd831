"""The top K simulated cover the space: round 1 the screen's best plan of each of its K/2 fastest shapes,
round 2 K/2 variants of the shapes that simulated fastest; ``--top-k`` stays the number simulated; the
longest simulations go to the pool first."""

import json

import pytest

from scenarios.cli import main
from scenarios.scenario import parse_scenario
from scenarios.search import driver
from scenarios.search.driver import VARIANTS_PER_SHAPE, pick_shapes, pick_variants, plan_shape, run_search
from scenarios.search.estimate import Estimate
from scenarios.search.space import Candidate


def est(c: Candidate, t: float) -> Estimate:
    return Estimate(c, t, t, 0.0, 0.0, 1e9, 80e9)


# one shape (TP4 CP8 PP64 DP8 mbs1) in 16 variants within 0.2 %, as the 405B search's top 20 were, then
# three other shapes
VARIANTS = [Candidate(tp=4, cp=8, pp=64, dp=8, sp=True, zero=z, overlap_grad_reduce=ogr, tp_comm_overlap=tpo,
                      rank_order=order)
            for z in (1, 2) for ogr in (True, False) for tpo in (True, False)
            for order in ("tp-cp-ep-dp-pp", "tp-cp-ep-pp-dp")]
A = [est(c, 10.0 * (1 + 0.0001 * i)) for i, c in enumerate(VARIANTS)]
OTHERS = [est(Candidate(tp=8, cp=4, pp=64, dp=8, sp=True), 10.05),
          est(Candidate(tp=4, cp=8, pp=32, dp=16, sp=True), 10.3),
          est(Candidate(tp=4, cp=8, pp=64, dp=8, mbs=2, sp=True), 10.4)]
FIT = sorted(A + OTHERS, key=lambda e: e.iteration_time_s)


def test_round_one_takes_one_plan_per_shape():
    assert pick_shapes(FIT, 3) == [A[0].candidate, OTHERS[0].candidate, OTHERS[1].candidate]
    assert pick_shapes(FIT, 10) == [A[0].candidate] + [e.candidate for e in OTHERS]  # 4 shapes in all
    assert len({plan_shape(c) for c in pick_shapes(FIT, 4)}) == 4


def test_round_two_takes_variants_of_the_fastest_simulated_shape_first():
    taken = pick_shapes(FIT, 2)
    # the simulation reverses the screen: the second shape is faster, but it has no other plan
    simulated = {A[0].candidate: {"iteration_time_s": 2.0}, OTHERS[0].candidate: {"iteration_time_s": 1.0}}
    assert pick_variants(FIT, simulated, 3, taken) == [e.candidate for e in A[1:4]]
    more = pick_variants(FIT, simulated, 6, taken)  # 4 variants at most, then the screen's next plan
    assert more == [e.candidate for e in A[1:1 + VARIANTS_PER_SHAPE]] + [A[5].candidate, A[6].candidate]
    failed = {A[0].candidate: {"error": "x"}, OTHERS[0].candidate: {"iteration_time_s": 1.0}}
    assert pick_variants(FIT, failed, 2, taken) == [A[1].candidate, A[2].candidate]  # no shape gives variants


def test_two_rounds_simulate_k_plans_and_the_extras_once(monkeypatch):
    calls = []

    def fake(base, cands, **_kw):
        cands = list(cands)
        calls.append(cands)
        return {c: {"iteration_time_s": 3.0 if c == A[0].candidate else 1.0} for c in cands}

    monkeypatch.setattr(driver, "simulate_plans", fake)
    base = Candidate(dp=8)
    out, picks = driver.simulate_top_k(None, FIT, 4, [base])
    assert calls[0] == [A[0].candidate, OTHERS[0].candidate, base]  # ceil(4 / 2) shapes, then the baseline
    assert calls[1] == [A[1].candidate, A[2].candidate]  # OTHERS[0] simulated fastest but has no variant
    assert len(picks) == 4 and set(out) == set(picks) | {base}
    assert [picks[c] for c in calls[0][:2]] == ["shape", "shape"] and picks[A[1].candidate] == "variant"
    calls.clear()
    out, picks = driver.simulate_top_k(None, FIT, 4, [base], rule="screen")
    assert calls == [[e.candidate for e in FIT[:4]] + [base]] and set(picks.values()) == {"screen"}


def test_unknown_rule_is_one_line():
    with pytest.raises(ValueError, match="top-k rule 'best': unknown; allowed: shapes, screen"):
        run_search(parse_scenario(GPT3), top_k_rule="best")


def test_cli_reports_the_rule_and_marks_the_picks(tmp_path, capsys, monkeypatch):
    """The report says how the K were picked and ``--json`` marks each simulated plan with its round. The
    simulation is replaced by a fixed time per plan (what the simulator predicts is tested elsewhere)."""
    def fake_simulate(base, cands, **_kw):
        return {c: {"iteration_time_s": 1.0 + 0.01 * c.mbs, "tokens_per_s": 1.0, "mfu": 0.1, "oom": False,
                    "breakdown": {"compute_s": 1.0, "bubble_s": 0.0, "exposed_comm_s": 0.0}} for c in cands}

    monkeypatch.setattr(driver, "simulate_plans", fake_simulate)
    sc = tmp_path / "small.toml"
    sc.write_text('name = "small"\n[system]\nname = "dgx-h100"\nnodes = 1\n[model]\nname = "llama3-8b"\n'
                  'num_layers = 2\n[parallel]\ntensor_model_parallel_size = 2\n[training]\nglobal_batch_size = 8\n'
                  'micro_batch_size = 1\nseq_length = 512\n', encoding="utf-8")
    out = tmp_path / "s.json"
    space = ["--space", "parallel.tensor_model_parallel_size=2", "--space", "parallel.pipeline_model_parallel_size=1",
             "--space", "parallel.context_parallel_size=1", "--space", "training.micro_batch_size=1,2"]
    assert main(["search", str(sc), *space, "--top-k", "4", "--workers", "1", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    doc = json.loads(out.read_text())
    assert doc["picked"] == 4 and doc["shapes_picked"] == 2
    rounds = {p["label"]: p["picked_as"] for p in doc["plans"] if "picked_as" in p}
    assert sorted(rounds.values()) == ["shape", "shape", "variant", "variant"]
    shape_of = {p["label"]: (p["plan"]["mbs"], p["plan"]["recompute"]) for p in doc["plans"]}
    firsts = {shape_of[lbl] for lbl, why in rounds.items() if why == "shape"}
    assert len(firsts) == 2  # two different shapes in round 1
    assert "top 4: the screen's fastest plan of each of its 2 fastest shapes" in text and "then 2 variants" in text
    assert main(["search", str(sc), *space, "--top-k", "4", "--workers", "1", "--top-k-rule", "screen",
                 "--json", str(out)]) == 0
    assert "top 4: the screen's 4 fastest plans" in capsys.readouterr().out
    assert {p.get("picked_as") for p in json.loads(out.read_text())["plans"]} == {None, "screen"}


GPT3 = {"name": "gpt3", "system": {"name": "dgx-a100", "nodes": 128}, "model": {"name": "gpt3-175b"}, "parallel": {},
        "training": {"global_batch_size": 1536, "micro_batch_size": 1}}


@pytest.mark.parametrize("plan, simulated", [
    # m 192, p 16, 1F1B: m1 = max(p, 16), m2 = m1 + p, simulated alone (half a period measured inside it)
    (Candidate(tp=8, sp=True, pp=16, dp=8), 32),
    (Candidate(tp=8, sp=True, pp=8, dp=16, mbs=2), 48),  # m 48: 16 + 24 is over 3/4 of it, so all 48 run
    (Candidate(tp=8, sp=True, pp=16, dp=8, mbs=5), 0),  # 1536 / (8 x 5) is no whole number: run refuses it
])
def test_simulated_microbatches(plan, simulated):
    from scenarios.scenario import parse_scenario
    from scenarios.search.simulate import simulated_microbatches

    assert simulated_microbatches(parse_scenario(GPT3), plan) == simulated


def test_the_longest_simulations_are_submitted_first(monkeypatch):
    """Tier 2 hands the executor the plans by simulated micro-batches, most first (longest processing
    time first: the pool's last task is a short one)."""
    from concurrent.futures import Future

    from scenarios.scenario import parse_scenario
    from scenarios.search import simulate as sim_mod

    submitted = []

    class Recorder:
        def submit(self, fn, data, *_args):
            submitted.append(data["parallel"]["pipeline_model_parallel_size"])
            fut: Future = Future()
            fut.set_result({"iteration_time_s": 1.0})
            return fut

    plans = [Candidate(tp=8, sp=True, pp=8, dp=16, mbs=2), Candidate(tp=8, sp=True, pp=32, dp=4),
             Candidate(tp=8, sp=True, pp=4, dp=32, mbs=4)]  # 48, 32 + 64 and 12 micro-batches simulated
    out = sim_mod.simulate_plans(parse_scenario(GPT3), plans, executor=Recorder())
    assert submitted == [32, 8, 4] and set(out) == set(plans)


def test_a_plan_above_max_tasks_is_refused_not_cached_and_reported(tmp_path):
    """A simulation is bounded as ``trainsim run --max-tasks`` bounds it: refused before it is built, with
    run's one line, kept out of the cache (a larger budget runs it) and named by the report."""
    from scenarios.search.report import format_picks
    from scenarios.search.simulate import candidate_data, simulate_plan, simulate_plans

    small = parse_scenario({"name": "small", "system": {"name": "dgx-h100", "nodes": 1},
                            "model": {"name": "llama3-8b", "num_layers": 2}, "parallel": {},
                            "training": {"global_batch_size": 8, "micro_batch_size": 1, "seq_length": 512}})
    plan = Candidate(tp=2, dp=4)
    r = simulate_plan(candidate_data(small, plan), max_tasks=10)
    assert r["over_budget"] and r["error"].startswith("not simulated: this run would simulate about")
    assert "above --max-tasks 10" in r["error"]
    cache = tmp_path / "c.jsonl"
    assert simulate_plans(small, [plan], cache=cache, max_tasks=10)[plan]["over_budget"]
    assert not cache.exists() or cache.read_text() == ""
    ran = simulate_plans(small, [plan], cache=cache)[plan]
    assert ran["iteration_time_s"] > 0 and len(cache.read_text().splitlines()) == 1

    class Res:  # what format_picks reads of a SearchResult
        picks = {plan: "screen"}
        simulated = {plan: r}
        info = {"picked": 1, "top_k_rule": "screen", "max_tasks": 10}

    assert format_picks(Res()).endswith("1 not simulated, above --max-tasks 10 estimated tasks (the screen's fastest "
                                        f"of them: {plan.short()}; raise --max-tasks to simulate them)")
