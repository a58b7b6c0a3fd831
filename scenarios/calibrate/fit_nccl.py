"""Fit the NCCL constants of ``calibration.toml [nccl]`` to an nccl-tests run.

What the model calls a constant (:mod:`hwmodel.nccl.calibration`) is per GPU generation or per fabric,
not per system: the achieved NVLink fraction of the generation (``[nccl.nvlink_efficiency.<arch>]``,
fitted on one node), the achieved InfiniBand fraction (``ib_app_efficiency``, fitted on several nodes)
and the host enqueue cost of one thread driving several GPUs (``host_launch_s``, ``host_per_channel_s``,
fitted to sizes below 1 MiB when ``-g`` > 1). The profile records the system and group size the fit came
from. The bandwidth fraction is fitted to the larger half of the sizes of 64 MiB and above (bandwidth-bound
in NCCL's model: busbw is proportional to it there), as the median ratio of measured to simulated busbw,
twice (the second pass absorbs protocol switches).

What no global constant can follow -- the log's busbw-vs-size curve where NCCL's own choices (algorithm,
protocol, channels per size) differ from the tuning model's -- is then fitted as a busbw correction of that
collective on that communicator shape (``[nccl.busbw_correction.<arch>.<curve>]``, read by
:func:`hwmodel.nccl.calibration.busbw_correction`): a factor per size knot, piecewise linear in
``log2(size)`` and clamped outside the knots, each knot's factor iterated until the simulated busbw at
that size equals the measured one, then knots dropped while the linear interpolation of their
neighbours stays within :data:`PRUNE_TOLERANCE`. The profile is fitted to every size; the held-out
error comes from a second fit on the sizes 2^even (and the sizes between them, for logs that are not
powers of two: every other size) tested on the others.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

from hwmodel.calibration_overlay import Overlay, applied, merge
from hwmodel.nccl import calibration as nccl_cal
from hwmodel.nccl import nccltests
from hwmodel.nccl.engine import simulate_nccl_tests
from hwmodel.nccl.tuner import arch_of
from scenarios.calibrate import CalibrationInputError
from scenarios.calibrate.nccl_log import NcclLog

BANDWIDTH_BOUND_BYTES = 64 << 20
"""Sizes from here fit the bandwidth fraction."""
COMPARED_FROM_BYTES = 1 << 20
"""Sizes from here are compared (the acceptance band)."""
CURVE_PASSES = 4
"""Fixed-point passes of the knot factors (each moves every knot by measured / simulated busbw)."""
FACTOR_RANGE = (0.05, 4.0)
"""Bounds on a knot's factor. A knot whose simulated time does not follow its factor (host-bound in a
``-g`` > 1 run: the log bounds its GPU time from above only) keeps 1.0, the shipped model."""
MIN_BANDWIDTH_ROWS = 4
"""Sizes of 1 MiB or more a log needs for the bandwidth fraction to be fitted: it is the median over the
larger half of them (from 64 MiB where there are enough), so at least two rows, past any protocol switch.
With fewer it is left at the shipped value, and the fit says so."""
FOLLOW_FRACTION = 0.1
"""A knot whose simulated busbw moved by less than this fraction of its factor's move (in one pass) is taken
for bound elsewhere and keeps 1.0 (a third, before: then the 8 MiB knot of the 8x A100 log under
``chunked``, partly masked by the host enqueue of ``-g 8`` -- busbw -3.5 % for the first pass's -24 %
factor -- kept 1.0 and stayed 32 % off; now it follows over the passes, and under ``flow`` nothing moves)."""
MIN_CURVE_SIZES = 4
"""Sizes a log needs for a busbw correction: outside the fitted sizes the correction is held at its end
values, so a curve through one to three sizes would move every other size by what those few measured
(one 128 MiB row of the 8x A100 log: -20 % at 8 GiB). With fewer, no correction is fitted, and the fit
says so."""
PRUNE_TOLERANCE = 0.02
"""A knot is dropped while interpolating its neighbours stays within this of every fitted knot's factor."""
CURVE_COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce")
"""Collectives the tuner plans, and so the ones a busbw correction applies to (not sendrecv/alltoall)."""


@dataclass
class NcclFit:
    """Fitted ``[nccl]`` values and the per-size comparison."""

    sections: dict[str, Any]
    """The profile's ``[nccl]`` table."""
    changed: list[tuple[str, float, float]]
    """(dotted key, shipped, fitted)."""
    comparison: list[dict[str, Any]] = field(default_factory=list)
    """Per size: measured and simulated busbw, in-sample error, and for sizes held out of the second fit
    its simulated busbw and error (``held_out_error``)."""
    curve_knots: int = 0
    """Knots of the fitted busbw correction (0: none fitted)."""
    not_fitted: list[str] = field(default_factory=list)
    """One line per constant the log could not fit (too few rows), which keeps its shipped value."""
    fidelity: str = "flow"
    """The collective model the log was fitted against (``[simulation] fidelity``)."""
    gpus_per_node: int = 0
    """GPUs per node of the system fitted on (a log of fewer ranks on one node fits a partial node)."""


