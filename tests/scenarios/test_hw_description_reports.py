"""What a newcomer describing their own hardware met: a GPU file checked less than ``gpu_overrides``, an
input error reported as OOM, a TP group across servers without a word, fabric keys ignored silently, and a
ring-attention message sized with the query heads. Each test reproduces the report and failed before."""

from __future__ import annotations

from pathlib import Path

import pytest

from scenarios.cli import main


def one_line_error(capsys, argv) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


SCENARIO = '[system]\nname = "dgx-h100"\nnodes = 1\ngpu_file = "gpu.toml"\n[model]\nname = "gpt3-175b"\n' \
           'num_layers = 2\n[parallel]\ntensor_model_parallel_size = 8\n[training]\nglobal_batch_size = 2\n'

FULL_GPU = {"name": '"MyGPU"', "architecture": '"Hopper"', "compute_capability": '"9.0"', "sm_count": "132",
            "boost_clock_MHz": "1980", "tensor_TFLOPS": "{ bf16 = 989.4, fp16 = 989.4 }", "fp32_TFLOPS": "66.9",
            "hbm_capacity_GB": "80", "hbm_bandwidth_GBps": "3350", "l2_MiB": "50", "nvlink_generation": "4",
            "nvlink_links": "18", "nvlink_bandwidth_per_link_GBps": "25",
            "nccl_nvlink_bandwidth_per_link_GBps": "20.6", "pcie_generation": "5", "pcie_bandwidth_GBps": "64",
            "copy_engines": "3"}


def gpu_file_error(tmp_path, capsys, gpu_text: str) -> str:
    write(tmp_path, "gpu.toml", gpu_text)
    return one_line_error(capsys, ["run", str(write(tmp_path, "s.toml", SCENARIO))])


def full_gpu(**changes: str | None) -> str:
    keys = {**FULL_GPU, **changes}
    return "".join(f"{k} = {v}\n" for k, v in keys.items() if v is not None)


# -- gpu_file: the checks of gpu_overrides ---------------------------------------------------------------

def test_gpu_file_unit_mistake_is_refused_in_the_unit_written(tmp_path, capsys):
    """Before: 3.35e12 GB/s (3.35e21 B/s) ran, with HBM time zero, without a word."""
    err = gpu_file_error(tmp_path, capsys, 'base = "H100"\nname = "H100-typo"\nhbm_bandwidth_GBps = 3.35e12\n')
    assert "[system] gpu_file: GPU file gpu.toml: hbm_bandwidth_GBps = 3.35e+12, i.e. 3.35e+21 bytes per " \
           "second; plausible range 1e+11 .. 1e+14 (about 10x beyond the shipped GPUs' 0.9 TB/s (V100) .. " \
           "8 TB/s (B200)" in err
    assert err.rstrip().endswith("did you mean 3350?")


def test_gpu_file_defining_every_field_is_range_checked_too(tmp_path, capsys):
    err = gpu_file_error(tmp_path, capsys, full_gpu(sm_count="132000"))
    assert "GPU file gpu.toml: sm_count = 132000: streaming multiprocessors; plausible range 8 .. 2048" in err


def test_gpu_file_unknown_architecture_lists_the_allowed(tmp_path, capsys):
    """Before: ``trainsim run: error: Rubin`` (a KeyError of a per-architecture table, at the memory step)."""
    err = gpu_file_error(tmp_path, capsys, 'base = "B200"\nname = "R100"\narchitecture = "Rubin"\n')
    assert "GPU file gpu.toml: architecture: unknown 'Rubin'; allowed: Ampere, Blackwell, Hopper, Volta; " \
           "the per-architecture tables" in err
    err = gpu_file_error(tmp_path, capsys, full_gpu(architecture='"Rubin"'))
    assert "architecture: unknown 'Rubin'; allowed: Ampere, Blackwell, Hopper, Volta" in err


