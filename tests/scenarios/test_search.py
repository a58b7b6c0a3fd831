"""``trainsim search``: the space by hand, one rejection per rule, the screen's closed form, the cache,
the emitted scenario, bad knobs, no feasible plan."""

import json
import math

import pytest

from scenarios.cli import main
from scenarios.scenario import parse_scenario
from scenarios.search import Candidate, ScreenContext, enumerate_space, parse_knobs, screen
from scenarios.search import simulate as sim_mod
from scenarios.search.driver import kendall_tau
from scenarios.search.report import pareto_front, to_toml
from scenarios.search.screen import _StageTimes
from scenarios.search.simulate import candidate_data, scenario_key, simulate_plans
from scenarios.search.space import ModelFacts, check_plan
from workload.parallel.builder import build_programs
from workload.parallel.rank_trace import trace_rank
from workload.zoo import get_model_config, with_overrides

SMALL = {
    "name": "small", "system": {"name": "dgx-h100", "nodes": 1},
    "model": {"name": "llama3-8b", "num_layers": 2},
    "parallel": {"tensor_model_parallel_size": 2},
    "training": {"global_batch_size": 8, "micro_batch_size": 1, "seq_length": 512},
}
TIGHT = ["parallel.context_parallel_size=1", "parallel.virtual_pipeline_model_parallel_size=1",
         "parallel.recompute_granularity=none", "training.micro_batch_size=1", "parallel.overlap_param_gather=false",
         "parallel.sequence_parallel=false", "parallel.rank_order=tp-cp-ep-dp-pp", "parallel.tp_comm_overlap=false",
         "parallel.async_tp=false"]


@pytest.fixture(scope="module")
def small():
    return parse_scenario(SMALL)


@pytest.fixture(scope="module")
def ctx(small):
    return ScreenContext(small)


OLD_MEMORY_KEYS = {"peak_memory_bytes", "memory_capacity_bytes", "memory_need_bytes", "memory_verdict", "hbm_bytes",
                   "memory_bytes", "allocated_bytes", "reserved_bytes"}
"""Memory keys of earlier releases, each renamed to run --json's name (docs/DESIGN.md)."""


def json_keys(doc) -> set[str]:
    """Every key of a JSON document, at any depth."""
    if isinstance(doc, dict):
        return set(doc).union(*(json_keys(v) for v in doc.values()))
    if isinstance(doc, list):
        return set().union(*(json_keys(v) for v in doc))
    return set()


def facts(**kw):
    base = {"num_layers": 4, "num_attention_heads": 32, "seq_length": 512, "num_experts": 0, "world_size": 4,
            "gpus_per_node": 4, "global_batch_size": 8}
    return ModelFacts(**{**base, **kw})


def llama(**kw):
    return with_overrides(get_model_config("llama3-8b"), **{"num_layers": 4, "seq_length": 512, **kw})


def test_enumeration_count_by_hand():
    # TP x PP in {1, 2}^2 on 4 GPUs: (1,1) DP 4, (1,2) DP 2, (2,1) DP 2, (2,2) DP 1; ZeRO 0 or 1, except DP 1
    # where there is nothing to shard (one plan): 3 x 2 + 1 = 7. Even stages only (PP 2 on 4 layers also
    # has the 3/1 split, test_new_knobs.py).
    even = ["parallel.num_layers_in_first_pipeline_stage=none", "parallel.num_layers_in_last_pipeline_stage=none"]
    knobs = parse_knobs(fix=[*TIGHT, *even, "parallel.overlap_grad_reduce=false"],
                        space=["parallel.tensor_model_parallel_size=1,2", "parallel.pipeline_model_parallel_size=1,2",
                               "parallel.zero_stage=0,1"])
    valid, rejected = enumerate_space(facts(), llama(), knobs)
    assert len(valid) == 7 and not rejected
    assert sorted((c.tp, c.pp, c.dp, c.zero) for c in valid) == [
        (1, 1, 4, 0), (1, 1, 4, 1), (1, 2, 2, 0), (1, 2, 2, 1), (2, 1, 2, 0), (2, 1, 2, 1), (2, 2, 1, 0)]
    # the overlap knob doubles the plans that reduce gradients (6 of 7), FSDP adds one per DP > 1 shape
    # ((1,1), (2,1) and, FSDP with PP as torchtitan runs it, (1,2)); ZeRO-2 is DeepSpeed's, whose pipeline
    # engine refuses it: not on (1,2), with or without the overlap
    knobs = parse_knobs(fix=[*TIGHT, *even], space=["parallel.tensor_model_parallel_size=1,2",
                                                    "parallel.pipeline_model_parallel_size=1,2"])
    valid, rejected = enumerate_space(facts(), llama(), knobs)
    assert len(valid) == 3 * (3 * 2) + 1 + 3 - 2
    assert sum(r.count for r in rejected) == 2 and all("zero_stage=2 is DeepSpeed's" in r.reason for r in rejected)
    assert Candidate(pp=2, dp=2, zero=3) in valid


