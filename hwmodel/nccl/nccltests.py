"""nccl-tests conventions: sizes, element counts, algbw/busbw, and the results table.

Follows NVIDIA/nccl-tests 2.19.6 (commit ``a0b82b22``): ``doc/PERFORMANCE.md``, ``src/common.cu``
(``parsesize``, ``setupArgs``, the size loop), ``src/util.cu`` (table layout) and each test's
``*GetCollByteCount`` / ``*GetBw``. GB is 1e9 bytes, as nccl-tests prints it.

* ``S`` (the printed ``size``) is the per-rank buffer for all-reduce, broadcast, reduce and sendrecv, and
  the **total** buffer (``count * typesize * nranks``) for all-gather, reduce-scatter and alltoall.
* ``algbw = S / t``; ``busbw = algbw * factor`` with factor 2(n-1)/n (all-reduce), (n-1)/n (all-gather,
  reduce-scatter, alltoall), 1 (broadcast, reduce, sendrecv).

Functions take and return SI units (bytes, seconds, bytes/s); :func:`format_table` and
:func:`rows_to_json` convert to nccl-tests' µs and GB/s.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

__all__ = [
    "BUSBW_COLLECTIVES",
    "DTYPE_SIZES",
    "NCCL_TESTS_VERSION",
    "NcclTestsRow",
    "algbw_Bps",
    "busbw_Bps",
    "busbw_factor",
    "canonical_collective",
    "dtype_size",
    "element_count",
    "format_table",
    "make_row",
    "model_rows",
    "nccltests_dtype",
    "nccltests_size_bytes",
    "parse_size",
    "rows_to_json",
    "size_sweep",
]

NCCL_TESTS_VERSION = "2.19.6"
"""nccl-tests version whose conventions are reproduced (``NCCL_TESTS_VERSION`` at ``a0b82b22``)."""

GB = 1e9
"""nccl-tests' GB: ``bytes / 1.0E9 / sec`` in every ``*GetBw``."""

BUSBW_COLLECTIVES: tuple[str, ...] = (
    "all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all", "sendrecv",
)
"""Collectives with an nccl-tests bandwidth rule (``hwmodel.ir`` names plus ``sendrecv``)."""

_ALIASES = {"alltoall": "all_to_all", "allreduce": "all_reduce", "allgather": "all_gather",
            "reducescatter": "reduce_scatter", "send_recv": "sendrecv"}

_TOTAL_SIZE = frozenset({"all_gather", "reduce_scatter", "all_to_all"})
"""Collectives whose S counts all ranks' data (``count*typesize*nranks`` in ``*GetBw``)."""

_PROGRAM = {"all_reduce": "all_reduce_perf", "all_gather": "all_gather_perf",
            "reduce_scatter": "reduce_scatter_perf", "broadcast": "broadcast_perf", "reduce": "reduce_perf",
            "all_to_all": "alltoall_perf", "sendrecv": "sendrecv_perf"}

DTYPE_SIZES: dict[str, int] = {
    "int8": 1, "uint8": 1, "int32": 4, "uint32": 4, "int64": 8, "uint64": 8,
    "half": 2, "float": 4, "double": 8, "bfloat16": 2, "f8e4m3": 1, "f8e5m2": 1,
}
"""Bytes per element for nccl-tests' type names (``test_typenames`` in ``src/common.cu``)."""

_DTYPE_ALIASES = {
    "fp32": "float", "float32": "float", "f32": "float", "fp16": "half", "float16": "half", "f16": "half",
    "bf16": "bfloat16", "fp64": "double", "float64": "double", "fp8": "f8e4m3", "e4m3": "f8e4m3",
    "e5m2": "f8e5m2", "float8_e4m3fn": "f8e4m3", "float8_e5m2": "f8e5m2", "int": "int32", "char": "int8",
}


def _coll(coll: str) -> str:
    c = str(coll).lower()
    c = _ALIASES.get(c, c)
    if c not in BUSBW_COLLECTIVES:
        raise ValueError(f"unknown collective {coll!r}; allowed: {', '.join(BUSBW_COLLECTIVES)}")
    return c


def canonical_collective(name: str) -> str:
    """The collective an nccl-tests binary or collective name denotes: ``all_reduce_perf``,
    ``allreduce`` and ``all_reduce`` -> ``all_reduce``; ``alltoall_perf`` -> ``all_to_all``;
    ``sendrecv_perf`` -> ``sendrecv``. Case and ``-`` vs ``_`` do not matter.

    Raises:
        ValueError: unknown name (the message lists the allowed ones).
    """
    c = str(name).strip().lower().replace("-", "_").removeprefix("./")
    c = c.removesuffix("_perf")
    return _coll(c)


