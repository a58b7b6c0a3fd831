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
    6 B per element (read bf16, write fp32) on the compute stream (pytorch/pytorch#129721: allocated
    and written in the default stream), before the fp32 reduce-scatter on its stream."""
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
    assert rs_in.op.name == "fsdp_reduce_scatter_copy_in" and rs_in.stream == "compute" and rs_in.id in tasks[rs].deps
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


def _collectives(prog, prefix):
    return [x.op for x in prog.tasks if isinstance(x.op, Collective) and x.op.name.startswith(prefix)]


def test_fsdp2_units_as_torchtitan_wraps_them():
    """torchtitan's apply_fsdp: the root unit (embedding, final norm, output layer) is gathered once, before
    the forward, and reduce-scattered once, at the end of the backward; every block is gathered before its
    forward, and before its backward except the last block (reshard_after_forward = layer_id < n - 1).
    2 layers, dp 4: 1 + 2 + 1 gathers, 2 + 1 reduce-scatters; plain ZeRO-3 keeps a unit for each part."""
    t, prog = _program(fsdp=True)
    eb = 2
    gathers = _collectives(prog, "fsdp_ag")
    assert [g.name for g in gathers] == ["fsdp_ag_fwd_pre", "fsdp_ag_fwd_L0", "fsdp_ag_fwd_L1", "fsdp_ag_bwd_L0"]
    assert gathers[0].size_bytes == (t.params_pre + t.params_post) * eb
    scatters = _collectives(prog, "fsdp_rs")
    assert [r.name for r in scatters] == ["fsdp_rs_L1", "fsdp_rs_L0", "fsdp_rs_pre"]
    assert scatters[-1].size_bytes == (t.params_pre + t.params_post) * 4  # fp32 (mixed_precision_reduce)
    # every parameter is gathered for the forward once and reduce-scattered once
    assert sum(g.size_bytes for g in gathers[:3]) == (t.params_pre + t.params_post + 2 * t.block_params(0)) * eb
    assert sum(r.size_bytes for r in scatters) == (t.params_pre + t.params_post + 2 * t.block_params(0)) * 4
    # the optimizer waits for the root's reduce-scatter, the last one
    last_rs = max(i for i, x in enumerate(prog.tasks) if x.op.name == "fsdp_rs_pre")
    first_opt = min(i for i, x in enumerate(prog.tasks) if isinstance(x.op, Compute) and x.op.phase == "opt")
    assert last_rs in prog.tasks[first_opt].deps
    _, z3 = _program(zero_stage=3)
    assert len(_collectives(z3, "fsdp_ag")) == 8 and len(_collectives(z3, "fsdp_rs")) == 4


def test_fsdp2_with_pp_keeps_every_unit_gathered():
    """With pipeline stages torchtitan sets reshard_after_forward = False everywhere: one gather per unit
    and iteration, whatever the root rule says (the pre and post parts are on different stages)."""
    cfg = ParallelConfig(global_batch_size=8, pipeline_model_parallel_size=2, fsdp=True).resolve(4)
    t = trace_rank(MC, cfg)
    names = {tuple(g.name for g in _collectives(p, "fsdp_ag")) for p in build_programs(t, cfg).programs.values()}
    assert names == {("fsdp_ag_fwd_pre", "fsdp_ag_fwd_L0"), ("fsdp_ag_fwd_L1", "fsdp_ag_fwd_post")}


def test_clip_grad_norm_all_reduces_the_dtensor_norm():
    """clip_grad_norm_ on DTensor gradients: one 4-byte fp32 all-reduce per sharded mesh dimension (dp;
    tp too under TP), on the compute stream after every norm kernel and before the first scaling kernel."""
    for kw, groups in (({}, [4]), ({"tensor_model_parallel_size": 2, "sequence_parallel": True}, [2, 2])):
        _, prog = _program(fsdp=True, **kw)
        names = [x.op.name for x in prog.tasks]
        norms = [x for x in prog.tasks if isinstance(x.op, Collective) and x.op.dtype == "fp32"
                 and x.op.op == "all_reduce" and x.op.size_bytes == 4]
        assert sorted(len(x.op.group) for x in norms) == sorted(groups)
        assert all(x.stream == "compute" for x in norms)
        first = min(prog.tasks.index(x) for x in norms)
        last = max(prog.tasks.index(x) for x in norms)
        assert max(i for i, n in enumerate(names) if n == "clip_grad_norm") < first
        assert last < min(i for i, n in enumerate(names) if n == "clip_grad_scale")
