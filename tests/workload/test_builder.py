"""Per-rank programs from a parallel configuration: counts, orders and timing closed forms."""

from collections import Counter
from dataclasses import dataclass

import pytest

from hwmodel.cluster import Cluster
from hwmodel.ir import Collective, Compute, SendRecv
from hwmodel.runtime import Runtime
from hwmodel.topology import build_system
from scenarios.analysis import breakdown
from workload.parallel.builder import ModelTrace, build_programs
from workload.parallel.config import ParallelConfig
from workload.parallel.placement import Layout
from workload.parallel.rank_trace import trace_rank
from workload.parallel.schedules import bubble_fraction
from workload.zoo import get_model_config, with_overrides

# -- a synthetic op graph: one fixed-duration kernel per layer pass --------------------------------


@dataclass(frozen=True)
class _Rec:
    name: str
    phase: str
    seconds: float
    layer: str = ""

    def to_compute(self) -> Compute:
        return Compute(self.name, "macro", 1.0, 1.0, layer=self.layer, phase=self.phase, fixed_time_s=self.seconds)


class _Graph:
    def __init__(self, layers: int, fwd_s: float, bwd_s: float) -> None:
        self.num_blocks, self.fwd_s, self.bwd_s = layers, fwd_s, bwd_s

    def block_ops(self, i, phase):
        return [_Rec(f"L{i}_{phase}", phase, self.fwd_s if phase == "fwd" else self.bwd_s, f"layers.{i}")]

    def pre_ops(self, phase):
        return []

    def post_ops(self, phase):
        return []


def _synthetic(layers=8, fwd_s=10e-3, bwd_s=20e-3, params_block=0, hidden=16):
    return ModelTrace(graph=_Graph(layers, fwd_s, bwd_s), num_layers=layers, hidden_size=hidden, seq_length=16,
                      micro_batch_size=1, params_pre=0, params_block=params_block, params_post=0)


def _run(trace, cfg, nodes=1, mirror=False):
    topo = build_system("dgx-a100", nodes)
    lay = Layout(cfg)
    res = build_programs(trace, cfg, ranks=lay.representatives() if mirror else None)
    gpus = topo.gpus()
    rt = Runtime(Cluster(topo), res.programs, placement={r: gpus[r] for r in range(cfg.world_size)},
                 host_launch_overhead_s=0.0, mirror=lay.mirror if mirror else None)
    return res, rt.run()


# -- counts and orders per schedule -------------------------------------------------------------------

@pytest.mark.parametrize("schedule,v", [("gpipe", 1), ("1f1b", 1), ("interleaved_1f1b", 2)])
def test_sendrecv_counts_and_order_per_stage(schedule, v):
    p, m = 4, 8
    cfg = ParallelConfig(pipeline_model_parallel_size=p, pipeline_schedule=schedule,
                         virtual_pipeline_model_parallel_size=v if v > 1 else None,
                         global_batch_size=m).resolve(p)
    res = build_programs(_synthetic(layers=8), cfg)
    for s, prog in res.programs.items():
        sr = Counter((t.op.direction, t.op.tag) for t in prog.tasks if isinstance(t.op, SendRecv))
        # closed form: every micro-batch chunk crosses every virtual-stage boundary once each way
        n_first, n_last = (1 if s == 0 else 0), (1 if s == p - 1 else 0)
        assert sr[("recv", "fwd")] == m * v - m * n_first
        assert sr[("send", "fwd")] == m * v - m * n_last
        assert sr[("recv", "bwd")] == m * v - m * n_last
        assert sr[("send", "bwd")] == m * v - m * n_first
        computes = [t.op for t in prog.tasks if isinstance(t.op, Compute) and t.op.phase in ("fwd", "bwd")]
        assert len(computes) == 2 * m * 8 // p  # every layer of the stage, fwd and bwd, per micro-batch
        if schedule == "1f1b":
            # p - s - 1 warm-up micro-batches: the first backward comes after p - s forwards
            per_layer = 8 // p
            first_b = next(i for i, c in enumerate(computes) if c.phase == "bwd")
            assert first_b == (p - s) * per_layer


