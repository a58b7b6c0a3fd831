"""Which engine a run uses: ``[simulation] mode`` resolved (``auto`` picks by size and by placement).

``full`` simulates every rank; ``symmetric`` one rank per pipeline stage (every CP rank), its data- and
tensor-parallel peers as mirrors of it; ``hierarchical`` one layer pass per block, reused. The two last
are exact only where every mirror is placed like the rank it copies: a tensor-parallel group that fits a
server on one rank and straddles two on another (TP 4 on 6-GPU servers; TP 8 on a 36-GPU NVL36 tray set)
meets NVLink on one and the network on the other, and one timed for all reads fast (a newcomer measured
-10 % and -22 %). :func:`placement_asymmetry` finds such layouts; ``auto`` then simulates every rank where
that stays affordable, and says so either way.
"""

from __future__ import annotations

from typing import Any

from workload.parallel.config import ParallelConfig
from workload.parallel.placement import Layout

SYMMETRY_THRESHOLD_GPUS = 16
"""Above this many GPUs, ``mode = "auto"`` simulates one representative rank per pipeline stage."""
HIERARCHICAL_THRESHOLD_TASKS = 100_000
"""Above this many tasks on the representative ranks, ``auto`` uses the hierarchical engine."""
SKEWED_FULL_MAX_TASKS = 1_000_000
"""The most tasks ``auto`` gives the full simulation of a layout whose mirrors are not placed alike
(a newcomer's 527,520-task one ran in 13 s; the catalog runs 4,500-40,000 tasks/s): beyond, it keeps the
one-rank-per-stage engine and says the time can read fast."""


def estimate_tasks(trace: Any, cfg: ParallelConfig, ranks: int) -> float:
    """Tasks the per-op programs of ``ranks`` ranks would hold (to pick the engine without building)."""
    g = trace.graph
    if not g.num_blocks:
        return ranks * cfg.num_microbatches * len(g.ops)
    per_layer = len(g.block_ops(0, "fwd")) * (2 if cfg.recompute_granularity == "full" else 1) + \
        len(g.block_ops(0, "bwd"))
    return ranks * cfg.num_microbatches * per_layer * trace.num_layers / cfg.pp


def placement_asymmetry(cfg: ParallelConfig, gpus_per_node: int) -> str | None:
    """Why the mirrors of a symmetric run would not be placed like the ranks they copy, or None.

    Ranks fill servers in order (rank *i* on GPU *i*) and Megatron's rank order (``cfg.rank_order``,
    e.g. ``tp-cp-ep-dp-pp``) makes each axis's groups blocks of consecutive ranks of the sizes before it:
    a block of ``u`` ranks sits alike on every server when ``u`` divides ``gpus_per_node`` (whole blocks
    in a server) or ``gpus_per_node`` divides ``u`` (whole servers in a block). The first block that does
    neither is named (``"tensor-parallel groups of 4 GPUs on 6-GPU servers"``)."""
    sizes = {"tp": cfg.tp, "cp": cfg.cp, "dp": cfg.dp, "pp": cfg.pp, "ep": cfg.ep}  # (dp counts ep's ranks)
    names = {"tp": "tensor-parallel groups", "cp": "context-parallel blocks", "ep": "expert-parallel blocks",
             "dp": "data-parallel blocks", "pp": "pipeline-parallel blocks"}
    unit = 1
    for axis in cfg.rank_order.split("-"):
        # (expert parallelism is carved out of the data-parallel axis: its block is checked, not counted)
        block = unit * sizes[axis]
        if sizes[axis] > 1 and block < cfg.world_size and block % gpus_per_node and gpus_per_node % block:
            return f"{names[axis]} of {block} GPUs on {gpus_per_node}-GPU servers"
        if axis != "ep":
            unit = block
    return None


