"""What a new user hit: a hang, code run from a scenario file, NaN accepted, silent no-op what-ifs,
paths, exit codes, BOM and multi-line errors. Each test reproduces the report and failed before."""

from __future__ import annotations

import colorsys
import json
import time
from pathlib import Path

import pytest

from hwmodel.spec_ranges import GPU_RANGES
from scenarios.catalog import catalog_dir
from scenarios.cli import UserError, main, one_line, output_dir, output_file
from scenarios.notes import what_if_notes
from scenarios.runner import DEFAULT_MAX_TASKS, TaskBudgetError, check_task_budget, estimate_tasks, prepare
from scenarios.scenario import load_scenario, parse_scenario, shipped_and_unchanged


def one_line_error(capsys, argv) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


def write(tmp_path: Path, text: str, name: str = "s.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


TINY = '[system]\nname = "dgx-a100"\nnodes = 1\n[parallel]\ntensor_model_parallel_size = 8\n' \
       '[training]\nglobal_batch_size = 2\n'


# -- 1. the hang: a task bound before simulating -------------------------------------------------------

def test_huge_batch_is_refused_in_seconds_with_the_estimate(capsys):
    """Every micro-batch simulated (``steady_state = "off"``): refused before simulating. (Under the default
    ``"auto"`` the same run simulates two short counts and extrapolates: it no longer needs the bound.)"""
    t0 = time.perf_counter()
    err = one_line_error(capsys, ["run", "--set", "training.global_batch_size=1099511627776",
                                  "--set", 'simulation.steady_state="off"'])
    assert time.perf_counter() - t0 < 60  # before: killed after 120 s, still running
    assert "549,755,813,888 micro-batches" in err and "tasks" in err and "years" in err
    assert "smaller [training] global_batch_size" in err and "--max-tasks 2,000,000" in err


def test_max_tasks_names_hierarchical_and_counts_closed_form():
    prep = prepare(load_scenario(None))
    cfg = prep.config
    from workload.parallel.placement import Layout

    reps = len(Layout(cfg).representatives())
    tasks = estimate_tasks(prep.trace, cfg, reps)
    from scenarios.budget import ROUTE_HOPS_PER_S, TASKS_PER_S, route_hops

    hops, ring = route_hops(cfg, prep.topology.gpus_per_node)  # DP 2 across 2 of the 4 servers: world hops
    assert (hops, ring) == (32, 2)
    tasks += hops * TASKS_PER_S / ROUTE_HOPS_PER_S
    check_task_budget(prep, prep.trace, "symmetric", tasks)  # at the bound: runs
    with pytest.raises(TaskBudgetError, match=r'mode = "hierarchical" or a smaller \[training\] global_batch_size'):
        check_task_budget(prep, prep.trace, "symmetric", tasks - 1)
    assert DEFAULT_MAX_TASKS >= 3 * 524_044  # the catalog's largest run (sc21-gpt-1t) passes, with margin


def test_a_tiny_max_tasks_says_under_a_second_not_about_0_s(capsys):
    """The default scenario's 2,368 tasks at TASKS_PER_S = 5,000 tasks/s take under half a second."""
    err = one_line_error(capsys, ["run", "--max-tasks", "10"])
    assert "about 2,368 tasks (8 micro-batches, mode symmetric), under a second, above --max-tasks 10" in err
    assert "about 0 s" not in err


def test_max_tasks_option_must_be_positive(capsys):
    assert "--max-tasks must be a positive number" in one_line_error(capsys, ["run", "--max-tasks", "0"])


# -- 2. code execution is opt-in ------------------------------------------------------------------------

def test_factory_from_a_file_does_not_run_without_trust(tmp_path, capsys):
    marker = tmp_path / "ran"
    path = write(tmp_path, TINY + f'[model]\nfactory = "os:system"\nfactory_args = {{command = "touch {marker}"}}\n')
    err = one_line_error(capsys, ["run", str(path)])
    assert "[model] factory = 'os:system' would run function system of module os" in err
    assert "--trust-code" in err and "TRAINSIM_TRUST_CODE=1" in err and not marker.exists()
    err = one_line_error(capsys, ["run", "custom-vit-b16-dp", "--set", 'model.factory="os:system"'])
    assert "would run function system of module os" in err  # --set on a shipped (trusted) file: not trusted
    err = one_line_error(capsys, ["sweep", str(path), "--vary", "training.global_batch_size=2,4"])
    assert "would run function system of module os" in err and not marker.exists()
    err = one_line_error(capsys, ["search", str(path)])  # the screen builds the model: refused before it
    assert "would run function system of module os" in err and not marker.exists()
    err = one_line_error(capsys, ["search", "custom-vit-b16-dp", "--set", 'model.factory="os:system"'])
    assert "would run function system of module os" in err and not marker.exists()


def test_search_checks_its_output_paths_before_searching(tmp_path, capsys):
    """A missing folder is refused in one line before the search, not created (search and synth, as run)."""
    for opt in ("--json", "--plot", "--emit-scenario"):
        err = one_line_error(capsys, ["search", "llama3-8b-tp2-dgx-h100", opt, str(tmp_path / "typo" / "x")])
        assert f"{opt} " in err and "does not exist (create it first)" in err
    err = one_line_error(capsys, ["synth", "--system", "dgx-a100", "--nodes", "2", "--axes", "dp=16",
                                  "--reduce", "dp", "--size", "1M", "--json", str(tmp_path / "typo" / "x.json")])
    assert "does not exist (create it first)" in err and not (tmp_path / "typo").exists()


COUNTER = """
from workload.zoo import get_model_config, with_overrides
CALLS = []
def build():
    CALLS.append(1)
    (__import__("pathlib").Path(__file__).parent / "calls.txt").write_text(str(len(CALLS)))
    return with_overrides(get_model_config("gpt-1.7b"), num_layers=1)
def leave():
    raise SystemExit(7)
def interrupt():
    raise KeyboardInterrupt
"""


def test_trusted_factory_runs_once_and_cannot_exit(tmp_path, capsys, monkeypatch):
    (tmp_path / "mine.py").write_text(COUNTER)
    path = write(tmp_path, TINY + '[model]\nfactory = "mine.py:build"\n')
    with pytest.raises(ValueError, match=r"function build of file .*mine.py"):
        prepare(load_scenario(path))
    prep = prepare(load_scenario(path, trust_code=True))
    assert prep.model_cfg.num_layers == 1 and (tmp_path / "calls.txt").read_text() == "1"
    monkeypatch.setenv("TRAINSIM_TRUST_CODE", "1")
    for fn, name in (("leave", "SystemExit: 7"), ("interrupt", "KeyboardInterrupt")):
        p = write(tmp_path, TINY + f'[model]\nfactory = "mine.py:{fn}"\n', f"{fn}.toml")
        err = one_line_error(capsys, ["run", str(p)])
        assert f"[model] factory 'mine.py:{fn}' raised {name}" in err


def test_shipped_catalog_is_trusted_unless_its_factory_is_overridden():
    vit = catalog_dir() / "custom-vit-b16-dp.toml"
    assert shipped_and_unchanged(vit) and load_scenario(vit).trust_code
    assert not shipped_and_unchanged(vit, ['model.factory="os:system"'])
    assert not load_scenario(vit, ['model.factory="os:system"']).trust_code
    assert parse_scenario({"system": {"name": "dgx-a100"}, "model": {"name": "gpt-1.7b"}}).trust_code  # Python


# -- 3. bad values ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("setting, message", [
    ("simulation.host_launch_overhead_s=nan", "[simulation] host_launch_overhead_s must be a finite number, got nan"),
    ("simulation.host_launch_overhead_s=-1e-6", "[simulation] host_launch_overhead_s must be in [0, 1e-3] seconds"),
    ("system.oversubscription=inf", "[system] oversubscription must be a finite number, got inf"),
    ("system.gpu_overrides.hbm_bandwidth_Bps=nan", "[system] gpu_overrides.hbm_bandwidth_Bps must be a finite"),
    ("model.hidden_dropout=-inf", "[model] hidden_dropout must be a finite number, got -inf"),
    ("system.gpu_overrides.hbm_bandwidth_Bps=1000",
     "[system] gpu_overrides: hbm_bandwidth_Bps = 1000: bytes per second; plausible range 1e+11 .. 1e+14 "
     "(about 10x beyond the shipped GPUs' 0.9 TB/s (V100) .. 8 TB/s (B200); outside is a unit mistake or a typo); "
     "did you mean 1000e9?"),
    ("system.gpu_overrides.nvlink_links=9223372036854775807",
     "nvlink_links = 9223372036854775807: links; plausible range 0 .. 144"),
    ("system.gpu_overrides.tensor_TFLOPS={bf16=1e9}", "tensor_TFLOPS.bf16 = 1e+09, i.e. 1e+21 FLOP per second"),
    ("system.nodes_per_leaf=0", "[system] nodes_per_leaf must be >= 1, got 0"),
    ("system.spines=0", "[system] spines must be >= 1, got 0"),
])
def test_bad_values_are_refused_naming_the_field(capsys, setting, message):
    assert message in one_line_error(capsys, ["run", "--set", setting])


