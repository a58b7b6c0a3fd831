"""The memory model against Korthikanti et al. 2022 (arXiv:2205.05198) closed forms and published runs."""

from types import SimpleNamespace

import pytest

from workload.memory import (
    MemoryBreakdown,
    TransformerShape,
    activation_bytes_per_layer,
    memory_per_gpu,
    parameter_count,
)

# Korthikanti et al. 2022 Table 3 (also in the project's validation/korthikanti2022.csv): heads, hidden,
# layers, TP, PP, micro-batch; all s = 2048, V = 51200, trained on A100 80GB.
KORTHIKANTI = {
    "22B": {"a": 64, "h": 6144, "L": 48, "t": 8, "p": 1, "b": 4, "v": 1},
    "175B": {"a": 96, "h": 12288, "L": 96, "t": 8, "p": 8, "b": 1, "v": 3},
    "530B": {"a": 128, "h": 20480, "L": 105, "t": 8, "p": 35, "b": 1, "v": 3},
    "1T": {"a": 160, "h": 25600, "L": 128, "t": 8, "p": 64, "b": 1, "v": 1},
}
S, V = 2048, 51200
A100_80GB = 80e9


def cfg(name: str) -> SimpleNamespace:
    k = KORTHIKANTI[name]
    return SimpleNamespace(num_layers=k["L"], hidden_size=k["h"], num_attention_heads=k["a"], seq_length=S,
                           vocab_size=V)


def closed_form(mode: str, s: int, b: int, h: int, a: int, t: int) -> float:
    """Korthikanti Table 2, per layer, bytes."""
    return {
        "none, t=1": s * b * h * (34 + 5 * a * s / h),
        "tp": s * b * h * (10 + 24 / t + 5 * a * s / (h * t)),
        "tp+sp": s * b * h / t * (34 + 5 * a * s / h),
        "selective+tp": s * b * h * (10 + 24 / t),
        "selective+tp+sp": 34 * s * b * h / t,
        "full": 2 * s * b * h,
    }[mode]


@pytest.mark.parametrize("model", ["22B", "175B", "530B", "1T"])
def test_per_layer_activations_match_table_2(model):
    k = KORTHIKANTI[model]
    s, b, h, a, t = S, k["b"], k["h"], k["a"], k["t"]

    def ours(**kw):
        return activation_bytes_per_layer(s, b, h, a, **kw)

    assert ours() == pytest.approx(closed_form("none, t=1", s, b, h, a, t), rel=1e-12)
    assert ours(tp=t) == pytest.approx(closed_form("tp", s, b, h, a, t), rel=1e-12)
    assert ours(tp=t, sequence_parallel=True) == pytest.approx(closed_form("tp+sp", s, b, h, a, t), rel=1e-12)
    assert ours(tp=t, recompute="selective") == pytest.approx(closed_form("selective+tp", s, b, h, a, t),
                                                              rel=1e-12)
    assert ours(tp=t, sequence_parallel=True, recompute="selective") == pytest.approx(
        closed_form("selective+tp+sp", s, b, h, a, t), rel=1e-12)
    assert ours(tp=t, recompute="full") == pytest.approx(closed_form("full", s, b, h, a, t), rel=1e-12)
    assert ours(tp=t, sequence_parallel=True, recompute="full") == pytest.approx(2 * s * b * h / t, rel=1e-12)


def test_gpt3_attention_term_and_selective_saving():
    """§4 [recollection of the paper's text, consistent with Table 2]: for GPT-3 175B 5as/h = 80, so
    selective recompute (34 of 34 + 80) saves 70 % of activation memory."""
    k = KORTHIKANTI["175B"]
    assert 5 * k["a"] * S / k["h"] == 80
    full = activation_bytes_per_layer(S, 1, k["h"], k["a"], tp=8, sequence_parallel=True)
    sel = activation_bytes_per_layer(S, 1, k["h"], k["a"], tp=8, sequence_parallel=True,
                                     recompute="selective")
    assert 1 - sel / full == pytest.approx(0.70, abs=0.01)


