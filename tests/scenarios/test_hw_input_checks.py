"""Hardware input a newcomer tripped on: a rated power out of range blamed on the power limit, a GPU file
under a shipped GPU's name, an architecture without FP8 running fp8, count fields offered a unit prefix, a
lower-case architecture without a suggestion. Each test reproduces the report and failed before."""

from __future__ import annotations

import pytest

from scenarios.cli import main

RUN = ["run", "--set", "model.num_layers=2", "--set", "training.global_batch_size=4"]


def one_line_error(capsys, argv) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_rated_power_is_range_checked_before_the_power_limit_reads_it(capsys):
    """Before: ``tdp_W = 700000`` ran; with ``power_limit_W = 400`` the error named power_limit_W."""
    expected = ("trainsim run: error: [system] gpu_overrides: tdp_W = 700000: watts; plausible range 10 .. 10000 "
                "(about 10x beyond the shipped GPUs' 300 W (V100) .. 1200 W (GB200); outside is a unit mistake or "
                "a typo); did you mean 700?\n")
    assert one_line_error(capsys, [*RUN, "--set", "system.gpu_overrides.tdp_W=700000"]) == expected
    assert one_line_error(capsys, [*RUN, "--set", "system.gpu_overrides.tdp_W=700000",
                                   "--set", "system.gpu_overrides.power_limit_W=400"]) == expected


def test_rated_power_in_a_gpu_file_is_checked_too(tmp_path, capsys):
    gpu = tmp_path / "gpu.toml"
    gpu.write_text('base = "H100"\nname = "H100-hot"\ntdp_W = 0.7\npower_limit_W = 0.5\n')
    err = one_line_error(capsys, [*RUN, "--set", f'system.gpu_file="{gpu}"'])
    assert "GPU file gpu.toml: tdp_W = 0.7: watts; plausible range 10 .. 10000" in err
    assert err.rstrip().endswith("did you mean 0.7e3?")


def test_a_count_is_not_offered_a_unit_prefix(capsys):
    """Before: ``sm_count = 1`` ended with "did you mean 1e3?" (a count has no unit to mistake)."""
    err = one_line_error(capsys, [*RUN, "--set", "system.gpu_overrides.sm_count=1"])
    assert err == ("trainsim run: error: [system] gpu_overrides: sm_count = 1: streaming multiprocessors; "
                   "plausible range 8 .. 2048 (about 10x beyond the shipped GPUs' 80 (V100) .. 148 (B200); "
                   "outside is a unit mistake or a typo)\n")
    # a measure still gets its hint
    assert "did you mean 2000e9?" in one_line_error(
        capsys, [*RUN, "--set", "system.gpu_overrides.hbm_bandwidth_Bps=2000"])


def test_an_architecture_in_the_wrong_case_is_suggested(capsys):
    err = one_line_error(capsys, [*RUN, "--set", 'system.gpu_overrides.architecture="hopper"'])
    assert "architecture: unknown 'hopper' (did you mean 'Hopper'? the name is case-sensitive); allowed: " \
           "Ampere, Blackwell, Hopper, Volta;" in err
    err = one_line_error(capsys, [*RUN, "--set", 'system.gpu_overrides.architecture="Rubin"'])
    assert "unknown 'Rubin'; allowed:" in err  # no suggestion without a match


def test_a_gpu_file_may_not_take_a_shipped_gpus_name_with_other_figures(tmp_path, capsys):
    """Before: an A100 file named "H100-SXM5" reported H100-SXM5 at A100 speed."""
    gpu = tmp_path / "gpu.toml"
    gpu.write_text('base = "A100"\nname = "H100-SXM5"\n')
    err = one_line_error(capsys, [*RUN, "--set", f'system.gpu_file="{gpu}"'])
    assert err == ("trainsim run: error: [system] gpu_file: GPU file gpu.toml: name 'H100-SXM5' is the shipped "
                   "GPU 'H100-SXM5', with other figures (architecture, compute_capability, sm_count, "
                   "boost_clock_hz, ...); rename it (e.g. name = \"H100-SXM5-whatif\") or set [system] gpu = "
                   "\"H100-SXM5\" with gpu_overrides\n")
    gpu.write_text('base = "H100-SXM5"\nname = "h100"\nhbm_bandwidth_GBps = 4000\n')  # an alias, one field
    err = one_line_error(capsys, [*RUN, "--set", f'system.gpu_file="{gpu}"'])
    assert "name 'h100' is the shipped GPU 'H100-SXM5', with other figures (hbm_bandwidth_Bps); rename it" in err