def test_ranges_hold_every_shipped_gpu():
    """Every GPU in the shipped data file (not what-if GPUs other tests register) lies in the ranges."""
    from pathlib import Path

    import tomllib

    import hwmodel
    from hwmodel.specs import get_gpu
    shipped = tomllib.loads((Path(hwmodel.__file__).parent / "data" / "gpus.toml").read_text(encoding="utf-8"))
    assert len(shipped) >= 5
    for name in shipped:
        gpu = get_gpu(name)
        for field, (low, high, _) in GPU_RANGES.items():
            values = gpu.tensor_flops.values() if field == "tensor_flops" else [getattr(gpu, field)]
            assert all(low <= v <= high for v in values), (name, field)


def test_bert_refuses_a_sequence_beyond_its_position_table(capsys):
    err = one_line_error(capsys, ["run", "bert-large-dp", "--set", "training.seq_length=131072"])
    assert "[training] seq_length=131072 exceeds bert-large's learned position table " \
           "(max_position_embeddings=512)" in err
    ok = prepare(load_scenario(catalog_dir() / "bert-large-dp.toml", ["training.seq_length=1024",
                                                                      "model.max_position_embeddings=1024"]))
    assert ok.model_cfg.seq_length == 1024


def test_nccl_tests_refuses_empty_collectives(capsys):
    err = one_line_error(capsys, ["nccl-tests", "all_reduce", "-b", "0", "-e", "0", "-f", "1", "-i", "4"])
    assert "all_reduce of 0 bytes: 0 elements of float per rank" in err
    err = one_line_error(capsys, ["nccl-tests", "all_gather", "-b", "4", "-e", "4", "-g", "8"])
    assert "0 elements" in err  # 1 float over 8 ranks: nccl-tests' aligned per-rank count is 0


