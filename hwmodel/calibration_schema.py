"""What a calibration profile may set: every key of its model sections, with its type and range.

A profile (:mod:`hwmodel.calibration_overlay`) is merged key by key over the shipped
``hwmodel/data/calibration.toml``, so a misspelt key would otherwise be reported as "changing a constant"
that nothing reads, and a value in the wrong unit (an efficiency of 50, a negative launch overhead) would
surface deep in the simulation as an error about some kernel, or as a silently wrong time.
:func:`check_profile` refuses both in one line naming the key and what it allows.

Ranges, and why:

- *efficiencies* (``gemm_efficiency.<dtype>``, ``hbm_efficiency``, ``vector_efficiency``, attention
  ``fwd_efficiency``/``bwd_efficiency``, ``sustained_clock_fraction``, ``hbm_efficiency_by_kind.<kind>``,
  NCCL's ``ib_app_efficiency`` and ``copy_engine_nvlink_efficiency``, and an NVLink ``busbw_Bps`` over its
  ``line_rate_Bps``) are fractions of a datasheet peak: (0, 1]. Above 1 the GPU would run faster than its
  datasheet.
- *GEMM shape classes* (``gemm_class_efficiency.<class>``, written by ``trainsim calibrate``): (0, 4]. A
  class's constant multiplies the peak in the model's tiled GEMM time, so it also absorbs the tile
  quantisation (a 64-wide GEMM priced in 128-wide tiles runs at most half the peak in the model) and may
  exceed 1 while its kernels stay below the datasheet rate; 4 is the fit's search bound and Winograd
  F(4x4, 3x3)'s saving in multiplies (36 for 16 outputs instead of 144; Lavin & Gray, "Fast Algorithms for
  Convolutional Neural Networks", CVPR 2016, sec. 4), the most a unit-stride 3x3 convolution can gain on
  the direct FLOP count. Whether the kernels themselves beat the peak is checked where their rows are
  known (``trainsim calibrate``, :func:`efficiency_ceiling`).
- *times*: ``launch_overhead_s``, ``host_launch_s``, ``host_per_channel_s`` in [0, 1 ms]: a kernel launch or
  an NCCL enqueue takes microseconds; a millisecond is a unit slip (the bound of ``[simulation]
  host_launch_overhead_s``).
- *counts and ratios*: positive (``gemm_tiles`` entries, ``memory_bytes_per_sm``, attention ``block`` and
  ``cta_overhead_blocks``, ``fp8_gemm_time_factor`` and busbw correction factors, which are ratios).

Documentation keys (``source``, ``sources``, ``fitted``: strings) are allowed anywhere.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["FORBIDDEN_SECTIONS", "MAX_TIME_S", "RECORD_SECTIONS", "WINOGRAD_MAX_EFFICIENCY", "check_profile",
           "efficiency_ceiling"]

MAX_TIME_S = 1e-3
"""Upper bound of a per-kernel or per-collective host time (s): these take microseconds."""

WINOGRAD_MAX_EFFICIENCY = 4.0
"""Ceiling of a unit-stride 3x3 convolution class: Winograd F(4x4, 3x3) does 4x fewer multiplies than the
direct convolution the model counts (Lavin & Gray, CVPR 2016)."""

DOC_KEYS = frozenset({"source", "sources", "fitted"})
"""Documentation leaves, allowed in every table (:class:`hwmodel.costmodel.Calibration`)."""

RECORD_SECTIONS = ("profile", "fit", "rows", "unmatched")
"""Sections of a profile that record what it was fitted to (written by ``trainsim calibrate``; the model
ignores them)."""

FORBIDDEN_SECTIONS = {
    "memory": "the allocator's fragmentation is read from the shipped calibration only",
    "deepspeed": "DeepSpeed's host time is read from the shipped calibration only",
    "fitted_to": "the shipped calibration's provenance table, not a constant",
}
"""Sections of the shipped file that a profile cannot change, and why (they would be ignored)."""

_GEMM_CLASS = re.compile(r"^(matmul|conv1x1|conv3x3)(s\d+)?(_fwd|_bwd)?(@m\d+n\d+k\d+)?$")
"""The shape classes :func:`hwmodel.costmodel.gemm_classes` can produce."""

FP8_SCALINGS = ("mxfp8", "rowwise")
"""Values of :attr:`hwmodel.ir.Compute.fp8_scaling` other than per-tensor (``""``)."""
_DTYPES = ("default", "bf16", "fp16", "tf32", "fp32", "fp8")
_CURVE_KEYS = ("collective", "ranks", "nodes", "log2_size_bytes", "factor", "fidelity")


class _Bad(ValueError):
    """A profile key at fault: its dotted path and what is wrong."""


def efficiency_ceiling(shape_class: str) -> float:
    """Fastest rate, as a multiple of the datasheet peak on the direct FLOP count, at which the kernels of
    GEMM ``shape_class`` can run: :data:`WINOGRAD_MAX_EFFICIENCY` for a unit-stride 3x3 convolution class
    (``conv3x3``, ``conv3x3_fwd``, ``conv3x3@m13n8k11``, ...), 1.0 otherwise (strided convolutions run
    implicit GEMM: cuDNN's Winograd and FFT need a unit stride)."""
    return WINOGRAD_MAX_EFFICIENCY if re.match(r"^conv3x3(_|@|$)", shape_class) else 1.0


def _tname(path: tuple[str, ...]) -> str:
    """A table's TOML header: ``[gpu."A100 80GB".gemm_efficiency]``."""
    return "[" + ".".join(p if re.match(r"^[A-Za-z0-9_-]+$", p) else f'"{p}"' for p in path) + "]"


def _where(path: tuple[str, ...]) -> str:
    """A key as its table's header and its name: ``[default] launch_overhead_s``."""
    return f"{_tname(path[:-1])} {path[-1]}"


def _number(path: tuple[str, ...], value: Any, low: float, high: float, *, low_open: bool, what: str,
            integer: bool = False) -> None:
    kind = "an integer" if integer else "a number"
    if isinstance(value, bool) or not isinstance(value, int | float) or (integer and not isinstance(value, int)):
        raise _Bad(f"{_where(path)} = {value!r}: must be {kind} ({what})")
    ok = (value > low if low_open else value >= low) and value <= high and math.isfinite(value)
    if not ok:
        lo = "(" if low_open else "["
        raise _Bad(f"{_where(path)} = {value!r}: must be in {lo}{low:g}, {high:g}] ({what})")


def _fraction(path: tuple[str, ...], value: Any) -> None:
    _number(path, value, 0.0, 1.0, low_open=True, what="a fraction of the datasheet peak")


def _time(path: tuple[str, ...], value: Any) -> None:
    _number(path, value, 0.0, MAX_TIME_S, low_open=False,
            what="seconds; a launch takes microseconds, a millisecond is a unit slip")


def _positive(what: str, high: float = 1e12, integer: bool = False) -> Callable[[tuple[str, ...], Any], None]:
    def check(path: tuple[str, ...], value: Any) -> None:
        _number(path, value, 0.0, high, low_open=True, what=what, integer=integer)
    return check


def _table(path: tuple[str, ...], value: Any, allowed: Mapping[str, Callable[[tuple[str, ...], Any], None]]) -> None:
    """Check a table whose keys are ``allowed`` (each with its checker) or documentation keys."""
    if not isinstance(value, Mapping):
        raise _Bad(f"{_tname(path)} must be a table")
    for key, v in value.items():
        key = str(key)
        sub = (*path, key)
        if key in DOC_KEYS:
            if not isinstance(v, str | list):
                raise _Bad(f"{_where(sub)} = {v!r}: a documentation key, must be a string")
        elif key in allowed:
            allowed[key](sub, v)
        else:
            raise _Bad(f"{_tname(path)}: unknown key {key!r}; allowed: {', '.join(sorted(allowed))}")


def _keyed(what: str, names: tuple[str, ...] | None, check: Callable[[tuple[str, ...], Any], None],
           name_check: Callable[[str], bool] | None = None) -> Callable[[tuple[str, ...], Any], None]:
    """A table of ``name -> value``: names from ``names`` (or accepted by ``name_check``)."""
    def table(path: tuple[str, ...], value: Any) -> None:
        if not isinstance(value, Mapping):
            raise _Bad(f"{_tname(path)} must be a table of {what}")
        for key, v in value.items():
            key = str(key)
            if key in DOC_KEYS:
                continue
            good = key in names if names is not None else bool(name_check and name_check(key))
            if not good:
                allowed = ", ".join(names) if names is not None else what
                raise _Bad(f"{_tname(path)}: unknown key {key!r}; allowed: {allowed}")
            check((*path, key), v)
    return table


def _head_dim(key: str) -> bool:
    return key.isdigit() and int(key) > 0


def _gemm_class(path: tuple[str, ...], value: Any) -> None:
    _number(path, value, 0.0, WINOGRAD_MAX_EFFICIENCY, low_open=True,
            what="a multiple of the peak in the model's tiled GEMM time; 4 is Winograd F(4x4, 3x3)'s saving")


def _tiles(path: tuple[str, ...], value: Any) -> None:
    if not isinstance(value, list) or not value or not all(
            isinstance(t, list) and len(t) == 2 and all(isinstance(x, int) and not isinstance(x, bool) and x > 0
                                                        for x in t) for t in value):
        raise _Bad(f"{_where(path)} = {value!r}: must be a non-empty list of [rows, columns] pairs of positive "
                   f"integers (output tiles, e.g. [[128, 128], [128, 256]])")


def _attention_tables(kernel: bool) -> dict[str, Callable[[tuple[str, ...], Any], None]]:
    tables: dict[str, Callable[[tuple[str, ...], Any], None]] = {
        "fwd_efficiency": _keyed("head dim -> fraction", None, _fraction, _head_dim),
        "bwd_efficiency": _keyed("head dim -> fraction", None, _fraction, _head_dim),
        "cta_overhead_blocks": _keyed("head dim -> key blocks", None,
                                      _positive("key-block iterations of one CTA's fixed cost", 1e3), _head_dim),
    }
    if kernel:
        tables["architectures"] = _architectures
    else:
        tables["block"] = _positive("rows of a query/key block", 4096, integer=True)
    return tables


def _architectures(path: tuple[str, ...], value: Any) -> None:
    archs = known_architectures()
    if not isinstance(value, list) or not all(isinstance(a, str) and a in archs for a in value):
        raise _Bad(f"{_where(path)} = {value!r}: must be a list of architectures from {', '.join(archs)}")


def _attention(path: tuple[str, ...], value: Any) -> None:
    from hwmodel.costmodel import Calibration

    shipped = Calibration.load().data["default"]["attention"].get("kernels", {})
    kernel = _attention_tables(kernel=True)
    _table(path, value, {**_attention_tables(kernel=False),
                         "kernels": _keyed("attention kernels", tuple(sorted(shipped)),
                                           lambda p, v: _table(p, v, kernel))})


def _kernel_section() -> dict[str, Callable[[tuple[str, ...], Any], None]]:
    from hwmodel.costmodel import MEMORY_BOUND_KINDS

    return {
        "launch_overhead_s": _time,
        "sustained_clock_fraction": _fraction,
        "hbm_efficiency": _fraction,
        "vector_efficiency": _fraction,
        "memory_bytes_per_sm": _positive("bytes moved per SM", 2.0**30),
        "gemm_tiles": _tiles,
        "gemm_efficiency": _keyed("dtypes", _DTYPES, _fraction),
        "fp8_gemm_time_factor": _keyed("FP8 scalings", FP8_SCALINGS,
                                       _positive("time over the per-tensor-scaled FP8 GEMM's", 10.0)),
        "attention": _attention,
        "gemm_class_efficiency": _keyed("GEMM shape classes (matmul, conv1x1, conv3x3, with s<stride>, _fwd/_bwd "
                                        "and @m<b>n<c>k<d>)", None, _gemm_class, lambda k: bool(_GEMM_CLASS.match(k))),
        "hbm_efficiency_by_kind": _keyed("memory-bound kinds", tuple(sorted(MEMORY_BOUND_KINDS)), _fraction),
    }


def _nvlink_row(path: tuple[str, ...], value: Any) -> None:
    rate = _positive("bytes/s", 1e14)
    count = _positive("count", 1e6, integer=True)  # the fitted log's group size (calibrate --nccl-log)
    _table(path, value, {"busbw_Bps": rate, "line_rate_Bps": rate, "ranks": count, "nodes": count})
    missing = [k for k in ("busbw_Bps", "line_rate_Bps") if k not in value]
    if missing:
        raise _Bad(f"{_tname(path)}: needs busbw_Bps and line_rate_Bps (missing {', '.join(missing)})")
    if value["busbw_Bps"] > value["line_rate_Bps"]:
        raise _Bad(f"{_where((*path, 'busbw_Bps'))} = {value['busbw_Bps']:g}: above line_rate_Bps = "
                   f"{value['line_rate_Bps']:g} (NCCL cannot beat the NVLink line rate)")


def _curve(path: tuple[str, ...], value: Any) -> None:
    from hwmodel.nccl.engine import FIDELITIES

    def fidelity(p: tuple[str, ...], v: Any) -> None:
        if v not in FIDELITIES:
            raise _Bad(f"{_where(p)} = {v!r}: must be one of {', '.join(FIDELITIES)}")

    def name(p: tuple[str, ...], v: Any) -> None:
        if not isinstance(v, str):
            raise _Bad(f"{_where(p)} = {v!r}: must be a collective name (all_reduce, all_gather, ...)")

    def numbers(positive: bool) -> Callable[[tuple[str, ...], Any], None]:
        def check(p: tuple[str, ...], v: Any) -> None:
            if not isinstance(v, list) or not all(isinstance(x, int | float) and not isinstance(x, bool)
                                                  and math.isfinite(x) and (x > 0 or not positive) for x in v):
                raise _Bad(f"{_where(p)} = {v!r}: must be a list of " + ("numbers > 0" if positive else "numbers"))
        return check

    count = _positive("a count", 1e7, integer=True)
    _table(path, value, {"collective": name, "ranks": count, "nodes": count, "log2_size_bytes": numbers(False),
                         "factor": numbers(True), "fidelity": fidelity})
    missing = [k for k in _CURVE_KEYS[:5] if k not in value]
    if missing:
        raise _Bad(f"{_tname(path)}: needs collective, ranks, nodes, log2_size_bytes and factor "
                   f"(missing {', '.join(missing)})")
    xs, ys = value["log2_size_bytes"], value["factor"]
    if not xs or len(xs) != len(ys) or any(b <= a for a, b in zip(xs, xs[1:], strict=False)):
        raise _Bad(f"{_tname(path)}: log2_size_bytes must increase, with one factor > 0 per knot")


def _nccl_section() -> dict[str, Callable[[tuple[str, ...], Any], None]]:
    archs = known_architectures()
    return {
        "ib_app_efficiency": _fraction,
        "host_launch_s": _time,
        "host_per_channel_s": _time,
        "host_fit_gpus": _positive("GPUs driven by the fitted host thread", 1024, integer=True),
        "nvlink_efficiency": _keyed("architectures", archs, _nvlink_row),
        "copy_engine_nvlink_efficiency": _keyed("architectures", archs, _fraction),
        "busbw_correction": _keyed("architectures", archs, _keyed("curves", None, _curve, lambda k: True)),
    }


def known_architectures() -> tuple[str, ...]:
    """Lower-case architectures of the known GPUs and of the compute capabilities the cost model maps
    (``ada``, ``ampere``, ...): the keys of ``[architecture.<arch>]`` and of the NCCL per-generation tables."""
    from hwmodel.costmodel import _CC_TO_ARCH
    from hwmodel.specs import get_gpu, known_gpus

    return tuple(sorted({get_gpu(n).architecture.lower() for n in known_gpus()} | set(_CC_TO_ARCH.values())))


def check_profile(data: Mapping[str, Any], model_sections: tuple[str, ...]) -> None:
    """Check every key of a profile's model sections (``default``, ``architecture``, ``gpu``, ``nccl``) and
    refuse a section a profile cannot change or does not have (a misspelt ``[defualt]``).

    ``data``: the parsed profile; ``model_sections``: the sections merged over the shipped calibration.

    Raises:
        ValueError: one line naming the key (as ``[section] key``) and its allowed keys or range.
    """
    try:
        for section, why in FORBIDDEN_SECTIONS.items():
            if section in data:
                raise _Bad(f"[{section}] cannot be set by a profile ({why}); a profile sets "
                           f"{', '.join(f'[{s}]' for s in model_sections)}")
        unknown = sorted(set(data) - set(model_sections) - set(RECORD_SECTIONS))
        if unknown:
            raise _Bad(f"unknown section [{unknown[0]}]; allowed: "
                       + ", ".join(f"[{s}]" for s in (*model_sections, *RECORD_SECTIONS)))
        kernel = _kernel_section()
        if "default" in data:
            _table(("default",), data["default"], kernel)
        if "architecture" in data:
            _keyed("architectures", known_architectures(), lambda p, v: _table(p, v, kernel))(
                ("architecture",), data["architecture"])
        if "gpu" in data:  # any name: a what-if GPU of a gpu_file is calibrated under its own name
            _keyed("GPU names", None, lambda p, v: _table(p, v, kernel), lambda k: bool(k))(("gpu",), data["gpu"])
        if "nccl" in data:
            _table(("nccl",), data["nccl"], _nccl_section())
    except _Bad as exc:
        raise ValueError(str(exc)) from None
