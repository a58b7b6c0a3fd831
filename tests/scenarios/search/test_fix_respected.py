"""``--fix``/``--space`` bind the recommendation, a pinned rank order is emitted, an empty space and the
knobs ``run`` refuses are bad input (exit 2), and the report names the HBM figure it checks."""

import pytest
import tomllib

from scenarios.cli import main
from scenarios.scenario import parse_scenario
from scenarios.search import ScreenContext, enumerate_space, parse_knobs
from scenarios.search.driver import run_search
from scenarios.search.report import emit_scenario, format_search
from scenarios.search.space import ModelFacts, satisfies
from workload.allocator import usable_hbm_bytes
from workload.zoo import get_model_config, with_overrides

ONE_NODE = {"name": "one-node", "system": {"name": "dgx-h100", "nodes": 1},
            "model": {"name": "llama3-8b", "num_layers": 4},
            "parallel": {"tensor_model_parallel_size": 2, "sequence_parallel": True, "use_distributed_optimizer": True,
                         "recompute_granularity": "selective", "overlap_grad_reduce": True,
                         "overlap_param_gather": True},
            "training": {"global_batch_size": 8, "micro_batch_size": 1, "seq_length": 1024}}
# a small space: PP 2 pinned, everything else but TP plain
PP2 = ["parallel.pipeline_model_parallel_size=2", "parallel.context_parallel_size=1",
       "parallel.virtual_pipeline_model_parallel_size=1", "parallel.recompute_granularity=none",
       "training.micro_batch_size=1", "parallel.overlap_param_gather=false", "parallel.overlap_grad_reduce=false",
       "parallel.zero_stage=0", "parallel.sequence_parallel=false", "parallel.tensor_model_parallel_size=2,4"]
FACTS = ModelFacts(num_layers=4, num_attention_heads=32, seq_length=1024, num_experts=0, world_size=8,
                   gpus_per_node=8, global_batch_size=8)


@pytest.fixture(scope="module")
def searched():
    sc = parse_scenario(ONE_NODE)
    ctx = ScreenContext(sc)
    return ctx, run_search(sc, fix=PP2[:-1], space=PP2[-1:], top_k=2, context=ctx)


def test_scenario_plan_outside_the_fix_is_never_the_recommendation(searched, tmp_path):
    _, res = searched
    knobs = parse_knobs(PP2[:-1], PP2[-1:])
    given = res.given
    assert given is not None and given.pp == 1 and given in res.outside
    # the scenario's own plan (PP 1, no bubble) is the fastest simulated: it would win without the rule
    assert res.simulated[given]["iteration_time_s"] < res.best[1]["iteration_time_s"]
    assert res.best[0].pp == 2 and satisfies(res.best[0], knobs)
    text = format_search(res)
    assert "[scenario's plan, outside --fix/--space: for comparison only]" in text
    assert f"best: {res.best[0].flags()}" in text
    emitted = tomllib.loads(emit_scenario(res, tmp_path / "w.toml").read_text())
    assert emitted["parallel"]["pipeline_model_parallel_size"] == 2


def test_report_names_the_hbm_figure_run_uses(searched):
    ctx, res = searched
    usable = usable_hbm_bytes(ctx.gpu)
    assert res.hbm_bytes == usable  # H100: 85.0 GB (80 GiB less the driver's share), not the datasheet's 80 GB
    head = format_search(res).splitlines()[0]
    assert f"fit in {usable / 1e9:.1f} GB usable HBM (reserved + CUDA context + NCCL buffers, as run checks)" in head
    assert "datasheet" not in head


def test_pinned_rank_order_is_emitted_and_shown():
    model = with_overrides(get_model_config("llama3-8b"), num_layers=4, seq_length=1024)
    knobs = parse_knobs(fix=[*PP2[1:-1], "parallel.rank_order=tp-cp-ep-pp-dp",
                             "parallel.pipeline_model_parallel_size=1", "parallel.tensor_model_parallel_size=2"])
    valid, _ = enumerate_space(FACTS, model, knobs)
    assert len(valid) == 1  # TP 2, PP 1, DP 4: lays ranks out as the default order does, kept as pinned
    (c,) = valid
    assert c.parallel_section()["rank_order"] == "tp-cp-ep-pp-dp"
    assert "--use-tp-pp-dp-mapping" in c.flags()


