"""Full, symmetric and hierarchical simulation agree on clusters where symmetry is not obvious.

Symmetric mode simulates one rank per pipeline stage and starts every collective and send together with
its mirrors; the hierarchical engine also replaces each layer pass by a macro task. Both must give the
full simulation's iteration time and per-link bytes, within 1 %, on oversubscribed leaves, scalable-unit
boundaries, uneven pipeline stages (also interleaved), a three-tier fabric, an NVLink domain of a rack, TP-overlap rings
(sends and copy-engine peer copies into the representative, once not mirrored), context-parallel rings
(of two, whose reverse send a set-wise dedup of mirrors dropped; of four with PP; across nodes; the
hierarchical engine simulates one rank per stage and mirrors the CP peers) and expert parallelism across nodes
(where mirrors once straddled expert-parallel blocks: 5.79 s symmetric vs 0.717 s full for Qwen3-30B-A3B
EP 16 on 4 nodes). Small models (2-4 layers, short sequences) keep the full runs to seconds.
"""

import pytest

from scenarios.runner import run_scenario
from scenarios.scenario import parse_scenario
from workload.parallel.placement import Layout

SMALL_LLAMA = {"name": "llama3-8b", "num_layers": 4}
TRAIN = {"global_batch_size": 8, "micro_batch_size": 1, "seq_length": 1024}

