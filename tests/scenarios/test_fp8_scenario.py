"""FP8 training end to end: the what-if catalog sweep (BF16 vs FP8, Llama 3 70B on 64 H100) against
published FP8 speed-ups, its memory against the formula, and the one-line errors for bad input."""

import pytest

from scenarios.cli import main
from scenarios.runner import run_scenario
from scenarios.sweep import load_sweep, point_scenario
from workload.zoo import get_model_config

SWEEP = "whatif-fp8-llama3-70b-dgx-h100"


@pytest.fixture(scope="module")
def runs():
    sweep = load_sweep(SWEEP)
    out = {}
    for values in sweep.points():
        out[values["training.dtype"]] = run_scenario(point_scenario(sweep.base, values, sweep.source)).metrics
    return out


def test_fp8_speedup_on_64_h100_is_in_the_published_range(runs):
    """Published end-to-end FP8 (per-tensor scaling) over BF16 speed-ups of LLM training on H100 lie
    around 1.2-1.5x: Peng et al. 2023 (FP8-LM, arXiv:2310.18313) report their FP8 GPT-175B on H100
    64-75 % faster than BF16 Megatron-LM and 17-37 % faster than Transformer Engine (by paper version),
    i.e. TE at about 1.3-1.4x; NVIDIA's NeMo AutoModel FP8 guide reports "over 1.2x" on 8 H100
    (torchao, tensorwise); NVIDIA's blog "Faster Training Throughput in FP8 Precision with NVIDIA NeMo"
    (2025) finds the gain growing with model size (Llama 3 8B to 70B). It stays well below the
    GEMM-only 1.95x (2 x 0.825/0.846) because attention, norms, elementwise kernels, the casts, the
    bf16 LM head, tensor-parallel communication and the pipeline bubble do not speed up. The model
    gives 1.31x here."""
    bf16, fp8 = runs["bf16"], runs["fp8"]
    speedup = bf16["iteration_time_s"] / fp8["iteration_time_s"]
    assert 1.2 <= speedup <= 1.5
    # MFU is against the bf16 peak for both, so the MFU ratio is the speed-up; FLOPs are the same
    assert fp8["model_flops_per_iteration"] == bf16["model_flops_per_iteration"]
    assert fp8["mfu"] / bf16["mfu"] == pytest.approx(speedup, rel=1e-9)


def test_fp8_memory_follows_the_formula(runs):
    """Stage 0 of TP 8 x PP 4 holds 20 layers; FP8 adds 2 bytes per Linear weight (E4M3 copy and its
    transpose) and keeps parameters, fp32 gradients and optimizer states."""
    m = get_model_config("llama3-70b")
    h, f = m.hidden_size, m.ffn_hidden_size
    kv = h * m.num_query_groups // m.num_attention_heads
    linear = h * (h + 2 * kv) + h * h + 3 * h * f  # QKV, projection, SwiGLU fc1 (2f) and fc2
    bf16, fp8 = runs["bf16"]["memory"], runs["fp8"]["memory"]
    assert fp8["fp8_weights_bytes"] == pytest.approx(2 * 20 * linear / 8, rel=1e-12)  # 4.28 GB
    assert bf16["fp8_weights_bytes"] == 0
    for k in ("parameters_bytes", "gradients_bytes", "optimizer_states_bytes"):
        assert fp8[k] == bf16[k]
    assert fp8["activations_bytes"] < bf16["activations_bytes"]
    assert not runs["fp8"]["oom"] and runs["fp8"]["peak_allocated_bytes"] > runs["bf16"]["peak_allocated_bytes"]


def test_fp8_on_a100_is_one_line_naming_the_field_and_the_gpus(capsys):
    assert main(["run", "--set", "training.dtype=fp8"]) == 2  # the default scenario: DGX A100
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "Traceback" not in err
    # the GPUs with an fp8 peak (what-if GPUs loaded by other tests may follow the shipped ones)
    assert "[training] dtype 'fp8' needs FP8 tensor cores (H100-SXM5, H200-SXM, B200-HGX" in err
    assert err.endswith("); A100-SXM4-80GB has none; allowed on it: bf16, fp16, fp32")


def test_unknown_dtype_lists_the_allowed_ones(capsys):
    assert main(["run", "--set", "training.dtype=fp4"]) == 2
    err = capsys.readouterr().err.strip()
    assert "[training] dtype: unknown 'fp4'; allowed: bf16, fp16, fp32, fp8" in err and "\n" not in err


# -- FP8 recipes ([training] fp8_recipe, fp8_param_gather) --------------------------------------------

RECIPES_SWEEP = "whatif-fp8-recipes-llama3-8b-dgx-h100"


