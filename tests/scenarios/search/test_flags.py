"""A plan is printed as the command line of the framework that runs it, and no plan mixes two stacks:
torchtitan's async TP never sits beside Megatron-LM's distributed optimizer or DeepSpeed's ZeRO-3."""

import pytest

from scenarios.search import Candidate, enumerate_space, parse_knobs
from scenarios.search.flags import framework, megatron_flags, torchtitan_flags
from scenarios.search.space import ModelFacts
from workload.parallel.config import ParallelConfig
from workload.zoo import get_model_config, with_overrides


def test_async_tp_plan_prints_torchtitan_flags():
    c = Candidate(tp=8, sp=True, pp=4, vpp=2, dp=4, zero=3, mbs=2, recompute="selective_op", async_tp=True)
    assert framework(c) == "torchtitan"
    flags = c.flags()
    assert flags.startswith("torchtitan: --parallelism.tensor_parallel_degree 8 "
                            "--parallelism.enable_async_tensor_parallel --compile.enable")
    for part in ("--parallelism.pipeline_parallel_degree 4", "--parallelism.pipeline_parallel_schedule Interleaved1F1B",
                 "--parallelism.pipeline_parallel_microbatch_size 2", "--parallelism.data_parallel_shard_degree 4",
                 "--activation_checkpoint.mode selective --activation_checkpoint.selective_ac_option op"):
        assert part in flags
    assert "--use-distributed-optimizer" not in flags and "--tensor-model-parallel-size" not in flags
    ddp = torchtitan_flags(Candidate(tp=2, sp=True, dp=4, mbs=1, async_tp=True))
    assert "--parallelism.data_parallel_replicate_degree 4 --parallelism.data_parallel_shard_degree 1" in ddp
    assert "--training.local_batch_size 1" in ddp and "pipeline_parallel" not in ddp


def test_torchtitan_pipeline_plan_prints_its_batch():
    """torchtitan's pipeline schedule takes a DP rank's whole batch (``--training.local_batch_size``) in
    micro-batches of ``--parallelism.pipeline_parallel_microbatch_size``: 1,024 samples over DP 4 are 256
    per rank, 128 micro-batches of 2. Without PP the micro-batch is the local batch and gradient
    accumulation makes up the global one."""
    pp = Candidate(tp=8, sp=True, pp=4, dp=4, zero=3, mbs=2, async_tp=True)
    flags = pp.flags(1024)
    assert "--parallelism.pipeline_parallel_microbatch_size 2 --training.local_batch_size 256" in flags
    assert flags.endswith("--training.global_batch_size 1024") or "--training.global_batch_size 1024 " in flags
    assert "--training.local_batch_size [global batch / 4]" in pp.flags()  # the scenario's batch not given
    flat = Candidate(tp=2, sp=True, dp=4, mbs=2, async_tp=True).flags(64)
    assert "--training.local_batch_size 2" in flat and "--training.global_batch_size 64" in flat


def test_other_plans_print_megatron_flags():
    c = Candidate(tp=2, sp=True, dp=4, zero=1, overlap_param_gather=True, tp_comm_overlap=True)
    assert framework(c) == "Megatron-LM" and c.flags() == megatron_flags(c)
    assert c.flags().startswith("--tensor-model-parallel-size 2 --pipeline-model-parallel-size 1")
    assert "--use-distributed-optimizer" in c.flags() and "--tp-comm-overlap" in c.flags()


TITAN = {"async_tp": {"tensor_model_parallel_size": 2, "sequence_parallel": True, "async_tp": True},
         "selective_op": {"recompute_granularity": "selective_op"}}


@pytest.mark.parametrize("feature", ["async_tp", "selective_op"])
@pytest.mark.parametrize("kw, named", [({"use_distributed_optimizer": True}, "use_distributed_optimizer"),
                                       ({"zero_stage": 2}, "zero_stage 1-2"),
                                       ({"zero_stage": 3, "zero_impl": "deepspeed"}, "zero_impl='deepspeed'"),
                                       ({"rank_order": "tp-cp-ep-pp-dp"}, "rank_order='tp-cp-ep-pp-dp'")])
def test_torchtitans_features_beside_another_stacks_are_refused(feature, kw, named):
    """Async TP and per-op SAC are torchtitan's; the distributed optimizer, DeepSpeed's ZeRO-3 and another
    rank order are not in torchtitan: one line names both keys."""
    with pytest.raises(ValueError, match=r"is torchtitan's, which runs FSDP2 \(fsdp=true\) or plain data "
                                         r"parallelism; it conflicts with .*" + named):
        ParallelConfig(**TITAN[feature], **kw)
    ParallelConfig(**TITAN[feature], fsdp=True)  # FSDP2: torchtitan's own


