"""The full-recompute workspace over one layer's backward (workload.recompute_lifetime): Korthikanti et
al. 2022 Table 2's terms, each freed when the op that saved it has run its backward, and DeepSpeed
ZeRO-3's joint peak with them (workload.parallel.deepspeed_memory.joint_peak)."""

from dataclasses import replace

import pytest

from workload.memory import TransformerShape, activation_bytes_per_layer, memory_per_gpu
from workload.parallel.config import ParallelConfig
from workload.parallel.deepspeed_memory import joint_peak, layer_workspace
from workload.parallel.deepspeed_zero import Stage3Settings
from workload.recompute_lifetime import MODULES, saved_bytes_by_op, workspace_by_module
from workload.zoo import get_model_config

SC21_DROPOUT = {"hidden_dropout": 0.1, "attention_dropout": 0.1}
"""SC'21 Table 2's 530B ran 2021 Megatron-LM: dropout on (and no FlashAttention)."""


def _shape(name: str, **changes) -> TransformerShape:
    return replace(TransformerShape.of(get_model_config(name)), **changes)


CASES = [
    ("gpt-530b", {}, {"micro_batch_size": 4, "flash_attention": False}),
    ("gpt-530b", {"attention_dropout": 0.0, "hidden_dropout": 0.0}, {"micro_batch_size": 2, "flash_attention": False}),
    ("gpt3-175b", {}, {"micro_batch_size": 1, "tp": 8, "sequence_parallel": True, "flash_attention": True,
                       "fp8": True}),
    ("gpt3-175b", {}, {"micro_batch_size": 1, "tp": 8, "flash_attention": False, "fp8": True, "cp": 2}),
    ("llama3-70b", {}, {"micro_batch_size": 1, "tp": 8, "sequence_parallel": True, "flash_attention": True}),
    ("llama3-8b", {"qk_norm": True, "head_dim": 256}, {"micro_batch_size": 2, "tp": 2, "flash_attention": True}),
]


@pytest.mark.parametrize("name,changes,kw", CASES)
def test_saved_bytes_add_up_to_the_layer_activations(name, changes, kw):
    """The ops' saved tensors are Table 2's terms split by op: they add up to a layer's activations
    without recomputation, and the first LayerNorm's input is what full recomputation keeps."""
    m = _shape(name, **changes)
    saved = saved_bytes_by_op(m, **kw)
    args = {"tp": kw.get("tp", 1), "sequence_parallel": kw.get("sequence_parallel", False), "cp": kw.get("cp", 1),
            "ffn_hidden_size": m.ffn_hidden_size, "num_query_groups": m.num_query_groups, "gated_mlp": m.gated_mlp,
            "flash_attention": kw["flash_attention"], "fp8": kw.get("fp8", False),
            "hidden_dropout": m.hidden_dropout, "attention_dropout": m.attention_dropout, "head_dim": m.head_dim,
            "qk_norm": m.qk_norm}

    def table2(mode: str) -> float:
        return activation_bytes_per_layer(m.seq_length, kw["micro_batch_size"], m.hidden_size,
                                          m.num_attention_heads, recompute=mode, **args)

    assert sum(b for _, b in saved) == pytest.approx(table2("none"), rel=1e-12)
    assert saved[0] == ("ln1", pytest.approx(table2("full"), rel=1e-12))


