"""The screen ranks plans as the simulation does where a mechanism fixes the order.

Ring attention's steps go in lockstep: each waits for the slowest hop of the ring. On 4 DGX H100
(8 GPUs per node), TP 4 x CP 8 lays each ring over all 4 nodes, so every step waits for a hop over the
NICs (about 50 GB/s against NVLink's 450); TP 8 x CP 4 also crosses nodes, but each hop sends half the
K/V block (TP 8 splits the heads twice as finely), so it is the faster plan. The screen used to price the
ring on its first pair, which sits in one node, and ranked them the other way round. The simulation's
order is checked here too (two small runs), so the test reads the simulator, not a pinned value."""

import pytest

from scenarios.scenario import parse_scenario
from scenarios.search import Candidate, ScreenContext
from scenarios.search.refine import refinable, refine, refined_estimate, step1_profiles
from scenarios.search.simulate import candidate_data, simulate_plan

RING = {
    "name": "cp-ring", "system": {"name": "dgx-h100", "nodes": 4},
    "model": {"name": "llama3-8b", "num_layers": 2},
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


@pytest.mark.parametrize("price", ["analytic", "refined"])
def test_screen_orders_the_rings_as_the_simulation(ring, simulated, price):
    _, ctx = ring
    est = ctx.estimate if price == "analytic" else (lambda c: refined_estimate(ctx, c))
    assert est(CP4).iteration_time_s < est(CP8).iteration_time_s


def test_refined_plan_without_data_parallelism_is_the_simulation(ring, simulated):
    """No data parallelism and no pipeline: an iteration is m micro-batches of the layer passes plus the
    optimizer, and the refined screen takes the passes from the simulator's own step 1 -- so it is the
    simulated time up to launch gaps between passes (0.5 %)."""
    _, ctx = ring
    for c in (CP8, CP4):
        assert refined_estimate(ctx, c).iteration_time_s == pytest.approx(simulated[c], rel=5e-3)


def test_refine_times_each_distinct_pass_once_and_reorders(ring):
    _, ctx = ring
    fit = sorted((ctx.estimate(c) for c in (CP8, CP4, Candidate(tp=4, sp=True, cp=8, dp=1, recompute="selective"))),
                 key=lambda e: e.iteration_time_s)
    out = refine(ctx, fit, n=len(fit))
    assert [e.iteration_time_s for e in out] == sorted(e.iteration_time_s for e in out)
    assert step1_profiles(ctx, CP8) is step1_profiles(ctx, CP8)  # cached by its pass key
    assert not refinable(Candidate(tp=4, cp=8, dp=1, zero=3))
