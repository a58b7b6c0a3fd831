"""Sweeps: ``--vary`` parsing, sweep files, the rows in point order, OOM points, the CLI."""

import json

import pytest

from scenarios.cli import main
from scenarios.sweep import catalog_dir, load_sweep, parse_vary, run_sweep

TINY = """
name = "tiny"
[system]
name = "dgx-a100"
[model]
name = "gpt3-175b"
num_layers = 2
[parallel]
tensor_model_parallel_size = 8
sequence_parallel = true
[training]
global_batch_size = 2
"""


def test_parse_vary_reads_toml_values():
    assert parse_vary("parallel.tensor_model_parallel_size=2,4,8") == ("parallel.tensor_model_parallel_size", [2, 4, 8])
    assert parse_vary("system.nic=ConnectX-6-HDR, ndr") == ("system.nic", ["ConnectX-6-HDR", "ndr"])
    assert parse_vary("system.oversubscription=1,1.5") == ("system.oversubscription", [1, 1.5])
    for bad in ("nodes=1,2", "system.nodes", "system.nodes="):
        with pytest.raises(ValueError, match="--vary"):
            parse_vary(bad)


def test_sweep_file_and_vary_override():
    sw = load_sweep("whatif-nvlink-bandwidth")
    assert sw.keys == ["system.gpu_overrides.nvlink_links"] and sw.x_values == [150, 300, 450, 600]
    assert [p["system.gpu_overrides.nvlink_links"] for p in sw.points()] == [6, 12, 18, 24]
    sw = load_sweep("whatif-nvlink-bandwidth",
                    ["system.gpu_overrides.nvlink_links=6,24", "training.global_batch_size=4,8"])
    assert sw.x_values is None
    assert sw.points() == [
        {"system.gpu_overrides.nvlink_links": 6, "training.global_batch_size": 4},
        {"system.gpu_overrides.nvlink_links": 6, "training.global_batch_size": 8},
        {"system.gpu_overrides.nvlink_links": 24, "training.global_batch_size": 4},
        {"system.gpu_overrides.nvlink_links": 24, "training.global_batch_size": 8},
    ]
    assert (catalog_dir() / "whatif-nvlink-bandwidth.toml").exists()


def test_bad_sweep_table_names_the_allowed_keys(tmp_path, capsys):
    p = tmp_path / "s.toml"
    p.write_text(TINY + "[sweep]\nvalues = 1\n")
    assert main(["sweep", str(p)]) == 2
    err = capsys.readouterr().err
    assert "[sweep] unknown key(s) values; allowed: vary, x_label, x_values" in err
    p.write_text(TINY)
    assert main(["sweep", str(p)]) == 2
    assert "nothing to vary" in capsys.readouterr().err
    assert main(["sweep", str(p), "--vary", "system.gpus=1,2"]) == 2
    assert "[system] unknown key(s) gpus" in capsys.readouterr().err


@pytest.fixture(scope="module")
def tiny_rows(tmp_path_factory):
    p = tmp_path_factory.mktemp("sweep") / "tiny.toml"
    p.write_text(TINY)
    sw = load_sweep(str(p), ["training.global_batch_size=4,2"])
    return sw, run_sweep(sw)


def test_two_point_sweep_returns_rows_in_order(tiny_rows):
    sw, rows = tiny_rows
    assert [r.values for r in rows] == [{"training.global_batch_size": 4}, {"training.global_batch_size": 2}]
    assert all(not r.error and not r.oom for r in rows)
    # Twice the micro-batches: about twice the time, the same TFLOP/s within 10 %.
    assert rows[0].iteration_time_s / rows[1].iteration_time_s == pytest.approx(2.0, rel=0.1)
    assert rows[0].tflops_per_gpu == pytest.approx(rows[1].tflops_per_gpu, rel=0.1)
    assert rows[0].metrics["parallel"]["num_microbatches"] == 4


def test_workers_give_the_same_rows(tiny_rows):
    sw, rows = tiny_rows
    again = run_sweep(sw, workers=2)
    assert [r.iteration_time_s for r in again] == [r.iteration_time_s for r in rows]


def test_progress_bars_change_no_row(tiny_rows, capsys):
    sw, rows = tiny_rows
    again = run_sweep(sw, progress=True)
    err = capsys.readouterr().err
    assert "sweep tiny" in err and "point" in err  # the points bar
    assert "simulating tiny" in err  # and, with one worker, each point's run below it
    assert [r.to_json() for r in again] == [r.to_json() for r in rows]