@pytest.mark.parametrize("model", ["22B", "175B", "530B", "1T"])
def test_sp_plus_selective_cuts_activations_about_5x(model):
    """Abstract: "reduces activation memory by 5x" (SP + selective vs tensor parallelism alone)."""
    k = KORTHIKANTI[model]
    tp_only = activation_bytes_per_layer(S, 1, k["h"], k["a"], tp=k["t"])
    present = activation_bytes_per_layer(S, 1, k["h"], k["a"], tp=k["t"], sequence_parallel=True,
                                         recompute="selective")
    assert 4.5 < tp_only / present < 6.5


def test_first_pipeline_stage_holds_L_layers_worth():
    """§4.2.3: with 1F1B the first stage stores p micro-batches x L/p layers = L layers."""
    c = cfg("175B")
    per_layer = 34 * S * 1 * 12288 / 8
    mask = S * 1 * 12288 / 8  # embedding dropout mask per micro-batch (§4.3)
    for p in (2, 4, 8, 16):
        r = memory_per_gpu(c, tp=8, pp=p, sequence_parallel=True, recompute="selective", stage=0)
        assert r.activations == pytest.approx(96 * per_layer + p * mask, rel=1e-12)
        assert r.detail["microbatches_in_flight"] == p
    last = memory_per_gpu(c, tp=8, pp=8, sequence_parallel=True, recompute="selective", stage=7)
    assert last.detail["microbatches_in_flight"] == 1
    # §4.3: last layer norm + output projection + fp32 logits = 4sbh/t (1 + V/h)
    assert last.activations == pytest.approx(12 * per_layer + 4 * S * 12288 / 8 * (1 + V / 12288), rel=1e-12)


def test_interleaved_schedule_factor():
    c = cfg("175B")
    plain = memory_per_gpu(c, tp=8, pp=8, sequence_parallel=True, recompute="selective", stage=0)
    inter = memory_per_gpu(c, tp=8, pp=8, sequence_parallel=True, recompute="selective", stage=0,
                           virtual_pipeline_size=3)
    layers = plain.activations - plain.detail["other_activations"]
    assert inter.activations - inter.detail["other_activations"] == pytest.approx(layers * (1 + 7 / 24))


def test_fewer_microbatches_than_stages_caps_in_flight():
    r = memory_per_gpu(cfg("175B"), tp=8, pp=8, num_microbatches=2, stage=0)
    assert r.detail["microbatches_in_flight"] == 2


def test_single_stage_total_matches_section_4_3():
    """p = 1: L layers + sbh/t dropout mask + 4sbh/t (1 + V/h), with SP (§4.3)."""
    k = KORTHIKANTI["22B"]
    s, b, h, t = S, k["b"], k["h"], k["t"]
    r = memory_per_gpu(cfg("22B"), tp=t, micro_batch_size=b, sequence_parallel=True, recompute="selective")
    expect = 48 * 34 * s * b * h / t + s * b * h / t + 4 * s * b * h / t * (1 + V / h)
    assert r.activations == pytest.approx(expect, rel=1e-12)


def test_gpt3_175b_parameter_count():
    assert parameter_count(cfg("175B")).total == pytest.approx(175e9, rel=0.01)


def test_zoo_config_is_accepted():
    import workload.zoo as zoo
    c = zoo.get_model_config("gpt3-175b")
    assert parameter_count(c).total == pytest.approx(175e9, rel=0.01)
    llama = zoo.get_model_config("llama2-70b")  # GQA, SwiGLU, RMSNorm, untied, no biases
    assert parameter_count(llama).total == pytest.approx(69.0e9, rel=0.01)
    assert memory_per_gpu(llama, tp=8, pp=4, dp=4, zero_stage=1).total > 0


def test_hugging_face_names_and_dicts_are_accepted():
    hf = {"n_layer": 96, "n_embd": 12288, "n_head": 96, "n_positions": 2048, "vocab_size": 51200}
    ns = cfg("175B")
    assert TransformerShape.of(hf) == TransformerShape.of(ns)