def nccltests_dtype(dtype: str) -> str:
    """nccl-tests' name for a dtype (``bf16`` -> ``bfloat16``, ``fp32`` -> ``float``).

    Raises:
        ValueError: unknown dtype.
    """
    d = str(dtype).lower()
    d = _DTYPE_ALIASES.get(d, d)
    if d not in DTYPE_SIZES:
        raise ValueError(f"unknown dtype {dtype!r}; allowed: {', '.join(DTYPE_SIZES)} (or aliases "
                         f"{', '.join(_DTYPE_ALIASES)})")
    return d


def dtype_size(dtype: str) -> int:
    """Bytes per element of ``dtype`` (nccl-tests ``wordSize``)."""
    return DTYPE_SIZES[nccltests_dtype(dtype)]


def busbw_factor(coll: str, n_ranks: int) -> float:
    """nccl-tests' bus-bandwidth factor (``doc/PERFORMANCE.md``; ``*GetBw`` in ``src/*.cu``).

    all_reduce 2(n-1)/n; all_gather, reduce_scatter, all_to_all (n-1)/n; broadcast, reduce, sendrecv 1.
    """
    c = _coll(coll)
    if n_ranks < 1:
        raise ValueError(f"n_ranks must be >= 1, got {n_ranks}")
    n = n_ranks
    if c == "all_reduce":
        return 2.0 * (n - 1) / n
    if c in _TOTAL_SIZE:
        return (n - 1) / n
    return 1.0


def parse_size(text: str | int) -> int:
    """Parse an nccl-tests size argument (``-b``/``-e``): a number with an optional K, M or G suffix
    (case-insensitive, powers of 1024: ``"8G"`` = 8 * 2**30). Fractions are allowed and truncated to
    bytes (``parsesize`` in ``src/common.cu`` returns ``size * units``; the caller casts to size_t).

    Raises:
        ValueError: not of that form, or negative.
    """
    if isinstance(text, int):
        if text < 0:
            raise ValueError(f"negative size {text}")
        return text
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([kKmMgG]?)\s*", str(text))
    if not m:
        raise ValueError(f"invalid size {text!r}: expected a number with an optional K, M or G suffix")
    units = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}[m.group(2).lower()]
    return int(float(m.group(1)) * units)


def size_sweep(
    min_bytes: int | str, max_bytes: int | str, factor: int = 2, step_bytes: int | str | None = None
) -> list[int]:
    """Sizes an nccl-tests run visits: ``for (size = min; size <= max; size = factor > 1 ? size*factor
    : size + step)`` (``TimeTest`` in ``src/common.cu``). ``step_bytes`` is used when ``factor <= 1``.

    Raises:
        ValueError: ``min > max``, or no usable step.
    """
    lo, hi = parse_size(min_bytes), parse_size(max_bytes)
    if lo > hi:
        raise ValueError(f"invalid sizes for 'minbytes' and 'maxbytes': {lo} > {hi}")
    step = parse_size(step_bytes) if step_bytes is not None else 0
    if factor <= 1 and step <= 0:
        raise ValueError("need factor > 1 or step_bytes > 0")
    if factor > 1 and lo == 0:
        raise ValueError("a geometric sweep needs min_bytes > 0")
    sizes = []
    size = lo
    while size <= hi:
        sizes.append(size)
        size = size * factor if factor > 1 else size + step
    return sizes