def test_sweep_cli_prints_rows_marks_oom_and_writes_outputs(tmp_path, capsys):
    p = tmp_path / "tiny.toml"
    p.write_text(TINY)
    rc = main(["sweep", str(p), "--vary", "model.num_layers=2,96", "--json", str(tmp_path / "s.json"),
               "--plot", str(tmp_path / "s.png")])
    out = capsys.readouterr().out
    assert rc == 0
    lines = [ln for ln in out.splitlines() if ln.startswith(("2 ", "96 "))]
    assert len(lines) == 2 and lines[0].startswith("2 ") and lines[1].startswith("96 ")
    assert " ms " in lines[0] and "fits" in lines[0]
    assert "OOM" in lines[1] and "not simulated" in lines[1]
    doc = json.loads((tmp_path / "s.json").read_text())
    assert [r["values"]["model.num_layers"] for r in doc["rows"]] == [2, 96]
    assert doc["rows"][1]["oom"] is True and doc["rows"][1]["iteration_time_s"] is None
    assert (tmp_path / "s.png").read_bytes()[:4] == b"\x89PNG"
    assert (tmp_path / "s_tflops.png").exists()


def test_a_point_that_does_not_parse_carries_its_error_and_the_others_run(tmp_path, capsys):
    """The README: failed points show their error in their row; the other points still run. Here the
    first point fails in parsing (an FP8 recipe without dtype fp8), which used to abort the sweep."""
    p = tmp_path / "tiny.toml"
    p.write_text(TINY.replace('name = "dgx-a100"', 'name = "dgx-h100"'))
    assert main(["sweep", str(p), "--vary", "training.dtype=bf16,fp8", "--vary", "training.fp8_recipe=tensorwise",
                 "--json", str(tmp_path / "rows.json")]) == 2  # some points failed (the others ran)
    rows = json.loads((tmp_path / "rows.json").read_text())["rows"]
    assert "applies to dtype = 'fp8'" in rows[0]["error"]
    assert rows[1]["error"] is None and rows[1]["metrics"]["iteration_time_s"] > 0


def test_a_key_no_point_accepts_fails_once_up_front(tmp_path, capsys):
    """An unknown varied key refuses every point alike: one line, exit 2, no table of repeated errors."""
    p = tmp_path / "tiny.toml"
    p.write_text(TINY)
    assert main(["sweep", str(p), "--vary", "system.foo=1,2,3"]) == 2
    cap = capsys.readouterr()
    assert cap.out == "" and cap.err.count("\n") == 1
    assert cap.err.startswith("trainsim sweep: error: every point: [system] unknown key(s) foo; allowed: ")


def test_a_key_given_twice_is_refused(tmp_path, capsys):
    """Two --vary of one key: the first was silently dropped; one line, exit 2."""
    p = tmp_path / "tiny.toml"
    p.write_text(TINY)
    assert main(["sweep", str(p), "--vary", "model.num_layers=2", "--vary", "model.num_layers=4"]) == 2
    assert capsys.readouterr().err == ("trainsim sweep: error: --vary model.num_layers: given twice; give each key "
                                       "once, with all its values (v1,v2,...)\n")


def test_points_that_all_give_the_same_time_say_the_key_changes_nothing(tmp_path, capsys):
    """One DGX with TP 8 only: nothing crosses the fabric, so its spine count cannot matter; the sweep says
    so once, below the table (and a sweep whose points differ says nothing of the kind)."""
    p = tmp_path / "tiny.toml"
    p.write_text(TINY)
    assert main(["sweep", str(p), "--vary", "system.spines=1,4"]) == 0
    out = capsys.readouterr().out
    assert out.count("every point gives the same iteration time") == 1
    assert "system.spines changes nothing in this scenario" in out
    assert main(["sweep", str(p), "--vary", "model.num_layers=1,2"]) == 0
    assert "same iteration time" not in capsys.readouterr().out