# -- 4. what-ifs that change nothing, and the fabric keys ----------------------------------------------

def notes_for(*overrides):
    prep = prepare(load_scenario(None, ["model.num_layers=2", "training.global_batch_size=4", *overrides]))
    return what_if_notes(prep.scenario.system, prep.topology), prep.topology


def test_faster_nic_than_switch_port_is_named():
    notes, _ = notes_for('system.nic="ConnectX-7-NDR"')
    assert notes == ["NIC ConnectX-7-NDR (400 Gb/s) is faster than a QM8700 switch port (200 Gb/s): every NIC "
                     "link runs at the switch port's rate; set [system] fabric_switch to a faster switch "
                     "(e.g. Q3400) for the NIC to count"]
    assert notes_for('system.nic="ConnectX-7-NDR"', 'system.fabric_switch="QM9700"')[0] == []


def test_oversubscription_under_one_leaf_is_named_and_nodes_per_leaf_reaches_the_spines():
    notes, _ = notes_for("system.oversubscription=4")
    assert len(notes) == 1 and "one scalable unit (su_size = 20)" in notes[0] and "su_size below 4" in notes[0]
    notes, topo = notes_for("system.oversubscription=4", 'system.fabric="fat_tree"')
    assert "sit under one leaf switch" in notes[0] and "nodes_per_leaf below 4" in notes[0]
    notes, topo = notes_for("system.oversubscription=4", 'system.fabric="fat_tree"', "system.nodes_per_leaf=1",
                            "system.spines=2")
    tiers = [d.get("tier") for _, d in topo.graph.nodes(data=True)]
    assert notes == [] and tiers.count("leaf") == 4 and tiers.count("spine") == 2  # 8 NICs down, 4:1 -> 2 up
    assert notes_for()[0] == []  # the default scenario: no notes, no "warnings" key in its JSON


