"""``--max-tasks`` counts a run's mirrored route work beside its tasks (scenarios/budget.py): a DP-only run
on a large fabric has few tasks but a data-parallel ring of thousands of hops per rail, each hop's ECMP
route hashed for every mirrored ring, and the refusal names them before anything is built."""

from scenarios.budget import ROUTE_HOPS_PER_S, TASKS_PER_S, route_hops
from scenarios.cli import main
from workload.parallel.config import ParallelConfig


def _cfg(world, **sizes):
    return ParallelConfig(global_batch_size=world, **sizes).resolve(world)


def test_ring_hops_are_the_world_where_the_ring_leaves_the_server():
    # TP 8 x DP 16,384: 8 rails' rings (one per TP rank) of 16,384 ranks, a hop per rank
    assert route_hops(_cfg(131_072, tensor_model_parallel_size=8), 8) == (131_072, 16_384)
    assert route_hops(_cfg(64, tensor_model_parallel_size=8, pipeline_model_parallel_size=2), 8) == (64, 4)
    assert route_hops(_cfg(8), 8) == (0, 8)  # DP 8 inside one server: NVLink, no fabric routes
    assert route_hops(_cfg(16, tensor_model_parallel_size=8, pipeline_model_parallel_size=2), 8) == (0, 1)


def test_a_dp_only_run_is_refused_for_its_routes_not_its_tasks(capsys):
    """Llama 3 8B with 4 layers, TP 8 x DP 2,048 on 2,048 DGX H100 of a SuperPOD: 280 estimated tasks,
    16,384 ring hops = 10,240 task equivalents (0.625 each at 5,000 tasks/s vs 8,000 hops/s)."""
    assert TASKS_PER_S / ROUTE_HOPS_PER_S == 0.625
    sets = ['system.name="dgx-superpod-h100"', "system.nodes=2048", 'model.name="llama3-8b"', "model.num_layers=4",
            "parallel.tensor_model_parallel_size=8", "parallel.pipeline_model_parallel_size=1",
            "training.global_batch_size=2048", "training.micro_batch_size=1", "training.seq_length=8192"]
    argv = ["run", *[a for s in sets for a in ("--set", s)]]
    assert main([*argv, "--max-tasks", "5000"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("trainsim run: error: this run would simulate about 280 tasks (1 micro-batch, mode symmetric) and "
                   "route about 16,384 mirrored ring hops (data-parallel rings of 2,048 ranks, 8 of them, each hop's "
                   "ECMP route hashed; a hop counted as 0.625 tasks), about 2 s, above --max-tasks 5,000; try fewer "
                   "[system] nodes (the data-parallel rings' routes grow with the GPUs), or raise --max-tasks")
