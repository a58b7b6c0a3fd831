"""What ``fsdp = true`` (PyTorch's own stack, torchtitan's model) traces differently from Megatron's:
eager RMSNorm as PyTorch's decomposition, separate projections, per-op SAC re-issuing TP all-gathers.
Closed forms from the traced shapes; sources in the docstrings of the code under test."""

from hwmodel.ir import Collective
from workload.parallel.builder import build_programs
from workload.parallel.config import ParallelConfig
from workload.parallel.rank_trace import trace_rank
from workload.zoo import get_model_config, with_overrides

MC = with_overrides(get_model_config("llama3-8b"), num_layers=2, seq_length=256, vocab_size=1024)


def _block_fwd_names(t):
    return [o.name for o in t.graph.block_ops(0, "fwd")]


def test_eager_rms_norm_decomposes_only_without_compile_under_fsdp():
    """Eager PyTorch: no fused RMSNorm kernel; the norm's fp32 passes (upcast, pow, mean, rsqrt, muls,
    cast back) are ops of the block; compiled, or Megatron's stack: one fused kernel per norm."""
    cfg = ParallelConfig(fsdp=True, global_batch_size=4).resolve(4)
    eager = _block_fwd_names(trace_rank(MC, cfg))
    compiled = _block_fwd_names(trace_rank(MC, cfg, compile=True))
    megatron = _block_fwd_names(trace_rank(MC, ParallelConfig(global_batch_size=4).resolve(4)))
    assert "trainsim.rms_norm" not in eager
    assert {"aten.pow", "aten.mean", "aten.rsqrt"} <= set(eager)
    assert compiled.count("trainsim.rms_norm") == megatron.count("trainsim.rms_norm") == 2
    # the eager norm moves more bytes: at least its two fp32 round trips of (B, T, C) per norm
    t_eager, t_meg = trace_rank(MC, cfg), trace_rank(MC, ParallelConfig(global_batch_size=4).resolve(4))
    norm_bytes = lambda t: sum(o.bytes_accessed for o in t.graph.block_ops(0, "fwd") if "norm" in o.layer)  # noqa: E731
    tokens_hidden = 1 * MC.seq_length * MC.hidden_size
    assert norm_bytes(t_eager) - norm_bytes(t_meg) >= 2 * 2 * 8 * tokens_hidden


def test_fsdp_traces_separate_projections_same_parameters_and_flops():
    """torchtitan's wq, wk, wv and w1, w3: seven block GEMMs instead of four in forward, same parameters
    and the same GEMM FLOPs."""
    fsdp = trace_rank(MC, ParallelConfig(fsdp=True, global_batch_size=4).resolve(4))
    meg = trace_rank(MC, ParallelConfig(global_batch_size=4).resolve(4))
    gemms = lambda t: [o for o in t.graph.block_ops(0, "fwd") if o.kind == "gemm"]  # noqa: E731
    assert (len(gemms(fsdp)), len(gemms(meg))) == (7, 4)
    assert fsdp.params_block == meg.params_block
    assert sum(o.flops for o in gemms(fsdp)) == sum(o.flops for o in gemms(meg))


def test_op_sac_reissues_tp_all_gathers_not_reduce_scatters():
    """Per-op SAC with TP and SP: each block's backward is preceded by its two forward all-gathers again
    (not in torchtitan's ``_save_list``); reduce-scatters are saved. Full recompute re-runs both."""
    def tp_collectives(granularity):
        cfg = ParallelConfig(tensor_model_parallel_size=2, sequence_parallel=True, global_batch_size=1,
                             recompute_granularity=granularity).resolve(2)
        prog = build_programs(trace_rank(MC, cfg), cfg, ranks=[0]).programs[0]
        return [t.op.op for t in prog.tasks if isinstance(t.op, Collective) and t.op.name.startswith("tp_")]
    none, sac = tp_collectives("none"), tp_collectives("selective_op")
    layers = MC.num_layers
    assert sac.count("all_gather") - none.count("all_gather") == 2 * layers
    assert sac.count("reduce_scatter") == none.count("reduce_scatter")


