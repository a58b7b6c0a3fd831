"""Context parallelism in symmetric mode: ring attention's send/recv between CP peers (which the search
met as "recv peer N is not a rank") runs, and gives the full simulation's iteration time."""

import pytest

from scenarios.runner import run_scenario
from scenarios.scenario import parse_scenario
from workload.parallel.config import ParallelConfig
from workload.parallel.placement import Layout


def _scenario(mode: str) -> dict:
    return {"name": "cp-symmetric", "system": {"name": "dgx-h100", "nodes": 2},
            "model": {"name": "llama3-8b", "num_layers": 2},
            "parallel": {"tensor_model_parallel_size": 2, "context_parallel_size": 2,
                         "pipeline_model_parallel_size": 2},
            "training": {"global_batch_size": 8, "micro_batch_size": 1, "seq_length": 8192},
            "simulation": {"mode": mode, "record_links": False}}


def test_representatives_keep_cp_peers_and_mirrors_skip_them():
    lay = Layout(ParallelConfig(tensor_model_parallel_size=2, context_parallel_size=2, pipeline_model_parallel_size=2,
                                data_parallel_size=2))
    reps = lay.representatives()
    assert sorted(reps) == sorted(lay.rank(pp=s, cp=c) for s in range(2) for c in range(2))
    tp_group = lay.group(lay.rank(cp=0), "tp")
    # the TP group of the CP peer is simulated itself, so it is not a mirror; mirrors never shift CP (the
    # CP peer's own groups are mirrored from it), so only the DP-shifted group is
    mirrored = lay.mirror(tp_group)
    assert lay.group(lay.rank(cp=1), "tp") not in mirrored
    expected = [tp_group, lay.group(lay.rank(dp=1), "tp")]
    assert sorted(map(sorted, mirrored)) == sorted(map(list, expected))


def test_symmetric_equals_full_under_cp():
    full = run_scenario(parse_scenario(_scenario("full"))).metrics
    sym = run_scenario(parse_scenario(_scenario("symmetric"))).metrics
    assert sym["simulation"]["mode"] == "symmetric"
    assert sym["iteration_time_s"] == pytest.approx(full["iteration_time_s"], rel=1e-6)