def _simulate(topo: Any, log: NcclLog, gpus: list, sections: dict[str, Any], fidelity: str) -> dict[int, float]:
    overlay = Overlay("(fitting)", "fit", {"nccl": sections}, ())
    with applied(overlay):
        rows = simulate_nccl_tests(topo, log.collective, [r.size_bytes for r in log.rows],
                                   gpus_per_thread=log.gpus_per_thread, gpus=gpus, fidelity=fidelity)
    return {r.size_bytes: r.busbw_Bps for r in rows}


def _topology(log: NcclLog, system: str) -> tuple[Any, list]:
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
    return topo, [g for n in range(log.nodes) for g in topo.gpus_of_node(n)[:per_node]]


def busbw_bound_Bps(log: NcclLog, topo: Any) -> tuple[float, str]:
    """The most busbw (bytes/s) the hardware can carry for ``log``'s collective and shape, and what sets it.

    One node: the GPU's NVLink line rate (links x per-link rate per direction, ``GPUSpec``): every rank
    moves at least busbw x t bytes over its own links (nccl-tests ``doc/PERFORMANCE.md``: busbw is the
    per-rank link load of a ring), whatever the algorithm -- except all-reduce with in-network reduction
    (NVLS, SHARP), where a rank need only send and receive S, so algbw <= line rate and busbw <= 2(n-1)/n
    x line rate (8x H100 NVLS all_reduce_perf: 479 GB/s busbw on 450 GB/s links, Azure ND H100 v5 sweep).
    Several nodes: the node's compute NICs (NICs per node x port rate): each node receives at least
    S x (nodes-1)/nodes over them, so busbw <= busbw factor x NIC rate x nodes/(nodes-1) (loose for
    all-reduce, which needs S; it bounds every collective). A row above it has a unit error (ms or ns for
    us) or is not this hardware's.
    """
    spec, n = topo.gpu_spec, log.ranks
    allreduce = nccltests.busbw_factor("all_reduce", n) if log.collective == "all_reduce" else 1.0
    if log.nodes == 1:
        line = spec.nvlink_bandwidth_per_link_Bps * spec.nvlink_links
        if line <= 0:
            return math.inf, "no NVLink"
        return line * allreduce, (f"{spec.name} NVLink line rate {spec.nvlink_links} x "
                                  f"{spec.nvlink_bandwidth_per_link_Bps / 1e9:g} GB/s"
                                  + (f" x 2(n-1)/n = {allreduce:g} (in-network reduction)" if allreduce > 1 else ""))
    nics = topo.nics_per_node
    if not nics or topo.nic_spec is None:
        return math.inf, "no NICs"
    node_Bps = nics * topo.nic_spec.bandwidth_Bps
    factor = nccltests.busbw_factor(log.collective, n) * log.nodes / (log.nodes - 1)
    return node_Bps * factor, (f"{nics} x {topo.nic_spec.name} {topo.nic_spec.bandwidth_Bps / 1e9:g} GB/s per node "
                               f"x busbw factor x nodes/(nodes-1) = {factor:.3g}")


def check_busbw(log: NcclLog, topo: Any, system: str) -> None:
    """Refuse a log with a row above :func:`busbw_bound_Bps`.

    Raises:
        CalibrationInputError: one line naming the first such row's size, its busbw and the bound.
    """
    bound, why = busbw_bound_Bps(log, topo)
    for r in log.rows:
        if r.busbw_Bps > bound * (1 + 1e-6):
            raise CalibrationInputError(
                f"{log.path}: the {r.size_bytes}-byte row has busbw {r.busbw_Bps / 1e9:.6g} GB/s, above the "
                f"{bound / 1e9:.4g} GB/s {system} can carry for {log.ranks}-rank {log.collective} on "
                f"{log.nodes} node(s) ({why}): is the time column in us (nccl-tests' unit), and the log this "
                f"system's?")


def held_out_sizes(sizes: list[int]) -> set[int]:
    """The sizes the held-out check leaves out: odd powers of two where every size is one (nccl-tests
    ``-f 2``), else every other size in order."""
    if all(s & (s - 1) == 0 for s in sizes):
        return {s for s in sizes if (s.bit_length() - 1) % 2 == 1}
    return {s for i, s in enumerate(sorted(sizes)) if i % 2 == 1}


