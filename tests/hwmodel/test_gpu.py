"""The GPU as shared SMs and HBM, and CUDA stream semantics in the runtime."""

import pytest

from hwmodel.cluster import Cluster
from hwmodel.costmodel import KernelCost
from hwmodel.gpu import wave_rate_bound
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


def test_gemm_beside_24_held_sms_runs_at_its_share_and_wave_bound():
    # 8192^3 bf16 on A100: 4096 tiles of 128x128 -> 38 waves on 108 SMs, 49 on the 84 left.
    c = _cluster()
    gpu = c.gpus["n0.gpu0"]
    cost = gpu.cost(GEMM)
    solo = cost.solo_time_s
    assert cost.ctas == 4096 and cost.detail["waves"] == 38
    rate = min(84 / 108, 38 / 49)  # fluid share of the pool, wave-quantised speed limit
    gpu.hold_sms(24)  # a 24-channel NCCL kernel
    act = gpu.launch(GEMM)
    c.env.run(until=solo / 2)
    assert act.rate == pytest.approx(rate, rel=1e-12)
    gpu.release_sms(24)
    c.env.run()
    assert act.end_time == pytest.approx(solo / 2 + (solo - solo / 2 * rate), rel=1e-9)


# -- wave quantisation when communication kernels hold SMs -------------------------------------

def _h100():
    return Cluster(build_system("dgx-h100", 1))


ONE_WAVE = Compute("gemm_1wave", "gemm", 2.0 * 1536 * 1408 * 8192, 2.0 * (1536 * 8192 + 8192 * 1408 + 1536 * 1408),
                   shape=(1, 1536, 1408, 8192))  # 12 x 11 = 132 tiles of 128x128: one wave on 132 SMs


def test_wave_rate_bound_closed_forms():
    assert wave_rate_bound(132, 132, 108) == 1 / 2
    assert wave_rate_bound(132, 132, 132) == 1.0
    assert wave_rate_bound(100, 132, 108) == 1.0  # fits the SMs left: still one wave
    assert wave_rate_bound(264, 132, 108) == 2 / 3
    assert wave_rate_bound(10_000, 132, 108) == 76 / 93
    assert wave_rate_bound(0, 132, 108) == 1.0  # grid not modelled
    assert wave_rate_bound(132, 132, 0) == 1.0  # no SM left: the empty pool gives it rate 0 anyway


def test_one_wave_gemm_beside_24_held_sms_takes_twice_its_solo_time():
    # NVIDIA forum thread 337991: a 132-CTA GEMM beside a 24-CTA ncclAllGather on H100 "nearly doubles".
    c = _h100()
    gpu = c.gpus["n0.gpu0"]
    cost = gpu.cost(ONE_WAVE)
    assert gpu.spec.sm_count == 132 and cost.ctas == 132 and cost.detail["waves"] == 1
    gpu.hold_sms(24)
    act = gpu.launch(ONE_WAVE)
    c.env.run()
    assert act.end_time == pytest.approx(2 * cost.solo_time_s, rel=1e-9)  # processor sharing alone: 132/108


def test_ten_thousand_cta_kernel_loses_about_the_sm_share():
    c = _h100()
    gpu = c.gpus["n0.gpu0"]
    cost = KernelCost(1e-3, 132, 0.0, ctas=10_000)
    gpu.hold_sms(24)
    act = gpu.launch(Compute("many_ctas", "gemm", 0.0, 0.0), cost)
    c.env.run()
    speed = cost.solo_time_s / act.end_time
    assert speed == pytest.approx(76 / 93, rel=1e-9)  # ceil(10000/132) / ceil(10000/108) waves
    assert speed == pytest.approx(108 / 132, rel=0.01)


def test_memory_bound_kernel_has_no_wave_bound():
    c = _h100()
    gpu = c.gpus["n0.gpu0"]
    cost = gpu.cost(COPY)
    assert cost.ctas == 0 and cost.sms_used == 132
    gpu.hold_sms(24)
    act = gpu.launch(COPY)
    c.env.run(until=cost.solo_time_s / 10)
    assert act.rate_bound == 1.0 and act.rate == pytest.approx(108 / 132, rel=1e-12)


