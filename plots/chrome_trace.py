"""Kineto-compatible Chrome trace JSON from a run's events, for Perfetto, chrome://tracing and HTA.

Layout (as PyTorch's profiler, Kineto, writes GPU activity):

* one *process* per GPU: ``pid`` = global rank, named ``GPU <rank>`` (``process_name``,
  ``process_labels`` and ``process_sort_index`` metadata events);
* one *thread* per CUDA stream: ``tid`` from :func:`stream_tids` (``compute`` is 7, Kineto's id for
  the default stream; other streams follow), named by ``thread_name`` metadata;
* every executed task is a complete event (``ph: "X"``) with ``ts`` and ``dur`` in **microseconds**.
  Compute kernels and NCCL kernels have ``cat: "kernel"``; NCCL kernels are named as Kineto names them
  (``ncclDevKernel_AllReduce_Sum_bf16_RING_LL``) so HTA classifies them as communication; copies have
  ``cat: "gpu_memcpy"`` and names starting with ``Memcpy``. ``args`` carry ``device``, ``stream`` and
  ``correlation`` (HTA's minimum) plus what the simulator knows (kind, layer, phase, algorithm, ...);
* link utilisation, if given, as counter events (``ph: "C"``, value in percent of nominal capacity) in a
  separate process named ``Network`` (``pid`` = :data:`NETWORK_PID`).

Timestamps are rounded to whole nanoseconds and written as exact decimal microseconds, so tasks that
touch in the simulation touch in the trace. Perfetto refuses overlapping slices on one track; tasks of
one stream never overlap, but if some did, the later ones go to an extra thread ``<tid> + 1000 * k``
named ``<stream> (overlap k)``.

One file holding every rank (:func:`to_chrome_trace`, :func:`write_chrome_trace`) is what Perfetto
wants. HTA wants a directory with one file per rank whose ``distributedInfo.rank`` says which
(:func:`write_per_rank_traces`); in the single file, ``distributedInfo.rank`` is 0 and ``world_size``
the caller's (``trainsim run --trace``: the job's GPUs, of which it may hold a few), by default the
number of ranks in it.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "NETWORK_PID",
    "stream_tids",
    "kineto_kernel_name",
    "to_chrome_trace",
    "write_chrome_trace",
    "write_per_rank_traces",
]

NETWORK_PID = 1_000_000
"""``pid`` of the ``Network`` process holding link counter tracks (far above any GPU rank)."""

HOST_TID = 0
"""``tid`` of the host thread that carries ``ProfilerStep#N`` annotations in each GPU process."""

_KNOWN_STREAMS = ("compute", "comm", "nccl", "tp", "dp", "pp", "p2p", "copy", "h2d", "d2h")
_OVERLAP_TID_STRIDE = 1000

_NCCL_OPS = {
    "all_reduce": "AllReduce_Sum",
    "reduce_scatter": "ReduceScatter_Sum",
    "reduce": "Reduce_Sum",
    "all_gather": "AllGather",
    "broadcast": "Broadcast",
    "all_to_all": "SendRecv",  # NCCL runs all-to-all as grouped send/recv
}
_NCCL_DTYPES = {"fp32": "f32", "float32": "f32", "fp16": "f16", "float16": "f16", "bf16": "bf16",
                "fp8": "f8e4m3", "fp64": "f64", "int8": "i8", "int32": "i32", "tf32": "f32"}
