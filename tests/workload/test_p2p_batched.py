"""Megatron's batched, synchronised pipeline exchanges (``overlap_p2p_comm = false``): the port of its
schedules pairs every send with a receive, in order, without deadlock; the passes keep the schedule's
order; the bubble with free communication is the schedule's closed form; the next pass waits for sends."""

from collections import defaultdict, deque

import pytest

from hwmodel.cluster import Cluster
from hwmodel.ir import SendRecv
from hwmodel.runtime import Runtime
from hwmodel.topology import build_system
from tests.workload.test_builder import _synthetic  # one fixed-duration kernel per layer pass
from workload.parallel.builder import build_programs
from workload.parallel.config import ParallelConfig
from workload.parallel.p2p_batched import Exchange, megatron_exchanges
from workload.parallel.schedules import bubble_fraction, schedule

CASES = [("1f1b", 4, 8, 1), ("1f1b", 8, 3, 1), ("1f1b", 2, 1, 1), ("interleaved_1f1b", 4, 8, 2),
         ("interleaved_1f1b", 4, 4, 3), ("interleaved_1f1b", 8, 48, 6), ("interleaved_1f1b", 2, 6, 4)]


def _transfers(kind, p, m, v):
    """Per stage, its items; per (src, dst, tag), the (micro-batch, chunk) each send carries, in order, and
    the pass each receive feeds, in order (the receiver's passes that take an input, in its order)."""
    items = {s: megatron_exchanges(kind, p, s, m, v) for s in range(p)}
    steps = {s: schedule(kind, p, m, s, v) for s in range(p)}
    sent, fed = defaultdict(list), defaultdict(list)
    for s in range(p):
        fwd = [st for st in steps[s] if st.kind == "F"]
        bwd = [st for st in steps[s] if st.kind == "B"]
        done_f, done_b = deque(), deque()
        for it in items[s]:
            if isinstance(it, Exchange):
                if it.send_next:
                    st = done_f.popleft()
                    sent[(s, (s + 1) % p, "fwd")].append((st.microbatch, st.chunk + (s == p - 1)))
                if it.send_prev:
                    st = done_b.popleft()
                    sent[(s, (s - 1) % p, "bwd")].append((st.microbatch, st.chunk - (s == 0)))
                continue
            st = fwd[it[1]] if it[0] == "F" else bwd[it[1]]
            vs = st.chunk * p + s
            if it[0] == "F":
                if vs != 0:
                    fed[((s - 1) % p, s, "fwd")].append((st.microbatch, st.chunk))
                if vs != p * v - 1:
                    done_f.append(st)
            else:
                if vs != p * v - 1:
                    fed[((s + 1) % p, s, "bwd")].append((st.microbatch, st.chunk))
                if vs != 0:
                    done_b.append(st)
        assert not done_f and not done_b  # every output that leaves the stage was sent
    return items, sent, fed


@pytest.mark.parametrize("kind,p,m,v", CASES)
def test_every_send_carries_what_its_receiver_feeds_next(kind, p, m, v):
    _, sent, fed = _transfers(kind, p, m, v)
    assert set(sent) == set(fed)
    for key in sent:
        assert sent[key] == fed[key], key  # FIFO per pair and tag: the k-th send is the k-th input used


@pytest.mark.parametrize("kind,p,m,v", CASES)
def test_passes_keep_the_schedule_order(kind, p, m, v):
    """The schedule's order; interleaved with m == p, all forwards first, as Megatron's
    ``all_warmup_microbatches``."""
    for s in range(p):
        passes = [it for it in megatron_exchanges(kind, p, s, m, v) if not isinstance(it, Exchange)]
        steps = schedule(kind, p, m, s, v)
        if kind == "interleaved_1f1b" and m == p:
            steps = sorted(steps, key=lambda st: st.kind != "F")
        order = {"F": 0, "B": 0}
        expect = []
        for st in steps:
            expect.append((st.kind, order[st.kind]))
            order[st.kind] += 1
        assert passes == expect


@pytest.mark.parametrize("kind,p,m,v", CASES)
def test_exchanges_complete_under_rendezvous(kind, p, m, v):
    """Zero-time passes; an exchange completes once every one of its transfers has its peer's matching
    operation posted (FIFO per pair and tag). Every stage reaches its end: no deadlock."""
    items = {s: megatron_exchanges(kind, p, s, m, v) for s in range(p)}
    pos = dict.fromkeys(range(p), 0)
    posted = defaultdict(int)  # (src, dst, tag, "send"/"recv") -> operations posted
    mine: dict[int, list] = {}
    while any(pos[s] < len(items[s]) for s in range(p)):
        progressed = False
        for s in range(p):
            while pos[s] < len(items[s]):
                it = items[s][pos[s]]
                if not isinstance(it, Exchange):
                    pos[s] += 1
                    progressed = True
                    continue
                if s not in mine:
                    ops = [((s, (s + 1) % p, "fwd"), "send")] * it.send_next
                    ops += [((s, (s - 1) % p, "bwd"), "send")] * it.send_prev
                    ops += [(((s - 1) % p, s, "fwd"), "recv")] * it.recv_prev
                    ops += [(((s + 1) % p, s, "bwd"), "recv")] * it.recv_next
                    mine[s] = []
                    for pair, d in ops:
                        posted[(*pair, d)] += 1
                        mine[s].append((pair, d, posted[(*pair, d)]))
                    progressed = True
                other = {"send": "recv", "recv": "send"}
                if all(posted[(*pair, other[d])] >= n for pair, d, n in mine[s]):
                    del mine[s]
                    pos[s] += 1
                    progressed = True
                else:
                    break
        assert progressed, {s: items[s][pos[s]] for s in range(p) if pos[s] < len(items[s])}