def test_530b_workspace_over_the_layer_backward_closed_form():
    """530B, micro-batch 4, no TP: the whole workspace is Table 2's 34 sbh + 5 a s^2 b less the
    checkpointed input 2 sbh (16.1 GB) once the recomputed forward ends; at fc2's backward the last
    dropout mask (sbh) is gone; at the attention core's backward Q, K, V, the scores and the qkv input
    remain (6 sbh + 5 a s^2 b + 2 sbh); at the qkv GEMM's backward only its saved input (2 sbh, the first
    norm's output) is left; at the first norm's, nothing (its input is the checkpoint)."""
    m = _shape("gpt-530b", **SC21_DROPOUT)
    s, b, h, a = m.seq_length, 4, m.hidden_size, m.num_attention_heads
    sbh, scores = s * b * h, 5 * a * s * s * b
    ws = workspace_by_module(saved_bytes_by_op(m, micro_batch_size=b, flash_attention=False))
    whole = 32 * sbh + scores
    assert ws["mlp.fc2"].forward_after == whole == pytest.approx(16.1e9, rel=2e-3)
    assert ws["mlp.fc2"].backward == whole - sbh
    assert ws["attn.proj"].backward_after == 2 * sbh + 6 * sbh + scores  # the core's backward, after proj's
    assert ws["attn.qkv"].backward == 2 * sbh  # the bytes of the qkv GEMM's saved input
    assert ws["ln1"].backward == ws["ln1"].backward_after == 0
    backward = [x for name in reversed(MODULES) for x in (ws[name].backward, ws[name].backward_after)]
    assert backward == sorted(backward, reverse=True)  # freed as the backward walks back
    assert max(x for w in ws.values() for x in vars(w).values()) == whole


@pytest.mark.parametrize("flash", [False, True])
def test_whole_workspace_is_the_memory_models(flash):
    """The profile's peak is the workspace memory_per_gpu counts for full recomputation, which is what
    Megatron's full recompute (nothing else changing within a layer's backward) keeps counting."""
    cfg = replace(get_model_config("gpt3-175b"), attention_backend="flash" if flash else "unfused")
    m = TransformerShape.of(cfg)
    ws = workspace_by_module(saved_bytes_by_op(m, micro_batch_size=2, tp=8, sequence_parallel=True,
                                               flash_attention=flash))
    mem = memory_per_gpu(cfg, tp=8, pp=8, dp=2, micro_batch_size=2, sequence_parallel=True, recompute="full",
                         flash_attention=flash)
    assert ws["mlp.fc2"].forward_after == pytest.approx(mem.workspace, rel=1e-12)


def test_530b_deepspeed_joint_peak_is_at_fc2_backward():
    """DeepSpeed ZeRO-3, 530B, micro-batch 4, fp16: with the workspace's lifetime the joint peak of
    gathered parameters, gradient buckets and workspace is at a layer's fc2 backward: fc2 whole (4 h^2),
    the next layer's qkv bucket being reduced and its flattened copy (6 h^2 + 6 h), that layer's ln1
    gradient waiting (2 h), fc2's gradient being produced (4 h^2 + h), the tied embedding's held V h,
    and the workspace less the last dropout mask. At the qkv backward (the buckets' own peak, 17.5 h^2 +
    14 h with V h) only 2 sbh of workspace is left, 14.7 GB lower."""
    m = _shape("gpt-530b", **SC21_DROPOUT)
    h, v, sbh = m.hidden_size, m.vocab_size, m.seq_length * 4 * m.hidden_size
    p = ParallelConfig(micro_batch_size=4, global_batch_size=2560, zero_stage=3, zero_impl="deepspeed",
                       recompute_granularity="full").resolve(640)
    profile = layer_workspace(m, p, flash_attention=False)
    _, (gathered, grads, ws) = joint_peak(m, True, Stage3Settings(), 1, profile, 2)
    whole = profile[-1].forward_after
    assert (gathered, grads, ws) == (4 * h * h, 10 * h * h + 9 * h + v * h, whole - sbh)
    at_qkv = (3 * h * h + 12 * h * h + 14 * h + v * h) * 2 + 2 * sbh
    assert (gathered + grads) * 2 + ws - at_qkv == pytest.approx(whole - 3 * sbh - 2 * h * h - 10 * h, rel=1e-12)


def test_workspace_by_module_needs_each_module_once():
    saved = saved_bytes_by_op(_shape("gpt-1.7b"), micro_batch_size=1)
    with pytest.raises(ValueError, match="ln1, attn.qkv"):
        workspace_by_module(saved[1:])