def test_175b_on_one_80gb_gpu_is_oom():
    r = memory_per_gpu(cfg("175B"))
    assert not r.fits(A100_80GB)
    v = r.verdict(A100_80GB)
    assert v.startswith("OOM") and "80.0 GB" in v and "parameters" in v
    # 18 bytes per parameter of model states alone (bf16 params, fp32 grads, Adam)
    assert r.model_states == pytest.approx(18 * parameter_count(cfg("175B")).total)


@pytest.mark.parametrize("model", ["22B", "175B", "530B", "1T"])
@pytest.mark.parametrize("recompute", ["full", "selective"])
def test_published_korthikanti_runs_fit_on_a100_80gb(model, recompute):
    """Table 3/5 runs (full recompute baseline, and SP + selective) trained on A100 80GB, no DP."""
    k = KORTHIKANTI[model]
    r = memory_per_gpu(cfg(model), tp=k["t"], pp=k["p"], micro_batch_size=k["b"],
                       virtual_pipeline_size=k["v"], sequence_parallel=recompute == "selective",
                       recompute=recompute)
    assert r.fits(A100_80GB), r.verdict(A100_80GB)


def test_zero_stages_shard_over_dp():
    c = cfg("175B")
    base = memory_per_gpu(c, tp=8, pp=8, dp=8)
    z1 = memory_per_gpu(c, tp=8, pp=8, dp=8, zero_stage=1)
    z2 = memory_per_gpu(c, tp=8, pp=8, dp=8, zero_stage=2)
    z3 = memory_per_gpu(c, tp=8, pp=8, dp=8, zero_stage=3)
    assert z1.optimizer_states == pytest.approx(base.optimizer_states / 8)
    assert z1.gradients == base.gradients and z1.parameters == base.parameters
    assert z2.gradients == pytest.approx(base.gradients / 8) and z2.parameters == base.parameters
    assert z3.parameters == pytest.approx(base.parameters / 8)
    assert z3.activations == base.activations
    # Megatron distributed optimizer doc: bf16 params + fp32 grads = 6 + 12/d bytes per parameter
    n = z1.params_per_gpu
    assert z1.model_states == pytest.approx((6 + 12 / 8) * n)


def test_fp16_grads_and_fp32_training_options():
    c = cfg("22B")
    zero_paper = memory_per_gpu(c, grad_bytes=2)
    assert zero_paper.model_states == pytest.approx(16 * zero_paper.params_per_gpu)  # ZeRO's 2 + 2 + 12
    fp32 = memory_per_gpu(c, param_bytes=4, grad_bytes=4)
    assert fp32.model_states == pytest.approx(16 * fp32.params_per_gpu)  # 4 + 4 + 8 (no master copy)


def test_context_parallel_divides_sequence():
    c = cfg("175B")
    one = memory_per_gpu(c, tp=8, pp=8, sequence_parallel=True, recompute="selective", stage=3)
    two = memory_per_gpu(c, tp=8, pp=8, cp=2, sequence_parallel=True, recompute="selective", stage=3)
    assert two.activations == pytest.approx(one.activations / 2)


def test_flash_attention_drops_score_matrices():
    k = KORTHIKANTI["175B"]
    fa = activation_bytes_per_layer(S, 1, k["h"], k["a"], tp=8, sequence_parallel=True, flash_attention=True)
    assert fa == pytest.approx(34 * S * k["h"] / 8 + 4 * k["a"] * S / 8)


def test_fits_accepts_a_gpu_spec():
    import hwmodel.specs as specs
    r = MemoryBreakdown(parameters=40e9, gradients=0, optimizer_states=0, activations=30e9)
    gpu = specs.get_gpu("A100-SXM4-80GB")
    assert r.fits(gpu) and not r.fits(gpu, headroom_bytes=20e9)
    assert r.verdict(gpu).startswith("fits")


@pytest.mark.parametrize("kw, match", [
    ({"recompute": "some"}, "recompute"),
    ({"zero_stage": 4}, "zero_stage"),
    ({"tp": 7}, "tp"),
    ({"pp": 97}, "pp"),
    ({"dp": 0}, "dp"),
])
def test_bad_arguments_raise(kw, match):
    with pytest.raises(ValueError, match=match):
        memory_per_gpu(cfg("175B"), **kw)