@pytest.fixture(scope="module")
def recipe_runs():
    """The recipes sweep (Llama 3 8B, FSDP on 8 H100, sequence 8192), plus bf16 and tensorwise with FP8
    parameter all-gathers."""
    sweep = load_sweep(RECIPES_SWEEP)
    out = {}
    for values in sweep.points():
        out[values["training.fp8_recipe"]] = run_scenario(point_scenario(sweep.base, values, sweep.source)).metrics
    extra = {"bf16": {"training.dtype": "bf16"},
             "tensorwise+ag": {"training.fp8_recipe": "tensorwise", "training.fp8_param_gather": True}}
    for key, values in extra.items():
        out[key] = run_scenario(point_scenario(sweep.base, values, sweep.source)).metrics
    return out


def test_recipes_against_torchao_float8_training_benchmark(recipe_runs):
    """Out of sample (no constant is fitted to end-to-end FP8 data): torchao's float8 README, "Training
    benchmarks", torchtitan on 8 H100, Llama 3 8B, batch 1, sequence 8192, FSDP2, per-op SAC, torch.compile:
    bf16 6150 tokens/s, tensorwise with float8 all-gather 7689.5 (1.250x), rowwise with bf16 all-gather
    6768 (1.100x). The model: 1.31x and 1.18x (+5 % and +7 %), their ratio 1.11 against 1.136 (-2 %)."""
    t = {k: v["iteration_time_s"] for k, v in recipe_runs.items()}
    assert t["bf16"] / t["tensorwise+ag"] == pytest.approx(7689.5 / 6150, rel=0.10)
    assert t["bf16"] / t["rowwise"] == pytest.approx(6768 / 6150, rel=0.10)
    assert t["rowwise"] / t["tensorwise+ag"] == pytest.approx(7689.5 / 6768, rel=0.05)
    # the amax pass makes current scaling slower than delayed; FP8 weight gathers win it back
    assert t["tensorwise+ag"] < t["delayed"] < t["tensorwise"] < t["rowwise"] < t["bf16"]


def test_fp8_param_gather_keeps_fsdp_memory_and_rowwise_holds_bf16_memory(recipe_runs):
    """torchao's float8 all-gather keeps the bf16 sharded parameter: per-GPU memory as without it.
    torchao's Float8Linear (rowwise) saves the bf16 input and weight for backward: bf16 training's memory;
    TE's recipes save FP8 GEMM inputs and keep FP8 weight copies."""
    assert recipe_runs["tensorwise+ag"]["memory"] == recipe_runs["tensorwise"]["memory"]
    assert recipe_runs["rowwise"]["memory"] == recipe_runs["bf16"]["memory"]
    assert recipe_runs["delayed"]["memory"]["fp8_weights_bytes"] > 0


def test_fp8_param_gather_with_the_distributed_optimizer_stores_fp8_parameters():
    """Megatron's FP8 parameters: 1 byte instead of 2 per FP8-GEMM weight, the FP8 copy beside them
    reduced to the transpose: 2 bytes less per FP8-GEMM weight element on the GPU."""
    from scenarios.runner import memory_for, prepare
    from scenarios.scenario import load_scenario

    sets = ["training.dtype='fp8'"]
    a, b = (memory_for(prepare(load_scenario("scenarios/catalog/llama3-8b-tp2-dgx-h100.toml", s)))
            for s in (sets, [*sets, "training.fp8_param_gather=true"]))
    n = a.fp8_weights / 2
    assert n > 0 and b.parameters == pytest.approx(a.parameters - n) and b.fp8_weights == pytest.approx(n)
    assert b.total == pytest.approx(a.total - 2 * n)


@pytest.mark.parametrize(("sets", "message"), [
    (["training.dtype='fp8'", "training.fp8_recipe='mxfp8'"],
     "[training] fp8_recipe 'mxfp8' needs a blackwell GPU"),
    (["training.fp8_recipe='fp4'"],
     "[training] fp8_recipe: unknown 'fp4'; allowed: delayed, tensorwise, rowwise, mxfp8"),
    (["training.fp8_recipe='rowwise'"], "[training] fp8_recipe 'rowwise' applies to dtype = 'fp8', got dtype 'bf16'"),
    (["training.fp8_param_gather=true"], "[training] fp8_param_gather all-gathers FP8 weights; it needs dtype = 'fp8'"),
    (["training.dtype='fp8'", "training.fp8_param_gather=true", "parallel.use_distributed_optimizer=false",
      "parallel.overlap_param_gather=false"],
     "[training] fp8_param_gather changes the parameter all-gather"),
    (["training.dtype='fp8'", "training.fp8_recipe='rowwise'", "training.fp8_param_gather=true"],
     "[training] fp8_param_gather is not available with fp8_recipe 'rowwise'"),
])
def test_fp8_recipe_refusals_are_one_line(capsys, sets, message):
    argv = ["run", "llama3-8b-tp2-dgx-h100"]
    for s in sets:
        argv += ["--set", s]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err and "Traceback" not in err
