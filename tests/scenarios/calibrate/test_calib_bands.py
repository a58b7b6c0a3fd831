"""GEMM bands below the shape classes: names, and the fallback from the finest fitted band to the dtype."""

import pytest

from hwmodel import calibration_overlay as O
from hwmodel.costmodel import KernelCostModel, gemm_class, gemm_classes
from hwmodel.ir import Compute
from hwmodel.specs import get_gpu


def _conv3x3(bytes_accessed: float, phase: str = "fwd") -> Compute:
    # ResNet-50 stage 3 conv2: M = 32 x 14 x 14, N = 256, K = 256 x 9
    name = "aten.convolution" if phase == "fwd" else "aten.convolution_backward"
    return Compute(name, "gemm", 2 * 6272 * 256 * 2304, bytes_accessed, "fp32", (1, 6272, 256, 2304), phase=phase)


def test_band_names():
    unstrided, strided = _conv3x3(15.2e6), _conv3x3(34.5e6)  # the strided one reads a 4x larger input
    assert gemm_classes(unstrided) == ("conv3x3_fwd@i9@m13n8k11", "conv3x3_fwd@i9", "conv3x3@m13n8k11", "conv3x3_fwd")
    assert gemm_classes(strided)[1] == "conv3x3_fwd@i8"  # log2(7.4e9 / 34.5e6) = 7.7
    assert gemm_classes(Compute("mm", "gemm", 1e9, 0, "fp32"))[-1] == gemm_class(Compute("mm", "gemm", 1e9, 0))
    assert gemm_classes(Compute("mm", "gemm", 1e9, 0, "fp32")) == ("matmul_fwd",)  # no shape: the class only


def test_finest_fitted_band_prices_the_task(tmp_path):
    from scenarios.calibrate.profile import write_profile

    v100 = get_gpu("V100-SXM2")
    unstrided, strided, bwd = _conv3x3(15.2e6), _conv3x3(34.5e6), _conv3x3(24e6, "bwd")
    eff = {"conv3x3_fwd": 1.0, "conv3x3_fwd@i9": 3.0, "conv3x3@m13n8k11": 2.0}
    ov = O.load_overlay(write_profile(tmp_path / "p.toml", {
        "profile": {"name": "bands"}, "gpu": {"V100-SXM2": {"gemm_class_efficiency": eff, "launch_overhead_s": 0.0}}}))
    with O.applied(ov):
        m = KernelCostModel(v100, sustained=True)
        t_unstrided, t_strided, t_bwd = (m.cost(t).solo_time_s for t in (unstrided, strided, bwd))
    # same FLOPs, compute-bound: time is inversely proportional to the efficiency of the finest fitted band
    assert t_strided / t_unstrided == pytest.approx(3.0 / 2.0, rel=0.02)  # i8 unfitted -> the pass-free band, 2.0
    assert t_bwd / t_unstrided == pytest.approx(3.0 / 2.0, rel=0.02)  # bwd: no class of its own -> shape band