def test_per_op_sac_with_tp_but_no_sequence_parallelism_is_refused():
    with pytest.raises(ValueError, match=r"selective_op' is torchtitan's.* sequence_parallel=false"):
        ParallelConfig(recompute_granularity="selective_op", tensor_model_parallel_size=2, fsdp=True)
    ParallelConfig(recompute_granularity="selective_op", tensor_model_parallel_size=2, sequence_parallel=True)


def test_async_tp_with_megatrons_selective_recompute_is_refused():
    with pytest.raises(ValueError, match=r"async_tp=true is torchtitan's.* recompute_granularity='selective'"):
        ParallelConfig(**TITAN["async_tp"], fsdp=True, recompute_granularity="selective")


def test_search_space_has_no_mixed_stack_plan():
    facts = ModelFacts(num_layers=4, num_attention_heads=32, seq_length=1024, num_experts=0, world_size=16,
                       gpus_per_node=8, global_batch_size=16)
    model = with_overrides(get_model_config("llama3-8b"), num_layers=4, seq_length=1024)
    knobs = parse_knobs(fix=["parallel.context_parallel_size=1", "training.micro_batch_size=1",
                             "parallel.virtual_pipeline_model_parallel_size=1"],
                        space=["parallel.tensor_model_parallel_size=2", "parallel.pipeline_model_parallel_size=1,2"])
    valid, rejected = enumerate_space(facts, model, knobs)
    atp = [c for c in valid if c.async_tp]
    # TP 2 with SP, PP 1 or 2: async TP under DDP and under FSDP2, in torchtitan's one rank order
    assert atp and {c.zero for c in atp} == {0, 3} and all(c.zero_impl == "megatron" for c in atp)
    assert {c.rank_order for c in atp} == {"tp-cp-ep-dp-pp"}
    assert {c.rank_order for c in valid if c.pp == 2 and not c.async_tp} == {"tp-cp-ep-dp-pp", "tp-cp-ep-pp-dp"}
    assert {c.zero for c in valid if not c.async_tp} >= {0, 1, 2, 3}
    assert {c.recompute for c in atp} == {"none", "full", "selective_op"}  # not Megatron's selective
    sac = [c for c in valid if c.recompute == "selective_op"]
    assert sac and all(c.zero in (0, 3) and not c.tp_comm_overlap and c.rank_order == "tp-cp-ep-dp-pp" and c.sp
                       for c in sac)
    assert all(framework(c) == "torchtitan" and c.flags().startswith("torchtitan: ") for c in sac + atp)
    assert not any("torchtitan" in r.reason for r in rejected)  # not expanded, so not a rejected family either


def test_a_pinned_zero_stage_keeps_plans_with_data_parallelism():
    """``--fix parallel.zero_stage=3`` asks for FSDP: a TP 8 plan with no data parallelism has no ZeRO to
    run (normalised to stage 0), so it is not among the plans that satisfy the pin."""
    facts = ModelFacts(num_layers=4, num_attention_heads=32, seq_length=1024, num_experts=0, world_size=8,
                       gpus_per_node=8, global_batch_size=8)
    model = with_overrides(get_model_config("llama3-8b"), num_layers=4, seq_length=1024)
    valid, _ = enumerate_space(facts, model, parse_knobs(fix=["parallel.zero_stage=3",
                                                              "parallel.pipeline_model_parallel_size=1"]))
    assert valid and all(c.zero == 3 and c.dp * c.cp > 1 for c in valid)
    assert {c.tp for c in valid} == {1, 2, 4}  # TP 8 leaves DP 1


def test_torchtitan_expert_parallelism_borrows_fsdp_and_cp_ranks_only():
    """torchtitan's EP mesh is ``dp_shard_in_ep x cp`` (parallel_dims.py): under DDP (dp_replicate) a
    torchtitan plan has no ranks to lend it, so EP 4 with async TP and plain data parallelism is refused,
    the same plan with FSDP2 (dp_shard 4) runs, and Megatron-LM (EP from the data-parallel ranks) runs it."""
    plan = {"tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 2, "expert_model_parallel_size": 4,
              "sequence_parallel": True, "global_batch_size": 16, "micro_batch_size": 1}
    with pytest.raises(ValueError, match=r"async_tp=true is torchtitan's, whose expert parallelism .* "
                                         r"expert_model_parallel_size=4 must divide dp_shard x "
                                         r"context_parallel_size = 1 x 1"):
        ParallelConfig(**plan, async_tp=True).resolve(16)
    assert ParallelConfig(**plan, async_tp=True, fsdp=True).resolve(16).dp == 4
    assert ParallelConfig(**plan).resolve(16).ep == 4


