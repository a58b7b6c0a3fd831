"""What-ifs that change nothing: notes for the report when a ``[system]`` or ``[model]`` key has no effect.

A user who sets a faster NIC, an oversubscription or a GPU field expects the iteration to change; when
the hardware model makes the key a no-op, the report says so (``warnings`` in the JSON, present only
when there is one) and names the key that would make it count.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np

from hwmodel.power import sustained_clock_fraction
from hwmodel.specs import get_switch
from hwmodel.topology import Topology, build_system
from scenarios.scenario import sp_turned_off

__all__ = ["FABRIC_KEYS_READ", "UNUSED_GPU_FIELDS", "model_notes", "parallel_notes", "tp_span_notes", "what_if_notes"]

UNUSED_GPU_FIELDS = {
    "boost_clock_hz": "the cost model takes peaks in FLOP/s (tensor_flops, fp32_flops), not the clock",
    "l2_bytes": "the cost model has no L2 cache",
    "pcie_bandwidth_Bps": "PCIe links run at the node's PCIe generation (the system's), not the GPU's figure",
    "pcie_generation": "PCIe links run at the node's PCIe generation (the system preset's), not the GPU's",
    "nvlink_generation": "NVLink runs at nvlink_links x nvlink_bandwidth_per_link_Bps through the system's "
                         "NVSwitch; set those for a faster NVLink",
}
"""GPUSpec fields no part of a scenario's simulation reads (``grep`` of hwmodel/, workload/, scenarios/; a
scenario's node is a system's, which names its NVSwitch and PCIe generation), and why."""


def what_if_notes(system: dict[str, Any], topology: Topology, base_dir: str | Path | None = None,
                  copies_requested_peak: int | None = None, simulation: dict[str, Any] | None = None) -> list[str]:
    """One line per ``[system]`` key of this scenario that has no effect on the simulation (a NIC faster than
    the switch port, an oversubscription no traffic crosses, a pod holding every leaf, unused GPU fields;
    ``spines`` or, with the ``simulation`` table, ``nccl_ib_qps_per_connection`` where no traffic crosses a
    spine; with ``copies_requested_peak``, the run's :attr:`hwmodel.runtime.Runtime.copies_requested_peak`, a
    ``copy_engines`` that no copy waited for), and a ``spines`` that does not divide a leaf's uplinks."""
    notes = _nic_note(system, topology) + _oversubscription_note(system, topology) + _pod_note(system, topology)
    notes += _fabric_key_notes(system, topology) + _spine_traffic_notes(system, simulation or {}, topology)
    notes += _spine_split_note(system, topology)
    if system.get("gpu_overrides"):
        notes += _unused_gpu_notes(system, topology, base_dir, copies_requested_peak)
    return notes


def _nic_note(system: dict, topo: Topology) -> list[str]:
    nic = topo.nic_spec
    switch_name = topo.graph.graph.get("fabric_switch")
    if nic is None or not switch_name or topo.num_nodes < 2 or topo.graph.graph.get("fabric") == "none":
        return []
    port = get_switch(switch_name).port_bandwidth_Bps
    if nic.bandwidth_Bps <= port:
        return []
    return [f"NIC {nic.name} ({nic.bandwidth_Bps * 8 / 1e9:g} Gb/s) is faster than a {switch_name} switch port "
            f"({port * 8 / 1e9:g} Gb/s): every NIC link runs at the switch port's rate; set [system] fabric_switch "
            f"to a faster switch (e.g. Q3400) for the NIC to count"]


