"""Qwen3-MoE through the model-family interface: published sizes, head_dim != h/a in the tracer, TP/EP
sharding, the memory closed forms and the Hugging Face config."""

from __future__ import annotations

import math

import pytest

from workload.memory import activation_bytes_per_layer, memory_per_gpu, parameter_count
from workload.parallel.config import ParallelConfig
from workload.parallel.rank_trace import trace_rank
from workload.zoo import build_model, config_from_hf, family_of, get_model_config, with_overrides

# Qwen/Qwen3-30B-A3B config.json (as published on the Hugging Face Hub)
QWEN3_30B_A3B_HF = {
    "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": False, "decoder_sparse_step": 1,
    "head_dim": 128, "hidden_act": "silu", "hidden_size": 2048, "intermediate_size": 6144,
    "max_position_embeddings": 40960, "mlp_only_layers": [], "model_type": "qwen3_moe",
    "moe_intermediate_size": 768, "norm_topk_prob": True, "num_attention_heads": 32, "num_experts": 128,
    "num_experts_per_tok": 8, "num_hidden_layers": 48, "num_key_value_heads": 4, "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0, "tie_word_embeddings": False, "vocab_size": 151936,
}


def active_params(name: str) -> float:
    """Parameters a token uses: all but the (E - k) / E unrouted share of the experts."""
    c = get_model_config(name)
    pc = parameter_count(c)
    return pc.total - pc.num_layers * pc.layer_experts * (1 - c.moe_router_topk / c.num_moe_experts)


# (name, published total, published activated, in billions): the model cards / Qwen3 report.
PUBLISHED = [("qwen3-30b-a3b", 30.5, 3.3), ("qwen3-235b-a22b", 235.0, 22.0)]


@pytest.mark.parametrize(("name", "total", "active"), PUBLISHED)
def test_parameter_counts_match_the_published_totals(name: str, total: float, active: float) -> None:
    assert parameter_count(get_model_config(name)).total == pytest.approx(total * 1e9, rel=0.01)
    # the activated figures are given to two significant digits (3.3 = 3.25..3.35, 22 = 21.5..22.5)
    assert active_params(name) == pytest.approx(active * 1e9, rel=0.025)


def test_module_and_closed_form_count_the_same_parameters() -> None:
    # 30B-A3B per layer: QKV 2048 x (32 + 2*4) x 128, projection 4096 x 2048, QK-norm 2 x 128, two RMSNorms,
    # router 2048 x 128, 128 SwiGLU experts of 3 x 2048 x 768
    c = get_model_config("qwen3-30b-a3b")
    layer = 2048 * 40 * 128 + 4096 * 2048 + 2 * 128 + 2 * 2048 + 2048 * 128 + 128 * 3 * 2048 * 768
    exact = 48 * layer + 2 * 151936 * 2048 + 2048
    assert parameter_count(c).total == exact
    model = build_model("qwen3-30b-a3b")
    assert sum(p.numel() for p in model.parameters()) == exact