@pytest.mark.parametrize("plan, model_kw, facts_kw, reason", [
    (Candidate(tp=4, dp=1), {"num_attention_heads": 6, "num_query_groups": 6, "hidden_size": 768,
                             "ffn_hidden_size": 3072}, {}, "does not divide num_attention_heads=6"),
    (Candidate(pp=2, vpp=2, dp=2), {"num_layers": 6}, {}, "does not divide num_layers=6"),
    (Candidate(dp=4, mbs=4), {}, {}, "global_batch_size=8 is not divisible by micro_batch_size=4"),
    (Candidate(ep=2, dp=4), {}, {}, "needs a mixture-of-experts model"),
    (Candidate(pp=4, vpp=2, dp=1, mbs=4), {"num_layers": 8}, {}, "to be a multiple of pipeline_model_parallel_size=4"),
    (Candidate(dp=4, overlap_param_gather=True), {}, {}, "needs the distributed optimizer"),
    (Candidate(cp=4, dp=1), {"seq_length": 500}, {}, "must be divisible by 2 x context_parallel_size"),
    (Candidate(tp=1, sp=True, dp=4), {}, {}, "sequence_parallel=True needs tensor_model_parallel_size > 1"),
])
def test_each_rule_rejects_with_its_reason(plan, model_kw, facts_kw, reason):
    mc = llama(**model_kw)
    f = facts(num_layers=mc.num_layers, **facts_kw)
    why = check_plan(plan, f, mc, None)
    assert why is not None and reason in why
    assert "\n" not in why


def test_ep_on_a_dense_model_is_bad_input():
    """EP asked on a dense model is refused before enumerating, with run's reason (as one rejected family it
    was shown behind unrelated reasons)."""
    with pytest.raises(ValueError, match=r"expert_model_parallel_size=1,2: expert parallelism needs a "
                                         r"mixture-of-experts model; this one is dense \(allowed: 1\)"):
        enumerate_space(facts(), llama(), parse_knobs(
            fix=[*TIGHT, "parallel.tensor_model_parallel_size=1", "parallel.pipeline_model_parallel_size=1",
                 "parallel.zero_stage=0", "parallel.overlap_grad_reduce=false"],
            space=["parallel.expert_model_parallel_size=1,2"]))


@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_screen_single_rank_equals_sum_of_kernel_times(ctx, recompute):
    """One rank, no communication: the screen's iteration time is the sum of the solo times of every kernel
    the builder puts in the iteration (full-depth trace, m micro-batches, recomputation, optimizer)."""
    c = Candidate(dp=1, recompute=recompute)  # world 1: no group has a second rank
    est = screen(ctx, [c])[0]
    assert est.fits
    cfg = c.config(ctx.global_batch_size)
    trace = trace_rank(ctx.model_cfg, cfg, dtype="bf16")
    prog = build_programs(trace, cfg).programs[0]
    kernels = [t.op for t in prog.tasks if type(t.op).__name__ == "Compute"]
    assert len(kernels) == len(prog.tasks)  # nothing but kernels on one rank
    expected = sum(ctx.cost_model.cost(k).solo_time_s for k in kernels)
    assert est.iteration_time_s == pytest.approx(expected, rel=1e-9)
    assert est.bubble_s == 0 and est.exposed_comm_s == pytest.approx(0, abs=1e-12)


def test_screen_bubble_closed_form(ctx):
    """PP 2 x DP 4 (1F1B): the bubble is (p - 1) = 1 micro-batch time of the slowest stage, and the m
    micro-batches take at least m of those: m x bubble <= T - bubble."""
    est = ctx.estimate(Candidate(pp=2, dp=4))
    m = ctx.global_batch_size // 4
    assert est.bubble_s > 0
    assert m * est.bubble_s <= est.iteration_time_s - est.bubble_s + 1e-12
    c = Candidate(pp=2, dp=4)
    stage = _StageTimes(ctx, ctx.shard(c), c, ctx.groups(c))
    f0, b0, _, _ = stage.pass_times(1, first=True, last=False)
    f1, b1, _, _ = stage.pass_times(1, first=False, last=True)
    assert est.bubble_s == pytest.approx(max(f0 + b0, f1 + b1), rel=1e-12)


