"""``[training] recompute_method`` / ``recompute_num_layers`` through ``trainsim run``: the hierarchical engine
agrees with symmetry mode when only some layers recompute, the JSON and the report name them, bad
input is one line (exit 2). The default scenario (GPT-3 175B, 8 layers, TP 8 x PP 2 x DP 2): 4 layers a stage."""

import contextlib
import io
import json

import pytest

from scenarios.cli import main
from tests.scenarios.test_input_errors import one_line_error

FULL = ["--set", 'parallel.recompute_granularity="full"']
BLOCK1 = [*FULL, "--set", 'training.recompute_method="block"', "--set", "training.recompute_num_layers=1"]


def _run(tmp_path, name, argv):
    with contextlib.redirect_stdout(io.StringIO()) as out:
        assert main(["run", *argv, "--json", str(tmp_path / f"{name}.json")]) == 0
    return json.loads((tmp_path / f"{name}.json").read_text()), out.getvalue()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("rc")
    return {name: _run(d, name, argv) for name, argv in (
        ("none", []), ("full", FULL), ("block_sym", [*BLOCK1, "--set", "simulation.mode=symmetric"]),
        ("block_hier", [*BLOCK1, "--set", "simulation.mode=hierarchical"]))}


def test_block_sits_between_none_and_full_in_both_engines(runs):
    t = {k: v[0]["iteration_time_s"] for k, v in runs.items()}
    assert t["none"] < t["block_sym"] < t["full"]
    # the macro backward of a layer outside every checkpoint is timed without recomputation
    assert t["block_hier"] == pytest.approx(t["block_sym"], rel=0.005)
    # 1 of 4 layers a stage re-runs its forward: about a quarter of full recomputation's cost
    assert (t["block_sym"] - t["none"]) == pytest.approx((t["full"] - t["none"]) / 4, rel=0.15)


def test_json_and_report_name_the_method(runs):
    data, text = runs["block_sym"]
    assert data["parallel"]["recompute_method"] == "block" and data["parallel"]["recompute_num_layers"] == 1
    assert "recompute full (block, 1 layers)" in text
    assert "recompute_method" not in runs["full"][0]["parallel"]  # unchanged JSON without the keys


@pytest.mark.parametrize(("argv", "message"), [
    (["--set", 'parallel.recompute_method="block"'], "(put recompute_method in [training])"),
    (["--set", 'training.recompute_num_layers="2"'], "[training] recompute_num_layers must be int"),
    (["--set", 'training.recompute_method="block"', "--set", "training.recompute_num_layers=1"],
     "need recompute_granularity = 'full'"),
    ([*FULL, "--set", 'training.recompute_method="uniform"', "--set", "training.recompute_num_layers=3"],
     "must divide the layers of every pipeline stage"),
    ([*FULL, "--set", 'training.recompute_method="block"', "--set", "training.recompute_num_layers=5"],
     "allowed: 0 to 4"),
])
def test_bad_input_is_one_line(capsys, argv, message):
    assert message in one_line_error(capsys, ["run", *argv])


def test_block_over_no_layer_runs_as_none_and_says_so(runs, tmp_path):
    block0 = [*FULL, "--set", 'training.recompute_method="block"', "--set", "training.recompute_num_layers=0"]
    data, _ = _run(tmp_path, "block0", block0)
    assert data["iteration_time_s"] == runs["none"][0]["iteration_time_s"]
    assert any("checkpoints no layer" in w for w in data["warnings"])
    assert not any("checkpoints no layer" in w for w in runs["block_sym"][0].get("warnings", []))