def test_tp_collectives_per_layer_and_sequence_parallel():
    mc = with_overrides(get_model_config("gpt-1.7b"), num_layers=2, hidden_size=256, num_attention_heads=4,
                        seq_length=128, vocab_size=512)
    for sp, fwd_ops in ((False, {"all_reduce"}), (True, {"all_gather", "reduce_scatter"})):
        cfg = ParallelConfig(tensor_model_parallel_size=2, sequence_parallel=sp, global_batch_size=1).resolve(2)
        tr = trace_rank(mc, cfg)
        prog = build_programs(tr, cfg).programs[0]
        per_layer = Counter()
        for t in prog.tasks:
            op = t.op
            if isinstance(op, Collective) and op.name.startswith("tp_"):
                per_layer[op.op] += 1
        if not sp:
            # Megatron: two all-reduces per layer forward, two backward (plus the vocab-parallel
            # embedding/loss ones: 1 embedding fwd, 1 output-layer input grad bwd, 3 loss statistics)
            assert per_layer["all_reduce"] == 2 * 2 * 2 + 1 + 1 + 3
        else:
            # all-gather before QKV/fc1 and reduce-scatter after proj/fc2 (forward), each the other's
            # backward; plus the embedding's reduce-scatter and the output layer's all-gather (and their
            # backwards); the loss statistics stay all-reduces
            assert per_layer["all_gather"] == 2 * 2 * 2 + 2
            assert per_layer["reduce_scatter"] == 2 * 2 * 2 + 2
            assert per_layer["all_reduce"] == 3
            assert set(per_layer) >= fwd_ops


def test_fsdp_collectives_move_one_layer_per_call():
    """FSDP/ZeRO-3: per layer, an all-gather of the layer's bf16 parameters before its forward and its
    backward (not the last layer's backward under FSDP: torchtitan keeps it unsharded after forward), and
    a reduce-scatter of its fp32 gradients after its backward. Sizes are nccl-tests' S,
    the whole (gathered) buffer -- Llama-3 8B: 218,112,000 parameters per layer -- whatever dp is."""
    mc = with_overrides(get_model_config("llama3-8b"), num_layers=2, seq_length=256, vocab_size=1024)
    h, f = mc.hidden_size, mc.ffn_hidden_size
    kv = mc.num_query_groups * h // mc.num_attention_heads  # K and V width (grouped-query attention)
    layer = 2 * h * h + 2 * h * kv + 3 * h * f + 2 * h
    assert layer == 218_112_000
    for dp in (4, 8):
        cfg = ParallelConfig(fsdp=True, global_batch_size=dp).resolve(dp)
        prog = build_programs(trace_rank(mc, cfg), cfg, ranks=[0]).programs[0]
        ag = [t.op for t in prog.tasks if t.stream == "fsdp_ag"]
        rs = [t.op for t in prog.tasks if t.stream == "fsdp_rs"]
        ag, rs = [c for c in ag if "_L" in c.name], [c for c in rs if "_L" in c.name]  # the layers
        assert len(ag) == 2 * 2 - 1 and {c.size_bytes for c in ag} == {2 * layer}
        assert len(rs) == 2 and {c.size_bytes for c in rs} == {4 * layer}
        assert all(len(c.group) == dp for c in ag + rs)


# -- timing closed forms ----------------------------------------------------------------------------

@pytest.mark.parametrize("schedule,v", [("gpipe", 1), ("1f1b", 1), ("interleaved_1f1b", 2)])
def test_bubble_fraction_with_free_communication(schedule, v):
    p, m = 4, 8
    cfg = ParallelConfig(pipeline_model_parallel_size=p, pipeline_schedule=schedule,
                         virtual_pipeline_model_parallel_size=v if v > 1 else None,
                         global_batch_size=m).resolve(p)
    fwd, bwd, layers = 10e-3, 20e-3, 8
    _, run = _run(_synthetic(layers, fwd, bwd), cfg)
    ideal = m * (fwd + bwd) * layers / p
    measured_bubble = 1 - ideal / run.end_time_s
    assert measured_bubble == pytest.approx(bubble_fraction(p, m, v), rel=0.01)


def test_interleaving_divides_the_bubble():
    p, m, layers = 4, 8, 8
    times = {}
    for v in (1, 2):
        cfg = ParallelConfig(pipeline_model_parallel_size=p, virtual_pipeline_model_parallel_size=v if v > 1 else None,
                             global_batch_size=m).resolve(p)
        _, run = _run(_synthetic(layers), cfg)
        times[v] = run.end_time_s - m * 30e-3 * layers / p
    assert times[2] == pytest.approx(times[1] / 2, rel=0.02)


