"""Scenario files as a user meets them: every mistake is one line naming the section and key (with the
allowed values), exit status 2, never a traceback; and every catalog file is a valid scenario."""

import pytest

from scenarios.cli import main
from scenarios.runner import prepare
from scenarios.scenario import load_scenario
from scenarios.sweep import catalog_dir, catalog_names, is_sweep_file, load_sweep, point_scenario

GOOD = """
name = "tiny"
[system]
name = "dgx-a100"
[model]
name = "gpt3-175b"
num_layers = 2
[parallel]
tensor_model_parallel_size = 8
[training]
global_batch_size = 2
"""


def _run_error(tmp_path, capsys, text, *extra):
    path = tmp_path / "s.toml"
    path.write_text(text)
    rc = main(["run", str(path), *extra])
    err = capsys.readouterr().err
    assert rc == 2
    assert "Traceback" not in err
    assert err.count("\n") == 1 and err.startswith("trainsim run: error: ")
    return err


def test_unknown_section_is_named_with_the_allowed_ones(tmp_path, capsys):
    err = _run_error(tmp_path, capsys, GOOD + "[hardware]\ngpus = 8\n")
    assert "unknown section(s) hardware" in err
    assert "[system], [model], [parallel], [training], [simulation]" in err


def test_unknown_key_is_named_with_the_allowed_keys(tmp_path, capsys):
    err = _run_error(tmp_path, capsys, GOOD.replace('name = "dgx-a100"', 'name = "dgx-a100"\ngpus = 8'))
    assert "[system] unknown key(s) gpus; allowed: " in err
    assert "fabric" in err and "nodes" in err and "oversubscription" in err


def test_gpu_and_gpu_file_together_are_refused(tmp_path, capsys):
    """The GPU file used to win silently over ``gpu``: the pair is refused, naming both."""
    (tmp_path / "gpu.toml").write_text('name = "A100-2xNVLink"\nbase = "A100-SXM4-80GB"\nnvlink_links = 24\n')
    err = _run_error(tmp_path, capsys, GOOD.replace('name = "dgx-a100"', 'name = "dgx-a100"\ngpu = "H100-SXM5"\n'
                                                                        'gpu_file = "gpu.toml"'))
    assert "[system] gpu = 'H100-SXM5' and gpu_file = 'gpu.toml': give one, not both" in err


def test_batch_size_in_parallel_points_to_training(tmp_path, capsys):
    err = _run_error(tmp_path, capsys, GOOD.replace("tensor_model_parallel_size = 8",
                                                   "tensor_model_parallel_size = 8\nglobal_batch_size = 4"))
    assert "[parallel] unknown key(s) global_batch_size" in err and "[training]" in err


def test_wrong_type_names_key_and_type(tmp_path, capsys):
    err = _run_error(tmp_path, capsys, GOOD.replace('name = "dgx-a100"', 'name = "dgx-a100"\nnodes = "four"'))
    assert "[system] nodes must be int, got 'four'" in err


def test_bad_mode_lists_the_modes(tmp_path, capsys):
    err = _run_error(tmp_path, capsys, GOOD + '[simulation]\nmode = "fast"\n')
    assert "[simulation] mode: unknown 'fast'; allowed: auto, full, symmetric, hierarchical" in err


def test_bad_fidelity_lists_the_fidelities(tmp_path, capsys):
    err = _run_error(tmp_path, capsys, GOOD + '[simulation]\nfidelity = "packet"\n')
    assert "[simulation] fidelity: unknown 'packet'; allowed: flow, step, chunked" in err


def test_malformed_toml_gives_the_line(tmp_path, capsys):
    err = _run_error(tmp_path, capsys, GOOD + "[simulation\nmode = \"full\"\n")
    assert "malformed TOML" in err and "line 12" in err


def test_missing_file_and_unknown_catalog_name(tmp_path, capsys):
    assert main(["run", str(tmp_path / "nope.toml")]) == 2
    err = capsys.readouterr().err
    assert "scenario file not found" in err and "nope.toml" in err and "Traceback" not in err
    assert main(["run", "no-such-scenario"]) == 2
    err = capsys.readouterr().err
    assert "no scenario file or catalog scenario 'no-such-scenario'" in err and "sc21-gpt-1.7b" in err


