"""Plausible physical ranges of GPU spec fields, to catch what-if overrides in the wrong unit.

A what-if GPU (``[system] gpu_overrides``) may be far from any shipped part, so the bounds are wide:
roughly 10x below the slowest and 10x above the fastest datacentre GPU in ``hwmodel/data/gpus.toml``
(V100 .. B200), rounded to a power of ten. A value outside them is almost surely a unit mistake
(``hbm_bandwidth_Bps = 1000`` meant GB/s) or a typo (``nvlink_links = 9223372036854775807``), which
would otherwise give an iteration of millions of seconds, or an overflow, without a word.
"""

from __future__ import annotations

import dataclasses

from hwmodel.specs import GPUSpec, get_gpu, known_gpus

__all__ = ["GPU_RANGES", "check_gpu_ranges"]

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
}
"""SI field -> (lowest, highest plausible value, unit in words)."""

_PREFIXES = ((1e3, "e3"), (1e6, "e6"), (1e9, "e9"), (1e12, "e12"))


def _check(fname: str, value: float) -> None:
    low, high, unit = GPU_RANGES[fname]
    if low <= value <= high:
        return
    hint = ""
    for factor, suffix in _PREFIXES:  # the unit mistake that would put it in range
        if low <= value * factor <= high:
            hint = f"; did you mean {value:g}{suffix}?"
            break
    shown = str(value) if isinstance(value, int) else f"{value:g}"
    raise ValueError(f"{fname} = {shown}: {unit}; plausible range {low:g} .. {high:g}{hint}")


def check_gpu_ranges(base: GPUSpec, new: GPUSpec) -> None:
    """Check the fields that ``new`` changes from ``base`` against :data:`GPU_RANGES`.

    Raises:
        ValueError: one line naming the field, its value, its unit, the range and, where a factor of
            10^3..10^12 would fit, the likely intended value; an architecture no shipped GPU has.
    """
    if new.architecture != base.architecture:  # the generation keys per-architecture figures (exact case)
        archs = sorted({get_gpu(n).architecture for n in known_gpus()})
        if new.architecture not in archs:
            raise ValueError(f"architecture: unknown {new.architecture!r}; allowed: {', '.join(archs)}")
    for f in dataclasses.fields(GPUSpec):
        if f.name not in GPU_RANGES:
            continue
        old, value = getattr(base, f.name), getattr(new, f.name)
        if f.name == "tensor_flops":
            for dtype, v in value.items():
                if old.get(dtype) != v:
                    _check_tensor(dtype, v)
        elif old != value:
            _check(f.name, value)


def _check_tensor(dtype: str, value: float) -> None:
    try:
        _check("tensor_flops", value)
    except ValueError as exc:
        raise ValueError(str(exc).replace("tensor_flops", f"tensor_flops.{dtype}", 1)) from None