def test_other_schedules_are_refused():
    with pytest.raises(ValueError, match="1f1b and interleaved_1f1b"):
        megatron_exchanges("gpipe", 4, 0, 8)
    with pytest.raises(ValueError, match="overlap_p2p_comm = false needs pipeline_schedule"):
        ParallelConfig(pipeline_model_parallel_size=4, pipeline_schedule="gpipe", overlap_p2p_comm=False,
                       global_batch_size=8).resolve(4)


def _run(trace, cfg):
    topo = build_system("dgx-a100", 1)
    res = build_programs(trace, cfg)
    gpus = topo.gpus()
    rt = Runtime(Cluster(topo), res.programs, placement={r: gpus[r] for r in range(cfg.world_size)},
                 host_launch_overhead_s=0.0)
    return res, rt.run()


def _cfg(p, m, v, overlap):
    return ParallelConfig(pipeline_model_parallel_size=p, virtual_pipeline_model_parallel_size=v if v > 1 else None,
                          overlap_p2p_comm=overlap, global_batch_size=m).resolve(p)


@pytest.mark.parametrize("v", [1, 2])
def test_bubble_with_free_communication_is_the_closed_form(v):
    """Tiny activations: the batched exchanges cost nothing and the bubble is (p-1)/(vm+p-1), as overlapped."""
    p, m, fwd, bwd, layers = 4, 8, 10e-3, 20e-3, 8
    res, run = _run(_synthetic(layers, fwd, bwd), _cfg(p, m, v, False))
    assert sum(isinstance(t.op, SendRecv) for prog in res.programs.values() for t in prog.tasks) == 4 * m * (p * v - 1)
    measured_bubble = 1 - m * (fwd + bwd) * layers / p / run.end_time_s
    assert measured_bubble == pytest.approx(bubble_fraction(p, m, v), rel=0.01)


@pytest.mark.parametrize("v", [1, 2])
def test_the_next_pass_waits_for_the_exchange_sends_included(v):
    """Activations that take time to move: every compute task after an exchange starts after all of its
    transfers end (the sends too; the overlapped builder has no compute task waiting for a send)."""
    p, m = 4, 8
    trace = _synthetic(8, 10e-3, 20e-3, hidden=2**21)  # 2^21 x 16 tokens x 2 bytes = 64 MiB per hop
    res, run = _run(trace, _cfg(p, m, v, False))
    overlapped, _ = _run(trace, _cfg(p, m, v, True))
    assert not any(isinstance(prog.tasks[d].op, SendRecv) and prog.tasks[d].op.direction == "send"
                   for prog in overlapped.programs.values() for t in prog.tasks if t.stream == "compute"
                   for d in t.deps)
    assert run.end_time_s >= m * 30e-3 * 8 / p  # never below the stage's compute
    ends = {(e.rank, e.task_id): e.end_s for e in run.events}
    starts = {(e.rank, e.task_id): e.start_s for e in run.events}
    checked = 0
    for r, prog in res.programs.items():
        for t in prog.tasks:
            p2p = [d for d in t.deps if isinstance(prog.tasks[d].op, SendRecv)]
            if t.stream == "compute" and any(prog.tasks[d].op.direction == "send" for d in p2p):
                assert starts[(r, t.id)] >= max(ends[(r, d)] for d in p2p) - 1e-12
                checked += 1
    assert checked > 0


@pytest.mark.parametrize("hidden", [2**17, 2**21])  # 4 MiB and 64 MiB per hop
def test_overlapped_interleaved_is_between_free_communication_and_the_batched_exchanges(hidden):
    """Megatron-LM's overlapped interleaved schedule posts each receive one pass early and its sends end
    once in NCCL's FIFO, so it hides what the batched, synchronised exchanges expose: never slower than
    them, never faster than the closed form with free communication (the bubble (p-1)/(vm+p-1))."""
    p, m, v, layers, fwd, bwd = 4, 8, 2, 8, 10e-3, 20e-3
    trace = _synthetic(layers, fwd, bwd, hidden=hidden)
    _, batched = _run(trace, _cfg(p, m, v, False))
    _, overlapped = _run(trace, _cfg(p, m, v, True))
    free = m * (fwd + bwd) * layers / p / (1 - bubble_fraction(p, m, v))
    assert free <= overlapped.end_time_s <= batched.end_time_s