_DTYPE_BYTES = {"fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2, "fp8": 1, "fp64": 8, "int8": 1, "int32": 4}
_MEMCPY_NAMES = {"h2d": "Memcpy HtoD", "d2h": "Memcpy DtoH", "d2d": "Memcpy DtoD", "peer": "Memcpy PtoP"}


def stream_tids(streams: Iterable[str]) -> dict[str, int]:
    """Stable thread ids for stream names: ``compute`` -> 7 (Kineto's default stream), then the known
    names (comm, nccl, tp, dp, pp, p2p, copy, h2d, d2h) in that order, then the rest alphabetically,
    numbered 8, 9, ... The mapping depends only on the *set* of names, so files of different ranks
    written from one run agree."""
    names = set(streams)
    ordered = [s for s in _KNOWN_STREAMS if s in names] + sorted(names - set(_KNOWN_STREAMS))
    tids: dict[str, int] = {}
    nxt = 8
    for s in ordered:
        if s == "compute":
            tids[s] = 7
        else:
            tids[s] = nxt
            nxt += 1
    return tids


def kineto_kernel_name(op: str, algorithm: str | None = None, protocol: str | None = None,
                       dtype: str = "bf16") -> str:
    """The NCCL kernel name Kineto records for a collective, e.g.
    ``kineto_kernel_name("all_reduce", "ring", "ll") == "ncclDevKernel_AllReduce_Sum_bf16_RING_LL"``.

    ``op`` is one of the IR's collective ops (unknown ones are CamelCased). Reducing collectives carry
    the reduction and dtype, as NCCL >= 2.19 names them; gathers and broadcasts do not.
    """
    base = _NCCL_OPS.get(op) or "".join(p.capitalize() for p in op.split("_"))
    parts = ["ncclDevKernel", base]
    if base.endswith("_Sum"):
        parts.append(_NCCL_DTYPES.get(dtype, dtype))
    if base != "SendRecv":
        if algorithm:
            parts.append(str(algorithm).upper())
        if protocol:
            parts.append(str(protocol).upper())
    return "_".join(parts)


def _ns(t_s: float) -> int:
    return round(t_s * 1e9)


def _us(ns: int) -> float:
    return ns / 1000


def _event_record(ev: Any, collective_dtype: str) -> tuple[str, str, dict]:
    """(name, cat, args) for one trace event."""
    category = ev.category
    if category.startswith("nccl:"):
        return _collective_record(ev, category[5:], getattr(ev, "dtype", None) or collective_dtype)
    if category in ("send", "recv"):
        return _p2p_record(ev)
    if category == "memcpy":
        return _memcpy_record(ev)
    return _kernel_record(ev)


def _set_present(args: dict[str, Any], **values: Any) -> None:
    """``args.update`` with the values that are not None."""
    args.update((k, v) for k, v in values.items() if v is not None)


def _collective_record(ev: Any, op: str, dtype: str) -> tuple[str, str, dict]:
    """An NCCL kernel, from a :class:`hwmodel.events.CollectiveInfo` when the event has one."""
    info = getattr(ev, "info", None)
    algo, proto = getattr(info, "algorithm", None), getattr(info, "protocol", None)
    size = getattr(info, "size_bytes", None)
    args: dict[str, Any] = {"Collective name": op, "label": ev.name, "dtype": dtype}
    _set_present(args, algorithm=algo, protocol=proto, channels=getattr(info, "channels", None), size_bytes=size)
    if size is not None and dtype in _DTYPE_BYTES:
        args["In msg nelems"] = int(size) // _DTYPE_BYTES[dtype]
    return kineto_kernel_name(op, algo, proto, dtype), "kernel", args


def _p2p_record(ev: Any) -> tuple[str, str, dict]:
    """A send or receive, from a :class:`hwmodel.events.P2PInfo` when the event has one."""
    info = getattr(ev, "info", None)
    args: dict[str, Any] = {"Collective name": ev.category, "label": ev.name}
    _set_present(args, peer=getattr(info, "peer", None), size_bytes=getattr(info, "size_bytes", None))
    return "ncclDevKernel_SendRecv", "kernel", args


def _memcpy_record(ev: Any) -> tuple[str, str, dict]:
    """A copy, from a :class:`hwmodel.events.MemcpyInfo` when the event has one."""
    direction = ev.name[len("memcpy_"):] if ev.name.startswith("memcpy_") else ""
    args: dict[str, Any] = {"label": ev.name}
    _set_present(args, size_bytes=getattr(getattr(ev, "info", None), "size_bytes", None))
    return _MEMCPY_NAMES.get(direction) or f"Memcpy {ev.name}", "gpu_memcpy", args


def _kernel_record(ev: Any) -> tuple[str, str, dict]:
    """A compute kernel. ``args["info"]`` lists its :class:`hwmodel.events.KernelInfo` fields in
    declaration order (``[flops, solo_time_s]``, then a macro task's ``pass_*_s``), as earlier trace
    files did."""
    args: dict[str, Any] = {"kind": ev.category}
    for key in ("layer", "phase"):
        val = getattr(ev, key, "")
        if val:
            args[key] = val
    for key in ("flops", "bytes_accessed", "dtype"):
        val = getattr(ev, key, None)
        if val is not None:
            args[key] = val
    info = getattr(ev, "info", None)
    if dataclasses.is_dataclass(info):
        args["info"] = list(dataclasses.astuple(info))
    return ev.name, "kernel", args


def _link_counters(link_series: Any, max_links: int | None) -> list[tuple[str, list[tuple[float, float]]]]:
    """Normalise link input to ``[(track name, [(t_s, percent), ...])]``.

    Accepts a mapping ``name -> [(t_s, fraction 0..1)]`` (e.g. from ``Resource.utilisation()``) or a
    sequence of link objects with ``name``, ``nominal_capacity`` (units/s) and ``timeline``
    ``[(t_s, units_per_s)]``; with objects, ``max_links`` keeps the busiest by ``carried`` over
    ``nominal_capacity`` -- mean utilisation, as the text report and ``links.png`` rank links (by bytes alone
    the fast NVLink links crowded out the saturated NICs).
    """
    out: list[tuple[str, list[tuple[float, float]]]] = []
    if isinstance(link_series, Mapping):
        for name, series in link_series.items():
            out.append((str(name), [(t, 100.0 * f) for t, f in series]))
        if max_links is not None:
            out = out[:max_links]
        return out
    links = list(link_series)
    if max_links is not None:
        links = sorted(links, key=lambda lk: (-float(getattr(lk, "carried", 0.0)) / (float(lk.nominal_capacity) or 1.0),
                                              lk.name))[:max_links]
    for lk in links:
        cap = float(lk.nominal_capacity) or 1.0
        label = f"{lk.name} ({cap / 1e9:g} GB/s)"
        out.append((label, [(t, 100.0 * u / cap) for t, u in lk.timeline]))
    return out


def to_chrome_trace(events: Iterable[Any], *, link_series: Any = None, metadata: Mapping | None = None,
                    ranks: Iterable[int] | None = None,
                    iterations: Sequence[tuple[float, float]] | None = None,
                    max_links: int | None = None, collective_dtype: str = "bf16",
                    world_size: int | None = None, trace_rank: int = 0,
                    streams: Iterable[str] | None = None) -> dict:
    """Build a Kineto-compatible Chrome trace as a JSON-ready dict.

    Args:
        events: ``TraceEvent``-like objects (``rank``, ``stream``, ``name``, ``category``, ``start_s``,
            ``end_s``, optional ``phase``, ``layer``, ``info``; times in seconds).
        link_series: link utilisation to add as counter tracks in the ``Network`` process: link objects
            (``name``, ``nominal_capacity`` in bytes/s, ``timeline`` [(s, bytes/s)], ``carried``) or a
            mapping name -> [(s, fraction 0..1)]. Values are written in percent.
        metadata: extra top-level keys (e.g. ``traceName``, scenario parameters); they override the
            defaults, so ``deviceProperties`` can be given in full.
        ranks: only these ranks' events (default: all).
        iterations: ``[(start_s, end_s)]`` per training step; written as ``ProfilerStep#i``
            ``user_annotation`` events on thread :data:`HOST_TID` of each GPU process, which HTA uses to
            split iterations.
        max_links: keep only the busiest links (link objects only).
        collective_dtype: dtype in NCCL kernel names when an event does not say (``TraceEvent`` does
            not).
        world_size: ``distributedInfo.world_size``; default the number of ranks in the trace.
        trace_rank: ``distributedInfo.rank``.
        streams: every stream name of the run, to number thread ids over (default: the streams in
            ``events``); lets files written separately agree.

    Returns:
        ``{"schemaVersion", "deviceProperties", "distributedInfo", "displayTimeUnit": "ms",
        "traceEvents": [...]}``; ``ts``/``dur`` in µs.
    """
    evs = list(events)
    tids = stream_tids({e.stream for e in evs} | set(streams or ()))
    if ranks is not None:
        keep = set(ranks)
        evs = [e for e in evs if e.rank in keep]
        present = sorted(keep)
    else:
        present = sorted({e.rank for e in evs})
    trace, used_threads = _task_events(evs, tids, collective_dtype)
    meta = _gpu_metadata(present, used_threads)
    if iterations:
        meta += [{"ph": "M", "name": "thread_name", "pid": r, "tid": HOST_TID, "args": {"name": "host"}}
                 for r in present]
        trace += _iteration_events(present, iterations)
    if link_series is not None:
        counter_meta, counters = _counter_events(link_series, max_links)
        meta += counter_meta
        trace += counters
    doc: dict[str, Any] = {
        "schemaVersion": 1,
        "deviceProperties": [{"id": r, "name": f"GPU {r}"} for r in present],
        "distributedInfo": {"backend": "nccl", "rank": trace_rank,
                            "world_size": world_size if world_size is not None else len(present)},
        "displayTimeUnit": "ms",
        "traceEvents": meta + trace,
    }
    if metadata:
        doc.update(metadata)
    return doc


def _task_events(evs: list[Any], tids: Mapping[str, int], collective_dtype: str
                 ) -> tuple[list[dict], dict[tuple[int, int], str]]:
    """The complete (``X``) events of the tasks, sorted by (rank, thread, start), and the label of
    every (rank, tid) used. Overlapping tasks of one stream go to extra lanes (see module doc).

    Raises:
        ValueError: an event ends before it starts.
    """
    trace: list[dict] = []
    # Lanes: per (rank, stream) a list of [tid, last_end_ns]; overlapping events go to extra lanes.
    lanes: dict[tuple[int, str], list[list[int]]] = {}
    used_threads: dict[tuple[int, int], str] = {}
    evs.sort(key=lambda e: (e.rank, tids[e.stream], e.start_s, e.end_s))
    for corr, ev in enumerate(evs, start=1):
        s_ns, e_ns = _ns(ev.start_s), _ns(ev.end_s)
        if e_ns < s_ns:
            raise ValueError(f"event {ev.name!r} on rank {ev.rank} ends before it starts "
                             f"({ev.start_s} > {ev.end_s} s)")
        lane_list = lanes.setdefault((ev.rank, ev.stream), [])
        k = next((i for i, lane in enumerate(lane_list) if lane[1] <= s_ns), len(lane_list))
        if k == len(lane_list):
            lane_list.append([tids[ev.stream] + _OVERLAP_TID_STRIDE * k, 0])
        lane = lane_list[k]
        lane[1] = e_ns
        tid = lane[0]
        used_threads[(ev.rank, tid)] = ev.stream if k == 0 else f"{ev.stream} (overlap {k})"
        name, cat, args = _event_record(ev, collective_dtype)
        args = {"device": ev.rank, "stream": tid, "correlation": corr, "External id": corr, **args}
        trace.append({"ph": "X", "cat": cat, "name": name, "pid": ev.rank, "tid": tid,
                      "ts": _us(s_ns), "dur": _us(e_ns - s_ns), "args": args})
    return trace, used_threads


def _gpu_metadata(present: list[int], used_threads: Mapping[tuple[int, int], str]) -> list[dict]:
    """Process (one per GPU) and thread (one per stream lane) name and sort-index metadata events."""
    meta: list[dict] = []
    for r in present:
        meta.append({"ph": "M", "name": "process_name", "pid": r, "tid": 0, "args": {"name": f"GPU {r}"}})
        meta.append({"ph": "M", "name": "process_labels", "pid": r, "tid": 0, "args": {"labels": f"GPU {r}"}})
        meta.append({"ph": "M", "name": "process_sort_index", "pid": r, "tid": 0, "args": {"sort_index": r}})
    for (r, tid), label in sorted(used_threads.items()):
        meta.append({"ph": "M", "name": "thread_name", "pid": r, "tid": tid,
                     "args": {"name": f"stream {tid} {label}"}})
        meta.append({"ph": "M", "name": "thread_sort_index", "pid": r, "tid": tid,
                     "args": {"sort_index": tid}})
    return meta


def _iteration_events(present: list[int], iterations: Sequence[tuple[float, float]]) -> list[dict]:
    """``ProfilerStep#i`` annotations on the host thread of every GPU process."""
    out = []
    for r in present:
        for i, (t0, t1) in enumerate(iterations):
            s_ns, e_ns = _ns(t0), _ns(t1)
            out.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{i}", "pid": r,
                        "tid": HOST_TID, "ts": _us(s_ns), "dur": _us(e_ns - s_ns), "args": {"External id": 0}})
    return out


