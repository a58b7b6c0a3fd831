"""DeepSpeed ZeRO-3's memory (``zero_impl = "deepspeed"``): the transient buffers come from the
coordinator's replay (per-module gathers) and the gradient buckets, in closed form; the FSDP estimate
(whole layers gathered and reduced) stays for ``zero_impl = "megatron"``."""

from dataclasses import replace

import pytest

from workload.memory import TransformerShape
from workload.parallel.config import ParallelConfig
from workload.parallel.deepspeed_memory import (
    gradient_order,
    joint_peak,
    layer_modules,
    layer_workspace,
    peak_gradient_elements,
    phase_peaks,
    transient_elements,
)
from workload.parallel.deepspeed_zero import Stage3Settings
from workload.zoo import get_model_config
from workload.zoo.family import transformer_memory


def _shape(name: str) -> TransformerShape:
    return TransformerShape.of(get_model_config(name))


def test_gpt_block_modules_hold_twelve_h_squared_weights():
    m = _shape("gpt3-175b")
    h = m.hidden_size
    mods = dict(layer_modules(m))
    assert mods["attn.qkv"] == (3 * h * h, 3 * h) and mods["mlp.fc2"] == (4 * h * h, h)
    assert sum(p[0] for name, p in mods.items() if not name.startswith("ln")) == 12 * h * h


def test_530b_gathers_at_most_proj_and_fc1():
    """h = 20480: qkv (3h^2), fc1 and fc2 (4h^2) each exceed stage3_max_live_parameters (1e9), so no hook
    prefetches while one of them is whole; only proj's hook (h^2 = 4.2e8 live) prefetches fc1: at most
    5 h^2 elements are gathered at once, not FSDP's layer and next layer (24 h^2)."""
    m = _shape("gpt-530b")
    gathered, _ = transient_elements(m, True)
    assert gathered == 5 * m.hidden_size ** 2


def test_gradient_peak_is_two_buckets_and_the_next_gradient():
    """Buckets of at most 5 elements over gradients 4, 4, 1, 3: [4], [4, 1], [3]. While [4] is reduced
    (it and its flattened copy), [4, 1] fills and 3 is produced: 2*4 + 5 + 3 = 16."""
    s = Stage3Settings(reduce_bucket_size=5)
    assert peak_gradient_elements([4, 4, 1, 3], s) == 16
    assert peak_gradient_elements([2], s) == 4  # one bucket: itself and its flattened copy
    assert peak_gradient_elements([], s) == 0


def test_530b_gradient_peak_closed_form():
    """530B, 5e8-element buckets, tied embeddings (the word embedding's gradient completes only after the
    embedding's backward, last): per layer backward gives the buckets [fc2], [fc1], [ln2, proj], [qkv],
    [ln1]. While fc1's (4h^2 + 4h) is reduced (itself and its flattened copy), [ln2 (2h), proj (h^2 + h)]
    waits and qkv's gradient (3h^2 + 3h) is produced: 12h^2 + 14h, above the embedding's own 2Vh
    (V = 2.5h) and fc2's turn (12h^2 + 8h)."""
    m = _shape("gpt-530b")
    _, grads = transient_elements(m, True)
    h, v = m.hidden_size, m.vocab_size
    assert grads == 2 * (4 * h * h + 4 * h) + (2 * h + h * h + h) + (3 * h * h + 3 * h)
    assert grads > 2 * v * h


