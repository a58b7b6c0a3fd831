"""torchtitan's sequence-parallel collectives through PyTorch's dim-0 functional collectives: a layout copy
of the whole tensor after each all-gather and before each reduce-scatter (``funcol.all_gather_tensor`` /
``reduce_scatter_tensor`` with ``gather_dim`` / ``scatter_dim`` 1 on batch-first activations). Megatron's
sequence-first activations gather in place; async TP's fused ops take the dimension themselves."""

from workload.parallel.config import ParallelConfig
from workload.parallel.rank_trace import trace_rank
from workload.zoo import get_model_config, with_overrides

MC = with_overrides(get_model_config("llama3-8b"), num_layers=2, seq_length=256, vocab_size=1024)
MICRO_BATCH = 2


def _sp_ops(*, fsdp: bool, async_tp: bool = False, phase: str = "fwd") -> list[tuple[str, float]]:
    """(op name, bytes) of the collectives and the ``cat`` copies of a (micro-batch, seq, hidden) tensor of
    one block's ``phase``, in order."""
    cfg = ParallelConfig(tensor_model_parallel_size=2, sequence_parallel=True, global_batch_size=2 * MICRO_BATCH,
                         micro_batch_size=MICRO_BATCH, fsdp=fsdp, async_tp=async_tp).resolve(2)
    ops = trace_rank(MC, cfg).graph.block_ops(0, phase)
    return [(o.name.split(".")[1], o.bytes_accessed) for o in ops
            if o.name == "aten.cat" and o.out_shapes[0][-1] == MC.hidden_size
            or o.name in ("trainsim.all_gather", "trainsim.reduce_scatter")]


def test_torchtitan_sp_collectives_copy_the_whole_tensor_each_way():
    """Forward and backward alike: all-gather then a copy, copy then reduce-scatter, each copy reading
    and writing the whole (micro-batch, seq, hidden) bf16 tensor once: 2 x 2 x b x s x h bytes."""
    full = MICRO_BATCH * MC.seq_length * MC.hidden_size * 2
    expected = [("all_gather", None), ("cat", 2 * full), ("cat", 2 * full), ("reduce_scatter", None)] * 2
    for phase in ("fwd", "bwd"):
        got = _sp_ops(fsdp=True, phase=phase)
        assert [n for n, _ in got] == [n for n, _ in expected]
        assert [b for (n, b) in got if n == "cat"] == [2 * full] * 4


def test_megatron_and_async_tp_sp_collectives_have_no_layout_copy():
    """Megatron (sequence-first, gathers dim 0 in place) and torchtitan under async TP (Inductor's
    micro-pipeline pass replaces the split + cat patterns by fused ops): collectives only."""
    for kw in ({"fsdp": False}, {"fsdp": True, "async_tp": True}):
        for phase in ("fwd", "bwd"):
            assert [n for n, _ in _sp_ops(**kw, phase=phase)] == ["all_gather", "reduce_scatter"] * 2
