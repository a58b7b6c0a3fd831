"""Tensor-parallel communication pipelined with its GEMM, as program structure.

Two implementations real stacks run, both built from ordinary tasks so that they contend for SMs,
HBM and NVLink in the simulation like any other kernel and flow:

* ``tp_comm_overlap`` -- Megatron-Core ``--tp-comm-overlap`` (Transformer Engine userbuffers, the
  methods of TE's default configuration, ``initialize_ub`` in ``transformer_engine/pytorch/module/
  base.py``): the sequence-parallel all-gather before a column-parallel GEMM is a *ring exchange* --
  the ``tp`` shards move by copy-engine peer copies (:class:`hwmodel.ir.Memcpy`, no SMs) on
  :data:`ASYNC_STREAM` while the GEMM runs as ``tp`` pieces, piece ``i`` waiting for shard ``i`` (the
  local one at once); the reduce-scatter after a row-parallel GEMM is *pipelined* in
  :data:`UB_RS_SPLITS` chunks, GEMM piece ``i`` then reduce-scatter chunk ``i``, a collective on its own
  stream (:data:`OVERLAP_STREAM`) holding its channels' SMs like any NCCL kernel (TE's ``num_sm``
  tuning of that kernel is not modelled: NCCL's channel choice).
* ``async_tp`` -- torchtitan's micro-pipelined TP (PyTorch ``fused_all_gather_matmul`` /
  ``fused_matmul_reduce_scatter`` over symmetric memory, ``torch/distributed/_symmetric_memory/
  __init__.py``; Inductor's ``micro_pipeline_tp`` pass): the all-gather is fused with *every* matmul
  that consumes the gathered tensor (``fused_all_gather_matmul(A_shard, [B_0, B_1, ...])``: wq, wk
  and wv together, w1 and w3 together), chunk ``i`` of all of them after shard ``i`` arrives. Before
  the pipeline the local shard is copied into the symmetric-memory buffer (``copy_shard(dst=
  local_p2p_bufs, src=shard)`` then a barrier, deliberately *not* overlapped with the first chunk:
  :data:`hwmodel.ir.Memcpy` ``d2d`` on the compute stream); the remote shards then move by
  copy-engine peer copies (no SMs held) on :data:`ASYNC_STREAM`, one at a time ("cp from different
  streams cannot overlap"); when the gathered tensor is needed later (a backward's weight-gradient
  GEMM: ``return_A``), the local shard is copied into it beside the last chunk, and, the fused op returning
  it as ``movedim(0, gather_dim)`` of its gather-dim-major buffer, a micro-batch above 1 makes the
  weight-gradient mm's reshape copy it whole (``tp_ag_out_layout_copy``: torchtitan gathers dim 1 of
  ``[batch, seq, hidden]``). Peer copies move at the copy engines' measured NVLink rate
  (``[nccl.copy_engine_nvlink_efficiency]``, :mod:`hwmodel.runtime`) and load the HBM of both GPUs
  (the read and the write) without being limited by it. The reduce-scatter
  pairs only with a matmul that produces its input directly (``_find_producer_matmul``: ``mm`` or
  reshape-``mm``-reshape), so a reduce-scatter of a *sum* of GEMM outputs (the input gradient of
  torchtitan's separate wq/wk/wv or w1/w3) stays a plain NCCL collective; a paired one's partial sums
  are pushed to their owners and summed by one memory-bound reduction kernel (read ``tp`` partials,
  write one). The remote shards' pieces come first and the local one last
  (``_pipelined_produce_and_all2all``), so the last partial moves beside the local piece.

A pipelined pair is a :class:`Pipelined` item in the builder's op list (:func:`pair_collectives` finds
them); :func:`emit_pipelined` adds its tasks. With ``g`` and ``c`` the times of one GEMM piece and one
shard copy, alone, a ring-exchange all-gather with its GEMM takes ``max(n g, (n - 1) c + g)`` --
max(GEMM, comm) plus one chunk -- and so hides at most ``min(g, c)`` per chunk pair.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from hwmodel.dtypes import ELEMENT_BYTES
from hwmodel.ir import Collective, Compute, Memcpy

if TYPE_CHECKING:  # builder imports this module
    from workload.parallel.builder import TracedCollective

OVERLAP_STREAM = "tp_overlap"
"""Stream of the userbuffers communication chunks (``tp_comm_overlap``)."""
ASYNC_STREAM = "tp_async"
"""Stream of the copy-engine peer copies (ring-exchange all-gather; async TP's reduce-scatter)."""
UB_RS_SPLITS = 4
"""Chunks of a userbuffers pipelined reduce-scatter (``num_splits`` of TE's default configuration)."""


def n_chunks(op: str, mode: str, tp: int) -> int:
    """Pieces a pipelined ``op`` (``all_gather``, ``reduce_scatter``) is split into under ``mode``."""
    return UB_RS_SPLITS if op == "reduce_scatter" and mode == "userbuffers" else tp


@dataclass(frozen=True)
class Pipelined:
    """A TP collective fused with the GEMM it feeds (all-gather) or drains (reduce-scatter)."""

    collective: TracedCollective
    """The :class:`workload.parallel.builder.TracedCollective` (``all_gather`` or ``reduce_scatter``)."""
    gemm: Compute
    """Its GEMM, shape ``(1, tokens, n, k)``."""
    more: tuple[Compute, ...] = ()
    """Async TP: the other GEMMs consuming the same gathered tensor (``fused_all_gather_matmul``'s list
    of B matrices), pipelined chunk by chunk with ``gemm``."""

    @property
    def gemms(self) -> tuple[Compute, ...]:
        """All the GEMMs of the pair, in program order."""
        return (self.gemm, *self.more)


def _tokens(coll, hidden: int) -> int | None:
    """Tokens of the ``[tokens, hidden]`` tensor a sequence-parallel collective moves (full size)."""
    width = hidden * ELEMENT_BYTES.get(coll.dtype, 2)
    return coll.size_bytes // width if coll.size_bytes % width == 0 else None


def _is_gemm(item) -> bool:
    return isinstance(item, Compute) and item.kind == "gemm"


def _fits(gemm, tokens: int, hidden: int, n_chunks: int, *, gather: bool) -> bool:
    """``gemm`` has the tokens as rows and reads (gather) or writes (scatter) a hidden-wide tensor."""
    if not (isinstance(gemm, Compute) and gemm.kind == "gemm" and len(gemm.shape) == 4):
        return False
    b, m, n, k = gemm.shape
    return b == 1 and m == tokens and m % n_chunks == 0 and (k if gather else n) == hidden


def pair_collectives(items: list, *, hidden: int, tp: int, mode: str) -> list:
    """``items`` with each TP all-gather followed by its GEMM, and each GEMM followed by its TP
    reduce-scatter, replaced by one :class:`Pipelined`.

    The GEMM is the one in the adjacent run of GEMMs whose rows are the collective's tokens and whose
    input (all-gather) or output (reduce-scatter) is ``hidden`` wide: the forward GEMM, or the backward's
    data-gradient GEMM; the weight-gradient GEMM of the same run (tokens as its reduction dimension)
    needs the whole tensor and stays after the pair. Under ``mode = "async"`` an all-gather takes every
    such GEMM up to the next collective, kernels between them included (``fused_all_gather_matmul``
    with a list of B matrices: Inductor's pass finds every consumer ``mm`` of the gathered node and
    moves them to the fused op; torchtitan's w3 comes after w1's SiLU). Collectives without such a
    GEMM stay as they are.
    """
    out: list = []
    i = 0
    while i < len(items):
        it = items[i]
        op, axis = getattr(it, "op", None), getattr(it, "axis", None)
        tokens = _tokens(it, hidden) if axis == "tp" and op in ("all_gather", "reduce_scatter") else None
        if tokens is None or op is None:
            out.append(it)
            i += 1
            continue
        if op == "all_gather":
            j = i + 1
            while j < len(items) and (_is_gemm(items[j]) or mode == "async" and not hasattr(items[j], "axis")):
                j += 1
            run = items[i + 1:j]
            picks = [g for g in run if _fits(g, tokens, hidden, tp, gather=True)][:None if mode == "async" else 1]
            if not picks:
                out.append(it)
                i += 1
                continue
            out.append(Pipelined(it, picks[0], tuple(picks[1:])))
            out += [g for g in run if not any(g is p for p in picks)]
            i = j
            continue
        j = len(out)
        while j > 0 and isinstance(out[j - 1], Compute) and out[j - 1].kind == "gemm":
            j -= 1
        run = out[j:]
        splits = n_chunks(op, mode, tp)
        pick = next((g for g in reversed(run) if _fits(g, tokens, hidden, splits, gather=False)), None)
        if pick is None:
            out.append(it)
        else:
            out[j:] = [g for g in run if g is not pick] + [Pipelined(it, pick)]
        i += 1
    return out


def gemm_piece(gemm: Compute, n_chunks: int, index: int) -> Compute:
    """Piece ``index`` of ``n_chunks`` of ``gemm`` split along its rows (tokens): 1/n of the FLOPs and of
    the activation bytes, the whole weight."""
    b, m, n, k = gemm.shape
    mc = m // n_chunks
    full, part = m * k + k * n + m * n, mc * k + k * n + mc * n
    fixed = None if gemm.fixed_time_s is None else gemm.fixed_time_s / n_chunks
    return replace(gemm, name=f"{gemm.name}[{index}/{n_chunks}]", shape=(b, mc, n, k), fixed_time_s=fixed,
                   flops=gemm.flops / n_chunks, bytes_accessed=gemm.bytes_accessed * part / full)


def _gathered_needed(gemm: Compute, recompute: str) -> bool:
    """Whether async TP's fused all-gather must also return the gathered tensor (``return_A``): its
    output is needed after the matmuls -- by a backward's weight-gradient GEMM (the backward pass, a
    per-op SAC re-run, named ``recompute:``), or saved for the backward when nothing is recomputed
    (or, under full recomputation, whose re-run keeps its forward names, on every pass). A forward
    whose block the per-op SAC re-runs drops it (torchtitan's ``_save_list`` has no all-gather)."""
    return gemm.phase == "bwd" or gemm.name.startswith("recompute:") or recompute in ("none", "full")


def emit_pipelined(rb, item: Pipelined, deps: list, *, mode: str) -> list:
    """Add ``item``'s tasks to ``rb`` (a :class:`workload.parallel.builder.RankBuilder`); the first
    task waits for ``deps`` and the previous compute task. Returns what the next compute task must wait
    for beyond stream order. ``mode``: ``"userbuffers"`` (collective chunks) or ``"async"`` (peer copies).
    """
    coll, gemm = item.collective, item.gemm
    group = rb.groups["tp"]
    tp = len(group)
    n = n_chunks(coll.op, mode, tp)
    chunk_bytes = coll.size_bytes // n
    me = group.index(rb.rank)
    if coll.op == "all_gather":  # the local shard at once, the others as their copies arrive
        if mode == "async":  # the local shard into the symmetric-memory buffer first, not overlapped
            deps = [rb.add(Memcpy("d2d", chunk_bytes, name="tp_ag_local_copy"), "compute", deps)]
        start = list(deps) + [rb.last_compute]
        arrived = [None] + [rb.add(Memcpy("peer", chunk_bytes, group[(me + j) % tp], name="tp_ag_shard"),
                                   ASYNC_STREAM, start) for j in range(1, n)]
        for j in range(n):
            for k, g in enumerate(item.gemms):
                rb.add(gemm_piece(g, n, j), "compute", ([arrived[j]] if j else list(deps)) if k == 0 else [])
        if mode == "async" and _gathered_needed(gemm, rb.cfg.recompute_granularity):
            out = rb.add(Memcpy("d2d", chunk_bytes, name="tp_ag_out_copy"), ASYNC_STREAM, (arrived[-1],))
            if rb.cfg.micro_batch_size == 1:
                return [out]
            # the gathered A comes back as movedim(0, gather_dim) of the gather-dim-major buffer: with
            # torchtitan's [batch, seq, hidden] (gather_dim 1) and a micro-batch above 1 it is no 2-D view,
            # so the weight-gradient mm's reshape copies all of it (read and write) on the compute stream
            return [rb.add(Compute("tp_ag_out_layout_copy", "copy", 0.0, 2.0 * coll.size_bytes, dtype=coll.dtype,
                                   layer=gemm.layer, phase=gemm.phase), "compute", [out])]
        return []
    sent = []
    # async TP produces the partial sums of the remote shards first and its own shard last
    # (_pipelined_produce_and_all2all: the loop over steps 1 .. tp - 1, then chunk_producer(rank, ...)), so
    # the last remote partial moves beside the local piece; userbuffers' chunks go in order
    order = [*range(1, n), 0] if mode == "async" else list(range(n))
    for k, j in enumerate(order):
        rb.add(gemm_piece(gemm, n, j), "compute", list(deps) if k == 0 else [])
        piece = rb.last_compute
        if mode == "async":  # push the partial sum of shard j to its owner
            if j:
                sent.append(rb.add(Memcpy("peer", chunk_bytes, group[(me + j) % tp], name="tp_rs_partial"),
                                   ASYNC_STREAM, (piece,)))
        else:
            sent.append(rb.add(Collective("reduce_scatter", chunk_bytes, group, dtype=coll.dtype,
                                          name=f"tp_reduce_scatter[{j}/{n}]"), OVERLAP_STREAM, (piece,)))
    if mode != "async":
        return sent[-1:]
    # the owner sums its n partial sums (read n shards, write one) once the last one has arrived
    rb.add(Compute("tp_async_reduce", "elementwise", 0.0, float(chunk_bytes * (n + 1)), dtype=coll.dtype,
                   layer=gemm.layer, phase=gemm.phase), "compute", sent)
    return []
