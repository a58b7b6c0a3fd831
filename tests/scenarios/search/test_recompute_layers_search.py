"""Megatron's k-layer recomputation in the search: the knobs, the block plans the driver adds (the fewest
layers that fit), the screen's time of a block plan, the flags and the emitted keys.

GPT-3 175B cut to 16 layers on one DGX A100 (TP 8, SP, micro-batch 16): without recomputation a GPU
needs more than the usable 85.1 GB, with full recomputation of every layer it fits."""

from dataclasses import replace

import pytest

from scenarios.scenario import parse_scenario
from scenarios.search import Candidate, ScreenContext, enumerate_space, parse_knobs
from scenarios.search.driver import add_block_recompute
from scenarios.search.space import check_knobs

SCENARIO = {"name": "k-layers", "system": {"name": "dgx-a100", "nodes": 1},
            "model": {"name": "gpt3-175b", "num_layers": 16}, "parallel": {},
            "training": {"global_batch_size": 32, "micro_batch_size": 16}}
PLAN = Candidate(tp=8, sp=True, pp=1, dp=1, mbs=16, recompute="full")
ONE_SHAPE = ["parallel.tensor_model_parallel_size=8", "parallel.pipeline_model_parallel_size=1",
             "parallel.sequence_parallel=true", "training.micro_batch_size=16", "parallel.context_parallel_size=1",
             "parallel.tp_comm_overlap=false", "parallel.async_tp=false"]


@pytest.fixture(scope="module")
def ctx():
    return ScreenContext(parse_scenario(SCENARIO))


def _fits(ctx, c):
    return not ctx.oom_reason(ctx.memory(c))


def test_knobs_parse_and_bad_values_are_one_line():
    k = parse_knobs(fix=["training.recompute_method=block"], space=["training.recompute_num_layers=0,2"])
    assert k == {"recompute_method": ["block"], "recompute_num_layers": [0, 2]}
    for fix, words in ((["training.recompute_method=layer"], "allowed: uniform, block"),
                       (["training.recompute_num_layers=-1"], "must be a non-negative integer"),
                       (["training.recompute_num_layers=x"], "is not an integer")):
        with pytest.raises(ValueError, match=None) as exc:
            parse_knobs(fix=fix)
        assert words in str(exc.value) and "training.recompute" in str(exc.value)


def test_knob_conflicts_are_refused_before_the_enumeration(ctx):
    with pytest.raises(ValueError, match="need parallel.recompute_granularity=full"):
        check_knobs(ctx.facts, parse_knobs(fix=["parallel.recompute_granularity=selective",
                                                "training.recompute_num_layers=2"]))
    with pytest.raises(ValueError, match="uniform needs training.recompute_num_layers"):
        check_knobs(ctx.facts, parse_knobs(fix=["training.recompute_method=uniform"]))


def test_driver_adds_the_block_plan_with_the_fewest_layers_that_fit(ctx):
    assert not _fits(ctx, replace(PLAN, recompute="none")) and _fits(ctx, PLAN)
    cands, _ = enumerate_space(ctx.facts, ctx.model_cfg, parse_knobs(fix=ONE_SHAPE), ctx.base_parallel)
    added = [c for c in add_block_recompute(ctx, cands, {}) if c not in set(cands)]
    assert added and all(c.recompute == "full" and c.recompute_method == "block" for c in added)
    for c in added:
        k = c.recompute_num_layers
        assert 1 <= k < 16 and _fits(ctx, c)
        assert not _fits(ctx, replace(c, recompute_num_layers=k - 1))  # block over 0 layers is none: no fit
    ours = next(c for c in added if replace(c, recompute_method="", recompute_num_layers=0) == PLAN)
    # faster than recomputing every layer: (16 - k) forwards fewer
    assert ctx.estimate(ours).iteration_time_s < ctx.estimate(PLAN).iteration_time_s