def test_sms_released_halfway_gives_the_piecewise_time():
    c = _h100()
    gpu = c.gpus["n0.gpu0"]
    solo = gpu.cost(ONE_WAVE).solo_time_s
    gpu.hold_sms(24)
    act = gpu.launch(ONE_WAVE)
    c.env.run(until=solo / 2)  # two waves' pace: a quarter of the work done
    assert act.rate == 0.5
    gpu.release_sms(24)
    c.env.run()
    assert act.rate_bound == 1.0
    assert act.end_time == pytest.approx(solo / 2 + 3 / 4 * solo, rel=1e-9)


def test_sms_held_halfway_gives_the_piecewise_time():
    c = _h100()
    gpu = c.gpus["n0.gpu0"]
    solo = gpu.cost(ONE_WAVE).solo_time_s
    act = gpu.launch(ONE_WAVE)
    c.env.run(until=solo / 2)
    gpu.hold_sms(24)  # the second half now needs two waves
    c.env.run(until=solo)
    assert act.rate == 0.5
    c.env.run()
    assert act.end_time == pytest.approx(solo / 2 + 2 * (solo / 2), rel=1e-9)


def test_two_one_wave_gemms_share_and_are_wave_bound():
    # Each alone would take 2 waves on the 108 SMs left (bound 1/2); together their fair shares of the
    # pool (108 / 264 each) bind first.
    c = _h100()
    gpu = c.gpus["n0.gpu0"]
    solo = gpu.cost(ONE_WAVE).solo_time_s
    gpu.hold_sms(24)
    a, b = gpu.launch(ONE_WAVE), gpu.launch(ONE_WAVE)
    c.env.run()
    assert a.end_time == pytest.approx(solo * 264 / 108, rel=1e-9)
    assert b.end_time == pytest.approx(solo * 264 / 108, rel=1e-9)


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


def test_peer_copy_reads_the_source_hbm_and_writes_the_destination_hbm():
    """A copy-engine peer copy moves at its NVLink rate r (not limited by HBM) and loads the source GPU's
    HBM with its read and the destination's with its write, r each. A memory-bound kernel on the source
    that alone draws d of the HBM's capacity C runs at (C - r) / d of its speed while the copy moves
    data. Closed form: beside a copy moving for t_m = S / r (after its path latency), a kernel of solo
    time t_k > t_m that starts with it ends at t_k + t_m (1 - (C - r) / d); the destination's HBM
    carries the copy's S bytes as the source's does."""
    c = Cluster(build_system("dgx-h100", 1))
    src, dst = c.topology.gpus()[:2]
    size = 2e9
    p0, p1 = Program(0), Program(1)
    p0.add(Memcpy("peer", size, 1, name="push"), "copy")
    kernel = Compute("copy", "copy", 0.0, 20e9)
    p0.add(kernel, "compute")
    res = Runtime(c, [p0, p1], placement={0: src, 1: dst}, host_launch_overhead_s=0.0).run()
    push = next(e for e in res.events if e.name == "push")
    k = next(e for e in res.events if e.name == "copy")
    gpu = c.gpus[src]
    hbm = gpu.hbm.capacity
    t_c = push.end_s - push.start_s
    latency = c.path(src, dst)[1]
    r = size / (t_c - latency)  # the copy's own rate: its NVLink path alone sets it
    cost = gpu.cost(kernel)
    t_k, d = cost.solo_time_s, cost.hbm_bytes / cost.solo_time_s
    t_m = t_c - latency
    assert t_c < t_k and hbm - r < d <= hbm
    assert k.end_s == pytest.approx(t_k + t_m * (1 - (hbm - r) / d), rel=1e-6)
    assert c.gpus[dst].hbm.carried == pytest.approx(size, rel=1e-9)
