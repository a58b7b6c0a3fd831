"""Megatron-style tensor-parallel building blocks that leave collectives in the traced op graph.

A model built with these layers computes exactly one tensor-parallel rank's share (Megatron-LM's
``ColumnParallelLinear`` / ``RowParallelLinear``: heads and FFN columns divided by TP), and its
communication appears in the trace as ``trainsim.<collective>`` ops -- in forward *and*, through
autograd, in backward -- at the places Megatron issues them (``megatron/core/tensor_parallel/
mappings.py``):

=============================================  ==================  ==================
mapping                                        forward             backward
=============================================  ==================  ==================
``copy_to_tensor_model_parallel_region``       identity            all-reduce
``reduce_from_tensor_model_parallel_region``   all-reduce          identity
``gather_from_sequence_parallel_region``       all-gather (seq)    reduce-scatter
``reduce_scatter_to_sequence_parallel_region`` reduce-scatter      all-gather
=============================================  ==================  ==================

The custom ops have meta kernels, so tracing on the meta device needs no process group. The op's
``axis`` argument names the parallel axis ("tp", "ep", "cp") that the program builder turns into a
communicator.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

COLLECTIVE_PREFIX = "trainsim."
"""Traced op names starting with this are collectives (``trainsim.all_reduce.default``)."""


@torch.library.custom_op("trainsim::all_reduce", mutates_args=())
def _all_reduce(x: torch.Tensor, axis: str) -> torch.Tensor:
    return x.clone()


@_all_reduce.register_fake
def _(x, axis):
    return torch.empty_like(x)


@torch.library.custom_op("trainsim::all_gather", mutates_args=())
def _all_gather(x: torch.Tensor, axis: str, dim: int, world: int) -> torch.Tensor:
    return torch.cat([x] * world, dim=dim)


@_all_gather.register_fake
def _(x, axis, dim, world):
    shape = list(x.shape)
    shape[dim] *= world
    return x.new_empty(shape)


@torch.library.custom_op("trainsim::reduce_scatter", mutates_args=())
def _reduce_scatter(x: torch.Tensor, axis: str, dim: int, world: int) -> torch.Tensor:
    return x.narrow(dim, 0, x.shape[dim] // world).clone()


@_reduce_scatter.register_fake
def _(x, axis, dim, world):
    shape = list(x.shape)
    shape[dim] //= world
    return x.new_empty(shape)


@torch.library.custom_op("trainsim::all_to_all", mutates_args=())
def _all_to_all(x: torch.Tensor, axis: str) -> torch.Tensor:
    return x.clone()


@_all_to_all.register_fake
def _(x, axis):
    return torch.empty_like(x)


class _CopyToRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, axis):
        ctx.axis = axis
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return _all_reduce(g, ctx.axis), None


class _ReduceFromRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, axis):
        return _all_reduce(x, axis)

    @staticmethod
    def backward(ctx, g):
        return g, None


class _GatherFromSequence(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, axis, dim, world):
        ctx.args = (axis, dim, world)
        return _all_gather(x, axis, dim, world)

    @staticmethod
    def backward(ctx, g):
        return _reduce_scatter(g, *ctx.args), None, None, None


class _ReduceScatterToSequence(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, axis, dim, world):
        ctx.args = (axis, dim, world)
        return _reduce_scatter(x, axis, dim, world)

    @staticmethod
    def backward(ctx, g):
        return _all_gather(g, *ctx.args), None, None, None


def _dim0_gather(x: torch.Tensor, axis: str, dim: int, world: int) -> torch.Tensor:
    """PyTorch's ``funcol.all_gather_tensor(x, gather_dim=dim)``: ``all_gather_into_tensor`` stacks the
    shards along dim 0, then ``torch.cat(torch.chunk(res, world, dim=0), dim=dim)`` copies the whole
    gathered tensor into the ``dim`` layout (a copy kernel) when ``dim != 0``."""
    res = _all_gather(x, axis, 0, world)
    return torch.cat(torch.chunk(res, world, dim=0), dim=dim) if dim else res


def _dim0_scatter(x: torch.Tensor, axis: str, dim: int, world: int) -> torch.Tensor:
    """PyTorch's ``funcol.reduce_scatter_tensor(x, scatter_dim=dim)``: when ``dim != 0`` the input is first
    copied shard-major (``torch.cat(torch.chunk(x, world, dim=dim))``), then ``reduce_scatter_tensor``
    scatters along dim 0."""
    if dim:
        x = torch.cat(torch.chunk(x, world, dim=dim))
    return _reduce_scatter(x, axis, 0, world)


class _GatherFromSequenceDim0(torch.autograd.Function):
    """:class:`_GatherFromSequence` as DTensor runs it (``Shard(dim) -> Replicate`` forward, ``Partial ->
    Shard(dim)`` backward), through PyTorch's dim-0 functional collectives."""

    @staticmethod
    def forward(ctx, x, axis, dim, world):
        ctx.args = (axis, dim, world)
        return _dim0_gather(x, axis, dim, world)

    @staticmethod
    def backward(ctx, g):
        return _dim0_scatter(g, *ctx.args), None, None, None


