"""PyTorch FSDP2's copy kernels and foreach AdamW (``fsdp = true``), against closed forms: bytes per
element from the copies ``torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py`` runs and the
``_foreach_*`` passes of ``torch/optim/adamw.py``; plain ZeRO-3 (Megatron-style) keeps none of them."""

from collections import Counter

from hwmodel.ir import Collective, Compute
from workload.parallel.builder import build_programs
from workload.parallel.config import ParallelConfig
from workload.parallel.fsdp2 import FOREACH_ADAMW_PASSES
from workload.parallel.rank_trace import trace_rank
from workload.zoo import get_model_config, with_overrides

MC = with_overrides(get_model_config("llama3-8b"), num_layers=2, seq_length=256, vocab_size=1024)


def _program(**kw):
    cfg = ParallelConfig(global_batch_size=4, **kw).resolve(4)
    t = trace_rank(MC, cfg)
    return t, build_programs(t, cfg, ranks=[0]).programs[0]


def test_fsdp2_copies_per_unit_closed_form():
    """Per layer (n elements, dp 4): copy-in 10 B per shard element (read fp32, write bf16, read bf16,
    write bf16) before the all-gather on its stream; copy-out 4 B per element (read, write bf16) on the
    compute stream, after it, and the layer's first kernel after the copy-out; reduce-scatter copy-in
    6 B per element (read bf16, write fp32) before the fp32 reduce-scatter on its stream."""
    t, prog = _program(fsdp=True)
    n = t.block_params(0)
    tasks = prog.tasks
    by_name = {}
    for i, x in enumerate(tasks):
        by_name.setdefault(x.op.name, []).append(i)
    ag = by_name["fsdp_ag_fwd_L0"][0]
    copy_in, copy_out = tasks[ag - 1], tasks[ag + 1]
    assert copy_in.op.name == "fsdp_all_gather_copy_in" and copy_in.stream == "fsdp_ag"
    assert copy_in.op.bytes_accessed == n / 4 * 10 and copy_in.id in tasks[ag].deps
    assert copy_out.op.name == "fsdp_all_gather_copy_out" and copy_out.stream == "compute"
    assert copy_out.op.bytes_accessed == 4 * n and ag in copy_out.deps
    rs = by_name["fsdp_rs_L0"][0]
    rs_in = tasks[rs - 1]
    assert rs_in.op.name == "fsdp_reduce_scatter_copy_in" and rs_in.stream == "fsdp_rs"
    assert rs_in.op.bytes_accessed == 6 * n and tasks[rs].op.size_bytes == 4 * n
    # one copy-out per gather, one copy-in per gather and per reduce-scatter
    names = Counter(x.op.name for x in tasks)
    gathers = sum(1 for x in tasks if isinstance(x.op, Collective) and x.op.name.startswith("fsdp_ag"))
    scatters = sum(1 for x in tasks if isinstance(x.op, Collective) and x.op.name.startswith("fsdp_rs"))
    assert names["fsdp_all_gather_copy_out"] == names["fsdp_all_gather_copy_in"] == gathers
    assert names["fsdp_reduce_scatter_copy_in"] == scatters


def test_fsdp2_optimizer_is_foreach_adamw_on_the_shard():
    """92 B per shard parameter (clip_grad_norm_: 4 + 8; AdamW foreach: 80), no master copy, no zeroing;
    Megatron's fused Adam path is 42 B (4 norm + 28 Adam + 6 copy + 4 zero)."""
    assert sum(b for _, b in FOREACH_ADAMW_PASSES) == 92
    t, prog = _program(fsdp=True)
    opt = [x.op for x in prog.tasks if isinstance(x.op, Compute) and x.op.phase == "opt"]
    shard = (t.params_pre + 2 * t.block_params(0) + t.params_post) / 4
    assert abs(sum(o.bytes_accessed for o in opt) - 92 * shard) < 1e-6 * shard
    assert not any(o.name in ("fused_adam", "copy_main_to_model_params", "zero_grad_buffers") for o in opt)


def test_plain_zero3_has_no_fsdp2_copies():
    _, prog = _program(zero_stage=3)
    names = {x.op.name for x in prog.tasks}
    assert not names & {"fsdp_all_gather_copy_in", "fsdp_all_gather_copy_out", "fsdp_reduce_scatter_copy_in"}
    assert "fused_adam" in names