def test_a_gpu_file_with_a_shipped_gpus_own_figures_runs(tmp_path, capsys):
    gpu = tmp_path / "gpu.toml"
    gpu.write_text('base = "H100-SXM5"\nname = "H100-SXM5"\n')
    assert main([*RUN, "--set", f'system.gpu_file="{gpu}"', "--set", 'system.name="dgx-h100"']) == 0
    assert "H100-SXM5" in capsys.readouterr().out


def test_fp8_on_an_architecture_without_fp8_tensor_cores_is_refused(capsys):
    """Before: an H100 overridden to ``architecture = "Ampere"`` trained in fp8 (exit 0); now it is refused
    as bf16 on a V100 is, and the same GPU without the override runs fp8."""
    arch = ["--set", 'system.gpu="H100-SXM5"', "--set", 'system.gpu_overrides.architecture="Ampere"']
    err = one_line_error(capsys, [*RUN, *arch, "--set", 'training.dtype="fp8"'])
    # (the list goes on with what-if GPUs other tests registered)
    assert err.startswith("trainsim run: error: [training] dtype 'fp8' needs FP8 tensor cores (H100-SXM5, H200-SXM, "
                          "B200-HGX, H100-SXM5-96GB-500W, B200-GB200")
    assert err.endswith("); H100-SXM5 as architecture 'Ampere' (no shipped Ampere GPU lists fp8) has none; allowed on "
                        "it: bf16, fp16, fp32\n")
    assert main([*RUN, *arch]) == 0  # bf16: Ampere has it
    capsys.readouterr()


def test_the_dtype_check_reads_the_architecture_in_the_library():
    from hwmodel.dtypes import check_gpu_has
    from hwmodel.specs import get_gpu, with_overrides

    h100 = get_gpu("H100-SXM5")
    check_gpu_has("fp8", h100)
    with pytest.raises(ValueError, match=r"BF16 tensor cores .*as architecture 'Volta' .*allowed on it: fp16, fp32$"):
        check_gpu_has("bf16", with_overrides(h100, architecture="Volta"))



# -- fabric keys: one line named as [system] keys, and spine keys that change nothing or split unevenly ----

def notes_for(*overrides: str) -> list[str]:
    from scenarios.notes import what_if_notes
    from scenarios.runner import prepare
    from scenarios.scenario import load_scenario

    prep = prepare(load_scenario(None, ["model.num_layers=2", "training.global_batch_size=16", *overrides]))
    return what_if_notes(prep.scenario.system, prep.topology, simulation=prep.scenario.simulation)


def test_fabric_errors_are_named_as_system_keys(capsys):
    """Before: ``system.spines = 9: ...`` beside ``[system] spines must be >= 1``; now one style."""
    h100 = ["--set", 'system.name="dgx-h100"', "--set", 'system.fabric="fat_tree"', "--set", "system.nodes_per_leaf=1"]
    err = one_line_error(capsys, [*RUN, *h100, "--set", "system.spines=9"])
    assert err == ("trainsim run: error: [system] spines = 9: a leaf has 8 uplink port(s) here (its downlinks / "
                   "oversubscription), one per spine at least; allowed 1..8\n")
    err = one_line_error(capsys, ["run", *h100, "--set", "system.nodes=64", "--set", "system.spines=1",
                                  "--set", "model.num_layers=2", "--set", "training.global_batch_size=64"])
    assert err.startswith("trainsim run: error: [system] spines = 1: the nodes present use 512 leaf uplinks ")
    err = one_line_error(capsys, [*RUN, *h100[:4], "--set", "system.nodes_per_leaf=9"])
    assert err.startswith("trainsim run: error: [system] nodes_per_leaf = 9: 72 downlinks")
    err = one_line_error(capsys, [*RUN, "--set", "system.core_oversubscription=2"])
    assert err == "trainsim run: error: [system] core_oversubscription needs leaves_per_pod (a core layer above " \
                  "pods of leaves)\n"


