"""The model zoo: published dimensions and parameter counts, registry errors, TP validation, HF configs."""

from __future__ import annotations

import importlib.util
import json

import pytest

from workload.zoo import (
    TransformerConfig,
    UnknownModelError,
    build_model,
    config_from_hf,
    get_model_config,
    known_models,
    padded_vocab_size,
    validate_tensor_parallel,
)


def n_params(model) -> int:
    return sum(p.numel() for p in model.parameters())


def test_known_models_cover_the_brief() -> None:
    names = set(known_models())
    assert names >= {"gpt-1.7b", "gpt-3.6b", "gpt-7.5b", "gpt-18b", "gpt-39b", "gpt-76b", "gpt-145b",
                     "gpt-310b", "gpt-530b", "gpt-1t", "gpt3-175b", "llama2-7b", "llama2-13b", "llama2-70b",
                     "llama3-8b", "llama3-70b", "llama3-405b", "mixtral-8x7b", "bert-large", "resnet-50"}


def test_unknown_model_lists_known_names() -> None:
    with pytest.raises(UnknownModelError) as e:
        get_model_config("gpt-4")
    assert "'gpt-4'" in str(e.value) and "gpt3-175b" in str(e.value) and "llama3-8b" in str(e.value)
    with pytest.raises(KeyError):  # UnknownModelError is a KeyError
        build_model("nope")


@pytest.mark.parametrize("name,heads,hidden,layers,published", [
    ("gpt-1.7b", 24, 2304, 24, 1.7), ("gpt-18b", 48, 6144, 40, 18.4), ("gpt-145b", 96, 12288, 80, 145.6),
    ("gpt-530b", 128, 20480, 105, 529.6), ("gpt-1t", 160, 25600, 128, 1008.0),
    ("gpt3-175b", 96, 12288, 96, 175.0)])
def test_gpt_sizes_match_sc21_table1(name: str, heads: int, hidden: int, layers: int, published: float) -> None:
    cfg = get_model_config(name)
    assert (cfg.num_attention_heads, cfg.hidden_size, cfg.num_layers) == (heads, hidden, layers)
    assert (cfg.vocab_size, cfg.seq_length, cfg.ffn_hidden_size) == (51200, 2048, 4 * hidden)
    count = n_params(build_model(name))  # meta device: free
    # Megatron's count, SC'21 §5.1: P = 12·l·h²·(1 + 13/(12h) + (V + s)/(12·l·h))
    h, l = hidden, layers
    assert count == pytest.approx(12 * l * h**2 * (1 + 13 / (12 * h) + (51200 + 2048) / (12 * l * h)), rel=1e-3)
    assert count / 1e9 == pytest.approx(published, rel=0.03)  # the table rounds (1.65 B -> "1.7")


@pytest.mark.parametrize("name,exact", [
    ("llama2-7b", 6_738_415_616), ("llama2-13b", 13_015_864_320), ("llama2-70b", 68_976_648_192),
    ("llama3-8b", 8_030_261_248), ("llama3-70b", 70_553_706_496), ("llama3-405b", 405_853_388_800),
    ("mixtral-8x7b", 46_702_792_704)])
def test_llama_parameter_counts_match_released_checkpoints(name: str, exact: int) -> None:
    assert n_params(build_model(name)) == exact


def test_other_models() -> None:
    assert n_params(build_model("resnet-50")) == 25_557_032  # torchvision resnet50
    bert = get_model_config("bert-large")
    assert (bert.num_layers, bert.hidden_size, bert.num_attention_heads, bert.causal) == (24, 1024, 16, False)
    assert n_params(build_model("bert-large")) / 1e6 == pytest.approx(340, rel=0.02)
    l3 = get_model_config("llama3-405b")
    assert (l3.num_layers, l3.hidden_size, l3.num_attention_heads, l3.num_query_groups, l3.ffn_hidden_size,
            l3.vocab_size) == (126, 16384, 128, 8, 53248, 128256)


def test_build_model_overrides() -> None:
    m = build_model("gpt3-175b", num_layers=2, hidden_size=256, num_attention_heads=8)
    assert len(m.layers) == 2 and m.config.ffn_hidden_size == 1024  # 4h follows the new h
    assert next(m.parameters()).device.type == "meta"
    assert build_model("llama3-8b", hidden_size=512, num_attention_heads=8, num_query_groups=2,
                       num_layers=1).config.ffn_hidden_size == 14336  # explicit: kept
    with pytest.raises(ValueError, match="unknown config field"):
        build_model("gpt-1.7b", n_layer=4)


def test_heads_must_divide_hidden() -> None:
    with pytest.raises(ValueError, match=r"num_attention_heads=7 must divide hidden_size=2304"):
        build_model("gpt-1.7b", num_attention_heads=7)
    with pytest.raises(ValueError, match="num_query_groups=3"):
        TransformerConfig(name="x", architecture="llama", num_layers=1, hidden_size=64, num_attention_heads=4,
                          num_query_groups=3)


def test_validate_tensor_parallel_names_both_numbers() -> None:
    validate_tensor_parallel(get_model_config("gpt3-175b"), 8)
    with pytest.raises(ValueError, match=r"num_attention_heads=96 is not divisible by tensor_parallel_degree=5"):
        validate_tensor_parallel(get_model_config("gpt3-175b"), 5)
    with pytest.raises(ValueError, match=r"num_query_groups=8 is not divisible by tensor_parallel_degree=16"):
        validate_tensor_parallel(get_model_config("llama3-70b"), 16)
    with pytest.raises(ValueError, match="tensor_parallel_degree must be >= 1"):
        validate_tensor_parallel(get_model_config("gpt-1.7b"), 0)
    # the vocabulary is padded, never rejected (Megatron: multiple of 128·tp)
    assert padded_vocab_size(get_model_config("bert-large"), 8) == 30720  # ceil(30522 / 1024) · 1024


def test_config_from_hf_dict_and_file(tmp_path) -> None:
    hf = {"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
          "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256,
          "max_position_embeddings": 8192, "rope_theta": 500000.0, "rms_norm_eps": 1e-5,
          "tie_word_embeddings": False}
    cfg = config_from_hf(hf, name="my-llama")
    ref = get_model_config("llama3-8b")
    for f in ("num_layers", "hidden_size", "num_attention_heads", "num_query_groups", "ffn_hidden_size",
              "vocab_size", "seq_length", "rotary_base", "untie_embeddings_and_output_weights"):
        assert getattr(cfg, f) == getattr(ref, f), f
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**hf, "num_local_experts": 8, "num_experts_per_tok": 2}))
    moe = config_from_hf(path)
    assert moe.architecture == "mixtral" and moe.num_moe_experts == 8
    with pytest.raises(ValueError, match="unsupported Hugging Face model_type 't5'"):
        config_from_hf({"model_type": "t5"})


@pytest.mark.skipif(importlib.util.find_spec("transformers") is not None, reason="transformers installed")
def test_config_from_hf_hub_id_without_transformers() -> None:
    with pytest.raises(ImportError, match=r"trainsim\[hf\]"):
        config_from_hf("meta-llama/Meta-Llama-3-8B")
