"""``[model] head_dim`` for the transformer families: heads ``d`` channels wide with ``a*d != h`` (Mistral-Nemo 12B:
h 5120, a 32, d 128). The modules build QKV ``h -> (a + 2g)*d`` and the projection ``a*d -> h``; the closed forms
(parameters, activations, TP shards) count the same; the Hugging Face import reads ``head_dim``."""

from __future__ import annotations

import pytest
import torch

import workload.trace.api as trace_api
from scenarios.runner import build_model_config
from workload.memory import activation_bytes_per_layer, memory_per_gpu, parameter_count
from workload.parallel.config import ParallelConfig
from workload.parallel.rank_trace import trace_rank
from workload.parallel.tp import TPContext
from workload.trace import trace_model
from workload.zoo import build_model, config_from_hf, family_of, get_model_config, with_overrides

# mistralai/Mistral-Nemo-Base-2407 config.json, as published on the Hugging Face Hub
MISTRAL_NEMO_HF = {
    "_name_or_path": "mistralai/Mistral-Nemo-Base-2407", "architectures": ["MistralForCausalLM"],
    "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2, "head_dim": 128, "hidden_act": "silu",
    "hidden_size": 5120, "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 128000,
    "model_type": "mistral", "num_attention_heads": 32, "num_hidden_layers": 40, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "sliding_window": None, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "transformers_version": "4.43.3", "use_cache": True, "vocab_size": 131072,
}


def mistral_nemo_exact() -> int:
    """Mistral-Nemo 12B's parameters from its config: per layer QKV 5120 x (32 + 2*8) x 128, output projection
    (32 x 128) x 5120, SwiGLU 3 x 5120 x 14336, two RMSNorms 2 x 5120; 40 layers, an untied embedding and
    output layer of 131072 x 5120 each, the final RMSNorm."""
    h, a, g, d, f, v, layers = 5120, 32, 8, 128, 14336, 131072, 40
    layer = h * (a + 2 * g) * d + a * d * h + 3 * h * f + 2 * h
    return layers * layer + 2 * v * h + h


