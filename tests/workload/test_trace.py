"""Tracing on the meta device: FLOPs against published formulas, layer dedup, the op graph, errors."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from hwmodel.ir import KERNEL_KINDS, Compute
from workload.trace import OpGraph, TraceError, trace_model
from workload.zoo import build_model

# Narayanan et al. SC'21 (arXiv:2104.04473) Table 1: (name, hidden h, layers l); V = 51200, s = 2048.
SC21_TABLE1 = [("gpt-1.7b", 2304, 24), ("gpt-3.6b", 3072, 30), ("gpt-7.5b", 4096, 36), ("gpt-18b", 6144, 40),
               ("gpt-39b", 8192, 48), ("gpt-76b", 10240, 60), ("gpt-145b", 12288, 80),
               ("gpt-310b", 16384, 96), ("gpt-530b", 20480, 105), ("gpt-1t", 25600, 128)]
V, S = 51200, 2048

TINY_GPT = {"num_layers": 3, "hidden_size": 128, "num_attention_heads": 4, "seq_length": 64, "vocab_size": 512}
TINY_LLAMA = {"num_layers": 3, "hidden_size": 128, "num_attention_heads": 4, "num_query_groups": 2,
                  "ffn_hidden_size": 256, "seq_length": 64, "vocab_size": 512}


@pytest.fixture(scope="module")
def tiny_gpt() -> OpGraph:
    return trace_model(build_model("gpt-1.7b", **TINY_GPT), micro_batch_size=2)


@pytest.mark.parametrize("name,h,l", SC21_TABLE1)
def test_gpt_flops_match_megatron_formula(name: str, h: int, l: int) -> None:
    """fwd+bwd = 72·B·s·l·h²·(1 + s/6h + V/12lh); + full recompute = 96·B·s·l·h²·(1 + s/6h + V/16lh)."""
    B = 1
    g = trace_model(build_model(name), micro_batch_size=B, optimizer=False)
    assert g.num_blocks == l and g.info["layer_dedup"]
    traced = g.total_flops("fwd") + g.total_flops("bwd")
    megatron = 72 * B * S * l * h**2 * (1 + S / (6 * h) + V / (12 * l * h))
    assert traced == pytest.approx(megatron, rel=0.01)
    assert g.total_flops("bwd") == pytest.approx(2 * g.total_flops("fwd"), rel=1e-9)
    with_recompute = traced + g.recompute_flops("full")  # SC'21 eq. (3), as Table 1 counts
    assert with_recompute == pytest.approx(96 * B * S * l * h**2 * (1 + S / (6 * h) + V / (16 * l * h)), rel=0.01)


def test_llama3_8b_flops_per_token_match_6n_plus_attention() -> None:
    """PaLM (Chowdhery et al. 2022, arXiv:2204.02311) App. B: 6·N + 12·l·h·s FLOPs per token, where N
    counts the parameters that multiply activations: all but the input embedding table (a lookup)."""
    model = build_model("llama3-8b")
    cfg = model.config
    B = 1
    g = trace_model(model, micro_batch_size=B, optimizer=False)
    n_params = sum(p.numel() for p in model.parameters())
    assert n_params == 8_030_261_248  # Meta-Llama-3-8B
    n_matmul = n_params - cfg.vocab_size * cfg.hidden_size
    per_token = (g.total_flops("fwd") + g.total_flops("bwd")) / (B * cfg.seq_length)
    expected = 6 * n_matmul + 12 * cfg.num_layers * cfg.hidden_size * cfg.seq_length
    assert per_token == pytest.approx(expected, rel=0.01)


def test_layer_dedup_is_exact(tiny_gpt: OpGraph) -> None:
    for name, kw in (("gpt-1.7b", TINY_GPT), ("llama3-8b", TINY_LLAMA),
                     ("mixtral-8x7b", TINY_LLAMA)):
        a = trace_model(build_model(name, **kw), layer_dedup=True)
        b = trace_model(build_model(name, **kw), layer_dedup=False)
        assert a.info["layer_dedup"] and not b.info["layer_dedup"]
        # (ModuleTracker's attribution of the embedding backwards, outside the blocks, can vary.)
        def key(g: OpGraph) -> list[tuple]:
            return [(o.name, o.kind, o.layer if o.block is not None else "", o.phase, o.flops,
                     o.bytes_accessed, o.shape, o.deps) for o in g.ops]

        assert key(a) == key(b), name
        assert [(o.part, o.block) for o in a.ops] == [(o.part, o.block) for o in b.ops], name


def test_graph_structure(tiny_gpt: OpGraph) -> None:
    g = tiny_gpt
    assert [o.index for o in g.ops] == list(range(len(g)))
    assert all(d < o.index for o in g.ops for d in o.deps)
    assert {o.kind for o in g.ops} <= set(KERNEL_KINDS)
    assert [o.phase for o in g.ops] == sorted((o.phase for o in g.ops), key=["fwd", "bwd", "opt"].index)
    for i in range(3):
        for phase in ("fwd", "bwd", "opt"):
            ops = g.block_ops(i, phase)
            assert ops and all(o.layer.startswith(f"layers.{i}") and o.block == i for o in ops)
        # one flash-attention kernel each way per layer, attributed to the block's attention
        for phase in ("fwd", "bwd"):
            att = [o for o in g.block_ops(i, phase) if o.kind == "attention"]
            assert [o.layer for o in att] == [f"layers.{i}.attn"]
    # backward runs the blocks in reverse
    bwd_blocks = [o.block for o in g.select("bwd") if o.block is not None]
    assert bwd_blocks == sorted(bwd_blocks, reverse=True)
    # block i's input is block i-1's output
    first = g.block_ops(1, "fwd")[0]
    assert g.ops[max(first.deps)].block == 0
    assert "embedding" in {o.kind for o in g.pre_ops("fwd")} and g.post_ops("fwd")[-1].kind == "loss"
    assert "embedding" in {o.kind for o in g.pre_ops("bwd")}  # the embeddings' backward, issued last
    assert g.pre_ops("bwd")[-1].index > g.block_ops(0, "bwd")[-1].index > g.post_ops("bwd")[-1].index
    assert {o.kind for o in g.select("opt")} == {"optimizer"}
    assert set(g.by_layer()) >= {"layers.2.attn.qkv", "layers.0.mlp.fc2", "ln_f", ""}


def test_gemm_and_attention_records(tiny_gpt: OpGraph) -> None:
    B, s, h, heads = 2, 64, 128, 4
    qkv = [o for o in tiny_gpt.block_ops(0, "fwd") if o.layer == "layers.0.attn.qkv" and o.kind == "gemm"]
    assert len(qkv) == 1
    op = qkv[0]
    assert op.name == "aten.addmm" and op.shape == (1, B * s, 3 * h, h) and op.dtype == "bf16"
    assert op.flops == 2 * B * s * 3 * h * h
    # bytes: A (Bs x h) + W^T (h x 3h) + bias (3h, broadcast rows counted once) + out (Bs x 3h), bf16
    assert op.bytes_accessed == 2 * (B * s * h + h * 3 * h + 3 * h + B * s * 3 * h)
    fa = next(o for o in tiny_gpt.block_ops(0, "fwd") if o.kind == "attention")
    fb = next(o for o in tiny_gpt.block_ops(0, "bwd") if o.kind == "attention")
    assert fa.shape == fb.shape == (B, heads, s, s, h // heads) and fa.causal and fb.causal
    assert fa.flops == fa.kernel_flops == 4 * B * s * s * h
    assert fb.kernel_flops == 2.5 * fa.kernel_flops and fb.flops == 2 * fa.flops


def test_to_compute_tasks(tiny_gpt: OpGraph) -> None:
    tasks = tiny_gpt.to_compute_tasks()
    assert len(tasks) == len(tiny_gpt) and all(isinstance(t, Compute) for t in tasks)
    i = next(o.index for o in tiny_gpt.ops if o.kind == "attention")
    assert tasks[i].flops == 0.5 * tiny_gpt.ops[i].kernel_flops  # causal: half the blocks computed
    assert tiny_gpt.to_compute_tasks(causal_discount=False)[i].flops == tiny_gpt.ops[i].kernel_flops
    assert tasks[i].shape == tiny_gpt.ops[i].shape and tasks[i].layer == "layers.0.attn"
    # the explicit flag: every causal attention kernel, fwd and bwd, and nothing else
    assert [t.causal for t in tasks] == [o.kind == "attention" for o in tiny_gpt.ops]
    assert tiny_gpt.to_compute_tasks(causal_discount=False)[i].causal


def test_non_causal_attention_is_not_flagged() -> None:
    enc = nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True)
    g = trace_model(enc, (torch.empty(2, 16, 64, dtype=torch.bfloat16, device="meta"),), optimizer=False)
    att = [t for t in g.to_compute_tasks() if t.kind == "attention"]
    assert len(att) == 2 and not any(t.causal for t in att)
    assert [t.flops for t in att] == [o.kernel_flops for o in g.ops if o.kind == "attention"]


def test_optimizer_ops_per_parameter(tiny_gpt: OpGraph) -> None:
    per_block = [len(tiny_gpt.block_ops(i, "opt")) for i in range(3)]
    assert per_block[0] > 0 and len(set(per_block)) == 1
    layers = {o.layer for o in tiny_gpt.block_ops(2, "opt")}
    assert "layers.2.attn.qkv" in layers and "layers.2.ln1" in layers
    # fp32 master weights: each step reads/writes fp32 moments
    assert any(o.dtype == "fp32" for o in tiny_gpt.select("opt"))


def test_recompute_selective_is_attention_fwd(tiny_gpt: OpGraph) -> None:
    att = sum(o.flops for o in tiny_gpt.select("fwd") if o.kind == "attention")
    assert tiny_gpt.recompute_flops("selective") == att > 0
    with pytest.raises(ValueError, match="granularity"):
        tiny_gpt.recompute_flops("some")  # type: ignore[arg-type]


def test_moe_uniform_routing() -> None:
    g = trace_model(build_model("mixtral-8x7b", **TINY_LLAMA), micro_batch_size=2, optimizer=False)
    tokens, E, k, h, f = 2 * 64, 8, 2, 128, 256
    cap = math.ceil(tokens * k / E)
    experts = [o for o in g.block_ops(0, "fwd") if o.name == "aten.bmm"]
    assert [o.shape for o in experts] == [(E, cap, 2 * f, h), (E, cap, h, f)]


def test_resnet_traces_without_blocks() -> None:
    g = trace_model(build_model("resnet-50", image_size=64), optimizer=False)
    assert g.num_blocks == 0 and not g.info["layer_dedup"]
    convs = [o for o in g.select("fwd") if o.name == "aten.convolution"]
    assert len(convs) == 53 and all(o.kind == "gemm" and len(o.shape) == 4 for o in convs)
    assert g.total_flops("bwd") == pytest.approx(2 * g.total_flops("fwd"), rel=0.02)


class _Routed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gate = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nonzero(self.gate(x) > 0).float().sum()


class _Item(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x).sum() * self.fc.weight.mean().item()


def test_untraceable_ops_are_named() -> None:
    x = (torch.empty(2, 8, device="meta"),)
    with pytest.raises(TraceError, match=r"aten\.nonzero.*tokens-per-expert"):
        trace_model(_Routed(), x)
    with pytest.raises(TraceError, match=r"Tensor\.item\(\)"):
        trace_model(_Item(), x)


def test_user_module_on_cpu_is_moved_to_meta() -> None:
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    g = trace_model(model, (torch.empty(5, 16, device="meta"),), dtype=torch.float32)
    mms = [o for o in g.select("fwd") if o.kind == "gemm"]
    assert [o.shape for o in mms] == [(1, 5, 32, 16), (1, 5, 4, 32)] and mms[0].dtype == "fp32"
    assert [o.layer for o in mms] == ["0", "2"]


class _EncoderSDPA(nn.Module):
    """``nn.TransformerEncoderLayer``'s attention written by hand with ``F.scaled_dot_product_attention``
    (same parameters: packed in-projection, out-projection)."""

    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.in_proj = nn.Linear(d, 3 * d)
        self.out_proj = nn.Linear(d, d)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2)
                   for t in self.in_proj(x).split(C, -1))
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.out_proj(y.transpose(1, 2).reshape(B, T, C))


def _attention_ops(g: OpGraph) -> list[tuple[str, str, float, tuple]]:
    return [(o.name, o.kind, o.flops, o.shape) for o in g.ops if o.kind == "attention"]


def test_multihead_attention_traces_to_the_sdpa_kernel() -> None:
    B, T, d, heads = 2, 128, 64, 4
    x = torch.empty(B, T, d, dtype=torch.bfloat16, device="meta")
    enc = trace_model(nn.TransformerEncoderLayer(d, heads, 128, dropout=0.1, batch_first=True), [x])
    sdpa = trace_model(_EncoderSDPA(d, heads), [x])
    fwd = 4 * B * T * T * d  # QK^T and PV: 2 GEMMs of 2·B·T·T·d FLOPs
    want = [("aten._scaled_dot_product_flash_attention", "attention", fwd, (B, heads, T, T, d // heads)),
            ("aten._scaled_dot_product_flash_attention_backward", "attention", 2 * fwd, (B, heads, T, T, d // heads))]
    assert _attention_ops(enc) == _attention_ops(sdpa) == want
    # no B·H·T·T score tensor: no bmm and no softmax kernel in the encoder layer
    assert not [o for o in enc.ops if o.name in ("aten.bmm", "aten._softmax", "aten._safe_softmax")]
    assert [o.layer for o in enc.ops if o.kind == "attention"] == ["self_attn", "self_attn"]
    # need_weights=True returns the weights: the math path (bmm, softmax) is what a GPU runs
    mha = trace_model(nn.MultiheadAttention(d, heads, batch_first=True), [x, x, x],
                      loss_fn=lambda out: out[0].float().mean())
    assert not _attention_ops(mha)
    assert sum(o.flops for o in mha.ops if o.name == "aten.bmm" and o.phase == "fwd") == fwd


def test_masked_sdpa_costs_the_memory_efficient_kernel_with_the_mask_read() -> None:
    B, T, d, heads = 2, 128, 64, 4
    x = torch.empty(B, T, d, dtype=torch.bfloat16, device="meta")
    mask = torch.empty(T, T, dtype=torch.bfloat16, device="meta")  # additive, broadcast over B and heads
    g = trace_model(_EncoderSDPA(d, heads), [x, mask])
    fa, fb = [o for o in g.ops if o.kind == "attention"]
    assert fa.name == "aten._scaled_dot_product_efficient_attention"
    assert fb.name == "aten._scaled_dot_product_efficient_attention_backward"
    assert fa.shape == fb.shape == (B, heads, T, T, d // heads) and not fa.causal
    assert fa.flops == 4 * B * T * T * d and fb.flops == 2 * fa.flops
    # q, k, v, the (T, T) mask read once and the output, bf16; the fp32 log-sum-exp (B, H, T); the two
    # int64 dropout RNG scalars (philox seed and offset)
    assert fa.bytes_accessed == 2 * (4 * B * T * d + T * T) + 4 * B * heads * T + 2 * 8
    assert not [o for o in g.ops if o.name in ("aten.bmm", "aten._softmax", "aten._safe_softmax")]
    # a boolean mask becomes an additive one first (two elementwise kernels), then the same kernel
    bmask = torch.empty(T, T, dtype=torch.bool, device="meta")
    gb = trace_model(_EncoderSDPA(d, heads), [x, bmask])
    assert _attention_ops(gb) == _attention_ops(g)


def test_embedding_forward_reads_only_the_gathered_rows() -> None:
    V_, C, B, T = 1000, 64, 2, 16
    g = trace_model(nn.Embedding(V_, C), [torch.zeros(B, T, dtype=torch.long)], optimizer=False)
    fwd = next(o for o in g.ops if o.name == "aten.embedding")
    # int64 indices + B·T rows read + B·T rows written, bf16; not the V x C table
    assert fwd.bytes_accessed == 8 * B * T + 2 * (2 * B * T * C)
    bwd = next(o for o in g.ops if o.name == "aten.embedding_dense_backward")
    # the incoming gradient and the indices read, the whole table gradient written (zero-filled)
    assert bwd.bytes_accessed == 2 * B * T * C + 8 * B * T + 2 * V_ * C


_LABELS = """
import json, torch
from workload.trace import trace_model
from workload.zoo import build_model
g = trace_model(build_model("gpt-1.7b", num_layers=2, hidden_size=64, num_attention_heads=4, seq_length=32,
                            vocab_size=128), micro_batch_size=1, optimizer=False)