def test_screen_oom_names_the_term(small):
    big = parse_scenario({**SMALL, "model": {"name": "llama3-70b", "num_layers": 80}})
    est = ScreenContext(big).estimate(Candidate(dp=8))
    assert not est.fits and math.isnan(est.iteration_time_s)
    assert est.oom_reason.startswith("OOM by ") and "largest term optimizer states" in est.oom_reason


def test_parse_knobs_errors():
    with pytest.raises(ValueError, match="unknown key; allowed: parallel.tensor_model_parallel_size"):
        parse_knobs(fix=["parallel.tensor_parallel=2"])
    with pytest.raises(ValueError, match="recompute_granularity: unknown value 'some'"):
        parse_knobs(space=["parallel.recompute_granularity=none,some"])
    with pytest.raises(ValueError, match="not an integer"):
        parse_knobs(fix=["training.micro_batch_size=two"])
    assert parse_knobs(space=["parallel.sequence_parallel=true,false"]) == {"sp": [True, False]}


def test_parse_knobs_refuses_a_key_given_twice():
    """A second value set for one knob would silently replace the first (the pinned value lost)."""
    with pytest.raises(ValueError, match=r"^--space parallel.tensor_model_parallel_size: already given by --fix;"):
        parse_knobs(fix=["parallel.tensor_model_parallel_size=8"], space=["parallel.tensor_model_parallel_size=1,2"])
    with pytest.raises(ValueError, match="already given by --fix"):
        parse_knobs(fix=["parallel.tensor_model_parallel_size=2", "parallel.tensor_model_parallel_size=4"])


def test_parse_knobs_takes_toml_strings_as_run_set_does():
    """``--fix parallel.recompute_granularity='"none"'`` (a TOML string, as ``run --set`` needs) equals the bare
    word; a quoted non-string value is still checked."""
    assert parse_knobs(fix=['parallel.recompute_granularity="none"']) == parse_knobs(
        fix=["parallel.recompute_granularity=none"])
    assert parse_knobs(space=["parallel.recompute_granularity='none', \"full\""]) == {"recompute": ["none", "full"]}
    with pytest.raises(ValueError, match="not an integer"):
        parse_knobs(fix=['training.micro_batch_size="two"'])
    # as ``run --set parallel.tensor_model_parallel_size='"2"'`` refuses a string, so does the search
    with pytest.raises(ValueError, match=r"tensor_model_parallel_size: '2' is quoted, a TOML string, not an integer"):
        parse_knobs(fix=['parallel.tensor_model_parallel_size="2"'])
    with pytest.raises(ValueError, match="not a boolean"):
        parse_knobs(space=["parallel.sequence_parallel='true'"])
    assert parse_knobs(fix=['parallel.num_layers_in_first_pipeline_stage="none"']) == {"first_layers": [0]}


def test_cache_key_is_canonical(small):
    c = Candidate(tp=2, dp=4, sp=True)
    a = candidate_data(small, c)
    b = json.loads(json.dumps(a))
    b["name"], b["description"] = "other", ""
    b["parallel"] = dict(reversed(list(b["parallel"].items())))
    assert scenario_key(a) == scenario_key(b)
    assert scenario_key(a) != scenario_key(candidate_data(small, Candidate(tp=2, dp=4)))


def test_cache_resumes(small, tmp_path, monkeypatch):
    cache = tmp_path / "c.jsonl"
    plans = [Candidate(tp=2, dp=4, sp=True), Candidate(tp=8, dp=1, sp=True)]
    first = simulate_plans(small, plans[:1], cache=cache)
    assert first[plans[0]]["iteration_time_s"] > 0
    with cache.open("a") as fh:
        fh.write('{"key": "torn')  # an interrupted write
    calls = []
    real = sim_mod.simulate_plan
    monkeypatch.setattr(sim_mod, "simulate_plan", lambda d, s="", *a: calls.append(d) or real(d, s, *a))
    again = simulate_plans(small, plans, cache=cache)
    assert len(calls) == 1 and calls[0]["parallel"]["tensor_model_parallel_size"] == 8  # only the new plan
    assert again[plans[0]] == first[plans[0]]
    # the new record went on a line of its own, after the torn one: a third search simulates nothing
    assert len(sim_mod.load_cache(cache)) == 2
    calls.clear()
    assert simulate_plans(small, plans, cache=cache) == again and not calls


