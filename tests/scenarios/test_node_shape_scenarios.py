"""``[system] gpus_per_node`` / ``nics_per_node`` through the scenario layer, and the NVL72 catalog entry."""

import itertools

import pytest

from scenarios.catalog import catalog_dir
from scenarios.runner import prepare, run_scenario
from scenarios.scenario import load_scenario, parse_scenario


def _scenario(system, **training):
    return parse_scenario({"system": system,
                           "model": {"name": "llama3-8b", "num_layers": 1, "seq_length": 1024},
                           "parallel": {},
                           "training": {"global_batch_size": 2, "micro_batch_size": 1, "seq_length": 1024,
                                        **training},
                           "simulation": {"host_launch_overhead_s": 0.0}})


def test_single_gpu_runs_with_no_collectives_and_takes_compute_plus_optimizer():
    rep = run_scenario(_scenario({"name": "dgx-h100", "nodes": 1, "gpus_per_node": 1}))
    topo = rep.prepared.topology
    assert topo.num_gpus == 1 and not topo.nodes_of_kind("nvswitch")
    events = rep.result.events
    assert not [e for e in events if e.category.startswith("nccl:") or e.category in ("send", "recv")]
    assert {e.stream for e in events} == {"compute"} and any(e.phase == "opt" for e in events)
    # one stream, no launch overhead: the iteration is the kernels back to back (forward, backward, Adam)
    kernels = sorted(events, key=lambda e: e.start_s)
    assert rep.result.end_time_s == pytest.approx(sum(e.end_s - e.start_s for e in kernels), rel=1e-12)
    assert all(b.start_s == pytest.approx(a.end_s, abs=1e-15) for a, b in itertools.pairwise(kernels))
    assert rep.metrics["breakdown"]["exposed_comm_s"] == 0 and rep.metrics["system"]["gpus"] == 1


@pytest.mark.parametrize("system, match", [
    ({"gpus_per_node": 16}, r"^\[system\] gpus_per_node must be an integer in 1\.\.8 \(a dgx-h100 node holds 8 GPUs"),
    ({"nics_per_node": 3}, r"^\[system\] nics_per_node = 3 does not divide gpus_per_node = 8: .*allowed: 2, 4, 8$"),
    ({"gpus_per_node": 2, "nics_per_node": 4}, r"^\[system\] nics_per_node must be an integer in 0\.\.2 "),
    ({"nodes": 2, "nics_per_node": 0}, r"^\[system\] nics_per_node = 0 leaves 2 nodes without a fabric"),
])
def test_bad_node_shape_keys_are_one_line_errors_naming_the_key(system, match):
    with pytest.raises(ValueError, match=match) as exc:
        prepare(_scenario({"name": "dgx-h100", "nodes": 1, **system}))
    assert "\n" not in str(exc.value)


def test_node_shape_keys_are_type_checked():
    with pytest.raises(ValueError, match=r"^\[system\] gpus_per_node must be int, got '8'$"):
        _scenario({"name": "dgx-h100", "gpus_per_node": "8"})
    with pytest.raises(ValueError, match=r"^\[system\] nics_per_node must be int, got true$"):
        _scenario({"name": "dgx-h100", "nics_per_node": True})


def test_shared_nics_reach_the_topology():
    prep = prepare(_scenario({"name": "dgx-h100", "nodes": 2, "nics_per_node": 4}, global_batch_size=16))
    assert prep.topology.nics_per_node == 4 and prep.config.world_size == 16


def test_nvl72_catalog_scenario_keeps_each_pipeline_in_its_rack():
    prep = prepare(load_scenario(catalog_dir() / "llama31-405b-8x-gb200-nvl72.toml"))
    topo, cfg = prep.topology, prep.config
    assert topo.num_nodes == 8 and topo.gpus_per_node == 72 and cfg.world_size == 576
    assert (cfg.tensor_model_parallel_size, cfg.pipeline_model_parallel_size, cfg.data_parallel_size) == (8, 9, 8)
    # rank order tp-cp-ep-pp-dp: rank = tp + 8 pp + 72 dp, so TP and PP groups stay in one NVLink domain
    assert cfg.rank_order == "tp-cp-ep-pp-dp"
