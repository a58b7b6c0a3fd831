"""The optimizer step's kernels as Megatron-LM runs them (apex fused Adam on fp32 master weights)."""

from __future__ import annotations

from hwmodel.ir import Compute

ADAM_BYTES_PER_PARAM = 4 + 3 * (4 + 4)
"""Fused Adam traffic per parameter: read the fp32 gradient; read and write the fp32 master weight
and both fp32 moments (apex ``multi_tensor_adam``)."""
ADAM_FLOPS_PER_PARAM = 12


def optimizer_kernel(name: str, nbytes: float, layer: str) -> Compute:
    """A memory-bound optimizer-step kernel (fp32) moving ``nbytes`` bytes for ``layer``."""
    return Compute(name, "optimizer", 0.0, nbytes, dtype="fp32", layer=layer, phase="opt")


def fused_adam(params: float, layer: str) -> Compute:
    """The fused Adam step over ``params`` parameters of ``layer``: ``ADAM_FLOPS_PER_PARAM`` FLOPs and
    ``ADAM_BYTES_PER_PARAM`` bytes of HBM traffic per parameter."""
    return Compute("fused_adam", "optimizer", ADAM_FLOPS_PER_PARAM * params, ADAM_BYTES_PER_PARAM * params,
                   dtype="fp32", layer=layer, phase="opt")
