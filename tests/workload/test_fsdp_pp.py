"""FSDP with pipeline stages, as torchtitan runs FSDP2 + PP (reshard_after_forward off with PP; gradient
sync only on the last micro-batch's backward)."""

from collections import Counter

import pytest

from hwmodel.ir import Collective
from workload.parallel.builder import build_programs
from workload.parallel.config import ParallelConfig
from workload.parallel.placement import Layout
from workload.parallel.rank_trace import trace_rank
from workload.zoo import get_model_config, with_overrides
from workload.zoo.family import transformer_memory

MC = with_overrides(get_model_config("llama3-8b"), num_layers=4, seq_length=256, vocab_size=1024)
H, F, VOCAB = MC.hidden_size, MC.ffn_hidden_size, MC.vocab_size
KV = MC.num_query_groups * H // MC.num_attention_heads
LAYER = 2 * H * H + 2 * H * KV + 3 * H * F + 2 * H  # 218,112,000 elements (Llama-3 8B layer)


def _stage_programs(cfg):
    lay = Layout(cfg)
    ranks = [lay.rank(**{**lay.coords(0), "pp": s}) for s in range(cfg.pp)]
    progs = build_programs(trace_rank(MC, cfg), cfg, ranks=ranks).programs
    return [progs[r] for r in ranks]


def _collectives(prog, stream):
    return Counter((t.op.name, t.op.size_bytes) for t in prog.tasks
                   if t.stream == stream and isinstance(t.op, Collective))


@pytest.mark.parametrize("pp,vpp,m", [(2, None, 4), (2, 2, 4), (4, None, 8)])
def test_each_unit_gathered_once_and_reduced_once_per_iteration(pp, vpp, m):
    """Per unit (layer; "pre" on the first stage, "post" on the last) and iteration: ONE all-gather of
    its bf16 parameters (2 bytes x elements, at its first forward) and ONE reduce-scatter of its fp32
    gradients (4 bytes x elements, after its last backward), whatever the number of micro-batches m;
    no backward all-gather. ZeRO-3 without FSDP is refused with PP."""
    dp = 2
    kw = {"pipeline_model_parallel_size": pp, "virtual_pipeline_model_parallel_size": vpp,
          "global_batch_size": m * dp}
    cfg = ParallelConfig(fsdp=True, **kw).resolve(pp * dp)
    per_stage = 4 // pp
    for s, prog in enumerate(_stage_programs(cfg)):
        ag, rs = _collectives(prog, "fsdp_ag"), _collectives(prog, "fsdp_rs")
        layers_ag = {k: n for k, n in ag.items() if "_L" in k[0]}
        layers_rs = {k: n for k, n in rs.items() if "_L" in k[0]}
        assert sorted(layers_ag.values()) == [1] * per_stage and {k[1] for k in layers_ag} == {2 * LAYER}
        assert all(k[0].startswith("fsdp_ag_fwd_") for k in ag)
        assert sorted(layers_rs.values()) == [1] * per_stage and {k[1] for k in layers_rs} == {4 * LAYER}
        if s == 0:
            assert ag[("fsdp_ag_fwd_pre", 2 * VOCAB * H)] == 1 and rs[("fsdp_rs_pre", 4 * VOCAB * H)] == 1
        if s == pp - 1:
            post = H + VOCAB * H
            assert ag[("fsdp_ag_fwd_post", 2 * post)] == 1 and rs[("fsdp_rs_post", 4 * post)] == 1
    with pytest.raises(ValueError, match="zero_stage=3 with pipeline_model_parallel_size > 1"):
        ParallelConfig(zero_stage=3, **kw)  # per-micro-batch gathers under PP: no framework runs them


def test_reduce_scatter_follows_the_last_backward_of_its_layer():
    """The single reduce-scatter of a layer waits for the last micro-batch's backward of that layer."""
    cfg = ParallelConfig(fsdp=True, pipeline_model_parallel_size=2, global_batch_size=8).resolve(4)
    prog = _stage_programs(cfg)[0]
    for t in prog.tasks:
        if t.stream == "fsdp_rs" and "_L" in t.op.name:
            layer = f"layers.{t.op.name.split('_L')[1]}"
            (dep,) = t.deps
            bwd = [u.id for u in prog.tasks if getattr(u.op, "phase", "") == "bwd" and u.op.layer.startswith(layer)]
            assert dep == max(bwd)


def test_memory_keeps_parameters_and_gradients_unsharded():
    """Memory at the peak: the stage's bf16 parameters and fp32 gradients whole (resident from the
    first forward to the last backward), the 12 bytes of fp32 master weights and Adam moments per
    parameter sharded over dp; without PP, FSDP shards all three."""
    dp = 4
    pp_cfg = ParallelConfig(fsdp=True, pipeline_model_parallel_size=2, global_batch_size=8).resolve(2 * dp)
    mem = transformer_memory(MC, pp_cfg, "bf16")
    n = mem.params_per_gpu
    assert mem.parameters == pytest.approx(2 * n) and mem.gradients == pytest.approx(4 * n)
    assert mem.optimizer_states == pytest.approx(12 * n / dp)
    flat = ParallelConfig(fsdp=True, global_batch_size=8).resolve(dp)
    mem1 = transformer_memory(MC, flat, "bf16")
    assert mem1.parameters == pytest.approx(2 * mem1.params_per_gpu / dp)
    assert mem1.gradients == pytest.approx(4 * mem1.params_per_gpu / dp)
