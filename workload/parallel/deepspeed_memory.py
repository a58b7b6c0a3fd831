"""Memory of DeepSpeed ZeRO stage 3 as DeepSpeed runs it (``[parallel] zero_impl = "deepspeed"``).

The FSDP estimate (:func:`workload.memory._gather_buffers`: a whole layer gathered and reduced while the
next layer is prefetched) does not describe DeepSpeed v0.3.16, which gathers and releases one *module*
at a time (:mod:`workload.parallel.deepspeed_zero`). Here the two transient terms come from the same
coordinator replay the simulation runs:

* *Gathered parameters*: the most elements whole at once over the iteration's module order
  (:attr:`workload.parallel.deepspeed_zero.FetchPlan.peak_live`: fetched, prefetched or kept for reuse),
  in the parameters' dtype (``partition_parameters.py`` gathers into a buffer of ``param.dtype``).
* *Unpartitioned gradients*: stage 3 computes each gradient whole (``param.grad``, fp16) and keeps it
  until its bucket's reduction is done (``reduce_independent_p_g_buckets_and_remove_grads``; the bucket
  is freed by ``partition_previous_reduced_grads`` after the host waited for it). At the peak: the
  bucket being reduced, its flattened copy (``allreduce_bucket`` -> ``flatten``, the all-reduce fallback of
  ``contiguous_gradients = false``), the next bucket and the gradient being produced
  (:func:`peak_gradient_elements`).
* *At one moment* (:func:`phase_peaks`): the two are taken where their sum is largest over the module
  order, not each at its own peak (which fall at different steps), with a tied word embedding's
  gradient from the output layer held until the embedding's backward; at that backward peak the output
  layer's activations (logits, the final norm's and output projection's inputs) are already freed
  (:func:`output_layer_activations`), unless the forward's peak of gathered parameters is higher.
  Under full recomputation the layer's recompute workspace joins that moment as it is then
  (:mod:`workload.recompute_lifetime`: freed op by op as the backward walks back through the layer),
  not whole (:func:`joint_peak`).
* The gradient *partitions* stay in fp16 (``fp16_partitioned_groups``' gradients, 2 bytes per element),
  not Megatron's fp32 main grads.

Not modelled: DeepSpeed's activation-checkpointing options (``partition_activations``,
``cpu_checkpointing``), which its own Megatron ZeRO-3 example sets (DeepSpeedExamples
``Megatron-LM-v1.1.5-ZeRO3/examples/ds_pretrain_gpt2-zero3.sh``) but Megatron-LM's own checkpointing,
which the SC'21 runs used, does not have.
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache
from typing import Any

from workload.memory import MemoryBreakdown, TransformerShape
from workload.parallel.deepspeed_zero import DEFAULTS, Stage3Settings, Use, gradient_buckets, plan_fetches
from workload.recompute_lifetime import MODULES, ModuleWorkspace, saved_bytes_by_op, workspace_by_module


def layer_modules(m: TransformerShape, tp: int = 1) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """A GPT block's parameter modules in forward order, with each parameter's elements on one rank of
    ``tp`` tensor-parallel ranks (Megatron's column-parallel qkv and fc1, row-parallel proj and fc2: the
    weights and the column-parallel biases split, the norms and row-parallel biases whole)."""
    h, q, kv, f = m.hidden_size, m.query_width, m.kv_width, m.ffn_hidden_size
    ln = (h, h) if m.layernorm_bias else (h,)
    fc1_out = f * (2 if m.gated_mlp else 1)

    def column(n_in: int, n_out: int) -> tuple[int, ...]:
        return (n_in * n_out // tp, n_out // tp) if m.bias else (n_in * n_out // tp,)

    def row(n_in: int, n_out: int) -> tuple[int, ...]:
        return (n_in * n_out // tp, n_out) if m.bias else (n_in * n_out // tp,)

    return (("ln1", ln), ("attn.qkv", column(h, q + 2 * kv)), ("attn.proj", row(q, h)), ("ln2", ln),
            ("mlp.fc1", column(h, fc1_out)), ("mlp.fc2", row(f, h)))


WORD_EMBEDDING = ("embedding", "word")
"""The word embedding's key: with tied embeddings the output layer uses the same parameter (Megatron's
``word_embeddings_weight``), gathered once and with one gradient."""


def _ends(m: TransformerShape, tp: int) -> tuple[list[Use], list[Use]]:
    """The modules before the blocks (word and position embeddings) and after them (final norm, then the
    output layer: the word embedding again when tied), each parameter's elements on one TP rank (the
    vocabulary split, Megatron's ``VocabParallelEmbedding``; position embeddings and the norm whole)."""
    word = m.vocab_size * m.hidden_size // tp
    pre = [Use(WORD_EMBEDDING, (word,))]
    if m.learned_position_embeddings:
        pre.append(Use(("pre", "position"), (m.seq_length * m.hidden_size,)))
    out_key = WORD_EMBEDDING if m.tied_embeddings else ("post", "output")
    post = [Use(("post", "norm"), (m.hidden_size,)), Use(out_key, (word,))]
    return pre, post


