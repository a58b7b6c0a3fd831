"""Fused kernels as ``torch.library`` custom ops with fake (meta) kernels and backwards.

``aten._fused_rms_norm`` is CompositeImplicit on CPU/meta (it decomposes before a dispatch mode sees
it), and ``F.dropout`` decomposes into three kernels on meta where CUDA runs one ``native_dropout``;
:class:`~workload.trace.reroutes.FusedKernels` routes the calls here instead.
"""

from __future__ import annotations

import torch


@torch.library.custom_op("trainsim::rms_norm", mutates_args=())
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused RMSNorm kernel: (y, rstd); y = x · rsqrt(mean(x²) + eps) · weight, rstd (..., 1) fp32."""
    rstd = torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)
    return (x.float() * rstd * weight.float()).to(x.dtype), rstd


@rms_norm.register_fake
def _(x, weight, eps):
    return torch.empty_like(x), x.new_empty((*x.shape[:-1], 1), dtype=torch.float32)


@torch.library.custom_op("trainsim::rms_norm_backward", mutates_args=())
def rms_norm_backward(grad: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                       rstd: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(dx, dweight) of :func:`rms_norm`."""
    xhat = x.float() * rstd
    gw = grad.float() * weight.float()
    dx = rstd * (gw - xhat * (gw * xhat).mean(-1, keepdim=True))
    dw = (grad.float() * xhat).reshape(-1, x.shape[-1]).sum(0)
    return dx.to(x.dtype), dw.to(weight.dtype)


@rms_norm_backward.register_fake
def _(grad, x, weight, rstd):
    return torch.empty_like(x), torch.empty_like(weight)


def _rms_norm_setup(ctx, inputs, output):
    x, weight, _ = inputs
    ctx.save_for_backward(x, weight, output[1])


def _rms_norm_grad(ctx, grad_y, grad_rstd):
    x, weight, rstd = ctx.saved_tensors
    dx, dw = rms_norm_backward(grad_y, x, weight, rstd)
    return dx, dw, None


rms_norm.register_autograd(_rms_norm_grad, setup_context=_rms_norm_setup)


@torch.library.custom_op("trainsim::dropout", mutates_args=())
def dropout(x: torch.Tensor, p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """One fused dropout kernel, as CUDA's ``native_dropout``: (y, keep-mask)."""
    mask = torch.rand_like(x, dtype=torch.float32) >= p
    return x * mask / (1 - p), mask


@dropout.register_fake
def _(x, p):
    return torch.empty_like(x), torch.empty_like(x, dtype=torch.bool)


@torch.library.custom_op("trainsim::dropout_backward", mutates_args=())
def dropout_backward(grad: torch.Tensor, mask: torch.Tensor, p: float) -> torch.Tensor:
    """dx = grad * mask / (1 - p): one elementwise kernel."""
    return grad * mask / (1 - p)


@dropout_backward.register_fake
def _(grad, mask, p):
    return torch.empty_like(grad)


def _dropout_setup(ctx, inputs, output):
    ctx.p = inputs[1]
    ctx.save_for_backward(output[1])


def _dropout_grad(ctx, grad_y, grad_mask):
    (mask,) = ctx.saved_tensors
    return dropout_backward(grad_y, mask, ctx.p), None


dropout.register_autograd(_dropout_grad, setup_context=_dropout_setup)
