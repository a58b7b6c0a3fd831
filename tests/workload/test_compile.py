"""[training] compile = true: torch.compile's fusion of pointwise chains (workload.compile)."""

import pytest

from scenarios.scenario import parse_scenario
from workload.compile import FUSED_NAME
from workload.parallel.config import ParallelConfig
from workload.parallel.rank_trace import trace_rank
from workload.zoo import get_model_config, with_overrides

CFG = ParallelConfig(global_batch_size=1).resolve(1)


def _trace(name: str, compile: bool, **over):
    mc = with_overrides(get_model_config(name), num_layers=2, seq_length=256, vocab_size=1024, **over)
    return mc, trace_rank(mc, CFG, compile=compile)


def test_squared_relu_chain_fuses_to_one_kernel_by_closed_form():
    """relu then pow over the fc1 output (E = tokens x f bf16 elements, 4E bytes each unfused) become one
    kernel; pow's read of relu's output stays on chip, relu's write does not (its backward reads the
    saved output): 4E + 4E - 2E = 6E bytes."""
    mc, tr = _trace("gpt-1.7b", True, activation="squared_relu")
    e = 256 * mc.ffn_hidden_size
    mlp = [o for o in tr.graph.block_ops(0, "fwd") if o.layer.endswith(".mlp")]
    assert [o.name for o in mlp] == [FUSED_NAME]
    assert mlp[0].bytes_accessed == pytest.approx(6 * e)


def test_compile_keeps_flops_and_cuts_memory_bound_kernels():
    """Llama (RoPE's mul/sub/add/cat chain, SwiGLU's silu * up): the same FLOPs and GEMMs, fewer
    memory-bound kernels and fewer bytes. (The zoo's GPT has no chain of two: its bias-GELU and
    dropout-add are already single kernels.)"""
    _, eager = _trace("llama3-8b", False)
    _, compiled = _trace("llama3-8b", True)
    ge, gc = eager.graph, compiled.graph
    assert gc.total_flops() == pytest.approx(ge.total_flops())
    assert [o.shape for o in gc.ops if o.kind == "gemm"] == [o.shape for o in ge.ops if o.kind == "gemm"]
    pointwise = ("elementwise", "copy")
    n_eager = sum(o.kind in pointwise for o in ge.ops)
    n_compiled = sum(o.kind in pointwise for o in gc.ops)
    assert n_compiled < n_eager
    assert gc.total_bytes() < ge.total_bytes()
    assert sum(o.name == FUSED_NAME for o in gc.ops) > 0


def test_compile_key_is_type_checked():
    base = {"system": {"name": "dgx-h100"}, "model": {"name": "llama3-8b"}}
    assert parse_scenario({**base, "training": {"compile": True}}).training["compile"] is True
    with pytest.raises(ValueError, match=r"\[training\] compile must be bool \(true or false\), got 1") as e:
        parse_scenario({**base, "training": {"compile": 1}})
    assert "\n" not in str(e.value)
