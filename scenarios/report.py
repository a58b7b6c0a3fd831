"""What ``trainsim run`` prints and writes: the text report, the metrics JSON, the trace and the plots.

Units at the edges only: the run's metrics are SI (seconds, bytes, FLOP/s, fractions); the printed
report converts to ms, GB, GB/s, TFLOP/s and percent. The JSON keeps SI, with unit-suffixed keys
where the runner gives them (``iteration_time_s``, ``peak_allocated_bytes``).

The JSON is reproducible: keys sorted, floats written with 12 significant digits (far below the
simulator's resolution, far above the last-bit noise of float summation order), byte counts (keys
ending ``_bytes``) as whole numbers, seconds (keys ending ``_s``) to the picosecond, and no wall-clock
times -- running one scenario twice gives byte-identical files. Every command's ``--json`` (``run``,
``sweep``, ``search``, ``synth``) is written by :func:`write_json`, so they share this formatting.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hwmodel.specs import get_switch
from scenarios.analysis import latency_bound
from scenarios.catalog import display_source
from scenarios.metrics import (
    link_capacity,
    link_groups,
    link_kind,
    link_stats,
    memory_dict,
    parallel_dict,
    peak_dtype_for,
    unrecorded_utilisation,
)

__all__ = [
    "JSON_FLOAT_DIGITS", "JSON_TIME_DECIMALS", "MAX_RANK_ROWS", "TRACE_MAX_LINKS", "format_memory_only",
    "format_report", "stable_json", "write_json", "write_plots", "write_trace",
]

JSON_FLOAT_DIGITS = 12
"""Significant digits of floats in the JSON outputs."""
JSON_TIME_DECIMALS = 12
"""Seconds in the JSON outputs are rounded to this many decimals (1 ps) before their significant digits: a
small time that is the difference of two iteration-long sums (a rank's idle time, 4e-6 s out of 1.5 s)
carries their last-bit noise (1e-16 s), which 12 significant digits of it would print (3.99999999989e-06)."""
MAX_RANK_ROWS = 16
"""The per-rank table shows at most this many ranks (the first and the last ones)."""
TRACE_MAX_LINKS = 16
"""Link counter tracks in ``--trace`` files: the busiest links only, to keep files small."""
_WALL_CLOCK_KEYS = ("wall_s", "wall_time_s")


def _round_floats(obj: Any, key: str = "") -> Any:
    """A copy of ``obj`` with floats rounded to :data:`JSON_FLOAT_DIGITS` significant digits (under a
    key ending ``_bytes``: to the nearest whole byte; ending ``_s``, seconds, first to
    :data:`JSON_TIME_DECIMALS` decimals), tuples as lists, wall-clock keys dropped, and non-finite floats
    as None (JSON has no NaN). ``key``: the key ``obj`` is the value of."""
    if isinstance(obj, bool) or obj is None or isinstance(obj, (int, str)):
        return obj
    if isinstance(obj, float):
        if not math.isfinite(obj):
            return None
        if key.endswith("_bytes"):  # a byte count: whole bytes (a model's bytes are sums of fractions)
            return round(obj)
        if key.endswith("_s") and not key.endswith("_per_s"):  # seconds: to the picosecond, then the digits
            obj = round(obj, JSON_TIME_DECIMALS) + 0.0  # (+ 0.0: -0.0 is 0)
        r = float(f"{obj:.{JSON_FLOAT_DIGITS}g}")
        return int(r) if r.is_integer() and abs(r) < 2**53 else r
    if isinstance(obj, Mapping):
        return {str(k): _round_floats(v, str(k)) for k, v in obj.items() if k not in _WALL_CLOCK_KEYS}
    if isinstance(obj, (list, tuple)):
        return [_round_floats(v, key) for v in obj]
    return str(obj)


def stable_json(doc: Any) -> str:
    """``doc`` as reproducible JSON text: sorted keys, rounded floats, one trailing newline."""
    return json.dumps(_round_floats(doc), sort_keys=True, indent=1, ensure_ascii=False) + "\n"


def write_json(path: str | Path, doc: Any) -> Path:
    """Write :func:`stable_json` of ``doc`` to ``path`` (parent folders created).

    Raises:
        ValueError: the file cannot be written (one line, for the CLI).
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(stable_json(doc), encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"cannot write {path}: {exc.strerror}") from None
    return path


# ----------------------------------------------------------------------------------------------------
# Text


def _ms(s: float) -> str:
    return f"{s * 1e3:,.2f} ms"


def _gb(b: float) -> str:
    return f"{b / 1e9:,.1f} GB"


def _pct(f: float) -> str:
    return f"{round(100 * f, 1) + 0.0:.1f} %"  # + 0.0: a tiny negative prints 0.0, not -0.0


def _parallel_line(p: Mapping[str, Any], stack: list[str] | None = None) -> str:
    parts = [f"TP {p['tp']}", f"PP {p['pp']}", f"DP {p['dp']}"]
    if p.get("cp", 1) > 1:
        parts.append(f"CP {p['cp']}")
    if p.get("ep", 1) > 1:
        parts.append(f"EP {p['ep']}")
    line = " x ".join(parts)
    extras = [f"schedule {p['schedule']}" + (f" (vpp {p['vpp']})" if p.get("vpp", 1) > 1 else "")
              if p["pp"] > 1 else "no pipeline"]  # (PP 1: Megatron's forward_backward_no_pipelining)
    extras.append(f"micro-batch {p['micro_batch_size']}, global batch {p['global_batch_size']} "
                  f"({p['num_microbatches']} micro-batch{'es' if p['num_microbatches'] != 1 else ''} per pipeline)")
    extras.append(f"recompute {p['recompute_granularity']}" + (
        f" ({p['recompute_method']}, {p['recompute_num_layers']} layers)" if p.get("recompute_method") else ""))
    if p.get("sequence_parallel"):
        extras.append("sequence parallel")
    if p.get("zero_stage"):
        extras.append(f"ZeRO stage {p['zero_stage']}")
    return line + "; " + ", ".join(extras + (stack or []))


def _stack_extras(cfg: Any, training: Mapping[str, Any]) -> list[str]:
    """The framework knobs that change the program beyond the parallel sizes (named as the report's
    reader would set them), for the Parallel line; none on a plain Megatron run."""
    out = []
    if getattr(cfg, "fsdp", False):
        out.append("FSDP (PyTorch)")
    if getattr(cfg, "zero_impl", "megatron") == "deepspeed":
        out.append("DeepSpeed ZeRO-3")
    if getattr(cfg, "tp_comm_overlap", False):
        out.append("TP comm overlap")
    if getattr(cfg, "async_tp", False):
        out.append("async TP")
    if training.get("compile"):
        out.append("torch.compile")
    if training.get("dtype") == "fp8":
        out.append(f"FP8 recipe {training.get('fp8_recipe', 'delayed')}")
    return out


def _header(scenario: Any, m: Mapping[str, Any] | None, prep: Any) -> list[str]:
    """Scenario, system, model and parallel lines (from the metrics when there are some)."""
    topo, cfg = prep.topology, prep.config
    lines = [f"Scenario    {scenario.name}  ({display_source(scenario.source)})"]
    if scenario.description:  # the file's words: they do not know the --set overrides
        lines.append(f"            {scenario.description}"
                     + ("  [the file's description, before the overrides below]" if getattr(scenario, "overrides", ())
                        else ""))
    if getattr(scenario, "overrides", ()):
        lines.append(f"Overrides   {', '.join(scenario.overrides)}")
    nic = f", {topo.nic_spec.name} NICs" if getattr(topo, "nic_spec", None) is not None else ""
    lines.append(f"System      {topo.name}: {topo.num_nodes} node(s) x {topo.gpus_per_node} GPUs = "
                 f"{cfg.world_size} x {topo.gpu_spec.name}{nic}")
    mc = prep.model_cfg
    shape = ""
    if hasattr(mc, "num_layers") and hasattr(mc, "hidden_size"):
        heads = f"{mc.num_attention_heads} heads"
        d = getattr(mc, "kv_channels", None)
        if d is not None and d * mc.num_attention_heads != mc.hidden_size:  # [model] head_dim: a*d != h
            heads += f" of head_dim {d}"
        shape = f": {mc.num_layers} layers, hidden {mc.hidden_size}, {heads}, sequence {mc.seq_length}"
    elif hasattr(mc, "summary"):  # a custom nn.Module (workload.custom)
        shape = f": {mc.summary}"
    lines.append(f"Model       {getattr(mc, 'name', 'model')}{shape}; {prep.dtype}")
    # the same line with or without a simulation (an OOM verdict's report showed no schedule, VPP or SP)
    par = m["parallel"] if m is not None else parallel_dict(cfg)
    lines.append(f"Parallel    {_parallel_line(par, _stack_extras(cfg, scenario.training))}")
    return lines


def _gather_part(mem: Mapping[str, Any], gather: float) -> str:
    """The ZeRO-3 transient term: DeepSpeed's gathered parameters and unpartitioned gradients at their
    joint peak, or FSDP's (and Megatron ZeRO-3's) gather buffers."""
    if "deepspeed_gathered_parameters_bytes" in mem:
        return (f", DeepSpeed gathered parameters {_gb(mem['deepspeed_gathered_parameters_bytes'])} and "
                f"unpartitioned gradients {_gb(mem['deepspeed_unpartitioned_gradients_bytes'])}")
    return f", FSDP gather buffers {_gb(gather)}" if gather else ""


def _memory_lines(mem: Mapping[str, Any] | None, oom: bool) -> list[str]:
    if mem is None:
        return ["Memory per GPU: not modelled for this model"]
    fp8 = mem.get("fp8_weights_bytes", 0.0)
    gather = mem.get("gather_buffers_bytes", 0.0)
    total = fp8 + gather + sum(mem[k] for k in ("parameters_bytes", "gradients_bytes", "optimizer_states_bytes",
                                                "activations_bytes", "workspace_bytes"))
    lines = [f"Memory per GPU (peak, busiest pipeline stage): {'OOM' if oom else 'fits'}",
             f"  parameters {_gb(mem['parameters_bytes'])}, gradients {_gb(mem['gradients_bytes'])}, "
             f"optimizer states {_gb(mem['optimizer_states_bytes'])}, activations {_gb(mem['activations_bytes'])}"
             + (f", fp8 weight copies {_gb(fp8)}" if fp8 else "")
             + (f", workspace {_gb(mem['workspace_bytes'])}" if mem["workspace_bytes"] else "")
             + _gather_part(mem, gather)]
    step_grads = mem.get("optimizer_step_grads_bytes", 0.0)
    if step_grads:  # fp16: the optimizer step is a second moment, without activations (workload.memory)
        lines.append(f"  at the optimizer step (no activations): + fp32 gradient copies {_gb(step_grads)}; "
                     f"the peak is the larger of the two moments")
    if "peak_reserved_bytes" in mem:  # the framework's memory (workload.allocator)
        lines += [f"  peak allocated {_gb(mem['peak_allocated_bytes'])} (tensors and cuBLAS workspace), peak "
                  f"reserved {_gb(mem['peak_reserved_bytes'])} (+ fragmentation {_gb(mem['fragmentation_bytes'])}); "
                  f"CUDA context {_gb(mem['cuda_context_bytes'])}, NCCL buffers {_gb(mem['nccl_buffers_bytes'])}",
                  f"  device {_gb(mem['device_used_bytes'])} of {_gb(mem['usable_hbm_bytes'])} usable HBM "
                  f"({100 * mem['device_used_bytes'] / mem['usable_hbm_bytes']:.0f} %; the datasheet's "
                  f"{_gb(mem['hbm_datasheet_bytes'])} read as GiB, less the driver's share)"]
    else:
        lines.append(f"  total {_gb(total)} of {_gb(mem['hbm_datasheet_bytes'])} HBM (datasheet) "
                     f"({100 * total / mem['hbm_datasheet_bytes']:.0f} %)")
    return [*lines, f"  verdict: {mem['verdict']}"]


def format_memory_only(prep: Any, memory: Any) -> str:
    """The report of a configuration that was not simulated because it does not fit in memory."""
    lines = _header(prep.scenario, None, prep)
    lines += ["", *_memory_lines(memory_dict(memory, prep.topology.gpu_spec), True), "",
              "Not simulated: the configuration does not fit in GPU memory (use --simulate-oom to simulate anyway)."]
    return "\n".join(lines)


def _rank_rows(per_rank: Mapping[str, Mapping[str, float]], T: float, max_rows: int) -> list[str]:
    ranks = sorted(per_rank, key=int)
    shown = ranks if len(ranks) <= max_rows else ranks[:max_rows // 2] + ranks[-(max_rows - max_rows // 2):]
    head = f"  {'rank':>6} {'compute':>11} {'exposed comm':>13} {'bubble':>11} {'idle':>11} {'busy %':>7}"
    lines = [head]
    for i, r in enumerate(shown):
        if i and int(r) != int(shown[i - 1]) + 1 and len(shown) < len(ranks) and i == max_rows // 2:
            lines.append(f"  {'...':>6}  ({len(ranks) - len(shown)} more ranks)")
        b = per_rank[r]
        busy = (b["compute_s"] + b["exposed_comm_s"]) / T if T else 0.0
        lines.append(f"  {r:>6} {_ms(b['compute_s']):>11} {_ms(b['exposed_comm_s']):>13} {_ms(b['bubble_s']):>11} "
                     f"{_ms(b['idle_s']):>11} {100 * busy:>6.1f}")
    return lines


def _link_lines(rep: Any, top: int) -> list[str]:
    # (once, a link class as one bundle: a large cluster's merges load tens of thousands of links)
    links = rep.result.cluster.link_bundles()
    topo = rep.result.cluster.topology
    graph = topo.graph

    def kind_of(name: str) -> str:
        return link_kind(graph, name, topo)

    groups = link_groups(links, rep.result.end_time_s, top, kind_of)  # (a mixed link class: one row per kind)
    if not groups:
        return ["  no link traffic"]
    lines = [f"  {'link':<34} {'kind':<10} {'links':>5} {'carried each':>13} {'capacity':>11} {'mean':>7} "
             f"{'peak':>7}"]
    caps: dict[str, float] = {}  # kind -> capacity of the links shown
    for name, n, carried, mean, peak in groups:  # kind and capacity as --json's busiest_links give them
        label = name if n == 1 else f"{name} (+{n - 1})"
        cap = link_capacity(links, name)
        kind = link_kind(graph, name)
        caps[kind] = cap
        peak_text = f"{100 * peak:>6.1f}%" if peak is not None else f"{'-':>7}"
        lines.append(f"  {label:<34} {kind:<10} {n:>5} {_gb(carried):>13} {cap / 1e9:>6.0f} GB/s "
                     f"{100 * mean:>6.1f}% {peak_text}")
    lines.append("  (+k): k more links with the same load; capacity per direction"
                 + ("; peak -: no load timeline kept ([simulation] record_links = false)"
                    if any(g[4] is None for g in groups) else ""))
    lines += _kind_lines(rep, links, caps)
    lines += _aggregate_lines(topo, caps)
    if rep.mode == "hierarchical":  # macro tasks carry time, not traffic (docs/DESIGN.md, hierarchical engine)
        lines.append("  (hierarchical mode: collectives inside a layer pass -- TP, CP -- are timed in its macro task "
                     "and put on no link; mode = \"symmetric\" puts them on the NVLink-domain links)")
    return lines


LINK_KIND_LABELS = {"nvlink": "NVLink (NVLink domain)", "pcie": "PCIe (GPU/NIC to switch)",
                    "nic": "network (NIC and leaf)", "leaf-spine": "fabric (leaf to spine)",
                    "spine-leaf": "fabric (spine to leaf)", "spine-core": "fabric (spine to core)",
                    "core-spine": "fabric (core to spine)"}
"""Text report labels of the link kinds (:func:`scenarios.metrics.link_kind`, as ``--json``'s
``busiest_links`` names them), in the order the per-kind lines show them."""


FABRIC_TIERS = (("leaf-spine", "spine-leaf"), ("spine-core", "core-spine"))
"""The fabric's switch-to-switch link kinds (each tier's two directions), whose one edge per switch pair
aggregates the pair's parallel cables (:mod:`hwmodel.fabric`)."""


def _aggregate_lines(topo: Any, caps: Mapping[str, float]) -> list[str]:
    """What a fabric tier's capacity shown (``caps``: kind -> capacity, per direction) aggregates: one edge
    per switch pair holds its parallel cables' summed bandwidth (:mod:`hwmodel.fabric`), ``capacity / port``
    cables of the fabric's port rate (the NIC-leaf link's, ``min(NIC, switch port)``); a fractional count is
    the uplink capacity (downlinks / oversubscription) split evenly over the switches above."""
    switch = topo.graph.graph.get("fabric_switch")
    if topo.nic_spec is None or not switch:
        return []
    port = min(topo.nic_spec.bandwidth_Bps, get_switch(switch).port_bandwidth_Bps)
    parts, fraction = [], False
    for up, down in FABRIC_TIERS:
        cap = caps.get(up, caps.get(down))
        if cap is not None and abs(cap / port - 1) > 1e-9:  # (one cable's edge aggregates nothing)
            n = cap / port
            whole = abs(n - round(n)) < 1e-9
            fraction |= not whole
            parts.append(f"{up} {cap / 1e9:.0f} GB/s = {n:.{0 if whole else 2}f} x {port / 1e9:.0f} GB/s")
    if not parts:
        return []
    return [f"  fabric capacities are per switch pair, its parallel cables aggregated: {'; '.join(parts)}"
            + (" (a fraction: the model spreads a switch's uplink capacity, downlinks / oversubscription, evenly "
               "over the switches above)" if fraction else "")]


def _kind_lines(rep: Any, links: list[Any], caps: dict[str, float] | None = None) -> list[str]:
    """The busiest link of each kind (:func:`scenarios.metrics.link_kind`) that carried traffic: NVLink-domain,
    NIC and fabric traffic apart, whichever dominates the table above (on an NVL72 the rack's NVLink is
    rarely the busiest).
    ``links``: the cluster's (``link_resources()``, or ``link_bundles()``: a bundle counts its links).
    Busiest as :func:`scenarios.metrics.busiest_links` ranks them, but the utilisation is integrated only
    for each kind's busiest link, not for every link."""
    topo = rep.result.cluster.topology
    graph, adj = topo.graph, topo.link_rows()  # (plain dicts: off networkx's views; no server made)
    end = rep.result.end_time_s
    first: dict[str, tuple[tuple[float, float, str], Any, float, float, str]] = {}  # kind -> its busiest link
    used: dict[str, int] = {}
    for lk in links:
        c = getattr(lk, "carried", None)
        carried = float(c) if c is not None else link_stats(lk.timeline, float(lk.nominal_capacity), end)[0]
        if carried <= 0:
            continue
        u, v = lk.name.split("->", 1)
        cap = adj[u][v]["bandwidth_Bps"]
        # a bundle's links, loaded alike, may be of several kinds (a class holds leaf -> spine and spine ->
        # leaf links of one bandwidth): each kind counts its own and may take the bundle as its busiest
        by_kind: dict[str, list[str]] = {}
        for name in (lk.names() if getattr(lk, "count", 1) > 1 else [lk.name]):
            by_kind.setdefault(link_kind(graph, name, topo), []).append(name)
        for kind, names in by_kind.items():
            used[kind] = used.get(kind, 0) + len(names)
            name = lk.name if lk.name in names else min(names)
            key = (-carried / (float(lk.nominal_capacity) or 1.0), -carried, name)  # busiest_links' order
            if kind not in first or key < first[kind][0]:
                first[kind] = (key, lk, carried, cap, name)
    if len(first) < 2:
        return []
    best = {kind: ((link_stats(lk.timeline, float(lk.nominal_capacity), end)[1] if lk.timeline else
                    unrecorded_utilisation(carried, float(lk.nominal_capacity), end)[0]), carried, name, cap)
            for kind, (_, lk, carried, cap, name) in first.items()}
    lines = ["  busiest link of each kind:"]
    of = "" if getattr(rep, "mode", "full") == "full" else " of the simulated ranks"  # (not a mirror's own links)
    for kind in sorted(best, key=lambda k: (list(LINK_KIND_LABELS).index(k) if k in LINK_KIND_LABELS else 9, k)):
        mean, carried, name, cap = best[kind]
        if caps is not None:
            caps.setdefault(kind, cap)
        lines.append(f"    {LINK_KIND_LABELS.get(kind, kind):<26} {name:<26} {_gb(carried):>10} "
                     f"{cap / 1e9:>6.0f} GB/s {100 * mean:>6.1f}%  ({used[kind]} such links{of} carried traffic)")
    return lines


def _plural(n: int, noun: str) -> str:
    """``1 rank``, ``2 ranks``."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _flop(x: float) -> str:
    for unit, scale in (("PFLOP", 1e15), ("TFLOP", 1e12), ("GFLOP", 1e9)):
        if x >= scale:
            return f"{x / scale:,.2f} {unit}"
    return f"{x:,.0f} FLOP"


def format_report(rep: Any, *, max_rank_rows: int = MAX_RANK_ROWS, top_links: int = 6) -> str:
    """The human-readable report of a :class:`scenarios.runner.RunReport`."""
    m = rep.metrics
    T = m["iteration_time_s"]
    gpu = rep.prepared.topology.gpu_spec
    dtype = rep.prepared.dtype
    peak_dtype = peak_dtype_for(dtype)
    peak = gpu.peak_flops(peak_dtype)
    if dtype == "fp8":
        peak_dtype += f"; FP8 GEMMs {gpu.peak_flops('fp8') / 1e12:.0f}"
    elif dtype == "fp32":
        peak_dtype += " CUDA cores: GEMMs without TF32, as PyTorch's default"
    lines = _header(rep.scenario, m, rep.prepared)
    if m.get("calibration"):
        cal = m["calibration"]
        lines.append(f"Calibration {cal['name']} ({cal['profile']}) on top of the shipped calibration.toml; "
                     + (f"changes {len(cal['changed'])} constant(s): {', '.join(cal['changed'][:6])}"
                        + (", ..." if len(cal["changed"]) > 6 else "") if cal["changed"] else
                        "changes nothing for this run's GPU (see the warnings)"))
    lines += [
        "",
        f"Iteration time   {_ms(T)}",
        (f"Throughput       {m['tokens_per_s']:,.0f} tokens/s" if m.get("tokens_per_s") is not None else
         f"Throughput       {m['samples_per_s']:,.1f} samples/s"),
        f"TFLOP/s per GPU  {m['tflops_per_gpu']:.1f} (hardware FLOPs, recomputation included; "
        f"peak {peak / 1e12:.{0 if peak >= 100e12 else 1}f} TFLOP/s {peak_dtype})",
        f"MFU              {_pct(m['mfu'])} (model FLOPs / iteration time / GPUs / peak)",
        f"FLOP formula     {m['flops_formula']}",
        f"                 model {_flop(m['model_flops_per_iteration'])}, hardware "
        f"{_flop(m['hardware_flops_per_iteration'])} per iteration",
        "",
        "Breakdown (mean over simulated ranks; the four parts add up to the iteration time)",
    ]
    labels = {"compute_s": "compute", "exposed_comm_s": "exposed communication", "bubble_s": "pipeline bubble",
              "idle_s": "idle"}
    for k, label in labels.items():
        v = m["breakdown"][k]
        lines.append(f"  {label:<22} {_ms(v):>12} {100 * v / T if T else 0.0:>6.1f} %")
    lines += _latency_lines(rep)
    sim = m["simulation"]
    world = m["system"]["gpus"]
    n_sim = sim["simulated_ranks"]
    note = "" if n_sim >= world else \
        f" ({_plural(n_sim, 'representative rank')} simulated; the others mirror {'it' if n_sim == 1 else 'them'})"
    lines += ["", f"Per rank{note}", *_rank_rows(m["per_rank"], T, max_rank_rows), ""]
    lines += _memory_lines(m["memory"], m["oom"])
    mirrored = "" if sim["simulated_ranks"] >= world else \
        " (links of simulated ranks, and links their mirrors share; a mirror's own links carry the same load)"
    lines += ["", f"Busiest links (by mean utilisation of nominal capacity over the iteration){mirrored}",
              *_link_lines(rep, top_links)]
    ov = m["overlap"]
    lines += [
        "",
        "Overlap",
        f"  communication hidden under compute  {_pct(ov['comm_hidden_fraction'])}",
        f"  compute slowed by contention        {_pct(ov['compute_slowdown'])} (SM and HBM sharing with "
        f"communication kernels, vs each kernel alone)",
        "",
        f"Simulation  mode {sim['mode']}" + _mode_why(rep)
        + f", {sim['simulated_ranks']} rank(s), {sim['tasks']:,} tasks, "
        f"{sim['fluid_solves']:,} fluid solves; wall time {rep.wall_s:.2f} s",
        *_steady_lines(sim),
    ]
    return "\n".join(lines)


def _latency_lines(rep: Any) -> list[str]:
    """A line per latency-bound collective of the lowest simulated rank (:func:`scenarios.analysis.
    latency_bound`), in the simulated run (the extrapolated one's own events where it is one)."""
    res = rep.simulated if getattr(rep, "simulated", None) is not None else rep.result
    if not rep.per_rank:
        return []
    lines = []
    for lb in latency_bound(res.events, min(rep.per_rank), res.end_time_s):
        i = lb.info
        names = lb.names[0] + (f" and {len(lb.names) - 1} more" if len(lb.names) > 1 else "")
        lines.append(f"  latency-bound: {names} ({lb.count} x {lb.op} over {i.ranks:,} ranks, {i.algorithm} "
                     f"{i.protocol}, {i.size_bytes / 1e6:,.1f} MB{' the last' if lb.count > 1 else ''}): "
                     f"{100 * lb.latency_s / lb.moving_s:.0f} % of {'its' if lb.count == 1 else 'their'} "
                     f"{_ms(lb.moving_s)} moving data is NCCL's latency term (many steps of small "
                     f"chunks), not bandwidth")
    return lines


def _mode_why(rep: Any) -> str:
    """`` (auto's choice: why)`` / `` (set by [simulation] mode)``: the mode line's reason
    (:func:`scenarios.modes.simulation_mode`)."""
    why = getattr(rep, "mode_reason", "")
    if rep.scenario.simulation.get("mode", "auto") != "auto":
        return " (set by [simulation] mode)"
    return f" (auto's choice: {why})" if why else " (auto's choice)"


def _steady_lines(sim: Mapping[str, Any]) -> list[str]:
    """The line on an extrapolated run (:mod:`scenarios.steady_state`); none where every micro-batch ran."""
    steady = sim.get("steady_state")
    if not steady:
        return []
    counts = steady["simulated_microbatches"]
    m2 = counts[-1]
    if len(counts) == 1:  # the period measured inside the run (steady_state.steady_window)
        what = (f"simulated {m2} of {steady['of']} micro-batches; the steady {steady['period']} period measured "
                f"over {steady['window_microbatches']} of them and extrapolated")
    else:
        what = f"simulated {counts[0]} and {m2} of {steady['of']} micro-batches; the steady {steady['period']} " \
               "period extrapolated"
    return [f"            {what} (tasks: the iteration's; --trace and --plots show the {m2}-micro-batch run)"]


# ----------------------------------------------------------------------------------------------------
# Files


def write_trace(rep: Any, path: str | Path, *, max_links: int = TRACE_MAX_LINKS) -> Path:
    """The run's Kineto/Chrome trace (Perfetto, chrome://tracing) with the busiest links as counter
    tracks. ``.json.gz`` is compressed. ``distributedInfo.world_size`` is the job's world size (the
    cluster's GPUs); ``trainsim.simulated_ranks`` the ranks whose GPUs the file holds (a symmetric or
    hierarchical run simulates a few and mirrors the others)."""
    from plots.chrome_trace import write_chrome_trace  # deferred: the plots package loads matplotlib

    res = getattr(rep, "simulated", None) or rep.result  # an extrapolated run: its larger simulated run
    # distributedInfo.world_size is the job's (every GPU of the cluster, as torch.distributed's); a
    # symmetric run simulates some ranks and mirrors the rest, so the ranks in the file are listed apart
    simulated = sorted({e.rank for e in res.events})
    meta = {"traceName": f"trainsim {rep.scenario.name}",
            "trainsim": {"scenario": rep.scenario.name, "iteration_time_s": res.end_time_s,
                         "mode": rep.mode, "simulated_ranks": simulated}}
    if rep.metrics.get("simulation", {}).get("steady_state"):  # only then: other traces keep their bytes
        meta["trainsim"]["steady_state"] = rep.metrics["simulation"]["steady_state"]
    try:
        return write_chrome_trace(path, res.events, link_series=res.cluster.link_resources(),
                                  max_links=max_links, metadata=meta, iterations=[(0.0, res.end_time_s)],
                                  world_size=rep.prepared.config.world_size,
                                  collective_dtype="bf16" if rep.prepared.dtype == "fp8" else rep.prepared.dtype)
    except OSError as exc:
        raise ValueError(f"cannot write {path}: {exc.strerror}") from None


def write_plots(rep: Any, directory: str | Path) -> list[Path]:
    """``gantt.png`` (timeline), ``links.png`` (busiest links over time) and ``breakdown.png`` (time per
    GPU) in ``directory``. Returns the paths."""
    # deferred: matplotlib is slow to import, and most runs draw nothing
    from plots.bars import plot_breakdown
    from plots.gantt import plot_gantt
    from plots.links import plot_link_utilisation

    d = Path(directory)
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"cannot create {d}: {exc.strerror}") from None
    res, m = getattr(rep, "simulated", None) or rep.result, rep.metrics
    p = m["parallel"]
    what = (f"{rep.scenario.name}: {m['model']} on {m['system']['gpus']} x {m['system']['gpu']}, "
            # no-break spaces inside "TP 8" etc.: a wrapped title keeps each axis with its size
            f"TP\u00a0{p['tp']} PP\u00a0{p['pp']}"
            + (f"\u00a0x\u00a0{p['vpp']} (interleaved)" if (p.get("vpp") or 1) > 1 else "")
            + f" DP\u00a0{p['dp']}" + "".join(f" {k.upper()}\u00a0{p[k]}" for k in ("cp", "ep") if (p.get(k) or 1) > 1))
    steady = m["simulation"].get("steady_state")
    shown = f" (the simulated {steady['simulated_microbatches'][-1]} of {steady['of']} micro-batches)" if steady else ""
    out = [d / "gantt.png", d / "links.png", d / "breakdown.png"]
    plot_gantt(res.events, out[0], title=f"Timeline -- {what}{shown}")
    plot_link_utilisation(res.cluster.link_resources(), out[1], end_time_s=res.end_time_s,
                          title=f"Busiest links -- {what}{shown}")
    # the breakdown is the iteration's: extrapolated from both simulated runs where steady_state applied
    extrapolated = (f" (extrapolated from the simulated {' and '.join(map(str, steady['simulated_microbatches']))}"
                    f" of {steady['of']} micro-batches)") if steady else ""
    plot_breakdown({int(r): v for r, v in m["per_rank"].items()}, out[2],
                   title=f"Time per GPU -- {what}{extrapolated}")
    return out
