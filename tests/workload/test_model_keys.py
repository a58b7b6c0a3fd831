"""Model keys of real training stacks: sliding windows, attention sinks, ALiBi, the embedding LayerNorm.

Closed forms (attended keys, key blocks, parameters) checked against brute force or published counts.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from hwmodel.attention_masks import ALIBI_FLOPS_PER_SCORE, attended_keys, attention_key_blocks
from hwmodel.costmodel import KernelCostModel
from hwmodel.ir import Compute
from hwmodel.specs import get_gpu
from scenarios.notes import model_notes
from workload.memory import memory_per_gpu, parameter_count
from workload.parallel.config import ParallelConfig
from workload.trace import trace_model
from workload.trace.masked_attention import AttentionPattern, alibi_slopes, masked_attention
from workload.zoo import build_model, config_from_hf, get_model_config, with_overrides

TINY = {"num_layers": 4, "hidden_size": 256, "num_attention_heads": 4, "num_query_groups": 2,
        "ffn_hidden_size": 512, "vocab_size": 1024, "seq_length": 1024}


def brute_keys(sq: int, skv: int, window: int = 0, sinks: int = 0) -> int:
    """Visible (query, key) pairs of a bottom-right aligned causal mask, counted one by one."""
    n = 0
    for p in range(sq):
        pos = p + skv - sq
        for j in range(skv):
            n += j <= pos and (not window or j > pos - window or j < sinks)
    return n


@pytest.mark.parametrize("sq, skv, window, sinks", [
    (64, 64, 0, 0), (64, 64, 16, 0), (64, 64, 16, 4), (50, 70, 9, 3), (64, 64, 100, 0), (10, 10, 3, 20)])
def test_attended_keys_is_the_brute_force_count(sq, skv, window, sinks):
    assert attended_keys(sq, skv, causal=True, window=window, sinks=sinks) == brute_keys(sq, skv, window, sinks)


def test_window_4096_1024_scores_0_4375_of_full_causal():
    full = attended_keys(4096, 4096, causal=True)
    assert full == 4096 * 4097 // 2
    windowed = attended_keys(4096, 4096, causal=True, window=1024)
    assert windowed == 1024 * 1025 // 2 + (4096 - 1024) * 1024  # ramp, then W keys per query
    assert windowed / full == pytest.approx(0.43746, abs=1e-5)
    # sinks: min(p + 1, W + N) keys, N more per query once the window has slid N past them
    assert attended_keys(4096, 4096, causal=True, window=1024, sinks=4) - windowed == 4 * (4096 - 1028) + 1 + 2 + 3 + 4


def test_key_blocks_skip_the_tiles_outside_the_window():
    # S = 4096, 128-row tiles: causal runs 1 + 2 + ... + 32 = 528 blocks; a 1024 window runs i + 1 blocks
    # for the first 8 query blocks and 9 (the diagonal block and 8 before it) for the other 24
    assert attention_key_blocks(4096, 4096, 128, causal=True) == 528
    assert attention_key_blocks(4096, 4096, 128, causal=True, window=1024) == 36 + 24 * 9
    # one sink block more for every query block whose window no longer reaches block 0 (blocks 9..31)
    assert attention_key_blocks(4096, 4096, 128, causal=True, window=1024, sinks=4) == 36 + 24 * 9 + 23
    assert attention_key_blocks(4096, 4096, 128, causal=True, window=8192) == 528  # window > seq: no-op


def test_bad_window_arguments_are_refused():
    with pytest.raises(ValueError, match="sinks only with a window"):
        attended_keys(8, 8, causal=True, sinks=2)
    with pytest.raises(ValueError, match="causal attention only"):
        attended_keys(8, 8, causal=False, window=4)


def _attention_task(window=0, sinks=0, alibi=False, phase="fwd") -> Compute:
    shape = (1, 32, 4096, 4096, 128)
    return Compute(name="attn", kind="attention", flops=0.0, bytes_accessed=0.0, shape=shape, phase=phase,
                   causal=True, attention_window=window, attention_sinks=sinks, attention_alibi=alibi)


def test_cost_model_prices_the_blocks_the_window_keeps():
    cm = KernelCostModel(get_gpu("H100-SXM5"))
    full, win = cm.cost(_attention_task()), cm.cost(_attention_task(window=1024))
    c = cm.cal.attention_params(128)[2]  # per-CTA overhead, in block times
    n_q = 32
    assert win.detail["compute_s"] / full.detail["compute_s"] == pytest.approx((252 + n_q * c) / (528 + n_q * c))
    # the executed FLOPs are the useful ones: the full count times the scored fraction
    useful = 4.0 * 32 * 4096 * 4096 * 128 * attended_keys(4096, 4096, window=1024) / 4096 ** 2
    assert win.detail["executed_flops"] == pytest.approx(useful)


def test_alibi_adds_one_fma_per_computed_score_on_the_cuda_cores():
    gpu = get_gpu("H100-SXM5")
    cm = KernelCostModel(gpu)
    for phase in ("fwd", "bwd"):
        plain, alibi = cm.cost(_attention_task(phase=phase)), cm.cost(_attention_task(alibi=True, phase=phase))
        ctas = 32 * 32
        waves = math.ceil(ctas / cm.sm_count)
        vector_per_sm = gpu.fp32_flops * cm.cal.vector_efficiency / cm.sm_count
        extra = waves * 32 * 528 * 128 * 128 * ALIBI_FLOPS_PER_SCORE / vector_per_sm / ctas
        assert alibi.detail["compute_s"] - plain.detail["compute_s"] == pytest.approx(extra, rel=1e-9)
        assert 0.01 < extra / plain.detail["compute_s"] < 0.1  # a small per-tile overhead, not a pass


def _attention_ops(graph):
    return [o for o in graph.ops if o.kind == "attention"]


def test_traced_window_scales_model_flops_and_reaches_the_compute_task():
    plain = trace_model(build_model("llama2-7b", **TINY), optimizer=False)
    windowed = trace_model(build_model("llama2-7b", sliding_window=256, **TINY), optimizer=False)
    ratio = attended_keys(1024, 1024, window=256) / attended_keys(1024, 1024)
    for p, w in zip(_attention_ops(plain), _attention_ops(windowed), strict=True):
        assert (w.window, w.sinks, w.alibi) == (256, 0, False)
        assert w.flops == pytest.approx(p.flops * ratio)
        assert w.kernel_flops == p.kernel_flops  # the registry's full-matrix count
        task = w.to_compute()
        assert task.attention_window == 256
        assert task.flops == pytest.approx(w.kernel_flops * attended_keys(1024, 1024, window=256) / 1024 ** 2)
    others = [(o.name, o.flops) for o in plain.ops if o.kind != "attention"]
    assert others == [(o.name, o.flops) for o in windowed.ops if o.kind != "attention"]  # memory: unchanged


def test_gemma_style_pattern_dedups_and_gives_each_layer_its_window():
    model_kw = {**TINY, "sliding_window": 128, "sliding_window_pattern": 2, "attention_sinks": 4}
    deduped = trace_model(build_model("llama2-7b", **model_kw), optimizer=False)
    full = trace_model(build_model("llama2-7b", **model_kw), optimizer=False, layer_dedup=False, saved_activations=True)
    assert deduped.info["layer_dedup"] and not full.info["layer_dedup"]
    for g in (deduped, full):
        by_layer = {(o.block, o.phase): (o.window, o.sinks) for o in _attention_ops(g)}
        assert by_layer == {(b, ph): ((128, 4) if b % 2 == 0 else (0, 0)) for b in range(4) for ph in ("fwd", "bwd")}
    listed = trace_model(build_model("llama2-7b", **{**TINY, "sliding_window": 128, "window_layers": [1, 2]}),
                         optimizer=False)
    assert {o.block: o.window for o in _attention_ops(listed)} == {0: 0, 1: 128, 2: 128, 3: 0}


def test_masked_attention_eager_matches_an_explicit_softmax():
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 4, 12, 8) for _ in range(3))
    pat = AttentionPattern(window=4, sinks=2, alibi=True)
    out = masked_attention(q, k, v, pat)
    i, j = torch.arange(12)[:, None], torch.arange(12)[None, :]
    visible = (j <= i) & ((j > i - 4) | (j < 2))
    slopes = torch.tensor(alibi_slopes(4))[:, None, None]
    scores = q @ k.transpose(-1, -2) / math.sqrt(8) + slopes * (j - i)
    ref = F.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1) @ v
    assert torch.allclose(out, ref, atol=1e-5)
    assert alibi_slopes(8) == [2.0 ** -(i + 1) for i in range(8)]  # Press et al.: 1/2, 1/4, ..., 1/256


def test_alibi_has_no_rope_kernels_and_marks_attention():
    rope = trace_model(build_model("llama2-7b", **TINY), optimizer=False)
    alibi = trace_model(build_model("llama2-7b", position_embedding_type="alibi", **TINY), optimizer=False)

    def rope_kernels(g):  # the tables (cos, sin) and apply_rope's muls, cat (fwd) and neg (bwd) in attention
        return [o for o in g.ops if o.name in ("aten.cos", "aten.sin") or (o.layer.endswith("attn") and (
            o.name in ("aten.mul", "aten.neg") or (o.name == "aten.cat" and o.phase == "fwd")))]

    assert len(rope_kernels(rope)) > 2 * TINY["num_layers"]
    assert rope_kernels(alibi) == []
    assert all(o.alibi for o in _attention_ops(alibi)) and not any(o.alibi for o in _attention_ops(rope))
    unfused = trace_model(build_model("bloom-176b", num_layers=1, hidden_size=256, num_attention_heads=4,
                                      vocab_size=1024, seq_length=256, attention_backend="unfused"), optimizer=False)
    qk = next(o for o in unfused.ops if o.name == "aten.baddbmm")
    assert qk.in_shapes[0] == (4, 1, 256)  # BLOOM's (B·nh, 1, T) ALiBi bias is the GEMM's input


def test_embedding_layernorm_adds_2h_params_a_kernel_and_activation_memory():
    cfg = with_overrides(get_model_config("gpt-1.7b"), num_layers=2)
    with_ln = with_overrides(cfg, embedding_layernorm=True)
    plain_n, ln_n = (sum(p.numel() for p in build_model_from(c).parameters()) for c in (cfg, with_ln))
    assert ln_n - plain_n == 2 * 2304
    assert parameter_count(with_ln).total - parameter_count(cfg).total == 2 * 2304
    g = trace_model(build_model("gpt-1.7b", num_layers=2, embedding_layernorm=True), optimizer=False)
    assert [o.name for o in g.pre_ops("fwd")].count("aten.native_layer_norm") == 1
    a, b = (memory_per_gpu(c, tp=2, sequence_parallel=True, flash_attention=True) for c in (cfg, with_ln))
    assert b.activations - a.activations == pytest.approx(2.0 * 2048 * 2304 / 2)  # its saved input, s*b*h/t
    assert b.params_per_gpu - a.params_per_gpu == 2 * 2304


def test_bloom_176b_has_bigscience_parameter_count():
    cfg = get_model_config("bloom-176b")
    assert (cfg.num_layers, cfg.hidden_size, cfg.num_attention_heads, cfg.vocab_size) == (70, 14336, 112, 250880)
    counted = sum(p.numel() for p in build_model("bloom-176b").parameters())  # meta device: free
    assert counted == pytest.approx(176_247_271_424, rel=0.005)
    assert counted == 176_247_271_424  # 70 (12h² + 13h) + Vh + 2h (embedding LN) + 2h (final LN)
    assert parameter_count(cfg).total == counted


def test_mistral_7b_window_and_count():
    cfg = get_model_config("mistral-7b")
    assert (cfg.sliding_window, cfg.seq_length) == (4096, 8192)
    assert sum(p.numel() for p in build_model("mistral-7b").parameters()) == 7_241_732_096  # released checkpoint


@pytest.mark.parametrize("overrides, msg", [
    ({"sliding_window": -1}, "sliding_window must be positive"),
    ({"sliding_window": 0}, "sliding_window must be positive"),
    ({"attention_sinks": 4}, "attention_sinks=4 needs sliding_window"),
    ({"sliding_window_pattern": 2}, "sliding_window_pattern needs sliding_window"),
    ({"sliding_window": 64, "window_layers": [0, 9]}, r"window_layers must be distinct layer indices in \[0, 3\]"),
    ({"sliding_window": 64, "window_layers": [1], "sliding_window_pattern": 2}, "not both"),
    ({"sliding_window": 64, "attention_backend": "efficient"}, "dense mask"),
    ({"position_embedding_type": "alibi", "attention_backend": "flash3"}, "FlashAttention-3 has no ALiBi"),
    ({"position_embedding_type": "relative"}, "position_embedding_type must be one of"),
])
def test_bad_values_are_refused_naming_the_field(overrides, msg):
    with pytest.raises(ValueError, match=msg):
        with_overrides(get_model_config("llama2-7b"), **{**TINY, **overrides})


def test_window_on_bidirectional_model_and_with_cp_are_refused():
    with pytest.raises(ValueError, match="sliding_window is a causal window"):
        with_overrides(get_model_config("bert-large"), sliding_window=128)
    cfg = with_overrides(get_model_config("llama2-7b"), **TINY, sliding_window=128)
    par = ParallelConfig(context_parallel_size=2).resolve(2)
    with pytest.raises(ValueError, match="context_parallel_size=2 with sliding_window"):
        par.validate_model(cfg)


def test_context_parallelism_with_unfused_attention_is_refused():
    """Megatron-Core's local DotProductAttention asserts context_parallel_size == 1 (CP is TE's only)."""
    par = ParallelConfig(context_parallel_size=2).resolve(2)
    unfused = with_overrides(get_model_config("llama2-7b"), **TINY, attention_backend="unfused")
    with pytest.raises(ValueError, match='context_parallel_size=2 with attention_backend = "unfused"'):
        par.validate_model(unfused)
    par.validate_model(with_overrides(get_model_config("llama2-7b"), **TINY, attention_backend="flash"))
    ParallelConfig().resolve(1).validate_model(unfused)


def test_window_no_shorter_than_the_sequence_is_a_noop_warning():
    cfg = with_overrides(get_model_config("llama2-7b"), **TINY, sliding_window=1024)
    assert model_notes(cfg) == ["[model] sliding_window = 1024 >= seq_length = 1024: every query already sees "
                                "all its keys, so the window changes nothing; set it below seq_length for local "
                                "attention"]
    assert "sliding_window = 1000 + attention_sinks = 24" in model_notes(with_overrides(cfg, sliding_window=1000,
                                                                                        attention_sinks=24))[0]
    assert model_notes(with_overrides(cfg, sliding_window=512)) == []
    assert "no layer uses it" in model_notes(with_overrides(cfg, sliding_window=512, sliding_window_pattern=1))[0]
    assert model_notes(get_model_config("llama2-7b")) == []


def test_tp_needs_to_divide_heads_and_kv_heads_not_hidden():
    par = ParallelConfig(tensor_model_parallel_size=4).resolve(4)
    # Qwen3-like: head_dim set, hidden 2052 not a multiple of 4
    par.validate_model(SimpleNamespace(num_attention_heads=32, num_query_groups=4, hidden_size=2052, head_dim=128,
                                       ffn_hidden_size=768, num_layers=2, seq_length=128))
    with pytest.raises(ValueError, match="does not divide num_query_groups=2"):
        par.validate_model(SimpleNamespace(num_attention_heads=32, num_query_groups=2, hidden_size=4096,
                                           ffn_hidden_size=768, num_layers=2, seq_length=128))


def test_moe_router_is_replicated_over_tp_in_memory():
    cfg = with_overrides(get_model_config("mixtral-8x7b"), num_layers=2)
    counts = parameter_count(cfg)
    assert counts.layer_router == 4096 * 8
    one, two = (memory_per_gpu(cfg, tp=t, flash_attention=True).params_per_gpu for t in (1, 2))
    replicated = 2 * (counts.layer_norms + counts.layer_router)
    sharded = one - replicated - counts.final_norm
    assert two == pytest.approx(sharded / 2 + replicated + counts.final_norm)


def test_hf_reader_maps_window_alibi_and_embedding_layernorm():
    bloom = config_from_hf({"model_type": "bloom", "n_layer": 70, "hidden_size": 14336, "n_head": 112,
                            "vocab_size": 250880, "layer_norm_epsilon": 1e-5}, name="bloom")
    assert (bloom.position_embedding_type, bloom.embedding_layernorm, bloom.architecture) == ("alibi", True, "gpt")
    assert sum(p.numel() for p in build_model_from(bloom).parameters()) == 176_247_271_424
    base = {"model_type": "mistral", "num_hidden_layers": 4, "hidden_size": 256, "num_attention_heads": 4,
            "num_key_value_heads": 2, "intermediate_size": 512, "vocab_size": 1024,
            "max_position_embeddings": 2048}
    assert config_from_hf({**base, "sliding_window": None}).sliding_window is None
    assert config_from_hf({**base, "sliding_window": 512}).sliding_window == 512
    assert config_from_hf({**base, "sliding_window": 512, "use_sliding_window": False}).sliding_window is None
    typed = config_from_hf({**base, "sliding_window": 512, "layer_types": ["sliding_attention", "full_attention"] * 2})
    assert typed.window_layers == (0, 2)
    assert config_from_hf({**base, "sliding_window": 512, "sliding_window_pattern": 2}).sliding_window_pattern == 2
    with pytest.raises(ValueError, match="sliding_window must be a positive integer, got -4"):
        config_from_hf({**base, "sliding_window": -4})


def build_model_from(cfg):
    from workload.zoo import build_model_from_config
    return build_model_from_config(cfg)


@pytest.mark.parametrize("model,activation", [("llama3-8b", "gelu"), ("llama3-8b", "squared_relu"),
                                              ("gpt3-175b", "swiglu")])
def test_an_activation_the_family_does_not_build_is_refused(model, activation):
    """The memory model reads ``activation`` (a gated MLP keeps 4f instead of 2f per token); a family whose
    modules build another MLP would count an MLP it never traces, so the key is refused at the build."""
    from workload.zoo import family_of
    cfg = with_overrides(get_model_config(model), activation=activation)
    with pytest.raises(ValueError, match=f"activation = '{activation}' is not built by the"):
        family_of(cfg).check_sizes(cfg)


def test_squared_relu_is_built_by_the_gpt_family():
    from workload.zoo import family_of
    cfg = with_overrides(get_model_config("gpt3-175b"), activation="squared_relu")
    family_of(cfg).check_sizes(cfg)  # no error


def test_hf_head_dim_other_than_hidden_over_heads_is_read():
    """Mistral-Nemo's config: hidden 5120, 32 heads, head_dim 128 (not 160); it was refused while the llama
    family derived the head width from hidden / heads (tests/workload/test_head_dim.py: the whole model)."""
    d = {"model_type": "mistral", "hidden_size": 5120, "intermediate_size": 14336, "num_attention_heads": 32,
         "num_key_value_heads": 8, "num_hidden_layers": 4, "vocab_size": 131072,
         "max_position_embeddings": 4096, "rms_norm_eps": 1e-5}
    assert config_from_hf({**d, "head_dim": 160}).kv_channels == 160
    assert config_from_hf({**d, "head_dim": 128}).kv_channels == 128