def fit_nccl(log: NcclLog, system: str, fidelity: str = "flow") -> NcclFit:
    """Fit ``log`` on ``system`` (a ``trainsim list systems`` name) against the collective model of
    ``fidelity`` (:data:`hwmodel.nccl.engine.FIDELITIES`; the busbw correction records it): the profile to
    every size, and a second fit without :func:`held_out_sizes` to report the held-out error.

    Raises:
        CalibrationInputError: the run does not fit the system (more ranks per node than it has GPUs), its
            ``Rank`` lines name a GPU trainsim knows that is not the system's, or a row's busbw is above what
            the hardware can carry (:func:`busbw_bound_Bps`).
    """
    topo, gpus = _topology(log, system)
    check_busbw(log, topo, system)
    measured = {r.size_bytes: r for r in log.rows if r.busbw_Bps > 0}
    not_fitted: list[str] = []
    sections, changed, sim = _fit(topo, log, gpus, set(measured), fidelity, not_fitted)
    held = held_out_sizes(sorted(measured))
    _, _, sim_out = _fit(topo, log, gpus, set(measured) - held, fidelity, [])
    comparison = []
    for s in sorted(measured):
        row: dict[str, Any] = {"size_bytes": s, "measured_busbw_GBps": measured[s].busbw_Bps / 1e9,
                               "simulated_busbw_GBps": sim[s] / 1e9, "error": sim[s] / measured[s].busbw_Bps - 1,
                               "held_out": s in held}
        if s in held:
            row["held_out_simulated_busbw_GBps"] = sim_out[s] / 1e9
            row["held_out_error"] = sim_out[s] / measured[s].busbw_Bps - 1
        comparison.append(row)
    knots = sum(len(t["factor"]) for t in sections.get(nccl_cal.BUSBW_CORRECTION_KEY, {}).get(
        arch_of(topo.gpu_spec.compute_capability), {}).values())
    return NcclFit(sections, changed, comparison, knots, not_fitted, fidelity, topo.gpus_per_node)


