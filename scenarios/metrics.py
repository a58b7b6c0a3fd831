"""The numbers of a run: the metrics dict ``trainsim run --json`` writes, and the busiest links.

All SI: seconds, bytes, FLOP, FLOP/s, fractions 0..1 (``scenarios.report`` converts for printing).
The runner computes what needs the model (FLOPs per iteration, memory) and passes it in, so this
module depends on the analysis only, not on the workload or the simulator.

A *link* here is any object with ``name``, ``nominal_capacity`` (bytes/s), ``timeline`` -- a step
function ``[(t_s, bytes_per_s), ...]`` whose value holds until the next point (zero before the
first) -- and optionally ``carried`` (bytes). ``hwmodel.fluid.Resource`` is one; plain namespaces do
as well. The plots draw the links this module ranks.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from scenarios.analysis import mfu_peak_dtype, overlap_stats

__all__ = [
    "BUSIEST_LINK_GROUPS", "LINK_GROUP_REL_TOL", "busiest_links", "link_capacity", "link_groups", "link_kind",
    "link_stats", "memory_dict",
    "parallel_dict", "peak_dtype_for", "run_metrics", "run_summary", "SUMMARY_KEYS", "unrecorded_utilisation",
]

BUSIEST_LINK_GROUPS = 10
"""Rows of the JSON's ``busiest_links``: groups of links with the same load, as the text report's
``name (+k)`` rows (one per kind where links of several kinds are loaded alike, :func:`link_groups`); each
row gives its first link's name, ``links`` (the number in the group), its ``kind`` (:func:`link_kind`) and
``capacity_Bps`` (nominal, per direction; what the utilisations are of)."""
LINK_GROUP_REL_TOL = 1e-9
"""Links whose bytes, mean and peak utilisation agree to this relative tolerance are one group."""


def peak_dtype_for(dtype: str) -> str:
    """The peak MFU and the report's "peak" are taken against for a training dtype: its own; the
    CUDA-core ``fp32`` peak for fp32, whose GEMMs trainsim runs at that rate (PyTorch's default
    ``torch.backends.cuda.matmul.allow_tf32 = False``); ``bf16`` for fp8 (see
    :func:`scenarios.analysis.mfu_peak_dtype`)."""
    return "fp32" if dtype == "fp32" else mfu_peak_dtype(dtype)


# ----------------------------------------------------------------------------------------------------
# Links


def link_stats(timeline: Sequence[tuple[float, float]], capacity: float,
               end_time_s: float) -> tuple[float, float, float]:
    """Integrate a step function over ``[0, end_time_s]``.

    Args:
        timeline: ``[(t_s, units_per_s)]``, each value holding until the next point; 0 before the first.
        capacity: nominal capacity (units/s) the utilisation is relative to.
        end_time_s: end of the window (s); the last value holds until then.

    Returns:
        ``(units carried, mean utilisation, peak utilisation)``; utilisations are fractions of
        ``capacity`` (mean over the whole window, peak over points inside it).
    """
    total = 0.0
    peak = 0.0
    for i, (t, u) in enumerate(timeline):
        if t >= end_time_s:
            break
        t_next = timeline[i + 1][0] if i + 1 < len(timeline) else end_time_s
        total += u * (min(t_next, end_time_s) - t)
        peak = max(peak, u)
    cap = capacity if capacity > 0 else 1.0
    mean = total / (cap * end_time_s) if end_time_s > 0 else 0.0
    return total, mean, peak / cap


def busiest_links(links: Iterable[Any], top: int, end_time_s: float) -> list[tuple[str, float, float, float]]:
    """The ``top`` busiest links: highest mean utilisation (carried bytes / capacity), then most bytes.

    Args:
        links: link objects (see module doc). ``carried`` is used when present, else the timeline's
            integral.
        top: how many to return.
        end_time_s: length of the run (s), the window of the mean utilisation.

    Returns:
        ``[(name, carried_bytes, mean_utilisation, peak_utilisation)]``, busiest first (ties by bytes, name);
        utilisations are fractions 0..1 of ``nominal_capacity``.
    """
    def carried_of(lk: Any) -> float:
        c = getattr(lk, "carried", None)
        return float(c) if c is not None else link_stats(lk.timeline, float(lk.nominal_capacity), end_time_s)[0]

    # busiest = highest mean utilisation (bytes / capacity): the bottlenecks, not merely the fattest
    # pipes; timelines are integrated only for the links returned
    def key(r: tuple[float, Any]) -> tuple[float, float, str]:
        cap = float(r[1].nominal_capacity) or 1.0
        return (-r[0] / cap, -r[0], r[1].name)

    # (heapq.nsmallest is sorted(...)[:top]; the key is a total order (names are unique), and a
    # 16,384-GPU cluster's report ranks tens of thousands of links for a few dozen rows)
    ranked = heapq.nsmallest(max(top, 0), ((carried_of(lk), lk) for lk in links), key=key)
    rows = []
    for carried, lk in ranked:
        _, mean, peak = link_stats(lk.timeline, float(lk.nominal_capacity), end_time_s)
        rows.append((lk.name, carried, mean, peak))
    return rows


def unrecorded_utilisation(carried: float, capacity: float, end_time_s: float) -> tuple[float, None]:
    """``(mean, peak)`` utilisation of a link that kept no load timeline: the mean is its ``carried`` bytes
    over ``capacity x end_time_s`` (what :func:`link_stats` integrates from a timeline), the peak unknown
    (``None``; ``[simulation] record_links = true`` records it)."""
    cap = capacity if capacity > 0 else 1.0
    return (carried / (cap * end_time_s) if end_time_s > 0 else 0.0), None


def link_groups(links: Iterable[Any], end_time_s: float, top: int,
                kind_of: Callable[[str], str] | None = None) -> list[tuple[str, int, float, float, float | None]]:
    """The ``top`` busiest *groups* of links: consecutive links (in :func:`busiest_links` order) with
    the same load (bytes, mean and peak utilisation equal to :data:`LINK_GROUP_REL_TOL` relative), as
    symmetric collectives produce, are one row; links that carried nothing are left out.

    Every link is ranked (by bytes, an attribute) and a group's count is the true number of its links,
    the last group's too. Timelines are integrated only for the links of the groups returned (and the
    one after), once per timeline object: the links of a link class (:mod:`hwmodel.link_classes`) share
    their representative's, so a class of thousands of links costs one integration.

    ``links`` may hold *bundles* (:class:`hwmodel.link_classes.LinkBundle`: ``count`` links named
    ``names()`` with one load, ``name`` the first of them by name), ranked as their links would be: a
    bundle's links sort next to each other unless another entry's load key is exactly theirs, and only
    such ties are ranked link by link (by name), so the rows are those of the links one by one.

    A link that keeps no load timeline (``[simulation] record_links = false``: only its ``carried``
    bytes) has its mean utilisation from its bytes and no peak (``None``): :func:`unrecorded_utilisation`.

    ``kind_of`` (a link's name -> its kind, :func:`link_kind`): a group whose links are of several kinds
    (a link class can hold NIC-leaf and leaf-spine links of one bandwidth loaded alike) is one row per
    kind, each named by its first link (the group's own where it is of that kind) and counting its own
    links, so that a row's kind is every one of its links' (:func:`_by_kind`); at most ``top`` rows.

    Returns:
        ``[(first link's name, number of links, bytes each, mean utilisation, peak utilisation or None)]``.
    """
    def carried_of(lk: Any) -> float:
        c = getattr(lk, "carried", None)
        return float(c) if c is not None else link_stats(lk.timeline, float(lk.nominal_capacity), end_time_s)[0]

    def key(r: tuple[float, Any]) -> tuple[float, float, str]:  # as busiest_links ranks
        cap = float(r[1].nominal_capacity) or 1.0
        return (-r[0] / cap, -r[0], r[1].name)

    # (mean, peak) by timeline object; the value holds the timeline, so its id is not reused meanwhile
    stats: dict[tuple[int, float], tuple[Any, float, float | None]] = {}

    def stats_of(lk: Any) -> tuple[float, float | None]:
        cap, timeline = float(lk.nominal_capacity), lk.timeline
        if not timeline:  # not recorded: the mean from the bytes, no peak
            return unrecorded_utilisation(carried_of(lk), cap, end_time_s)
        sk = (id(timeline), cap)
        if sk not in stats:
            stats[sk] = (timeline, *link_stats(timeline, cap, end_time_s)[1:])
        return stats[sk][1:]

    ranked = _untied(sorted(((c, lk) for lk in links if (c := carried_of(lk)) > 0), key=key), key, stats_of)
    groups: list[list] = []
    for carried, lk in ranked:
        mean, peak = stats_of(lk)
        g = groups[-1] if groups else None
        if g and (peak is None) == (g[4] is None) and all(
                math.isclose(a, b, rel_tol=LINK_GROUP_REL_TOL)
                for a, b in ((carried, g[2]), (mean, g[3]), (peak, g[4])) if a is not None and b is not None):
            g[1] += getattr(lk, "count", 1)
            g[5].append(lk)
            continue
        if len(groups) == top:
            break
        groups.append([lk.name, getattr(lk, "count", 1), carried, mean, peak, [lk]])
    if kind_of is None:
        return [tuple(g[:5]) for g in groups]
    return [row for g in groups for row in _by_kind(g, kind_of)][:top]


def _by_kind(group: list, kind_of: Callable[[str], str]) -> list[tuple[str, int, float, float, float | None]]:
    """A :func:`link_groups` group ``[name, count, bytes, mean, peak, members]`` as one row per kind of its
    links: the kind of the group's named link first (under that name), the others by their first link's
    name; a group of one kind is its one row, unchanged."""
    name, count, carried, mean, peak, members = group
    names: dict[str, list[str]] = {}
    for lk in members:
        for n in (lk.names() if getattr(lk, "count", 1) > 1 and hasattr(lk, "names") else [lk.name]):
            names.setdefault(kind_of(n), []).append(n)
    if len(names) == 1:
        return [(name, count, carried, mean, peak)]
    lead = kind_of(name)
    rows = [(name if kind == lead else min(ns), len(ns), carried, mean, peak) for kind, ns in names.items()]
    return sorted(rows, key=lambda r: (r[0] != name, r[0]))


def link_capacity(links: Sequence[Any], name: str) -> float:
    """Nominal capacity (bytes/s, per direction) of the link ``name`` among ``links`` (links or bundles,
    :func:`link_groups`' input: a bundle's link other than its first by name is found in its ``names()``)."""
    for lk in links:
        if lk.name == name:
            return float(lk.nominal_capacity)
    return float(next(lk.nominal_capacity for lk in links if name in getattr(lk, "names", list)()))


def link_kind(graph: Any, name: str, topology: Any = None) -> str:
    """What the link ``name`` (``"u->v"``, an edge of the topology ``graph``) connects: the edge's
    ``kind`` (``nvlink``: GPU to NVSwitch; ``pcie``: GPU or NIC to PCIe switch to CPU), with the
    fabric's ``ib`` edges told apart by their ends (:mod:`hwmodel.fabric`): ``nic`` (a NIC and its leaf
    switch) or the two switch tiers, ``leaf-spine``, ``spine-leaf``, ``spine-core``, ``core-spine``.
    ``topology``: the graph's :class:`~hwmodel.topology.Topology`, when given read so that no server made
    on demand is made (for the many links of a bundle)."""
    u, v = name.split("->", 1)
    if topology is not None:
        kind = str(topology.link_rows()[u][v].get("kind", "other"))
        if kind != "ib":
            return kind
        kinds = topology.device_kinds()
        if kinds[u] == "nic" or kinds[v] == "nic":
            return "nic"
    else:
        kind = str(graph._adj[u][v].get("kind", "other"))  # (networkx's plain dicts: off its views)
        if kind != "ib":
            return kind
    ends = graph.nodes[u], graph.nodes[v]
    if any(e.get("kind") == "nic" for e in ends):
        return "nic"
    return "-".join(str(e.get("tier", e.get("kind", "switch"))) for e in ends)


class _OneOf:
    """One link of a bundle, ranked on its own (:func:`_untied`)."""

    __slots__ = ("name", "_of")
    count = 1

    def __init__(self, name: str, of: Any) -> None:
        self.name, self._of = name, of

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._of, attr)


def _untied(ranked: list[tuple[float, Any]], key: Any, stats_of: Any) -> Iterator[tuple[float, Any]]:
    """``ranked`` (sorted by ``key``), lazily, with every run of entries whose load key (``key`` less the
    name) is exactly equal, that holds a bundle and whose entries differ in ``stats_of`` (mean, peak)
    replaced by its links one by one, sorted by name: the order of the links one by one. (A lone
    bundle's links are consecutive there; entries of equal bytes, mean and peak fall in one group
    whatever their order, the first by name leading it.)"""
    i, n = 0, len(ranked)
    while i < n:
        k = key(ranked[i])[:2]
        j = i + 1
        while j < n and key(ranked[j])[:2] == k:
            j += 1
        run = ranked[i:j]
        if j - i > 1 and any(hasattr(lk, "names") for _, lk in run) and len({stats_of(lk) for _, lk in run}) > 1:
            ones: list[tuple[float, Any]] = []
            for c, lk in run:
                if hasattr(lk, "names"):
                    ones += [(c, _OneOf(name, lk)) for name in lk.names()]
                else:
                    ones.append((c, lk))
            run = sorted(ones, key=lambda r: r[1].name)
        yield from run
        i = j


# ----------------------------------------------------------------------------------------------------
# The metrics dict


def memory_dict(mem: Any, gpu: Any) -> dict[str, Any]:
    """The JSON's ``memory``: a :class:`workload.memory.MemoryBreakdown` ``mem`` (bytes per GPU)
    against ``gpu``'s HBM, with the verdict line; once :func:`workload.allocator.with_framework` has
    set them, also the peak allocated and reserved bytes (PyTorch's ``max_memory_allocated`` /
    ``max_memory_reserved``), the framework's own memory and the usable HBM the verdict compares with.

    Two capacities, named by what they are: ``hbm_datasheet_bytes`` is the GPU's datasheet figure (H100
    SXM5: "80 GB", 80e9), ``usable_hbm_bytes`` what a process can allocate (``totalGlobalMem``: the
    datasheet's GB read as GiB, less the driver's share -- 85.0e9 on that H100; :mod:`workload.allocator`).
    ``verdict_need_bytes`` and ``verdict_capacity_bytes`` are the two figures the verdict compares (the
    device's use and the usable HBM once the framework's memory is set, else the tensors and the datasheet
    HBM), so a "fits" verdict always has need <= capacity in the JSON too. The two peaks are
    ``peak_allocated_bytes`` and ``peak_reserved_bytes``: every command's JSON (``run``, ``sweep``,
    ``search``) uses these names for these figures."""
    need, capacity, _ = mem.need_and_capacity(gpu)
    out = {"parameters_bytes": mem.parameters, "gradients_bytes": mem.gradients,
           "optimizer_states_bytes": mem.optimizer_states, "activations_bytes": mem.activations,
           "workspace_bytes": mem.workspace, "fp8_weights_bytes": mem.fp8_weights,
           "hbm_datasheet_bytes": gpu.hbm_capacity_bytes, "verdict_need_bytes": need,
           "verdict_capacity_bytes": capacity, "verdict": mem.verdict(gpu)}
    if getattr(mem, "usable_hbm", 0.0):  # framework memory (workload.allocator): new keys; old ones unchanged
        out.update({"gather_buffers_bytes": mem.gather_buffers, "cublas_workspace_bytes": mem.cublas_workspace,
                    "peak_allocated_bytes": mem.allocated, "fragmentation_bytes": mem.fragmentation,
                    "peak_reserved_bytes": mem.reserved, "cuda_context_bytes": mem.cuda_context,
                    "nccl_buffers_bytes": mem.nccl_buffers, "device_used_bytes": mem.device_used,
                    "usable_hbm_bytes": mem.usable_hbm})
        if mem.optimizer_step_grads:  # fp16: the optimizer step's fp32 gradient copies (new key, fp16 only)
            out["optimizer_step_grads_bytes"] = mem.optimizer_step_grads
        g, r = (mem.detail.get(k, 0) for k in ("deepspeed_gathered_elements", "deepspeed_gradient_elements"))
        if g + r:  # DeepSpeed ZeRO-3's two transient terms (workload.parallel.deepspeed_memory)
            out.update({"deepspeed_gathered_parameters_bytes": mem.gather_buffers * g / (g + r),
                        "deepspeed_unpartitioned_gradients_bytes": mem.gather_buffers * r / (g + r)})
    return out


def run_metrics(rep: Any, flops: tuple[float, float, str]) -> dict[str, Any]:
    """The metrics of a :class:`scenarios.runner.RunReport` (its ``metrics`` field; ``--json``).

    Args:
        rep: the run (``scenario``, ``prepared``, ``result``, ``build``, ``mode``, ``per_rank``,
            ``memory``: a memory estimate or ``None`` where the model's memory is not modelled).
        flops: ``(model FLOPs per iteration, hardware FLOPs incl. recomputation, formula used)``, as
            :func:`scenarios.runner.model_flops` gives them.

    Returns:
        A JSON-ready dict; times in s, throughputs per s, FLOP counts, memory in bytes, fractions 0..1.
    """
    prep, res, cfg = rep.prepared, rep.result, rep.prepared.config
    T = res.end_time_s
    mc = prep.model_cfg
    gpu = prep.topology.gpu_spec
    mem = rep.memory
    ranks = sorted(rep.per_rank)
    mean = {k: sum(getattr(rep.per_rank[r], k) for r in ranks) / len(ranks)
            for k in ("compute_s", "exposed_comm_s", "bubble_s", "idle_s")}
    ov = overlap_stats(res.events, rep.per_rank)
    bundles = res.cluster.link_bundles()
    graph, topo = res.cluster.topology.graph, res.cluster.topology

    def kinds(name: str) -> str:
        return link_kind(graph, name, topo)

    links = link_groups(bundles, T, BUSIEST_LINK_GROUPS, kinds)
    return {
        "scenario": rep.scenario.name,
        "iteration_time_s": T,
        **_throughput(T, cfg, mc, flops, gpu.peak_flops(peak_dtype_for(prep.dtype))),
        # the caching allocator's two peaks (torch.cuda.max_memory_allocated / max_memory_reserved)
        "peak_allocated_bytes": mem.allocated if mem is not None else None,
        "peak_reserved_bytes": mem.reserved if mem is not None else None,
        "oom": (not mem.fits(gpu)) if mem is not None else False,
        "memory": memory_dict(mem, gpu) if mem is not None else None,
        "breakdown": mean,
        "per_rank": {str(r): rep.per_rank[r].as_dict() for r in ranks},
        "overlap": {"comm_hidden_fraction": ov.comm_hidden_fraction, "compute_slowdown": ov.compute_slowdown},
        "busiest_links": [{"link": n, "links": k, "kind": kinds(n),
                           "capacity_Bps": link_capacity(bundles, n), "carried_bytes": b,
                           "mean_utilisation": m, "peak_utilisation": p} for n, k, b, m, p in links],
        "parallel": parallel_dict(cfg),
        "system": {"name": prep.topology.name, "gpus": cfg.world_size, "gpu": gpu.name,
                   "nodes": prep.topology.num_nodes},
        "model": getattr(mc, "name", "model"),
        "simulation": {"mode": rep.mode, "simulated_ranks": len(rep.build.programs),
                       "tasks": sum(len(p.tasks) for p in rep.build.programs.values()),
                       "fluid_solves": res.stats.get("fluid_solves", 0),
                       # null: every micro-batch simulated; scenarios.steady_state fills it when extrapolated
                       "steady_state": None},
    }


SUMMARY_KEYS = ("iteration_time_s", "tokens_per_s", "samples_per_s", "tflops_per_gpu", "mfu", "peak_allocated_bytes",
                "peak_reserved_bytes", "oom", "breakdown", "overlap", "busiest_links", "simulation", "warnings")
"""The keys of :func:`run_summary`: a run's figures without its per-rank rows and its memory breakdown."""


def run_summary(metrics: dict[str, Any]) -> dict[str, Any]:
    """The figures of a run's metrics (:func:`run_metrics`, ``run --json``) that another command's JSON
    reports per run (``search --json``'s ``simulated``): :data:`SUMMARY_KEYS`, with ``run``'s names and
    nesting (``breakdown.bubble_s``, ``busiest_links[].kind``, ``simulation.mode``), so that one figure has
    one name in every command's output. Keys the run does not have are left out."""
    return {k: metrics[k] for k in SUMMARY_KEYS if k in metrics}


def _throughput(T: float, cfg: Any, mc: Any, flops: tuple[float, float, str], peak_flops: float) -> dict[str, Any]:
    """Tokens (models with a sequence) and samples per second, TFLOP/s per GPU (hardware FLOPs) and MFU
    (model FLOPs against ``peak_flops``, FLOP/s); zeros for an empty iteration."""
    model_f, hw_f, formula = flops
    world, gbs = cfg.world_size, cfg.global_batch_size
    seq = getattr(mc, "seq_length", 1)
    return {
        "tokens_per_s": (gbs * seq / T if T else 0.0) if hasattr(mc, "seq_length") else None,
        "samples_per_s": gbs / T if T else 0.0,
        "tflops_per_gpu": hw_f / T / world / 1e12 if T else 0.0,
        "mfu": model_f / T / world / peak_flops if T else 0.0,
        "flops_formula": formula,
        "model_flops_per_iteration": model_f,
        "hardware_flops_per_iteration": hw_f,
    }


def parallel_dict(cfg: Any) -> dict[str, Any]:
    """The JSON's ``parallel``: the resolved :class:`workload.parallel.config.ParallelConfig`."""
    return {"tp": cfg.tp, "pp": cfg.pp, "dp": cfg.dp, "cp": cfg.cp, "ep": cfg.ep, "vpp": cfg.vpp,
            "micro_batch_size": cfg.micro_batch_size, "global_batch_size": cfg.global_batch_size,
            "num_microbatches": cfg.num_microbatches, "schedule": cfg.schedule,
            "recompute_granularity": cfg.recompute_granularity, "sequence_parallel": cfg.sequence_parallel,
            "zero_stage": cfg.effective_zero_stage,
            **({"recompute_method": cfg.recompute_method, "recompute_num_layers": cfg.recompute_num_layers}
               if getattr(cfg, "recompute_method", None) else {})}