def _oversubscription_note(system: dict, topo: Topology) -> list[str]:
    k = float(system.get("oversubscription", 1.0))
    if k == 1:
        return []
    if topo.num_nodes < 2:  # (no fix to suggest: a leaf's uplinks carry only inter-node traffic)
        return [f"oversubscription = {k:g} has no effect: one node, no inter-node traffic (its GPUs talk over NVLink)"]
    g = topo.graph
    fabric = g.graph.get("fabric")
    if fabric == "fat_tree":
        leaves = len(_switches(topo, "leaf"))
        if leaves > 1:
            return []
        return [f"oversubscription = {k:g} has no effect: all {topo.num_nodes} node(s) sit under one leaf switch, "
                f"so no traffic reaches the spines; set [system] nodes_per_leaf below {topo.num_nodes}"]
    su = g.graph.get("su_size")
    if fabric == "rail_optimized" and su and topo.num_nodes <= su:
        return [f"oversubscription = {k:g} has (almost) no effect: all {topo.num_nodes} node(s) are in one "
                f"scalable unit (su_size = {su}), so rail-aligned traffic stays under the leaves; set [system] "
                f"su_size below {topo.num_nodes} (or fabric = \"fat_tree\" with nodes_per_leaf) to cross the spines"]
    return []


def _switches(topo: Topology, tier: str) -> list[str]:
    """The fabric's switches of ``tier`` (leaf, spine, core): the switches alone are read, not every device."""
    return topo.nodes_of_kind("ib_switch", tier=tier)


def _pod_note(system: dict, topo: Topology) -> list[str]:
    """A pod that holds every leaf: ``leaves_per_pod`` (the scenario's) or ``core_oversubscription`` (the
    scenario's, over a system preset's pods) then builds no core tier to oversubscribe."""
    g = topo.graph
    per_pod = system.get("leaves_per_pod", g.graph.get("leaves_per_pod"))
    core = system.get("core_oversubscription")
    if per_pod is None or (system.get("leaves_per_pod") is None and (core is None or float(core) == 1)):
        return []
    leaves = len(_switches(topo, "leaf"))
    if _switches(topo, "core"):
        return _last_pod_note(g, int(per_pod), leaves)
    if system.get("leaves_per_pod") is None:  # the preset's pods; the scenario set only the core's ratio
        return [f"core_oversubscription = {float(core):g} has (almost) no effect: all {topo.num_nodes} node(s) "
                f"({leaves} leaf switch(es)) are in one pod (leaves_per_pod = {per_pod}), so no traffic reaches "
                f"the core; {_more_pods_hint(g, leaves)} for traffic to cross the core"]
    tail = f", so core_oversubscription = {core:g} has no effect" if core is not None else ""
    return [f"leaves_per_pod = {per_pod} covers all {leaves} leaf switch(es): one pod, no core tier{tail}; "
            f"{_more_pods_hint(g, leaves)} for traffic to cross the core"]


