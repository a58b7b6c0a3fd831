"""The steady period of deep pipelines: one pipeline's worth of micro-batches is enough.

:func:`scenarios.steady_state.plan_for` picks ``m1 >= max(p, 16)`` micro-batches with 1F1B and ``m2 = m1 + p``;
that ``m1 = p`` already lies on the steady line is what the 1F1B cases were written to check: deep pipelines
(16 to 64 stages), full and selective recomputation, A100 and H100, with and without data-parallel traffic
on the fabric. Only ``m2`` is simulated now: the increment of half a period (1F1B) or a period (the
interleaved schedule, ``m2 = 3p``) is measured inside that run
(:func:`scenarios.steady_state.steady_window`), so the cases check that this one run gives the full run's
iteration, every rank's split and the task count. Each case runs in full (``steady_state = "off"``) and
extrapolated; the iteration time and every rank's compute / exposed communication / bubble / idle seconds
agree within 0.5 % of the iteration (the issue's bound). The hierarchical engine (what ``auto`` picks at
these depths in practice) keeps the full runs to seconds; layer passes are Llama 3 8B's at sequence 1,024.
"""

import pytest

from scenarios.runner import run_scenario
from scenarios.scenario import parse_scenario

TOL = 0.005

DEEP = {  # name: (system, pp, recompute, micro-batches per pipeline, dp, vpp, the counts simulated: m2 alone,
    # the period measured inside it -- half a period with 1F1B, one with the interleaved schedule)
    "pp16-a100-full-dp2-overlap": ("dgx-a100", 16, "full", 80, 2, None, (32,)),
    "pp32-h100-selective": ("dgx-h100", 32, "selective", 160, 1, None, (64,)),
    "pp64-a100-full": ("dgx-a100", 64, "full", 320, 1, None, (128,)),
    "pp16x2-a100-full-dp2-overlap": ("dgx-a100", 16, "full", 112, 2, 2, (48,)),
}


def _run(case: str, steady: str):
    system, pp, recompute, m, dp, vpp, _ = DEEP[case]
    tp = 2
    parallel = {"tensor_model_parallel_size": tp, "pipeline_model_parallel_size": pp,
                "recompute_granularity": recompute, "sequence_parallel": recompute == "selective",
                "overlap_grad_reduce": dp > 1, **({"virtual_pipeline_model_parallel_size": vpp} if vpp else {})}
    data = {"name": case, "system": {"name": system, "nodes": tp * pp * dp // 8},
            "model": {"name": "llama3-8b", "num_layers": pp * (vpp or 1), "vocab_size": 32000},
            "parallel": parallel,
            "training": {"micro_batch_size": 1, "seq_length": 1024, "global_batch_size": m * dp},
            "simulation": {"steady_state": steady, "mode": "hierarchical", "record_links": False}}
    return run_scenario(parse_scenario(data, source=case)).metrics


@pytest.mark.parametrize("case", sorted(DEEP))
def test_one_pipeline_of_microbatches_is_steady(case):
    full, fast = _run(case, "off"), _run(case, "auto")
    assert fast["simulation"]["steady_state"]["simulated_microbatches"] == list(DEEP[case][-1])
    T = full["iteration_time_s"]
    assert fast["iteration_time_s"] == pytest.approx(T, rel=TOL)
    for rank, parts in full["per_rank"].items():
        for key, seconds in parts.items():
            assert abs(fast["per_rank"][rank][key] - seconds) <= TOL * T, (rank, key)
    assert fast["simulation"]["tasks"] == full["simulation"]["tasks"]
