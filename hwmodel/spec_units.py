"""Data-file keys in human units -> SI fields: the ONE place where units are converted, with checks.

``gpus.toml`` and ``network.toml`` store human units with the unit in the key name (``boost_clock_MHz``,
``hbm_bandwidth_GBps``, ``bandwidth_Gbps``, ``hop_latency_ns``); the tables below map each key to its SI
field and scale (MHz x 1e6 -> Hz, TFLOPS x 1e12 -> FLOP/s, GB x 1e9 -> bytes, MiB x 2^20 -> bytes,
GB/s x 1e9 -> bytes/s, Gb/s x 1e9/8 -> bytes/s, us x 1e-6 and ns x 1e-9 -> s). The SI field names are
accepted too. :mod:`hwmodel.specs` builds its dataclasses from what :func:`convert` returns.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

TENSOR_DTYPES: tuple[str, ...] = ("fp16", "bf16", "tf32", "fp8", "fp4")
"""Tensor-core math dtypes a :attr:`~hwmodel.specs.GPUSpec.tensor_flops` table may list."""

Conv = tuple[str, Callable[[Any], Any]]
"""(SI field name, function from the file's value to the SI value)."""


def _scale(k: float) -> Callable[[Any], Any]:
    return lambda v: v * k


def _ident(v: Any) -> Any:
    return v


GPU_KEYS: dict[str, Conv] = {
    "name": ("name", _ident),
    "architecture": ("architecture", _ident),
    "compute_capability": ("compute_capability", _ident),
    "sm_count": ("sm_count", _ident),
    "boost_clock_MHz": ("boost_clock_hz", _scale(1e6)),
    "tensor_TFLOPS": ("tensor_flops", _ident),  # table; each value scaled by GPU_TABLE_SCALE in convert
    "fp32_TFLOPS": ("fp32_flops", _scale(1e12)),
    "hbm_capacity_GB": ("hbm_capacity_bytes", _scale(1e9)),
    "hbm_bandwidth_GBps": ("hbm_bandwidth_Bps", _scale(1e9)),
    "l2_MiB": ("l2_bytes", _scale(2**20)),
    "nvlink_generation": ("nvlink_generation", _ident),
    "nvlink_links": ("nvlink_links", _ident),
    "nvlink_bandwidth_per_link_GBps": ("nvlink_bandwidth_per_link_Bps", _scale(1e9)),
    "nccl_nvlink_bandwidth_per_link_GBps": ("nccl_nvlink_bandwidth_per_link_Bps", _scale(1e9)),
    "pcie_generation": ("pcie_generation", _ident),
    "pcie_bandwidth_GBps": ("pcie_bandwidth_Bps", _scale(1e9)),
    "copy_engines": ("copy_engines", _ident),
    "tdp_W": ("tdp_w", _ident),
    "power_limit_W": ("power_limit_w", _ident),
}
GPU_KEY_MEANING: dict[str, str] = {
    "architecture": "Volta, Ampere, Hopper or Blackwell",
    "compute_capability": 'CUDA compute capability, e.g. "9.0"',
    "sm_count": "streaming multiprocessors, e.g. 132 (H100)",
    "boost_clock_MHz": "maximum boost clock, e.g. 1980 (H100)",
    "tensor_TFLOPS": "dense tensor-core peaks per dtype, e.g. { bf16 = 989.4 } (H100)",
    "fp32_TFLOPS": "non-tensor FP32 peak, e.g. 66.9 (H100)",
    "hbm_capacity_GB": "the datasheet's HBM capacity, e.g. 80 (H100)",
    "hbm_bandwidth_GBps": "HBM peak bandwidth in GB/s, e.g. 3350 (H100)",
    "l2_MiB": "L2 cache, e.g. 50 (H100)",
    "nvlink_generation": "NVLink generation, e.g. 4 (H100); 0 without NVLink",
    "nvlink_links": "NVLink links per GPU, e.g. 18 (H100)",
    "nvlink_bandwidth_per_link_GBps": "NVLink line rate per link per direction, e.g. 25 (H100)",
    "nccl_nvlink_bandwidth_per_link_GBps": "NCCL's own per-link NVLink figure, nccl src/graph/topo.h "
                                           "SMxx_NVLINK_BW: 20.0 Volta/Ampere, 20.6 Hopper, 40.1 Blackwell",
    "pcie_generation": "PCIe generation of the host link, e.g. 5 (H100)",
    "pcie_bandwidth_GBps": "raw PCIe x16 rate per direction, e.g. 64 (Gen5)",
    "copy_engines": "asynchronous copy engines, e.g. 3",
}
"""What each required GPU key is, for the error that names a missing one."""

GPU_TABLE_SCALE = {"tensor_TFLOPS": 1e12}
"""Table-valued keys -> the scale of each of their values."""

NIC_KEYS: dict[str, Conv] = {
    "name": ("name", _ident),
    "bandwidth_Gbps": ("bandwidth_Bps", _scale(1e9 / 8)),
    "bandwidth_GBps": ("bandwidth_Bps", _scale(1e9)),
    "latency_us": ("latency_s", _scale(1e-6)),
    "pcie_generation": ("pcie_generation", _ident),
}

SWITCH_KEYS: dict[str, Conv] = {
    "name": ("name", _ident),
    "kind": ("kind", _ident),
    "radix": ("radix", _ident),
    "hop_latency_ns": ("hop_latency_s", _scale(1e-9)),
    "port_bandwidth_Gbps": ("port_bandwidth_Bps", _scale(1e9 / 8)),
    "port_bandwidth_GBps": ("port_bandwidth_Bps", _scale(1e9)),
}

_INT_FIELDS = {"sm_count", "hbm_capacity_bytes", "l2_bytes", "nvlink_generation", "nvlink_links",
               "pcie_generation", "copy_engines", "radix"}
_STR_FIELDS = {"name", "architecture", "kind"}
_POSITIVE_FIELDS = {"tdp_w", "power_limit_w"}
"""Fields whose value must be > 0 (a power); the others may be 0 (e.g. a GPU without NVLink)."""
_TABLE_FIELDS = {"tensor_flops"}


def check_number(owner: str, fname: str, value: Any, *, positive: bool = True, integer: bool = False) -> None:
    """Raise ValueError naming ``fname`` unless ``value`` is a finite (positive / non-negative) number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{owner}: field {fname!r} must be a number, got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{owner}: field {fname!r} must be finite, got {value!r}")
    if integer and value != int(value):
        raise ValueError(f"{owner}: field {fname!r} must be an integer, got {value!r}")
    if positive and value <= 0:
        raise ValueError(f"{owner}: field {fname!r} must be > 0, got {value!r}")
    if not positive and value < 0:
        raise ValueError(f"{owner}: field {fname!r} must be >= 0, got {value!r}")


def parse_compute_capability(owner: str, value: Any) -> tuple[int, int]:
    """Compute capability from ``"8.0"``, ``8.0``, ``(8, 0)`` or ``[8, 0]`` to ``(8, 0)``; ValueError
    naming the field otherwise."""
    try:
        if isinstance(value, str):
            major, minor = value.strip().split(".")
        elif isinstance(value, float):
            major, minor = f"{value:.1f}".split(".")
        else:
            major, minor = value
        cc = (int(major), int(minor))
    except (TypeError, ValueError):
        raise ValueError(
            f"{owner}: field 'compute_capability' must look like '8.0' or (8, 0), got {value!r}"
        ) from None
    if cc[0] < 0 or cc[1] < 0:
        raise ValueError(f"{owner}: field 'compute_capability' must be non-negative, got {value!r}")
    return cc


def _convert_sources(value: Any, conv: Mapping[str, Conv], where: str) -> dict[str, str]:
    """A ``sources`` table keyed by file keys -> sources keyed by SI field name."""
    if not isinstance(value, Mapping):
        raise ValueError(f"{where}: 'sources' must be a table of key = \"source\"")
    out: dict[str, str] = {}
    for skey, src in value.items():
        if skey not in conv:
            raise ValueError(f"{where}: sources has unknown key {skey!r}; allowed keys: {', '.join(sorted(conv))}")
        out[conv[skey][0]] = str(src)
    return out


def _convert_table(key: str, value: Any, scale: float, where: str) -> dict[str, float]:
    if not isinstance(value, Mapping):
        raise ValueError(f"{where}: key {key!r} must be a table of dtype -> peak ({', '.join(TENSOR_DTYPES)}), "
                         f"e.g. {{ bf16 = 400 }}, got {value!r}")
    out = {}
    for sub, v in value.items():
        check_number(where, f"{key}.{sub}", v)
        out[sub] = v * scale
    return out


def _convert_value(key: str, value: Any, conv: Conv, where: str) -> Any:
    """One single-valued key's value -> its SI value (strings checked, numbers scaled and checked)."""
    fname, fn = conv
    if isinstance(value, Mapping):
        raise ValueError(f"{where}: key {key!r} must be a single value, not a table, got {dict(value)!r}")
    if fname in _STR_FIELDS:
        if not isinstance(value, str) or not value.strip():
            raise ValueError(f"{where}: key {key!r} must be a non-empty string, got {value!r}")
        return value
    if fname == "compute_capability":  # parsed by the dataclass
        return value
    check_number(where, key, value, positive=fname in _POSITIVE_FIELDS)
    si = fn(value)
    if fname in _INT_FIELDS:
        if abs(si - round(si)) > 1e-6 * max(1.0, abs(si)):
            raise ValueError(f"{where}: key {key!r} must give a whole number, got {value!r}")
        si = int(round(si))
    return si


def convert(keys: Mapping[str, Conv], table_scale: Mapping[str, float], si_names: list[str],
            table: Mapping[str, Any], where: str) -> tuple[dict[str, Any], dict[str, str]]:
    """File keys (``keys``, human units) or SI field names (``si_names``) -> (SI fields, sources keyed
    by SI field name).

    Unknown keys, a field given twice and non-numbers raise ValueError naming the key (and listing the
    allowed keys); negative numbers and non-whole counts raise ValueError naming the key.
    """
    conv: dict[str, Conv] = {n: (n, _ident) for n in si_names}
    conv.update(keys)
    fields: dict[str, Any] = {}
    given_as: dict[str, str] = {}
    sources: dict[str, str] = {}
    for key, value in table.items():
        if key == "sources":
            sources.update(_convert_sources(value, conv, where))
            continue
        if key not in conv:
            raise ValueError(f"{where}: unknown key {key!r}; allowed keys: {', '.join(sorted(conv) + ['sources'])}")
        fname = conv[key][0]
        if fname in fields:
            raise ValueError(f"{where}: {fname!r} given twice (as {given_as[fname]!r} and {key!r})")
        if fname in _TABLE_FIELDS:
            fields[fname] = _convert_table(key, value, table_scale.get(key, 1.0), where)
        else:
            fields[fname] = _convert_value(key, value, conv[key], where)
        given_as[fname] = key
    return fields, sources