class _ReduceScatterToSequenceDim0(torch.autograd.Function):
    """:class:`_ReduceScatterToSequence` as DTensor runs it, through PyTorch's dim-0 functional collectives."""

    @staticmethod
    def forward(ctx, x, axis, dim, world):
        ctx.args = (axis, dim, world)
        return _dim0_scatter(x, axis, dim, world)

    @staticmethod
    def backward(ctx, g):
        return _dim0_gather(g, *ctx.args), None, None, None


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, axis):
        ctx.axis = axis
        return _all_to_all(x, axis)

    @staticmethod
    def backward(ctx, g):
        return _all_to_all(g, ctx.axis), None


@dataclass(frozen=True)
class TPContext:
    """Tensor-parallel settings a model is built with.

    Args:
        size: tensor_model_parallel_size.
        sequence_parallel: Megatron's sequence parallelism (activations outside the TP region are split
            along the sequence dimension ``seq_dim``).
        seq_dim: the sequence dimension of the activations entering a column-parallel layer.
        dim0_collectives: the sequence-parallel collectives run as PyTorch's functional collectives
            (DTensor, torchtitan's ``SequenceParallel`` on the batch-first ``[batch, seq, hidden]``
            activations), which gather and scatter along dim 0 only: a ``split`` + ``cat`` copy of the
            whole tensor after each all-gather and before each reduce-scatter
            (``torch/distributed/_functional_collectives.py``: ``all_gather_tensor``,
            ``reduce_scatter_tensor``; Inductor's ``micro_pipeline_tp`` pass matches exactly these
            ``split``/``cat`` patterns, ``NonZeroDimAllGather`` / ``NonZeroDimReduceScatter``). Megatron
            keeps its activations sequence-first (``[seq, batch, hidden]``) and gathers dim 0 in place:
            no copy, the default.
    """

    size: int = 1
    sequence_parallel: bool = False
    seq_dim: int = 1
    dim0_collectives: bool = False

    def __post_init__(self) -> None:
        if self.size < 1:
            raise ValueError(f"tensor_model_parallel_size must be >= 1, got {self.size}")
        if self.sequence_parallel and self.size == 1:
            raise ValueError("sequence_parallel needs tensor_model_parallel_size > 1")

    def shard(self, n: int, what: str) -> int:
        """``n // size``, or ValueError naming ``what`` when TP does not divide it."""
        if n % self.size:
            raise ValueError(f"tensor_model_parallel_size={self.size} does not divide {what}={n}")
        return n // self.size

    # Megatron's mappings (identity when TP is 1).
    def enter(self, x: torch.Tensor) -> torch.Tensor:
        """Input of a column-parallel region: all-gather along the sequence (SP) or copy (all-reduce in
        backward)."""
        if self.size == 1:
            return x
        if self.sequence_parallel:
            gather = _GatherFromSequenceDim0 if self.dim0_collectives else _GatherFromSequence
            return gather.apply(x, "tp", self.seq_dim, self.size)
        return _CopyToRegion.apply(x, "tp")

    def leave(self, x: torch.Tensor) -> torch.Tensor:
        """Output of a row-parallel region: reduce-scatter along the sequence (SP) or all-reduce."""
        if self.size == 1:
            return x
        if self.sequence_parallel:
            scatter = _ReduceScatterToSequenceDim0 if self.dim0_collectives else _ReduceScatterToSequence
            return scatter.apply(x, "tp", self.seq_dim, self.size)
        return _ReduceFromRegion.apply(x, "tp")

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """A plain all-reduce over TP (forward only), e.g. the vocab-parallel loss statistics."""
        return _ReduceFromRegion.apply(x, "tp") if self.size > 1 else x

    def local_seq(self, s: int) -> int:
        """Sequence length held outside the TP region (s / tp with sequence parallelism)."""
        return self.shard(s, "seq_length") if self.sequence_parallel else s


def all_to_all(x: torch.Tensor, axis: str = "ep") -> torch.Tensor:
    """MoE token dispatch/combine across the expert-parallel group (all-to-all in both passes)."""
    return _AllToAll.apply(x, axis)


class ColumnParallelLinear(nn.Linear):
    """``nn.Linear(in, out / tp)``: this rank's columns (Megatron ``ColumnParallelLinear``)."""

    def __init__(self, in_features: int, out_features: int, tp: TPContext, bias: bool = True, **kw) -> None:
        super().__init__(in_features, tp.shard(out_features, "output features"), bias=bias, **kw)


class RowParallelLinear(nn.Linear):
    """``nn.Linear(in / tp, out)``: this rank's rows (Megatron ``RowParallelLinear``)."""

    def __init__(self, in_features: int, out_features: int, tp: TPContext, bias: bool = True, **kw) -> None:
        super().__init__(tp.shard(in_features, "input features"), out_features, bias=bias, **kw)