def iteration_uses(m: TransformerShape, full_recompute: bool, tp: int = 1) -> list[Use]:
    """One micro-batch's module uses in execution order on one of ``tp`` tensor-parallel ranks: the
    embeddings, the blocks, the final norm and output layer (the word embedding's parameter when tied),
    then backward in reverse, each block's recompute forward before its backward under full
    recomputation, and the embeddings' backward last."""
    modules = layer_modules(m, tp)
    pre, post = _ends(m, tp)

    def block(layer: int, order) -> list[Use]:
        return [Use((layer, name), params) for name, params in order]

    out = list(pre)
    for layer in range(m.num_layers):
        out += block(layer, modules)
    out += post
    for layer in reversed(range(m.num_layers)):
        if full_recompute:
            out += block(layer, modules)
        out += block(layer, reversed(modules))
    return out + pre


def gradient_order(m: TransformerShape, tp: int = 1) -> list[int]:
    """Elements of each parameter module's gradient in the order backward completes them (DeepSpeed's
    hook fires once a parameter's gradient is accumulated): the output layer (untied) and final norm, the
    blocks in reverse, then the embeddings (a tied word embedding's gradient is complete only there)."""
    pre, post = _ends(m, tp)
    grads = [u.numel for u in reversed(post) if u.key != WORD_EMBEDDING]
    for _ in range(m.num_layers):
        grads += [sum(params) for _, params in reversed(layer_modules(m, tp))]
    return grads + [u.numel for u in reversed(pre)]


@lru_cache(maxsize=64)
def transient_elements(m: TransformerShape, full_recompute: bool, s: Stage3Settings = DEFAULTS,
                       tp: int = 1) -> tuple[int, int]:
    """(gathered parameter elements, unpartitioned gradient elements) at their peaks over one micro-batch
    on one of ``tp`` tensor-parallel ranks. The first is at most the rank's parameters (its TP shard of
    the model, each parameter once); the second at most twice them (a bucket and its flattened copy)."""
    gathered = plan_fetches(iteration_uses(m, full_recompute, tp), s).peak_live
    return gathered, peak_gradient_elements(gradient_order(m, tp), s)


def _backward_gradients(m: TransformerShape, full_recompute: bool, tp: int) -> tuple[int, dict[int, list[int]]]:
    """(index in :func:`iteration_uses` of the first backward step, step -> the gradients (elements, in
    :func:`gradient_order`) completed at it): the output layer's and final norm's at the first backward
    step (their backward runs before the blocks'), each block module's at its backward use, the
    embeddings' at their backward uses, last."""
    pre, post = _ends(m, tp)
    per_layer = len(layer_modules(m, tp))
    first_bwd = len(pre) + m.num_layers * per_layer + len(post)
    grads = gradient_order(m, tp)
    n_post = sum(1 for u in post if u.key != WORD_EMBEDDING)
    at: dict[int, list[int]] = {first_bwd: grads[:n_post]} if n_post else {}
    k, step = n_post, first_bwd
    for _ in range(m.num_layers):
        step += per_layer if full_recompute else 0
        for j in range(per_layer):
            at.setdefault(step + j, []).append(grads[k])
            k += 1
        step += per_layer
    for j in range(len(pre)):
        at.setdefault(step + j, []).append(grads[k])
        k += 1
    return first_bwd, at


@lru_cache(maxsize=64)
def phase_peaks(m: TransformerShape, full_recompute: bool, s: Stage3Settings = DEFAULTS,
                tp: int = 1) -> tuple[int, tuple[int, int]]:
    """(most gathered elements in the forward, (gathered, unpartitioned gradient elements) at the
    backward step where their sum is largest) of one micro-batch on one of ``tp`` tensor-parallel ranks.
    The two peaks of :func:`transient_elements` fall at different steps (530B: 5 h^2 gathered in the
    forward, 12 h^2 of gradients at a layer's qkv backward, where 3 h^2 are gathered), so adding them
    over-counts. :func:`joint_peak` without a recompute workspace."""
    fwd, (gathered, grads, _) = joint_peak(m, full_recompute, s, tp)
    return fwd, (gathered, grads)