def _counter_events(link_series: Any, max_links: int | None) -> tuple[list[dict], list[dict]]:
    """(metadata of the ``Network`` process, its counter events: one per change of a link's value)."""
    counters = _link_counters(link_series, max_links)
    meta = []
    if counters:
        meta = [{"ph": "M", "name": "process_name", "pid": NETWORK_PID, "tid": 0, "args": {"name": "Network"}},
                {"ph": "M", "name": "process_sort_index", "pid": NETWORK_PID, "tid": 0,
                 "args": {"sort_index": NETWORK_PID}}]
    out = []
    for label, series in counters:
        last = None
        for t, pct in series:
            if pct == last:
                continue
            last = pct
            out.append({"ph": "C", "name": label, "pid": NETWORK_PID, "tid": 0, "ts": _us(_ns(t)),
                        "args": {"util %": round(pct, 4)}})
    return meta, out


def write_chrome_trace(path: str | Path, events: Iterable[Any], **kwargs: Any) -> Path:
    """Write :func:`to_chrome_trace` (all ranks in one file) to ``path`` (``.json``; ``.json.gz`` is
    gzip-compressed). Keyword arguments as for :func:`to_chrome_trace`. Returns the path."""
    return _write(Path(path), to_chrome_trace(events, **kwargs))


