"""The screen's price of PyTorch FSDP2's own kernels (``fsdp = true``, every ZeRO-3 plan the search makes
but DeepSpeed's): the copies around its collectives and its optimizer step, no SimPy.

The kernels are :mod:`workload.parallel.fsdp2`'s, reused rather than re-modelled, and priced by the same
cost model as the rest of the screen (solo times):

* per unit gathered, the all-gather copy-out on the compute stream (``split_with_sizes_copy`` of the
  gathered buffer: read and write its bytes) -- before the unit's forward and its backward;
* per unit reduced, the reduce-scatter copy-in on the compute stream (``torch._chunk_cat`` widening the
  gradients to fp32: read the training dtype, write the reduce dtype) -- after its backward;
* the optimizer step as ``clip_grad_norm_`` and ``AdamW(foreach=True)`` run it
  (:data:`workload.parallel.fsdp2.FOREACH_ADAMW_PASSES`, fp32 bytes per parameter per pass), instead of
  Megatron's fused Adam.

The FSDP collectives around the passes (:func:`fsdp_pass_s`, :func:`fsdp_once_s` with pipeline stages)
are composed here too.

The all-gather copy-in runs on the all-gather stream before its collective, so it is not on the compute
stream's path (prefetched behind the previous unit), as the collectives' own times are in the screen's
FSDP pass.
"""

from __future__ import annotations

from typing import Any

from hwmodel.ir import Compute
from workload.parallel.fsdp2 import FOREACH_ADAMW_PASSES
from workload.parallel.optimizer import optimizer_kernel

__all__ = ["fsdp_copies_s", "foreach_adamw_s", "fsdp_once_s", "fsdp_pass_s"]


def _copy_s(ctx: Any, name: str, nbytes: float) -> float:
    key = ("fsdp_copy", name, nbytes)
    hit = ctx._opt.get(key)
    if hit is None:
        k = Compute(name, "copy", 0.0, float(nbytes), dtype=ctx.dtype if ctx.dtype != "fp8" else "bf16")
        hit = ctx._opt[key] = ctx.cost_model.cost(k).solo_time_s if nbytes > 0 else 0.0
    return hit


def fsdp_copies_s(ctx: Any, units: list[tuple[float, float]], phase: str) -> float:
    """FSDP2's compute-stream copies in one pass over ``units`` ((elements gathered, elements reduced) of
    each unit on this rank, before sharding over data parallelism), in seconds: a copy-out per unit
    gathered, and in the backward a reduce-scatter copy-in per unit reduced (``ctx``: the screen's
    :class:`~scenarios.search.screen.ScreenContext`, whose ``eb`` and ``grad_bytes`` are the training and
    gradient-reduction element sizes)."""
    total = sum(_copy_s(ctx, "fsdp_all_gather_copy_out", 2 * n * ctx.eb) for n, _ in units)
    if phase == "bwd":
        total += sum(_copy_s(ctx, "fsdp_reduce_scatter_copy_in", n * (ctx.eb + ctx.grad_bytes)) for _, n in units)
    return total


def foreach_adamw_s(ctx: Any, params: float) -> float:
    """``clip_grad_norm_`` and foreach AdamW over one unit's ``params`` fp32 shard elements, in seconds (the
    gradient norm's scalar all-reduces are left out: a few microseconds)."""
    key = ("foreach_adamw", params)
    hit = ctx._opt.get(key)
    if hit is None:
        hit = ctx._opt[key] = sum(ctx.cost_model.cost(optimizer_kernel(name, params * b, "")).solo_time_s
                                  for name, b in FOREACH_ADAMW_PASSES) if params > 0 else 0.0
    return hit


def fsdp_once_s(st: Any, Ls: int, first: bool, last: bool, t_bwd: float) -> float:
    """FSDP with PP (``ParallelConfig.fsdp_keeps_unsharded``): each of the stage's units is gathered
    once, before its first forward (prefetched behind the previous unit), and reduce-scattered once,
    after its last backward, behind the rest of that backward; the exposed part of both. ``st``: the
    screen's ``_StageTimes`` of the plan (its ``dp_coll`` prices the data-parallel collectives)."""
    ctx, sc, pr = st.ctx, st.sc, st.sc.params
    units = ([(pr["pre"], sc.compute[("pre", "fwd")])] if first else []) + [(pr["block"], st.blk_f)] * Ls + (
        [(st.part_params("post"), sc.compute[("post", "fwd")])] if last else [])
    # one stage's groups at a time: the schedule staggers the stages' first forwards and last backwards
    ag = [st.dp_coll("all_gather", n * st.eb, "dp", every_stage=False) for n, _ in units]
    exposed = ag[0][0] + sum(max(0.0, ag[k][0] - units[k - 1][1])
                             + ctx.sm_tax(min(ag[k][0], units[k - 1][1]), ag[k][1]) for k in range(1, len(units)))
    rs = [st.dp_coll("reduce_scatter", n * ctx.grad_bytes, "dp", every_stage=False) for n, _ in units]
    total = sum(t for t, _ in rs)
    rs_exposed = max(rs[0][0], total - t_bwd)  # the first unit's backward is the last to end
    return exposed + rs_exposed + ctx.sm_tax(total - rs_exposed, max(ch for _, ch in rs))


def fsdp_pass_s(st: Any, Ls: int, phase: str) -> float:
    """FSDP's extra time in one pass over the units (pre, the layers, post; backward reversed; one
    stage, as FSDP has no pipeline): each unit's all-gather is prefetched behind the previous unit's
    compute (the first is exposed), in backward beside the previous unit's reduce-scatter, and the
    last reduce-scatter is exposed; overlapped kernels pay the SMs the collectives hold. ``st``: the
    screen's ``_StageTimes`` of the plan."""
    ctx, sc, g, pr = st.ctx, st.sc, st.g, st.sc.params
    blk = st.blk_f if phase == "fwd" else st.blk_b
    pre_s = sc.compute[("pre", phase)] * st.slow
    post_s = sc.compute[("post", phase)] * st.slow
    units = [(pr["pre"], pr["pre"], pre_s)] + [(pr["block"], pr["block"], blk)] * Ls + [
        (pr["post"] + pr["tied"], pr["post"], post_s)]
    if phase == "bwd":
        units.reverse()
    ag = [ctx.coll("all_gather", n * st.eb, g["dp"]) for n, _, _ in units]
    rs = [ctx.coll("reduce_scatter", n * ctx.grad_bytes, g["dp"]) if phase == "bwd" else (0.0, 0)
          for _, n, _ in units]
    extra = ag[0][0] + rs[-1][0]
    for k in range(1, len(units)):
        comm = ag[k][0] + rs[k - 1][0]
        comp = units[k - 1][2]
        extra += max(0.0, comm - comp)
        extra += ctx.sm_tax(min(comm, comp), max(ag[k][1], rs[k - 1][1]))
    return extra
