"""NCCL constants fitted to measurements, read from ``hwmodel/data/calibration.toml`` (``[nccl]``).

What is copied from NCCL's source stays in code next to its citation; what was fitted or read off
measurements is here, with the rows it was fitted to documented in the TOML file. A user's calibration
profile (:mod:`hwmodel.calibration_overlay`), when one is active, is merged over the shipped table, so
these functions are read where the engine uses them, not once at import.
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import math
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from hwmodel import calibration_overlay
from hwmodel.costmodel import Calibration


def nccl_calibration() -> Mapping[str, Any]:
    """The ``[nccl]`` table of the shipped calibration file, with the active profile's merged in.

    Raises:
        ValueError: the file has no ``[nccl]`` table.
    """
    return _nccl_table(calibration_overlay.active())


@functools.cache
def _nccl_table(overlay: calibration_overlay.Overlay | None) -> Mapping[str, Any]:
    with calibration_overlay.applied(overlay):
        cal = Calibration.load()
    table = cal.data.get("nccl")
    if not isinstance(table, Mapping):
        raise ValueError(f"calibration {cal.path}: no [nccl] table")
    return table


def _value(key: str) -> float:
    try:
        return float(nccl_calibration()[key])
    except KeyError:
        raise ValueError(f"calibration [nccl]: missing key {key!r}") from None


def ib_app_efficiency() -> float:
    """Achieved / line rate of one InfiniBand NIC through NCCL (fraction, ``ib_app_efficiency``)."""
    return _value("ib_app_efficiency")


def host_launch_per_gpu_s() -> float:
    """Host seconds to enqueue one collective on one GPU when one thread drives several GPUs."""
    return _value("host_launch_s") / int(nccl_calibration()["host_fit_gpus"])


def host_per_channel_per_gpu_s() -> float:
    """Host seconds per channel per GPU to enqueue one collective."""
    return _value("host_per_channel_s") / int(nccl_calibration()["host_fit_gpus"])


def copy_engine_nvlink_efficiency(architecture: str) -> float:
    """Payload rate of a copy-engine peer copy over NVLink over the NVLink line rate (fraction) on GPUs of
    ``architecture`` (``GPUSpec.architecture``, any case): ``[nccl.copy_engine_nvlink_efficiency]``, 1.0
    (the line rate) where nothing was measured."""
    table = nccl_calibration().get("copy_engine_nvlink_efficiency", {})
    return float(table.get(architecture.lower(), 1.0))


def nvlink_efficiency_fit() -> dict[str, float]:
    """Fitted NCCL NVLink efficiency (achieved busbw / line rate) per GPU generation, where measured."""
    table = nccl_calibration().get("nvlink_efficiency", {})
    return {arch: float(row["busbw_Bps"]) / float(row["line_rate_Bps"]) for arch, row in table.items()}


BUSBW_CORRECTION_KEY = "busbw_correction"
"""``[nccl.busbw_correction.<arch>.<curve>]``: fitted busbw-vs-size corrections of a user's profile
(written by ``trainsim calibrate --nccl-log``; the shipped file has none)."""


@dataclass(frozen=True)
class BusbwCurve:
    """A fitted busbw correction of one collective on one communicator shape.

    ``factor(size)`` is piecewise linear in ``log2(size_bytes)`` between the knots and clamped to the end
    knots outside them; the engine divides the collective's GPU time by it (see
    :func:`busbw_correction`).
    """

    collective: str
    ranks: int
    nodes: int
    log2_size_bytes: tuple[float, ...]
    factor: tuple[float, ...]
    fidelity: str = "flow"
    """The collective model (``[simulation] fidelity``) the curve was fitted against: it corrects that
    model's busbw, and multiplies another one's without reproducing the log."""

    def at(self, size_bytes: int) -> float:
        """The correction at ``size_bytes`` (dimensionless, > 0)."""
        xs, ys = self.log2_size_bytes, self.factor
        x = math.log2(max(size_bytes, 1))
        if x <= xs[0]:
            return ys[0]
        if x >= xs[-1]:
            return ys[-1]
        i = bisect.bisect_right(xs, x)
        t = (x - xs[i - 1]) / (xs[i] - xs[i - 1])
        return ys[i - 1] + t * (ys[i] - ys[i - 1])


CurveKey = tuple[str, str, int, int]
"""A busbw correction's key: (GPU generation, collective, ranks, nodes)."""

_recorders: list[set[CurveKey]] = []


@contextlib.contextmanager
def recording_corrections() -> Iterator[set[CurveKey]]:
    """Collect the keys (arch, collective, ranks, nodes) of every collective :func:`busbw_correction` prices
    inside the block, whether or not a curve corrects it: the shapes a run really uses (a profile's curves
    for other collectives or shapes are not among them)."""
    seen: set[CurveKey] = set()
    _recorders.append(seen)
    try:
        yield seen
    finally:
        _recorders.remove(seen)


