"""A search plan as the command line of the framework that runs it.

Megatron-LM runs every plan but those with async TP (an Inductor pass over the compiled model) or per-op
selective activation checkpointing, which are torchtitan's; the configuration refuses those beside Megatron's
distributed optimizer, TP comm overlap, core-attention recompute, another rank order or DeepSpeed's ZeRO-3
(``ParallelConfig._check_one_stack``), so such a plan is one that torchtitan runs: FSDP2 or plain data
parallelism, TP with sequence parallelism, pipeline and context parallelism.

Flag names: Megatron-LM ``megatron/training/arguments.py``; torchtitan ``torchtitan/config/job_config.py``
(``--parallelism.*``, ``--activation_checkpoint.*``, ``--compile.enable``, ``--float8.recipe_name``). What a
framework has no flag for is written in brackets.
"""

from __future__ import annotations

from typing import Any

from workload.parallel.config import DEFAULT_RANK_ORDER

__all__ = ["framework", "megatron_flags", "plan_flags", "torchtitan_flags"]


def framework(c: Any) -> str:
    """``"torchtitan"`` for a plan with torchtitan's async TP, per-op SAC, FSDP with PP (Megatron-LM's
    ``--use-torch-fsdp2`` refuses PP) or torchao's rowwise FP8 (not a Megatron-Core recipe), else
    ``"Megatron-LM"`` (``c``: a search ``Candidate``)."""
    fsdp_pp = c.zero == 3 and c.zero_impl != "deepspeed" and c.pp > 1  # Megatron's FSDP2 refuses PP
    return "torchtitan" if c.async_tp or c.recompute == "selective_op" or fsdp_pp or c.fp8_recipe == "rowwise" \
        else "Megatron-LM"


def plan_flags(c: Any, global_batch_size: int | None = None) -> str:
    """The plan as its framework's flags, prefixed with the framework's name for a torchtitan plan
    (``"torchtitan: --parallelism.tensor_parallel_degree 8 ..."``); ``global_batch_size`` (samples): the
    scenario's, which torchtitan's batch flags need (:func:`torchtitan_flags`)."""
    if framework(c) == "torchtitan":
        return f"torchtitan: {torchtitan_flags(c, global_batch_size)}"
    return megatron_flags(c)


def _recompute_megatron(c: Any) -> str:
    # Megatron-Core refuses full granularity without a method; every layer checkpointed is uniform 1.
    method, layers = ((c.recompute_method, c.recompute_num_layers) if c.recompute_method
                      else ("uniform", 1) if c.recompute == "full" else (None, None))
    return f"--recompute-granularity {c.recompute}" + (
        f" --recompute-method {method} --recompute-num-layers {layers}" if method else "")


def megatron_flags(c: Any) -> str:
    """The plan as Megatron-LM command-line flags (``--use-torch-fsdp2`` for ZeRO-3; DeepSpeed's ZeRO-3 as
    ``--zero-stage 3 [DeepSpeed]``; an FP8 recipe as Megatron-Core's ``--fp8-recipe``)."""
    f = [f"--tensor-model-parallel-size {c.tp}", f"--pipeline-model-parallel-size {c.pp}"]
    if c.first_layers:  # Megatron-Core's TransformerConfig.num_layers_in_first_pipeline_stage
        f.append(f"--decoder-first-pipeline-num-layers {c.first_layers}")
    if c.last_layers:
        f.append(f"--decoder-last-pipeline-num-layers {c.last_layers}")
    if c.vpp > 1:
        f.append(f"--virtual-pipeline-model-parallel-size {c.vpp}")
    if c.cp > 1:
        f.append(f"--context-parallel-size {c.cp}")
    if c.ep > 1:
        f.append(f"--expert-model-parallel-size {c.ep}")
    if c.sp:
        f.append("--sequence-parallel")
    f.append(f"--micro-batch-size {c.mbs}")
    if c.zero == 1:
        f.append("--use-distributed-optimizer")
    elif c.zero == 2:  # sharded gradients: not Megatron-LM's distributed optimizer, DeepSpeed's stage 2
        f.append("--zero-stage 2 [Megatron-DeepSpeed]")
    elif c.zero == 3 and c.zero_impl == "deepspeed":
        f.append("--zero-stage 3 [DeepSpeed]")
    elif c.zero == 3:
        f.append("--use-torch-fsdp2")
    if c.fp8_recipe:  # --fp8-format turns FP8 on; the recipe only chooses the scaling
        f.append(f"--fp8-format hybrid --fp8-recipe {c.fp8_recipe}")
    if c.recompute != "none":
        f.append(_recompute_megatron(c))
    # DeepSpeed overlaps ZeRO-2's reductions through its config file, not a Megatron-Core flag
    grad_overlap = "[ds_config zero_optimization.overlap_comm true]" if c.zero == 2 else "--overlap-grad-reduce"
    f += [flag for on, flag in ((c.overlap_grad_reduce, grad_overlap),
                                (c.overlap_param_gather, "--overlap-param-gather"),
                                (c.tp_comm_overlap, "--tp-comm-overlap")) if on]
    if c.rank_order == "tp-cp-ep-pp-dp":
        f.append("--use-tp-pp-dp-mapping")
    elif c.rank_order != DEFAULT_RANK_ORDER:
        f.append(f"[rank order {c.rank_order}]")
    return " ".join(f)


