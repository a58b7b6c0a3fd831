"""A calibration profile's keys are checked when it is loaded: unknown keys name the allowed ones, values
out of range name their range, in one line and exit status 2 on the command line."""

import pytest

from hwmodel import calibration_overlay as O
from hwmodel.calibration_schema import check_profile, efficiency_ceiling
from hwmodel.costmodel import Calibration
from scenarios.calibrate.profile import write_profile
from scenarios.cli import main


def test_the_shipped_calibration_passes_its_own_checks():
    """Every key of the shipped file's model sections is one a profile may set, in its range: the schema
    covers the file it overlays (a key missing here would refuse a profile that copies a shipped value)."""
    data = Calibration.load().data
    check_profile({k: data[k] for k in O.MODEL_SECTIONS if k in data}, O.MODEL_SECTIONS)


@pytest.mark.parametrize(("sections", "message"), [
    ({"default": {"launch_overhead_s": -1e-6}},
     "[default] launch_overhead_s = -1e-06: must be in [0, 0.001] (seconds"),
    ({"gpu": {"A100-SXM4-80GB": {"launch_overhead_s": 3.0}}}, "launch_overhead_s = 3.0: must be in [0, 0.001]"),
    ({"default": {"gemm_efficiency": {"bf16": 50}}},
     "[default.gemm_efficiency] bf16 = 50: must be in (0, 1] (a fraction of the datasheet peak)"),
    ({"default": {"launch_overhed_s": 1e-6}},
     "[default]: unknown key 'launch_overhed_s'; allowed: attention, fp8_gemm_time_factor, gemm_class_efficiency, "
     "gemm_efficiency, gemm_tiles, hbm_efficiency, hbm_efficiency_by_kind, launch_overhead_s, memory_bytes_per_sm, "
     "sustained_clock_fraction, vector_efficiency"),
    ({"default": {"gemm_efficiency": {"bf61": 0.8}}},
     "[default.gemm_efficiency]: unknown key 'bf61'; allowed: default, bf16, fp16, tf32, fp32, fp8"),
    ({"architecture": {"ampre": {"hbm_efficiency": 0.9}}}, "[architecture]: unknown key 'ampre'; allowed: ada, ampere"),
    ({"architecture": {"hopper": {"sustained_clock_fraction": 0}}},
     "[architecture.hopper] sustained_clock_fraction = 0: must be in (0, 1]"),
    ({"default": {"hbm_efficiency": True}}, "[default] hbm_efficiency = True: must be a number"),
    ({"gpu": {"V100-SXM2": {"gemm_class_efficiency": {"conv3x3_fwd": 5.0}}}},
     '[gpu.V100-SXM2.gemm_class_efficiency] conv3x3_fwd = 5.0: must be in (0, 4]'),
    ({"gpu": {"V100-SXM2": {"gemm_class_efficiency": {"conv5x5_fwd": 1.0}}}},
     "unknown key 'conv5x5_fwd'; allowed: GEMM shape classes"),
    ({"gpu": {"V100-SXM2": {"hbm_efficiency_by_kind": {"layernorm": 0.5}}}},
     "unknown key 'layernorm'; allowed: copy, elementwise, embedding, loss, norm, optimizer, other, reduction, "
     "softmax"),
    ({"default": {"attention": {"fwd_efficiency": {"128": 1.2}}}},
     "[default.attention.fwd_efficiency] 128 = 1.2: must be in (0, 1]"),
    ({"default": {"attention": {"kernels": {"flash4": {"fwd_efficiency": {"128": 0.5}}}}}},
     "[default.attention.kernels]: unknown key 'flash4'; allowed: cudnn, efficient, flash2, flash3"),
    ({"default": {"gemm_tiles": [[128, 0]]}}, "[default] gemm_tiles = [[128, 0]]: must be a non-empty list"),
    ({"nccl": {"ib_app_efficiency": 1.5}}, "[nccl] ib_app_efficiency = 1.5: must be in (0, 1]"),
    ({"nccl": {"host_launch_s": 41.3}}, "[nccl] host_launch_s = 41.3: must be in [0, 0.001]"),
    ({"nccl": {"nvlink_efficiency": {"ampere": {"busbw_Bps": 400e9, "line_rate_Bps": 300e9}}}},
     "[nccl.nvlink_efficiency.ampere] busbw_Bps = 4e+11: above line_rate_Bps = 3e+11"),
    ({"nccl": {"nvlink_efficiency": {"ampere": {"busbw_Bps": 200e9}}}},
     "[nccl.nvlink_efficiency.ampere]: needs busbw_Bps and line_rate_Bps (missing line_rate_Bps)"),
    ({"nccl": {"ib_efficiency": 0.9}}, "[nccl]: unknown key 'ib_efficiency'; allowed: busbw_correction, "
                                       "copy_engine_nvlink_efficiency, host_fit_gpus, host_launch_s"),
    ({"defualt": {"launch_overhead_s": 4e-6}},
     "unknown section [defualt]; allowed: [default], [architecture], [gpu], [nccl], [profile], [fit], [rows], "
     "[unmatched]"),
    ({"memory": {"allocator_fragmentation": 0.2}},
     "[memory] cannot be set by a profile (the allocator's fragmentation is read from the shipped calibration "
     "only); a profile sets [default], [architecture], [gpu], [nccl]"),
])
def test_bad_profile_keys_are_refused_in_one_line(tmp_path, capsys, sections, message):
    path = write_profile(tmp_path / "p.toml", {"profile": {"name": "p"}, **sections})
    with pytest.raises(ValueError) as err:
        O.load_overlay(path)
    assert message in str(err.value) and "\n" not in str(err.value)
    assert main(["list", "gpus", "--calibration", str(path)]) == 2  # on the command line: one line, exit 2
    err_text = capsys.readouterr().err
    assert err_text.count("\n") == 1 and message in err_text and "Traceback" not in err_text


def test_nan_is_refused(tmp_path):
    path = tmp_path / "p.toml"
    path.write_text("[profile]\nname = 'p'\n[default]\nhbm_efficiency = nan\n")  # TOML has nan; a profile may not
    with pytest.raises(ValueError, match=r"\[default\] hbm_efficiency = nan: must be in \(0, 1\]"):
        O.load_overlay(path)


def test_documentation_keys_and_a_what_if_gpu_name_are_accepted(tmp_path):
    ov = O.load_overlay(write_profile(tmp_path / "p.toml", {"profile": {"name": "p"}, "gpu": {
        "my-what-if-gpu": {"launch_overhead_s": 4e-6, "source": "measured on our cluster",
                           "gemm_class_efficiency": {"conv3x3_fwd": 2.4, "matmul@m5n11k10": 2.07}}}}))
    assert ov.changed == ("gpu.my-what-if-gpu.launch_overhead_s",
                          "gpu.my-what-if-gpu.gemm_class_efficiency.conv3x3_fwd",
                          "gpu.my-what-if-gpu.gemm_class_efficiency.matmul@m5n11k10")


@pytest.mark.parametrize(("shape_class", "ceiling"), [
    ("conv3x3", 4.0), ("conv3x3_fwd", 4.0), ("conv3x3@m13n8k11", 4.0), ("conv3x3_bwd@m11n9k12", 4.0),
    ("conv3x3s2_fwd", 1.0), ("conv3x3s2", 1.0), ("conv1x1_fwd", 1.0), ("matmul_bwd", 1.0)])
def test_only_unit_stride_3x3_convolutions_may_beat_the_peak(shape_class, ceiling):
    assert efficiency_ceiling(shape_class) == ceiling
