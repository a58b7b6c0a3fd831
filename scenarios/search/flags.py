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


def plan_flags(c: Any, global_batch_size: int | None = None, num_layers: int | None = None) -> str:
    """The plan as its framework's flags, prefixed with the framework's name for a torchtitan plan
    (``"torchtitan: --parallelism.tensor_parallel_degree 8 ..."``); ``global_batch_size`` (samples) and
    ``num_layers``: the scenario's, which torchtitan's batch and stage-split flags need (:func:`torchtitan_flags`)."""
    if framework(c) == "torchtitan":
        return f"torchtitan: {torchtitan_flags(c, global_batch_size, num_layers)}"
    return megatron_flags(c)


def titan_split(num_stages: int, num_layers: int, first_less: int, last_less: int) -> list[int] | None:
    """Transformer layers per (virtual) stage as torchtitan splits them
    (``torchtitan/distributed/pipeline_parallel.py`` ``generate_llm_fqn_per_model_part``, ``input_weight`` and
    ``output_weight`` its ``pipeline_parallel_first/last_stage_less_layers``): ``num_layers + first_less +
    last_less`` effective layers spread evenly, the remainder one each on the first stages, the first stage
    ``first_less`` fewer and the last ``last_less`` fewer; ``None`` where torchtitan refuses the numbers."""
    eff = num_layers + first_less + last_less
    per, extra = divmod(eff, num_stages)
    if per == 0 or first_less > per or last_less > per:
        return None
    out = [per + (1 if i < extra else 0) for i in range(num_stages)]
    out[0] -= first_less
    out[-1] -= last_less
    return out


def _titan_stage_flags(split: list[int], pp: int) -> list[str]:
    """torchtitan flags that reproduce the simulated per-virtual-stage ``split`` (``pp`` ranks): its
    ``first/last_stage_less_layers`` (defaults 1 each, so an even split must say 0) and, with several stages
    per rank, ``pipeline_parallel_layers_per_stage`` (the virtual stage count is ``ceil(effective layers /
    layers_per_stage)``); a split no such pair gives is named for ``module_fqns_per_model_part``."""
    n, layers = len(split), sum(split)
    for first_less in range(max(split) + 1):
        for last_less in range(max(split) + 1):
            if titan_split(n, layers, first_less, last_less) != split:
                continue
            f = [f"--parallelism.pipeline_parallel_first_stage_less_layers {first_less}",
                 f"--parallelism.pipeline_parallel_last_stage_less_layers {last_less}"]
            if n > pp:
                eff = layers + first_less + last_less
                per_stage = -(-eff // n)
                if -(-eff // per_stage) != n:
                    break
                f.append(f"--parallelism.pipeline_parallel_layers_per_stage {per_stage}")
            return f
    return [f"[stages of {'/'.join(map(str, split))} layers: --parallelism.module_fqns_per_model_part]"]


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
        f.append(f"--num-virtual-stages-per-pipeline-rank {c.vpp}")  # the argument (also with uneven ends)
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


def torchtitan_flags(c: Any, global_batch_size: int | None = None, num_layers: int | None = None) -> str:
    """The plan as torchtitan flags: TP always shards the sequence there (``c.tp`` 1 prints degree 1),
    async TP needs ``--compile.enable``, data parallelism is FSDP2 (``data_parallel_shard_degree``) for ZeRO-3 and DDP
    (``data_parallel_replicate_degree``) otherwise.

    The batch (torchtitan ``[training]``): ``local_batch_size`` is one data-parallel rank's batch per
    optimizer step and ``global_batch_size`` (default ``local_batch_size`` x the DP degree) the step's.
    Without a pipeline the micro-batch is ``local_batch_size`` and gradient accumulation makes up the
    global batch; with one, the pipeline schedule takes the rank's whole batch, ``local_batch_size`` =
    global / DP, in micro-batches of ``pipeline_parallel_microbatch_size`` (their count is the ratio).
    ``global_batch_size`` (samples) unknown: the PP plan's ``local_batch_size`` is written as that ratio.
    With ``num_layers`` the stage split is spelled out (:func:`_titan_stage_flags`), else bracketed."""
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
        if num_layers:  # the simulated split (Megatron's virtual-stage order is torchtitan's looped one)
            f += _titan_stage_flags(c.config(c.mbs * c.dp * c.pp).stage_layers(num_layers), c.pp)
        else:
            f.append(f"[{c.vpp} stages per rank; first / last stage {c.first_layers or '-'} / {c.last_layers or '-'} "
                     f"layers]")
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
