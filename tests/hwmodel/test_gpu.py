"""The GPU as shared SMs and HBM, and CUDA stream semantics in the runtime."""

import pytest

from hwmodel.cluster import Cluster
from hwmodel.ir import Compute, Memcpy, Program
from hwmodel.runtime import Runtime
from hwmodel.topology import build_system

GEMM = Compute("gemm", "gemm", 2 * 8192**3, 3 * 8192 * 8192 * 2, shape=(1, 8192, 8192, 8192))
COPY = Compute("copy", "copy", 0.0, 4e9)


def _cluster():
    return Cluster(build_system("dgx-a100", 1))


def test_two_overlapping_compute_bound_kernels_each_take_twice_as_long(env):
    c = _cluster()
    gpu = c.gpus["n0.gpu0"]
    solo = gpu.cost(GEMM).solo_time_s
    a, b = gpu.launch(GEMM), gpu.launch(GEMM)
    c.env.run()
    assert a.end_time == pytest.approx(2 * solo, rel=1e-6)
    assert b.end_time == pytest.approx(2 * solo, rel=1e-6)


def test_two_memory_bound_kernels_share_hbm():
    c = _cluster()
    gpu = c.gpus["n0.gpu0"]
    solo = gpu.cost(COPY).solo_time_s
    a, _ = gpu.launch(COPY), gpu.launch(COPY)
    c.env.run()
    assert a.end_time == pytest.approx(2 * solo, rel=0.01)


def test_gemm_beside_24_held_sms_runs_at_84_of_108():
    c = _cluster()
    gpu = c.gpus["n0.gpu0"]
    solo = gpu.cost(GEMM).solo_time_s
    gpu.hold_sms(24)  # a 24-channel NCCL kernel
    act = gpu.launch(GEMM)
    c.env.run(until=solo / 2)
    assert act.rate == pytest.approx(84 / 108)
    gpu.release_sms(24)
    c.env.run()
    assert act.end_time == pytest.approx(solo / 2 + (solo - solo / 2 * 84 / 108), rel=1e-6)


def test_streams_are_in_order_and_events_order_across_streams():
    c = _cluster()
    p = Program(0)
    a = p.add(GEMM, "s1")
    p.add(GEMM, "s2")           # independent: overlaps with a
    p.add(COPY, "s2", deps=[a])  # waits for a (a CUDA event), and for its stream predecessor
    res = Runtime(c, [p], host_launch_overhead_s=0.0).run()
    ev = {e.task_id: e for e in res.events}
    assert ev[0].start_s == ev[1].start_s == 0.0           # two streams run concurrently
    assert ev[2].start_s == pytest.approx(max(ev[0].end_s, ev[1].end_s))
    assert ev[0].end_s == pytest.approx(2 * c.gpus["n0.gpu0"].cost(GEMM).solo_time_s, rel=1e-6)


def test_host_launch_overhead_serialises_issue():
    c = _cluster()
    p = Program(0)
    tiny = Compute("tiny", "elementwise", 0.0, 1.0)
    for _ in range(10):
        p.add(tiny, "compute")
    res = Runtime(c, [p], host_launch_overhead_s=10e-6).run()
    starts = [e.start_s for e in sorted(res.events, key=lambda e: e.task_id)]
    # the GPU finishes each tiny kernel before the host has issued the next one
    assert starts == pytest.approx([10e-6 * (i + 1) for i in range(10)])


def test_memcpy_h2d_over_pcie_on_a_copy_engine():
    c = _cluster()
    p = Program(0)
    p.add(Memcpy("h2d", 1_000_000_000), "copy")
    res = Runtime(c, [p], host_launch_overhead_s=0.0).run()
    pcie = c.pcie_link("n0.gpu0", "h2d").capacity
    assert res.end_time_s == pytest.approx(1e9 / pcie, rel=1e-6)


def test_placement_errors_name_the_gpu():
    c = _cluster()
    with pytest.raises(ValueError, match="unknown GPU 'n9.gpu0'"):
        Runtime(c, [Program(0)], placement={0: "n9.gpu0"})
    with pytest.raises(ValueError, match="same GPU"):
        Runtime(c, [Program(0), Program(1)], placement={0: "n0.gpu0", 1: "n0.gpu0"})