CASES = {
    "oversubscribed-leaves": {
        "system": {"name": "dgx-h100", "nodes": 4, "fabric": "fat_tree", "nodes_per_leaf": 1, "oversubscription": 4},
        "model": SMALL_LLAMA, "parallel": {"tensor_model_parallel_size": 4, "use_distributed_optimizer": True},
        "training": TRAIN},
    "su-boundary": {
        "system": {"name": "dgx-h100", "nodes": 3, "su_size": 2, "oversubscription": 2},
        "model": SMALL_LLAMA, "parallel": {"tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 2},
        "training": {**TRAIN, "global_batch_size": 24}},
    "uneven-stages": {
        "system": {"name": "dgx-h100", "nodes": 2, "fabric": "fat_tree", "nodes_per_leaf": 1},
        "model": {"name": "llama3-8b", "num_layers": 5},
        "parallel": {"tensor_model_parallel_size": 4, "pipeline_model_parallel_size": 2,
                  "num_layers_in_first_pipeline_stage": 2},
        "training": TRAIN},
    "uneven-interleaved": {  # 4 / 6 layers on 2 stages of 2 chunks: chunks of 2 and 3 layers
        "system": {"name": "dgx-h100", "nodes": 2},
        "model": {"name": "llama3-8b", "num_layers": 10},
        "parallel": {"tensor_model_parallel_size": 4, "pipeline_model_parallel_size": 2,
                     "virtual_pipeline_model_parallel_size": 2, "num_layers_in_first_pipeline_stage": 4,
                     "num_layers_in_last_pipeline_stage": 6},
        "training": TRAIN},
    "three-tier": {
        "system": {"name": "dgx-h100", "nodes": 4, "fabric": "fat_tree", "nodes_per_leaf": 1, "leaves_per_pod": 2,
                "core_oversubscription": 4},
        "model": SMALL_LLAMA, "parallel": {"tensor_model_parallel_size": 8}, "training": TRAIN},
    "nvl72-domain": {
        "system": {"name": "gb200-nvl72", "nodes": 2, "gpus_per_node": 16, "nics_per_node": 8},
        "model": SMALL_LLAMA, "parallel": {"tensor_model_parallel_size": 4, "sequence_parallel": True},
        "training": TRAIN},
    "tp-overlap": {
        "system": {"name": "dgx-h100", "nodes": 2},
        "model": SMALL_LLAMA,
        "parallel": {"tensor_model_parallel_size": 8, "sequence_parallel": True, "tp_comm_overlap": True},
        "training": {**TRAIN, "seq_length": 2048}},
    "tp-overlap-pp-recompute": {
        "system": {"name": "dgx-h100", "nodes": 2},
        "model": SMALL_LLAMA,
        "parallel": {"tensor_model_parallel_size": 8, "sequence_parallel": True, "tp_comm_overlap": True,
                     "pipeline_model_parallel_size": 2, "recompute_granularity": "full"},
        "training": {**TRAIN, "seq_length": 2048}},
    "async-tp-interleaved": {
        "system": {"name": "dgx-h100", "nodes": 2},
        "model": SMALL_LLAMA,
        "parallel": {"tensor_model_parallel_size": 4, "sequence_parallel": True, "async_tp": True,
                     "pipeline_model_parallel_size": 2, "virtual_pipeline_model_parallel_size": 2},
        "training": {**TRAIN, "seq_length": 2048, "compile": True}},
    "async-tp-peer-copies": {
        "system": {"name": "dgx-h100", "nodes": 2},
        "model": SMALL_LLAMA,
        "parallel": {"tensor_model_parallel_size": 8, "sequence_parallel": True, "async_tp": True},
        "training": {**TRAIN, "seq_length": 2048, "compile": True}},
    "cp-ring-of-two": {
        "system": {"name": "dgx-h100", "nodes": 2, "fabric": "fat_tree", "nodes_per_leaf": 1},
        "model": SMALL_LLAMA,
        "parallel": {"tensor_model_parallel_size": 4, "context_parallel_size": 2},
        "training": {**TRAIN, "seq_length": 4096}},
    "cp-ring-of-four-pp": {
        "system": {"name": "dgx-h100", "nodes": 2, "fabric": "fat_tree", "nodes_per_leaf": 1},
        "model": SMALL_LLAMA,
        "parallel": {"tensor_model_parallel_size": 2, "context_parallel_size": 4, "pipeline_model_parallel_size": 2},
        "training": {**TRAIN, "seq_length": 4096}},
    "cp-ring-across-nodes": {
        "system": {"name": "dgx-h100", "nodes": 2, "fabric": "fat_tree", "nodes_per_leaf": 1},
        "model": SMALL_LLAMA,
        "parallel": {"tensor_model_parallel_size": 4, "context_parallel_size": 4, "sequence_parallel": True},
        "training": {"global_batch_size": 4, "micro_batch_size": 1, "seq_length": 8192}},
    "cp-rings-of-8-replicas": {  # each ring across 4 nodes, 8 DP replicas' rings on the fabric at once
        "system": {"name": "dgx-h100", "nodes": 32},
        "model": {"name": "llama3-8b", "num_layers": 2},
        "parallel": {"tensor_model_parallel_size": 4, "context_parallel_size": 8, "sequence_parallel": True},
        "training": {"global_batch_size": 16, "micro_batch_size": 1, "seq_length": 8192}},
    "ep-across-nodes": {
        "system": {"name": "dgx-h100", "nodes": 4},
        "model": {"name": "qwen3-30b-a3b", "num_layers": 2},
        "parallel": {"expert_model_parallel_size": 16, "use_distributed_optimizer": True},
        "training": {"global_batch_size": 32, "micro_batch_size": 1, "seq_length": 1024}},
}


def _report(case: str, mode: str):
    spec = CASES[case]
    data = {"name": case, **{k: dict(v) for k, v in spec.items()}, "simulation": {"mode": mode}}
    return run_scenario(parse_scenario(data, source=case))


def _run(case: str, mode: str):
    """(iteration time, {link: bytes carried} of the links a symmetric run loads exactly: those of the
    representative ranks' GPUs and NICs, and those between fabric switches)."""
    rep = _report(case, mode)
    topo = rep.result.cluster.topology
    kinds = {n: d["kind"] for n, d in topo.graph.nodes(data=True)}
    gpus = topo.gpus()
    own = {gpus[r] for r in Layout(rep.prepared.config).representatives()}
    own |= {topo.graph.nodes[g].get("nic") for g in own}
    carried = {}
    for r in rep.result.cluster.link_resources():
        _, u, v, _ = r.meta
        if r.carried > 0 and (u in own or v in own or kinds[u] == kinds[v] == "ib_switch"):
            carried[r.name] = r.carried
    return rep.metrics["iteration_time_s"], carried


@pytest.fixture(scope="module")
def full_runs():
    return {}


def _full(full_runs, case):
    if case not in full_runs:
        full_runs[case] = _run(case, "full")
    return full_runs[case]


@pytest.mark.parametrize("case", sorted(CASES))
def test_hierarchical_iteration_agrees_with_the_full_simulation(full_runs, case):
    """Macro tasks stand for a layer pass's time, not its traffic: only the iteration is compared. Passes
    that overlap were inexact once: CP rings (-6.4 %, receives posted a pass early) and TP overlap (+1.6 %,
    its pipelines running on into the next pass, now timed as the second of two passes in a row)."""
    rep = _report(case, "hierarchical")
    full_s = _full(full_runs, case)[0]
    cfg = rep.prepared.config
    assert sorted(rep.build.programs) == Layout(cfg).representatives(every_cp=False), case  # one rank per stage
    assert not any("exact" in w for w in rep.metrics.get("warnings", [])), case
    assert rep.metrics["iteration_time_s"] == pytest.approx(full_s, rel=0.01), case


@pytest.mark.parametrize("case", ["cp-ring-of-two", "cp-ring-of-four-pp", "tp-overlap", "async-tp-peer-copies",
                                  "three-tier"])
def test_auto_picks_the_hierarchical_engine_by_size(monkeypatch, case):
    """Sized for the hierarchical engine (thresholds lowered), auto runs it, CP and TP overlap included."""
    import scenarios.modes as modes

    monkeypatch.setattr(modes, "SYMMETRY_THRESHOLD_GPUS", 0)
    monkeypatch.setattr(modes, "HIERARCHICAL_THRESHOLD_TASKS", 0)
    rep = _report(case, "auto")
    assert rep.mode == "hierarchical" and not any("exact" in w for w in rep.metrics.get("warnings", []))


@pytest.mark.parametrize("case", sorted(CASES))
def test_symmetric_iteration_and_link_bytes_agree_with_the_full_simulation(full_runs, case):
    mode = "symmetric"
    full_s, full_links = _full(full_runs, case)
    t_s, links = _run(case, mode)
    assert t_s == pytest.approx(full_s, rel=0.01), (case, mode)
    assert links, "the run must carry traffic"
    crossed = 0
    for name, carried in links.items():  # every link the mode simulated carries what it carries in full
        assert carried == pytest.approx(full_links.get(name, 0.0), rel=0.01), (case, mode, name)
        crossed += "leaf" in name or "spine" in name or "core" in name
    assert crossed or case == "nvl72-domain"  # the fabric took part (NVL72's TP stays in the rack)