def test_stale_cache_records_are_simulated_again(small, tmp_path, monkeypatch):
    """A record of an older trainsim (no schema, its old key names) is not read back: its plan is simulated
    again, and the new record, of this schema, is what a resumed search reads."""
    cache = tmp_path / "c.jsonl"
    plan = Candidate(tp=2, dp=4, sp=True)
    key = scenario_key(candidate_data(small, plan))
    old = {"iteration_time_s": 1.0, "peak_memory_bytes": 1e9, "bubble_s": 0.0}
    cache.write_text(json.dumps({"key": key, "plan": plan.to_dict(), "result": old}) + "\n")
    assert sim_mod.load_cache(cache) == {} and sim_mod.stale_records(cache) == 1
    calls = []
    real = sim_mod.simulate_plan
    monkeypatch.setattr(sim_mod, "simulate_plan", lambda d, s="", *a: calls.append(d) or real(d, s, *a))
    got = simulate_plans(small, [plan], cache=cache)[plan]
    assert len(calls) == 1 and got["iteration_time_s"] != 1.0 and "peak_memory_bytes" not in got
    assert sim_mod.stale_records(cache) == 0 and sim_mod.load_cache(cache)[key] == got
    assert simulate_plans(small, [plan], cache=cache)[plan] == got and len(calls) == 1


def _values(doc, key=""):
    """(key, value) of every scalar of a JSON document, at any depth."""
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _values(v, k)
    elif isinstance(doc, list):
        for v in doc:
            yield from _values(v, key)
    else:
        yield key, doc


def test_cli_search_emits_a_runnable_scenario(tmp_path, capsys):
    scen = tmp_path / "small.toml"
    scen.write_text(to_toml(SMALL))
    out = tmp_path / "best.toml"
    js = tmp_path / "s.json"
    cache = tmp_path / "c.jsonl"  # one plan's record from an older trainsim: said once, simulated again
    stale = {"key": "0" * 64, "plan": {}, "result": {"iteration_time_s": 1.0, "peak_memory_bytes": 1e9}}
    cache.write_text(json.dumps(stale) + "\n")
    rc = main(["search", str(scen), "--top-k", "2", "--workers", "1", "--emit-scenario", str(out), "--json", str(js),
               *[f"--fix={f}" for f in TIGHT], "--fix", "parallel.pipeline_model_parallel_size=1",
               "--space", "parallel.tensor_model_parallel_size=2,8", "--space", "parallel.zero_stage=1,3",
               "--cache", str(cache)])
    text, err = capsys.readouterr()
    assert err.count("written by an older trainsim") == 1 and "1 cached plan " in err
    # plain DDP (TP 1) is outside --space TP 2,8: shown for comparison only
    assert rc == 0 and "best:" in text and "[baseline, outside --fix/--space: for comparison only]" in text
    doc = json.loads(js.read_text())
    best_time = min(p["simulated"]["iteration_time_s"] for p in doc["plans"] if "simulated" in p)
    assert all(p["fits"] or p["oom_reason"] for p in doc["plans"])
    capsys.readouterr()
    assert main(["run", str(out), "--json", str(tmp_path / "run.json")]) == 0
    run = json.loads((tmp_path / "run.json").read_text())
    assert run["iteration_time_s"] == pytest.approx(best_time, rel=1e-9)
    # one memory vocabulary: search's JSON names each figure as run's does, with run's value
    assert not json_keys(doc) & OLD_MEMORY_KEYS and not json_keys(run) & OLD_MEMORY_KEYS
    best = next(p for p in doc["plans"] if p.get("simulated", {}).get("iteration_time_s") == best_time)
    for k in ("peak_allocated_bytes", "peak_reserved_bytes"):
        assert best["simulated"][k] == best[k] == run[k] == run["memory"][k] > 0
    for k in ("verdict_need_bytes", "verdict_capacity_bytes"):
        assert best[k] == run["memory"][k]
    assert doc["usable_hbm_bytes"] == run["memory"]["usable_hbm_bytes"] == best["verdict_capacity_bytes"]
    # one vocabulary for a run's figures: the simulated record is run --json's, names and nesting
    sim = best["simulated"]
    for k in ("breakdown", "overlap", "simulation"):
        assert set(sim[k]) == set(run[k]), k
    assert sim["breakdown"] == pytest.approx(run["breakdown"], rel=1e-9)
    assert sim["simulation"]["mode"] == run["simulation"]["mode"]
    s0, r0 = sim["busiest_links"][0], run["busiest_links"][0]  # searched without link timelines: no peak
    assert set(s0) == set(r0) and s0["peak_utilisation"] is None and r0["peak_utilisation"] > 0
    for k in ("link", "links", "kind", "capacity_Bps", "carried_bytes"):
        assert s0[k] == r0[k], k
    assert s0["mean_utilisation"] == pytest.approx(r0["mean_utilisation"], rel=1e-9) and 0 < s0["mean_utilisation"] <= 1
    # bytes whole, and no float noise where a figure is zero
    for doc_ in (doc, run):
        assert all(isinstance(v, int) for k, v in _values(doc_) if k.endswith("_bytes") and v is not None)
        assert all(v == 0 or abs(v) > 1e-12 for _, v in _values(doc_) if isinstance(v, float))
    assert run["overlap"]["compute_slowdown"] >= 0
    base = doc["speedups"]
    assert base["speedup_over_baseline"] >= 1.0  # never slower than the printed baseline