def _rank_params(m: TransformerShape, tp: int) -> tuple[int, int]:
    """(all parameter elements, those above the persistence threshold) on one TP rank, each once."""
    s = Stage3Settings()
    block = [n for _, params in layer_modules(m, tp) for n in params]
    ends = [m.vocab_size * m.hidden_size // tp, m.seq_length * m.hidden_size, m.hidden_size]  # tied
    every = ends + block * m.num_layers
    return sum(every), sum(n for n in every if n > s.param_persistence_threshold)


@pytest.mark.parametrize("tp", [1, 2])
def test_small_model_gathers_its_tp_shard_once(tp):
    """gpt-1.7b at 4 layers (the issue's run): every module is reused within stage3_max_reuse_distance,
    so everything partitioned stays gathered, but each parameter once (the tied word embedding is one
    tensor) and on its TP shard only: V h / tp + s h + 4 (12 h^2 / tp + biases), never more than the
    rank's parameters. All gradients fit one 5e8 bucket: they and its flattened copy, 2x the rank's."""
    m = replace(_shape("gpt-1.7b"), num_layers=4)
    total, partitioned = _rank_params(m, tp)
    gathered, grads = transient_elements(m, True, Stage3Settings(), tp)
    assert gathered == partitioned <= total
    assert grads == 2 * total
    h = m.hidden_size
    assert partitioned == pytest.approx((m.vocab_size * h + 4 * 12 * h * h) / tp + m.seq_length * h, rel=1e-3)


def test_gathered_never_exceeds_the_rank_parameters():
    for name, layers in (("gpt-1.7b", 2), ("gpt-1.7b", 24), ("gpt-530b", 105)):
        m = replace(_shape(name), num_layers=layers)
        for tp in (1, 2, 8):
            total, _ = _rank_params(m, tp)
            gathered, grads = transient_elements(m, True, Stage3Settings(), tp)
            assert gathered <= total and grads <= 2 * total, (name, layers, tp)


def test_untied_output_layer_is_its_own_parameter():
    m = replace(_shape("gpt-1.7b"), num_layers=2)
    untied = replace(m, tied_embeddings=False)
    vh = m.vocab_size * m.hidden_size
    assert transient_elements(untied, True)[0] - transient_elements(m, True)[0] == vh
    assert gradient_order(untied)[0] == vh and gradient_order(m)[0] == m.hidden_size  # output, final norm


def _cfg(impl: str, dp: int = 640) -> ParallelConfig:
    return ParallelConfig(micro_batch_size=4, global_batch_size=4 * dp, zero_stage=3, zero_impl=impl,
                          recompute_granularity="full").resolve(dp)


def test_deepspeed_replaces_the_fsdp_gather_estimate():
    """The same run under both implementations: model states and the recompute workspace agree except the
    gradient partitions (fp16 under DeepSpeed, like the parameters); the transient term is DeepSpeed's
    at its backward peak, where the output layer's activations (final norm and output inputs 4sbh, fp32
    logits 4sbv: 2.35 GB at micro-batch 4) are already freed, with the recompute workspace alive at that
    moment (at most the whole one, which the FSDP estimate counts)."""
    cfg = get_model_config("gpt-530b")
    fsdp = transformer_memory(cfg, _cfg("megatron"), "bf16")
    ds = transformer_memory(cfg, _cfg("deepspeed"), "bf16")
    m = TransformerShape.of(cfg)
    sb = m.seq_length * 4
    assert fsdp.activations - ds.activations == pytest.approx(4 * sb * m.hidden_size + 4 * sb * m.vocab_size)
    assert ds.workspace <= fsdp.workspace
    assert ds.optimizer_states == fsdp.optimizer_states and ds.parameters == fsdp.parameters
    assert ds.gradients == pytest.approx(fsdp.gradients / 2)  # bf16 state bytes: fp32 main grads -> 2 B
    _, (gathered, grads, ws) = joint_peak(m, True, Stage3Settings(), 1, layer_workspace(m, _cfg("deepspeed")), 2)
    assert ds.gather_buffers == (gathered + grads) * 2 and ds.workspace == ws
    assert ds.gather_buffers < 0.6 * fsdp.gather_buffers


def test_530b_joint_peak_is_at_a_qkv_backward():
    """530B: the sum of gathered parameters and unpartitioned gradients is largest at a layer's qkv
    backward: qkv whole (3h^2 + its persistent bias is not gathered) with fc1's bucket being reduced and its
    flattened copy (8h^2 + 8h), [ln2, proj] waiting (h^2 + 3h), qkv's gradient (3h^2 + 3h) and the tied
    word embedding's gradient from the output layer, held until the embedding's backward (V h): 17.5 h^2
    + 14h, below the two peaks added (5 h^2 + 12 h^2 + 14h, the old upper bound) plus that held V h.
    The forward's peak (5 h^2, no gradients) is smaller."""
    m = _shape("gpt-530b")
    h, v = m.hidden_size, m.vocab_size
    fwd, (gathered, grads) = phase_peaks(m, True)
    assert gathered == 3 * h * h and fwd == 5 * h * h
    assert grads == 12 * h * h + 14 * h + v * h
    g_peak, r_peak = transient_elements(m, True)
    assert gathered + grads < g_peak + r_peak + v * h and gathered < g_peak



_UNITS = {"TB": 1e12, "GB": 1e9, "MB": 1e6, "kB": 1e3, "B": 1.0}


@pytest.mark.parametrize("impl", ["deepspeed", "megatron"])
def test_verdict_parts_add_up_to_the_stated_total(impl):
    """The issue's run (gpt-1.7b, 4 layers, ZeRO-3 on 8 GPUs): the verdict's listed parts, the gather
    term included, sum to the bytes it says are needed (each part rounded to 0.05 of its unit)."""
    import re

    import hwmodel.specs as specs
    from workload import allocator

    gpu = specs.get_gpu("A100-SXM4-80GB")
    cfg = replace(get_model_config("gpt-1.7b"), num_layers=4)
    p = ParallelConfig(micro_batch_size=1, global_batch_size=16, zero_stage=3, zero_impl=impl).resolve(8)
    mem = allocator.with_framework(transformer_memory(cfg, p, "bf16"), p, gpu)
    assert mem.gather_buffers > 0
    text = re.sub(r" \(reserved [^)]*\)", "", mem.verdict(gpu))
    stated, listed = re.match(r"fits: ([\d.]+ \w+) of [^(]*\([^;]*; (.*); stage \d+\)$", text).groups()
    values = [(float(v), u) for v, u in (part.rsplit(" ", 2)[-2:] for part in listed.split(", "))]
    n, unit = stated.split()
    rounding = 0.05 * (_UNITS[unit] + sum(_UNITS[u] for _, u in values))
    assert sum(v * _UNITS[u] for v, u in values) == pytest.approx(float(n) * _UNITS[unit], abs=rounding)
    assert ("unpartitioned gradients" in text) == (impl == "deepspeed")


def test_small_model_joint_peak_is_the_epilogue_flush():
    """gpt-1.7b at 4 layers: all gradients fit one 5e8 bucket, reduced by the backward's epilogue, so the
    joint peak is there: that bucket and its flattened copy (2x the rank's parameters) with what is still
    gathered, never more than the two peaks added."""
    m = replace(_shape("gpt-1.7b"), num_layers=4)
    total, _ = _rank_params(m, 1)
    _, (gathered, grads) = phase_peaks(m, True)
    assert grads == 2 * total
    assert gathered + grads <= sum(transient_elements(m, True))
