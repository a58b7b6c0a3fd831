"""What makes large runs slower: per-GPU speed variation (stragglers) and its cost at a synchronisation,
checked against closed forms and order-statistic tables, and end to end on small scenarios."""

import math

import pytest

from hwmodel.costmodel import KernelCostModel
from hwmodel.ir import Compute
from hwmodel.specs import get_gpu
from hwmodel.variation import DEFAULT_GPU_SPEED_SPREAD, expected_max_standard_normal, straggler_slowdown
from scenarios.runner import run_scenario
from scenarios.scenario import parse_scenario

SMALL = {
    "name": "small-tp8", "system": {"name": "dgx-h100", "nodes": 1},
    "model": {"name": "llama3-8b", "num_layers": 2},
    "parallel": {"tensor_model_parallel_size": 8},
    "training": {"global_batch_size": 4, "micro_batch_size": 4, "seq_length": 2048},
}


def test_expected_max_closed_forms():
    assert expected_max_standard_normal(1) == 0.0
    assert expected_max_standard_normal(2) == pytest.approx(1 / math.sqrt(math.pi), abs=1e-9)
    assert expected_max_standard_normal(3) == pytest.approx(3 / (2 * math.sqrt(math.pi)), abs=1e-9)
    # n = 4 and 5 closed forms (Godwin 1949): 3/(2 sqrt(pi)) (1 + 2/pi asin(1/3)) and 5/(4 sqrt(pi)) (1 + 6/pi
    # asin(1/3))
    a = math.asin(1 / 3)
    assert expected_max_standard_normal(4) == pytest.approx(3 / (2 * math.sqrt(math.pi)) * (1 + 2 / math.pi * a),
                                                            abs=1e-9)
    assert expected_max_standard_normal(5) == pytest.approx(5 / (4 * math.sqrt(math.pi)) * (1 + 6 / math.pi * a),
                                                            abs=1e-9)


def test_expected_max_tabulated_values():
    # Tippett (1925) / Harter (1961) tables of expected normal order statistics
    for n, e in ((10, 1.53875), (100, 2.50759), (1000, 3.24144)):
        assert expected_max_standard_normal(n) == pytest.approx(e, abs=2e-5)
    # grows like sqrt(2 ln n) from below
    for n in (1 << 10, 1 << 14, 1 << 17):
        assert expected_max_standard_normal(n) < math.sqrt(2 * math.log(n))


def test_slowdown_grows_with_gpus_and_spread():
    s = [straggler_slowdown(DEFAULT_GPU_SPEED_SPREAD, n) for n in (1, 8, 64, 1024, 12288)]
    assert s[0] == 1.0
    assert all(a < b for a, b in zip(s, s[1:], strict=False))
    assert straggler_slowdown(0.0, 4096) == 1.0
    assert straggler_slowdown(0.04, 1000) == pytest.approx(1 + 0.04 * 3.24144, abs=1e-6)


@pytest.mark.parametrize("spread", [-0.01, 0.5, 2.0])
def test_slowdown_rejects_bad_spread(spread):
    with pytest.raises(ValueError, match="gpu_speed_spread"):
        straggler_slowdown(spread, 8)


def test_speed_scale_slows_tensor_core_work_only():
    gpu = get_gpu("H100-SXM5")
    base, slow = KernelCostModel(gpu, sustained=True), KernelCostModel(gpu, sustained=True, speed_scale=0.8)
    gemm = Compute("mm", "gemm", 2 * 8192**3, 3 * 2 * 8192**2, dtype="bf16", shape=(1, 8192, 8192, 8192))
    launch = base.launch_overhead_s
    assert slow.cost(gemm).solo_time_s - launch == pytest.approx((base.cost(gemm).solo_time_s - launch) / 0.8,
                                                                 rel=1e-9)
    copy = Compute("copy", "elementwise", 0.0, 1 << 30, dtype="bf16")
    assert slow.cost(copy).solo_time_s == base.cost(copy).solo_time_s
    with pytest.raises(ValueError, match="speed_scale"):
        KernelCostModel(gpu, speed_scale=0.0)


def test_scenario_key_is_checked():
    with pytest.raises(ValueError, match=r"\[simulation\] gpu_speed_spread must be in \[0, 0.5\)"):
        parse_scenario({**SMALL, "simulation": {"gpu_speed_spread": 0.7}})


def test_stragglers_slow_a_run_by_at_most_the_slowest_gpus_factor():
    t = {s: run_scenario(parse_scenario({**SMALL, "simulation": {"gpu_speed_spread": s}})).metrics["iteration_time_s"]
         for s in (0.0, 0.05)}
    factor = straggler_slowdown(0.05, 8)
    # only the tensor-core share of the iteration slows: strictly slower, never by more than the factor
    assert t[0.0] < t[0.05] <= t[0.0] * factor * (1 + 1e-9)
    # GEMM and attention are about 60 % of this run (memory-bound kernels and TP collectives the rest)
    assert t[0.05] > t[0.0] * (1 + 0.4 * (factor - 1))


def test_one_gpu_has_no_straggler():
    one = {**SMALL, "system": {"name": "dgx-h100", "nodes": 1, "gpus_per_node": 1},
           "parallel": {"tensor_model_parallel_size": 1},
           "training": {"global_batch_size": 1, "micro_batch_size": 1, "seq_length": 512}}
    t = [run_scenario(parse_scenario({**one, "simulation": {"gpu_speed_spread": s}})).metrics["iteration_time_s"]
         for s in (0.0, 0.1)]
    assert t[0] == t[1]
