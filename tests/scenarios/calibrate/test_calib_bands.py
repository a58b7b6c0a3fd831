"""GEMM bands below the shape classes: names, and the fallback from the finest fitted band to the dtype."""

from dataclasses import replace

import pytest

from hwmodel import calibration_overlay as O
from hwmodel.costmodel import KernelCostModel, gemm_class, gemm_classes
from hwmodel.ir import Compute
from hwmodel.specs import get_gpu


def _conv3x3(bytes_accessed: float, phase: str = "fwd", stride: int = 1) -> Compute:
    # ResNet-50 stage 3 conv2: M = 32 x 14 x 14, N = 256, K = 256 x 9
    name = "aten.convolution" if phase == "fwd" else "aten.convolution_backward"
    return Compute(name, "gemm", 2 * 6272 * 256 * 2304, bytes_accessed, "fp32", (1, 6272, 256, 2304), phase=phase,
                   conv_stride=stride)


def test_band_names():
    unstrided, strided = _conv3x3(15.2e6), _conv3x3(34.5e6, stride=2)
    assert gemm_classes(unstrided) == ("conv3x3_fwd@m13n8k11", "conv3x3@m13n8k11", "conv3x3_fwd", "conv3x3")
    # Winograd/FFT need a unit stride: a strided convolution is a class of its own, in every band
    assert gemm_classes(strided) == ("conv3x3s2_fwd@m13n8k11", "conv3x3s2@m13n8k11", "conv3x3s2_fwd", "conv3x3s2")
    assert gemm_classes(Compute("mm", "gemm", 1e9, 0, "fp32"))[0] == gemm_class(Compute("mm", "gemm", 1e9, 0))
    assert gemm_classes(Compute("mm", "gemm", 1e9, 0, "fp32")) == ("matmul_fwd", "matmul")  # no shape: no band


def test_traced_convolutions_carry_their_stride():
    from workload.trace.graph import conv_stride

    # ResNet's stem (7x7, stride 2, 224 -> 112), a "same" 3x3, and the backward (dL/dy, x, w)
    assert conv_stride("aten.convolution", ((32, 3, 224, 224), (64, 3, 7, 7)), ((32, 64, 112, 112),)) == 2
    assert conv_stride("aten.convolution", ((32, 64, 56, 56), (64, 64, 3, 3)), ((32, 64, 56, 56),)) == 1
    assert conv_stride("aten.convolution_backward", ((32, 128, 28, 28), (32, 128, 56, 56), (128, 128, 3, 3)),
                       ((32, 128, 56, 56), (128, 128, 3, 3))) == 2
    assert conv_stride("aten.mm", ((4, 4), (4, 4)), ((4, 4),)) == 1


def test_finest_fitted_band_prices_the_task(tmp_path):
    from scenarios.calibrate.profile import write_profile

    v100 = get_gpu("V100-SXM2")
    unstrided, strided, bwd = _conv3x3(15.2e6), _conv3x3(34.5e6, stride=2), _conv3x3(24e6, "bwd")
    other = Compute("aten.convolution_backward", "gemm", 2 * 1568 * 512 * 4608, 40e6, "fp32", (1, 1568, 512, 4608),
                    phase="bwd")  # stage 4's shape: no band fitted
    eff = {"conv3x3_fwd": 1.0, "conv3x3_fwd@m13n8k11": 3.0, "conv3x3@m13n8k11": 2.0, "conv3x3s2_fwd": 0.5,
           "conv3x3": 1.5}
    ov = O.load_overlay(write_profile(tmp_path / "p.toml", {
        "profile": {"name": "bands"}, "gpu": {"V100-SXM2": {"gemm_class_efficiency": eff, "launch_overhead_s": 0.0}}}))
    with O.applied(ov):
        m = KernelCostModel(v100, sustained=True)
        t_unstrided, t_strided, t_bwd = (m.cost(t).solo_time_s for t in (unstrided, strided, bwd))
        t_other = m.cost(other).solo_time_s
        t_other_at = m.cost(replace(other, phase="fwd", name="aten.convolution")).solo_time_s
    # same FLOPs, compute-bound: time is inversely proportional to the efficiency of the finest fitted band
    assert t_strided / t_unstrided == pytest.approx(3.0 / 0.5, rel=0.02)  # strided: its own class, 0.5
    assert t_bwd / t_unstrided == pytest.approx(3.0 / 2.0, rel=0.02)  # bwd: no class of its own -> shape band
    # a bwd task with no band and no bwd class: the op in either pass (1.5), not the fwd class (1.0)
    assert t_other_at / t_other == pytest.approx(1.5 / 1.0, rel=0.02)