@pytest.mark.parametrize(("field", "reason"), [
    ("pcie_generation=3", "PCIe links run at the node's PCIe generation (the system preset's), not the GPU's"),
    ("nvlink_generation=5", "NVLink runs at nvlink_links x nvlink_bandwidth_per_link_Bps through the system's "
                            "NVSwitch; set those for a faster NVLink"),
])
def test_gpu_fields_a_scenario_node_does_not_read_are_named(field, reason):
    notes, _ = notes_for(f"system.gpu_overrides.{field}")
    assert notes == [f"[system] gpu_overrides {field.split('=')[0]}: changes nothing, {reason}"]


def test_copy_engines_no_copy_waited_for_are_named():
    """copy_engines bounds the Memcpy tasks a GPU runs at once: a run whose copies never queued (none at all,
    or at most as many in flight as either engine count) is the same run, and says so."""
    from scenarios.runner import run_scenario

    def run(*overrides):
        return run_scenario(load_scenario(catalog_dir() / "llama3-8b-tp2-dgx-h100.toml",
                                          ["model.num_layers=1", "parallel.tp_comm_overlap=true", *overrides]))

    base, one = run(), run("system.gpu_overrides.copy_engines=1")
    assert one.metrics["iteration_time_s"] == base.metrics["iteration_time_s"]
    assert "[system] gpu_overrides copy_engines: changes nothing, no copy ever waited for one: at most 1 copy in " \
           "flight on a GPU" in one.metrics["warnings"]
    plain = run_scenario(load_scenario(None, ["model.num_layers=2", "training.global_batch_size=4",
                                              "system.gpu_overrides.copy_engines=8"]))
    assert any("copy_engines: changes nothing, this run has no copy-engine work" in w
               for w in plain.metrics["warnings"])
    # copies that queued for the engines: the count matters, no note
    prep = prepare(load_scenario(None, ["system.gpu_overrides.copy_engines=1"]))
    assert what_if_notes(prep.scenario.system, prep.topology, None, copies_requested_peak=2) == []


def test_unused_gpu_field_is_named():
    notes, _ = notes_for("system.gpu_overrides.l2_bytes=100000000", "system.gpu_overrides.nvlink_links=24")
    assert notes == ["[system] gpu_overrides l2_bytes: changes nothing, the cost model has no L2 cache"]


# -- 5. paths --------------------------------------------------------------------------------------------

def test_relative_paths_are_beside_the_scenario_only(tmp_path, capsys, monkeypatch):
    work, here = tmp_path / "cwd", tmp_path / "scen"
    work.mkdir()
    here.mkdir()
    (work / "gpu.toml").write_text((Path(__file__).parents[2] / "examples/whatif_a100_2x_nvlink.toml").read_text())
    monkeypatch.chdir(work)  # before: gpu_file was also looked up in the working directory
    path = write(here, TINY + '[model]\nname = "gpt-1.7b"\nnum_layers = 1\n')
    err = one_line_error(capsys, ["run", str(path), "--set", 'system.gpu_file="gpu.toml"'])
    assert f"[system] gpu_file not found: {here / 'gpu.toml'} (relative paths are taken from the scenario " \
           f"file's folder)" in err
    (here / "adir.toml").mkdir()
    err = one_line_error(capsys, ["run", str(path), "--set", 'system.gpu_file="adir.toml"'])
    assert f"[system] gpu_file {here / 'adir.toml'} is a directory; expected a .toml file" in err
    (here / "gpu.json").write_text("{}")
    err = one_line_error(capsys, ["run", str(path), "--set", 'system.gpu_file="gpu.json"'])
    assert "expected a .toml file, got .json" in err


def test_output_folders_are_not_created_by_a_typo(tmp_path, capsys):
    err = one_line_error(capsys, ["run", "--json", str(tmp_path / "typo" / "out.json")])
    assert f"--json {tmp_path / 'typo' / 'out.json'}: directory {tmp_path / 'typo'} does not exist" in err
    assert not (tmp_path / "typo").exists()
    with pytest.raises(UserError, match="is a directory; give a file name"):
        output_file("--json", str(tmp_path))
    with pytest.raises(UserError, match="end the path with / to create every missing folder"):
        output_dir("--plots", str(tmp_path / "a" / "b"))
    assert output_dir("--plots", str(tmp_path / "a" / "b") + "/") == tmp_path / "a" / "b"
    assert output_dir("--plots", str(tmp_path / "a")) == tmp_path / "a"  # one level, as mkdir