_TITAN_AC = {"none": "--activation_checkpoint.mode none",
             "full": "--activation_checkpoint.mode full",
             "selective_op": "--activation_checkpoint.mode selective --activation_checkpoint.selective_ac_option op",
             # Megatron's selective recomputation (core attention only) has no torchtitan mode
             "selective": "[recompute core attention, as Megatron-LM's selective]"}
_TITAN_FP8 = {"tensorwise": "--model.converters float8 --float8.recipe_name tensorwise",
              "rowwise": "--model.converters float8 --float8.recipe_name rowwise",
              "mxfp8": "--model.converters mx", "delayed": "[FP8 delayed scaling, Transformer Engine's]"}


def torchtitan_flags(c: Any, global_batch_size: int | None = None) -> str:
    """The plan as torchtitan flags: TP always shards the sequence there (``c.tp`` 1 prints degree 1),
    async TP needs ``--compile.enable``, data parallelism is FSDP2 (``data_parallel_shard_degree``) for ZeRO-3 and DDP
    (``data_parallel_replicate_degree``) otherwise.

    The batch (torchtitan ``[training]``): ``local_batch_size`` is one data-parallel rank's batch per
    optimizer step and ``global_batch_size`` (default ``local_batch_size`` x the DP degree) the step's.
    Without a pipeline the micro-batch is ``local_batch_size`` and gradient accumulation makes up the
    global batch; with one, the pipeline schedule takes the rank's whole batch, ``local_batch_size`` =
    global / DP, in micro-batches of ``pipeline_parallel_microbatch_size`` (their count is the ratio).
    ``global_batch_size`` (samples) unknown: the PP plan's ``local_batch_size`` is written as that ratio."""
    f = [f"--parallelism.tensor_parallel_degree {c.tp}"]
    if c.async_tp:
        f += ["--parallelism.enable_async_tensor_parallel", "--compile.enable"]
    if c.cp > 1:
        f.append(f"--parallelism.context_parallel_degree {c.cp}")
    if c.ep > 1:
        f.append(f"--parallelism.expert_parallel_degree {c.ep}")
    if c.pp > 1:
        local = str(global_batch_size // c.dp) if global_batch_size else f"[global batch / {c.dp}]"
        f += [f"--parallelism.pipeline_parallel_degree {c.pp}",
              f"--parallelism.pipeline_parallel_schedule {'Interleaved1F1B' if c.vpp > 1 else '1F1B'}",
              f"--parallelism.pipeline_parallel_microbatch_size {c.mbs}", f"--training.local_batch_size {local}"]
        if c.vpp > 1:
            f.append(f"[{c.vpp} stages per rank]")
        if c.first_layers or c.last_layers:  # torchtitan's first/last_stage_less_layers weigh, not count, layers
            f.append(f"[first / last stage {c.first_layers or '-'} / {c.last_layers or '-'} layers]")
    else:
        f.append(f"--training.local_batch_size {c.mbs}")
    if global_batch_size:
        f.append(f"--training.global_batch_size {global_batch_size}")
    if c.zero == 3:
        f.append(f"--parallelism.data_parallel_shard_degree {c.dp}")
    else:
        f.append(f"--parallelism.data_parallel_replicate_degree {c.dp} --parallelism.data_parallel_shard_degree 1")
    f.append(_TITAN_AC[c.recompute])
    if c.recompute_method:  # torchtitan's full checkpointing wraps every block
        f.append(f"[recompute {c.recompute_method} {c.recompute_num_layers} layers, as Megatron-LM's]")
    if c.fp8_recipe:
        f.append(_TITAN_FP8.get(c.fp8_recipe, f"[FP8 recipe {c.fp8_recipe}]"))
    return " ".join(f)
