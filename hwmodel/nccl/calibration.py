"""NCCL constants fitted to measurements, read from ``hwmodel/data/calibration.toml`` (``[nccl]``).

What is copied from NCCL's source stays in code next to its citation; what was fitted or read off
measurements is here, with the rows it was fitted to documented in the TOML file. A user's calibration
profile (:mod:`hwmodel.calibration_overlay`), when one is active, is merged over the shipped table, so
these functions are read where the engine uses them, not once at import.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
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


def nvlink_efficiency_fit() -> dict[str, float]:
    """Fitted NCCL NVLink efficiency (achieved busbw / line rate) per GPU generation, where measured."""
    table = nccl_calibration().get("nvlink_efficiency", {})
    return {arch: float(row["busbw_Bps"]) / float(row["line_rate_Bps"]) for arch, row in table.items()}
