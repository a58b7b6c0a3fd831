"""The top K simulated are the screen's fastest *distinct* plans: a plan of the same shape as a faster pick
and a screen time within the margin is a near-duplicate, left out; ``--top-k`` stays the number simulated."""

import json
from dataclasses import replace

import pytest

from scenarios.cli import main
from scenarios.search import driver
from scenarios.search.driver import NEAR_DUPLICATE_MARGIN, pick_distinct, plan_shape
from scenarios.search.estimate import Estimate
from scenarios.search.space import Candidate


def est(c: Candidate, t: float) -> Estimate:
    return Estimate(c, t, t, 0.0, 0.0, 1e9, 80e9)


# one shape (TP4 CP8 PP64 DP8 mbs1) in 20 variants within 0.2 %, as the 405B search's top 20 were, then
# three other shapes
VARIANTS = [Candidate(tp=4, cp=8, pp=64, dp=8, sp=sp, zero=z, overlap_grad_reduce=ogr, tp_comm_overlap=tpo)
            for sp in (True, False) for z in (0, 1) for ogr in (True, False) for tpo in (True, False)][:20]
A = [est(c, 10.0 * (1 + 0.0001 * i)) for i, c in enumerate(VARIANTS)]
OTHERS = [est(Candidate(tp=8, cp=4, pp=64, dp=8, sp=True), 10.05),
          est(Candidate(tp=4, cp=8, pp=32, dp=16, sp=True), 10.3),
          est(Candidate(tp=4, cp=8, pp=64, dp=8, mbs=2, sp=True), 10.4)]
FIT = sorted(A + OTHERS, key=lambda e: e.iteration_time_s)


def test_variants_of_one_shape_take_one_slot():
    picks, folded = pick_distinct(FIT, 4)
    assert picks == [A[0].candidate] + [e.candidate for e in OTHERS]  # K = 4 distinct plans, screen order
    assert len({plan_shape(c) for c in picks}) == 4
    assert set(folded) == {e.candidate for e in A[1:]}  # all 19 variants walked past, each folded onto A[0]
    assert set(folded.values()) == {A[0].candidate}


def test_margin_zero_is_the_k_fastest():
    picks, folded = pick_distinct(FIT, 4, margin=0.0)
    assert picks == [e.candidate for e in FIT[:4]] and not folded


def test_a_variant_the_screen_prices_apart_is_kept():
    far = est(replace(VARIANTS[0], zero=3), 10.0 * (1 + 2 * NEAR_DUPLICATE_MARGIN))  # same shape, 2 % slower
    picks, folded = pick_distinct(sorted(A[:3] + [far], key=lambda e: e.iteration_time_s), 3)
    assert picks == [A[0].candidate, far.candidate]  # fewer than K only because the plans ran out
    assert folded == {A[1].candidate: A[0].candidate, A[2].candidate: A[0].candidate}


def test_another_shape_within_the_margin_is_kept():
    near = est(Candidate(tp=8, cp=4, pp=64, dp=8, sp=True), 10.0001)  # other shape, 0.001 % apart
    picks, _ = pick_distinct([A[0], near, A[1]], 2)
    assert picks == [A[0].candidate, near.candidate]


def test_cli_reports_the_rule_and_marks_the_skipped(tmp_path, capsys, monkeypatch):
    """The CLI's table simulates K distinct plans; the report says how they were picked, ``--json`` marks
    each plan left out with the pick it duplicates. The simulation is replaced by the screen's time (the
    rule is the driver's; what the simulator predicts is tested elsewhere)."""
    def fake_simulate(base, cands, **_kw):
        return {c: {"iteration_time_s": 1.0 + 0.01 * i, "tokens_per_s": 1.0, "mfu": 0.1, "bubble_s": 0.0,
                    "exposed_comm_s": 0.0, "oom": False} for i, c in enumerate(cands)}

    monkeypatch.setattr(driver, "simulate_plans", fake_simulate)
    sc = tmp_path / "small.toml"
    sc.write_text('name = "small"\n[system]\nname = "dgx-h100"\nnodes = 1\n[model]\nname = "llama3-8b"\n'
                  'num_layers = 2\n[parallel]\ntensor_model_parallel_size = 2\n[training]\nglobal_batch_size = 8\n'
                  'micro_batch_size = 1\nseq_length = 512\n', encoding="utf-8")
    out = tmp_path / "s.json"
    space = ["--space", "parallel.tensor_model_parallel_size=2", "--space", "parallel.pipeline_model_parallel_size=1",
             "--space", "parallel.context_parallel_size=1", "--space", "training.micro_batch_size=1,2"]
    assert main(["search", str(sc), *space, "--top-k", "3", "--workers", "1", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    doc = json.loads(out.read_text())
    assert doc["picked"] == 3 and doc["near_duplicates"] > 0
    fit = [p for p in doc["plans"] if p["fits"]]
    picked = [p for p in fit if "simulated" in p]
    skipped = [p for p in fit if "near_duplicate_of" in p]
    assert len(skipped) == doc["near_duplicates"]
    by_label = {p["label"]: p for p in fit}
    for p in skipped:  # each within the margin of a faster simulated plan of its shape, and not simulated
        twin = by_label[p["near_duplicate_of"]]
        assert "simulated" not in p and "simulated" in twin
        assert twin["screen_iteration_time_s"] <= p["screen_iteration_time_s"] <= \
            twin["screen_iteration_time_s"] * (1 + NEAR_DUPLICATE_MARGIN)
        assert twin["plan"]["tp"] == p["plan"]["tp"] and twin["plan"]["mbs"] == p["plan"]["mbs"]
    assert len(picked) >= 3
    assert "top 3: the screen's 3 fastest distinct plans" in text and f"{doc['near_duplicates']} skipped" in text
    assert main(["search", str(sc), *space, "--top-k", "3", "--workers", "1", "--near-duplicate-margin", "0",
                 "--json", str(out)]) == 0
    assert "top 3: the screen's 3 fastest plans" in capsys.readouterr().out
    assert json.loads(out.read_text())["near_duplicates"] == 0


@pytest.mark.parametrize("bad", ["-0.1", "nan"])
def test_cli_bad_margin_exits_2(bad, capsys):
    assert main(["search", "llama3-8b-tp2-dgx-h100", "--near-duplicate-margin", bad]) == 2
    assert "--near-duplicate-margin" in capsys.readouterr().err


GPT3 = {"name": "gpt3", "system": {"name": "dgx-a100", "nodes": 128}, "model": {"name": "gpt3-175b"}, "parallel": {},
        "training": {"global_batch_size": 1536, "micro_batch_size": 1}}


@pytest.mark.parametrize("plan, simulated", [
    (Candidate(tp=8, sp=True, pp=16, dp=8), 32 + 48),  # m 192, p 16: m1 = 2p, m2 = m1 + p (steady period)
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
        def submit(self, fn, data, source):
            submitted.append(data["parallel"]["pipeline_model_parallel_size"])
            fut: Future = Future()
            fut.set_result({"iteration_time_s": 1.0})
            return fut

    plans = [Candidate(tp=8, sp=True, pp=8, dp=16, mbs=2), Candidate(tp=8, sp=True, pp=16, dp=8),
             Candidate(tp=8, sp=True, pp=4, dp=32, mbs=4)]  # 48, 80 and 12 micro-batches simulated
    out = sim_mod.simulate_plans(parse_scenario(GPT3), plans, executor=Recorder())
    assert submitted == [16, 8, 4] and set(out) == set(plans)
