"""Bad input gives one line on stderr naming the field (and what it allows) and exit status 2 -- never a
traceback, never a hang; plus the fp32 peak, the JSON's link groups and the nccl-tests header."""

import json
import re
import time

import pytest

from scenarios.cli import main
from scenarios.report import _pct
from scenarios.scenario import MAX_NODES
from workload.zoo import get_model_config, with_overrides
from workload.zoo.hf import config_from_hf

LLAMA_HF = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 2048, "num_attention_heads": 16,
            "num_key_value_heads": 8, "intermediate_size": 8192, "vocab_size": 32000,
            "max_position_embeddings": 4096}


def one_line_error(capsys, argv) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("setting, message", [
    ('model.num_layers="8"', "[model] gpt3-175b: num_layers must be a positive integer, got '8'"),
    ("model.num_layers=8.0", "num_layers must be a positive integer, got 8.0"),
    ("model.num_layers=true", "num_layers must be a positive integer, got True"),
    ("model.hidden_size=12288.5", "hidden_size must be a positive integer, got 12288.5"),
    ("model.vocab_size=abc", "vocab_size must be a positive integer, got 'abc'"),
    ("model.ffn_hidden_size=0", "ffn_hidden_size must be positive, got 0"),
    ('model.attention_backend="fast"', "attention_backend must be one of 'flash', 'flash2', 'flash3', 'cudnn', "
                                       "'efficient', 'unfused', got 'fast'"),
    ("model.hidden_dropout=true", "hidden_dropout must be a number, got True"),
    ("system.gpu_overrides.tensor_TFLOPS=5", "[system] gpu_overrides: overrides of GPUSpec 'A100-SXM4-80GB': "
                                             "key 'tensor_TFLOPS' must be a table of dtype -> peak"),
    ("system.gpu_overrides.nvlink_links=true", "field 'nvlink_links' must be a number, got True"),
    ("system.gpu_overrides.nvlink_links=0", "nvlink_links = 0 leaves the GPUs of a dgx-a100 node with no path"),
    ("training.global_batch_size=true", "[training] global_batch_size must be int, got true"),
    ("training.global_batch_size=1.5", "[training] global_batch_size must be int, got 1.5"),
    ("system.nodes=true", "[system] nodes must be int, got true"),
    ("parallel.num_layers_in_first_pipeline_stage=8",
     "num_layers=8 with num_layers_in_first_pipeline_stage=8: leaves 0 layers for the last stage "
     "(pipeline_model_parallel_size=2), which needs at least one layer"),
    ("model.hf_config=x.json", "[model] give one of name, factory, hf_config; got name and hf_config"),
    ('system.gpu_overrides.architecture="volta"', "[system] gpu_overrides: architecture: unknown 'volta' (did you "
                                                  "mean 'Volta'? the name is case-sensitive); allowed: Ampere, "
                                                  "Blackwell, Hopper"),
    ('system.fabric="none"', "[system] fabric = 'none' connects no servers; it needs nodes = 1, got 4"),
    ("model.num_layers=100000", "num_layers=100000 is above 2048"),  # refused at once, not traced for minutes
    ("simulation.host_launch_overhead_s=1", "[simulation] host_launch_overhead_s must be in [0, 1e-3] seconds"),
])
def test_bad_values_name_the_field(capsys, setting, message):
    err = one_line_error(capsys, ["run", "--set", setting])
    assert message in err


def test_model_config_types_are_checked_in_the_library():
    cfg = get_model_config("gpt3-175b")
    assert with_overrides(cfg, rotary_base=5).rotary_base == 5  # an int where a float is: fine
    assert with_overrides(cfg, num_layers=4).num_layers == 4
    with pytest.raises(ValueError, match="num_query_groups must be a positive integer, got 'x'"):
        with_overrides(cfg, num_query_groups="x")
    with pytest.raises(ValueError, match="num_layers must be positive, got -1"):
        with_overrides(cfg, num_layers=-1)


@pytest.mark.parametrize("nodes", [MAX_NODES + 1, 1_000_000, 0])
def test_absurd_node_counts_fail_fast(capsys, nodes):
    t0 = time.perf_counter()
    err = one_line_error(capsys, ["run", "--set", f"system.nodes={nodes}"])
    assert time.perf_counter() - t0 < 5.0
    assert f"[system] nodes must be in 1..{MAX_NODES}, got {nodes}" in err and "131,072 GPUs" in err


def test_batch_divisibility_is_checked_before_building_a_large_fabric(capsys):
    t0 = time.perf_counter()
    err = one_line_error(capsys, ["run", "--set", f"system.nodes={MAX_NODES}"])
    assert time.perf_counter() - t0 < 1.5  # building 16,384 nodes alone takes tens of seconds
    assert "global_batch_size=16 is not divisible by micro_batch_size=1 x data_parallel_size=8192" in err


def test_nccl_tests_bounds_nodes(capsys):
    err = one_line_error(capsys, ["nccl-tests", "all_reduce", "--nodes", "1000000"])
    assert f"--nodes must be in 1..{MAX_NODES}" in err