def test_eager_fsdp_rope_is_torchtitans_fp32_complex_form():
    """torchtitan's ``apply_rotary_emb`` in eager: per q and per k a cast to fp32 (read 2, write 4 bytes
    an element), a complex64 multiply by freqs_cis (read 4 + write 4 bytes an element, plus the
    (T, hs/2) complex64 table) and a cast back (read 4, write 2); no rotate-half kernels. Compiled, or
    Megatron's stack: the rotate-half form in bf16 (compile fuses it)."""
    cfg = ParallelConfig(fsdp=True, global_batch_size=4).resolve(4)
    eager = trace_rank(MC, cfg).graph.block_ops(0, "fwd")
    muls = [o for o in eager if o.dtype == "complex64"]
    seq, hs = MC.seq_length, MC.kv_channels
    q_elems, k_elems = seq * MC.num_attention_heads * hs, seq * MC.num_query_groups * hs
    table = seq * hs // 2 * 8
    assert [o.bytes_accessed for o in muls] == [8 * q_elems + table, 8 * k_elems + table]
    casts = sorted(o.bytes_accessed for o in eager if o.name == "aten._to_copy" and o.layer.endswith(".attn"))
    assert casts == sorted([6 * q_elems] * 2 + [6 * k_elems] * 2)
    assert "aten.cat" not in [o.name for o in eager if o.layer.endswith(".attn")]
    bwd = trace_rank(MC, cfg).graph.block_ops(0, "bwd")
    assert sum(o.name == "aten.mul" and o.dtype == "complex64" for o in bwd) == 2
    for other in (trace_rank(MC, cfg, compile=True), trace_rank(MC, ParallelConfig(global_batch_size=4).resolve(4))):
        assert not any(o.dtype == "complex64" for o in other.graph.block_ops(0, "fwd"))


def test_explicit_model_keys_win_over_the_stack_default():
    """``fsdp = true`` sets separate projections and the complex RoPE only where the scenario left them
    unset: an explicit false keeps Megatron's fused GEMMs (four) and the rotate-half RoPE."""
    cfg = ParallelConfig(fsdp=True, global_batch_size=4).resolve(4)
    fused = with_overrides(MC, separate_projections=False, rotary_complex=False)
    gemms = [o for o in trace_rank(fused, cfg).graph.block_ops(0, "fwd") if o.kind == "gemm"]
    assert len(gemms) == 4
    complex_ops = lambda t: [o for o in t.graph.block_ops(0, "fwd") if o.dtype == "complex64"]  # noqa: E731
    assert complex_ops(trace_rank(fused, cfg)) == [] and len(complex_ops(trace_rank(MC, cfg))) == 2


def test_fsdp_attention_repeats_kv_heads_as_torchtitans_repeat_kv():
    """torchtitan's ``repeat_kv`` before SDPA (grouped-query K and V copied to the query heads): per block
    two copy kernels each reading the g heads and writing a*hs per token (2 bytes an element), SDPA on
    a heads, and in backward two reductions of the a-head gradients back to g heads. Megatron's stack
    passes the g heads to the kernel (no copies, no sums)."""
    cfg = ParallelConfig(fsdp=True, global_batch_size=4).resolve(4)
    seq, hs, a, g = MC.seq_length, MC.kv_channels, MC.num_attention_heads, MC.num_query_groups
    t = trace_rank(MC, cfg).graph
    copies = [o for o in t.block_ops(0, "fwd") if o.name == "aten.clone" and o.layer.endswith(".attn")]
    assert [o.out_shapes[0] for o in copies] == [(1, seq, g, a // g, hs)] * 2
    assert [o.bytes_accessed for o in copies] == [2 * seq * (g + a) * hs] * 2
    sdpa_bwd = [o for o in t.block_ops(0, "bwd") if o.kind == "attention"]
    assert [s[1] for s in sdpa_bwd[0].out_shapes[1:]] == [a, a]  # dK, dV on a heads
    sums = [o for o in t.block_ops(0, "bwd") if o.name == "aten.sum" and o.layer.endswith(".attn")]
    assert len(sums) == 2
    meg = trace_rank(MC, ParallelConfig(global_batch_size=4).resolve(4)).graph
    assert not [o for o in meg.block_ops(0, "fwd") if o.name == "aten.clone" and o.layer.endswith(".attn")]
    assert [s[1] for s in [o for o in meg.block_ops(0, "bwd") if o.kind == "attention"][0].out_shapes[1:]] == [g, g]