print(json.dumps([[o.name, o.phase, o.layer] for o in g.ops]))
"""


def test_layer_labels_do_not_depend_on_the_hash_seed() -> None:
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    runs = []
    for seed in ("0", "1", "2", "3"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run([sys.executable, "-c", _LABELS], cwd=root, env=env, capture_output=True, text=True,
                             check=True)
        runs.append(json.loads(out.stdout))
    assert all(r == runs[0] for r in runs[1:])
    emb = [(phase, layer) for name, phase, layer in runs[0] if name in ("aten.embedding",
                                                                        "aten.embedding_dense_backward")]
    # x = wte(idx) + wpe(pos): forward in that order; backward per table, each under its own module
    assert sorted(emb[:2]) == [("fwd", "wpe"), ("fwd", "wte")] and emb[0] == ("fwd", "wte")
    assert sorted(emb[2:]) == [("bwd", "wpe"), ("bwd", "wte")]


def test_a_storage_key_in_saved_tensor_accounting_is_not_handed_on() -> None:
    """The relaid flash output stands for the kernel's output (``storage_alias``); keys are addresses, so
    when a caller drops it (``nn.MultiheadAttention`` copies it and lets it go) a storage born later at
    the same address would read as the attention output. The aliased storages live as long as the
    recorder, so no later tensor maps to them."""
    from workload.trace.recorder import Recorder, storage_key
    from workload.trace.reroutes import FusedKernels
    from workload.trace.tracker import Tracker

    rec = Recorder(Tracker(), "m")
    q = torch.empty(2, 4, 16, 8, dtype=torch.bfloat16, device="meta")
    with torch.device("meta"), FusedKernels(rec), rec:
        out = torch.nn.functional.scaled_dot_product_attention(q, q, q)
        assert storage_key(out) in rec.storage_alias
        del out
        later = [torch.empty(64) for _ in range(64)]
    assert not {storage_key(t) for t in later} & set(rec.storage_alias)