# -- FP8 training (Transformer Engine): FP8 saved GEMM inputs and FP8 weight copies -------------------

@pytest.mark.parametrize("model", ["22B", "175B"])
def test_fp8_activations_closed_forms(model):
    """GPT (4h GeLU MLP, MHA): QKV and MLP inputs 2 -> 1 byte (replicated 10 -> 8), fc2 input 8h -> 4h
    and, with FlashAttention, the projection input 2h -> 3h (FA's bf16 output + TE's FP8 copy):
    ``s*b*h*(8 + 21/t)``; without FlashAttention the projection input is 1h: ``8 + 19/t``."""
    k = KORTHIKANTI[model]
    s, b, h, a, t = S, k["b"], k["h"], k["a"], k["t"]
    stats = 4 * a * s * b / t  # FlashAttention's fp32 softmax statistics
    assert activation_bytes_per_layer(s, b, h, a, tp=t, flash_attention=True, fp8=True) == pytest.approx(
        s * b * h * (8 + 21 / t) + stats, rel=1e-12)
    assert activation_bytes_per_layer(s, b, h, a, tp=t, sequence_parallel=True, flash_attention=True,
                                      fp8=True) == pytest.approx(s * b * h / t * 29 + stats, rel=1e-12)
    assert activation_bytes_per_layer(s, b, h, a, tp=t, fp8=True) == pytest.approx(
        s * b * h * (8 + 19 / t + 5 * a * s / (h * t)), rel=1e-12)
    assert activation_bytes_per_layer(s, b, h, a, tp=t, recompute="full", fp8=True) == 2 * s * b * h


def test_fp8_memory_per_gpu_llama3_70b():
    """Llama 3 70B, TP 8 x PP 4 (20 layers per stage), SP + selective recompute: FP8 adds 2 bytes per
    Linear weight (E4M3 copy + transpose) and saves 2h + f - h bytes per token per layer / t."""
    from workload.zoo import get_model_config

    m = get_model_config("llama3-70b")
    h, f, kv, s = m.hidden_size, m.ffn_hidden_size, m.hidden_size * m.num_query_groups // m.num_attention_heads, \
        m.seq_length
    kw = {"tp": 8, "pp": 4, "dp": 2, "sequence_parallel": True, "recompute": "selective", "num_microbatches": 32,
              "virtual_pipeline_size": 4, "flash_attention": True, "stage": 0}
    bf16, fp8 = memory_per_gpu(m, **kw), memory_per_gpu(m, fp8=True, **kw)
    linear = h * (h + 2 * kv) + h * h + 3 * h * f
    assert fp8.fp8_weights == pytest.approx(2 * 20 * linear / 8, rel=1e-12)
    assert bf16.fp8_weights == 0
    assert (fp8.parameters, fp8.gradients, fp8.optimizer_states) == (bf16.parameters, bf16.gradients,
                                                                     bf16.optimizer_states)
    per_layer_saving = (2 * s * h / 8) + (f - h) * s / 8  # replicated (/t with SP) and split parts, b = 1
    assert bf16.detail["activation_bytes_per_layer"] - fp8.detail["activation_bytes_per_layer"] == \
        pytest.approx(per_layer_saving, rel=1e-12)
    assert fp8.total - bf16.total == pytest.approx(
        fp8.fp8_weights - (bf16.activations - fp8.activations), rel=1e-12)
    assert "fp8 weight copies" in fp8.verdict(80e9) and "fp8" not in bf16.verdict(80e9)
    # ZeRO-3 shards the FP8 copies over the data-parallel ranks, like the parameters
    z3 = memory_per_gpu(m, tp=8, dp=4, zero_stage=3, fp8=True, recompute="full")
    assert z3.fp8_weights == pytest.approx(2 * 80 * linear / 8 / 4, rel=1e-12)


# -- uneven pipeline stages ---------------------------------------------------------------------------

