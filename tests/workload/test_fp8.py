"""FP8 training (Transformer Engine hybrid recipe): which GEMMs run in FP8, the cast-transpose kernels'
bytes (closed forms from the GEMM shapes), weight casts per iteration, and what stays bf16."""

from collections import Counter

import pytest

from hwmodel.ir import Collective, Compute
from workload.fp8 import (
    CAST_BWD_NAME,
    CAST_FWD_NAME,
    CAST_TRANSPOSE_BYTES,
    CAST_WEIGHT_NAME,
    fp8_gemm_bytes,
    to_fp8,
)
from workload.parallel.builder import build_programs
from workload.parallel.config import ParallelConfig
from workload.parallel.rank_trace import trace_rank
from workload.zoo import get_model_config, with_overrides

LLAMA = with_overrides(get_model_config("llama3-70b"), num_layers=2, seq_length=512)
TP = 8
FP8_MODULES = ("attn.qkv", "attn.proj", "mlp.fc1", "mlp.fc2")


@pytest.fixture(scope="module")
def traces():
    cfg = ParallelConfig(tensor_model_parallel_size=TP, sequence_parallel=True).resolve(TP)
    return cfg, trace_rank(LLAMA, cfg, dtype="bf16"), trace_rank(LLAMA, cfg, dtype="fp8")


def _rel(o) -> str:
    return o.layer.removeprefix(f"layers.{o.block}.") if o.block is not None else o.layer


def test_linear_gemms_of_every_layer_run_in_fp8_the_rest_in_bf16(traces):
    _, bf16, fp8 = traces
    gemms = [o for o in fp8.graph.ops if o.kind == "gemm"]
    in_fp8 = Counter((o.phase, _rel(o)) for o in gemms if o.dtype == "fp8")
    # fprop per Linear, dgrad + wgrad per Linear, for both layers
    assert in_fp8 == {**{("fwd", m): 2 for m in FP8_MODULES}, **{("bwd", m): 4 for m in FP8_MODULES}}
    head = [o for o in gemms if o.part != "block"]
    assert head and all(o.dtype == "bf16" for o in head)  # the LM head stays bf16
    assert all(o.dtype == "bf16" for o in fp8.graph.ops if o.kind == "attention")
    # the trace dtype stays bf16 (parameters, activations, communication) and FLOPs are unchanged
    assert fp8.dtype == "bf16" and fp8.graph.info["fp8_format"] == "hybrid"
    for phase in ("fwd", "bwd", "opt"):
        assert fp8.graph.total_flops(phase) == bf16.graph.total_flops(phase)


def test_cast_transpose_bytes_match_the_gemm_shapes(traces):
    _, bf16, fp8 = traces
    ops = fp8.graph.ops
    fwd_gemms = [o for o in ops if o.dtype == "fp8" and o.phase == "fwd"]
    # forward: one E4M3 cast of each FP8 GEMM's input X (b*m*k elements), right before it
    for g in fwd_gemms:
        cast = ops[g.index - 1]
        b, m, n, k = g.shape
        assert cast.name == CAST_FWD_NAME and cast.index in g.deps
        assert cast.bytes_accessed == CAST_TRANSPOSE_BYTES * b * m * k == 4 * b * m * k
        assert cast.layer == g.layer and cast.kind == "elementwise" and cast.flops == 0
        assert g.bytes_accessed == fp8_gemm_bytes(g.shape) == b * (m * k + k * n) + 2 * b * m * n
    # backward: one E5M2 cast per module of its output gradient (the fprop output), shared by dgrad and wgrad
    bwd_casts = [o for o in ops if o.name == CAST_BWD_NAME]
    assert len(bwd_casts) == len(fwd_gemms)
    out = {g.layer: g.shape[0] * g.shape[1] * g.shape[2] for g in fwd_gemms}
    for c in bwd_casts:
        assert c.bytes_accessed == 4 * out[c.layer]
    # the only ops added are the casts
    added = len(ops) - len(bf16.graph.ops)
    assert added == 2 * len(fwd_gemms)
    assert [o.index for o in ops] == list(range(len(ops)))
    assert all(d < o.index for o in ops for d in o.deps)