def _fit(topo: Any, log: NcclLog, gpus: list, fit_sizes: set[int], fidelity: str, not_fitted: list[str]
         ) -> tuple[dict[str, Any], list[tuple[str, float, float]], dict[int, float]]:
    """The global constants, then the busbw correction, fitted to the rows of ``fit_sizes``; returns the
    ``[nccl]`` sections, the changed constants and the simulated busbw per size with them. A bandwidth
    fraction with too few rows (:data:`MIN_BANDWIDTH_ROWS`) is left out, with a line in ``not_fitted``."""
    shipped = dict(nccl_cal.nccl_calibration())
    spec = topo.gpu_spec
    rows = [r for r in log.rows if r.size_bytes in fit_sizes]
    measured = {r.size_bytes: r for r in rows}
    big = sorted(s for s in fit_sizes if s >= COMPARED_FROM_BYTES)
    fit_bw = [s for s in big if s >= BANDWIDTH_BOUND_BYTES] or big
    fit_bw = fit_bw[len(fit_bw) // 2:]  # the larger half: the asymptote, past any protocol or algorithm switch
    sections: dict[str, Any] = {}
    changed: list[tuple[str, float, float]] = []
    arch = arch_of(spec.compute_capability)
    if log.nodes == 1:
        line = spec.nvlink_bandwidth_per_link_Bps * spec.nvlink_links
        if line <= 0:
            raise CalibrationInputError(f"{topo.name}: its GPUs have no NVLink to fit")
        key = f"nccl.nvlink_efficiency.{arch}"
        before = nccl_cal.nvlink_efficiency_fit().get(arch, spec.nccl_nvlink_bandwidth_per_link_Bps
                                                     / spec.nvlink_bandwidth_per_link_Bps)
    else:
        key, line, before = "nccl.ib_app_efficiency", 0.0, float(shipped["ib_app_efficiency"])

    def with_fraction(eff: float) -> dict[str, Any]:
        if log.nodes == 1:
            return merge(sections, {"nvlink_efficiency": {arch: {"busbw_Bps": eff * line, "line_rate_Bps": line,
                                                                  "ranks": log.ranks, "nodes": 1}}})
        return {**sections, "ib_app_efficiency": eff}

    if len(big) < MIN_BANDWIDTH_ROWS:
        not_fitted.append(f"{key}: not fitted: {len(big)} size(s) of 1 MiB or more, at least {MIN_BANDWIDTH_ROWS} "
                          f"are needed (the larger half of them fits it); kept at {before:.4g}")
    else:
        eff = before
        for _ in range(2):
            sim = _simulate(topo, log, gpus, with_fraction(eff), fidelity)
            eff = min(eff * statistics.median(measured[s].busbw_Bps / sim[s] for s in fit_bw), 1.0)
        sections = with_fraction(eff)
        changed.append((key, before, eff))
    small = [r for r in rows if r.size_bytes < COMPARED_FROM_BYTES]
    if log.gpus_per_thread > 1 and small:
        sim_t = {s: s / bw for s, bw in _simulate(topo, log, gpus, sections, fidelity).items() if bw > 0}
        ratio = statistics.median(r.size_bytes / r.busbw_Bps / sim_t[r.size_bytes] for r in small
                                  if r.size_bytes in sim_t)
        for key in ("host_launch_s", "host_per_channel_s"):
            sections[key] = float(shipped[key]) * ratio
            changed.append((f"nccl.{key}", float(shipped[key]), sections[key]))
        sections["host_fit_gpus"] = int(shipped["host_fit_gpus"])
    if log.collective in CURVE_COLLECTIVES and len(measured) >= MIN_CURVE_SIZES:
        sections = _fit_curve(topo, log, gpus, sections, measured, arch, changed, fidelity)
    elif log.collective in CURVE_COLLECTIVES and measured:
        not_fitted.append(f"nccl.{nccl_cal.BUSBW_CORRECTION_KEY}.{arch}.{curve_name(log)}: not fitted: "
                          f"{len(measured)} size(s), at least {MIN_CURVE_SIZES} are needed (the correction is held "
                          f"at its end values outside the sizes it was fitted on)")
    return sections, changed, _simulate(topo, log, gpus, sections, fidelity)


def curve_name(log: NcclLog) -> str:
    """The profile's table name of ``log``'s busbw correction, e.g. ``all_reduce_8ranks_1nodes``."""
    return f"{log.collective}_{log.ranks}ranks_{log.nodes}nodes"


def _fit_curve(topo: Any, log: NcclLog, gpus: list, sections: dict[str, Any], measured: dict[int, Any],
               arch: str, changed: list[tuple[str, float, float]], fidelity: str) -> dict[str, Any]:
    """Fit the busbw correction knots (see the module docstring); returns ``sections`` with it."""
    knots = sorted(measured)
    factor = dict.fromkeys(knots, 1.0)
    lo, hi = FACTOR_RANGE

    def with_curve(points: list[int]) -> dict[str, Any]:
        table = {"collective": log.collective, "ranks": log.ranks, "nodes": log.nodes, "fidelity": fidelity,
                 "log2_size_bytes": [math.log2(s) for s in points], "factor": [factor[s] for s in points]}
        return merge(sections, {nccl_cal.BUSBW_CORRECTION_KEY: {arch: {curve_name(log): table}}})

    before: tuple[dict[int, float], dict[int, float]] | None = None
    bound_elsewhere: set[int] = set()  # knots whose simulated time did not follow their factor
    for _ in range(CURVE_PASSES):
        sim = _simulate(topo, log, gpus, with_curve(knots), fidelity)
        if before is not None:
            for s in knots:
                moved = factor[s] / before[0][s] - 1
                if abs(moved) > 1e-3 and abs(sim[s] / before[1][s] - 1) < abs(moved) * FOLLOW_FRACTION:
                    bound_elsewhere.add(s)  # host-bound (-g > 1): the log says nothing of its GPU time
        before = (dict(factor), sim)
        for s in knots:
            new = factor[s] * measured[s].busbw_Bps / sim[s]
            factor[s] = 1.0 if s in bound_elsewhere else min(max(new, lo), hi)
    kept = _prune(knots, factor)
    for s in kept:
        changed.append((f"nccl.{nccl_cal.BUSBW_CORRECTION_KEY}.{arch}.{curve_name(log)}@{s}", 1.0, factor[s]))
    return with_curve(kept)


def _prune(knots: list[int], factor: dict[int, float]) -> list[int]:
    """Drop knots (never the end ones) while the curve through the rest reproduces every knot's factor
    within :data:`PRUNE_TOLERANCE`; the knot whose removal costs least goes first."""
    kept = list(knots)

    def worst(points: list[int]) -> float:
        xs = [math.log2(s) for s in points]
        ys = [factor[s] for s in points]
        return max(abs(_interp(xs, ys, math.log2(s)) / factor[s] - 1) for s in knots)

    while len(kept) > 2:
        cost, i = min((worst(kept[:i] + kept[i + 1:]), i) for i in range(1, len(kept) - 1))
        if cost > PRUNE_TOLERANCE:
            break
        del kept[i]
    return kept


def _interp(xs: list[float], ys: list[float], x: float) -> float:
    if x <= xs[0]:
        return ys[0]
    for (x0, y0), (x1, y1) in zip(zip(xs, ys, strict=True), zip(xs[1:], ys[1:], strict=True), strict=False):
        if x <= x1:
            return y0 + (x - x0) / (x1 - x0) * (y1 - y0)
    return ys[-1]
