"""No-op what-ifs of this wave's keys are reported: a pod holding every leaf (no core tier to
oversubscribe), and a sliding window under the unfused (math) attention, which masks a dense matrix."""

from types import SimpleNamespace

from scenarios.notes import model_notes
from scenarios.runner import run_scenario
from scenarios.scenario import parse_scenario


def _fabric(leaves_per_pod: int) -> dict:
    return {"name": "pods", "system": {"name": "dgx-h100", "nodes": 4, "fabric": "fat_tree", "nodes_per_leaf": 1,
                                       "leaves_per_pod": leaves_per_pod, "core_oversubscription": 4},
            "model": {"name": "llama3-8b", "num_layers": 1},
            "parallel": {"tensor_model_parallel_size": 8},
            "training": {"global_batch_size": 4, "micro_batch_size": 1, "seq_length": 512},
            "simulation": {"record_links": False}}


def test_a_pod_of_every_leaf_says_the_core_changes_nothing():
    one_pod = run_scenario(parse_scenario(_fabric(4))).metrics
    assert any("leaves_per_pod = 4 covers all 4 leaf switch(es)" in w for w in one_pod["warnings"])
    two_pods = run_scenario(parse_scenario(_fabric(2))).metrics
    assert not any("leaves_per_pod" in w for w in two_pods.get("warnings", []))
    assert two_pods["iteration_time_s"] > one_pod["iteration_time_s"]  # the 4:1 core binds only with 2 pods


def test_a_window_under_unfused_attention_is_a_no_op():
    model = SimpleNamespace(sliding_window=1024, attention_backend="unfused", seq_length=8192, attention_sinks=0,
                            num_layers=2, layer_window=lambda i: 1024)
    (note,) = model_notes(model)
    assert "unfused" in note and "changes neither time nor memory" in note
    model.attention_backend = "flash"
    assert model_notes(model) == []


def test_a_rank_order_that_moves_no_group_says_so():
    from scenarios.notes import parallel_notes
    from workload.parallel.config import ParallelConfig

    tp_dp = ParallelConfig(tensor_model_parallel_size=2, rank_order="tp-cp-ep-pp-dp").resolve(16)
    (note,) = parallel_notes(tp_dp)  # PP is 1: pp-dp and dp-pp place every rank alike
    assert "no group changes" in note and "tp, dp" in note
    tp_pp_dp = ParallelConfig(tensor_model_parallel_size=2, pipeline_model_parallel_size=2,
                              rank_order="tp-cp-ep-pp-dp").resolve(16)
    assert parallel_notes(tp_pp_dp) == []
    assert parallel_notes(ParallelConfig(tensor_model_parallel_size=2).resolve(16)) == []


def test_core_oversubscription_over_a_presets_single_pod_is_named():
    """``core_oversubscription`` alone, on a preset with pods (Meta's RoCE cluster: 192 leaves a pod) whose
    nodes all sit in one pod, builds no core tier: named as a no-op, as ``oversubscription`` is; with pods
    of one leaf (a core tier) or the ratio left at 1 it is not."""
    from scenarios.notes import what_if_notes
    from scenarios.runner import build_topology

    def notes(**system):
        system = {"name": "meta-llama3-roce-24k", "nodes": 8, **system}
        return [n for n in what_if_notes(system, build_topology(system, None)) if "core" in n]

    one_pod = notes(core_oversubscription=4)
    assert len(one_pod) == 1 and one_pod[0].startswith("core_oversubscription = 4 has (almost) no effect")
    assert "4 leaf switch(es)" in one_pod[0] and "leaves_per_pod = 192" in one_pod[0]
    assert "leaves_per_pod below 4" in one_pod[0]
    assert notes(core_oversubscription=4, leaves_per_pod=1) == []  # 4 pods of one leaf: the core is crossed
    assert notes() == [] and notes(core_oversubscription=1) == []


def test_batched_pipeline_exchanges_without_a_pipeline_say_so():
    from scenarios.notes import parallel_notes
    from workload.parallel.config import ParallelConfig

    (note,) = parallel_notes(ParallelConfig(tensor_model_parallel_size=2, overlap_p2p_comm=False).resolve(16))
    assert "overlap_p2p_comm = false changes nothing" in note
    assert parallel_notes(ParallelConfig(pipeline_model_parallel_size=2, overlap_p2p_comm=False).resolve(16)) == []


def test_compile_without_op_sac_says_memory_is_unchanged():
    """torch.compile's saved set is modelled under per-op SAC only; elsewhere the note says memory is eager's."""
    from scenarios.notes import training_notes

    def cfg(g):
        return SimpleNamespace(recompute_granularity=g)

    assert training_notes({"compile": True}, cfg("none")) == [
        "[training] compile = true changes time (fused kernels) but not memory here: the memory model keeps eager's "
        "saved activations; torch.compile's saved set is modelled under recompute_granularity = \"selective_op\" only"]
    assert training_notes({"compile": True}, cfg("selective_op")) == []
    assert training_notes({"compile": False}, cfg("none")) == training_notes({}, cfg("full")) == []


def test_an_uneven_last_pod_is_named_with_its_share_of_the_core():
    """``leaves_per_pod = 3`` over 4 leaves builds a last pod of one leaf whose spines keep a full pod's
    cabling to the core (:func:`hwmodel.fabric._add_pods`): the note names it and its leaf's 3x share of
    the core, which the graph's spine-core capacities show; pods that divide the leaves say nothing."""
    from scenarios.notes import what_if_notes
    from scenarios.runner import build_topology

    def run(**system):
        system = {"name": "dgx-h100", **system}
        topo = build_topology(system, None)
        return topo, [n for n in what_if_notes(system, topo) if "last of" in n]

    topo, notes = run(nodes=8, fabric="fat_tree", nodes_per_leaf=2, leaves_per_pod=3)
    assert notes == ["the last of 2 pods has 1 leaf switch(es), not leaves_per_pod = 3 (4 leaves): its spines keep "
                     "a full pod's cabling to the core, 3x the core bandwidth per leaf of a full pod"]
    up = {p: sum(d["bandwidth_Bps"] for u, v, d in topo.graph.edges(data=True)
                 if u.startswith(f"pod{p}.") and v.startswith("core")) for p in (0, 1)}
    assert up[1] / 1 == 3 * up[0] / 3  # per leaf: one leaf in pod 1, three in pod 0
    _, rail = run(nodes=3, su_size=1, leaves_per_pod=16)  # 3 SUs of 8 rail leaves, pods of 2 SUs
    assert rail == ["the last of 2 pods has 8 leaf switch(es) (1 scalable unit), not leaves_per_pod = 16 (24 "
                    "leaves): its spines keep a full pod's cabling to the core, 2x the core bandwidth per leaf of a "
                    "full pod"]
    assert run(nodes=8, fabric="fat_tree", nodes_per_leaf=2, leaves_per_pod=2)[1] == []
