"""How long one layer's recompute workspace lives within that layer's backward (full recomputation).

:func:`workload.memory.memory_per_gpu` counts the workspace of full recomputation as one layer's saved
activations (Korthikanti et al. 2022 Table 2 without recomputation, less the checkpointed layer input),
which is its peak: the moment the recomputed forward ends. Autograd then frees each node's saved tensors
once the node's backward has run, so as the backward walks back through the layer the workspace shrinks,
down to the qkv GEMM's saved input at its backward (the first LayerNorm's input is the checkpoint
itself). Something else whose size changes over the layer's backward (DeepSpeed ZeRO-3's gathered
parameters and gradient buckets, :mod:`workload.parallel.deepspeed_memory`) peaks jointly with the
workspace at one of these moments, not at the workspace's own peak.

The decomposition is that of :func:`workload.memory.activation_bytes_per_layer` (the same terms, each
assigned to the op that saves it), in forward order:

=============  ========================================================================================
``ln1``        its input, ``2sbh/t_sp``: the layer input, the checkpoint (not workspace)
``attn.qkv``   its input (the norm's output), ``gemm_in sbh/t_sp``
core           Q, K, V ``(2q + 4kv) sb/t``, QK-norm inputs, the scores (softmax output, dropout mask
               and output, ``5as^2b/t``) or FlashAttention's softmax statistics and its output O
``attn.proj``  its input, the attention output (with FlashAttention only the FP8 copy, O being the core's)
dropout        the hidden-dropout mask, ``sbh/t_sp``
``ln2``        its input, ``2sbh/t_sp``
``mlp.fc1``    its input, ``gemm_in sbh/t_sp``
activation     the GeLU input (``2f``) or SwiGLU's gate and up (``4f``), ``sb/t``
``mlp.fc2``    its input, ``gemm_in f sb/t``
dropout        the hidden-dropout mask, ``sbh/t_sp``
=============  ========================================================================================

Not modelled (as nowhere in the memory model): the activation gradients in flight (the gradient of
the op's output and of its input, a few ``sbh`` outside the attention core).
"""

from __future__ import annotations

from dataclasses import dataclass

from workload.memory import TransformerShape

MODULES = ("ln1", "attn.qkv", "attn.proj", "ln2", "mlp.fc1", "mlp.fc2")
"""A GPT block's parameter modules in forward order (:func:`workload.parallel.deepspeed_memory.layer_modules`)."""


@dataclass(frozen=True)
class ModuleWorkspace:
    """Recompute workspace alive (bytes) around one module's pass in the recomputed forward and the
    backward of its layer."""

    forward: float
    """During its recomputed forward: the saved tensors of the ops up to it, its own input included."""
    forward_after: float
    """After it, while the ops up to the next module run (the last module: the whole workspace)."""
    backward: float
    """During its backward: the saved tensors of the ops up to it (those after it are freed)."""
    backward_after: float
    """After it, while the ops between the previous module and it run their backward."""


def saved_bytes_by_op(m: TransformerShape, *, micro_batch_size: int, tp: int = 1, sequence_parallel: bool = False,
                      cp: int = 1, flash_attention: bool = True, fp8: bool = False) -> tuple[tuple[str, float], ...]:
    """(op, bytes it saves for the backward) of one transformer layer per GPU, in forward order (module
    docstring), a module's name for a parameter module's op. They add up to
    ``activation_bytes_per_layer(recompute="none")`` for the same arguments (``sequence_parallel``
    only with ``tp`` > 1, as :func:`workload.memory.memory_per_gpu` passes it)."""
    s_full, b, h, a, t = m.seq_length, micro_batch_size, m.hidden_size, m.num_attention_heads, tp
    s = s_full / cp
    sp = t if sequence_parallel else 1
    q, kv, f = m.query_width, m.kv_width, m.ffn_hidden_size * m.moe_topk * m.moe_capacity_factor
    gemm_in = 1.0 if fp8 else 2.0
    mask = 1.0 if m.hidden_dropout > 0 else 0.0
    sbh, sb = s * b * h / sp, s * b / t
    if flash_attention:  # softmax statistics; O is saved by the kernel (bf16) and, with FP8, by the GEMM
        scores, out_core, out_proj = 4.0 * a * s * b / t, 2.0 * q * sb, (1.0 * q * sb if fp8 else 0.0)
    else:
        scores = (5.0 if m.attention_dropout > 0 else 2.0) * a * s * s_full * b / t
        out_core, out_proj = 0.0, gemm_in * q * sb
    qk_norm_in = 2.0 * (q + kv) if m.qk_norm else 0.0
    core = (2.0 * q + 4.0 * kv + qk_norm_in) * sb + scores + out_core
    return (("ln1", 2.0 * sbh), ("attn.qkv", gemm_in * sbh), ("core", core), ("attn.proj", out_proj),
            ("dropout", mask * sbh), ("ln2", 2.0 * sbh), ("mlp.fc1", gemm_in * sbh),
            ("activation", (4.0 if m.gated_mlp else 2.0) * f * sb), ("mlp.fc2", gemm_in * f * sb),
            ("dropout", mask * sbh))


def workspace_by_module(saved: tuple[tuple[str, float], ...]) -> dict[str, ModuleWorkspace]:
    """Per parameter module of :data:`MODULES`, the recompute workspace around its passes, from
    :func:`saved_bytes_by_op` (the first op's saved input, the layer input, is the checkpoint: not
    counted). The largest is the whole workspace, after the recomputed forward; at the qkv GEMM's
    backward only its own saved input is left.

    Raises:
        ValueError: ``saved`` does not hold each module of :data:`MODULES` once, in order, ``ln1`` first.
    """
    names = [name for name, _ in saved if name in MODULES]
    if tuple(names) != MODULES or saved[0][0] != MODULES[0]:
        raise ValueError(f"saved must hold the modules {', '.join(MODULES)} once each, in order, ln1 first")
    upto: list[float] = []  # ops up to and including the op, less the checkpoint
    total = 0.0
    for j, (_, nbytes) in enumerate(saved):
        total += nbytes if j else 0.0
        upto.append(total)
    at = [j for j, (name, _) in enumerate(saved) if name in MODULES]
    out: dict[str, ModuleWorkspace] = {}
    for k, j in enumerate(at):
        segment_end = upto[at[k + 1] - 1] if k + 1 < len(at) else total
        before = upto[j - 1] if j else 0.0
        out[MODULES[k]] = ModuleWorkspace(forward=upto[j], forward_after=segment_end, backward=upto[j],
                                          backward_after=before)
    return out


__all__ = ["MODULES", "ModuleWorkspace", "saved_bytes_by_op", "workspace_by_module"]
