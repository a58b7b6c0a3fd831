"""A search resumed from its ``--cache`` re-simulates nothing: the top K's runs, the re-pricing tier's
sampled layers, the pipelines' step-1 passes and their data-parallel probes are all read back
(:mod:`scenarios.search.refine`, :mod:`scenarios.search.simulate`), and the ranking is the first search's."""

import json

from hwmodel.runtime import Runtime
from scenarios.scenario import parse_scenario
from scenarios.search.driver import run_search
from scenarios.search.simulate import load_cache

SMALL = {
    "name": "resume", "system": {"name": "dgx-h100", "nodes": 1},
    "model": {"name": "llama3-8b", "num_layers": 2},
    "parallel": {"tensor_model_parallel_size": 2},
    "training": {"global_batch_size": 8, "micro_batch_size": 1, "seq_length": 512},
}
FIX = ["parallel.context_parallel_size=1", "parallel.virtual_pipeline_model_parallel_size=1",
       "parallel.recompute_granularity=none", "training.micro_batch_size=1", "parallel.sequence_parallel=false",
       "parallel.rank_order=tp-cp-ep-dp-pp", "parallel.tp_comm_overlap=false", "parallel.async_tp=false",
       "parallel.zero_stage=1", "parallel.overlap_param_gather=false", "parallel.overlap_grad_reduce=true"]
SPACE = ["parallel.tensor_model_parallel_size=2,4", "parallel.pipeline_model_parallel_size=1,2"]


def _ranking(res):
    return ([(e.candidate, e.iteration_time_s, e.priced) for e in res.estimates],
            {c: r.get("iteration_time_s") for c, r in res.simulated.items()})


def test_a_resumed_search_simulates_nothing_and_ranks_alike(tmp_path, monkeypatch):
    cache = tmp_path / "c.jsonl"
    runs: list[int] = []
    real_run = Runtime.run
    monkeypatch.setattr(Runtime, "run", lambda self, *a, **k: runs.append(1) or real_run(self, *a, **k))
    first = run_search(parse_scenario(SMALL), fix=FIX, space=SPACE, top_k=2, cache=cache)
    kinds = {rec.get("kind") for rec in map(json.loads, cache.read_text().splitlines())}
    assert {"step1", "dp_probe"} <= kinds  # a pipeline plan was re-priced by its passes and probes
    assert len(runs) >= len(load_cache(cache)) > 0  # every run the cache keeps was simulated once
    runs.clear()
    again = run_search(parse_scenario(SMALL), fix=FIX, space=SPACE, top_k=2, cache=cache)
    assert runs == [] and again.info["refine_runs"] == 0
    assert _ranking(again) == _ranking(first)
