"""Pair the op instances of a profiled step with the tasks of the traced model.

Both sides are ordered streams of kernels: the trace's op instances in GPU order, the model's
:class:`~hwmodel.ir.Compute` tasks in program order. Each side is split by (kind, phase) -- kind from the
launching aten op (:mod:`.kinds`), phase from the autograd engine and optimizer annotations -- and within
a group the two sequences of op names (:func:`canonical_op`: ``aten::cudnn_convolution`` and
``aten.convolution`` are one name, an in-place ``add_`` is ``add``) are aligned in order (the longest
matching blocks, :class:`difflib.SequenceMatcher`): eager PyTorch launches a model's layers in the order
its module calls them, which is the order the tracer records them, so the position in the aligned
sequence carries the layer scope and the shape (checked: ``tests/scenarios/calibrate``).
What is left over on either side is *unmatched* and listed, never dropped: trace work the model does not
have (e.g. DDP's bucket copies on one GPU) and model tasks the trace lacks.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from difflib import SequenceMatcher
from typing import Any

from hwmodel.ir import Compute
from scenarios.calibrate import CalibrationInputError
from scenarios.calibrate.kinds import op_kind
from scenarios.calibrate.kineto import KinetoTrace, OpInstance

SAME_MODEL_MIN_RATIO = 0.8
"""A trace is taken for the scenario's model when its forward GEMM count (convolutions and matmuls)
is within 80-125 % of the model's: a different model almost never has the same count."""


@dataclass(frozen=True)
class Pair:
    """Model task(s) and the op instance measured for them: one task each, except the optimizer, whose
    foreach or fused launches are paired as one group (their split need not match the model's)."""

    tasks: tuple[Compute, ...]
    op: OpInstance
    kind: str

    @property
    def task(self) -> Compute:
        """The (first) model task."""
        return self.tasks[0]


@dataclass
class Matching:
    """The result of :func:`match`."""

    pairs: list[Pair]
    unmatched_ops: list[tuple[str, OpInstance]]
    """(kind, op instance) of trace work with no model task."""
    unmatched_tasks: list[Compute]
    """Model tasks with no measured op instance."""
    counts: dict[tuple[str, str], tuple[int, int]] = field(default_factory=dict)
    """(kind, phase) -> (op instances in the trace, tasks in the model)."""

    def unmatched_kernels(self) -> list[tuple[str, int, float]]:
        """(kernel name, launches, total seconds) of unmatched trace work, longest first."""
        total: dict[str, float] = defaultdict(float)
        count: Counter[str] = Counter()
        for _, op in self.unmatched_ops:
            for e in op.events:
                total[e.name] += e.dur_us * 1e-6
                count[e.name] += 1
        return sorted(((n, count[n], total[n]) for n in total), key=lambda r: -r[2])


def graph_tasks(programs: Any, rank: int = 0) -> list[Compute]:
    """The compute tasks of ``rank``'s program, in program order (all streams)."""
    program = programs[rank]
    return [t.op for t in program.tasks if isinstance(t.op, Compute)]


def match(trace: KinetoTrace, tasks: list[Compute]) -> Matching:
    """Pair ``trace``'s op instances with ``tasks`` by (kind, phase) and order (see the module docstring)."""
    side_trace: dict[tuple[str, str], list[OpInstance]] = defaultdict(list)
    for op in trace.ops:
        side_trace[(op_kind(op.op, op.phase, op.main_kernel), op.phase)].append(op)
    side_model: dict[tuple[str, str], list[Compute]] = defaultdict(list)
    for t in tasks:
        side_model[(t.kind, "opt" if t.kind == "optimizer" else ("bwd" if t.phase == "bwd" else "fwd"))].append(t)
    pairs: list[Pair] = []
    unmatched_ops: list[tuple[str, OpInstance]] = []
    unmatched_tasks: list[Compute] = []
    counts = {}
    for key in sorted(set(side_trace) | set(side_model)):
        ops, ts = side_trace.get(key, []), side_model.get(key, [])
        counts[key] = (len(ops), len(ts))
        if key[0] == "optimizer" and ops and ts:  # one group (see Pair)
            merged = OpInstance(", ".join(sorted({o.op for o in ops})), "opt", tuple(e for o in ops for e in o.events))
            pairs.append(Pair(tuple(ts), merged, key[0]))
            continue
        a, b = [canonical_op(o.op) for o in ops], [canonical_op(t.name) for t in ts]
        used_ops: set[int] = set()
        used_tasks: set[int] = set()
        for block in SequenceMatcher(None, a, b, autojunk=False).get_matching_blocks():
            for k in range(block.size):
                pairs.append(Pair((ts[block.b + k],), ops[block.a + k], key[0]))
                used_ops.add(block.a + k)
                used_tasks.add(block.b + k)
        unmatched_ops.extend((key[0], o) for i, o in enumerate(ops) if i not in used_ops)
        unmatched_tasks.extend(t for i, t in enumerate(ts) if i not in used_tasks)
    return Matching(pairs, unmatched_ops, unmatched_tasks, counts)


_ALIASES = {"cudnn_convolution": "convolution", "_convolution": "convolution", "conv2d": "convolution",
            "cudnn_convolution_backward": "convolution_backward", "cudnn_batch_norm": "native_batch_norm",
            "batch_norm": "native_batch_norm", "_batch_norm_impl_index": "native_batch_norm",
            "cudnn_batch_norm_backward": "native_batch_norm_backward", "clamp_min": "relu", "threshold": "relu",
            "layer_norm": "native_layer_norm", "linear": "addmm", "matmul": "mm", "nll_loss": "nll_loss_forward",
            "log_softmax": "_log_softmax", "softmax": "_softmax"}


def canonical_op(name: str) -> str:
    """One name for an op on both sides: ``aten::clamp_min_`` and ``aten.relu`` -> ``relu``."""
    n = name.strip().replace("::", ".")
    n = n.removeprefix("aten.").split(".")[0]
    if n.endswith("_") and not n.startswith("_"):
        n = n[:-1]
    return _ALIASES.get(n, n)


def check_same_model(matching: Matching, trace_path: str, model: str) -> None:
    """Refuse a trace of another model: its forward GEMM count must be near the model's.

    Raises:
        CalibrationInputError: one line with both counts.
    """
    n_trace, n_model = matching.counts.get(("gemm", "fwd"), (0, 0))
    if n_model == 0 and n_trace == 0:
        return
    ratio = n_trace / n_model if n_model else float("inf")
    if not SAME_MODEL_MIN_RATIO <= ratio <= 1 / SAME_MODEL_MIN_RATIO:
        raise CalibrationInputError(
            f"{trace_path}: not a trace of {model}: its step has {n_trace} forward GEMM/convolution ops, the "
            f"model {n_model} (give the trace of the scenario's model, or the scenario of the traced model)")
