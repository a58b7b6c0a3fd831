"""The search's TP-overlap, rank-order, uneven-stage and FSDP-with-PP knobs: parsing, enumeration by
hand, the emitted scenario, and the screen's handling of each."""

import pytest

from scenarios.cli import main
from scenarios.scenario import parse_scenario
from scenarios.search import Candidate, ScreenContext, enumerate_space, parse_knobs
from scenarios.search.driver import given_plan
from scenarios.search.space import ModelFacts
from scenarios.search.stages import balanced_ends, end_splits
from workload.zoo import get_model_config, with_overrides

SMALL = {"name": "small", "system": {"name": "dgx-h100", "nodes": 2},
         "model": {"name": "llama3-8b", "num_layers": 6},
         "parallel": {"tensor_model_parallel_size": 2},
         "training": {"global_batch_size": 16, "micro_batch_size": 1, "seq_length": 1024}}
PLAIN = ["parallel.context_parallel_size=1", "parallel.virtual_pipeline_model_parallel_size=1",
         "parallel.recompute_granularity=none", "training.micro_batch_size=1", "parallel.overlap_param_gather=false",
         "parallel.overlap_grad_reduce=false", "parallel.zero_stage=0"]


@pytest.fixture(scope="module")
def ctx():
    return ScreenContext(parse_scenario(SMALL))


def test_parse_new_knobs():
    k = parse_knobs(fix=["parallel.rank_order=tp-cp-ep-pp-dp", "parallel.num_layers_in_first_pipeline_stage=none"],
                    space=["parallel.tp_comm_overlap=true,false", "parallel.num_layers_in_last_pipeline_stage=2,3"])
    assert k == {"rank_order": ["tp-cp-ep-pp-dp"], "first_layers": [0], "tp_comm_overlap": [True, False],
                 "last_layers": [2, 3]}
    with pytest.raises(ValueError, match="parallel.rank_order: 'tp-dp-pp' is not an order of the axes"):
        parse_knobs(fix=["parallel.rank_order=tp-dp-pp"])
    with pytest.raises(ValueError, match="num_layers_in_first_pipeline_stage: 'x' is not a layer count"):
        parse_knobs(fix=["parallel.num_layers_in_first_pipeline_stage=x"])


@pytest.mark.parametrize("flag", [["--fix", "parallel.rank_order=dp-tp"], ["--space", "parallel.async_tp=yes"],
                                  ["--fix", "parallel.num_layers_in_last_pipeline_stage=-1"]])