def test_uneven_stages_scale_the_first_stage_with_its_layers():
    """Llama 3 70B, TP 8 x PP 4: 35 + 5 + 5 + 35 layers instead of 20 per stage. Stage 0's layer
    parameters, model states and layer activations grow by exactly 35/20; it is the busiest stage."""
    from workload.zoo import get_model_config

    m = get_model_config("llama3-70b")
    counts = parameter_count(m)
    kw = {"tp": 8, "pp": 4, "sequence_parallel": True, "recompute": "selective", "num_microbatches": 32, "stage": 0}
    even = memory_per_gpu(m, **kw)
    uneven = memory_per_gpu(m, stage_layers=[35, 5, 5, 35], **kw)
    embedding = counts.embedding / 8  # vocabulary-parallel
    assert even.detail["layers"] == 20 and uneven.detail["layers"] == 35
    assert uneven.params_per_gpu - embedding == pytest.approx(35 / 20 * (even.params_per_gpu - embedding), rel=1e-12)
    layer_params = (counts.layer_dense - counts.layer_norms) / 8 + counts.layer_norms
    assert uneven.params_per_gpu == 35 * layer_params + embedding
    assert uneven.model_states == pytest.approx(18 * uneven.params_per_gpu, rel=1e-12)
    other = even.detail["other_activations"]
    assert uneven.detail["other_activations"] == other
    assert uneven.activations - other == pytest.approx(35 / 20 * (even.activations - other), rel=1e-12)
    kw.pop("stage")
    assert memory_per_gpu(m, stage_layers=[35, 5, 5, 35], **kw).stage == 0
    # a light first stage makes a middle stage the busiest
    assert memory_per_gpu(m, stage_layers=[2, 39, 37, 2], **kw).stage == 1
    with pytest.raises(ValueError, match="stage_layers"):
        memory_per_gpu(m, stage_layers=[35, 5, 5, 30], **kw)


def test_uneven_stages_flip_the_scenario_verdict():
    """The catalog's Llama 3 70B (TP 8 x PP 4, 32 micro-batches of 1, SP + selective) on H100 80GB, not
    interleaved: 20 layers per stage fit (63.4 GB), 35 on the first and last stages do not (109.1 GB)."""
    from scenarios.runner import memory_for, prepare, scenario_path
    from scenarios.scenario import load_scenario
    from workload.zoo import get_model_config

    base = ["parallel.virtual_pipeline_model_parallel_size=1"]
    uneven = base + ["parallel.num_layers_in_first_pipeline_stage=35",
                     "parallel.num_layers_in_last_pipeline_stage=35"]
    r = {k: memory_for(prepare(load_scenario(scenario_path("llama3-70b-tp8-pp4-dgx-h100"), o)))
         for k, o in (("even", base), ("uneven", uneven))}
    assert r["even"].fits(80e9) and not r["uneven"].fits(80e9)
    assert r["even"].total == pytest.approx(63.4e9, abs=0.05e9)
    assert r["uneven"].total == pytest.approx(109.1e9, abs=0.05e9)
    assert r["uneven"].stage == 0 and r["uneven"].detail["layers"] == 35
    counts = parameter_count(get_model_config("llama3-70b"))
    layer_params = (counts.layer_dense - counts.layer_norms) / 8 + counts.layer_norms
    assert r["uneven"].params_per_gpu - r["even"].params_per_gpu == pytest.approx(15 * layer_params, rel=1e-12)


# -- dropout masks ---------------------------------------------------------------------------------

