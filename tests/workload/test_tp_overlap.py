"""TP communication pipelined with its GEMM: Megatron-Core tp_comm_overlap and torchtitan async TP."""

from collections import Counter
from dataclasses import dataclass

import pytest

from hwmodel.cluster import Cluster
from hwmodel.ir import Collective, Compute, Memcpy
from hwmodel.runtime import Runtime
from hwmodel.topology import build_system
from workload.parallel.builder import ModelTrace, build_programs
from workload.parallel.config import ParallelConfig
from workload.parallel.rank_trace import trace_rank
from workload.parallel.tp_overlap import UB_RS_SPLITS
from workload.zoo import get_model_config, with_overrides

TP, TOKENS, HIDDEN = 8, 8192, 8192


@dataclass(frozen=True)
class _Op:
    """A traced op record: a trainsim collective, or a fixed-duration GEMM of shape (1, m, n, k)."""

    name: str
    phase: str
    in_shapes: tuple = ()
    out_shapes: tuple = ()
    shape: tuple = ()
    seconds: float = 0.0
    dtype: str = "bf16"

    def to_compute(self) -> Compute:
        return Compute(self.name, "gemm", 2.0 * self.shape[1] * self.shape[2] * self.shape[3], 1.0,
                       shape=self.shape, layer="layers.0", phase=self.phase, fixed_time_s=self.seconds)