def test_cli_bad_new_knob_exits_2(flag, capsys):
    assert main(["search", "llama3-8b-tp2-dgx-h100", *flag]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and flag[1].split("=")[0] in err


def test_balanced_ends_by_hand():
    assert balanced_ends(105, 8) == (10, 11)  # 6 middle stages of 14 = 84, 21 left for the ends
    assert balanced_ends(96, 8) == (0, 0)  # divides: even
    assert balanced_ends(7, 2) == (3, 4)


@pytest.mark.parametrize("layers, pp, splits", [
    (5, 4, [(0, 2), (2, 0)]),  # 1/1/1/2 and 2/1/1/1: ends larger than the middle
    (6, 4, [(2, 2), (1, 1)]),  # 2/1/1/2 and 1/2/2/1
    (32, 4, [(0, 0), (9, 7)]),  # even, and the last stage one layer fewer (the first one more)
    (126, 16, [(7, 7)]),  # Llama 3 405B: 7 + 14 x 8 + 7
    (126, 2, [(0, 0), (64, 62)]),
    (105, 8, [(0, 14), (14, 0), (10, 11)]),  # 13 x 7 + 14 either way, and balanced_ends' 10/14 x 6/11
    (5, 8, [(0, 0)]),  # more stages than layers: no split (the config says why)
    (12, 1, [(0, 0)])])
def test_end_splits_by_hand(layers, pp, splits):
    assert end_splits(layers, pp) == splits


@pytest.mark.parametrize("layers, pp, vpp, splits", [
    (126, 16, 2, [(6, 0), (0, 6)]),  # 63 pairs on 16 stages: 3 + 15 x 4, or 15 x 4 + 3, each x 2
    (10, 2, 2, [(4, 6), (6, 4)]),
    (96, 8, 4, [(0, 0)]),  # divides: even only (one chunk-group fewer would be 4 layers off)
    (126, 4, 4, [(0, 0)])])  # 4 does not divide 126: no split a stage's chunks share equally
def test_end_splits_interleaved_by_hand(layers, pp, vpp, splits):
    assert end_splits(layers, pp, vpp) == splits


@pytest.mark.parametrize("layers, pp, vpp", [(5, 4, 1), (6, 4, 1), (32, 4, 1), (126, 16, 1), (126, 4, 1), (105, 8, 1),
                                             (61, 16, 1), (7, 2, 1), (80, 8, 1), (3, 2, 1), (126, 16, 2), (126, 8, 2),
                                             (10, 2, 2), (90, 4, 3)])
def test_end_splits_are_megatrons_and_balanced(layers, pp, vpp):
    """Every split is one Megatron-Core accepts (the config's own check), sums to the layers, and keeps each
    stage within one layer (one group of vpp layers when interleaved) of the even share, but for
    balanced_ends' split and the last stage's one fewer."""
    from workload.parallel.config import ParallelConfig
    groups = layers // vpp
    lo, hi = groups // pp * vpp, -(-groups // pp) * vpp
    lists = []
    for first, last in end_splits(layers, pp, vpp):
        cfg = ParallelConfig(pipeline_model_parallel_size=pp, virtual_pipeline_model_parallel_size=vpp,
                             num_layers_in_first_pipeline_stage=first or None,
                             num_layers_in_last_pipeline_stage=last or None)
        chunks = cfg.stage_layers(layers)
        n = [sum(chunks[c * pp + s] for c in range(vpp)) for s in range(pp)]
        assert sum(n) == layers and min(chunks) >= 1 and len(set(n[1:-1])) <= 1
        assert all(lo <= k <= hi for k in n) or vpp == 1 and (
            n[-1] == n[-2] - 1 or (first, last) == balanced_ends(layers, pp))
        lists.append(tuple(n))
    assert len(lists) == len(set(lists)) >= 1  # each split once


def test_five_layers_on_four_stages_are_searched():
    """PP 4 on 5 layers: 2/1/1/1 (run's first=2) and 1/1/1/2 -- ends larger than the middle, which the
    search's one split (ends smaller) could not give."""
    facts = ModelFacts(num_layers=5, num_attention_heads=32, seq_length=1024, num_experts=0, world_size=8,
                       gpus_per_node=8, global_batch_size=8)
    model = with_overrides(get_model_config("llama3-8b"), num_layers=5, seq_length=1024)
    valid, _ = enumerate_space(facts, model, parse_knobs(fix=[*PLAIN, "parallel.pipeline_model_parallel_size=4",
                                                              "parallel.tensor_model_parallel_size=1"]))
    assert {(c.first_layers, c.last_layers) for c in valid} == {(2, 0), (0, 2)}


def test_enumeration_of_new_knobs_by_hand():
    facts = ModelFacts(num_layers=6, num_attention_heads=32, seq_length=1024, num_experts=0, world_size=16,
                       gpus_per_node=8, global_batch_size=16)
    model = with_overrides(get_model_config("llama3-8b"), num_layers=6, seq_length=1024)
    knobs = parse_knobs(fix=PLAIN, space=["parallel.tensor_model_parallel_size=1,2",
                                          "parallel.pipeline_model_parallel_size=1,4"])
    valid, rejected = enumerate_space(facts, model, knobs)
    # TP1, or TP2 with SP off or on with no / Megatron / async overlap: 1 + 4 = 5 variants; PP 1 once, PP 4
    # (6 layers: uneven ends 1 + 2 + 2 + 1 and 2 + 1 + 1 + 2) in both rank orders (DP 4 or 2 > 1), but async
    # TP only in torchtitan's one order: 5 + 2 x (5 x 2 - 1)
    assert len(valid) == 5 + 2 * (5 * 2 - 1) and not rejected
    pp4 = [c for c in valid if c.pp == 4]
    assert {(c.first_layers, c.last_layers) for c in pp4} == {(1, 1), (2, 2)}
    assert {c.rank_order for c in pp4} == {"tp-cp-ep-dp-pp", "tp-cp-ep-pp-dp"}
    assert sum(c.tp_comm_overlap for c in valid) == 1 + 2 * 2 and sum(c.async_tp for c in valid) == 1 + 2


def test_emitted_scenario_and_flags_carry_the_new_knobs():
    c = Candidate(tp=2, sp=True, pp=4, dp=2, tp_comm_overlap=True, rank_order="tp-cp-ep-pp-dp", first_layers=1,
                  last_layers=1)
    sec = c.parallel_section()
    assert sec["tp_comm_overlap"] and sec["rank_order"] == "tp-cp-ep-pp-dp"
    assert sec["num_layers_in_first_pipeline_stage"] == sec["num_layers_in_last_pipeline_stage"] == 1
    flags = c.flags()
    assert "--tp-comm-overlap" in flags and "--use-tp-pp-dp-mapping" in flags
    assert "--decoder-first-pipeline-num-layers 1 --decoder-last-pipeline-num-layers 1" in flags
    sc = parse_scenario({**SMALL, "parallel": sec})
    assert given_plan(sc, 16) == c


def test_screen_uneven_stages_slowest_stage_sets_the_pace(ctx):
    even = ctx.estimate(Candidate(tp=2, pp=2, dp=4))
    skew = ctx.estimate(Candidate(tp=2, pp=2, dp=4, first_layers=1, last_layers=5))
    assert even.fits and skew.fits
    assert skew.iteration_time_s > even.iteration_time_s  # 5 layers on the last stage instead of 3
    assert ctx.stage_layers(skew.candidate) == [1, 5]


def test_screen_fsdp_with_pp_memory_is_zero1(ctx):
    fsdp = ctx.memory(Candidate(pp=2, dp=8, zero=3))
    z1 = ctx.memory(Candidate(pp=2, dp=8, zero=1))
    assert fsdp.model_states == pytest.approx(z1.model_states)  # units stay unsharded under PP
    assert fsdp.activations > z1.activations  # FSDP is torchtitan's stack: PyTorch's cross entropy on fp32 logits
    assert ctx.estimate(Candidate(pp=2, dp=8, zero=3)).fits


def test_screen_rank_order_changes_the_communicators(ctx):
    a = ctx.groups(Candidate(pp=2, dp=8))
    b = ctx.groups(Candidate(pp=2, dp=8, rank_order="tp-cp-ep-pp-dp"))
    # default: DP inner (8 ranks in a node), PP across nodes; swapped: PP peers in a node, DP across both
    assert (a["dp"].key[0], b["dp"].key[0]) == (1, 2)
    assert (a["pp"].key[0], b["pp"].key[0]) == (2, 1)


def test_screen_tp_overlap_saves_time(ctx):
    plain = ctx.estimate(Candidate(tp=4, sp=True, dp=4)).iteration_time_s
    for kw in ({"tp_comm_overlap": True}, {"async_tp": True}):
        t = ctx.estimate(Candidate(tp=4, sp=True, dp=4, **kw)).iteration_time_s
        assert 0.7 * plain < t < plain