def test_unknown_names_list_known_ones(tmp_path, capsys):
    err = _run_error(tmp_path, capsys, GOOD.replace('"dgx-a100"', '"dgx-z100"'))
    assert "dgx-z100" in err and "dgx-a100" in err and "dgx-h100" in err
    err = _run_error(tmp_path, capsys, GOOD.replace('"gpt3-175b"', '"gpt-5"'))
    assert "unknown model 'gpt-5'" in err and "llama3-8b" in err


def test_impossible_parallel_layout_is_one_line(tmp_path, capsys):
    err = _run_error(tmp_path, capsys, GOOD, "--set", "parallel.tensor_model_parallel_size=16")
    assert "tensor_model_parallel_size" in err or "16" in err


def test_set_overrides_are_typed_as_toml():
    sc = load_scenario(None, ["parallel.tensor_model_parallel_size=4", "simulation.nccl_algo=ring",
                              "parallel.sequence_parallel=false", "system.oversubscription=2.5",
                              'simulation.mode="full"', "system.gpu_overrides.nvlink_links=6"])
    assert sc.parallel["tensor_model_parallel_size"] == 4
    assert sc.simulation == {"nccl_algo": "ring", "mode": "full"}
    assert sc.parallel["sequence_parallel"] is False
    assert sc.system["oversubscription"] == 2.5 and sc.system["gpu_overrides"] == {"nvlink_links": 6}
    assert prepare(sc).config.tp == 4


def test_bad_set_is_one_line(capsys):
    assert main(["run", "--set", "tensor_model_parallel_size=4"]) == 2
    err = capsys.readouterr().err
    assert "expected section.key=value" in err and "Traceback" not in err
    assert main(["run", "--set", "parallel.tensor_model_parallel_size=three"]) == 2
    assert "tensor_model_parallel_size must be a positive integer, got 'three'" in capsys.readouterr().err


def test_sweep_file_given_to_run_points_to_sweep(capsys):
    assert main(["run", "whatif-nvlink-bandwidth"]) == 2
    assert "trainsim sweep whatif-nvlink-bandwidth" in capsys.readouterr().err


# -- the catalog ---------------------------------------------------------------------------------------

EXPECTED = {
    *(f"sc21-gpt-{s}" for s in ("1.7b", "3.6b", "7.5b", "18b", "39b", "76b", "145b", "310b", "530b", "1t")),
    *(f"korthikanti-{m}-{v}" for m in ("22b", "175b", "530b", "1t") for v in ("full-recompute", "sp-selective")),
    "gpt3-175b-16x-dgx-a100", "llama3-8b-fsdp-dgx-h100", "llama3-8b-tp2-dgx-h100", "llama3-70b-fsdp-dgx-h100",
    "llama3-70b-tp8-pp4-dgx-h100", "bert-large-dp", "resnet50-dp", "mixtral-8x7b-ep",
    "whatif-nvlink-bandwidth", "whatif-nic-bandwidth", "whatif-oversubscription", "whatif-gpu-generation",
    "whatif-fp8-llama3-70b-dgx-h100", "whatif-fp8-recipes-llama3-8b-dgx-h100", "custom-vit-b16-dp",
}


def test_catalog_has_the_expected_files():
    assert set(catalog_names()) >= EXPECTED


@pytest.mark.parametrize("name", catalog_names())
def test_every_catalog_file_prepares(name):
    path = catalog_dir() / f"{name}.toml"
    if is_sweep_file(path):
        sweep = load_sweep(str(path))
        assert sweep.base.get("description") and len(sweep.points()) >= 2
        for values in sweep.points():
            prepare(point_scenario(sweep.base, values, str(path)))
        return
    sc = load_scenario(path)
    assert sc.name == name and sc.description
    prep = prepare(sc)
    assert prep.config.world_size == prep.topology.num_gpus


def test_sc21_rows_match_the_paper_table():
    sc = load_scenario(catalog_dir() / "sc21-gpt-530b.toml")
    cfg = prepare(sc).config
    assert (cfg.tp, cfg.pp, cfg.dp, cfg.global_batch_size, cfg.world_size) == (8, 35, 9, 2520, 2520)
    assert cfg.schedule == "interleaved_1f1b" and cfg.recompute_granularity == "full"
    assert sc.model["attention_backend"] == "unfused" and sc.model["hidden_dropout"] == 0.1
    k = prepare(load_scenario(catalog_dir() / "korthikanti-175b-sp-selective.toml")).config
    assert (k.tp, k.pp, k.dp, k.vpp, k.global_batch_size, k.sequence_parallel, k.recompute_granularity) == \
        (8, 8, 1, 3, 64, True, "selective")