# -- 6. exit codes ---------------------------------------------------------------------------------------

def test_input_error_comes_before_the_memory_verdict(capsys):
    # TP 8 does not divide BERT's vocabulary; micro-batches of 4,096 sequences do not fit either
    err = one_line_error(capsys, ["run", "bert-large-dp", "--set", "parallel.tensor_model_parallel_size=8",
                                  "--set", "training.micro_batch_size=4096", "--set",
                                  "training.global_batch_size=4096"])
    assert "tensor_model_parallel_size=8 does not divide vocab_size=30522" in err


def test_simulate_oom_exits_0_with_a_warning(tmp_path, capsys):
    small = ["--set", "model.num_layers=2", "--set", "training.global_batch_size=4", "--set",
             "system.gpu_overrides.hbm_capacity_bytes=2e9"]
    assert main(["run", *small]) == 3
    capsys.readouterr()
    out = tmp_path / "oom.json"
    assert main(["run", *small, "--simulate-oom", "--json", str(out)]) == 0
    err = capsys.readouterr().err
    assert err.startswith("warning: OOM: default: needs ") and "--simulate-oom" in err
    assert json.loads(out.read_text())["oom"] is True


# -- 7. BOM, one-line errors, nccl-tests topology options, Gantt colours --------------------------------

def test_bom_prefixed_toml_loads(tmp_path):
    path = tmp_path / "bom.toml"
    path.write_bytes(b"\xef\xbb\xbf" + (TINY + '[model]\nname = "gpt-1.7b"\n').encode())
    assert load_scenario(path).system["nodes"] == 1


def test_section_name_with_a_newline_stays_one_line(tmp_path, capsys):
    path = write(tmp_path, TINY + '[model]\nname = "gpt-1.7b"\n["evil\\nname"]\nx = 1\n')
    err = one_line_error(capsys, ["run", str(path)])
    assert "unknown section(s) evil\\nname" in err
    assert one_line("a\nb\tc\x1b") == "a\\nb\\tc\\x1b"


def nccl_busbw(capsys, tmp_path, *opts) -> float:
    out = tmp_path / "n.json"
    assert main(["nccl-tests", "all_reduce", "-b", "256M", "-e", "256M", "-g", "8", *opts, "--json", str(out)]) == 0
    capsys.readouterr()
    return json.loads(out.read_text())[0]["busbw_GBps"]


def test_nccl_tests_takes_the_topology_keys_and_a_scenario(tmp_path, capsys):
    under_one_leaf = nccl_busbw(capsys, tmp_path, "--nodes", "4", "--fabric", "fat_tree", "--oversubscription", "4")
    through_spines = nccl_busbw(capsys, tmp_path, "--nodes", "4", "--fabric", "fat_tree", "--oversubscription", "4",
                                "--nodes-per-leaf", "1")
    assert through_spines < 0.5 * under_one_leaf  # 4:1 uplinks now on the path
    from_scenario = nccl_busbw(capsys, tmp_path, "--scenario", "default")  # 4 DGX A100, rail-optimised
    assert from_scenario == nccl_busbw(capsys, tmp_path, "--nodes", "4")
    assert nccl_busbw(capsys, tmp_path, "--scenario", "default", "--nic", "ConnectX-5-EDR") < from_scenario


def test_gemm_and_other_compute_colours_differ_in_hue():
    from plots.gantt import category_style

    def hue(label_colour):
        c = label_colour[1].lstrip("#")
        return colorsys.rgb_to_hsv(*(int(c[i:i + 2], 16) / 255 for i in (0, 2, 4)))[0]

    for phase in ("fwd", "bwd"):
        a, b = hue(category_style("gemm", phase)), hue(category_style("softmax", phase))
        assert min(abs(a - b), 1 - abs(a - b)) > 0.2  # before: 0.08 (blue vs teal)


