"""torchtitan's per-op selective activation checkpointing (``recompute_granularity = "selective_op"``):
which of a block's forward ops its backward re-runs.

torchtitan (``activation_checkpoint.mode = "selective"``, ``selective_ac_option = "op"``; ``_save_list`` and
``_custom_policy`` in ``torchtitan/models/llama3/parallelize_llama.py``) saves the outputs of ``aten.mm``
except every second one, of SDPA and of the TP reduce-scatters
(``_c10d_functional.reduce_scatter_tensor``), and marks every other op PREFER_RECOMPUTE. On the traced
graph: the block's GEMMs in forward order, the 2nd, 4th, ... re-run; attention kernels kept; every other
compute kernel (norms, rotary, activations, casts) re-run; of the collectives, the reduce-scatters are
saved and the others re-issued: a sequence-parallel block's two TP all-gathers
(``_c10d_functional.all_gather_into_tensor``, not in ``_save_list``) run again before its backward.
The GEMMs are those of the traced layer: Megatron's fused QKV and gate/up (Llama 3 8B: the attention
projection and fc2 re-run, 35 % of the block's GEMM FLOPs), or torchtitan's seven separate ``mm``
(``separate_projections``, set by ``fsdp = true``: wk, wo and w3 re-run, 37 %).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol, TypeVar


class _Op(Protocol):
    @property
    def kind(self) -> str: ...


class _Collective(Protocol):
    @property
    def op(self) -> str: ...


T = TypeVar("T", bound=_Op | _Collective)

KEPT_KINDS = ("attention",)
"""Kernel kinds whose outputs per-op SAC saves besides every other GEMM (SDPA)."""
KEPT_COLLECTIVES = ("reduce_scatter",)
"""Collectives whose outputs per-op SAC saves (``_save_list``); the others are re-issued."""


def op_sac_recomputed(block_fwd: Iterable[T]) -> list[T]:
    """The ops of one block's forward (in order: compute kernels, anything with a ``kind``, and
    collectives, anything with an ``op`` and no ``kind``) that per-op SAC re-runs before the block's
    backward: every second GEMM, every kernel not in :data:`KEPT_KINDS` and every collective not in
    :data:`KEPT_COLLECTIVES`."""
    out, gemms = [], 0
    for op in block_fwd:
        kind = getattr(op, "kind", None)
        if kind is None:  # a collective
            if op.op not in KEPT_COLLECTIVES:  # type: ignore[union-attr]
                out.append(op)
        elif kind == "gemm":
            gemms += 1
            if gemms % 2 == 0:
                out.append(op)
        elif kind not in KEPT_KINDS:
            out.append(op)
    return out


def op_sac_bytes(tokens: float, h: int, q: float, kv: float, f: float, a: int, t: int, sp: int,
                 gated_mlp: bool, *, compiled: bool = False) -> float:
    """Bytes one block keeps under torchtitan's per-op selective checkpointing (module
    docstring), for ``tokens`` = s*b local tokens: the region's input, the odd-numbered ``mm`` outputs (wq,
    wv, the MLP's first and, gated, its down projection), SDPA's output and fp32 log-sum-exp, and with TP
    the two reduce-scatter outputs.

    ``compiled`` (torch.compile of the block, as torchtitan applies it after the checkpoint wrapper): the
    saved set is what AOTAutograd's min-cut partitioner keeps, and it keeps only tensors the backward reads
    (``solve_min_cut`` in ``torch/_functorch/partitioners.py`` cuts between the forward and the nodes the
    backward needs; a ``MUST_SAVE`` tag only bans recomputing a node). Eager SAC instead stores every
    ``MUST_SAVE`` output as it runs (``_CachingTorchDispatchMode`` in ``torch/utils/checkpoint.py``). The
    gated MLP's down projection output (mm 7, ``w2``) and, with TP, its reduce-scatter output only feed the
    residual add, whose backward reads nothing, so compiled they are not kept: ``2h`` (and ``2h/t``) bytes
    per token less. Every other kept tensor is read by the backward (wq's and wv's outputs rebuild SDPA's
    inputs, w1's feeds SiLU's backward, SDPA's output the wo weight gradient, wo's reduce-scatter output the
    MLP norm's input)."""
    layer_input = 2.0 * h / sp
    mm_widths = [q / t, kv / t, kv / t, h, f / t] + ([f / t, h] if gated_mlp else [h])
    kept = mm_widths[0::2]  # mm 1, 3, 5, 7: every second one is recomputed
    kept_mm = sum(kept[:-1] if compiled and gated_mlp else kept)
    sdpa = 2.0 * q / t + 4.0 * a / t
    kept_reduce_scatters = 1 if compiled and gated_mlp else 2
    reduce_scatter = kept_reduce_scatters * 2.0 * h / t if t > 1 else 0.0
    return tokens * (layer_input + 2.0 * kept_mm + sdpa + reduce_scatter)


__all__ = ["KEPT_COLLECTIVES", "KEPT_KINDS", "op_sac_bytes", "op_sac_recomputed"]