def _step_workspace(m: TransformerShape, full_recompute: bool, tp: int,
                    workspace: tuple[ModuleWorkspace, ...] | None) -> list[tuple[float, float]]:
    """Per step of :func:`iteration_uses`: the recompute workspace (bytes) during the module's pass and
    after it (:class:`workload.recompute_lifetime.ModuleWorkspace`); none outside the blocks' backward."""
    pre, post = _ends(m, tp)
    n = len(layer_modules(m, tp))
    if workspace is not None and len(workspace) != n:
        raise ValueError(f"workspace must give each of the block's {n} modules, got {len(workspace)}")
    zero = [(0.0, 0.0)]
    out = zero * (len(pre) + m.num_layers * n + len(post))
    for _ in range(m.num_layers):
        if full_recompute:
            out += [(w.forward, w.forward_after) for w in workspace] if workspace else zero * n
        out += [(w.backward, w.backward_after) for w in reversed(workspace)] if workspace else zero * n
    return out + zero * len(pre)


@lru_cache(maxsize=64)
def joint_peak(m: TransformerShape, full_recompute: bool, s: Stage3Settings = DEFAULTS, tp: int = 1,
               workspace: tuple[ModuleWorkspace, ...] | None = None,
               param_bytes: int = 2) -> tuple[int, tuple[int, int, float]]:
    """(most gathered elements in the forward, (gathered elements, unpartitioned gradient elements,
    recompute workspace bytes) at the backward moment where ``(gathered + gradients) * param_bytes +
    workspace`` is largest) of one micro-batch on one of ``tp`` tensor-parallel ranks; ``workspace``: per
    module of :func:`layer_modules` (forward order), the layer's recompute workspace around its passes
    (:func:`workload.recompute_lifetime.workspace_by_module`), or none.

    Replays the coordinator (:attr:`FetchPlan.live` per step) and the buckets of
    :func:`peak_gradient_elements` together: at a backward step, the gathered elements plus the bucket
    being reduced (it and its flattened copy), the bucket filling and the gradient being produced, and
    at the end the last bucket and its flattened copy (the backward epilogue's reduction). With
    tied embeddings the output layer's gradient of the word embedding is held from the start of backward
    until the embedding's backward adds its part (autograd sums a leaf's incoming gradients before its
    ``AccumulateGrad``; DeepSpeed's hook fires once, :func:`gradient_order`): V h / tp more elements.
    With a workspace, also the moment after each block step (:attr:`FetchPlan.after` gathered, the
    buckets as that step left them), while the ops between two modules run (the attention core's
    backward, the recomputed forward's end)."""
    uses = iteration_uses(m, full_recompute, tp)
    plan = plan_fetches(uses, s)
    live = plan.live
    first_bwd, at = _backward_gradients(m, full_recompute, tp)
    ws = _step_workspace(m, full_recompute, tp, workspace)
    held = m.vocab_size * m.hidden_size // tp if m.tied_embeddings else 0
    reducing = current = 0
    best: tuple[int, int, float] = (0, 0, 0.0)
    best_bytes = 0.0

    def consider(gathered: int, grads: int, workspace_bytes: float) -> None:
        nonlocal best, best_bytes
        if (gathered + grads) * param_bytes + workspace_bytes > best_bytes:
            best, best_bytes = (gathered, grads, workspace_bytes), (gathered + grads) * param_bytes + workspace_bytes

    for i in range(first_bwd, len(live)):
        for g in at.get(i, [0]):
            consider(live[i], reducing + current + g + held, ws[i][0])
            if g and current and current + g > s.reduce_bucket_size:
                reducing, current = 2 * current, 0  # the previous bucket freed, this one flattened
            current += g
        if ws[i][1] > 0:
            consider(plan.after[i], reducing + current + held, ws[i][1])
    if live:  # the epilogue's flush: the last bucket and its copy
        consider(live[-1], 2 * current, 0.0)
    return max(live[:first_bwd], default=0), best


def output_layer_activations(mem: MemoryBreakdown, m: TransformerShape, parallel: Any) -> float:
    """Bytes of ``mem``'s activations that the output layer and the loss hold (the final norm's and the
    output projection's inputs, the fp32 logits, an unfused loss's gradients: ``memory_per_gpu``'s last
    stage terms), freed once the loss and the output layer have run their backward, before any block's."""
    s_local = m.seq_length // max(1, parallel.cp)
    shard = parallel.tp if parallel.sequence_parallel else 1
    sbh = s_local * parallel.micro_batch_size * m.hidden_size / shard
    first_stage = (sbh if m.hidden_dropout > 0 else 0.0) + (2.0 * sbh if m.embedding_norm else 0.0)
    return max(0.0, float(mem.detail.get("other_activations", 0.0)) - first_stage)