def _scenario(tmp_path, model: str, name: str = "s.toml") -> str:
    p = tmp_path / name
    p.write_text(f'[system]\nname = "dgx-a100"\nnodes = 1\n[model]\n{model}\n'
                 f'[parallel]\ntensor_model_parallel_size = 8\n[training]\nglobal_batch_size = 1\n')
    return str(p)


def test_hf_config_is_relative_to_the_scenario_file(tmp_path, monkeypatch, capsys):
    sub = tmp_path / "cfgs"
    sub.mkdir()
    (sub / "config.json").write_text(json.dumps(LLAMA_HF | {"num_hidden_layers": 1}))
    path = _scenario(sub, 'hf_config = "config.json"')
    monkeypatch.chdir(tmp_path)  # not the scenario's folder
    from scenarios.runner import prepare
    from scenarios.scenario import load_scenario
    prep = prepare(load_scenario(path))
    assert prep.model_cfg.num_layers == 1 and prep.model_cfg.hidden_size == 2048


def test_hf_config_errors_name_the_file(tmp_path, capsys):
    err = one_line_error(capsys, ["run", _scenario(tmp_path, 'hf_config = "missing.json"')])
    assert f"[model] hf_config not found: {tmp_path / 'missing.json'} (relative paths are taken from the " \
           f"scenario file's folder)" in err and "transformers" not in err
    bad = tmp_path / "bad.json"
    bad.write_text("not json")
    err = one_line_error(capsys, ["run", _scenario(tmp_path, 'hf_config = "bad.json"')])
    assert f"Hugging Face config {bad}: malformed JSON: Expecting value: line 1 column 1" in err
    (tmp_path / "str.json").write_text(json.dumps(LLAMA_HF | {"hidden_size": "2048"}))
    err = one_line_error(capsys, ["run", _scenario(tmp_path, 'hf_config = "str.json"')])
    assert "str.json: hidden_size must be a positive integer, got '2048'" in err
    (tmp_path / "frac.json").write_text(json.dumps(LLAMA_HF | {"num_hidden_layers": 2.5}))
    err = one_line_error(capsys, ["run", _scenario(tmp_path, 'hf_config = "frac.json"')])
    assert "frac.json: num_hidden_layers must be a positive integer, got 2.5" in err
    err = one_line_error(capsys, ["run", _scenario(tmp_path, 'name = "gpt3-175b"\nhf_config = "str.json"')])
    assert "[model] give one of name, factory, hf_config; got name and hf_config" in err


def test_hf_loader_checks_types():
    assert config_from_hf(LLAMA_HF).num_layers == 2
    with pytest.raises(ValueError, match="num_key_value_heads must be a positive integer, got True"):
        config_from_hf(LLAMA_HF | {"num_key_value_heads": True})


def test_unreadable_scenario_and_tuner_files_name_the_file(tmp_path, capsys):
    err = one_line_error(capsys, ["run", str(tmp_path)])
    assert f"{tmp_path} is a directory; expected a scenario file" in err
    latin = tmp_path / "latin1.toml"
    latin.write_bytes('name = "caf\xe9"\n'.encode("latin-1"))
    err = one_line_error(capsys, ["run", str(latin)])
    assert f"{latin}: not UTF-8 text (byte 11)" in err
    err = one_line_error(capsys, ["sweep", str(latin)])
    assert f"{latin}: not UTF-8 text" in err
    err = one_line_error(capsys, ["nccl-tests", "all_reduce", "--tuner-config", str(latin)])
    assert "latin1.toml" in err and "not UTF-8 text (byte 11)" in err


def test_cluster_file_as_gpu_file_says_what_it_is(capsys):
    err = one_line_error(capsys, ["run", "--set", 'system.gpu_file="examples/cluster_dgx_a100_4node.toml"'])
    assert "is a cluster file (for hwmodel.topology.load_cluster_file), not a GPU file" in err


def test_nccl_tests_header_prints_the_requested_max_bytes(capsys):
    assert main(["nccl-tests", "all_reduce", "-b", "1M", "-e", "8G", "-f", "4", "-g", "8"]) == 0
    cap = capsys.readouterr()
    assert "minBytes 1048576 maxBytes 8589934592 step: 4(factor)" in cap.out
    assert re.search(r"^\s+4294967296\s", cap.out, re.M) and not re.search(r"^\s+8589934592\s", cap.out, re.M)


def test_tuner_rule_with_too_many_channels_gets_a_note(tmp_path, capsys):
    rules = tmp_path / "wide.conf"
    rules.write_text("allreduce,0,4294967295,ring,simple,1000,-1,-1\n")
    assert main(["nccl-tests", "all_reduce", "-b", "1M", "-e", "1M", "-g", "8", "--tuner-config", str(rules)]) == 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "up to 1000 channels" in err and "64 at most" in err


def test_percentages_never_print_minus_zero():
    assert _pct(-1e-9) == "0.0 %" and _pct(-0.0) == "0.0 %" and _pct(0.1234) == "12.3 %"
    assert _pct(-0.5) == "-50.0 %"


