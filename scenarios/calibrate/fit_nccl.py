"""Fit the NCCL constants of ``calibration.toml [nccl]`` to an nccl-tests run.

What the model calls a constant (:mod:`hwmodel.nccl.calibration`) is per GPU generation or per fabric,
not per system: the achieved NVLink fraction of the generation (``[nccl.nvlink_efficiency.<arch>]``,
fitted on one node), the achieved InfiniBand fraction (``ib_app_efficiency``, fitted on several nodes)
and the host enqueue cost of one thread driving several GPUs (``host_launch_s``, ``host_per_channel_s``,
fitted to sizes below 1 MiB when ``-g`` > 1). The profile records the system and group size the fit came
from. The bandwidth fraction is fitted to the larger half of the sizes of 64 MiB and above (bandwidth-bound
in NCCL's model: busbw is proportional to it there), as the median ratio of measured to simulated busbw,
twice (the second pass absorbs protocol switches); sizes from 1 MiB are then compared, every third one held
out of the fit. NCCL's algorithm choice stays the tuning model's (``trainsim nccl-tests --tuner-config``
replays another).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from hwmodel.calibration_overlay import Overlay, applied, merge
from hwmodel.nccl import calibration as nccl_cal
from hwmodel.nccl.engine import simulate_nccl_tests
from hwmodel.nccl.tuner import arch_of
from scenarios.calibrate import CalibrationInputError
from scenarios.calibrate.nccl_log import NcclLog

BANDWIDTH_BOUND_BYTES = 64 << 20
"""Sizes from here fit the bandwidth fraction."""
COMPARED_FROM_BYTES = 1 << 20
"""Sizes from here are compared (the acceptance band); every third of them is held out of the fit."""


@dataclass
class NcclFit:
    """Fitted ``[nccl]`` values and the per-size comparison."""

    sections: dict[str, Any]
    """The profile's ``[nccl]`` table."""
    changed: list[tuple[str, float, float]]
    """(dotted key, shipped, fitted)."""
    comparison: list[dict[str, Any]] = field(default_factory=list)
    """Per size: measured and simulated busbw, error, whether held out."""


def _simulate(topo: Any, log: NcclLog, gpus: list, sections: dict[str, Any]) -> dict[int, float]:
    overlay = Overlay("(fitting)", "fit", {"nccl": sections}, ())
    with applied(overlay):
        rows = simulate_nccl_tests(topo, log.collective, [r.size_bytes for r in log.rows],
                                   gpus_per_thread=log.gpus_per_thread, gpus=gpus)
    return {r.size_bytes: r.busbw_Bps for r in rows}


def fit_nccl(log: NcclLog, system: str) -> NcclFit:
    """Fit ``log`` on ``system`` (a ``trainsim list systems`` name).

    Raises:
        CalibrationInputError: the run does not fit the system (more ranks per node than it has GPUs), or
            its ``Rank`` lines name a GPU trainsim knows that is not the system's.
    """
    from scenarios.calibrate.pipeline import trace_gpu
    from scenarios.runner import build_topology

    topo = build_topology({"name": system, "nodes": log.nodes})
    known = trace_gpu(log.gpu_name) if log.gpu_name else None
    if known is not None and known != topo.gpu_spec.name:
        raise CalibrationInputError(f"{log.path}: ran on {log.gpu_name} ({known}); {system} has "
                                    f"{topo.gpu_spec.name}: give the --system the nccl-tests ran on")
    per_node = log.ranks // log.nodes
    if per_node > topo.gpus_per_node or per_node < 1:
        raise CalibrationInputError(f"{log.path}: {log.ranks} ranks on {log.nodes} node(s) do not fit {system} "
                                    f"({topo.gpus_per_node} GPUs per node)")
    gpus = [g for n in range(log.nodes) for g in topo.gpus_of_node(n)[:per_node]]
    shipped = dict(nccl_cal.nccl_calibration())
    spec = topo.gpu_spec
    sizes = sorted(r.size_bytes for r in log.rows if r.size_bytes >= COMPARED_FROM_BYTES)
    held = {s for i, s in enumerate(sizes) if i % 3 == 2}
    measured = {r.size_bytes: r for r in log.rows}
    fit_bw = [s for s in sizes if s >= BANDWIDTH_BOUND_BYTES and s not in held] or [s for s in sizes if s not in held]
    fit_bw = fit_bw[len(fit_bw) // 2:]  # the larger half: the asymptote, past any protocol or algorithm switch
    sections: dict[str, Any] = {}
    changed: list[tuple[str, float, float]] = []
    if log.nodes == 1:
        arch = arch_of(spec.compute_capability)
        line = spec.nvlink_bandwidth_per_link_Bps * spec.nvlink_links
        if line <= 0:
            raise CalibrationInputError(f"{system}: its GPUs have no NVLink to fit")
        before = nccl_cal.nvlink_efficiency_fit().get(arch, spec.nccl_nvlink_bandwidth_per_link_Bps
                                                     / spec.nvlink_bandwidth_per_link_Bps)
        eff = before
        for _ in range(2):
            sections = merge(sections, {"nvlink_efficiency": {arch: {"busbw_Bps": eff * line, "line_rate_Bps": line}}})
            sim = _simulate(topo, log, gpus, sections)
            if fit_bw:
                eff = min(eff * statistics.median(measured[s].busbw_Bps / sim[s] for s in fit_bw), 1.0)
        sections = merge(sections, {"nvlink_efficiency": {arch: {"busbw_Bps": eff * line, "line_rate_Bps": line}}})
        changed.append((f"nccl.nvlink_efficiency.{arch}", before, eff))
    else:
        before = float(shipped["ib_app_efficiency"])
        eff = before
        for _ in range(2):
            sections["ib_app_efficiency"] = eff
            sim = _simulate(topo, log, gpus, sections)
            if fit_bw:
                eff = min(eff * statistics.median(measured[s].busbw_Bps / sim[s] for s in fit_bw), 1.0)
        sections["ib_app_efficiency"] = eff
        changed.append(("nccl.ib_app_efficiency", before, eff))
    small = [r for r in log.rows if r.size_bytes < COMPARED_FROM_BYTES]
    if log.gpus_per_thread > 1 and small:
        sim_t = {s: s / bw for s, bw in _simulate(topo, log, gpus, sections).items() if bw > 0}
        ratio = statistics.median(r.size_bytes / r.busbw_Bps / sim_t[r.size_bytes] for r in small
                                  if r.busbw_Bps > 0 and r.size_bytes in sim_t)
        for key in ("host_launch_s", "host_per_channel_s"):
            sections[key] = float(shipped[key]) * ratio
            changed.append((f"nccl.{key}", float(shipped[key]), sections[key]))
        sections["host_fit_gpus"] = int(shipped["host_fit_gpus"])
    sim = _simulate(topo, log, gpus, sections)
    comparison = [{"size_bytes": s, "measured_busbw_GBps": measured[s].busbw_Bps / 1e9,
                   "simulated_busbw_GBps": sim[s] / 1e9, "error": sim[s] / measured[s].busbw_Bps - 1,
                   "held_out": s in held} for s in sorted(measured) if measured[s].busbw_Bps > 0]
    return NcclFit(sections, changed, comparison)