def fidelity_warning(profile_name: str, fidelity: str, used: Collection[CurveKey]) -> str | None:
    """A one-line warning when a busbw correction in ``used`` (keys :func:`recording_corrections` collected:
    the corrections the run applied) was fitted under another fidelity than ``fidelity`` (the model it is
    now applied to); ``None`` otherwise, also when the profile's other-fidelity curves are for collectives
    or communicator shapes the run does not have."""
    curves = busbw_curves()
    other = sorted({curves[k].fidelity for k in used if k in curves} - {fidelity})
    if not other:
        return None
    fitted = " and ".join(f'fidelity = "{f}"' for f in other)
    return (f"calibration {profile_name}: its busbw-vs-size correction was fitted under {fitted} (trainsim "
            f"calibrate --nccl-log ... --fidelity {other[0]}); under fidelity = \"{fidelity}\" it multiplies a "
            f"different model and does not reproduce the log: refit it with --fidelity {fidelity}")


def group_size_warning(profile_name: str, used: Collection[CurveKey]) -> str | None:
    """A one-line warning when the active profile's ``[nccl.nvlink_efficiency.<arch>]`` was fitted to a log
    of one group size (its ``ranks``, written by ``trainsim calibrate --nccl-log``) and the run priced
    collectives with another number of ranks per node on that generation (``used``: the shapes
    :func:`recording_corrections` collected); ``None`` otherwise. busbw changes with the group size (NCCL
    picks channels and algorithms per communicator: 8x H100 NVLS all_reduce_perf, 367.5 GB/s busbw on 2-4
    GPUs, 480 on 8, NVIDIA/nccl#1455), so the fraction of one size is only an estimate for another."""
    table = nccl_calibration().get("nvlink_efficiency", {})
    for arch, row in sorted(table.items()):
        fitted = row.get("ranks") if isinstance(row, Mapping) else None
        if fitted is None:
            continue
        # an NVLink fraction: what counts is the group on one node's NVLink (ranks per node)
        other = sorted({(r, n) for a, _, r, n in used if a == str(arch).lower() and r // max(n, 1) != int(fitted)})
        if other:
            shapes = ", ".join(f"{r} ranks" + (f" on {n} nodes" if n > 1 else "") for r, n in other[:4])
            return (f"calibration {profile_name}: nccl.nvlink_efficiency.{arch} was fitted to {int(fitted)}-rank "
                    f"nccl-tests and prices this run's collectives of {shapes} too; busbw differs with the group "
                    f"size: fit a log of the GPUs per node you run (all_reduce_perf -g N)")
    return None


def busbw_curves() -> dict[tuple[str, str, int, int], BusbwCurve]:
    """The active profile's busbw corrections, keyed by (arch, collective, ranks, nodes); empty without one.

    Raises:
        ValueError: a curve table with missing keys, knots not increasing, lists of different lengths,
            or a factor that is not > 0 (one line naming the table).
    """
    return _curves(calibration_overlay.active())


@functools.cache
def _curves(overlay: calibration_overlay.Overlay | None) -> dict[tuple[str, str, int, int], BusbwCurve]:
    out: dict[tuple[str, str, int, int], BusbwCurve] = {}
    if overlay is None:
        return out
    by_arch = nccl_calibration().get(BUSBW_CORRECTION_KEY, {})
    for arch, tables in by_arch.items():
        for name, t in tables.items():
            where = f"calibration [nccl.{BUSBW_CORRECTION_KEY}.{arch}.{name}]"
            try:
                curve = BusbwCurve(str(t["collective"]), int(t["ranks"]), int(t["nodes"]),
                                   tuple(float(x) for x in t["log2_size_bytes"]),
                                   tuple(float(y) for y in t["factor"]), str(t.get("fidelity", "flow")))
            except (KeyError, TypeError, ValueError) as exc:
                raise ValueError(f"{where}: needs collective, ranks, nodes, log2_size_bytes and factor "
                                 f"({exc})") from None
            xs, ys = curve.log2_size_bytes, curve.factor
            if not xs or len(xs) != len(ys) or any(b <= a for a, b in zip(xs, xs[1:], strict=False)) \
                    or any(not y > 0 for y in ys):
                raise ValueError(f"{where}: log2_size_bytes must increase, with one factor > 0 per knot")
            out[(str(arch).lower(), curve.collective, curve.ranks, curve.nodes)] = curve
    return out


def busbw_correction(arch: str, collective: str, ranks: int, nodes: int, size_bytes: int) -> float:
    """Fitted correction of a collective's busbw (1.0 when the active profile has no curve for it).

    ``arch``: GPU generation (``ampere`` ...), ``collective``: engine op name (``all_reduce`` ...),
    ``ranks``/``nodes``: the communicator's shape, ``size_bytes``: nccl-tests' S (the engine's collective
    size). Source: the user's own nccl-tests log, fitted by ``trainsim calibrate --nccl-log``.
    """
    key = (arch.lower(), collective, ranks, nodes)
    for seen in _recorders:  # every shape priced, curve or not (group_size_warning needs them all)
        seen.add(key)
    curve = busbw_curves().get(key)
    return 1.0 if curve is None else curve.at(size_bytes)