def simulation_mode(cfg: ParallelConfig, sim: dict, trace: Any, gpus_per_node: int,
                    model_name: str = "the model") -> tuple[str, list[str], str]:
    """``[simulation] mode`` resolved, the report's notes on it, and why it was picked (one clause for the
    report's mode line, with the thresholds that decided: ``"1,536 GPUs > 16 and 8 representative ranks'
    ~240,000 tasks > 100,000"``): ``auto`` picks full, symmetric or
    hierarchical by size (:data:`SYMMETRY_THRESHOLD_GPUS`, :data:`HIERARCHICAL_THRESHOLD_TASKS`, by
    :func:`estimate_tasks`), and full where the mirrors would not be placed alike
    (:func:`placement_asymmetry`) while the full run stays under :data:`SKEWED_FULL_MAX_TASKS`.
    The hierarchical engine is exact wherever its blocks are alike: context parallelism's ring stays
    inside its layer pass, and a pass whose TP-overlap pipelines run on into the next is timed as the
    second of two in a row (``tests/scenarios/test_mode_equivalence.py``, within 0.3 %). Not where a CP
    ring crosses servers: its ranks meet the network differently and one is timed for all (a TP 4 x CP 4
    case on two servers read 3 % fast), which the note says.

    Raises:
        ValueError: hierarchical asked for a model whose blocks differ.
    """
    asked = sim.get("mode", "auto")
    uniform = trace.params_per_block is None  # the hierarchical engine times one block for all
    if asked == "hierarchical" and not uniform:
        raise ValueError(f"[simulation] mode = 'hierarchical' times one block and reuses it for every block; "
                         f"{model_name}'s blocks differ: use auto, full or symmetric")
    what = "context" if cfg.cp > 1 else "tensor"
    cp_note = [f"mode hierarchical with {what} parallelism across servers (TP {cfg.tp} x CP {cfg.cp} > "
               f"{gpus_per_node} GPUs per server): one rank's layer pass stands for ranks whose {what}-parallel "
               f"traffic crosses the network differently, which can read a few % fast (TP 8 on 4-GPU servers: "
               f"6 %); mode = \"full\" or \"symmetric\" simulates each"] if cfg.tp * cfg.cp > gpus_per_node else []
    skew = placement_asymmetry(cfg, gpus_per_node)
    skew_note = [f"mode {{mode}}: {skew} sit differently on different servers (their traffic meets NVLink and "
                 f"the network in different shares), and one simulated rank stands for all, so the iteration time "
                 f"can read fast (4-20 % in cases measured); mode = \"full\" simulates every rank"] if skew else []
    if asked != "auto":
        notes = (cp_note if asked == "hierarchical" else []) + ([] if asked == "full" else skew_note)
        return asked, [n.replace("{mode}", asked) for n in notes], "[simulation] mode"
    world = cfg.world_size
    gpus = f"{world:,} GPU{'s' if world != 1 else ''}"
    if world <= SYMMETRY_THRESHOLD_GPUS:
        return "full", [], f"{gpus} <= {SYMMETRY_THRESHOLD_GPUS}"
    full_tasks = estimate_tasks(trace, cfg, world) if skew else 0.0
    if skew and full_tasks <= SKEWED_FULL_MAX_TASKS:
        return "full", [f"mode full (auto's choice): {skew} sit differently on different servers, so no rank "
                        f"stands for the others; every rank is simulated"], \
            f"{gpus} > {SYMMETRY_THRESHOLD_GPUS}, but mirrors placed unlike their ranks and the full run's " \
            f"~{full_tasks:,.0f} tasks <= {SKEWED_FULL_MAX_TASKS:,}"
    ranks = len(Layout(cfg).representatives())
    tasks = estimate_tasks(trace, cfg, ranks)
    whose = "ranks'" if ranks != 1 else "rank's"
    why = f"{gpus} > {SYMMETRY_THRESHOLD_GPUS} and {ranks:,} representative {whose} ~{tasks:,.0f} tasks"
    if skew:
        why += f"; mirrors placed unlike their ranks, but the full run's ~{full_tasks:,.0f} tasks > " \
               f"{SKEWED_FULL_MAX_TASKS:,}"
    if uniform and tasks > HIERARCHICAL_THRESHOLD_TASKS:
        return "hierarchical", [n.replace("{mode}", "hierarchical (auto's choice)") for n in cp_note + skew_note], \
            why.replace(" tasks", f" tasks > {HIERARCHICAL_THRESHOLD_TASKS:,}", 1)
    bound = f" tasks <= {HIERARCHICAL_THRESHOLD_TASKS:,}" if uniform else " tasks (blocks differ: not hierarchical)"
    why = why.replace(" tasks", bound, 1)
    return "symmetric", [n.replace("{mode}", "symmetric (auto's choice)") for n in skew_note], why
