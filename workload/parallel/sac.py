"""torchtitan's per-op selective activation checkpointing (``recompute_granularity = "selective_op"``):
which of a block's forward ops its backward re-runs.

torchtitan (``activation_checkpoint.mode = "selective"``, ``selective_ac_option = "op"``; ``_save_list`` and
``_custom_policy`` in ``torchtitan/models/llama3/parallelize_llama.py``) saves the outputs of ``aten.mm``
except every second one, of SDPA and of the TP reduce-scatters, and marks every other op
PREFER_RECOMPUTE. On the traced graph: the block's GEMMs in forward order, the 2nd, 4th, ... re-run;
attention kernels kept; every other compute kernel (norms, rotary, activations, casts) re-run;
collectives not re-issued. The traced layer's GEMMs are those of the zoo's layer (fused QKV, fused
gate/up), so the re-run share of GEMM FLOPs is the zoo layer's (Llama 3 8B: the attention projection and
fc2, 35 % of the block's GEMM FLOPs; torchtitan's seven separate ``mm`` re-run wk, wo and w3, 37 %).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol, TypeVar


class _Op(Protocol):
    @property
    def kind(self) -> str: ...


T = TypeVar("T", bound=_Op)

KEPT_KINDS = ("attention",)
"""Kernel kinds whose outputs per-op SAC saves besides every other GEMM (SDPA)."""


def op_sac_recomputed(block_fwd: Iterable[T]) -> list[T]:
    """The ops of one block's forward (in order; compute kernels, anything with a ``kind``) that per-op
    SAC re-runs before the block's backward: every second GEMM and every kernel not in
    :data:`KEPT_KINDS`."""
    out, gemms = [], 0
    for op in block_fwd:
        if op.kind == "gemm":
            gemms += 1
            if gemms % 2 == 0:
                out.append(op)
        elif op.kind not in KEPT_KINDS:
            out.append(op)
    return out


__all__ = ["KEPT_KINDS", "op_sac_recomputed"]