@pytest.mark.parametrize("kw, named", [({"pipeline_model_parallel_size": 2}, "pipeline_model_parallel_size > 1"),
                                       ({"context_parallel_size": 2}, "context_parallel_size > 1"),
                                       ({"tensor_model_parallel_size": 2, "sequence_parallel": True,
                                         "tp_comm_overlap": True}, "tp_comm_overlap=true")])
def test_zero2_is_deepspeeds_and_refuses_what_its_stack_lacks(kw, named):
    """ZeRO-2 is printed as Megatron-DeepSpeed's; DeepSpeed's pipeline engine asserts ZeRO stage < 2, and CP
    and TE userbuffer overlap are Megatron-Core's: one line names the conflict."""
    with pytest.raises(ValueError, match=r"zero_stage=2 is DeepSpeed's ZeRO-2 \(Megatron-DeepSpeed\); it conflicts "
                                         r"with " + named):
        ParallelConfig(zero_stage=2, **kw)
    ParallelConfig(zero_stage=1, **kw)  # Megatron-LM's distributed optimizer runs each of them


def test_zero2_overlap_is_deepspeeds_config_not_a_megatron_flag():
    """Megatron-DeepSpeed runs ZeRO-2's reduction overlap from DeepSpeed's config (``overlap_comm``), not from
    Megatron-Core's ``--overlap-grad-reduce``."""
    flags = Candidate(tp=2, sp=True, dp=4, zero=2, overlap_grad_reduce=True).flags()
    assert flags.endswith("--zero-stage 2 [Megatron-DeepSpeed] [ds_config zero_optimization.overlap_comm true]")
    assert "--overlap-grad-reduce" in Candidate(tp=2, sp=True, dp=4, zero=1, overlap_grad_reduce=True).flags()


def test_torchtitan_stage_split_flags_reproduce_the_simulated_split():
    """torchtitan splits stages by ``generate_llm_fqn_per_model_part`` with first/last_stage_less_layers
    defaulting to 1 each: an even plan must say 0 and 0, Megatron's recipe split (last stage one fewer) is
    (0, 1), an interleaved plan names its layers per virtual stage, and a split torchtitan cannot make (a
    larger last stage) is named for module_fqns_per_model_part."""
    from scenarios.search.flags import titan_split

    assert titan_split(4, 32, 1, 1) == [8, 9, 8, 7]  # torchtitan's default on 32 layers: 34 effective
    assert titan_split(4, 32, 0, 1) == [9, 8, 8, 7] and titan_split(4, 32, 0, 0) == [8, 8, 8, 8]
    atp = {"tp": 2, "sp": True, "zero": 3, "mbs": 1, "async_tp": True}
    even = Candidate(pp=2, dp=2, **atp).flags(8, 4)
    assert ("--parallelism.pipeline_parallel_first_stage_less_layers 0 "
            "--parallelism.pipeline_parallel_last_stage_less_layers 0") in even and "layers_per_stage" not in even
    assert "--parallelism.pipeline_parallel_layers_per_stage 2" in Candidate(pp=2, vpp=2, dp=2, **atp).flags(8, 8)
    recipe = Candidate(pp=4, dp=1, first_layers=9, last_layers=7, **atp).flags(8, 32)
    assert "--parallelism.pipeline_parallel_last_stage_less_layers 1" in recipe
    assert "[stages of 1/1/1/2 layers: --parallelism.module_fqns_per_model_part]" in \
        Candidate(pp=4, dp=1, last_layers=2, **atp).flags(8, 5)
    assert "[" not in Candidate(pp=4, dp=1, first_layers=2, **atp).flags(8, 5)  # 2/1/1/1: torchtitan's remainder


def test_megatron_interleaving_is_its_argument():
    """Megatron-LM's argument is --num-virtual-stages-per-pipeline-rank (the config field's name is not a flag)."""
    flags = Candidate(tp=2, sp=True, pp=2, vpp=3, dp=2, zero=1).flags()
    assert "--num-virtual-stages-per-pipeline-rank 3" in flags and "--virtual-pipeline-model" not in flags
