"""Read a PyTorch profiler (Kineto) Chrome-trace JSON: the GPU kernels of one training step.

The format is the one ``torch.profiler`` writes (``export_chrome_trace``, ``tensorboard_trace_handler``)
and Perfetto and Holistic Trace Analysis read: ``{"traceEvents": [...], "deviceProperties": [...],
"distributedInfo": {...}}``; times ``ts``/``dur`` in microseconds. GPU work is ``cat`` ``kernel``,
``gpu_memcpy`` and ``gpu_memset``; each carries ``args["External id"]`` linking it to the ``cpu_op``
(aten op) that launched it, and ``args["correlation"]`` linking it to its ``cuda_runtime`` launch.

Steps are the ``ProfilerStep#N`` annotations: a kernel belongs to the step during which its launch ran
on the CPU (one whose launch is not in the trace belongs to none). The step time on the GPU is from its
first kernel's start to the next step's first kernel's start (the last step: to its last kernel's end).
The *steady* step is the one whose GPU time is the median (warm-up steps are slower). A trace without
step annotations is one step.

Plain ``json`` on the whole file (gzip read transparently): ``bench/bench_calibrate.py`` reads a 100 MB
trace in about 10 s of CPU and 0.3 GB above the interpreter (budget 60 s, 2 GB): no streaming parser.
"""

from __future__ import annotations

import bisect
import gzip
import json
import statistics
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scenarios.calibrate import CalibrationInputError

GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
BACKWARD_MARK = "autograd::engine::evaluate_function"
"""The CPU event the autograd engine wraps each backward node in: ops inside it run in the backward."""
OPTIMIZER_MARK = "Optimizer.step"
"""The profiler's annotation of ``optimizer.step()`` (``Optimizer.step#SGD.step``, ...)."""


@dataclass(frozen=True)
class GpuEvent:
    """One kernel, copy or memset on the GPU."""

    name: str
    category: str
    start_us: float
    dur_us: float
    external_id: int | None
    stream: int


@dataclass(frozen=True)
class OpInstance:
    """One launch of an aten op (or of a kernel no op claims) and the GPU work it caused."""

    op: str
    """The launching ``cpu_op`` name (``aten::cudnn_convolution``), ``""`` if none."""
    phase: str
    """``fwd``, ``bwd`` or ``opt``."""
    events: tuple[GpuEvent, ...]

    @property
    def dur_s(self) -> float:
        """GPU time of its kernels, seconds."""
        return sum(e.dur_us for e in self.events) * 1e-6

    @property
    def main_kernel(self) -> str:
        """The name of its longest kernel."""
        return max(self.events, key=lambda e: e.dur_us).name


@dataclass
class KinetoTrace:
    """What calibration takes from a trace: the steady step's GPU work, as op instances in GPU order."""

    path: str
    gpu_name: str
    """``deviceProperties[0].name`` (``""`` if absent)."""
    step_name: str
    step_time_s: float
    """GPU time of the steady step (see the module docstring), seconds."""
    steps: dict[str, float]
    """Every complete step's GPU time, seconds."""
    ops: list[OpInstance]
    busy_s: float
    """Sum of the step's GPU event durations, seconds."""
    meta: dict[str, Any] = field(default_factory=dict)


def _load_json(path: Path) -> Any:
    try:
        raw = path.read_bytes()
    except IsADirectoryError:
        raise CalibrationInputError(f"{path}: is a directory, not a trace file") from None
    except OSError as exc:
        raise CalibrationInputError(f"{path}: cannot read it ({exc.strerror})") from None
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error):
            raise CalibrationInputError(f"{path}: truncated or corrupt gzip file") from None
    try:
        return json.loads(raw)
    except UnicodeDecodeError:
        raise CalibrationInputError(f"{path}: not a Kineto trace (not UTF-8 JSON text)") from None
    except json.JSONDecodeError as exc:
        what = "truncated JSON" if exc.pos >= len(raw.rstrip()) - 1 or "Unterminated" in exc.msg else "not valid JSON"
        raise CalibrationInputError(f"{path}: not a Kineto trace ({what}: {exc.msg} at byte {exc.pos})") from None


def _events(path: Path, data: Any) -> list[dict]:
    if isinstance(data, dict) and "nodes" in data and "schema" in data:
        raise CalibrationInputError(
            f"{path}: a Chakra execution trace (ExecutionTraceObserver) has CPU ops but no GPU kernel "
            f"durations; give the Kineto trace of the same run (torch.profiler with ProfilerActivity.CUDA)")
    events = data.get("traceEvents") if isinstance(data, dict) else None
    if not isinstance(events, list):
        raise CalibrationInputError(f"{path}: not a Kineto trace (no traceEvents list)")
    return [e for e in events if isinstance(e, dict) and e.get("ph") == "X"]


class _Intervals:
    """Sorted, possibly nested CPU intervals of one thread; :meth:`inside` asks whether a time falls
    within one of them."""

    def __init__(self, spans: list[tuple[float, float]]) -> None:
        spans.sort()
        merged: list[list[float]] = []
        for a, b in spans:
            if merged and a <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], b)
            else:
                merged.append([a, b])
        self.starts = [a for a, _ in merged]
        self.ends = [b for _, b in merged]

    def inside(self, t: float) -> bool:
        i = bisect.bisect_right(self.starts, t) - 1
        return i >= 0 and t <= self.ends[i]


