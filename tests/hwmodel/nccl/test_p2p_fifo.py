"""Send/recv through NCCL's connection FIFO: a send that fits does not wait for its receive
(hwmodel.runtime, hwmodel.nccl.algorithms.p2p.p2p_fifo_steps)."""

import pytest

from hwmodel.cluster import Cluster
from hwmodel.gpu import wave_rate_bound
from hwmodel.ir import Compute, Program, SendRecv
from hwmodel.nccl.algorithms.p2p import P2P_FIFO_STEPS, P2PPlan, p2p_fifo_steps
from hwmodel.nccl.engine import NcclEngine
from hwmodel.runtime import Runtime
from hwmodel.topology import build_system

KiB, MiB = 1 << 10, 1 << 20


def _gemm(name="gemm_8k"):
    return Compute(name, "gemm", 2 * 8192**3, 3 * 2 * 8192**2, "bf16", (1, 8192, 8192, 8192))


def _late_receiver(sizes, *, sender_gemm=False, receiver_gemms=2):
    """Rank 0 sends ``sizes`` to rank 1 at once (stream p2p), optionally with a GEMM beside them; rank 1
    receives them only after ``receiver_gemms`` GEMMs. Returns (events, topology)."""
    topo = build_system("dgx-a100", 1)
    p0, p1 = Program(0), Program(1)
    for size in sizes:
        p0.add(SendRecv("send", 1, size, name="act"), "p2p")
    if sender_gemm:
        p0.add(_gemm(), "compute")
    last = None
    for i in range(receiver_gemms):
        last = p1.add(_gemm(f"late_{i}"), "compute")
    for size in sizes:
        p1.add(SendRecv("recv", 0, size, name="act"), "p2p", (last,))
    return Runtime(Cluster(topo), [p0, p1]).run().events, topo


def _ev(events, rank, category):
    return [e for e in events if e.rank == rank and e.category == category]


def test_fifo_steps_follow_nccls_chunking():
    # single node, NVLink: 512 KiB steps; a 4 MiB message on 16 channels is 256 KiB per channel
    nvl = P2PPlan(16, "simple", 512 * KiB, 0.0)
    assert p2p_fifo_steps(4 * MiB, nvl, multi_node=False) == 1
    assert p2p_fifo_steps(32 * MiB, nvl, multi_node=False) == 4  # 2 MiB per channel
    assert p2p_fifo_steps(128 * MiB, nvl, multi_node=False) == 16  # twice the FIFO
    # network: 128 KiB steps, chunk halved below 8 steps and quartered below one (enqueue.cc)
    net = P2PPlan(2, "simple", 128 * KiB, 0.0)
    assert p2p_fifo_steps(MiB, net, multi_node=True) == 4  # 512 KiB per channel / 128 KiB
    assert p2p_fifo_steps(512 * KiB, net, multi_node=True) == 4  # 256 KiB / 64 KiB
    assert p2p_fifo_steps(64 * KiB, net, multi_node=True) == 1  # 32 KiB / 32 KiB
    assert p2p_fifo_steps(8 * KiB, P2PPlan(1, "ll", 128 * KiB, 0.0), multi_node=True) == 1