def test_fp8_weight_elements_are_the_linear_weights(traces):
    _, bf16, fp8 = traces
    h, f, q, kv, hd = (LLAMA.hidden_size, LLAMA.ffn_hidden_size, LLAMA.num_attention_heads,
                       LLAMA.num_query_groups, LLAMA.kv_channels)
    per_rank = (h * (q + 2 * kv) * hd + q * hd * h + 3 * h * f) // TP  # QKV, proj, SwiGLU fc1 + fc2
    assert fp8.fp8_params_block == per_rank
    assert fp8.params_block - fp8.fp8_params_block == 2 * h  # the two RMSNorm weights stay bf16
    assert bf16.fp8_params_block == 0


def test_weight_casts_once_per_layer_per_iteration_and_every_pass_under_fsdp(traces):
    cfg, _, fp8 = traces
    cfg = ParallelConfig(tensor_model_parallel_size=TP, sequence_parallel=True,
                         global_batch_size=4).resolve(TP)
    prog = build_programs(fp8, cfg, ranks=[0]).programs[0]
    casts = [t.op for t in prog.tasks if isinstance(t.op, Compute) and t.op.name == CAST_WEIGHT_NAME]
    assert cfg.num_microbatches == 4 and len(casts) == LLAMA.num_layers  # first micro-batch only
    assert all(c.bytes_accessed == CAST_TRANSPOSE_BYTES * fp8.fp8_params_block for c in casts)
    # FSDP frees the gathered bf16 weights: a cast in every forward and backward pass
    fsdp = ParallelConfig(fsdp=True, global_batch_size=16).resolve(8)
    t = trace_rank(LLAMA, fsdp, dtype="fp8")
    prog = build_programs(t, fsdp, ranks=[0]).programs[0]
    n = sum(1 for x in prog.tasks if isinstance(x.op, Compute) and x.op.name == CAST_WEIGHT_NAME)
    assert n == 2 * fsdp.num_microbatches * LLAMA.num_layers


def test_gradients_and_activations_communicated_as_in_bf16(traces):
    cfg, bf16, fp8 = traces
    cfg = ParallelConfig(tensor_model_parallel_size=2, pipeline_model_parallel_size=2, sequence_parallel=True,
                         global_batch_size=4).resolve(8)
    a, b = (build_programs(trace_rank(LLAMA, cfg, dtype=d), cfg, ranks=[0]).programs[0] for d in ("bf16", "fp8"))

    def comms(p):
        return [(t.op.op, t.op.size_bytes, t.op.dtype) if isinstance(t.op, Collective) else
                (t.op.direction, t.op.size_bytes) for t in p.tasks if not isinstance(t.op, Compute)]

    assert comms(a) == comms(b)
    assert any(c[0] == "all_reduce" and c[2] == "fp32" for c in comms(b))  # DP gradients in fp32


def test_fp8_needs_a_transformer_and_a_known_dtype():
    cfg = ParallelConfig().resolve(1)
    with pytest.raises(ValueError, match="dtype 'fp8' .* resnet-50 is not a transformer"):
        trace_rank(get_model_config("resnet-50"), cfg, dtype="fp8")
    with pytest.raises(ValueError, match=r"dtype: unknown 'fp4'; allowed: bf16, fp16, fp32, fp8"):
        trace_rank(LLAMA, cfg, dtype="fp4")


def test_to_fp8_refuses_a_graph_without_fp8_modules(traces):
    _, bf16, _ = traces
    with pytest.raises(ValueError, match="no GEMM of the traced model belongs to an FP8 module"):
        to_fp8(bf16.graph, ["no.such.linear"])


def test_moe_experts_run_in_fp8_the_router_in_bf16():
    mixtral = with_overrides(get_model_config("mixtral-8x7b"), num_layers=1, seq_length=256)
    cfg = ParallelConfig(tensor_model_parallel_size=2, expert_model_parallel_size=2).resolve(4)
    t = trace_rank(mixtral, cfg, dtype="fp8")
    gemms = [o for o in t.graph.ops if o.kind == "gemm" and o.part == "block"]
    assert {o.dtype for o in gemms if o.name == "aten.bmm"} == {"fp8"}  # grouped expert GEMMs
    assert {o.dtype for o in gemms if o.layer.endswith(".router")} == {"bf16"}
    h, q, kv, hd = (mixtral.hidden_size, mixtral.num_attention_heads, mixtral.num_query_groups,
                    mixtral.kv_channels)
    qkv_and_proj = (h * (q + 2 * kv) * hd + q * hd * h) // 2  # TP 2, no biases
    assert t.fp8_params_block - t.params_block_expert == qkv_and_proj
