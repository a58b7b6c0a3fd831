"""What calibrate refuses or explains: a log of another GPU, an unreachable measured time, a profile for
another GPU, fitted efficiencies above the datasheet peak."""

import json
from pathlib import Path

import pytest

from hwmodel import calibration_overlay as O
from scenarios.calibrate import CalibrationInputError
from scenarios.calibrate.fit_kernels import above_peak_note
from scenarios.calibrate.fit_measured import BOUNDS
from scenarios.calibrate.fit_nccl import fit_nccl
from scenarios.calibrate.nccl_log import read_nccl_log
from scenarios.calibrate.profile import write_profile
from scenarios.cli import main

DATA = Path(__file__).resolve().parents[2] / "data"
SCENARIO = DATA / "resnet50_v100_1gpu.toml"
A100_LOG = DATA / "nccl_tests_a100_8gpu.log"


def test_nccl_log_of_another_gpu(capsys, tmp_path):
    log = read_nccl_log(A100_LOG)
    assert log.gpu_name == "NVIDIA A100-SXM4-80GB"
    with pytest.raises(CalibrationInputError, match="A100-SXM4-80GB.*dgx-h100 has H100-SXM5"):
        fit_nccl(log, "dgx-h100")
    out = tmp_path / "x.toml"
    assert main(["calibrate", "--nccl-log", str(A100_LOG), "--system", "dgx-h100", "--output", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "A100" in err and "H100" in err
    assert not out.exists()


def test_nccl_log_without_a_gpu_line_is_noted(capsys, tmp_path):
    text = "\n".join(line for line in A100_LOG.read_text().splitlines() if "Rank" not in line)
    (tmp_path / "nogpu.log").write_text(text + "\n")
    out = tmp_path / "y.toml"
    assert main(["calibrate", "--nccl-log", str(tmp_path / "nogpu.log"), "--system", "dgx-a100",
                 "--output", str(out)]) == 0
    assert "not checked against dgx-a100" in capsys.readouterr().err
    assert out.exists()


def test_measured_time_out_of_reach(capsys, tmp_path):
    assert BOUNDS[1] == 1.0  # the microbenchmark clock is the ceiling of a sustained clock
    out = tmp_path / "m.toml"
    assert main(["calibrate", "--measured", "iteration_time_s=0.001", "--scenario", str(SCENARIO),
                 "--output", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "iteration_time_s=0.001" in err and "fastest reachable" in err and "ceiling 1.0" in err
    assert not out.exists()


PROFILE = {"profile": {"name": "v100"},
           "gpu": {"V100-SXM2": {"launch_overhead_s": 5e-6}},
           "architecture": {"volta": {"hbm_efficiency": 0.8}},
           "nccl": {"nvlink_efficiency": {"volta": {"busbw_Bps": 100e9, "line_rate_Bps": 150e9}}}}


def test_changed_lists_only_what_applies(tmp_path):
    ov = O.load_overlay(write_profile(tmp_path / "p.toml", {**PROFILE, "nccl": {
        **PROFILE["nccl"], "ib_app_efficiency": 0.9}}))
    assert len(ov.changed) == 4  # the NVLink table's line rate is the spec its busbw refers to, not a constant
    assert "nccl.nvlink_efficiency.volta.line_rate_Bps" not in ov.changed
    assert ov.applying_to("H100-SXM5", "hopper") == ("nccl.ib_app_efficiency",)
    assert set(ov.applying_to("V100-SXM2", "volta")) == set(ov.changed)
    assert "gpu.V100-SXM2.launch_overhead_s" not in ov.applying_to("V100-SXM2-16GB", "volta")
    assert len(ov.applying_to("V100-SXM2-16GB", "volta")) == 3


def test_changed_counts_constants_not_metadata(tmp_path):
    curve = {"collective": "all_reduce", "ranks": 8, "nodes": 1, "fidelity": "flow",
             "log2_size_bytes": [20.0, 30.0], "factor": [0.9, 1.1]}
    ov = O.load_overlay(write_profile(tmp_path / "p.toml", {"profile": {"name": "c"}, "nccl": {
        "host_launch_s": 4e-5, "host_fit_gpus": 8,
        "busbw_correction": {"ampere": {"all_reduce_8ranks_1nodes": curve}}}}))
    # one curve (its factors) and one host constant; the shape, knots, fidelity and GPU count describe them
    assert ov.changed == ("nccl.host_launch_s", "nccl.busbw_correction.ampere.all_reduce_8ranks_1nodes.factor")


def test_profile_of_another_gpu_warns(tmp_path, capsys):
    profile = write_profile(tmp_path / "p.toml", PROFILE)
    scenario = tmp_path / "h100.toml"
    scenario.write_text(SCENARIO.read_text().replace('"dgx-2-v100"', '"dgx-h100"').replace(
        'name = "resnet50-v100-1gpu"', 'name = "resnet50-h100-1gpu"'))
    out = tmp_path / "r.json"
    assert main(["run", str(scenario), "--calibration", str(profile), "--json", str(out)]) == 0
    assert "changes nothing for this run's GPU" in capsys.readouterr().out
    m = json.loads(out.read_text())
    assert m["calibration"]["changed"] == []
    assert any("changes nothing for this run on H100-SXM5" in w for w in m["warnings"])


def test_default_key_that_the_architecture_sets_changes_nothing(tmp_path):
    """The shipped [architecture.ampere.gemm_efficiency] sets bf16, so a profile's [default] bf16 never reaches an
    A100 (Calibration.for_gpu merges default < architecture < GPU): not reported as changing it."""
    ov = O.load_overlay(write_profile(tmp_path / "p.toml", {"profile": {"name": "d"},
                                                             "default": {"gemm_efficiency": {"bf16": 0.3}}}))
    assert ov.changed == ("default.gemm_efficiency.bf16",)
    assert ov.applying_to("A100-SXM4-80GB", "ampere") == ()
    assert ov.applying_to("V100-SXM2-16GB", "volta") == ("default.gemm_efficiency.bf16",)  # no volta section sets it
    out = tmp_path / "r.json"
    assert main(["run", "--calibration", str(tmp_path / "p.toml"), "--json", str(out)]) == 0
    warnings = json.loads(out.read_text())["warnings"]
    assert any("changes nothing for this run on A100-SXM4-80GB: 1 [default] key(s) that A100-SXM4-80GB's "
               "architecture or GPU section sets, which wins (default.gemm_efficiency.bf16)" in w for w in warnings)


@pytest.mark.parametrize("path, word", [
    (("gemm_class_efficiency", "conv3x3_fwd"), "Winograd"),
    (("gemm_class_efficiency", "conv3x3@m13n8k11"), "Winograd"),
    (("gemm_class_efficiency", "conv3x3s2_fwd"), "FLOP count"),  # strided: no Winograd (cuDNN needs stride 1)
    (("gemm_class_efficiency", "conv1x1_fwd"), "FLOP count"),
    (("gemm_efficiency", "fp32"), "pooled"),
    (("gemm_class_efficiency", "matmul_bwd"), "FLOP count"),
    (("hbm_efficiency_by_kind", "optimizer"), "byte count"),
])
def test_above_peak_notes(path, word):
    assert word in above_peak_note(path)


def _gemm_rows(name: str) -> tuple:
    from hwmodel.costmodel import KernelCostModel
    from hwmodel.ir import Compute
    from hwmodel.specs import get_gpu

    gpu = get_gpu("V100-SXM2")
    model = KernelCostModel(gpu, sustained=True)
    task = Compute(name, "gemm", 2.0 * 4096**3, 0, "fp32", (1, 4096, 4096, 4096))
    return model, [task], task.flops / gpu.peak_flops("fp32")  # seconds at the datasheet peak


def test_rows_faster_than_the_peak_are_clamped_to_it():
    """A matmul class whose rows ran at 2x the datasheet peak (a misread dtype or shape) is refitted so its
    rows run at the peak, and says why; a unit-stride 3x3 convolution at 2x is Winograd, and kept."""
    from scenarios.calibrate.fit_kernels import BOUNDS, _within_peak, exec_time, with_value

    model, rows, at_peak_s = _gemm_rows("aten.mm")
    path = ("gemm_class_efficiency", "matmul_fwd")
    value, note = _within_peak(model, model.cal, path, rows, at_peak_s / 2, 2.1, "", BOUNDS["gemm"])
    assert note.startswith("clamped (fitted 2.1): its rows ran at 2x the datasheet peak") and "misread" in note
    assert exec_time(model, with_value(model.cal, path, value), rows) == pytest.approx(at_peak_s, rel=1e-6)
    conv = ("gemm_class_efficiency", "conv3x3_fwd")
    assert _within_peak(model, model.cal, conv, rows, at_peak_s / 2, 2.1, "", BOUNDS["gemm"]) == (
        2.1, above_peak_note(conv))
    # a class constant above 1 whose rows stay below the peak absorbs the model's tile pricing: kept
    value, note = _within_peak(model, model.cal, path, rows, at_peak_s * 1.25, 1.3, "", BOUNDS["gemm"])
    assert value == 1.3 and note == above_peak_note(path)


@pytest.mark.parametrize("path", [("gemm_efficiency", "fp32"), ("hbm_efficiency_by_kind", "optimizer"),
                                  ("attention", "fwd_efficiency", "128")])
def test_fractions_of_the_peak_are_clamped_at_one(path):
    from scenarios.calibrate.fit_kernels import BOUNDS, _within_peak

    model, rows, at_peak_s = _gemm_rows("aten.mm")
    value, note = _within_peak(model, model.cal, path, rows, at_peak_s, 1.07, "", BOUNDS["gemm"])
    assert value == 1.0 and note.startswith("clamped to 1 (fitted 1.07): ") and "misread" in note
    assert _within_peak(model, model.cal, path, rows, at_peak_s, 0.93, "", BOUNDS["gemm"]) == (0.93, "")


def test_a_fit_the_profile_checks_would_refuse_is_not_written(tmp_path, capsys, monkeypatch):
    """calibrate checks the profile before writing it: a fitted host time of seconds (a log of another
    setup) is refused in one line, and no file is left that --calibration would refuse."""
    import scenarios.cmd_calibrate as cmd

    monkeypatch.setattr(cmd, "_nccl", lambda paths, system, fidelity, doc: {"nccl": {"host_launch_s": 5.0}})
    out = tmp_path / "p.toml"
    assert main(["calibrate", "--nccl-log", str(A100_LOG), "--system", "dgx-a100", "--output", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "the fit gives [nccl] host_launch_s = 5.0: must be in [0, 0.001]" in err
    assert f"{out} not written" in err and not out.exists()