def test_ddp_overlap_hides_one_of_two_buckets():
    # Two layers, one bucket each; backward 20 ms per layer. With overlap_grad_reduce the first bucket's
    # all-reduce runs under the second layer's backward, so only the last bucket is exposed.
    params = 100_000_000  # 400 MB of fp32 gradients per layer = one bucket
    trace = _synthetic(layers=2, fwd_s=10e-3, bwd_s=20e-3, params_block=params)
    exposed = {}
    for overlap in (False, True):
        cfg = ParallelConfig(overlap_grad_reduce=overlap, grad_bucket_size_bytes=params * 4,
                             global_batch_size=2).resolve(2)
        res, run = _run(trace, cfg)
        buckets = [e for e in run.events if e.rank == 0 and e.category == "nccl:all_reduce"]
        assert len(buckets) == 2
        one = buckets[-1].end_s - buckets[-1].xfer_start_s
        exposed[overlap] = (breakdown(run.events, run.end_time_s, pipeline=False)[0].exposed_comm_s, one)
    off, one_off = exposed[False]
    on, one_on = exposed[True]
    assert off == pytest.approx(2 * one_off, rel=0.02)   # both buckets after the backward
    assert on == pytest.approx(one_on, rel=0.02)         # only the last bucket
    assert on < off


def test_symmetry_matches_full_simulation_64_and_128_gpus():
    mc = with_overrides(get_model_config("gpt-1.7b"), num_layers=4, hidden_size=512, num_attention_heads=8,
                        seq_length=256, vocab_size=1024)
    for nodes, tp, pp in ((8, 2, 2), (16, 4, 2)):
        cfg = ParallelConfig(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
                             global_batch_size=nodes * 8, overlap_grad_reduce=True).resolve(nodes * 8)
        tr = trace_rank(mc, cfg)
        _, full = _run(tr, cfg, nodes=nodes)
        _, sym = _run(tr, cfg, nodes=nodes, mirror=True)
        assert sym.end_time_s == pytest.approx(full.end_time_s, rel=0.01)


def _fsdp_parts(prog):
    """{name: [size_bytes, ...]} of the FSDP collectives of the "pre" and "post" units."""
    out: dict[str, list[int]] = {}
    for t in prog.tasks:
        if t.stream in ("fsdp_ag", "fsdp_rs") and isinstance(t.op, Collective) \
                and not t.op.name.split("_")[-1].startswith("L"):
            out.setdefault(t.op.name, []).append(t.op.size_bytes)
    return out


def test_fsdp_gathers_and_reduces_embedding_and_head():
    """ZeRO-3/FSDP shards the parts outside the layers too, once per micro-batch; S is the whole unit.
    Llama-3 (untied): pre V*h, post h + V*h elements. ZeRO-3: the embedding ("pre") and final norm plus
    output layer ("post") are units of their own, all-gathered (bf16) before their forward and backward,
    their fp32 gradients reduce-scattered after the backward. FSDP (torchtitan's ``fully_shard(model)``):
    both are the root unit, gathered once before the forward and reduce-scattered after the whole backward."""
    mc = with_overrides(get_model_config("llama3-8b"), num_layers=2, seq_length=256, vocab_size=1024)
    h, vocab = mc.hidden_size, mc.vocab_size
    pre, post = vocab * h, h + vocab * h
    assert (pre, post) == (4_194_304, 4_198_400)
    for dp in (4, 8):
        cfg = ParallelConfig(zero_stage=3, global_batch_size=2 * dp).resolve(dp)  # 2 micro-batches
        prog = build_programs(trace_rank(mc, cfg), cfg, ranks=[0]).programs[0]
        assert _fsdp_parts(prog) == {
            "fsdp_ag_fwd_pre": [2 * pre] * 2, "fsdp_ag_bwd_pre": [2 * pre] * 2, "fsdp_rs_pre": [4 * pre] * 2,
            "fsdp_ag_fwd_post": [2 * post] * 2, "fsdp_ag_bwd_post": [2 * post] * 2, "fsdp_rs_post": [4 * post] * 2}
        cfg = ParallelConfig(fsdp=True, global_batch_size=2 * dp).resolve(dp)
        prog = build_programs(trace_rank(mc, cfg), cfg, ranks=[0]).programs[0]
        assert _fsdp_parts(prog) == {"fsdp_ag_fwd_pre": [2 * (pre + post)] * 2, "fsdp_rs_pre": [4 * (pre + post)] * 2}
        assert all(len(t.op.group) == dp for t in prog.tasks
                   if t.stream.startswith("fsdp") and isinstance(t.op, Collective))
        # the embedding's forward waits for its gather (FSDP2: its copy-out, first on the compute
        # stream); the optimizer for the last reduce-scatter
        ag = next(i for i, t in enumerate(prog.tasks) if t.op.name == "fsdp_ag_fwd_pre")
        first_kernel = next(t for t in prog.tasks if t.stream == "compute")
        assert first_kernel.op.name == "fsdp_all_gather_copy_out" and ag in first_kernel.deps
        rs = [i for i, t in enumerate(prog.tasks) if t.stream == "fsdp_rs"]
        assert prog.tasks[rs[-1]].op.name == "fsdp_rs_pre"
        assert rs[-1] in next(t for t in prog.tasks if t.op.name == "clip_grad_norm").deps