def test_screen_time_adds_one_forward_per_recomputed_layer(ctx):
    """Per micro-batch, block k costs k of the 16 layer forwards full recomputation adds (m = 2)."""
    def t(c):
        mem = ctx.memory(c)
        need, cap = ctx.hbm_limit(mem)
        return ctx._timed(c, mem, need, cap).iteration_time_s  # timed even where it does not fit
    none, full = t(replace(PLAN, recompute="none")), t(PLAN)
    for k in (0, 4, 16):
        block = t(replace(PLAN, recompute_method="block", recompute_num_layers=k))
        assert block - none == pytest.approx((full - none) * k / 16, rel=1e-9, abs=1e-12)
    uniform = t(replace(PLAN, recompute_method="uniform", recompute_num_layers=4))
    assert uniform == pytest.approx(full, rel=1e-12)


def test_space_of_layer_counts_is_enumerated_as_given(ctx):
    knobs = parse_knobs(fix=ONE_SHAPE, space=["training.recompute_num_layers=0,4,8"])
    cands, _ = enumerate_space(ctx.facts, ctx.model_cfg, knobs, ctx.base_parallel)
    kinds = {(c.recompute, c.recompute_method, c.recompute_num_layers) for c in cands}
    assert kinds == {("none", "", 0), ("full", "block", 4), ("full", "block", 8)}
    assert add_block_recompute(ctx, cands, knobs) == cands
    knobs = parse_knobs(fix=[*ONE_SHAPE, "training.recompute_method=uniform"],
                        space=["training.recompute_num_layers=3,4"])
    cands, rejected = enumerate_space(ctx.facts, ctx.model_cfg, knobs, ctx.base_parallel)
    assert {c.recompute_num_layers for c in cands} == {4}
    assert any("must divide the layers of every pipeline stage" in r.reason for r in rejected)


def test_flags_and_training_keys():
    c = replace(PLAN, recompute_method="block", recompute_num_layers=3)
    assert "--recompute-granularity full --recompute-method block --recompute-num-layers 3" in c.flags()
    assert "full-block3" in c.short()
    # Megatron-Core's TransformerConfig refuses full granularity with no method: every layer is uniform 1.
    assert "--recompute-granularity full --recompute-method uniform --recompute-num-layers 1" in replace(
        PLAN, recompute="full").flags()
    assert "--recompute-method" not in replace(PLAN, recompute="selective").flags()
    tr = c.training_section({"global_batch_size": 32})
    assert tr["recompute_method"] == "block" and tr["recompute_num_layers"] == 3
    sc = parse_scenario({**SCENARIO, "parallel": c.parallel_section(), "training": tr})
    assert sc.training["recompute_num_layers"] == 3
    cfg = c.config(32)
    assert (cfg.recompute_method, cfg.recompute_num_layers) == ("block", 3)
    # the scenario's own method is its plan's, not another plan's
    base = {"micro_batch_size": 1, "recompute_method": "uniform", "recompute_num_layers": 2}
    assert "recompute_method" not in replace(PLAN, recompute="selective").training_section(base)


def test_a_scenario_plan_the_model_cannot_take_is_left_out():
    """The scenario's own plan with stages that do not divide the model's layers (a model set with --set):
    the search runs without it instead of failing in the memory model."""
    from scenarios.search.driver import run_search

    sc = parse_scenario({"name": "odd", "system": {"name": "dgx-h100", "nodes": 1},
                         "model": {"name": "llama3-8b", "num_layers": 3},
                         "parallel": {"tensor_model_parallel_size": 4, "pipeline_model_parallel_size": 2},
                         "training": {"global_batch_size": 8, "micro_batch_size": 1, "seq_length": 512}})
    res = run_search(sc, fix=["parallel.tensor_model_parallel_size=8", "parallel.recompute_granularity=none",
                              "training.micro_batch_size=1", "parallel.async_tp=false"],
                     space=["parallel.pipeline_model_parallel_size=1"], top_k=1)
    assert res.given is None and res.best is not None
