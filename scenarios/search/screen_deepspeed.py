"""The screen's price of DeepSpeed ZeRO-3 (``[parallel] zero_impl = "deepspeed"``): the simulator's own
fetch plan replayed on three clocks, no SimPy.

The program structure is :mod:`workload.parallel.deepspeed_zero`'s, reused rather than re-modelled: the
module order of a layer's passes (:func:`~workload.parallel.deepspeed_zero.module_order`), where each
module's hook splits the pass (:func:`~workload.parallel.deepspeed_zero.segment_starts`), DeepSpeed's
coordinator (:func:`~workload.parallel.deepspeed_zero.plan_fetches`: blocking fetches, prefetch buckets,
device synchronisations, releases) and the gradient buckets
(:func:`~workload.parallel.deepspeed_zero.gradient_buckets`' rule). The replay keeps the builder's
dependencies on three clocks -- the compute stream, the all-gather stream and the reduction stream:
a gather starts after the kernels, gathers and reductions so far; a hook that synchronised waits for its
gathers (the one before its prefetch) and every reduction; a bucket's reduction starts after the kernels
so far and the previous reduction, and the kernels after a flush wait for the previous reduction (the
host's ``reduction_stream.synchronize()``). Collectives are NCCL's tuner times on the data-parallel
communicator, kernels their solo times (as the rest of the screen).

Each gather is the builder's fill, the host's per-rank loops on the compute stream, then the all-gather
and copy-out; the iteration starts with the previous optimizer step's gather of the persistent
parameters and its host copy loop (``_post_step``). Two micro-batches are replayed; further ones repeat
the second's period (the coordinator's steady state). Not kept: SMs the overlapped collectives hold (the
hooks' synchronisations leave little overlap).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from workload.parallel.deepspeed_zero import (
    DEFAULTS,
    Use,
    gather_kernels,
    module_order,
    persistent_gather_host_s,
    persistent_parameters,
    plan_fetches,
    segment_starts,
)

if TYPE_CHECKING:
    from scenarios.search.screen import ScreenContext, ShardCosts
    from scenarios.search.space import Candidate

Step = tuple[str, Any, float, int]
"""(``free`` or ``use``, the :class:`Use`, seconds of kernels, gradient elements it produces; -1: none)."""


def hook_segments(trace: Any, items: list, times: list[float]) -> list[tuple[str, tuple[int, ...], float, list]]:
    """Layer 0's pass (``items``, each kernel's seconds in ``times``) split where DeepSpeed's module hooks
    split it, as the builder splits it: (module, its parameters' elements, kernel seconds, collectives)."""
    from workload.parallel.builder import TracedCollective

    modules = trace.block_modules or (("", (trace.params_block,)),)
    order = module_order(modules, items, "layers.0.")
    starts = segment_starts(items, [f"layers.0.{name}" for name, _ in order])
    out = []
    for k, (name, params) in enumerate(order):
        lo, hi = (starts[k] if k else 0), (starts[k + 1] if k + 1 < len(order) else len(items))
        out.append((name, params, sum(times[lo:hi]), [it for it in items[lo:hi] if isinstance(it, TracedCollective)]))
    return out


def _layer_steps(sc: ShardCosts, ctx: ScreenContext, g: dict, phase: str, layer: int, slow: float,
                 grads: bool) -> list[Step]:
    out: list[Step] = []
    for name, params, compute_s, colls in sc.ds_segments[phase]:
        t = compute_s * slow + ctx._colls_s(colls, g)
        out.append(("use", Use((layer, name), params), t, sum(params) if grads else -1))
    return out


def _pass_steps(ctx: ScreenContext, sc: ShardCosts, c: Candidate, g: dict, slow: float, rc_s: float) -> list[Step]:
    """One micro-batch's forward and backward as hook steps and hook-free kernels, in execution order."""
    L = ctx.model_cfg.num_layers
    pr = sc.params
    post_params = pr["post"] + pr["tied"]

    def unit(part: str, phase: str, params: int, grad_params: int) -> list[Step]:
        t = sc.compute[(part, phase)] * slow + ctx._colls_s(sc.colls[(part, phase)], g)
        if params <= 0:
            return [("free", None, t, -1)]
        return [("use", Use((part, ""), (params,)), t, grad_params if phase == "bwd" else -1)]

    fwd = [s for layer in range(L) for s in _layer_steps(sc, ctx, g, "fwd", layer, slow, False)]
    steps = unit("pre", "fwd", pr["pre"], 0) + fwd + unit("post", "fwd", post_params, 0)
    steps += unit("post", "bwd", post_params, pr["post"])
    for layer in reversed(range(L)):
        if c.recompute == "full":
            steps += _layer_steps(sc, ctx, g, "fwd", layer, slow, False)
        elif rc_s:
            steps.append(("free", None, rc_s, -1))
        steps += _layer_steps(sc, ctx, g, "bwd", layer, slow, True)
    return steps + unit("pre", "bwd", pr["pre"], pr["pre"]) + [("flush", None, 0.0, -1)]


def _gather_kernels_s(ctx: ScreenContext, gather: Any, world: int) -> tuple[float, float, float]:
    """Solo seconds of the fill, the host's per-rank work and the copy-out around one gather
    (:func:`~workload.parallel.deepspeed_zero.gather_kernels`, the builder's own tasks)."""
    fill, host, copy_out = gather_kernels(gather, world, ctx.eb, ctx.dtype, "ds_gather")
    cost = ctx.cost_model.cost
    return cost(fill).solo_time_s, cost(host).solo_time_s, cost(copy_out).solo_time_s


def deepspeed_passes_s(ctx: ScreenContext, sc: ShardCosts, c: Candidate, g: dict, slow: float, rc_s: float,
                       m: int) -> float:
    """Seconds from the first forward to the last gradient reduction of ``m`` micro-batches under
    DeepSpeed ZeRO-3 (module docstring); ``rc_s``: one layer's selective recomputation (0 if none)."""
    one = _pass_steps(ctx, sc, c, g, slow, rc_s)
    n_mb = min(m, 2)
    steps = one * n_mb
    uses = [s[1] for s in steps if s[0] == "use"]
    plan = plan_fetches(uses, DEFAULTS)
    eb, dp = ctx.eb, g["dp"]
    op = "reduce_scatter" if DEFAULTS.contiguous_gradients else "all_reduce"
    t_c = t_ag = t_red = 0.0
    count, numel = persistent_parameters([(n, p) for n, p, _, _ in sc.ds_segments["fwd"]], ctx.model_cfg.num_layers)
    if count and dp.n > 1:  # the previous step's _post_step gather, then its host copy loop
        t_ag = ctx.coll_s("all_gather", numel * eb, dp)
        t_c = t_ag + persistent_gather_host_s(count, dp.n)
    host_wait: float | None = None
    bucket = 0
    ends: list[float] = []
    i = 0
    for kind, _, seconds, grad in steps:
        if kind == "free":
            t_c += seconds
            continue
        if kind == "flush":
            if bucket and dp.n > 1:
                host_wait, start = t_red, max(t_c, t_red)
                t_red = start + ctx.coll_s(op, bucket * eb, dp)
            bucket = 0
            ends.append(t_c)
            continue
        wait = t_c
        synced = plan.synced[i]
        for k in plan.by_step.get(i, []):
            gather = plan.gathers[k]
            if gather.prefetch and synced:
                wait, synced = max(wait, t_ag), False
            fill_s, host_s, copy_s = _gather_kernels_s(ctx, gather, dp.n)
            fill_end = max(t_c, t_ag, t_red) + fill_s
            # the host's per-rank loop on the compute stream, before the module's kernels and the all-gather
            t_c = max(t_c, fill_end) + host_s
            wait = max(wait, t_c)
            t_ag = t_c + ctx.coll_s("all_gather", gather.numel * eb, dp) + copy_s
        if synced:
            wait = max(wait, t_ag)
        if plan.synced[i]:
            wait = max(wait, t_red)
        if host_wait is not None:
            wait, host_wait = max(wait, host_wait), None
        t_c = wait + seconds
        i += 1
        if grad > 0:
            if bucket and bucket + grad > DEFAULTS.reduce_bucket_size and dp.n > 1:
                host_wait, start = t_red, max(t_c, t_red)
                t_red = start + ctx.coll_s(op, bucket * eb, dp)
                bucket = 0
            bucket += grad
    period = ends[-1] - ends[-2] if len(ends) > 1 else ends[-1]
    return ends[-1] + (m - n_mb) * period + max(0.0, t_red - t_c)


__all__ = ["deepspeed_passes_s", "hook_segments"]