ONE = ("system.nodes=1", "parallel.pipeline_model_parallel_size=1")
NO_INTER_NODE = "changes nothing here: one node, no inter-node traffic (its GPUs talk over NVLink)"


def test_spine_keys_on_one_node_say_they_change_nothing():
    """Before: only ``sweep`` said so; ``run`` was silent."""
    assert notes_for(*ONE, "system.spines=1", "simulation.nccl_ib_qps_per_connection=4") == [
        f"[system] spines = 1 {NO_INTER_NODE}", f"[simulation] nccl_ib_qps_per_connection = 4 {NO_INTER_NODE}"]
    assert notes_for(*ONE, "simulation.nccl_ib_qps_per_connection=1") == []  # NCCL's default


def test_spine_keys_in_one_scalable_unit_or_under_one_leaf_say_so():
    one_su = notes_for("system.nodes=4", "system.spines=2")
    assert one_su == ["[system] spines = 2 changes (almost) nothing here: all 4 nodes are in one scalable unit "
                      "(su_size = 20), so rail-aligned traffic stays under the leaves and only traffic between rails "
                      "crosses a spine; set [system] su_size below 4 to cross the spines"]
    one_leaf = notes_for("system.nodes=2", 'system.fabric="fat_tree"', "simulation.nccl_ib_qps_per_connection=2")
    assert one_leaf == ["[simulation] nccl_ib_qps_per_connection = 2 changes nothing here: all 2 nodes sit under one "
                        "leaf switch, no traffic crosses a spine; set [system] nodes_per_leaf below 2"]
    one_spine = notes_for("system.nodes=2", 'system.fabric="fat_tree"', "system.nodes_per_leaf=1", "system.spines=1",
                          "simulation.nccl_ib_qps_per_connection=2")
    assert one_spine == ["[simulation] nccl_ib_qps_per_connection = 2 changes nothing here: with one spine every "
                         "sub-flow of a connection takes the same path"]


def test_spine_keys_where_traffic_crosses_the_spines_say_nothing():
    assert notes_for("system.nodes=2", 'system.fabric="fat_tree"', "system.nodes_per_leaf=1", "system.spines=4",
                     "simulation.nccl_ib_qps_per_connection=4") == []


def test_spines_that_do_not_divide_a_leafs_uplinks_are_named():
    """Before: ``spines = 3`` over 8 uplinks ran silently; a leaf's cables cannot split 8 over 3 evenly."""
    tree = ['system.name="dgx-h100"', "system.nodes=2", 'system.fabric="fat_tree"', "system.nodes_per_leaf=1"]
    assert notes_for(*tree, "system.spines=3") == [
        "[system] spines = 3 does not divide a leaf's 8 uplinks: the model gives each leaf-spine link 8/3 = 2.67 "
        "uplinks' capacity, as if a cable could be split; a real leaf cables 3 to 2 spine(s) and 2 to the other 1, "
        "whose links fill first under ECMP's equal shares, so this reads fast; spines that cable evenly here: "
        "1, 2, 4, 8"]
    assert notes_for(*tree, "system.spines=4") == []


def test_the_tp_span_note_suggests_only_tp_sizes_the_model_takes():
    """Before: TP 4 on 6-GPU servers suggested 2, 3, 6; GPT-3 175B's vocabulary (51,200) refuses 3 and 6."""
    from scenarios.notes import tp_span_notes
    from workload.parallel.config import ParallelConfig
    from workload.zoo import get_model_config

    cfg = ParallelConfig(tensor_model_parallel_size=4, data_parallel_size=3)
    model = get_model_config("gpt3-175b")
    assert "a TP size that divides gpus_per_node (2), with tp first" in tp_span_notes(cfg, 6, model)[0]
    assert "gpus_per_node (2, 3, 6), with" in tp_span_notes(cfg, 6)[0]  # without the model: the divisors
    for tp in (3, 6):
        with pytest.raises(ValueError, match=f"tensor_model_parallel_size={tp} does not divide vocab_size=51200"):
            ParallelConfig(tensor_model_parallel_size=tp).validate_model(model)
