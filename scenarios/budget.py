"""The pre-run estimate of a run's cost (``trainsim run --max-tasks``): tasks and mirrored route work.

A run's wall time grows with its tasks (:func:`scenarios.modes.estimate_tasks`) and, on a large cluster,
with the routes its cross-node rings hash: a data-parallel ring of ``n`` ranks has ``n`` hops, and every
one of the ``world / n`` rings the simulated ranks stand for (their mirrors, :mod:`hwmodel.nccl.mirrors`)
is routed hop by hop over the fabric's ECMP choices -- ``world`` route hops per ring collective shape,
whatever the task count. A DP-only Llama 3 8B (4 layers, TP 8, DP 16,384) on 131,072 H100 has 339 tasks
and 131,072 such hops: the hops are its run time. :func:`check_task_budget` counts both, a route hop as
``TASKS_PER_S / ROUTE_HOPS_PER_S`` tasks, and refuses a run above the caller's bound before it is built.
"""

from __future__ import annotations

from typing import Any

from scenarios.modes import estimate_tasks
from workload.parallel.config import ParallelConfig
from workload.parallel.placement import Layout

__all__ = ["ROUTE_HOPS_PER_S", "TASKS_PER_S", "TaskBudgetError", "check_task_budget", "duration", "route_hops"]

TASKS_PER_S = 5_000
"""Rough simulation rate for the time estimate of a refused run, in tasks per wall-clock second: the
catalog runs 4,500-20,000 tasks/s on one core (``Simulation`` line of their reports)."""
ROUTE_HOPS_PER_S = 8_000
"""Rough rate of the mirrored ring hops a run routes (:func:`route_hops`), per wall-clock second, measured
with the runs' ``Simulation`` wall time on a 2-core machine (cluster build included): Llama 3 8B, 4
layers, TP 8 x DP 2,048 / 8,192 / 16,384 on a DGX SuperPOD H100 preset, 16,384 / 65,536 / 131,072 hops and
339 tasks each, in 4.3 / 13.3 / 16.2 s."""


class TaskBudgetError(ValueError):
    """A run would simulate more tasks than the caller's bound."""


def route_hops(cfg: ParallelConfig, gpus_per_node: int) -> tuple[int, int]:
    """``(hops, ring ranks)``: the mirrored ring hops the data-parallel gradient rings route (module
    docstring) -- ``world_size`` where a ring (the ``dp x cp`` group, Megatron's gradient reduction)
    spans more than one server, else 0 (NVLink routes: one hop each, no fabric) -- and one ring's ranks."""
    group = Layout(cfg).group(0, ("dp", "cp"))
    if len(group) < 2 or len({r // gpus_per_node for r in group}) < 2:
        return 0, len(group)
    return cfg.world_size, len(group)


def check_task_budget(prep: Any, trace: Any, mode: str, max_tasks: float) -> float:
    """Refuse a run whose estimated work exceeds ``max_tasks`` tasks, before building its programs: its
    tasks plus its mirrored ring hops (:func:`route_hops`) counted as tasks of the same wall time.
    Returns the estimated wall time (seconds).

    Raises:
        TaskBudgetError: one line with the estimate, the expected wall time and what to change.
    """
    cfg = prep.config
    if mode == "hierarchical":  # one macro task per layer pass, plus a few per micro-batch (p2p, buckets)
        ranks = len(Layout(cfg).representatives(every_cp=False))
        tasks = ranks * cfg.num_microbatches * (2.0 * trace.num_layers / cfg.pp + 8)
    else:
        tasks = estimate_tasks(trace, cfg, cfg.world_size if mode == "full" else len(Layout(cfg).representatives()))
    hops, ring = route_hops(cfg, prep.topology.gpus_per_node)
    seconds = tasks / TASKS_PER_S + hops / ROUTE_HOPS_PER_S
    work = tasks + hops * TASKS_PER_S / ROUTE_HOPS_PER_S
    if work <= max_tasks:
        return seconds
    routes = hops / ROUTE_HOPS_PER_S >= 0.1 * seconds  # (named where they are a tenth of the time or more)
    hint = "a smaller [training] global_batch_size (fewer micro-batches)" if mode == "hierarchical" else \
        '[simulation] mode = "hierarchical" or a smaller [training] global_batch_size'
    if routes:
        hint = "fewer [system] nodes (the data-parallel rings' routes grow with the GPUs)" if hops >= tasks \
            else f"{hint}; fewer [system] nodes for the rings' routes"
    what = (f" and route about {hops:,} mirrored ring hops (data-parallel rings of {ring:,} ranks, "
            f"{hops // ring:,} of them, each hop's ECMP route hashed; a hop counted as "
            f"{TASKS_PER_S / ROUTE_HOPS_PER_S:g} tasks)") if routes else ""
    raise TaskBudgetError(f"this run would simulate about {tasks:,.0f} tasks ({cfg.num_microbatches:,} micro-batch"
                          f"{'es' if cfg.num_microbatches != 1 else ''}, "
                          f"mode {mode}){what}, {duration(seconds)}, above --max-tasks "
                          f"{max_tasks:,.0f}; try {hint}, or raise --max-tasks")


def duration(seconds: float) -> str:
    """A rough wall time, as words: ``about 3 hours``, ``about 40 s``, ``under a second`` (not ``about 0 s``)."""
    for unit, size in (("years", 365 * 86400.0), ("days", 86400.0), ("hours", 3600.0), ("minutes", 60.0)):
        if seconds >= 2 * size:
            return f"about {seconds / size:,.0f} {unit}"
    return f"about {seconds:.0f} s" if seconds >= 1 else "under a second"
