"""Profiles: written atomically, read back, applied over the shipped calibration and only while active."""

import sys

import pytest

from hwmodel import calibration_overlay as O
from hwmodel.costmodel import Calibration, KernelCostModel, gemm_class
from hwmodel.ir import Compute
from hwmodel.nccl import calibration as nccl_cal
from hwmodel.specs import get_gpu
from scenarios.calibrate.profile import dumps, nested, write_profile

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

PROFILE = {"profile": {"name": "t"},
           "gpu": {"V100-SXM2": {"launch_overhead_s": 5e-6, "gemm_class_efficiency": {"conv3x3_fwd": 2.0},
                                 "hbm_efficiency_by_kind": {"norm": 0.45}}},
           "nccl": {"nvlink_efficiency": {"ampere": {"busbw_Bps": 150e9, "line_rate_Bps": 300e9}}},
           "rows": [{"op": "aten::mm", "measured_s": 1e-5}, {"op": "aten::add_", "measured_s": 2e-6}]}


def test_dumps_round_trips():
    doc = {**PROFILE, "x": {"a b": [1, 2.5, "q\"uote"], "flag": True}}
    assert tomllib.loads(dumps(doc)) == doc


def test_nested():
    assert nested({("gpu", "A", "k"): 1, ("gpu", "A", "t", "c"): 2}) == {"gpu": {"A": {"k": 1, "t": {"c": 2}}}}


def test_write_is_atomic(tmp_path):
    out = write_profile(tmp_path / "p.toml", PROFILE)
    assert tomllib.loads(out.read_text())["gpu"]["V100-SXM2"]["launch_overhead_s"] == 5e-6
    with pytest.raises(ValueError, match="cannot write"):
        write_profile(tmp_path / "p.toml", {"bad": float("nan")})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.toml"]  # no temporary file left, old file kept
    assert tomllib.loads(out.read_text())["profile"]["name"] == "t"


def _conv3x3() -> Compute:
    return Compute("aten.convolution", "gemm", 2 * 100352 * 64 * 576, 0, "fp32", (1, 100352, 64, 576))


def test_overlay_applies_only_while_active(tmp_path):
    ov = O.load_overlay(write_profile(tmp_path / "p.toml", PROFILE))
    assert "gpu.V100-SXM2.gemm_class_efficiency.conv3x3_fwd" in ov.changed
    assert not any(c.startswith("rows") or c.startswith("profile") for c in ov.changed)
    v100 = get_gpu("V100-SXM2")
    task = _conv3x3()
    assert gemm_class(task) == "conv3x3_fwd"
    shipped = KernelCostModel(v100, sustained=True).cost(task).solo_time_s
    with O.applied(ov):
        cal = Calibration.load().for_gpu(v100)
        assert cal.launch_overhead_s == 5e-6 and cal.hbm_efficiency_by_kind == {"norm": 0.45}
        fitted = KernelCostModel(v100, sustained=True).cost(task).solo_time_s
        assert nccl_cal.nvlink_efficiency_fit()["ampere"] == pytest.approx(0.5)
        # other GPUs keep the shipped values
        assert Calibration.load().for_gpu(get_gpu("A100-SXM4-80GB")).launch_overhead_s == 3e-6
    # 2.0 / 0.8 of the efficiency: the compute part is 2.5x shorter, the launch 5 us instead of 3
    assert fitted - 5e-6 == pytest.approx((shipped - 3e-6) * 0.8 / 2.0, rel=1e-9)
    assert O.active() is None
    assert KernelCostModel(v100, sustained=True).cost(task).solo_time_s == shipped
    assert nccl_cal.nvlink_efficiency_fit()["ampere"] == pytest.approx(234.9 / 300)


@pytest.mark.parametrize(("text", "message"), [("x = 1\n", r"no \[profile\] table"), ("[profile\n", "not valid TOML"),
                                                ("[profile]\nnccl = 3\n", None)])
def test_bad_profiles(tmp_path, text, message):
    p = tmp_path / "p.toml"
    p.write_text(text)
    if message is None:  # a key of [profile] named like a section is just metadata
        assert O.load_overlay(p).changed == ()
        return
    with pytest.raises(ValueError, match=message):
        O.load_overlay(p)


def test_missing_profile_on_the_command_line(capsys, tmp_path):
    from scenarios.cli import main

    assert main(["list", "gpus", "--calibration", str(tmp_path / "missing" / "p.toml")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_attention_and_memory_constants():
    from scenarios.calibrate.fit_kernels import constant_of, with_value

    cal = Calibration.load().for_gpu(get_gpu("H100-SXM5"))
    fwd = Compute("aten._scaled_dot_product_flash_attention", "attention", 1.0, 0, "bf16", (1, 16, 4096, 4096, 128))
    path, shipped, _ = constant_of(fwd, cal)
    assert path == ("attention", "fwd_efficiency", "128") and shipped == cal.attention_params(128)[0]
    assert with_value(cal, path, 0.5).attention_params(128)[0] == 0.5
    cudnn = Compute("x_bwd", "attention", 1.0, 0, "bf16", (1, 16, 4096, 4096, 64), phase="bwd",
                    attention_kernel="cudnn")
    path, shipped, _ = constant_of(cudnn, cal)
    assert path == ("attention", "kernels", "cudnn", "bwd_efficiency", "64")
    assert with_value(cal, path, 0.3).attention_params(64, "cudnn")[1] == 0.3
    norm = Compute("aten.native_layer_norm", "norm", 0.0, 1e8, "bf16")
    path, shipped, _ = constant_of(norm, cal)
    assert path == ("hbm_efficiency_by_kind", "norm") and shipped == cal.hbm_efficiency
    slow = with_value(cal, path, 0.45)
    m = KernelCostModel(get_gpu("H100-SXM5"))
    t0 = m.cost(norm).solo_time_s
    m.cal = slow
    m._cache.clear()
    assert m.cost(norm).solo_time_s - cal.launch_overhead_s == pytest.approx((t0 - cal.launch_overhead_s) * 2, rel=1e-9)