def test_power_what_if_that_moves_no_clock_is_named():
    """A higher rated power, or a limit equal to it, leaves the clock at the rated one (hwmodel/power.py);
    a limit below it lowers the clock and is no no-op."""
    notes, _ = notes_for('system.name="dgx-h100"', "system.gpu_overrides.tdp_W=900")
    assert len(notes) == 1 and "tdp_W/power_limit_W: changes nothing" in notes[0] and "100 %" in notes[0]
    assert notes_for('system.name="dgx-h100"', "system.gpu_overrides.power_limit_W=700")[0] != []
    assert notes_for('system.name="dgx-h100"', "system.gpu_overrides.power_limit_W=500")[0] == []


def test_parallel_line_names_the_framework_knobs():
    """async TP, compile, FSDP, DeepSpeed and the FP8 recipe change the program: the Parallel line says so;
    a plain Megatron run adds nothing."""
    from scenarios.report import _stack_extras
    from workload.parallel.config import ParallelConfig

    plain = ParallelConfig(global_batch_size=8)
    assert _stack_extras(plain, {"dtype": "bf16"}) == []
    titan = ParallelConfig(global_batch_size=8, tensor_model_parallel_size=2, sequence_parallel=True,
                           fsdp=True, async_tp=True)
    assert _stack_extras(titan, {"compile": True}) == ["FSDP (PyTorch)", "async TP", "torch.compile"]
    assert _stack_extras(plain, {"dtype": "fp8", "fp8_recipe": "rowwise"}) == ["FP8 recipe rowwise"]


def test_memory_lines_name_the_fp16_optimizer_step_copies():
    """fp16's optimizer-step fp32 gradient copies sit in the summary, not only in the verdict (bf16: absent)."""
    from scenarios.report import _memory_lines

    mem = {"parameters_bytes": 3.3e9, "gradients_bytes": 3.3e9, "optimizer_states_bytes": 19.8e9,
           "activations_bytes": 0.7e9, "workspace_bytes": 0.0, "hbm_datasheet_bytes": 80e9, "verdict": "fits"}
    assert not any("optimizer step" in line for line in _memory_lines(mem, False))
    lines = _memory_lines({**mem, "optimizer_step_grads_bytes": 6.6e9}, False)
    assert lines[2] == ("  at the optimizer step (no activations): + fp32 gradient copies 6.6 GB; the peak is the "
                        "larger of the two moments")


def test_a_faster_nvlink_link_alone_names_nccls_per_link_figure():
    """NCCL's tuner takes its per-link NVLink figure from its own table (src/graph/topo.h), not the
    hardware's, and the collective's rate is bounded by it: a faster link alone barely moves a TP run, so
    the note says which figure to scale; scaling both (or nvlink_links) gives no note."""
    notes, _ = notes_for("system.gpu_overrides.nvlink_bandwidth_per_link_GBps=50")
    assert len(notes) == 1 and "nccl_nvlink_bandwidth_per_link_GBps = 20 " in notes[0]
    assert notes_for("system.gpu_overrides.nvlink_bandwidth_per_link_GBps=50",
                     "system.gpu_overrides.nccl_nvlink_bandwidth_per_link_GBps=40")[0] == []


def test_nccl_tests_takes_the_qps_per_connection_of_its_scenario_or_its_flag(tmp_path, capsys):
    """4 DGX H100, one per leaf, 4 spines: with 16 QPs per connection a NIC pair's ring traffic is hashed as
    more sub-flows, fewer collide on a spine, and busbw rises; the flag overrides the scenario's key."""
    sc = tmp_path / "nt.toml"
    sc.write_text('[system]\nname = "dgx-h100"\nnodes = 4\nfabric = "fat_tree"\nnodes_per_leaf = 1\nspines = 4\n'
                  '[simulation]\nnccl_ib_qps_per_connection = 16\n')
    many = nccl_busbw(capsys, tmp_path, "--scenario", str(sc))
    one = nccl_busbw(capsys, tmp_path, "--scenario", str(sc), "--ib-qps-per-connection", "1")
    assert many > 1.2 * one  # (256 MiB: 247 vs 193 GB/s)
    assert main(["nccl-tests", "all_reduce", "--ib-qps-per-connection", "0"]) == 2
    assert "nccl_ib_qps_per_connection = 0" in capsys.readouterr().err