def write_per_rank_traces(directory: str | Path, events: Iterable[Any], *, link_series: Any = None,
                          links_rank: int | None = None, metadata: Mapping | None = None,
                          iterations: Sequence[tuple[float, float]] | None = None,
                          collective_dtype: str = "bf16", compress: bool = False) -> list[Path]:
    """Write one Kineto-style trace per rank, ``<directory>/rank-<r>.json`` (HTA's layout), each with
    ``distributedInfo = {"rank": r, "world_size": n}`` and only rank ``r``'s events. Stream ids agree
    across the files. Link counters go only into the file of ``links_rank`` (default: none, since
    profiler traces have no such tracks). ``compress`` writes ``rank-<r>.json.gz``. Returns the paths in
    rank order."""
    evs = list(events)
    all_streams = {e.stream for e in evs}
    ranks = sorted({e.rank for e in evs})
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    by_rank: dict[int, list[Any]] = {r: [] for r in ranks}
    for e in evs:
        by_rank[e.rank].append(e)
    paths = []
    for r in ranks:
        doc = to_chrome_trace(by_rank[r], streams=all_streams, metadata=metadata, iterations=iterations,
                              link_series=link_series if links_rank == r else None,
                              collective_dtype=collective_dtype, world_size=len(ranks), trace_rank=r)
        name = f"rank-{r}.json" + (".gz" if compress else "")
        paths.append(_write(directory / name, doc))
    return paths


def _write(path: Path, doc: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = json.dumps(doc, separators=(",", ":"))
    if path.suffix == ".gz":
        import gzip

        with gzip.open(path, "wt", encoding="utf-8") as fh:
            fh.write(data)
    else:
        path.write_text(data, encoding="utf-8")
    return path
