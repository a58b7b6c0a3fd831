"""Read nccl-tests output (``all_reduce_perf`` and the other ``*_perf`` binaries), any version.

Header lines give what the fit needs: ``# nccl-tests version ... nccl-library=22907`` or ``NCCL version
2.29.7+cuda12`` (the NCCL release), ``# Collective test starting: all_reduce_perf``, ``nThread T nGpus G``
and one ``Rank r ... on HOST device d ... NAME`` line per rank (ranks, nodes, GPU). Result rows are
``size count type redop [root] time algbw busbw #wrong time algbw busbw #wrong`` (the ``root`` column
appeared in nccl-tests 2.10; old releases print a float ``error`` column instead of ``#wrong``); the
out-of-place half is used, as ``trainsim nccl-tests`` prints it. ``NCCL_DEBUG=INFO`` lines, when present,
add NCCL's algorithm and protocol per size (``NCCL_DEBUG_SUBSYS=TUNING``: ``N Bytes -> Algo a proto p``)
and its channel count (``N coll channels``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from hwmodel.nccl import nccltests as N
from scenarios.calibrate import CalibrationInputError

ALGORITHMS = ("tree", "ring", "collnet_direct", "collnet_chain", "nvls", "nvls_tree", "pat")
"""NCCL's algorithm indices (``NCCL_ALGO_TREE`` = 0, ... ``NCCL_ALGO_PAT`` = 6; ``src/include/device.h``)."""
PROTOCOLS = ("ll", "ll128", "simple")
"""NCCL's protocol indices (``NCCL_PROTO_LL`` = 0, ``LL128``, ``SIMPLE``)."""

_FILE_NAMES = ("reduce_scatter", "all_reduce", "all_gather", "alltoall", "broadcast", "sendrecv", "reduce")
_RANK = re.compile(r"Rank\s+(\d+)\s+(?:Group\s+\d+\s+)?Pid\s+\d+\s+on\s+(\S+)\s+device\s+\d+\s+\[[^\]]*\]\s+(.+)$")
_TUNING = re.compile(r"(\d+) Bytes -> Algo (\d+) proto (\d+)")


@dataclass(frozen=True)
class NcclRow:
    """One out-of-place result row (SI units)."""

    size_bytes: int
    time_s: float
    algbw_Bps: float
    busbw_Bps: float


@dataclass
class NcclLog:
    """A parsed nccl-tests run."""

    path: str
    collective: str
    rows: list[NcclRow]
    ranks: int
    nodes: int
    gpus_per_thread: int
    gpu_name: str = ""
    nccl_version: str = ""
    channels: int | None = None
    choices: dict[int, tuple[str, str]] = field(default_factory=dict)
    """size -> (algorithm, protocol) from ``NCCL_DEBUG_SUBSYS=TUNING`` lines."""
    skipped: list[tuple[int, str]] = field(default_factory=list)
    """(1-based line number, text) of lines that start like a result row (a size, then a count) but do not
    parse as one -- a truncated or garbled row; they are left out of the fit, and the caller warns."""


def _nccl_version(line: str) -> str:
    m = re.search(r"nccl-library=(\d+)", line)
    if m:
        code = int(m.group(1))
        return f"{code // 10000}.{code // 100 % 100}.{code % 100}"
    m = re.search(r"NCCL version (\d+\.\d+\.\d+)", line)
    return m.group(1) if m else ""


def read_nccl_log(path: str | Path) -> NcclLog:
    """Parse one nccl-tests output file.

    Raises:
        CalibrationInputError: unreadable, no result rows, a row with wrong results (``#wrong`` > 0), no
            way to tell the collective (no ``Collective test starting`` line and a file name without it), no
            way to tell the rank count (no ``nGpus`` line and no ``Rank`` lines), or a single rank.
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise CalibrationInputError(f"{p}: cannot read it ({exc.strerror})") from None
    collective, version, g, channels = "", "", 0, None
    ranks: dict[int, tuple[str, str]] = {}
    rows: list[NcclRow] = []
    choices: dict[int, tuple[str, str]] = {}
    skipped: list[tuple[int, str]] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = re.sub(r"^\[\d+\]\s*", "", raw.strip()).replace("[0]", " ")
        version = version or _nccl_version(line)
        if "Collective test starting:" in line:
            collective = line.split(":", 1)[1].strip()
        if m := re.search(r"nGpus\s+(\d+)", line):
            g = int(m.group(1))
        if m := _RANK.search(line):
            ranks[int(m.group(1))] = (m.group(2), m.group(3).strip())
        if m := _TUNING.search(line):
            choices[int(m.group(1))] = (ALGORITHMS[int(m.group(2))] if int(m.group(2)) < len(ALGORITHMS) else "?",
                                        PROTOCOLS[int(m.group(3))] if int(m.group(3)) < len(PROTOCOLS) else "?")
        if m := re.search(r"(\d+) coll channels", line):
            channels = int(m.group(1))
        row = _row(p, line)
        if isinstance(row, NcclRow):
            rows.append(row)
        elif row is _GARBLED:
            skipped.append((number, raw.strip()))
    if not rows:
        raise CalibrationInputError(f"{p}: no nccl-tests result rows (size count type redop ... busbw #wrong)")
    if not collective:
        stem = p.name.lower()
        collective = next((c for c in _FILE_NAMES if c in stem or c.replace("_", "") in stem), "")
    if not collective:
        raise CalibrationInputError(f"{p}: cannot tell the collective (no '# Collective test starting' line); name "
                                    f"the file after it, e.g. all_reduce_perf.log")
    if not g and not ranks:
        raise CalibrationInputError(f"{p}: cannot tell how many GPUs ran it (no 'nThread T nGpus G' line and no "
                                    f"'Rank r ... device d' lines): keep nccl-tests' header in the log")
    if max(len(ranks), g) < 2:
        raise CalibrationInputError(f"{p}: ran on one GPU (busbw is 0 there): a log of 2 or more ranks is needed")
    hosts = {h for h, _ in ranks.values()}
    gpu = next(iter(ranks.values()))[1] if ranks else ""
    return NcclLog(str(p), N.canonical_collective(collective), rows, max(len(ranks), g), max(len(hosts), 1),
                   g or 1, gpu, version, channels, choices, skipped)


_GARBLED = object()
""":func:`_row`'s answer for a line that starts like a result row but is not one."""


def _row(path: Path, line: str) -> NcclRow | object | None:
    """The row of ``line``; ``None`` for a line that is not a row (header, ``NCCL INFO``, a size-0 row),
    :data:`_GARBLED` for one that starts with a size but does not parse (cut off, mangled)."""
    tok = line.split()
    if not tok or not tok[0].isdigit() or (len(tok) > 1 and not tok[1].isdigit()):
        return None  # a row starts with its size and count; "2 coll channels" is not one
    if len(tok) < 12:
        return _GARBLED
    k = 5 if len(tok) >= 13 else 4  # with or without the root column
    try:
        size, time_us, algbw, busbw = int(tok[0]), float(tok[k]), float(tok[k + 1]), float(tok[k + 2])
    except ValueError:
        return _GARBLED
    wrong = tok[k + 3]
    if wrong.isdigit() and int(wrong) > 0:
        raise CalibrationInputError(f"{path}: the {size}-byte row has {wrong} wrong results (#wrong): a run "
                                    f"that failed validation cannot be fitted")
    if size == 0 or time_us <= 0:
        return None
    return NcclRow(size, time_us * 1e-6, algbw * 1e9, busbw * 1e9)