def test_empty_space_is_bad_input_naming_the_value(capsys):
    assert main(["search", "llama3-8b-tp2-dgx-h100", "--space", "parallel.tensor_model_parallel_size=3"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert "parallel.tensor_model_parallel_size=3 divides neither the 8 GPUs nor the 32 attention heads" in err


def test_knobs_validated_like_run():
    with pytest.raises(ValueError, match="num_layers_in_first_pipeline_stage: 0 must be a positive integer"):
        parse_knobs(fix=["parallel.num_layers_in_first_pipeline_stage=0"])
    assert parse_knobs(fix=["parallel.num_layers_in_first_pipeline_stage=none"]) == {"first_layers": [0]}
    assert parse_knobs(fix=["parallel.recompute_granularity=selective_op"]) == {"recompute": ["selective_op"]}
    with pytest.raises(ValueError, match="recompute_granularity: unknown value 'op'; allowed: none, selective, "
                                         "full, selective_op"):
        parse_knobs(fix=["parallel.recompute_granularity=op"])


def test_fp8_recipe_on_a_bf16_scenario_is_bad_input(capsys, tmp_path):
    out = tmp_path / "em.toml"
    assert main(["search", "llama3-8b-tp2-dgx-h100", "--set", "model.num_layers=4", "--set",
                 "training.seq_length=1024", "--top-k", "1", "--space", "training.fp8_recipe=delayed",
                 "--emit-scenario", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and not out.exists()
    assert err.endswith("training.fp8_recipe applies to training.dtype = 'fp8' (this scenario: bf16)")


def test_expert_parallelism_on_a_dense_model_is_bad_input(capsys):
    """As run says it: the search named an unrelated divisibility rule as its most common reason."""
    assert main(["search", "llama3-8b-tp2-dgx-h100", "--set", "model.num_layers=4", "--top-k", "1",
                 "--space", "parallel.expert_model_parallel_size=2,4"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert err.endswith("parallel.expert_model_parallel_size=2,4: expert parallelism needs a mixture-of-experts "
                        "model; this one is dense (allowed: 1)")


def test_fixed_deepspeed_zero_impl_keeps_only_zero3_deepspeed_plans():
    model = with_overrides(get_model_config("llama3-8b"), num_layers=4, seq_length=1024)
    small = ["parallel.context_parallel_size=1", "parallel.virtual_pipeline_model_parallel_size=1",
             "training.micro_batch_size=1", "parallel.recompute_granularity=none"]
    valid, rejected = enumerate_space(FACTS, model, parse_knobs(fix=[*small, "parallel.zero_impl=deepspeed"]))
    assert valid and all(c.zero == 3 and c.zero_impl == "deepspeed" and c.pp == 1 for c in valid)
    assert {c.tp for c in valid} == {1, 2, 4}  # TP 8 leaves no data-parallel group to shard over
    assert all("DSZ3" in c.short().split() for c in valid)
    assert all("--zero-stage 3 [DeepSpeed]" in c.flags() for c in valid)
    assert any("needs pipeline_model_parallel_size = 1" in r.reason for r in rejected)
    # the scenario's zero_impl is only the default of ZeRO-3 plans: the other stages stay in the space
    ds_facts = ModelFacts(**{**FACTS.__dict__, "zero_impl": "deepspeed"})
    stages = {c.zero for c in enumerate_space(ds_facts, model, parse_knobs(fix=small))[0]}
    assert stages == {0, 1, 2, 3}
    with pytest.raises(ValueError, match=r"^parallel.zero_impl=deepspeed is DeepSpeed's ZeRO stage 3: it needs "
                                         r"parallel.zero_stage=3, got 1$"):
        enumerate_space(FACTS, model, parse_knobs(fix=["parallel.zero_impl=deepspeed", "parallel.zero_stage=1"]))


def test_pinned_async_tp_and_tp_overlap_name_their_conflict(capsys):
    assert main(["search", "llama3-8b-tp2-dgx-h100", "--fix", "parallel.async_tp=true",
                 "--fix", "parallel.tp_comm_overlap=true"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert err.endswith("parallel.async_tp=true (torchtitan) conflicts with parallel.tp_comm_overlap=true "
                        "(Megatron-Core); choose one")
