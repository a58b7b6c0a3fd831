"""``trainsim run`` with a user's own nn.Module: the catalog example end to end, an OOM verdict, and the
one-line errors (exit status 2) of a strategy a plain module cannot use or a forward that fails on meta."""

import json
from pathlib import Path

import pytest

from scenarios.cli import main

MODELS = Path(__file__).parents[1] / "workload" / "custom_models.py"


def _write(tmp_path, factory: str, extra: str = "") -> Path:
    p = tmp_path / "custom.toml"
    p.write_text(f'name = "custom"\n[system]\nname = "dgx-a100"\n[model]\nfactory = "{factory}"\n{extra}')
    return p


def test_catalog_example_runs(tmp_path, capsys):
    """examples/vit.py (ViT-B/16) with 8 images per GPU: traced FLOPs per image are ViT-B/16's
    (3 x 35.06 GFLOP forward, less the patch convolution's input gradient)."""
    out = tmp_path / "vit.json"
    rc = main(["run", "custom-vit-b16-dp", "--set", "training.micro_batch_size=8",
               "--set", "training.global_batch_size=64", "--json", str(out)])
    text = capsys.readouterr().out
    assert rc == 0
    assert "ViT: custom nn.Module (../../examples/vit.py:build), 86.57 M parameters, 12 identical blocks in " \
           "'blocks', loss output.sum()" in text
    m = json.loads(out.read_text())
    N, d, mlp, P = 197, 768, 3072, 196
    fwd = 2 * P * 768 * d + 12 * (2 * N * (4 * d * d + 2 * d * mlp) + 4 * N * N * d) + 2 * d * 1000
    expected = 64 * (3 * fwd - 2 * P * 768 * d)
    assert m["model_flops_per_iteration"] == pytest.approx(expected, rel=1e-11)  # JSON floats: 12 digits
    assert m["tokens_per_s"] is None and m["samples_per_s"] == pytest.approx(64 / m["iteration_time_s"], rel=1e-11)
    assert m["memory"]["verdict"].startswith("fits") and m["parallel"]["dp"] == 8


def test_tensor_parallel_is_one_line(tmp_path, capsys):
    path = _write(tmp_path, f"{MODELS}:plain_mlp", "input_shape = [64]\n[parallel]\ntensor_model_parallel_size = 2\n")
    assert main(["run", str(path), "--trust-code"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("trainsim run: error: [parallel] tensor_model_parallel_size = 2: tensor parallelism "
                          "splits the zoo's Megatron column/row-parallel layers; Sequential")


def test_forward_failing_on_meta_is_one_line_naming_the_factory(tmp_path, capsys):
    path = _write(tmp_path, f"{MODELS}:data_dependent", "input_shape = [8]\n")
    assert main(["run", str(path), "--trust-code"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert f"[model] factory '{MODELS}:data_dependent': DataDependent could not be traced on the meta device" in err


def test_relative_factory_file_and_oom(tmp_path, capsys):
    """A factory file relative to the scenario file; a model that does not fit exits with status 3."""
    (tmp_path / "mine.py").write_text(MODELS.read_text())
    path = _write(tmp_path, "mine.py:token_mlp",
                  'input_shape = [2048]\ninput_dtype = "int64"\n'
                  "factory_args = { d = 16384, layers = 2, vocab = 1024 }\n"
                  "[training]\nmicro_batch_size = 8\n")
    assert main(["run", str(path), "--trust-code"]) == 3
    captured = capsys.readouterr()
    assert "Not simulated: the configuration does not fit in GPU memory" in captured.out
    assert captured.err.startswith("OOM: custom: needs ")
