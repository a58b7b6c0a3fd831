"""The optimizer phase of a trace: one single-tensor AdamW step per parameter."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

if TYPE_CHECKING:
    from workload.trace.recorder import Recorder


def trace_adamw(rec: Recorder, params: list[tuple[str, nn.Parameter]], master_dtype: torch.dtype,
                weight_decay: float) -> None:
    """One AdamW step per parameter (foreach=False), each attributed to the parameter's module."""
    rec.phase = "opt"
    for name, p in params:
        if p.grad is None:
            continue
        master = nn.Parameter(torch.empty(p.shape, dtype=master_dtype, device="meta")) if p.dtype != master_dtype else p
        master.grad = torch.empty(p.shape, dtype=master_dtype, device="meta")
        # Megatron: no weight decay on biases and norm weights (1-D parameters).
        opt = torch.optim.AdamW([master], lr=1e-4, weight_decay=weight_decay if p.dim() > 1 else 0.0,
                                foreach=False)
        opt.step()  # allocates the moments; not part of a steady-state step
        rec.layer_override = name.rpartition(".")[0]
        with rec:
            with torch.no_grad():
                if master is not p:
                    master.grad = p.grad.to(master_dtype)  # (numel,) bf16 -> fp32 grad cast
            opt.step()
            if master is not p:
                with torch.no_grad():
                    p.copy_(master)  # fp32 master -> model dtype
        rec.layer_override = None