class _Graph:
    """One layer whose forward is [all-gather, GEMM] or [GEMM, reduce-scatter]; nothing else."""

    num_blocks = 1

    def __init__(self, op: str, gemm_s: float) -> None:
        full, shard = (TOKENS, HIDDEN), (TOKENS // TP, HIDDEN)
        if op == "all_gather":
            coll = _Op("trainsim.all_gather.default", "fwd", (shard,), (full,))
            self.fwd = [coll, _Op("fc1", "fwd", shape=(1, TOKENS, 4096, HIDDEN), seconds=gemm_s)]
        else:
            coll = _Op("trainsim.reduce_scatter.default", "fwd", (full,), (shard,))
            self.fwd = [_Op("fc2", "fwd", shape=(1, TOKENS, HIDDEN, 4096), seconds=gemm_s), coll]

    def block_ops(self, i, phase):
        return self.fwd if phase == "fwd" else []

    def pre_ops(self, phase):
        return []

    def post_ops(self, phase):
        return []


def _simulate(op: str, gemm_s: float, **flags):
    trace = ModelTrace(graph=_Graph(op, gemm_s), num_layers=1, hidden_size=HIDDEN, seq_length=TOKENS // TP,
                       micro_batch_size=1, params_pre=0, params_block=0, params_post=0)
    cfg = ParallelConfig(tensor_model_parallel_size=TP, sequence_parallel=True, global_batch_size=1,
                         **flags).resolve(TP)
    res = build_programs(trace, cfg)
    topo = build_system("dgx-h100", 1)
    gpus = topo.gpus()
    run = Runtime(Cluster(topo), res.programs, placement={r: gpus[r] for r in range(TP)},
                  host_launch_overhead_s=0.0).run()
    events = [e for e in run.events if e.rank == 0]
    return res.programs[0], events, max(e.end_s for e in events)


@pytest.mark.parametrize("flag", ["tp_comm_overlap", "async_tp"])
@pytest.mark.parametrize("gemm_s", [0.2e-3, 2e-3])
def test_ring_exchange_all_gather_closed_form(flag, gemm_s):
    """Ring-exchange all-gather + GEMM (both flags): the local shard's GEMM piece starts at once, piece j
    waits for copy j. With g = one piece alone and c = one shard copy alone (copy engines hold no SMs,
    so nothing slows the pieces): T = max(n g, (n - 1) c + g) -- max(GEMM, comm) + one chunk; the
    overlap hides at most min(g, c) per chunk pair."""
    prog, events, t = _simulate("all_gather", gemm_s, **{flag: True})
    copies = [e for e in events if e.name == "tp_ag_shard"]
    pieces = [e for e in events if e.name.startswith("fc1[")]
    assert len(copies) == TP - 1 and len(pieces) == TP
    c = copies[0].end_s - copies[0].start_s
    g = gemm_s / TP
    assert all(abs((e.end_s - e.start_s) - g) < 1e-12 for e in pieces)
    # async TP: the local shard's copy into the symmetric buffer (m, on HBM: 2 x S/n bytes) before
    # the pipeline, and (nothing recomputed: the gathered tensor is saved) its copy into the gathered
    # output after the last shard arrives, beside the last piece
    local = [e for e in events if e.name in ("tp_ag_local_copy", "tp_ag_out_copy")]
    assert len(local) == (2 if flag == "async_tp" else 0)
    m = local[0].end_s - local[0].start_s if local else 0.0
    assert all(e.start_s >= m - 1e-15 for e in copies + pieces)
    assert t == pytest.approx(m + max(TP * g, (TP - 1) * c + max(g, m)), rel=1e-6)
    serial = m + gemm_s + (TP - 1) * c + m
    assert serial - t <= (TP - 1) * min(g, c) * (1 + 1e-9) + m
    # without the flag: the whole NCCL all-gather, then the whole GEMM
    _, ev0, t0 = _simulate("all_gather", gemm_s)
    ag = next(e for e in ev0 if e.name == "tp_all_gather")
    assert t0 == pytest.approx((ag.end_s - ag.start_s) + gemm_s, rel=1e-9)
    assert t < t0


def test_userbuffers_reduce_scatter_chunks_hold_sms():
    """tp_comm_overlap's pipelined reduce-scatter: UB_RS_SPLITS GEMM pieces, each followed by a
    reduce-scatter chunk of 1/UB_RS_SPLITS of the buffer on its own stream. The chunks are NCCL
    kernels holding one SM per channel, so a (whole-GPU, fixed-time) GEMM piece beside chunk j - 1
    runs at (132 - channels) / 132 of its speed while the chunk lasts: piece j takes
    g + c_{j-1} x channels / 132 (H100: 132 SMs); the first runs alone."""
    gemm_s = 2e-3
    prog, events, t = _simulate("reduce_scatter", gemm_s, tp_comm_overlap=True)
    chunks = [tk.op for tk in prog.tasks if tk.stream == "tp_overlap"]
    assert len(chunks) == UB_RS_SPLITS
    assert all(isinstance(c, Collective) and c.op == "reduce_scatter" for c in chunks)
    assert sum(c.size_bytes for c in chunks) == TOKENS * HIDDEN * 2
    pieces = sorted((e for e in events if e.name.startswith("fc2[")), key=lambda e: e.start_s)
    g = gemm_s / UB_RS_SPLITS
    assert pieces[0].end_s - pieces[0].start_s == pytest.approx(g, rel=1e-9)
    rs = sorted((e for e in events if e.stream == "tp_overlap"), key=lambda e: e.start_s)
    for piece, chunk in zip(pieces[1:], rs, strict=False):
        held = chunk.info.channels / 132
        assert piece.end_s - piece.start_s == pytest.approx(g + (chunk.end_s - chunk.start_s) * held, rel=1e-6)
    assert t == pytest.approx(max(e.end_s for e in rs), rel=1e-12)  # the last chunk ends the layer
    # and the pipelining still beats GEMM then the whole reduce-scatter
    _, ev0, t0 = _simulate("reduce_scatter", gemm_s)
    assert t < t0


def test_async_tp_reduce_scatter_pushes_partials_and_sums_them():
    """Async TP's matmul + reduce-scatter: tp GEMM pieces, tp - 1 copy-engine pushes of one shard's
    partial sum (S / tp bytes each), then one reduction reading tp shards and writing one."""
    prog, events, _ = _simulate("reduce_scatter", 1e-3, async_tp=True)
    pushes = [tk.op for tk in prog.tasks if isinstance(tk.op, Memcpy)]
    shard = TOKENS * HIDDEN * 2 // TP
    assert [p.size_bytes for p in pushes] == [shard] * (TP - 1)
    assert sorted(p.peer for p in pushes) == list(range(1, TP))
    red = [tk.op for tk in prog.tasks if isinstance(tk.op, Compute) and tk.op.name == "tp_async_reduce"]
    assert len(red) == 1 and red[0].bytes_accessed == (TP + 1) * shard
    assert not any(isinstance(tk.op, Collective) for tk in prog.tasks)


@pytest.mark.parametrize("gemm_s", [0.2e-3, 4e-3])
def test_async_tp_reduce_scatter_produces_its_own_shard_last(gemm_s):
    """PyTorch's ``_pipelined_produce_and_all2all`` computes the partial sums of the remote shards first
    (steps 1 .. tp - 1) and the local one last, so the last push moves beside the local piece. With g one
    GEMM piece and c one push (copy engines hold no SMs; the pushes run one at a time on their stream):
    the pieces end at tp g, the pushes at g + (tp - 1) c when copies are the bottleneck, else at
    (tp - 1) g + c; the reduction follows the later of the two."""
    prog, events, t = _simulate("reduce_scatter", gemm_s, async_tp=True)
    pieces = sorted((e for e in events if e.name.startswith("fc2[")), key=lambda e: e.start_s)
    assert [e.name for e in pieces] == [f"fc2[{j}/{TP}]" for j in [*range(1, TP), 0]]
    pushes = sorted((e for e in events if e.name == "tp_rs_partial"), key=lambda e: e.start_s)
    g, c = gemm_s / TP, pushes[0].end_s - pushes[0].start_s
    red = next(e for e in events if e.name == "tp_async_reduce")
    assert pieces[-1].end_s == pytest.approx(TP * g, rel=1e-9)
    last_push = max(g + (TP - 1) * c, (TP - 1) * g + c)
    assert pushes[-1].end_s == pytest.approx(last_push, rel=1e-6)
    assert red.start_s == pytest.approx(max(TP * g, last_push), rel=1e-6)
    assert t == pytest.approx(red.end_s, rel=1e-12)


@pytest.mark.parametrize("flag", ["tp_comm_overlap", "async_tp"])
def test_real_layer_keeps_flops_and_pairs_every_sequence_parallel_collective(flag):
    """On a traced Llama layer (TP 2 + SP) the pipelining moves work, it does not change it: the same
    GEMM FLOPs; every layer collective (2 all-gathers, 2 reduce-scatters per pass) is pipelined; the
    embedding's and output layer's collectives (no adjacent GEMM of the right shape) stay whole."""
    mc = with_overrides(get_model_config("llama3-8b"), num_layers=2, seq_length=256, vocab_size=1024)
    base = ParallelConfig(tensor_model_parallel_size=2, sequence_parallel=True, global_batch_size=1)
    progs = {}
    for on in (False, True):
        cfg = ParallelConfig(**{**base.__dict__, flag: on}).resolve(2)
        progs[on] = build_programs(trace_rank(mc, cfg), cfg, ranks=[0]).programs[0]

    def gemm_flops(prog):
        return sum(t.op.flops for t in prog.tasks if isinstance(t.op, Compute) and t.op.kind == "gemm")

    assert gemm_flops(progs[True]) == pytest.approx(gemm_flops(progs[False]), rel=1e-12)
    whole = Counter(t.op.op for t in progs[True].tasks if isinstance(t.op, Collective) and t.stream == "compute")
    # 2 layers x (fwd + bwd) x 2 of each were pipelined; what stays is the embedding's reduce-scatter
    # and the output layer's all-gather and their backwards, and the 3 loss all-reduces
    assert whole == {"all_gather": 2, "reduce_scatter": 2, "all_reduce": 3}
    copies = sum(isinstance(t.op, Memcpy) and t.op.direction == "peer" for t in progs[True].tasks)
    pipelined_rs = 0 if flag == "async_tp" else 2 * 2 * 2 * UB_RS_SPLITS
    assert copies == 2 * 2 * 2 * (2 - 1) * (2 if flag == "async_tp" else 1)
    # async TP: each of the 8 all-gathers copies its local shard in, and (nothing recomputed) out
    local = sum(isinstance(t.op, Memcpy) and t.op.direction == "d2d" for t in progs[True].tasks)
    assert local == (2 * 2 * 2 * 2 if flag == "async_tp" else 0)
    assert sum(t.stream == "tp_overlap" for t in progs[True].tasks) == pipelined_rs


@pytest.mark.parametrize("flags,msg", [
    ({"tp_comm_overlap": True, "tensor_model_parallel_size": 2}, "tp_comm_overlap=true needs sequence_parallel"),
    ({"async_tp": True, "tensor_model_parallel_size": 2}, "async_tp=true needs sequence_parallel"),
    ({"async_tp": True, "tp_comm_overlap": True, "tensor_model_parallel_size": 2, "sequence_parallel": True},
     "choose one"),
    ({"tp_comm_overlap": 1}, "tp_comm_overlap must be true or false"),
    ({"async_tp": "yes"}, "async_tp must be true or false"),
])
def test_overlap_flags_refused_in_one_line(flags, msg):
    with pytest.raises(ValueError, match=msg) as e:
        ParallelConfig(**flags)
    assert "\n" not in str(e.value)


def test_async_tp_fuses_every_consumer_gemm_and_not_a_summed_reduce_scatter():
    """torchtitan's separate projections (``fsdp = true`` traces wq, wk, wv and w1, w3 as their own
    ``mm``): async TP's fused all-gather takes every GEMM reading the gathered tensor (PyTorch's
    ``fused_all_gather_matmul(A_shard, [B_0, B_1, ...])``), tp pieces of each; Megatron's
    userbuffers pairs one. The backward reduce-scatter of the summed input gradients has no producer
    ``mm`` (Inductor's ``_find_producer_matmul``) and stays a whole NCCL collective."""
    from workload.parallel.builder import TracedOps
    from workload.parallel.tp_overlap import Pipelined, pair_collectives

    mc = with_overrides(get_model_config("llama3-8b"), num_layers=1, seq_length=256, vocab_size=1024)
    cfg = ParallelConfig(tensor_model_parallel_size=2, sequence_parallel=True, global_batch_size=1, fsdp=True,
                         data_parallel_size=1, async_tp=True).resolve(2)
    trace = trace_rank(mc, cfg)  # traced for async TP: no DTensor layout copies beside the collectives
    ops = TracedOps(trace)
    fwd = pair_collectives(ops.get("block", "fwd", 0), hidden=trace.hidden_size, tp=2, mode="async")
    gathers = [it for it in fwd if isinstance(it, Pipelined) and it.collective.op == "all_gather"]
    q, kv, ffn = 4096 // 2, 1024 // 2, 14336 // 2  # wq; wk and wv (8 KV heads x 128); w1 and w3
    assert [[g.shape[2] for g in p.gemms] for p in gathers] == [[q, kv, kv], [ffn, ffn]]
    ub = pair_collectives(ops.get("block", "fwd", 0), hidden=trace.hidden_size, tp=2, mode="userbuffers")
    assert [len(p.gemms) for p in ub if isinstance(p, Pipelined) and p.collective.op == "all_gather"] == [1, 1]
    bwd = pair_collectives(ops.get("block", "bwd", 0), hidden=trace.hidden_size, tp=2, mode="async")
    assert sum(isinstance(it, Pipelined) and it.collective.op == "all_gather" for it in bwd) == 2
    assert sum(getattr(it, "op", "") == "reduce_scatter" for it in bwd) == 2  # both whole
    prog = build_programs(trace, ParallelConfig(**{**cfg.__dict__, "async_tp": True}).resolve(2), ranks=[0]).programs[0]
    pieces = Counter(t.op.name.split("[")[1] for t in prog.tasks if isinstance(t.op, Compute) and "[" in t.op.name
                     and t.op.kind == "gemm")
    assert set(pieces) == {"0/2]", "1/2]"}


def test_copy_engine_peer_copy_runs_at_the_measured_nvlink_rate():
    """A shard copy on DGX H100 moves at the measured copy-engine rate (380 of 450 GB/s, calibration
    ``[nccl.copy_engine_nvlink_efficiency]``): S/n / (0.844 x 18 x 25 GB/s) plus the path latency.
    Architectures without a measured rate (A100) keep the line rate."""
    from hwmodel.nccl.calibration import copy_engine_nvlink_efficiency

    _, events, _ = _simulate("all_gather", 2e-3, async_tp=True)
    copy = next(e for e in events if e.name == "tp_ag_shard")
    topo = build_system("dgx-h100", 1)
    g0, g1 = topo.gpus()[:2]
    latency = Cluster(topo).path(g0, g1)[1]
    shard = TOKENS * HIDDEN * 2 // TP
    assert copy_engine_nvlink_efficiency("Hopper") == pytest.approx(380 / 450, abs=1e-3)
    assert copy.end_s - copy.start_s == pytest.approx(shard / (0.844 * 18 * 25e9) + latency, rel=1e-9)
    assert copy_engine_nvlink_efficiency("Ampere") == 1.0


@pytest.mark.parametrize("micro_batch", [1, 2])
def test_async_tp_gathered_output_is_copied_for_its_weight_gradient_when_batch_first(micro_batch):
    """PyTorch's fused all-gather matmul returns the gathered A as ``movedim(0, gather_dim)`` of its
    gather-dim-major buffer. torchtitan gathers dim 1 of [batch, seq, hidden]: with a micro-batch above 1
    that is no 2-D view, so the weight-gradient mm's reshape copies it whole (read + write: 2 S bytes), once
    per fused all-gather whose output is needed (nothing recomputed: the two forward and the two backward
    all-gathers of each block). With one sequence the movedim is a view: no copy."""
    mc = with_overrides(get_model_config("llama3-8b"), num_layers=2, seq_length=256, vocab_size=1024)
    cfg = ParallelConfig(tensor_model_parallel_size=2, sequence_parallel=True, fsdp=True, async_tp=True,
                         micro_batch_size=micro_batch, global_batch_size=micro_batch,
                         data_parallel_size=1).resolve(2)
    prog = build_programs(trace_rank(mc, cfg), cfg, ranks=[0]).programs[0]
    copies = [tk.op for tk in prog.tasks if isinstance(tk.op, Compute) and tk.op.name == "tp_ag_out_layout_copy"]
    gathered = micro_batch * mc.seq_length * mc.hidden_size * 2
    assert len(copies) == (0 if micro_batch == 1 else 4 * mc.num_layers)
    assert all(c.kind == "copy" and c.bytes_accessed == 2 * gathered for c in copies)
