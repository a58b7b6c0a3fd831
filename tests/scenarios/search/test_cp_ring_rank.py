"""The screen ranks plans as the simulation does where a mechanism fixes the order.

Ring attention's steps go in lockstep: each waits for the slowest hop of the ring. On 4 DGX H100
(8 GPUs per node), TP 4 x CP 8 lays each ring over all 4 nodes, so every step waits for a hop over the
NICs (about 50 GB/s against NVLink's 450); TP 8 x CP 4 also crosses nodes, but each hop sends half the
K/V block (TP 8 splits the heads twice as finely), so it is the faster plan. The screen used to price the
ring on its first pair, which sits in one node, and ranked them the other way round. The simulation's
order is checked here too (two small runs), so the test reads the simulator, not a pinned value.

The model has multi-head attention (``num_query_groups = 32``): ring attention passes K/V of the K/V heads,
so Llama 3's own 8 K/V heads send a block 4x smaller, and the hop's share of a step (and the plans' gap,
2.6 % in the simulation) shrinks with it; the ordering mechanism is the same."""

import pytest

from scenarios.scenario import parse_scenario
from scenarios.search import Candidate, ScreenContext
from scenarios.search.simulate import candidate_data, simulate_plan

RING = {
    "name": "cp-ring", "system": {"name": "dgx-h100", "nodes": 4},
    "model": {"name": "llama3-8b", "num_layers": 2, "num_query_groups": 32},
    "parallel": {"tensor_model_parallel_size": 4, "context_parallel_size": 8, "sequence_parallel": True},
    "training": {"global_batch_size": 4, "micro_batch_size": 1, "seq_length": 32768},
}
CP8 = Candidate(tp=4, sp=True, cp=8, dp=1)
CP4 = Candidate(tp=8, sp=True, cp=4, dp=1)


@pytest.fixture(scope="module")
def ring():
    sc = parse_scenario(RING)
    return sc, ScreenContext(sc)


@pytest.fixture(scope="module")
def simulated(ring):
    sc, _ = ring
    return {c: simulate_plan(candidate_data(sc, c), "")["iteration_time_s"] for c in (CP8, CP4)}


def test_simulation_orders_the_rings_by_their_network_hop(simulated):
    assert simulated[CP4] < 0.9 * simulated[CP8]


def test_screen_orders_the_rings_as_the_simulation(ring, simulated):
    _, ctx = ring
    assert ctx.estimate(CP4).iteration_time_s < ctx.estimate(CP8).iteration_time_s