def test_gpu_file_missing_nccl_figure_says_what_it_is(tmp_path, capsys):
    """Before: ``missing keys ['nccl_nvlink_bandwidth_per_link_GBps']`` and nothing on what to give."""
    err = gpu_file_error(tmp_path, capsys, full_gpu(nccl_nvlink_bandwidth_per_link_GBps=None))
    assert "missing keys ['nccl_nvlink_bandwidth_per_link_GBps'] (nccl_nvlink_bandwidth_per_link_GBps: NCCL's " \
           "own per-link NVLink figure, nccl src/graph/topo.h SMxx_NVLINK_BW: 20.0 Volta/Ampere, 20.6 Hopper, " \
           "40.1 Blackwell); or give base = \"<a known GPU>\" and only the keys that differ" in err


def test_a_plausible_full_gpu_file_runs(tmp_path, capsys):
    write(tmp_path, "gpu.toml", full_gpu())
    assert main(["run", str(write(tmp_path, "s.toml", SCENARIO))]) == 0
    assert "MyGPU" in capsys.readouterr().out


def test_cluster_file_gpu_file_gets_the_same_checks(tmp_path):
    from hwmodel.systems import load_cluster_file

    write(tmp_path, "gpu.toml", 'base = "A100"\nname = "A100-typo"\nnvlink_bandwidth_per_link_GBps = 25e9\n')
    cluster = write(tmp_path, "c.toml", 'system = "dgx-a100"\nnum_nodes = 1\ngpu_file = "gpu.toml"\n')
    with pytest.raises(ValueError, match=r"GPU file gpu.toml: nvlink_bandwidth_per_link_GBps = 2.5e\+10, i.e. "
                                         r"2.5e\+19 bytes per second; .* did you mean 25\?"):
        load_cluster_file(cluster)


# -- an input error before the memory verdict -------------------------------------------------------------

def test_bf16_on_a_v100_is_an_input_error_before_the_memory_verdict(capsys):
    """Before: exit 3, ``OOM: ... needs 2.1 TB > 34.0 GB usable HBM``, though a V100 cannot run bf16 at all."""
    big = ["--set", "training.micro_batch_size=4096", "--set", "training.global_batch_size=65536"]
    err = one_line_error(capsys, ["run", "bert-large-dp", "--set", 'system.name="dgx-2-v100"',
                                  "--set", 'training.dtype="bf16"', *big])
    assert "[training] dtype 'bf16' needs BF16 tensor cores (A100-SXM4-40GB, A100-SXM4-80GB, H100-SXM5" in err
    assert err.rstrip().endswith("V100-SXM2 has none; allowed on it: fp16, fp32")
    assert main(["run", "bert-large-dp", "--set", 'system.name="dgx-2-v100"', "--set", 'training.dtype="fp16"',
                 *big]) == 3  # the same run in a dtype the V100 has: the memory verdict, as before
    capsys.readouterr()


def test_fp8_on_an_a100_still_names_the_fp8_gpus(capsys):
    err = one_line_error(capsys, ["run", "--set", 'training.dtype="fp8"'])
    assert "[training] dtype 'fp8' needs FP8 tensor cores (H100-SXM5, H200-SXM, B200-HGX" in err
    assert err.rstrip().endswith("A100-SXM4-80GB has none; allowed on it: bf16, fp16, fp32")


# -- a TP group across servers: a warning, not a refusal ---------------------------------------------------