def test_mistral_nemo_parameters_traced_closed_form_and_published() -> None:
    exact = mistral_nemo_exact()
    assert exact == 12_247_782_400
    assert exact == pytest.approx(12.2e9, rel=0.005)  # the model card's 12.2B (a*d = h would give 13.5B)
    cfg = get_model_config("mistral-nemo-12b")
    assert (cfg.kv_channels, cfg.hidden_size // cfg.num_attention_heads) == (128, 160)
    assert parameter_count(cfg).total == exact
    with torch.device("meta"):
        model = build_model("mistral-nemo-12b")
    assert sum(p.numel() for p in model.parameters()) == exact
    attn = model.layers[0].attn
    assert tuple(attn.qkv.weight.shape) == (48 * 128, 5120) and tuple(attn.proj.weight.shape) == (5120, 32 * 128)


def test_hf_import_of_mistral_nemo_reads_head_dim() -> None:
    """The config was refused (the family derived the head width from hidden / heads, 160)."""
    cfg = config_from_hf(MISTRAL_NEMO_HF)
    assert (family_of(cfg).name, cfg.head_dim, cfg.kv_channels, cfg.num_query_groups) == ("llama", 128, 128, 8)
    assert parameter_count(cfg).total == mistral_nemo_exact()
    plain = config_from_hf({k: v for k, v in MISTRAL_NEMO_HF.items() if k != "head_dim"})
    assert plain.kv_channels == 160  # no head_dim: hidden / heads, as Hugging Face's MistralConfig
    # a family that builds its heads h / a wide still refuses a head_dim it would drop
    bert = {"model_type": "bert", "hidden_size": 256, "num_attention_heads": 4, "num_hidden_layers": 2,
            "intermediate_size": 1024, "vocab_size": 1000, "max_position_embeddings": 128, "head_dim": 32}
    with pytest.raises(ValueError, match="head_dim = 32 differs from hidden_size / num_attention_heads = 64"):
        config_from_hf(bert)


def test_model_head_dim_key_on_a_llama_scenario() -> None:
    cfg = build_model_config({"name": "llama3-8b", "head_dim": 96}, {})
    assert (cfg.kv_channels, cfg.num_attention_heads) == (96, 32)
    assert parameter_count(cfg).layer_linear_weights == 4096 * (32 + 16) * 96 + 32 * 96 * 4096 + 3 * 4096 * 14336
    # hidden / heads follows a new hidden_size when head_dim is not given
    assert build_model_config({"name": "llama3-8b", "hidden_size": 2048}, {}).kv_channels == 64
    with pytest.raises(ValueError, match="head_dim must be a positive even integer \\(RoPE rotates pairs\\), got 95"):
        build_model_config({"name": "llama3-8b", "head_dim": 95}, {})
    with pytest.raises(ValueError, match="head_dim must be positive, got 0"):
        build_model_config({"name": "llama3-8b", "head_dim": 0}, {})
    # with head_dim, the heads need not divide hidden_size (Megatron-Core asserts it only without kv_channels)
    assert with_overrides(get_model_config("llama3-8b"), hidden_size=4100, head_dim=128).kv_channels == 128
    with pytest.raises(ValueError, match="num_attention_heads=32 must divide hidden_size=4100 \\(or give head_dim\\)"):
        with_overrides(get_model_config("llama3-8b"), hidden_size=4100)


TINY = {"num_layers": 2, "hidden_size": 512, "num_attention_heads": 8, "num_query_groups": 2,
        "ffn_hidden_size": 1024, "vocab_size": 1024, "seq_length": 256}
"""A small Llama: h / a = 64, grouped-query attention (g = 2)."""


@pytest.mark.parametrize("d", [32, 64, 128])
def test_attention_flops_scale_with_heads_times_head_dim(d: int) -> None:
    """One TP rank (t = 2) of a layer: QKV ``2n*h*(a + 2g)*d/t``, projection ``2n*(a*d/t)*h``, the attention
    kernel ``4*(a/t)*n^2*d``; the MLP does not change with d."""
    n, h, a, g, f, t = 256, 512, 8, 2, 1024, 2
    c = with_overrides(get_model_config("llama3-8b"), **TINY, head_dim=d)
    tr = trace_rank(c, ParallelConfig(tensor_model_parallel_size=t, micro_batch_size=1, global_batch_size=1).resolve(t))
    fwd = list(tr.graph.block_ops(0, "fwd"))
    mm = sum(o.flops for o in fwd if o.name == "aten.mm")
    assert mm == 2 * n * h * (a + 2 * g) * d / t + 2 * n * (a * d / t) * h + 2 * n * h * 3 * f / t
    assert sum(o.flops for o in fwd if o.kind == "attention") == 4 * (a // t) * n * n * d
    assert tr.params_block == (h * (a + 2 * g) * d + a * d * h + 3 * h * f) // t + 2 * h
    mem = memory_per_gpu(c, tp=t, flash_attention=True)
    counts = parameter_count(c)
    assert mem.params_per_gpu == (c.num_layers * tr.params_block + counts.embedding / t + counts.final_norm
                                  + counts.output / t)


def _traced_block_saved_bytes(cfg, tp: int) -> tuple[float, list[tuple[str, float]]]:
    """Bytes the first block of one TP rank saves for backward (the trace's saved-tensor accounting)."""
    seen: list[tuple[str, float]] = []
    by_part = trace_api.saved_by_part

    def spy(saved, *args, **kwargs):
        seen.extend(saved)
        return by_part(saved, *args, **kwargs)

    with torch.device("meta"):
        model = family_of(cfg).build(cfg, tp=TPContext(tp))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(trace_api, "saved_by_part", spy)
        g = trace_model(model, optimizer=False, saved_activations=True)
    return g.info["saved_bytes"]["blocks"][0], seen


@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("d", [32, 64, 128])
def test_activation_closed_form_with_head_dim_is_the_traced_saved_tensors(d: int, tp: int) -> None:
    """Korthikanti's terms with ``a*d`` for Q and the attention output, ``g*d`` for K and V, match what the
    traced block saves, less what the eager model saves and Megatron's fused kernels do not, each named:
    the pre-rotation q and k kept by the unfused rotate-half RoPE (``2(a + g)d/t`` per token), the eager SiLU
    output (``2f/t``; Megatron's fused SwiGLU keeps only its input), the two RMSNorms' fp32 ``rstd`` (``2*4``),
    RoPE's cos and sin tables (``(s, d/2)`` bf16 each, saved where the first block uses them) and the flash
    kernel's philox seed and offset (16 + 8 bytes). d = 64 is h / a; 32 and 128 are not."""
    n, h, a, g, f = 256, 512, 8, 2, 1024
    cfg = with_overrides(get_model_config("llama3-8b"), **TINY, head_dim=d)
    traced, _ = _traced_block_saved_bytes(cfg, tp)
    closed = activation_bytes_per_layer(n, 1, h, a, tp=tp, ffn_hidden_size=f, num_query_groups=g, gated_mlp=True,
                                        flash_attention=True, hidden_dropout=0.0, attention_dropout=0.0, head_dim=d)
    eager = n * (2 * (a + g) * d / tp + 2 * f / tp + 2 * 4 + 2 * d) + 16 + 8
    assert traced == closed + eager
    if d == 64:  # the closed form with head_dim = h / a is the plain model's
        assert closed == activation_bytes_per_layer(n, 1, h, a, tp=tp, ffn_hidden_size=f, num_query_groups=g,
                                                    gated_mlp=True, flash_attention=True, hidden_dropout=0.0,
                                                    attention_dropout=0.0)


def test_gpt_with_head_dim_counts_traced_flops_not_eq3() -> None:
    """SC'21 eq. 3 assumes a*d = h and multi-head attention: with another head width, or with grouped-query
    attention, GPT's model FLOPs are the trace's."""
    from workload.zoo.gpt import sc21_applies

    gpt = get_model_config("gpt-1.7b")
    assert sc21_applies(gpt)
    assert not sc21_applies(with_overrides(gpt, head_dim=64))  # 24 x 64 = 1536 != 2304
    assert not sc21_applies(with_overrides(gpt, num_query_groups=8))
    c = with_overrides(gpt, num_layers=2, seq_length=256, head_dim=64)
    cfg = ParallelConfig(micro_batch_size=1, global_batch_size=1).resolve(1)
    fl = family_of(c).flops(c, cfg, trace_rank(c, cfg).graph)
    assert fl.formula.startswith("traced model FLOPs")


def test_report_names_a_head_dim_other_than_hidden_over_heads(monkeypatch) -> None:
    import scenarios.runner as runner
    from scenarios.report import _header
    from scenarios.scenario import parse_scenario

    monkeypatch.setattr(runner, "trace_rank", lambda *a, **k: None)  # the header reads no trace
    lines = {}
    for d in (None, 96):
        model = {"name": "llama3-8b", "num_layers": 2} | ({"head_dim": d} if d else {})
        sc = parse_scenario({"name": "hd", "system": {"name": "dgx-h100", "nodes": 1}, "model": model,
                             "parallel": {"tensor_model_parallel_size": 8}, "training": {"global_batch_size": 1}})
        lines[d] = next(line for line in _header(sc, None, runner.prepare(sc)) if line.startswith("Model"))
    assert lines[None] == "Model       llama3-8b: 2 layers, hidden 4096, 32 heads, sequence 8192; bf16"
    assert lines[96] == "Model       llama3-8b: 2 layers, hidden 4096, 32 heads of head_dim 96, sequence 8192; bf16"
