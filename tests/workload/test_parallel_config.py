"""ParallelConfig validation and rank layout (Megatron's RankGenerator order)."""

from types import SimpleNamespace

import pytest

from workload.parallel.config import ParallelConfig
from workload.parallel.placement import Layout


def test_dp_derived_and_microbatches():
    c = ParallelConfig(tensor_model_parallel_size=8, pipeline_model_parallel_size=8, micro_batch_size=1,
                       global_batch_size=1536).resolve(1024)
    assert c.dp == 16
    assert c.num_microbatches == 96


def test_tp_innermost_layout():
    c = ParallelConfig(tensor_model_parallel_size=4, pipeline_model_parallel_size=2).resolve(16)
    lay = Layout(c)
    assert lay.group(0, "tp") == (0, 1, 2, 3)
    assert lay.group(0, "dp") == (0, 4)
    assert lay.group(0, "pp") == (0, 8)
    assert lay.coords(13) == {"tp": 1, "cp": 0, "dp": 1, "pp": 1, "ep": 0}
    assert all(lay.rank(**lay.coords(r)) == r for r in range(16))


def test_expert_groups_carved_from_dp():
    c = ParallelConfig(expert_model_parallel_size=2).resolve(8)
    lay = Layout(c)
    assert lay.group(0, "ep") == (0, 1)
    assert lay.group(0, "edp") == (0, 2, 4, 6)


@pytest.mark.parametrize("kwargs, world, msg", [
    ({"tensor_model_parallel_size": 3}, 8, "world_size=8 is not divisible"),
    ({"data_parallel_size": 3}, 8, "world_size=8"),
    ({"micro_batch_size": 2, "global_batch_size": 6}, 2, "global_batch_size=6 is not divisible"),
    ({"pipeline_model_parallel_size": 2, "virtual_pipeline_model_parallel_size": 2, "global_batch_size": 3}, 2,
     "multiple of pipeline_model_parallel_size=2"),
])
def test_resolve_errors_name_fields(kwargs, world, msg):
    with pytest.raises(ValueError, match=msg):
        ParallelConfig(**kwargs).resolve(world)


@pytest.mark.parametrize("kwargs, msg", [
    ({"recompute_granularity": "fulll"}, "recompute_granularity.*none, selective, full"),
    ({"sequence_parallel": True}, "sequence_parallel"),
    ({"zero_stage": 4}, "zero_stage"),
    ({"tensor_model_parallel_size": 0}, "tensor_model_parallel_size"),
    ({"rank_order": "tp-dp-pp"}, "rank_order"),
    ({"virtual_pipeline_model_parallel_size": 2}, "pipeline_model_parallel_size > 1"),
])
def test_field_errors(kwargs, msg):
    with pytest.raises(ValueError, match=msg):
        ParallelConfig(**kwargs)


def test_model_divisibility():
    model = SimpleNamespace(num_attention_heads=12, hidden_size=768, ffn_hidden_size=3072, num_layers=10,
                            seq_length=1024, num_query_groups=12)
    with pytest.raises(ValueError, match="tensor_model_parallel_size=5 does not divide num_attention_heads=12"):
        ParallelConfig(tensor_model_parallel_size=5).validate_model(model)
    with pytest.raises(ValueError, match="does not divide num_layers=10"):
        ParallelConfig(pipeline_model_parallel_size=4).validate_model(model)
    uneven = ParallelConfig(pipeline_model_parallel_size=4, num_layers_in_first_pipeline_stage=1,
                            num_layers_in_last_pipeline_stage=3)
    assert uneven.stage_layers(10) == [1, 3, 3, 3]


def test_uneven_stages_interleaved_split_per_chunk():
    """Megatron-Core's rule with virtual stages: each stage's count a multiple of the chunks per stage,
    each chunk an equal share; chunk c of stage s is virtual stage c * pp + s (the model's order)."""
    cfg = ParallelConfig(pipeline_model_parallel_size=4, virtual_pipeline_model_parallel_size=2,
                         num_layers_in_first_pipeline_stage=2, num_layers_in_last_pipeline_stage=4)
    assert cfg.stage_layers(18) == [1, 3, 3, 2, 1, 3, 3, 2]  # first 2, middle 6 each, last 4
    with pytest.raises(ValueError, match=r"num_layers_in_first_pipeline_stage = 3 is not a multiple of "
                                         r"virtual_pipeline_model_parallel_size=2"):
        ParallelConfig(pipeline_model_parallel_size=4, virtual_pipeline_model_parallel_size=2,
                       num_layers_in_first_pipeline_stage=3, num_layers_in_last_pipeline_stage=1).stage_layers(16)
    with pytest.raises(ValueError, match=r"the middle stages' layers = 5 is not a multiple"):
        ParallelConfig(pipeline_model_parallel_size=4, virtual_pipeline_model_parallel_size=2,
                       num_layers_in_first_pipeline_stage=2, num_layers_in_last_pipeline_stage=2).stage_layers(14)


def test_uneven_split_messages_name_the_condition_that_fails():
    """Too few layers for the middle stages, or a count they cannot share evenly: each said as it is (65 layers
    for two stages was reported as their needing at least one layer each)."""
    cfg = ParallelConfig(pipeline_model_parallel_size=4, num_layers_in_first_pipeline_stage=30,
                         num_layers_in_last_pipeline_stage=31)
    with pytest.raises(ValueError, match=r"leaves 65 layers for the other 2 stages \(pipeline_model_parallel_size=4\), "
                                         r"which split them evenly, and 65 is not a multiple of 2$"):
        cfg.stage_layers(126)
    cfg = ParallelConfig(pipeline_model_parallel_size=4, num_layers_in_first_pipeline_stage=60,
                         num_layers_in_last_pipeline_stage=65)
    with pytest.raises(ValueError, match=r"leaves 1 layers for the other 2 stages .*need at least one layer each$"):
        cfg.stage_layers(126)


def test_tp_not_dividing_the_vocabulary_is_a_config_error_not_a_trace_failure():
    """BERT-Large's 30,522 tokens: the vocab-parallel embedding shards V unpadded, so TP 4 is refused up front
    (the search lists it among the rejected plans instead of aborting), TP 2 passes."""
    model = SimpleNamespace(num_attention_heads=16, ffn_hidden_size=4096, num_layers=24, seq_length=512,
                            num_query_groups=16, vocab_size=30522)
    with pytest.raises(ValueError, match="tensor_model_parallel_size=4 does not divide vocab_size=30522"):
        ParallelConfig(tensor_model_parallel_size=4).validate_model(model)
    ParallelConfig(tensor_model_parallel_size=2).validate_model(model)