def test_fsdp_tied_output_layer_gathers_the_embedding():
    """Tied embeddings on one stage (GPT), ZeRO-3: "post" (final LayerNorm, 2h) gathers the word embedding
    (V*h) with it; the embedding's gradient, both uses accumulated, is reduce-scattered once, with "pre"
    (word and position embeddings, (V + s)*h). FSDP's root unit holds the tied weight once."""
    mc = with_overrides(get_model_config("gpt-1.7b"), num_layers=2, seq_length=256, vocab_size=1024)
    h, vocab, s = mc.hidden_size, mc.vocab_size, mc.seq_length
    cfg = ParallelConfig(zero_stage=3, global_batch_size=4).resolve(4)
    trace = trace_rank(mc, cfg)
    pre, post, tied = (vocab + s) * h, 2 * h, vocab * h
    assert (trace.params_pre, trace.params_post, trace.params_post_tied) == (pre, post, tied)
    parts = _fsdp_parts(build_programs(trace, cfg, ranks=[0]).programs[0])
    assert parts == {"fsdp_ag_fwd_pre": [2 * pre], "fsdp_ag_bwd_pre": [2 * pre], "fsdp_rs_pre": [4 * pre],
                     "fsdp_ag_fwd_post": [2 * (post + tied)], "fsdp_ag_bwd_post": [2 * (post + tied)],
                     "fsdp_rs_post": [4 * post]}
    cfg = ParallelConfig(fsdp=True, global_batch_size=4).resolve(4)
    parts = _fsdp_parts(build_programs(trace_rank(mc, cfg), cfg, ranks=[0]).programs[0])
    assert parts == {"fsdp_ag_fwd_pre": [2 * (pre + post)], "fsdp_rs_pre": [4 * (pre + post)]}


def test_zero3_pipeline_gathers_pre_on_first_stage_and_post_on_last():
    """FSDP with pipeline stages (torchtitan): only the first stage holds (and gathers) the embedding, only
    the last the final norm and output layer; middle stages neither. Under PP torchtitan keeps the
    parameters unsharded after the forward (``reshard_after_forward`` off), so each unit is gathered once
    and its gradient reduce-scattered once per iteration, not per micro-batch. ZeRO-3 without FSDP is
    refused with PP (no framework runs it)."""
    mc = with_overrides(get_model_config("llama3-8b"), num_layers=3, seq_length=256, vocab_size=1024)
    h, vocab = mc.hidden_size, mc.vocab_size
    with pytest.raises(ValueError, match=r"zero_stage=3 with pipeline_model_parallel_size > 1: .* set fsdp = true"):
        ParallelConfig(pipeline_model_parallel_size=3, zero_stage=3, global_batch_size=6)
    cfg = ParallelConfig(pipeline_model_parallel_size=3, fsdp=True, global_batch_size=6).resolve(6)
    lay = Layout(cfg)
    ranks = [lay.rank(**{**lay.coords(0), "pp": s}) for s in range(3)]
    progs = build_programs(trace_rank(mc, cfg), cfg, ranks=ranks).programs
    parts = [_fsdp_parts(progs[r]) for r in ranks]
    assert parts[0] == {"fsdp_ag_fwd_pre": [2 * vocab * h], "fsdp_rs_pre": [4 * vocab * h]}
    assert parts[1] == {}
    post = h + vocab * h
    assert parts[2] == {"fsdp_ag_fwd_post": [2 * post], "fsdp_rs_post": [4 * post]}