def peak_gradient_elements(numels: list[int], s: Stage3Settings = DEFAULTS) -> int:
    """Most unpartitioned gradient elements alive at once for gradients produced in the order ``numels``.

    Bucket j's reduction is launched at the hook of bucket j+1's first gradient and its gradients are
    freed at the hook of bucket j+2's first (``reduce_ipg_grads``: ``reduction_stream.synchronize()``, then
    ``partition_previous_reduced_grads``), so meanwhile bucket j (and its flattened copy), bucket j+1 and
    bucket j+2's first gradient, being produced, are alive: ``2 B_j + B_(j+1) + g_first(j+2)``."""
    buckets = gradient_buckets(numels, s)
    sizes = [sum(numels[k] for k in b) for b in buckets]
    firsts = [numels[b[0]] for b in buckets]
    peak = 0
    for j, b in enumerate(sizes):
        nxt = sizes[j + 1] if j + 1 < len(sizes) else 0
        first = firsts[j + 2] if j + 2 < len(sizes) else 0
        peak = max(peak, 2 * b + nxt + first)
    return peak


def with_deepspeed_stage3(mem: MemoryBreakdown, model_cfg: Any, parallel: Any, param_bytes: int, grad_bytes: int,
                          s: Stage3Settings = DEFAULTS, *, flash_attention: bool = True,
                          fp8: bool = False) -> MemoryBreakdown:
    """``mem`` (:func:`workload.memory.memory_per_gpu` at ZeRO stage 3, with ``param_bytes`` and
    ``grad_bytes`` per element, ``flash_attention`` and ``fp8`` as passed to it) with DeepSpeed's
    transient buffers in place of FSDP's and the gradient partitions in the parameters' dtype (module
    docstring). Under full recomputation the recompute workspace is the layer's at the backward's joint
    peak (:func:`layer_workspace`, :func:`joint_peak`), not its own peak. MoE models keep the FSDP
    estimate (the coordinator replay here knows dense blocks only)."""
    m = TransformerShape.of(model_cfg)
    if m.num_experts > 1 or parallel.dp * parallel.cp == 1:
        return mem
    full = parallel.recompute_granularity == "full"
    workspace = layer_workspace(m, parallel, flash_attention=flash_attention, fp8=fp8) if full else None
    fwd_gathered, (gathered, grads, ws) = joint_peak(m, full, s, parallel.tp, workspace, param_bytes)
    if workspace is None:  # the workspace (none, or selective's attention core) counted whole
        ws = mem.workspace
    activations = mem.activations
    out_act = output_layer_activations(mem, m, parallel)
    # the blocks' backward peak (the output layer's activations freed) or the forward's (the workspace
    # counted whole there, as before its lifetime was modelled: an upper bound)
    if (gathered + grads) * param_bytes + ws - out_act >= fwd_gathered * param_bytes + mem.workspace:
        activations -= out_act
    else:
        gathered, grads, ws = fwd_gathered, 0, mem.workspace
    detail = dict(mem.detail, deepspeed_gathered_elements=gathered, deepspeed_gradient_elements=grads,
                  deepspeed_freed_output_activations=mem.activations - activations,
                  recompute_workspace_peak_bytes=mem.workspace)
    return replace(mem, gradients=mem.gradients * param_bytes / grad_bytes, activations=activations,
                   workspace=ws, gather_buffers=(gathered + grads) * param_bytes, detail=detail)


def layer_workspace(m: TransformerShape, parallel: Any, *, flash_attention: bool = True,
                    fp8: bool = False) -> tuple[ModuleWorkspace, ...]:
    """One layer's full-recompute workspace around each module of :func:`layer_modules` (in its order)
    for ``parallel``'s micro-batch, TP, sequence parallelism and CP
    (:func:`workload.recompute_lifetime.workspace_by_module`)."""
    saved = saved_bytes_by_op(m, micro_batch_size=parallel.micro_batch_size, tp=parallel.tp,
                              sequence_parallel=parallel.sequence_parallel and parallel.tp > 1, cp=parallel.cp,
                              flash_attention=flash_attention, fp8=fp8)
    by_module = workspace_by_module(saved)
    return tuple(by_module[name] for name in MODULES)


__all__ = ["WORD_EMBEDDING", "gradient_order", "iteration_uses", "joint_peak", "layer_modules", "layer_workspace",
           "output_layer_activations", "peak_gradient_elements", "phase_peaks", "transient_elements",
           "with_deepspeed_stage3"]