def test_tp_group_across_servers_is_named_in_the_warnings(capsys):
    """Before: TP 4 on 6-GPU servers ran with a TP group over the NIC and no word in the report."""
    argv = ["run", "--set", 'system.name="dgx-h100"', "--set", "system.nodes=2", "--set", "system.gpus_per_node=6",
            "--set", "parallel.tensor_model_parallel_size=4", "--set", "parallel.pipeline_model_parallel_size=1",
            "--set", "model.num_layers=2", "--set", "training.global_batch_size=6"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    # ranks 0-5 on server 0, 6-11 on server 1: TP groups {0-3}, {4-7}, {8-11}; the middle one spans both
    assert "[parallel] tensor_model_parallel_size = 4 on 6-GPU servers: 1 of 3 TP groups span servers (e.g. " \
           "ranks 4..7 on servers 0..1)" in out.split("\nWarnings\n")[1]


@pytest.mark.parametrize("tp, dp, gpus_per_node, order, spanning", [
    (8, 1, 4, "tp-cp-ep-dp-pp", 1),    # TP 8 on 4-GPU servers: the one group spans two
    (4, 3, 6, "tp-cp-ep-dp-pp", 1),    # the newcomer's case
    (4, 6, 6, "tp-cp-ep-dp-pp", 2),    # 24 ranks on 4 servers: groups 4-7 and 16-19 span, 8-11 and 12-15 not
    (2, 6, 6, "tp-cp-ep-dp-pp", 0),    # 2 divides 6
    (2, 4, 4, "dp-tp-cp-ep-pp", 4),    # tp after dp: TP neighbours 4 ranks apart, each pair on two servers
])
def test_tp_span_count_is_closed_form(tp, dp, gpus_per_node, order, spanning):
    from scenarios.notes import tp_span_notes
    from workload.parallel.config import ParallelConfig

    cfg = ParallelConfig(tensor_model_parallel_size=tp, data_parallel_size=dp, rank_order=order)
    notes = tp_span_notes(cfg, gpus_per_node)
    if spanning == 0:
        assert notes == []
    else:
        assert len(notes) == 1 and f": {spanning} of {tp * dp // tp} TP groups span servers" in notes[0]


# -- fabric keys: refused where the switch cannot cable them, named where they change nothing ---------------

def fabric_notes(*overrides: str) -> list[str]:
    from scenarios.notes import what_if_notes
    from scenarios.runner import prepare
    from scenarios.scenario import load_scenario

    prep = prepare(load_scenario(None, ["model.num_layers=2", "training.global_batch_size=16",
                                        'system.name="dgx-h100"', "system.nodes=2", *overrides]))
    return what_if_notes(prep.scenario.system, prep.topology)


def test_nodes_per_leaf_on_a_rail_fabric_is_named():
    """Before: ``nodes_per_leaf = 2`` on the default rail-optimised fabric changed nothing, without a word."""
    (note,) = fabric_notes("system.nodes_per_leaf=2")
    assert note.startswith('[system] nodes_per_leaf = 2 changes nothing on fabric = "rail_optimized": NIC r of '
                           "every node of a scalable unit goes to that unit's rail-r leaf")
    (note,) = fabric_notes('system.fabric="fat_tree"', "system.su_size=1")
    assert note.startswith('[system] su_size = 1 changes nothing on fabric = "fat_tree"')
    assert fabric_notes('system.fabric="fat_tree"', "system.nodes_per_leaf=1") == []


def test_pods_within_one_scalable_unit_are_named_with_what_would_make_two():
    (note,) = fabric_notes("system.leaves_per_pod=16", "system.core_oversubscription=2")
    assert note.startswith("leaves_per_pod = 16 covers all 8 leaf switch(es): one pod, no core tier, so "
                           "core_oversubscription = 2 has no effect; the nodes fill one scalable unit (8 rail leaves)")
    # one leaf: "below 1" was the advice before
    (note,) = fabric_notes('system.fabric="fat_tree"', "system.leaves_per_pod=4")
    assert "covers all 1 leaf switch(es)" in note and "below 1" not in note and "nodes_per_leaf" in note


def test_nodes_per_leaf_beyond_the_leaf_radix_is_refused(capsys):
    """Before: 16 DGX H100 (128 NICs) under one 64-port QM9700 leaf was built as asked."""
    err = one_line_error(capsys, ["run", "--set", 'system.name="dgx-h100"', "--set", 'system.fabric="fat_tree"',
                                  "--set", "system.nodes_per_leaf=16"])
    # k:1 with k = 1: n x 8 downlinks + n x 8 uplinks <= 64 ports -> n <= 4
    assert "nodes_per_leaf = 16: 128 downlinks (8 NICs a node) + 128 uplinks (oversubscription 1:1) need more " \
           "than a QM9700 leaf's 64 ports; allowed 1..4" in err
    err = one_line_error(capsys, ["run", "--set", 'system.name="dgx-h100"', "--set", 'system.fabric="fat_tree"',
                                  "--set", "system.oversubscription=3", "--set", "system.nodes_per_leaf=7"])
    assert "allowed 1..6" in err  # 6 x 8 = 48 down + 16 up = 64 ports; 7 nodes: 56 + 19 > 64


def test_most_nodes_per_leaf_is_the_port_count_in_closed_form():
    from hwmodel.fabric import _most_nodes_per_leaf

    assert _most_nodes_per_leaf(8, 1.0, 64) == 4      # 32 down + 32 up
    assert _most_nodes_per_leaf(8, 7.0, 64) == 7      # 56 down + 8 up
    assert _most_nodes_per_leaf(1, 1.0, 40) == 20     # QM8700: 20 + 20
    assert _most_nodes_per_leaf(72, 1.0, 64) == 1     # an NVL72 rack under one leaf, as built


def test_partial_scalable_unit_pods_on_a_rail_fabric_are_refused(capsys):
    """Before: ``leaves_per_pod = 3`` on the rail-optimised fabric put one SU's rails under three pods."""
    err = one_line_error(capsys, ["run", "--set", 'system.name="dgx-h100"', "--set", "system.leaves_per_pod=3"])
    assert "leaves_per_pod = 3 on fabric 'rail_optimized': a pod holds whole scalable units of 8 rail leaves" in err
    assert "allowed: multiples of 8 (8, 16, ...)" in err


# -- ring attention under GQA: K/V blocks of the K/V heads -------------------------------------------------

@pytest.mark.parametrize("separate, kv_heads_per_rank", [(False, 4), (True, 16)])
def test_ring_attention_block_is_sized_with_the_kv_heads(separate, kv_heads_per_rank):
    """Llama 3 8B (32 query heads, 8 K/V heads) at TP 2, CP 2, micro-batch 2, 8,192 tokens: each CP hop carries
    K and V of the rank's 8 / 2 = 4 K/V heads, bytes = 2 x seq/cp x kv_heads x head_dim x 2 (bf16) x
    micro-batch (Megatron-Core's AttnFuncWithCPAndKVP2P passes K/V as (s/cp, b, g/tp, d)); backward also
    returns dK/dV: twice that. Before: the 16 query heads, 4x too many bytes. torchtitan's layout copies K/V
    to the query heads (repeat_kv) before SDPA, so its ring passes 16 heads: that one is unchanged."""
    from hwmodel.ir import SendRecv
    from scenarios.runner import prepare
    from scenarios.scenario import load_scenario
    from workload.parallel.builder import build_programs

    prep = prepare(load_scenario(None, [
        'model.name="llama3-8b"', "model.num_layers=1", f"model.separate_projections={str(separate).lower()}",
        'system.name="dgx-h100"', "system.nodes=1", "parallel.tensor_model_parallel_size=2",
        "parallel.context_parallel_size=2", "parallel.pipeline_model_parallel_size=1",
        "training.seq_length=8192", "training.micro_batch_size=2", "training.global_batch_size=4"]))
    assert prep.model_cfg.num_attention_heads == 32 and prep.model_cfg.num_query_groups == 8
    sends = {(t.op.tag, t.op.size_bytes) for t in build_programs(prep.trace, prep.config, ranks=[0]).programs[0].tasks
             if isinstance(t.op, SendRecv) and t.op.name == "cp_kv"}
    hop = 2 * (8192 // 2) * kv_heads_per_rank * 128 * 2 * 2
    assert sends == {("cpfwd", hop), ("cpbwd", 2 * hop)}