def read_kineto(path: str | Path) -> KinetoTrace:
    """Read ``path`` (``.json`` or ``.json.gz``) and return its steady step.

    Raises:
        CalibrationInputError: not JSON, truncated, not a Kineto trace, a Chakra execution trace, a
            CPU-only trace (no GPU kernels), or no step with GPU work.
    """
    p = Path(path)
    data = _load_json(p)
    events = _events(p, data)
    props = data.get("deviceProperties")
    gpu_name = str(props[0].get("name", "")) if isinstance(props, list) and props and isinstance(
        props[0], dict) else ""
    dist = data.get("distributedInfo")
    data_meta: dict[str, Any] = {"world_size": int(dist.get("world_size", 1)) if isinstance(dist, dict) else 1}
    del data
    gpu_events = [e for e in events if e.get("cat") in GPU_CATEGORIES]
    if not any(e.get("cat") == "kernel" for e in gpu_events):
        raise CalibrationInputError(f"{p}: a CPU-only trace (no GPU kernel events); profile with "
                                    f"activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]")
    cpu_ops: dict[int, dict] = {}
    launches: dict[int, float] = {}  # correlation -> launch time on the CPU
    marks: dict[tuple[Any, Any], list[tuple[float, float]]] = {}
    opt_spans: list[tuple[float, float]] = []
    steps: list[tuple[float, float, str]] = []
    for e in events:
        cat, name = e.get("cat"), str(e.get("name", ""))
        ts, dur = float(e.get("ts", 0.0)), float(e.get("dur", 0.0))
        args = e.get("args") or {}
        if cat == "cpu_op":
            if args.get("External id") is not None:
                cpu_ops[int(args["External id"])] = e
            if name.startswith(BACKWARD_MARK):
                marks.setdefault((e.get("pid"), e.get("tid")), []).append((ts, ts + dur))
        elif cat in ("cuda_runtime", "cuda_driver") and args.get("correlation") is not None:
            launches[int(args["correlation"])] = ts
        elif cat == "user_annotation":
            if name.startswith("ProfilerStep#"):
                steps.append((ts, ts + dur, name))
            elif name.startswith(OPTIMIZER_MARK):
                opt_spans.append((ts, ts + dur))
    backward = {k: _Intervals(v) for k, v in marks.items()}
    optimizer = _Intervals(opt_spans)
    gpu_events.sort(key=lambda e: float(e.get("ts", 0.0)))
    step_of = _assign_steps(gpu_events, steps, launches)
    times = _step_times(gpu_events, step_of)
    if not times:
        raise CalibrationInputError(f"{p}: no profiler step has GPU work")
    median = statistics.median(times.values())
    steady = min(times, key=lambda s: (abs(times[s] - median), s))
    chosen = [e for e, s in zip(gpu_events, step_of, strict=True) if s == steady]
    ops = _op_instances(chosen, cpu_ops, backward, optimizer)
    data_meta["steps"] = len(times)
    return KinetoTrace(str(p), gpu_name, steady, times[steady], times, ops,
                       sum(float(e.get("dur", 0.0)) for e in chosen) * 1e-6, data_meta)


def _assign_steps(gpu_events: list[dict], steps: list[tuple[float, float, str]],
                  launches: dict[int, float]) -> list[str]:
    """The step of each GPU event: the ProfilerStep its launch ran in (``"trace"`` if no steps)."""
    if not steps:
        return ["trace"] * len(gpu_events)
    steps.sort()
    starts = [s for s, _, _ in steps]
    out = []
    for e in gpu_events:
        args = e.get("args") or {}
        t = launches.get(int(args["correlation"])) if args.get("correlation") is not None else None
        if t is None:  # launched before the trace began (or by no traced call): in no step
            out.append("")
            continue
        i = bisect.bisect_right(starts, t) - 1
        out.append(steps[i][2] if i >= 0 and t <= steps[i][1] else "")
    return out


def _step_times(gpu_events: list[dict], step_of: list[str]) -> dict[str, float]:
    first: dict[str, float] = {}
    last: dict[str, float] = {}
    for e, s in zip(gpu_events, step_of, strict=True):
        if not s:
            continue
        ts, end = float(e.get("ts", 0.0)), float(e.get("ts", 0.0)) + float(e.get("dur", 0.0))
        first[s] = min(first.get(s, ts), ts)
        last[s] = max(last.get(s, end), end)
    order = sorted(first, key=first.__getitem__)
    times = {}
    for i, s in enumerate(order):
        end = first[order[i + 1]] if i + 1 < len(order) else last[s]
        times[s] = (end - first[s]) * 1e-6
    return times


def _op_instances(chosen: list[dict], cpu_ops: dict[int, dict], backward: dict, optimizer: _Intervals
                  ) -> list[OpInstance]:
    """Group the step's GPU events by launching op (External id), in GPU order of their first event."""
    groups: dict[Any, list[GpuEvent]] = {}
    info: dict[Any, tuple[str, str]] = {}
    for i, e in enumerate(chosen):
        args = e.get("args") or {}
        ext = args.get("External id")
        ev = GpuEvent(str(e.get("name", "")), str(e.get("cat")), float(e.get("ts", 0.0)),
                      float(e.get("dur", 0.0)), None if ext is None else int(ext), int(args.get("stream", 0) or 0))
        op = cpu_ops.get(int(ext)) if ext is not None else None
        key: Any = ("op", ev.external_id) if op is not None else ("gpu", i)
        if key not in info:
            name = str(op.get("name", "")) if op is not None else ""
            phase = "fwd"
            if op is not None:
                t = float(op.get("ts", 0.0))
                if optimizer.inside(t):
                    phase = "opt"
                elif (iv := backward.get((op.get("pid"), op.get("tid")))) is not None and iv.inside(t):
                    phase = "bwd"
            info[key] = (name, phase)
        groups.setdefault(key, []).append(ev)
    return [OpInstance(info[k][0], info[k][1], tuple(v)) for k, v in groups.items()]