def _last_pod_note(g: Any, per_pod: int, leaves: int) -> list[str]:
    """An uneven last pod (``leaves_per_pod`` not dividing the leaves, :func:`hwmodel.fabric._add_pods`): it
    gets a full pod's spines and spine-core cabling for fewer leaves (as a partly filled scalable unit keeps
    its leaves' full uplinks), so each of its leaves has ``leaves_per_pod / k`` times a full pod's leaf's
    share of the core."""
    last = leaves % per_pod
    if not last:
        return []
    pods = -(-leaves // per_pod)
    su = ""
    if g.graph.get("fabric") == "rail_optimized":
        sus = {d.get("su") for _, d in g.nodes(data=True) if d.get("tier") == "leaf"}
        rails = leaves // max(1, len(sus))
        su = f" ({last // rails} scalable unit{'s' if last // rails != 1 else ''})"
    return [f"the last of {pods} pods has {last} leaf switch(es){su}, not leaves_per_pod = {per_pod} ({leaves} "
            f"leaves): its spines keep a full pod's cabling to the core, {per_pod / last:.3g}x the core bandwidth "
            f"per leaf of a full pod"]


def _more_pods_hint(g: Any, leaves: int) -> str:
    """What would give the fabric a second pod: fewer leaves a pod (a rail fabric's pods are whole
    scalable units, :func:`hwmodel.fabric.rail_optimized`), or more leaves first."""
    if g.graph.get("fabric") == "rail_optimized":
        rails = leaves // max(1, len({d.get("su") for _, d in g.nodes(data=True) if d.get("tier") == "leaf"}))
        if leaves > rails:
            return f"set [system] leaves_per_pod to a multiple of the {rails} rail leaves below {leaves}"
        return (f"the nodes fill one scalable unit ({rails} rail leaves); set [system] su_size below the node count "
                f"and leaves_per_pod = {rails} (one SU a pod)")
    if leaves > 1:
        return f"set [system] leaves_per_pod below {leaves}"
    return "spread the nodes over leaves (nodes_per_leaf) and set leaves_per_pod below their number"


FABRIC_KEYS_READ = {
    "rail_optimized": ("oversubscription", "su_size", "spines", "leaves_per_pod", "core_oversubscription"),
    "fat_tree": ("oversubscription", "nodes_per_leaf", "spines", "leaves_per_pod", "core_oversubscription"),
    "single_switch": (),
    "none": (),
}
"""The ``[system]`` fabric keys each fabric reads (:func:`hwmodel.fabric.build_cluster`); the others it ignores."""

_HOW_LEAVES_FILL = {
    "rail_optimized": "NIC r of every node of a scalable unit goes to that unit's rail-r leaf (su_size nodes a "
                      "leaf); set su_size, or fabric = \"fat_tree\" for leaves of whole nodes",
    "fat_tree": "leaves take whole nodes in blocks of nodes_per_leaf; set that instead",
    "single_switch": "one switch joins every NIC, with no leaves or spines; set fabric = \"fat_tree\" or "
                     "\"rail_optimized\" for a tree",
    "none": "no fabric joins the servers",
}


def _fabric_key_notes(system: dict, topo: Topology) -> list[str]:
    """A ``[system]`` fabric key the scenario sets that its fabric does not read (``nodes_per_leaf`` on a
    rail-optimised fabric, ``su_size`` on a fat tree, any on a single switch): said, not ignored silently.
    (``oversubscription`` and ``leaves_per_pod`` on a single switch are refused by the fabric.)"""
    fabric = topo.graph.graph.get("fabric")
    if fabric not in FABRIC_KEYS_READ:
        return []
    keys = [k for k in ("nodes_per_leaf", "su_size", "spines", "core_oversubscription")
            if k in system and k not in FABRIC_KEYS_READ[fabric]]
    return [f"[system] {k} = {system[k]} changes nothing on fabric = \"{fabric}\": {_HOW_LEAVES_FILL[fabric]}"
            for k in keys]


def _spine_traffic_notes(system: dict, simulation: dict, topo: Topology) -> list[str]:
    """``[system] spines``, ``[simulation] nccl_ib_qps_per_connection`` and ``nccl_ib_adaptive_routing``
    (both only split traffic over the spines' paths, :mod:`hwmodel.ecmp`) where no traffic crosses a
    spine: one node (its GPUs talk over NVLink), one fat-tree leaf, one switch, one spine (for the QPs and
    the adaptive routing), and -- almost -- one rail-optimised scalable unit, whose rail-aligned traffic
    stays under its leaves. (``spines`` on a fabric without
    spines is :func:`_fabric_key_notes`'.)"""
    g = topo.graph.graph
    fabric = g.get("fabric")
    keys = [f"[system] spines = {system['spines']}"] if "spines" in system and fabric in FABRIC_KEYS_READ and \
        "spines" in FABRIC_KEYS_READ[fabric] else []
    qps = simulation.get("nccl_ib_qps_per_connection", 1)
    if qps != 1:
        keys.append(f"[simulation] nccl_ib_qps_per_connection = {qps}")
    if simulation.get("nccl_ib_adaptive_routing"):
        keys.append("[simulation] nccl_ib_adaptive_routing = true")
    if not keys:
        return []
    spines = _switches(topo, "spine")
    if topo.num_nodes < 2 or fabric == "none":
        why = "changes nothing here: one node, no inter-node traffic (its GPUs talk over NVLink)"
    elif fabric == "single_switch":
        why = "changes nothing here: one switch joins every NIC, no traffic crosses a spine"
    elif fabric == "fat_tree" and len(_switches(topo, "leaf")) < 2:
        why = (f"changes nothing here: all {topo.num_nodes} nodes sit under one leaf switch, no traffic crosses "
               f"a spine; set [system] nodes_per_leaf below {topo.num_nodes}")
    elif fabric == "rail_optimized" and g.get("su_size") and topo.num_nodes <= g["su_size"]:
        why = (f"changes (almost) nothing here: all {topo.num_nodes} nodes are in one scalable unit (su_size = "
               f"{g['su_size']}), so rail-aligned traffic stays under the leaves and only traffic between rails "
               f"crosses a spine; set [system] su_size below {topo.num_nodes} to cross the spines")
    elif len(spines) == 1 and not _switches(topo, "core"):
        keys = [k for k in keys if k.startswith("[simulation]")]
        why = "changes nothing here: with one spine every sub-flow of a connection takes the same path"
    else:
        return []
    return [f"{k} {why}" for k in keys]


def _spine_split_note(system: dict, topo: Topology) -> list[str]:
    """A ``[system] spines`` that does not divide a leaf's (whole) uplink count: the model splits the leaf's
    uplink capacity evenly over the spines (ONE edge each, :mod:`hwmodel.fabric`), which no cabling does;
    a fabric engineer cables the same number of uplinks to every spine, so the note names those counts."""
    n, up = system.get("spines"), topo.graph.graph.get("leaf_uplink_ports")
    if not isinstance(n, int) or up is None or not float(up).is_integer() or int(up) % n == 0:
        return []
    up = int(up)
    low, high = topo.graph.graph.get("spines_allowed", (1, up))
    even = [str(d) for d in range(low, high + 1) if up % d == 0]
    q, r = divmod(up, n)
    return [f"[system] spines = {n} does not divide a leaf's {up} uplinks: the model gives each leaf-spine link "
            f"{up}/{n} = {up / n:.3g} uplinks' capacity, as if a cable could be split; a real leaf cables {q + 1} "
            f"to {r} spine(s) and {q} to the other {n - r}, whose links fill first under ECMP's equal shares, so "
            f"this reads fast; spines that cable evenly here: {', '.join(even) or 'none'}"]


def _unused_gpu_notes(system: dict, topo: Topology, base_dir: str | Path | None,
                      copies_requested_peak: int | None) -> list[str]:
    from scenarios.runner import system_gpu  # deferred: the runner imports this module's caller

    base = system_gpu({**system, "gpu_overrides": {}}, base_dir) or build_system(system["name"], 1).gpu_spec
    gpu = topo.gpu_spec
    notes = [f"[system] gpu_overrides {name}: changes nothing, {why}"
             for name, why in UNUSED_GPU_FIELDS.items() if getattr(base, name) != getattr(gpu, name)]
    if base.nvlink_bandwidth_per_link_Bps != gpu.nvlink_bandwidth_per_link_Bps and \
            base.nccl_nvlink_bandwidth_per_link_Bps == gpu.nccl_nvlink_bandwidth_per_link_Bps:
        notes.append(f"[system] gpu_overrides nvlink_bandwidth_per_link_GBps: collectives still run at most at NCCL's "
                     f"per-link figure for this GPU generation, nccl_nvlink_bandwidth_per_link_GBps = "
                     f"{gpu.nccl_nvlink_bandwidth_per_link_Bps / 1e9:g} (NCCL's tuner table, src/graph/topo.h); "
                     f"override it in proportion for a faster NVLink generation (or raise nvlink_links)")
    power_changed = (base.tdp_w, base.power_limit_w) != (gpu.tdp_w, gpu.power_limit_w)
    if power_changed and sustained_clock_fraction(base) == sustained_clock_fraction(gpu):
        notes.append(f"[system] gpu_overrides tdp_W/power_limit_W: changes nothing, the clock stays at "
                     f"{100 * sustained_clock_fraction(gpu):.3g} % of the rated clock (only a power_limit_W below "
                     f"tdp_W lowers it; the datasheet peaks are quoted at the rated power)")
    if copies_requested_peak is not None and base.copy_engines != gpu.copy_engines and \
            copies_requested_peak <= min(base.copy_engines, gpu.copy_engines):
        why = (f"no copy ever waited for one: at most {copies_requested_peak} "
               f"cop{'y' if copies_requested_peak == 1 else 'ies'} in flight on a GPU"
               if copies_requested_peak else "this run has no copy-engine work (peer, host or on-GPU Memcpy "
                                             "tasks: async TP's shard copies, userbuffers)")
        notes.append(f"[system] gpu_overrides copy_engines: changes nothing, {why}")
    return notes


def model_notes(model: Any) -> list[str]:
    """One line per ``[model]`` attention key of this scenario that changes nothing: a sliding window
    under the unfused (math) attention, one (with its sinks) no shorter than the sequence, or one that
    no layer uses."""
    window = getattr(model, "sliding_window", None)
    if window is None:
        return []
    if getattr(model, "attention_backend", "") == "unfused":
        return [f"[model] sliding_window = {window} with attention_backend = \"unfused\": the math path computes "
                f"every score and masks it, so the window changes neither time nor memory; a flash backend "
                f"skips the masked tiles"]
    seq, sinks = int(model.seq_length), int(getattr(model, "attention_sinks", 0))
    if window + sinks >= seq:
        what = f"sliding_window = {window}" + (f" + attention_sinks = {sinks}" if sinks else "")
        return [f"[model] {what} >= seq_length = {seq}: every query already sees all its keys, so the window "
                f"changes nothing; set it below seq_length for local attention"]
    if not any(model.layer_window(i) for i in range(int(model.num_layers))):
        return [f"[model] sliding_window = {window}: no layer uses it (sliding_window_pattern / window_layers "
                f"make every layer global)"]
    return []


def parallel_notes(config: Any, parallel: dict[str, Any] | None = None) -> list[str]:
    """One line per ``[parallel]`` / recompute key that changes nothing: a ``rank_order`` that orders the axes
    of size > 1 (those that hold more than one rank) as the default does, so every rank keeps its groups;
    ``recompute_method = "block"`` over 0 layers (Megatron checkpoints no layer: no recomputation);
    ``overlap_p2p_comm = false`` without pipeline parallelism (there are no pipeline exchanges); with the
    scenario's ``[parallel]`` table, ``sequence_parallel = true`` at TP 1, turned off
    (:func:`scenarios.scenario.sp_turned_off`)."""
    notes = []
    if parallel is not None and sp_turned_off(parallel):
        notes.append("[parallel] sequence_parallel = true with tensor_model_parallel_size = 1: turned off, as "
                     "Megatron-LM does (\"Disabling sequence parallelism because tensor model parallelism is "
                     "disabled\"): there is no tensor-parallel group to split the sequence over")
    if getattr(config, "overlap_p2p_comm", True) is False and getattr(config, "pp", 1) == 1:
        notes.append("[parallel] overlap_p2p_comm = false changes nothing without pipeline parallelism "
                     "(pipeline_model_parallel_size = 1: no pipeline exchanges)")
    if getattr(config, "recompute_method", None) == "block" and getattr(config, "recompute_num_layers", None) == 0:
        notes.append("recompute_method = \"block\" with recompute_num_layers = 0 checkpoints no layer: time and "
                     "memory are those of recompute_granularity = \"none\"")
    return notes + _rank_order_notes(config)


def tp_span_notes(config: Any, gpus_per_node: int, model: Any = None) -> list[str]:
    """A tensor-parallel group placed across servers (``tensor_model_parallel_size`` not dividing the node's
    GPUs, e.g. TP 4 on 6-GPU nodes or TP 8 on 4-GPU ones, or ``tp`` not first in ``rank_order``): its
    per-layer collectives then cross the NIC instead of NVLink. Megatron-LM and torchtitan allow it, so it is
    a note, not a refusal. Ranks sit on servers in rank order (rank r on server r // gpus_per_node), as the
    runner places them; the count is closed form over the ranks (numpy), so a 131,072-GPU run pays ~1 ms.
    With ``model``, the TP sizes the note suggests are those that also pass
    :meth:`~workload.parallel.config.ParallelConfig.validate_model` (heads, groups, MLP width, vocabulary)."""
    tp, world = int(getattr(config, "tp", 1)), int(getattr(config, "world_size", 1))
    if tp <= 1 or world <= gpus_per_node:
        return []
    stride = 1  # rank distance between TP neighbours: the sizes of the axes placed before tp
    for axis in str(config.rank_order).split("-"):
        if axis == "tp":
            break
        stride *= {"cp": config.cp, "dp": config.dp, "pp": config.pp}.get(axis, 1)
    ranks = np.arange(world)
    first = ranks - (ranks // stride) % tp * stride  # the group's first rank
    split = np.unique(first[first // gpus_per_node != ranks // gpus_per_node])
    if not len(split):
        return []
    group = [int(split[0]) + k * stride for k in range(tp)]
    fits = [d for d in range(2, gpus_per_node + 1) if gpus_per_node % d == 0 and _tp_fits(config, d, model)] or [1]
    return [f"[parallel] tensor_model_parallel_size = {tp} on {gpus_per_node}-GPU servers: {len(split)} of "
            f"{world // tp} TP groups span servers (e.g. ranks {group[0]}..{group[-1]} on servers "
            f"{group[0] // gpus_per_node}..{group[-1] // gpus_per_node}), so their per-layer all-reduce / "
            f"all-gather / reduce-scatter cross the NIC instead of NVLink -- allowed, but almost always a "
            f"mistake; a TP size that divides gpus_per_node ({', '.join(map(str, fits))}), with tp first in "
            f"rank_order, keeps every group in one server"]


def _tp_fits(config: Any, tp: int, model: Any) -> bool:
    """Whether TP size ``tp`` passes ``config``'s own checks and :meth:`validate_model` (no ``model``: yes)."""
    if model is None or not dataclasses.is_dataclass(config):
        return True
    try:
        dataclasses.replace(config, tensor_model_parallel_size=tp).validate_model(model)
    except (ValueError, TypeError):
        return False
    return True


def training_notes(training: Any, config: Any) -> list[str]:
    """``[training] compile = true`` outside torchtitan's per-op SAC: the kernels fuse (time changes) but the
    memory model keeps eager's saved activations -- what AOTAutograd's partitioner saves is modelled under
    ``recompute_granularity = "selective_op"`` only (:func:`workload.parallel.sac.op_sac_bytes`)."""
    if training.get("compile", False) and getattr(config, "recompute_granularity", "none") != "selective_op":
        return ["[training] compile = true changes time (fused kernels) but not memory here: the memory model "
                "keeps eager's saved activations; torch.compile's saved set is modelled under "
                "recompute_granularity = \"selective_op\" only"]
    return []


def _rank_order_notes(config: Any) -> list[str]:
    order = getattr(config, "rank_order", None)
    default = type(config).rank_order if hasattr(type(config), "rank_order") else None
    if not order or not isinstance(default, str) or order == default:
        return []
    sizes = {"tp": config.tp, "cp": config.cp, "ep": config.ep, "dp": config.dp, "pp": config.pp}
    used = [a for a in order.split("-") if sizes.get(a, 1) > 1]
    if used != [a for a in default.split("-") if sizes.get(a, 1) > 1]:
        return []
    return [f"[parallel] rank_order = \"{order}\" places ranks as the default \"{default}\" does: only "
            f"{', '.join(used) or 'no axis'} hold(s) more than one rank, in the same order, so no group changes"]