def test_sequence_parallel_at_tp_1_is_turned_off_with_a_warning(tmp_path, capsys):
    """Megatron-LM's validate_args turns sequence parallelism off at TP 1 and warns; a sweep over TP with
    sequence_parallel = true runs its TP 1 point (it used to fail), and says so for that point only."""
    p = tmp_path / "tiny.toml"
    p.write_text(TINY)
    assert main(["sweep", str(p), "--vary", "parallel.tensor_model_parallel_size=1,8",
                 "--set", "model.num_layers=1", "--set", "training.global_batch_size=8", "--json",
                 str(tmp_path / "rows.json")]) == 0
    out = capsys.readouterr().out
    rows = json.loads((tmp_path / "rows.json").read_text())["rows"]
    assert [r["error"] for r in rows] == [None, None]
    assert rows[0]["metrics"]["parallel"]["sequence_parallel"] is False
    assert rows[1]["metrics"]["parallel"]["sequence_parallel"] is True
    assert "  [parallel] sequence_parallel = true with tensor_model_parallel_size = 1: turned off, as Megatron-LM " \
           "does (\"Disabling sequence parallelism because tensor model parallelism is disabled\"): there is no " \
           "tensor-parallel group to split the sequence over (parallel.tensor_model_parallel_size=1)" in out


def test_table_values_are_spelled_as_toml():
    """A boolean knob prints as the scenario file and ``--vary`` spell it (true/false), numbers by %g."""
    from scenarios.sweep import _fmt_value

    assert [_fmt_value(v) for v in (True, False, 0.5, 8, "flash")] == ["true", "false", "0.5", "8", "flash"]


def test_memory_column_is_the_verdicts_comparison(tiny_rows):
    """The sweep prints what run's verdict compares -- device use (reserved + CUDA context + NCCL buffers)
    of the usable HBM -- not the tensors alone, so run, sweep and search show one figure."""
    from scenarios.runner import memory_for, prepare
    from scenarios.sweep import format_rows, point_scenario

    sw, rows = tiny_rows
    mem = memory_for(prepare(point_scenario(sw.base, rows[0].values, sw.source)))
    assert rows[0].verdict_need_bytes == mem.device_used > mem.reserved == rows[0].peak_reserved_bytes
    assert rows[0].peak_reserved_bytes > mem.allocated == rows[0].peak_allocated_bytes > mem.total
    assert rows[0].verdict_capacity_bytes == mem.usable_hbm
    row = rows[0].to_json()  # run --json's names, at the row's top and in its run's metrics
    for k in ("peak_allocated_bytes", "peak_reserved_bytes"):
        assert row[k] == row["metrics"][k] == row["metrics"]["memory"][k]
    for k in ("verdict", "verdict_need_bytes", "verdict_capacity_bytes"):
        assert row[k] == row["metrics"]["memory"][k]
    line = format_rows(sw, rows).splitlines()[3]
    assert line.endswith(f"fits ({mem.device_used / 1e9:.1f} of {mem.usable_hbm / 1e9:.1f} GB)")


def test_named_values_are_a_categorical_axis(tmp_path):
    """Names (dtypes, GPUs) sit at 0, 1, ... labelled with themselves, the axis label said once; names with
    ``x_values`` (NICs at their Gb/s) at those values, each tick with value and name; numbers at themselves."""
    from scenarios.sweep import PointResult, plot_rows, x_axis

    fp8 = load_sweep("whatif-fp8-llama3-70b-dgx-h100")
    xs, label, ticks = x_axis(fp8)
    assert (xs, ticks) == ([0.0, 1.0], {0.0: "bf16", 1.0: "fp8"}) and label == fp8.x_label and "=" not in label
    (tmp_path / "tiny.toml").write_text(TINY)
    gpus = load_sweep(str(tmp_path / "tiny.toml"), ["system.gpu=A100,H100"])
    assert x_axis(gpus) == ([0.0, 1.0], "system.gpu", {0.0: "A100", 1.0: "H100"})
    xs, _, ticks = x_axis(load_sweep("whatif-nic-bandwidth"))
    assert xs == [100, 200, 400, 800] and ticks[100] == "100\nConnectX-5-EDR"
    assert x_axis(load_sweep("whatif-oversubscription")) == ([1, 2, 3, 4], "leaf uplink oversubscription (k:1)", None)
    rows = [PointResult(v, 1.0 + i) for i, v in enumerate(gpus.points())]
    for path in plot_rows(gpus, rows, tmp_path / "gpus.png"):
        assert path.read_bytes().startswith(b"\x89PNG")
