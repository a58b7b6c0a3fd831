"""The model-family registry: every configuration has a family, the families answer for the runner and
the rank tracer, and unsupported strategies are refused in one line naming the field and the reason."""

from __future__ import annotations

import pytest
from torch import nn

from workload.custom import CustomModel
from workload.parallel.config import ParallelConfig
from workload.parallel.rank_trace import trace_rank
from workload.zoo import build_model_from_config, family_of, get_model_config, known_models, with_overrides
from workload.zoo.family import PARALLELISMS, TRACED_FLOPS_FORMULA
from workload.zoo.gpt import SC21_FORMULA
from workload.zoo.gpt import sc21_flops_per_iteration as megatron_flops_per_iteration
from workload.zoo.registry import families, hf_model_types


def test_every_zoo_model_has_a_family_that_builds_it() -> None:
    expected = {"gpt": "GPT", "llama": "Llama", "mixtral": "Llama", "bert": "Bert", "resnet": "ResNet",
                "qwen3_moe": "Qwen3MoE"}
    for name in known_models():
        cfg = get_model_config(name)
        family = family_of(cfg)
        assert isinstance(cfg, family.config_type), name
        small = with_overrides(cfg, num_layers=1) if family.transformer else cfg
        assert type(build_model_from_config(small)).__name__ == expected[family.name], name
    assert set(families()) == {*expected, "custom"}


def test_unknown_architecture_lists_the_families() -> None:
    class Odd:
        name, architecture = "odd", "rnn"

    with pytest.raises(ValueError, match="odd: architecture 'rnn' is no model family; families: gpt, llama"):
        family_of(Odd())


def test_resnet_refuses_model_parallelism_naming_field_and_reason() -> None:
    cfg = get_model_config("resnet-50")
    assert set(family_of(cfg).unsupported(cfg)) == set(PARALLELISMS)
    par = ParallelConfig(tensor_model_parallel_size=2, global_batch_size=8).resolve(8)
    with pytest.raises(ValueError, match="resnet-50: tensor_model_parallel_size=2 is not supported: trainsim runs "
                                         "ResNet data parallel only"):
        trace_rank(cfg, par)
    with pytest.raises(ValueError, match="expert_model_parallel_size=2 is not supported"):
        build_model_from_config(cfg, expert_model_parallel_size=2)


def test_dense_transformers_refuse_expert_parallelism() -> None:
    for name in ("gpt-1.7b", "llama3-8b", "bert-large"):
        cfg = get_model_config(name)
        assert "ep" in family_of(cfg).unsupported(cfg)
        with pytest.raises(ValueError, match=f"{name}: expert_model_parallel_size=2 is not supported: expert "
                                             f"parallelism needs a mixture-of-experts model"):
            build_model_from_config(with_overrides(cfg, num_layers=1), expert_model_parallel_size=2)
    for name in ("mixtral-8x7b", "qwen3-30b-a3b"):
        cfg = get_model_config(name)
        assert family_of(cfg).unsupported(cfg) == {}


def test_custom_module_maps_onto_the_custom_family() -> None:
    mods = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8))
    cm = CustomModel.from_factory(mods, "tests:mlp", {"input_shape": [8]})
    family = family_of(cm)
    assert family.name == "custom" and not family.transformer
    assert set(family.unsupported(cm)) == {"tp", "cp", "ep", "sp", "pp"}  # the two Linears differ: no PP


def test_gpt_flops_are_sc21_eq3_and_others_are_traced() -> None:
    cfg = get_model_config("gpt3-175b")
    par = ParallelConfig(tensor_model_parallel_size=8, pipeline_model_parallel_size=8, global_batch_size=1536,
                         recompute_granularity="full").resolve(1024)
    model, hw, formula = family_of(cfg).flops(cfg, par, graph=None)  # a closed form: no trace needed
    args = {"batch": 1536, "seq": 2048, "layers": 96, "hidden": 12288, "vocab": 51200}
    assert model == megatron_flops_per_iteration(full_recompute=False, **args)
    assert hw == megatron_flops_per_iteration(full_recompute=True, **args)
    assert hw / model == pytest.approx(4 / 3, rel=0.01)  # full recomputation: one more forward of three passes
    assert formula == SC21_FORMULA
    wide = with_overrides(get_model_config("gpt-1.7b"), num_layers=1, ffn_hidden_size=3 * 2304, seq_length=128)
    small = ParallelConfig(global_batch_size=1).resolve(1)
    assert family_of(wide).flops(wide, small, trace_rank(wide, small).graph).formula == TRACED_FLOPS_FORMULA


def test_hf_model_types_come_from_the_families() -> None:
    assert hf_model_types() == ["gpt2", "bloom", "llama", "mistral", "mixtral", "bert", "qwen3_moe"]