def test_fp32_uses_the_cuda_core_peak_and_json_links_are_groups(tmp_path, capsys):
    """fp32 GEMMs run at the A100's CUDA-core 19.5 TFLOP/s (no TF32 by default); MFU and the report's
    peak use it. The JSON's busiest links are the text report's groups, with their sizes."""
    out = tmp_path / "m.json"
    rc = main(["run", "--set", "system.nodes=1", "--set", "parallel.pipeline_model_parallel_size=1",
               "--set", "model.num_layers=1", "--set", "training.global_batch_size=1",
               "--set", 'training.dtype="fp32"', "--set", "model.seq_length=1024", "--json", str(out)])
    text = capsys.readouterr().out
    assert rc == 0
    assert "peak 19.5 TFLOP/s fp32 CUDA cores" in text and "tf32" not in text
    m = json.loads(out.read_text())
    assert m["mfu"] == pytest.approx(m["model_flops_per_iteration"] / m["iteration_time_s"] / 8 / 19.5e12)
    shown = float(re.search(r"MFU\s+([\d.]+) %", text).group(1))
    assert shown == pytest.approx(100 * m["mfu"], abs=0.06)
    links = m["busiest_links"]
    assert 1 <= len(links) <= 10 and all(r["links"] >= 1 for r in links)
    # one DGX A100: NVLink 12 x 25 GB/s per GPU, PCIe Gen4 x16 32 GB/s per direction (the text's capacity)
    assert {(r["kind"], r["capacity_Bps"]) for r in links} <= {("nvlink", 300e9), ("pcie", 32e9)}
    assert any(r["kind"] == "nvlink" for r in links)
    for r in links[:6]:  # the text shows the first 6 groups, "(+k)" for k more links of the same load
        label = r["link"] if r["links"] == 1 else f"{r['link']} (+{r['links'] - 1})"
        row = rf"^\s+{re.escape(label)}\s+{r['kind']}\s+{r['links']}\s.* {r['capacity_Bps'] / 1e9:.0f} GB/s "
        assert re.search(row, text, re.M), label


@pytest.mark.parametrize("overrides, message", [
    (["parallel.use_distributed_optimizer=true", "parallel.zero_stage=3"],
     "use_distributed_optimizer=true is ZeRO stage 1 (Megatron-LM's distributed optimizer); it conflicts with "
     "zero_stage=3"),
    (["parallel.overlap_param_gather=true"], "overlap_param_gather=true needs the distributed optimizer"),
    (["parallel.overlap_param_gather=true", "parallel.zero_stage=2", "parallel.pipeline_model_parallel_size=1"],
     "overlap_param_gather=true needs the distributed optimizer"),
    (["parallel.zero_stage=2"], "zero_stage=2 is DeepSpeed's ZeRO-2 (Megatron-DeepSpeed); it conflicts with "
                                "pipeline_model_parallel_size > 1"),
])
def test_combinations_megatron_refuses_are_refused(capsys, overrides, message):
    """Megatron-LM's arguments.py asserts these; a plan it refuses is not simulated as if it ran."""
    err = one_line_error(capsys, ["run", *[a for o in overrides for a in ("--set", o)]])
    assert message in err


@pytest.mark.parametrize("argv", [["run", "--max-tasks", "abc"], ["nccl-tests", "all_reduce", "-b"], ["bogus"]])
def test_argument_errors_are_one_line(capsys, argv):
    """argparse's own errors (a bad type, a missing value, an unknown command): one line, exit 2, no usage
    block before it (``--help`` shows the usage)."""
    from scenarios.cli import main

    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and ": error: " in err and "usage:" not in err


def test_an_uneven_split_is_unset_with_none():
    """TOML has no null: ``--set parallel.num_layers_in_first_pipeline_stage=none`` unsets a file's split (it
    was refused as "got 'none'"), as ``search --fix`` spells it."""
    from scenarios.scenario import parallel_kwargs

    kw = parallel_kwargs({"pipeline_model_parallel_size": 4, "num_layers_in_first_pipeline_stage": "none",
                          "num_layers_in_last_pipeline_stage": 7}, {})
    assert "num_layers_in_first_pipeline_stage" not in kw and kw["num_layers_in_last_pipeline_stage"] == 7


def test_an_oom_report_shows_the_plan_as_a_run_does(capsys):
    """The OOM verdict's Parallel line is the simulated run's (schedule or none, VPP, sequence parallelism), not a
    shorter one that hid whether interleaving applied."""
    from scenarios.cli import main

    assert main(["run", "llama3-70b-tp8-pp4-dgx-h100", "--set", "system.nodes=1", "--set",
                 "parallel.pipeline_model_parallel_size=1", "--set",
                 "parallel.virtual_pipeline_model_parallel_size=1"]) == 3
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("Parallel"))
    assert "no pipeline" in line and "sequence parallel" in line and "(32 micro-batches per pipeline)" in line
