"""Plausible physical ranges of GPU spec fields, to catch what-if overrides in the wrong unit.

A what-if GPU (``[system] gpu_overrides``) may be far from any shipped part, so the bounds are wide:
roughly 10x below the slowest and 10x above the fastest datacentre GPU in ``hwmodel/data/gpus.toml``
(V100 .. B200), rounded to a power of ten. A value outside them is almost surely a unit mistake
(``hbm_bandwidth_Bps = 1000`` meant GB/s) or a typo (``nvlink_links = 9223372036854775807``), which
would otherwise give an iteration of millions of seconds, or an overflow, without a word.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

from hwmodel.spec_units import GPU_KEYS, GPU_TABLE_SCALE
from hwmodel.specs import GPUSpec, get_gpu, load_gpu_file, shipped_gpus

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

__all__ = ["GPU_RANGES", "GPU_RANGE_SHIPPED", "check_gpu_ranges", "check_rated_power", "load_checked_gpu_file",
           "shipped_architectures"]

GPU_RANGES: dict[str, tuple[float, float, str]] = {
    # field: (low, high, unit); basis: V100 .. B200 figures in hwmodel/data/gpus.toml
    "sm_count": (8, 2048, "streaming multiprocessors"),                 # 80 (V100) .. 148 (B200)
    "boost_clock_hz": (1e8, 1e10, "hertz"),                             # 1.41 GHz .. 1.98 GHz
    "fp32_flops": (1e12, 1e16, "FLOP per second"),                      # 15.7 TF .. 80 TF
    "tensor_flops": (1e12, 1e17, "FLOP per second"),                    # 125 TF (V100 fp16) .. 9 PF (B200 fp4)
    "hbm_capacity_bytes": (1e9, 1e13, "bytes"),                         # 32 GB .. 186 GB
    "hbm_bandwidth_Bps": (1e11, 1e14, "bytes per second"),              # 0.9 TB/s .. 8 TB/s
    "l2_bytes": (1e6, 1e10, "bytes"),                                   # 6 MB .. 126 MB
    "nvlink_generation": (0, 10, "generation"),                         # 2 .. 5
    "nvlink_links": (0, 144, "links"),                                  # 6 .. 18
    "nvlink_bandwidth_per_link_Bps": (1e9, 1e12, "bytes per second"),   # 25 GB/s .. 50 GB/s
    "nccl_nvlink_bandwidth_per_link_Bps": (1e9, 1e12, "bytes per second"),
    "pcie_generation": (1, 10, "generation"),                           # 3 .. 6
    "pcie_bandwidth_Bps": (1e9, 1e12, "bytes per second"),              # 16 GB/s .. 64 GB/s (x16)
    "copy_engines": (0, 64, "copy engines"),
    "tdp_w": (10, 1e4, "watts"),                                        # 300 W (V100) .. 1200 W (GB200)
}
"""SI field -> (lowest, highest plausible value, unit in words)."""

GPU_RANGE_SHIPPED: dict[str, str] = {
    "sm_count": "80 (V100) .. 148 (B200)",
    "boost_clock_hz": "1.41 GHz (A100) .. 1.98 GHz (H100, B200)",
    "fp32_flops": "15.7 TFLOP/s (V100) .. 80 TFLOP/s (B200)",
    "tensor_flops": "125 TFLOP/s (V100 fp16) .. 10 PFLOP/s (GB200 fp4)",
    "hbm_capacity_bytes": "32 GB (V100) .. 186 GB (GB200)",
    "hbm_bandwidth_Bps": "0.9 TB/s (V100) .. 8 TB/s (B200)",
    "l2_bytes": "6 MiB (V100) .. 126.5 MiB (B200)",
    "nvlink_generation": "2 (V100) .. 5 (B200)",
    "nvlink_links": "6 (V100) .. 18 (H100, B200)",
    "nvlink_bandwidth_per_link_Bps": "25 GB/s (V100 .. H200) .. 50 GB/s (B200)",
    "nccl_nvlink_bandwidth_per_link_Bps": "20 GB/s (V100, A100) .. 40.1 GB/s (B200), nccl topo.h SMxx_NVLINK_BW",
    "pcie_generation": "3 (V100) .. 6 (B200)",
    "pcie_bandwidth_Bps": "16 GB/s (Gen3 x16) .. 128 GB/s (Gen6 x16)",
    "copy_engines": "3 on every shipped GPU",
    "tdp_w": "300 W (V100) .. 1200 W (GB200)",
}
"""SI field -> the shipped GPUs' span (``hwmodel/data/gpus.toml``), the reason an error gives for its range."""