@pytest.mark.parametrize("flag", [["--fix", "parallel.tensor_parallel=2"], ["--space", "parallel.zero_stage=0,5"],
                                  ["--fix", "parallel.sequence_parallel=maybe"]])
def test_cli_bad_knob_exits_2(flag, capsys):
    assert main(["search", "llama3-8b-tp2-dgx-h100", *flag]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and flag[1].split("=")[0] in err


def test_cli_no_feasible_plan_exits_3(capsys):
    rc = main(["search", "gpt3-175b-16x-dgx-a100", "--set", "system.nodes=1", "--set", "training.global_batch_size=8"])
    err = capsys.readouterr().err
    assert rc == 3 and "closest:" in err and "it lacks" in err and "GB of HBM per GPU" in err


def test_kendall_tau_and_pareto():
    assert kendall_tau([1, 2, 3, 4], [10, 20, 30, 40]) == 1.0
    assert kendall_tau([1, 2, 3, 4], [40, 30, 20, 10]) == -1.0
    assert kendall_tau([1, 2, 3], [1, 3, 2]) == pytest.approx(1 / 3)
    assert pareto_front([(1, 5), (2, 3), (3, 4), (4, 1)]) == [0, 1, 3]


def test_dask_executor_optional():
    pytest.importorskip("distributed")
    from distributed import Client, LocalCluster

    from scenarios.search.simulate import make_executor

    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False) as cluster:
        ex, close = make_executor("dask://" + cluster.scheduler_address.removeprefix("tcp://"), 1)
        try:
            assert ex.submit(sum, [1, 2]).result() == 3
        finally:
            close()
        assert Client  # imported lazily by make_executor, present when the extra is installed


def test_table_times_have_three_significant_figures():
    """Plans 0.5 ms apart at 24 ms print apart (whole milliseconds printed both as 24); from 100 ms whole ms."""
    from scenarios.search.report import _ms

    assert [_ms(t) for t in (0.02418, 0.02467, 0.00512, 0.000523, 0.1234, 1.5)] == \
        ["24.2", "24.7", "5.12", "0.523", "123", "1,500"]
    assert _ms(None) == _ms(float("nan")) == "-"


def test_a_space_without_a_valid_plan_names_its_reasons(capsys):
    """Async TP pinned beside the distributed optimizer: most plans fail for want of SP, but those with SP
    fail for the stack conflict, which the one line must name too (it named only the first)."""
    assert main(["search", "llama3-8b-tp2-dgx-h100", "--fix", "parallel.async_tp=true",
                 "--fix", "parallel.zero_stage=1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "async_tp=true needs sequence_parallel=true" in err
    assert "conflicts with use_distributed_optimizer / zero_stage 1-2" in err and "(234 plans)" in err


@pytest.mark.parametrize("what", ["missing folder", "a --json file", "a folder"])
def test_cli_bad_cache_path_exits_2_before_any_work(what, tmp_path, capsys):
    """A --cache the search could not append to, or one that is not a cache (a --json output given by
    mistake, which the search would append records to), is refused in one line before minutes of search."""
    js = tmp_path / "s.json"
    js.write_text('{\n "plans": []\n}\n')
    path = {"missing folder": tmp_path / "no" / "c.jsonl", "a --json file": js, "a folder": tmp_path}[what]
    assert main(["search", "llama3-8b-tp2-dgx-h100", "--cache", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"--cache {path}" in err
    assert js.read_text() == '{\n "plans": []\n}\n'
