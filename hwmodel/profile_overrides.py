"""Measured kernel durations from a PyTorch profiler (Kineto) Chrome trace, keyed by aten op and shape:
:class:`ProfileOverrides` replaces the cost model's estimate for the kernels it has measured (see
:mod:`hwmodel.costmodel`, "Measured overrides")."""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hwmodel.ir import Compute


def normalise_op_name(name: str) -> str:
    """``aten::mm`` and ``aten.mm.default`` -> ``aten.mm``; other names unchanged (stripped)."""
    n = name.strip().replace("::", ".")
    parts = n.split(".")
    if len(parts) == 3 and parts[0] == "aten":
        n = ".".join(parts[:2])
    return n


def _prod(xs: Any) -> int:
    p = 1
    for x in xs:
        p *= int(x)
    return p


def gemm_shape_from_dims(op: str, dims: list) -> tuple[int, ...] | None:
    """The IR GEMM shape ``(batch, m, n, k)`` from a profiler's ``Input Dims`` for matmul-like aten ops,
    ``None`` if ``op`` is not one or the dims do not fit."""
    try:
        d = [list(x) for x in dims]
        if op == "aten.mm":
            (m, k), (_, n) = d[0], d[1]
            return (1, m, n, k)
        if op == "aten.addmm":
            (m, k), (_, n) = d[1], d[2]
            return (1, m, n, k)
        if op in ("aten.bmm", "aten.baddbmm"):
            a, b = (d[0], d[1]) if op == "aten.bmm" else (d[1], d[2])
            return (a[0], a[1], b[2], a[2])
        if op == "aten.linear":
            x, w = d[0], d[1]
            return (1, _prod(x[:-1]), w[0], x[-1])
        if op == "aten.matmul" and len(d[0]) >= 2 and len(d[1]) == 2:
            x, w = d[0], d[1]
            return (1, _prod(x[:-1]), w[1], x[-1])
    except (IndexError, TypeError, ValueError):
        return None
    return None


class ProfileOverrides:
    """Measured kernel durations from a PyTorch profiler (Kineto) Chrome-trace JSON.

    Reads ``traceEvents``: events with ``cat == "kernel"`` are GPU kernels (``dur`` in microseconds).
    Each is attributed to the aten op that launched it through ``args["External id"]`` (matched to a
    ``cat == "cpu_op"`` event with the same ``External id``) or, failing that, through
    ``args["correlation"]`` and the ``cuda_runtime`` launch event carrying the same correlation id.
    When an op instance launches several kernels their durations are summed. Repeated instances of the
    same (op, shape) are reduced to their median.

    Keys: ``(op, shape)`` where ``op`` is normalised (``aten::mm`` -> ``aten.mm``) and ``shape`` is the
    IR GEMM shape ``(batch, m, n, k)`` for matmul ops, else the flattened ``Input Dims``; and ``(op,
    None)`` for the op over all shapes. Kernels with no op are keyed by their own kernel name.

    :meth:`lookup` matches a task by (name, shape) exactly; a task with no shape, or an op recorded
    without shapes, matches by name alone. A shaped task whose shape was not profiled is *not* matched
    (durations depend on shape too much to borrow another shape's).
    """

    def __init__(self, durations: Mapping[tuple[str, tuple | None], float]) -> None:
        self.durations: dict[tuple[str, tuple | None], float] = dict(durations)
        """(op, shape or None) -> measured duration in seconds."""
        self._shaped_ops = {op for op, shape in self.durations if shape is not None}

    @classmethod
    def from_chrome_trace(cls, path: str | Path) -> ProfileOverrides:
        """Parse a Kineto Chrome-trace JSON file (``torch.profiler`` ``export_chrome_trace``)."""
        with Path(path).open(encoding="utf-8") as f:
            data = json.load(f)
        events = data["traceEvents"] if isinstance(data, Mapping) else data
        ops: dict[Any, tuple[str, tuple | None]] = {}
        corr_to_ext: dict[Any, Any] = {}
        kernels: list[dict] = []
        for ev in events:
            cat = str(ev.get("cat", "")).lower()
            args = ev.get("args") or {}
            if cat == "cpu_op":
                ext = args.get("External id")
                if ext is not None:
                    op = normalise_op_name(str(ev.get("name", "")))
                    dims = args.get("Input Dims")
                    shape = None
                    if dims:
                        shape = gemm_shape_from_dims(op, dims)
                        if shape is None:
                            shape = tuple(int(x) for dim in dims if isinstance(dim, list) for x in dim
                                          if isinstance(x, int))
                    ops[ext] = (op, shape)
            elif cat in ("cuda_runtime", "cuda_driver"):
                if args.get("correlation") is not None and args.get("External id") is not None:
                    corr_to_ext[args["correlation"]] = args["External id"]
            elif cat == "kernel":
                kernels.append(ev)
        # sum kernel time per op instance (External id), then median per key
        per_instance: dict[Any, float] = defaultdict(float)
        instance_key: dict[Any, tuple[str, tuple | None]] = {}
        for ev in kernels:
            args = ev.get("args") or {}
            ext = args.get("External id")
            if ext not in ops:
                ext = corr_to_ext.get(args.get("correlation"))
            dur_s = float(ev.get("dur", 0.0)) * 1e-6
            if ext in ops:
                inst = ("op", ext)
                instance_key[inst] = ops[ext]
            else:  # unattributed kernel: key by its own name, each launch an instance
                inst = ("kernel", id(ev))
                instance_key[inst] = (str(ev.get("name", "")), None)
            per_instance[inst] += dur_s
        samples: dict[tuple[str, tuple | None], list[float]] = defaultdict(list)
        for inst, dur in per_instance.items():
            op, shape = instance_key[inst]
            samples[(op, shape)].append(dur)
            if shape is not None:
                samples[(op, None)].append(dur)
        return cls({k: statistics.median(v) for k, v in samples.items()})

    def lookup(self, task: Compute) -> float | None:
        """Measured duration (s) for ``task``, or ``None`` if the profile has no match."""
        op = normalise_op_name(task.name)
        if task.shape and op in self._shaped_ops:
            return self.durations.get((op, tuple(task.shape)))
        return self.durations.get((op, None))

    def __len__(self) -> int:
        return len(self.durations)