def test_a_send_that_fits_ends_before_its_receive_which_moves_the_data_when_posted():
    size = 4 * MiB
    events, topo = _late_receiver([size])
    cl = Cluster(topo)
    plan = NcclEngine(cl).plan_p2p("n0.gpu0", "n0.gpu1", size)
    assert plan.info["fifo_steps"] == 1 <= P2P_FIFO_STEPS
    (send,), (recv,) = _ev(events, 0, "send"), _ev(events, 1, "recv")
    gemms = [e for e in events if e.rank == 1 and e.name.startswith("late_")]
    # the send: the latency, then one read and one write of the bytes through GPU 0's HBM, alone there
    hbm_Bps = cl.gpus["n0.gpu0"].hbm.capacity
    assert send.end_s - send.start_s == pytest.approx(plan.latency_s + 2 * size / hbm_Bps, rel=1e-9)
    assert send.end_s < gemms[0].end_s  # over long before rank 1 asks for the data
    # nothing held rank 1's SMs while its GEMMs ran: each at its solo time
    solo = cl.gpus["n0.gpu1"].cost(_gemm()).solo_time_s
    assert [g.duration_s for g in gemms] == pytest.approx([solo, solo], rel=1e-9)
    # the receive moves the data from its post, as fast as a transfer whose peers both wait
    assert recv.xfer_start_s == pytest.approx(gemms[-1].end_s, abs=1e-12)
    p0, p1 = Program(0), Program(1)
    p0.add(SendRecv("send", 1, size), "p2p")
    p1.add(SendRecv("recv", 0, size), "p2p")
    ref = [e for e in Runtime(Cluster(topo), [p1, p0]).run().events if e.category == "recv"][0]
    assert recv.end_s - recv.xfer_start_s == pytest.approx(ref.end_s - ref.xfer_start_s, rel=1e-9)


def test_a_send_beyond_the_fifo_waits_for_its_receive_and_holds_its_channels_sms():
    size = 128 * MiB  # 8 MiB per channel: 16 steps of 512 KiB, twice the FIFO
    events, topo = _late_receiver([size], sender_gemm=True)
    cl = Cluster(topo)
    plan = NcclEngine(cl).plan_p2p("n0.gpu0", "n0.gpu1", size)
    assert plan.info["fifo_steps"] == 16 and plan.n_channels == 16
    (send,), (gemm,) = _ev(events, 0, "send"), _ev(events, 0, "gemm")
    late = [e for e in events if e.rank == 1 and e.name.startswith("late_")]
    assert send.xfer_start_s == pytest.approx(late[-1].end_s, abs=1e-12)  # a rendezvous
    assert send.start_s <= gemm.start_s and gemm.end_s <= send.xfer_start_s  # the GEMM ran inside the wait
    cost = cl.gpus["n0.gpu0"].cost(_gemm())
    sm = topo.gpu_spec.sm_count
    rate = min((sm - plan.n_channels) / sm, wave_rate_bound(cost.ctas, sm, sm - plan.n_channels))
    assert gemm.duration_s == pytest.approx(cost.solo_time_s / rate, rel=1e-9)


def test_compute_beside_a_send_that_fits_slows_only_while_the_send_holds_its_sms():
    size = 4 * MiB
    events, topo = _late_receiver([size], sender_gemm=True)
    (send,), (gemm,) = _ev(events, 0, "send"), _ev(events, 0, "gemm")
    solo = Cluster(topo).gpus["n0.gpu0"].cost(_gemm()).solo_time_s
    held = min(send.end_s, gemm.end_s) - max(send.start_s, gemm.start_s)
    assert 0 < held < 0.01 * solo
    # at worst the GEMM does nothing while the SMs are held: it loses at most that time
    assert solo < gemm.duration_s <= solo + held * (1 + 1e-9)


def test_sends_share_the_fifo_and_the_one_that_overflows_it_waits():
    size = 32 * MiB  # 2 MiB per channel: 4 of the 8 steps
    events, topo = _late_receiver([size] * 3)
    assert NcclEngine(Cluster(topo)).plan_p2p("n0.gpu0", "n0.gpu1", size).info["fifo_steps"] == 4
    sends, recvs = _ev(events, 0, "send"), _ev(events, 1, "recv")
    posted = [e for e in events if e.rank == 1 and e.name.startswith("late_")][-1].end_s
    assert [s.end_s < posted for s in sends] == [True, True, False]
    assert sends[2].xfer_start_s == pytest.approx(recvs[2].start_s, abs=1e-12)  # matched at its receive
    assert [r.xfer_start_s >= posted for r in recvs] == [True, True, True]