def element_count(coll: str, size_bytes: int, dtype: str, n_ranks: int) -> int:
    """nccl-tests' printed ``count``: elements each rank passes to NCCL for a ``-b`` size.

    ``count = size / typesize``; all_gather, reduce_scatter and alltoall use the per-rank
    ``(count/nranks) & ~(16/typesize - 1)`` (16-byte aligned; ``*GetCollByteCount``).
    """
    c = _coll(coll)
    ts = dtype_size(dtype)
    count = int(size_bytes) // ts
    if c in _TOTAL_SIZE:
        align = max(1, 16 // ts)
        return (count // n_ranks) & ~(align - 1)
    return count


def nccltests_size_bytes(coll: str, size_bytes: int, dtype: str, n_ranks: int) -> int:
    """The S nccl-tests prints and divides by t: ``count*typesize`` (times nranks for all_gather,
    reduce_scatter and alltoall), after the alignment of :func:`element_count`."""
    c = _coll(coll)
    count = element_count(c, size_bytes, dtype, n_ranks)
    s = count * dtype_size(dtype)
    return s * n_ranks if c in _TOTAL_SIZE else s


def algbw_Bps(size_bytes: float, time_s: float) -> float:
    """``algbw = S / t``, bytes/s (S as :func:`nccltests_size_bytes`)."""
    if time_s <= 0:
        raise ValueError(f"time must be > 0, got {time_s}")
    return size_bytes / time_s


def busbw_Bps(coll: str, size_bytes: float, time_s: float, n_ranks: int) -> float:
    """``busbw = algbw * factor`` (:func:`busbw_factor`), bytes/s."""
    return algbw_Bps(size_bytes, time_s) * busbw_factor(coll, n_ranks)


@dataclass(frozen=True, slots=True)
class NcclTestsRow:
    """One out-of-place result line, plus trainsim's algorithm and protocol."""

    collective: str
    size_bytes: int
    """S as nccl-tests prints it (bytes)."""
    count: int
    """Elements per rank passed to NCCL (nccl-tests ``count``)."""
    dtype: str
    """nccl-tests type name (``float``, ``bfloat16``, ...)."""
    redop: str
    """``sum`` ... or ``none`` (all_gather, broadcast, alltoall)."""
    root: int
    """Root rank (broadcast/reduce), else -1."""
    n_ranks: int
    time_s: float
    algbw_Bps: float
    busbw_Bps: float
    algorithm: str = ""
    protocol: str = ""


def make_row(
    coll: str,
    size_bytes: int,
    time_s: float,
    n_ranks: int,
    dtype: str = "float",
    *,
    redop: str | None = None,
    root: int | None = None,
    algorithm: str = "",
    protocol: str = "",
) -> NcclTestsRow:
    """Build a row the way nccl-tests would report a run of ``-b size`` taking ``time_s``.

    ``size_bytes`` is the requested size; S, count, algbw and busbw follow nccl-tests' rules.
    """
    c = _coll(coll)
    d = nccltests_dtype(dtype)
    s = nccltests_size_bytes(c, size_bytes, d, n_ranks)
    if redop is None:
        redop = "none" if c in ("all_gather", "broadcast", "all_to_all") else "sum"
    if root is None:
        root = 0 if c in ("broadcast", "reduce") else -1
    return NcclTestsRow(
        collective=c,
        size_bytes=s,
        count=element_count(c, size_bytes, d, n_ranks),
        dtype=d,
        redop=redop,
        root=root,
        n_ranks=n_ranks,
        time_s=time_s,
        algbw_Bps=algbw_Bps(s, time_s),
        busbw_Bps=busbw_Bps(c, s, time_s, n_ranks),
        algorithm=algorithm,
        protocol=protocol,
    )


def model_rows(
    coll: str,
    topo,
    sizes: Iterable[int | str],
    dtype: str = "float",
    *,
    algo: str | None = None,
    proto: str | None = None,
) -> list[NcclTestsRow]:
    """nccl-tests rows predicted by NCCL's own tuning model (:func:`hwmodel.nccl.tuner.choose`).

    Handy as a baseline next to simulated or measured rows. ``topo`` is a
    :class:`hwmodel.nccl.channels.CommTopology`; only tuned collectives (not alltoall/sendrecv).
    """
    from hwmodel.nccl.tuner import choose

    c = _coll(coll)
    rows = []
    for size in sizes:
        b = parse_size(size)
        s = nccltests_size_bytes(c, b, dtype, topo.n_ranks)
        ch = choose(c, s, topo, algo=algo, proto=proto, dtype=dtype)
        rows.append(make_row(c, b, ch.predicted_time_s, topo.n_ranks, dtype,
                             algorithm=ch.algorithm, protocol=ch.protocol))
    return rows


def _float_str(value: float, width: int) -> str:
    """nccl-tests' ``getFloatStr``: %.2f, else %.1f, else %.0f, else exponent, to fit ``width``."""
    for fmt in (f"{{:{width}.2f}}", f"{{:{width}.1f}}", f"{{:{width}.0f}}"):
        s = fmt.format(value)
        if len(s) <= width:
            return s
    s = f"{value:{width}.1e}" if width >= 7 else f"{value:{width}.0e}"
    return s[:width]


def _header_line(first: tuple[str, ...], rest: tuple[str, ...] = (), tail: str = "", algo_width: int = 6) -> str:
    """``"# %10s  %12s  %8s  %6s  %6s"`` then ``"  %7s  %6s  %6s  %6s  %6s"`` (nccl-tests util.cu); the
    algo column widens for longer names (``nvls_tree``)."""
    a, b, c, d, e = first
    line = f"# {a:>10s}  {b:>12s}  {c:>8s}  {d:>6s}  {e:>6s}"
    if rest:
        t, alg, bus, algo, proto = rest
        line += f"  {t:>7s}  {alg:>6s}  {bus:>6s}  {algo:>{algo_width}s}  {proto:>6s}"
    return (line + tail).rstrip()


def format_table(
    rows: Sequence[NcclTestsRow],
    *,
    n_threads: int = 1,
    n_gpus: int | None = None,
    program: str | None = None,
    step_factor: int | None = None,
    min_bytes: int | None = None,
    max_bytes: int | None = None,
) -> str:
    """The nccl-tests results table (out-of-place half) for ``rows``, as text ending in a newline.

    Layout from nccl-tests ``src/util.cu``: ``"%12li  %12li  %8s  %6s  %6s"`` for size, count, type,
    redop, root, then ``"  %7s  %6s  %6s"`` for time (µs), algbw and busbw (GB/s, ``getFloatStr``).
    Differences, all trainsim's: no in-place half and no ``#wrong`` column (nothing is validated), and
    two extra columns ``algo`` and ``proto`` (``"  %6s  %6s"``, algo wider for ``nvls_tree``) with the
    algorithm and protocol used.
    The header mimics nccl-tests' (``# nThread 1 nGpus 8 minBytes ...``, nGpus = ranks of the first
    row; ``step_factor`` or the ratio of the first two sizes; warmup/iters 0/1 because a model has
    none), and the footer gives the average busbw (GB/s, ``%g``) as nccl-tests does. ``minBytes`` and
    ``maxBytes`` are the requested ``-b`` / ``-e`` (``min_bytes``, ``max_bytes``), as nccl-tests prints
    them, not the largest size run (``-b 1M -e 8G -f 4`` runs up to 4 GiB and says ``maxBytes
    8589934592``); they default to the smallest and largest row.
    """
    if not rows:
        raise ValueError("format_table needs at least one row")
    first = rows[0]
    prog = program or _PROGRAM[first.collective]
    gpus = first.n_ranks if n_gpus is None else n_gpus
    sizes = [r.size_bytes for r in rows]
    if step_factor is not None:
        step, kind = step_factor, "factor"
    elif len(sizes) >= 2 and sizes[0] > 0 and sizes[1] % sizes[0] == 0 and sizes[1] > sizes[0]:
        step, kind = sizes[1] // sizes[0], "factor"
    else:
        step, kind = (sizes[1] - sizes[0] if len(sizes) >= 2 else 0), "bytes"
    aw = max(6, *(len(r.algorithm) for r in rows))
    lines = [
        f"# Collective test starting: {prog} (trainsim model)",
        f"# nThread {n_threads} nGpus {gpus} minBytes {min(sizes) if min_bytes is None else min_bytes} "
        f"maxBytes {max(sizes) if max_bytes is None else max_bytes} "
        f"step: {step}({kind}) warmup iters: 0 iters: 1 agg iters: 1 validation: 0 graph: 0 unalign: 0",
        "#",
        _header_line(("", "", "", "", ""), tail="           out-of-place            trainsim"),
        _header_line(("size", "count", "type", "redop", "root"), ("time", "algbw", "busbw", "algo", "proto"),
                     algo_width=aw),
        _header_line(("(B)", "(elements)", "", "", ""), ("(us)", "(GB/s)", "(GB/s)", "", ""), algo_width=aw),
    ]
    for r in rows:
        time_s = _float_str(r.time_s * 1e6, 7)
        alg = _float_str(r.algbw_Bps / GB, 6)
        bus = _float_str(r.busbw_Bps / GB, 6)
        lines.append(
            f"{r.size_bytes:12d}  {r.count:12d}  {r.dtype:>8s}  {r.redop:>6s}  {r.root:6d}"
            f"  {time_s:>7s}  {alg:>6s}  {bus:>6s}  {r.algorithm:>{aw}s}  {r.protocol:>6s}"
        )
    avg = sum(r.busbw_Bps for r in rows) / len(rows) / GB
    lines += [f"# {'Avg bus bandwidth':<20s} : {avg:g}", "#"]
    return "\n".join(lines) + "\n"


def rows_to_json(rows: Iterable[NcclTestsRow]) -> list[dict]:
    """JSON-ready records (pass to ``json.dumps``): ``size_bytes``, ``time_us``, ``algbw_GBps``,
    ``busbw_GBps``, ``algorithm``, ``protocol``, plus ``collective``, ``count``, ``type``, ``redop``,
    ``root`` and ``n_ranks``; a time or bandwidth that is not finite is ``None``. GB = 1e9 B as nccl-tests."""
    out = []
    for r in rows:
        out.append({
            "collective": r.collective,
            "size_bytes": int(r.size_bytes),
            "count": int(r.count),
            "type": r.dtype,
            "redop": r.redop,
            "root": int(r.root),
            "n_ranks": int(r.n_ranks),
            "time_us": _finite_or_none(r.time_s * 1e6),
            "algbw_GBps": _finite_or_none(r.algbw_Bps / GB),
            "busbw_GBps": _finite_or_none(r.busbw_Bps / GB),
            "algorithm": r.algorithm,
            "protocol": r.protocol,
        })
    return out


def _finite_or_none(x: float) -> float | None:
    """``x``, or ``None`` (JSON ``null``) for an infinite or NaN value, which JSON cannot hold."""
    return x if math.isfinite(x) else None
