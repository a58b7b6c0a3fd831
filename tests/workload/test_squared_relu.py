"""activation = "squared_relu" (Nemotron-4; Megatron-LM's eager relu then pow)."""

import pytest

from workload.parallel.builder import TracedOps
from workload.parallel.config import ParallelConfig
from workload.parallel.rank_trace import trace_rank
from workload.zoo import get_model_config, with_overrides
from workload.zoo.family import transformer_memory

CFG = ParallelConfig(global_batch_size=1).resolve(1)


def _mlp_ops(act: str, phase: str):
    mc = with_overrides(get_model_config("gpt-1.7b"), num_layers=1, seq_length=256, vocab_size=1024, activation=act)
    return mc, [o for o in TracedOps(trace_rank(mc, CFG)).get("block", phase, 0) if o.layer.endswith(".mlp")]


def test_squared_relu_is_two_memory_bound_kernels_over_the_fc1_output():
    """Forward: relu and pow, each reading and writing the fc1 output (b x s x f bf16 elements: 2 x 2
    bytes each), where GELU is one kernel of the same traffic; backward: pow's derivative (pow, two
    muls) and relu's threshold_backward. The GEMMs are the same."""
    mc, fwd = _mlp_ops("squared_relu", "fwd")
    elements = 256 * mc.ffn_hidden_size
    assert [o.name for o in fwd] == ["aten.relu", "aten.pow"]
    assert [o.bytes_accessed for o in fwd] == [2 * 2 * elements] * 2
    _, gelu = _mlp_ops("gelu", "fwd")
    assert [o.name for o in gelu] == ["aten.gelu"] and gelu[0].bytes_accessed == 2 * 2 * elements
    _, bwd = _mlp_ops("squared_relu", "bwd")
    assert sorted(o.name for o in bwd) == ["aten.mul", "aten.mul", "aten.pow", "aten.threshold_backward"]


def test_squared_relu_stores_what_gelu_stores():
    """relu saves its output, which is also pow's saved input, and fc2 saves pow's output: 2 x 2f bytes
    per token, GELU's 2f (its input) + 2f (fc2's input). Same activations, same parameters."""
    base = get_model_config("gpt-1.7b")
    sq = transformer_memory(with_overrides(base, activation="squared_relu"), CFG, "bf16")
    gelu = transformer_memory(base, CFG, "bf16")
    assert sq.activations == pytest.approx(gelu.activations) and sq.parameters == gelu.parameters


def test_unknown_activation_refused_in_one_line():
    with pytest.raises(ValueError, match="activation must be one of 'gelu', 'swiglu', 'squared_relu'") as e:
        with_overrides(get_model_config("gpt-1.7b"), activation="relu2")
    assert "\n" not in str(e.value)