def test_head_dim_is_not_hidden_over_heads() -> None:
    c = get_model_config("qwen3-30b-a3b")
    assert (c.hidden_size // c.num_attention_heads, c.kv_channels) == (64, 128)
    attn = family_of(c).attention(c)
    assert (attn.query_heads, attn.kv_heads, attn.head_dim) == (32, 4, 128)


def test_rank_trace_shards_heads_of_width_head_dim_and_experts() -> None:
    c = with_overrides(get_model_config("qwen3-30b-a3b"), num_layers=2, seq_length=256)
    cfg = ParallelConfig(tensor_model_parallel_size=2, expert_model_parallel_size=4, micro_batch_size=1,
                         global_batch_size=8).resolve(8)
    t = trace_rank(c, cfg)
    n, h, tp, ep = 256, 2048, 2, 4
    mm = sum(o.flops for o in t.graph.block_ops(0, "fwd") if o.name == "aten.mm")
    # QKV (h -> (a + 2g)·d / tp), projection (a·d / tp -> h), router (h -> E, replicated)
    assert mm == 2 * n * h * (32 + 8) * 128 / tp + 2 * n * (32 * 128 / tp) * h + 2 * n * h * 128
    bmm = sum(o.flops for o in t.graph.block_ops(0, "fwd") if o.name == "aten.bmm")
    cap = math.ceil(n * 8 / 128)  # tokens per expert, uniform routing
    local, f = 128 // ep, 768 // tp
    assert bmm == 2 * local * cap * ep * h * 2 * f + 2 * local * cap * ep * f * h
    flash = sum(o.flops for o in t.graph.block_ops(0, "fwd") if o.kind == "attention")
    assert flash == 4 * (32 // tp) * n * n * 128
    # this rank's block: attention / tp, norms and router replicated, E/ep experts with f/tp
    assert t.params_block_expert == local * 3 * h * f
    assert t.params_block == (h * 40 * 128 + 4096 * h) // tp + 2 * 128 + 2 * h + h * 128 + local * 3 * h * f


@pytest.mark.parametrize("backend", ["flash", "flash3", "cudnn"])
def test_fsdp_projections_and_every_fused_backend_trace(backend: str) -> None:
    """FSDP sets separate_projections (torchtitan's wq/wk/wv): Qwen3's attention traced a fused qkv it did not
    have (an AttributeError); the QKV GEMM FLOPs are the same three ways split. Every fused backend is one
    attention kernel (flash3/cudnn went to the unfused path)."""
    c = with_overrides(get_model_config("qwen3-30b-a3b"), num_layers=2, seq_length=256, attention_backend=backend)
    cfg = ParallelConfig(fsdp=True, micro_batch_size=1, global_batch_size=8).resolve(8)
    t = trace_rank(c, cfg)
    n, h = 256, 2048
    mm = sum(o.flops for o in t.graph.block_ops(0, "fwd") if o.name == "aten.mm")
    assert mm == 2 * n * h * (32 + 8) * 128 + 2 * n * (32 * 128) * h + 2 * n * h * 128
    assert sum(o.kind == "attention" for o in t.graph.block_ops(0, "fwd")) == 1
    assert not any(o.name == "aten.baddbmm" for o in t.graph.block_ops(0, "fwd"))


def test_activations_with_head_dim_and_qk_norm() -> None:
    s, b, h, a, g, d, f, t = 4096, 1, 2048, 32, 4, 128, 768, 2
    kw = {"tp": t, "ffn_hidden_size": f, "num_query_groups": g, "gated_mlp": True, "moe_tokens_factor": 8.0,
          "flash_attention": True, "hidden_dropout": 0.0, "attention_dropout": 0.0}
    got = activation_bytes_per_layer(s, b, h, a, head_dim=d, qk_norm=True, **kw)
    q, kv = a * d, g * d
    # norms 4 + QKV/MLP inputs 4 (replicated); Q 2q, K and V 4kv, attention output 2q, q/k pre-norm
    # 2(q + kv), SwiGLU 6f per routed copy (split); softmax statistics 4·a per token
    want = 8 * s * b * h + (2 * q + 4 * kv + 2 * q + 2 * (q + kv) + 6 * f * 8) * s * b / t + 4 * a * s * b / t
    assert got == pytest.approx(want, rel=1e-12)
    # head_dim = h / a is the plain model, bit for bit
    assert activation_bytes_per_layer(s, b, h, a, head_dim=h // a, **kw) == activation_bytes_per_layer(s, b, h, a, **kw)


def test_memory_follows_the_family() -> None:
    c = get_model_config("qwen3-30b-a3b")
    cfg = ParallelConfig(expert_model_parallel_size=8, micro_batch_size=1, global_batch_size=16,
                         use_distributed_optimizer=True).resolve(16)
    m = family_of(c).memory(c, cfg, "bf16")
    direct = memory_per_gpu(c, dp=16, ep=8, num_microbatches=1, zero_stage=1, flash_attention=True)
    assert m.total == pytest.approx(direct.total, rel=1e-12)
    pc = parameter_count(c)
    dense = pc.total - pc.num_layers * pc.layer_experts
    assert m.params_per_gpu == pytest.approx(dense + pc.num_layers * pc.layer_experts / 8)


def test_config_from_hf_reads_qwen3_moe() -> None:
    cfg = config_from_hf(QWEN3_30B_A3B_HF, name="qwen3-30b-a3b", seq_length=4096)
    zoo = get_model_config("qwen3-30b-a3b")
    assert family_of(cfg).name == "qwen3_moe"
    assert parameter_count(cfg).total == parameter_count(zoo).total
    assert (cfg.head_dim, cfg.num_query_groups, cfg.ffn_hidden_size, cfg.num_moe_experts, cfg.moe_router_topk,
            cfg.rotary_base, cfg.untie_embeddings_and_output_weights) == (128, 4, 768, 128, 8, 1e6, True)
    with pytest.raises(ValueError, match="decoder_sparse_step / mlp_only_layers"):
        config_from_hf({**QWEN3_30B_A3B_HF, "mlp_only_layers": [0]})
    with pytest.raises(ValueError, match="Hugging Face config: moe_intermediate_size must be a positive integer, "
                                         "got 0"):
        config_from_hf({**QWEN3_30B_A3B_HF, "moe_intermediate_size": 0})


def test_qwen3_config_errors_name_the_field() -> None:
    c = get_model_config("qwen3-30b-a3b")
    with pytest.raises(ValueError, match="head_dim must be a positive even integer"):
        with_overrides(c, head_dim=127)
    with pytest.raises(ValueError, match="tensor_model_parallel_size=8 does not divide num_query_groups=4"):
        trace_rank(c, ParallelConfig(tensor_model_parallel_size=8, global_batch_size=8).resolve(8))
