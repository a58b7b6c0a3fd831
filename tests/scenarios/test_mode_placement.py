"""``auto`` and layouts whose mirrors are not placed alike (scenarios/modes.py): a tensor-parallel group
that fits one server on one rank and straddles two on another makes one simulated rank a poor stand-in
(a newcomer read -10 % for TP 4 on 6-GPU servers in symmetric mode), so ``auto`` simulates every rank
where that is affordable and a symmetric or hierarchical run says it may read fast."""

import pytest

import scenarios.modes as modes
from scenarios.cmd_run import load
from scenarios.modes import placement_asymmetry
from scenarios.report import format_report
from scenarios.runner import run_scenario
from workload.parallel.config import ParallelConfig


def _cfg(world, **sizes):
    return ParallelConfig(**sizes).resolve(world)


@pytest.mark.parametrize(("world", "sizes", "gpus_per_node", "expected"), [
    (24, {"tensor_model_parallel_size": 4, "pipeline_model_parallel_size": 2}, 6,
     "tensor-parallel groups of 4 GPUs on 6-GPU servers"),
    (144, {"tensor_model_parallel_size": 8}, 36, "tensor-parallel groups of 8 GPUs on 36-GPU servers"),
    (144, {"tensor_model_parallel_size": 4}, 36, None),  # 9 whole groups a server
    (24, {"tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 3}, 6,
     "data-parallel blocks of 8 GPUs on 6-GPU servers"),  # a stage's 8 ranks: servers cut stages unevenly
    (24, {"tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 3}, 8, None),
    (24, {"tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 3, "rank_order": "tp-cp-ep-pp-dp"}, 8,
     "pipeline-parallel blocks of 6 GPUs on 8-GPU servers"),
    (32, {"tensor_model_parallel_size": 8, "pipeline_model_parallel_size": 2}, 8, None),
    (64, {"tensor_model_parallel_size": 2, "expert_model_parallel_size": 8}, 8, None),  # EP blocks of 16
    (576, {"tensor_model_parallel_size": 8, "pipeline_model_parallel_size": 8}, 72, None),  # a stage = a rack
])
def test_blocks_that_neither_fill_nor_fit_a_server_are_named(world, sizes, gpus_per_node, expected):
    assert placement_asymmetry(_cfg(world, global_batch_size=world, **sizes), gpus_per_node) == expected


SKEWED = ["system.gpus_per_node=6", "parallel.tensor_model_parallel_size=4", "parallel.pipeline_model_parallel_size=2",
          "training.global_batch_size=12"]


def test_auto_simulates_every_rank_of_a_skewed_layout_and_says_why():
    auto = run_scenario(load(None, SKEWED))
    full = run_scenario(load(None, [*SKEWED, 'simulation.mode="full"']))
    assert auto.mode == "full"
    assert auto.metrics["iteration_time_s"] == full.metrics["iteration_time_s"]
    assert any("mode full (auto's choice): tensor-parallel groups of 4 GPUs" in w for w in auto.metrics["warnings"])
    assert _mode_line(auto).startswith("mode full (auto's choice: 24 GPUs > 16, but mirrors placed unlike their "
                                       "ranks and the full run's ~14,208 tasks <= 1,000,000), 24 rank(s)")
    sym = run_scenario(load(None, [*SKEWED, 'simulation.mode="symmetric"']))
    assert sym.metrics["iteration_time_s"] < 0.95 * full.metrics["iteration_time_s"]  # (why auto does not use it)
    assert any(w.startswith("mode symmetric: tensor-parallel groups") and "can read fast" in w
               for w in sym.metrics["warnings"])


def test_auto_warns_where_the_full_run_is_too_big(monkeypatch):
    monkeypatch.setattr(modes, "SKEWED_FULL_MAX_TASKS", 0)  # (no full run is affordable)
    rep = run_scenario(load(None, SKEWED))
    assert rep.mode in ("symmetric", "hierarchical")
    note = f"mode {rep.mode} (auto's choice): tensor-parallel groups of 4 GPUs"
    assert any(note in w for w in rep.metrics["warnings"])


def test_aligned_layouts_keep_auto_symmetric_and_quiet():
    rep = run_scenario(load(None, []))  # the default scenario: TP 8 on 8-GPU servers
    assert rep.mode == "symmetric" and not any("sit differently" in w for w in rep.metrics.get("warnings", []))


def _mode_line(rep) -> str:
    """The report's ``Simulation  mode ...`` line, from ``mode`` on."""
    return next(ln for ln in format_report(rep).splitlines() if ln.startswith("Simulation  ")).split("  ", 1)[1]


def test_the_mode_line_says_why_auto_picked_by_size(monkeypatch):
    """Each of auto's size-based choices names the figures and the thresholds that decided it: the default
    scenario's 32 GPUs > 16 (one rank per stage), its 2 stage ranks' estimated tasks
    (:func:`scenarios.modes.estimate_tasks`) against the hierarchical threshold, 8 GPUs <= 16."""
    rep = run_scenario(load(None, []))
    assert modes.estimate_tasks(rep.prepared.trace, rep.prepared.config, 2) == 2368
    assert _mode_line(rep).startswith("mode symmetric (auto's choice: 32 GPUs > 16 and 2 representative ranks' "
                                      "~2,368 tasks <= 100,000), 2 rank(s)")
    monkeypatch.setattr(modes, "HIERARCHICAL_THRESHOLD_TASKS", 2000)
    rep = run_scenario(load(None, []))
    assert rep.mode == "hierarchical"
    assert _mode_line(rep).startswith("mode hierarchical (auto's choice: 32 GPUs > 16 and 2 representative ranks' "
                                      "~2,368 tasks > 2,000), 2 rank(s)")
    small = run_scenario(load(None, ["system.nodes=1", "parallel.pipeline_model_parallel_size=1",
                                     "training.global_batch_size=4"]))
    assert _mode_line(small).startswith("mode full (auto's choice: 8 GPUs <= 16), 8 rank(s)")
    asked = run_scenario(load(None, ["system.nodes=1", "parallel.pipeline_model_parallel_size=1",
                                     "training.global_batch_size=4", 'simulation.mode="symmetric"']))
    assert _mode_line(asked).startswith("mode symmetric (set by [simulation] mode), 1 rank(s)")