ARCHITECTURE_USE = ("the per-architecture tables (CUDA context, cuBLAS workspace, kernel efficiencies, NCCL's "
                    "per-generation figures) have rows for these only; describe a new part as the closest one")
"""Why an architecture outside the shipped GPUs' is refused (the name keys those tables, exact case)."""

_PREFIXES = (1e3, 1e6, 1e9, 1e12)

_COUNTS = frozenset({"sm_count", "nvlink_generation", "nvlink_links", "pcie_generation", "copy_engines"})
"""Fields that are counts, not measures: no unit prefix puts them in range (``sm_count = 1`` is not 1e3)."""


def _user_unit(fname: str, keys: Mapping[str, str]) -> tuple[str, float]:
    """The key the user wrote for SI field ``fname`` and its scale to SI (``hbm_bandwidth_GBps``, 1e9)."""
    key = keys.get(fname, fname)
    if key in GPU_TABLE_SCALE:
        return key, GPU_TABLE_SCALE[key]
    conv = GPU_KEYS.get(key)
    return key, (float(conv[1](1.0)) if conv is not None and conv[0] == fname else 1.0)


def _check(fname: str, value: float, keys: Mapping[str, str] | None = None) -> None:
    low, high, unit = GPU_RANGES[fname]
    if low <= value <= high:
        return
    key, scale = _user_unit(fname, keys or {})
    mine = value / scale  # the value in the unit the user wrote
    hint = ""
    for factor in () if fname in _COUNTS else _PREFIXES:  # the unit mistake that would put it in range, in that unit
        if low <= value * factor <= high:
            hint = f"; did you mean {mine:g}e{len(str(int(factor))) - 1}?"
            break
        if low <= value / factor <= high:
            hint = f"; did you mean {mine / factor:g}?"
            break
    shown = str(value) if isinstance(value, int) else f"{value:g}"
    given = f"{key} = {shown}: {unit}" if scale == 1.0 else f"{key} = {mine:g}, i.e. {shown} {unit}"
    raise ValueError(f"{given}; plausible range {low:g} .. {high:g} (about 10x beyond the shipped GPUs' "
                     f"{GPU_RANGE_SHIPPED[fname]}; outside is a unit mistake or a typo){hint}")


def shipped_architectures() -> list[str]:
    """The architecture names of the shipped GPUs (exact case): the rows the per-architecture tables have
    (what-if GPUs registered since do not add theirs)."""
    return sorted({get_gpu(n).architecture for n in shipped_gpus()})


def check_gpu_ranges(base: GPUSpec | None, new: GPUSpec, keys: Iterable[str] = ()) -> None:
    """Check the fields that ``new`` changes from ``base`` (every field when ``base`` is ``None``: a GPU
    file that defines a part in full) against :data:`GPU_RANGES`, and its architecture name.

    ``keys`` are the keys the user wrote (``hbm_bandwidth_GBps`` or ``hbm_bandwidth_Bps``), so that the
    message names the key and the value in the unit given.

    Raises:
        ValueError: one line naming the key, its value, its unit, the range and why, and where a factor of
            10^3..10^12 would fit, the likely intended value; an architecture no shipped GPU has, with the
            allowed names.
    """
    if base is None or new.architecture != base.architecture:  # it keys per-architecture figures (exact case)
        archs = shipped_architectures()
        if new.architecture not in archs:
            near = [a for a in archs if a.lower() == str(new.architecture).strip().lower()]
            hint = f" (did you mean {near[0]!r}? the name is case-sensitive)" if near else ""
            raise ValueError(f"architecture: unknown {new.architecture!r}{hint}; allowed: {', '.join(archs)}; "
                             f"{ARCHITECTURE_USE}")
    given = {GPU_KEYS[k][0] if k in GPU_KEYS else k: k for k in keys}
    for f in dataclasses.fields(GPUSpec):
        if f.name not in GPU_RANGES:
            continue
        old, value = (None if base is None else getattr(base, f.name)), getattr(new, f.name)
        if f.name == "tensor_flops":
            for dtype, v in value.items():
                if old is None or old.get(dtype) != v:
                    _check_tensor(dtype, v, given)
        elif old != value and value is not None:  # (tdp_w None: a what-if GPU without power data)
            _check(f.name, value, given)