@pytest.mark.parametrize("model", ["22B", "175B"])
def test_dropout_zero_stores_no_masks(model):
    """Korthikanti's 34 + 5as/h assumes dropout: with hidden_dropout 0 the two sbh masks go
    (34 -> 32, 10 -> 8 of the replicated part), with attention_dropout 0 the as^2b mask and the
    2as^2b dropout output go (5as/h -> 2as/h); FlashAttention's statistics stay."""
    k = KORTHIKANTI[model]
    s, b, h, a, t = S, k["b"], k["h"], k["a"], k["t"]

    def ours(**kw):
        return activation_bytes_per_layer(s, b, h, a, **kw)

    off = {"hidden_dropout": 0.0, "attention_dropout": 0.0}
    assert ours(**off) == pytest.approx(s * b * h * (32 + 2 * a * s / h), rel=1e-12)
    assert ours(tp=t, **off) == pytest.approx(s * b * h * (8 + 24 / t + 2 * a * s / (h * t)), rel=1e-12)
    assert ours(tp=t, sequence_parallel=True, **off) == pytest.approx(s * b * h / t * (32 + 2 * a * s / h),
                                                                      rel=1e-12)
    assert ours(tp=t, hidden_dropout=0.0) == pytest.approx(s * b * h * (8 + 24 / t + 5 * a * s / (h * t)),
                                                           rel=1e-12)
    assert ours(tp=t, attention_dropout=0.0) == pytest.approx(s * b * h * (10 + 24 / t + 2 * a * s / (h * t)),
                                                              rel=1e-12)
    assert ours(tp=t, recompute="selective", **off) == pytest.approx(s * b * h * (8 + 24 / t), rel=1e-12)
    assert ours(tp=t, flash_attention=True, **off) == pytest.approx(s * b * h * (8 + 24 / t) + 4 * a * s * b / t,
                                                                    rel=1e-12)
    assert ours(tp=t, recompute="full", **off) == 2 * s * b * h
    with pytest.raises(ValueError, match="hidden_dropout"):
        ours(hidden_dropout=1.0)


def test_dropout_read_from_the_model_config():
    """Dropout probabilities come from the config (Megatron / Hugging Face names); absent, Megatron's
    0.1. With dropout 0 the embedding's mask (sbh/t with SP) goes too."""
    k = KORTHIKANTI["175B"]
    s, h, t = S, k["h"], k["t"]
    on, off = cfg("175B"), cfg("175B")
    off.hidden_dropout = off.attention_dropout = 0.0
    assert TransformerShape.of(on).hidden_dropout == 0.1 == TransformerShape.of(on).attention_dropout
    assert TransformerShape.of({**vars(on), "resid_pdrop": 0.0, "attn_pdrop": 0.0}) == TransformerShape.of(off)
    kw = {"tp": t, "pp": 8, "sequence_parallel": True, "recompute": "selective", "stage": 0}
    a_on, a_off = memory_per_gpu(on, **kw), memory_per_gpu(off, **kw)
    assert a_on.detail["activation_bytes_per_layer"] == 34 * s * h / t
    assert a_off.detail["activation_bytes_per_layer"] == 32 * s * h / t
    assert a_on.detail["other_activations"] - a_off.detail["other_activations"] == 8 * s * h / t  # 8 in flight


def test_interleaved_stages_hold_their_warmup_chunks():
    """Megatron-LM's interleaved schedule: stage i runs (p-i-1)*2 + (v-1)*p warm-up forward chunks, then
    one more, before its first backward; each chunk is 1/v of the stage. Stage 0: p (1 + (p-1)/(p v))
    (Korthikanti sec. 4.2.3); the last stage p - (p-1)/v, not plain 1F1B's one micro-batch."""
    from workload.parallel.schedules import interleaved_1f1b, interleaved_in_flight

    p, v, m = 8, 3, 16
    for stage in range(p):
        alive = peak = 0
        for step in interleaved_1f1b(p, m, stage, v):  # the schedule itself: forwards alive at most
            alive += 1 if step.kind == "F" else -1
            peak = max(peak, alive)
        assert interleaved_in_flight(p, stage, v, m) == pytest.approx(peak / v)
    assert interleaved_in_flight(p, 0, v) == pytest.approx(p * (1 + (p - 1) / (p * v)))
    assert interleaved_in_flight(p, p - 1, v) == pytest.approx(p - (p - 1) / v)
    c = cfg("175B")
    plain = memory_per_gpu(c, tp=8, pp=8, sequence_parallel=True, recompute="selective", stage=7)
    inter = memory_per_gpu(c, tp=8, pp=8, sequence_parallel=True, recompute="selective", stage=7,
                           virtual_pipeline_size=3)
    layers = plain.activations - plain.detail["other_activations"]  # one micro-batch of 12 layers
    assert inter.activations - inter.detail["other_activations"] == pytest.approx(layers * (8 - 7 / 3))