def check_rated_power(table: Mapping[str, object]) -> None:
    """Check a user table's rated power (``tdp_W`` or ``tdp_w``) against :data:`GPU_RANGES` before the
    spec is built: the spec's own ``power_limit_W`` check scales from it, so an implausible rated power
    would otherwise be reported as a bad power limit. Non-numbers are left to the spec's own checks.

    Raises:
        ValueError: one line naming the key, as :func:`check_gpu_ranges`.
    """
    for key in ("tdp_W", "tdp_w"):
        value = table.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            _check("tdp_w", value, {"tdp_w": key})


def _check_tensor(dtype: str, value: float, keys: Mapping[str, str]) -> None:
    try:
        _check("tensor_flops", value, keys)
    except ValueError as exc:
        msg = str(exc)
        for name in ("tensor_TFLOPS", "tensor_flops"):
            msg = msg.replace(f"{name} = ", f"{name}.{dtype} = ", 1)
        raise ValueError(msg) from None


def load_checked_gpu_file(path: str | Path) -> GPUSpec:
    """:func:`hwmodel.specs.load_gpu_file` with the checks of ``[system] gpu_overrides``: the fields a file
    with ``base`` changes, or every field of a file that defines the GPU in full, against
    :data:`GPU_RANGES` (the rated power first, :func:`check_rated_power`), and the architecture against the
    shipped GPUs' (:func:`check_gpu_ranges`); and its ``name`` may not be a shipped GPU's (or alias) unless
    the figures are that GPU's.

    Raises:
        ValueError: one line starting ``GPU file <name>:`` (as ``load_gpu_file``'s own errors).
    """
    path = Path(path)
    with path.open("rb") as fh:
        data = tomllib.load(fh)
    if set(data) == {"gpu"} and isinstance(data["gpu"], Mapping):
        data = data["gpu"]
    try:
        check_rated_power(data)
    except ValueError as exc:
        raise ValueError(f"GPU file {path.name}: {exc}") from None
    spec = load_gpu_file(path)
    base = data.get("base")
    try:
        check_gpu_ranges(None if base is None else get_gpu(base), spec, keys=data)
        _check_not_a_shipped_name(spec)
    except ValueError as exc:
        raise ValueError(f"GPU file {path.name}: {exc}") from None
    return spec


def _check_not_a_shipped_name(spec: GPUSpec) -> None:
    """A what-if GPU may not take a shipped GPU's name (or alias) with other figures: every report, trace
    and JSON would label the what-if's numbers with the shipped part's name."""
    try:
        shipped = get_gpu(spec.name)
    except KeyError:  # (UnknownNameError)
        return
    if shipped.name not in shipped_gpus():
        return
    differ = [f.name for f in dataclasses.fields(GPUSpec)
              if f.name not in ("name", "sources") and getattr(spec, f.name) != getattr(shipped, f.name)]
    if differ:
        raise ValueError(f"name {spec.name!r} is the shipped GPU {shipped.name!r}, with other figures "
                         f"({', '.join(differ[:4])}{', ...' if len(differ) > 4 else ''}); rename it "
                         f"(e.g. name = \"{shipped.name}-whatif\") or set [system] gpu = \"{shipped.name}\" "
                         f"with gpu_overrides")
