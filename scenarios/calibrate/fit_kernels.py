"""Fit the kernel cost model's efficiencies to a profiled step (:mod:`.matcher` pairs).

Each paired task belongs to one *constant* of the cost model (:func:`constant_of`), set in the profile's
``[gpu."<name>"]`` section so it applies to that GPU only:

- GEMM: ``gemm_class_efficiency.<class>`` by shape class (:func:`hwmodel.costmodel.gemm_class`:
  convolution (1x1 or 3x3, unit stride or strided) or matmul, forward or backward -- cuDNN's Winograd and
  FFT convolutions do fewer multiplies than the implicit GEMM the model prices, so a convolution class
  may exceed 1), above each class the same op in either pass and below it its shape bands
  (:func:`hwmodel.costmodel.gemm_classes`), each fitted where its rows carry enough of its time, else
  falling back to the next broader one;
- attention: ``attention.fwd_efficiency.<head_dim>`` / ``bwd_efficiency`` (of the named kernel's table
  where the task names one); causality stays the model's (it prices only the executed key blocks);
- memory-bound kinds: ``hbm_efficiency_by_kind.<kind>``.

Every constant is solved alone (their tasks are disjoint) by bisection so that the model's execution
time of its rows (solo time less the launch overhead) equals their measured kernel time: a constant is
fitted to kernel rows only, the rows are listed with their residuals. Then ``launch_overhead_s`` -- what
the step spends between and beside the modelled kernels -- is fitted to the time that is no paired
kernel's: ``(idle + unmatched trace work - modelled time of unmatched tasks) / tasks``. It uses no paired
row, so holding kernels out (``holdout``) leaves it unchanged and the held-out rows are a true
out-of-sample check.

No kernel beats the GPU's datasheet peak: a GEMM class whose rows ran faster than it on the direct FLOP
count (4x for unit-stride 3x3 convolutions, Winograd's saving) is refitted to run at it, and every other
constant, a fraction of the peak, is clamped at 1 -- each with a note saying why (:func:`_within_peak`).
"""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass, field, replace
from typing import Any

from hwmodel.calibration_schema import efficiency_ceiling
from hwmodel.costmodel import (
    MEMORY_BOUND_KINDS,
    ArchCalibration,
    KernelCostModel,
    gemm_class,
    gemm_classes,
    normalise_dtype,
)
from hwmodel.ir import Compute
from scenarios.calibrate.matcher import Matching, Pair

BOUNDS = {"gemm": (0.02, 4.0), "attention": (0.02, 1.5), "memory": (0.02, 1.5)}
"""Search range of each constant kind (fractions of the datasheet peak): a convolution class above 1
is cuDNN's Winograd/FFT arithmetic saving; an HBM fraction above 1 means the model over-counts bytes."""


SHAPE_BANDS = True
"""Fit the GEMM bands below each class (:func:`hwmodel.costmodel.gemm_classes`)."""

MIN_CLASS_SUPPORT = 0.25
"""A class is fitted only where its fitted rows carry at least a quarter of the class's modelled time
(held-out rows excluded): otherwise its few rows are one algorithm's, and the class falls back to the
next broader one (:func:`hwmodel.costmodel.gemm_classes`; at the end the pooled ``gemm_efficiency.<dtype>``
fitted to every GEMM row). Chosen on the ResNet-50 trace over ten held-out splits (DESIGN.md): a half
left classes with a few one-algorithm rows fitted on them."""


@dataclass
class ConstantFit:
    """One fitted constant."""

    path: tuple[str, ...]
    """Keys below the GPU's section, e.g. ``("gemm_class_efficiency", "conv_fwd")``."""
    shipped: float
    fitted: float
    rows: int
    measured_s: float
    predicted_before_s: float
    predicted_after_s: float
    note: str = ""


@dataclass
class KernelFit:
    """The result of :func:`fit_kernels`."""

    constants: list[ConstantFit]
    launch_overhead_s: float
    shipped_launch_overhead_s: float
    cal: ArchCalibration
    """The calibration with every fitted value in."""
    held_out: frozenset[str] = field(default_factory=frozenset)
    launch_terms: dict[str, float] = field(default_factory=dict)

    def values(self) -> dict[tuple[str, ...], float]:
        """Profile key path (below the GPU section) -> fitted value."""
        out = {c.path: c.fitted for c in self.constants}
        out[("launch_overhead_s",)] = self.launch_overhead_s
        return out


def constant_of(task: Compute, cal: ArchCalibration) -> tuple[tuple[str, ...], float, str] | None:
    """(profile key path, shipped value, bounds key) of the constant ``task``'s time depends on, or
    ``None`` (a fixed-time task)."""
    if task.fixed_time_s is not None:
        return None
    if task.kind == "gemm":
        return ("gemm_class_efficiency", gemm_class(task)), cal.gemm_eff(normalise_dtype(task.dtype)), "gemm"
    if task.kind == "attention" and len(task.shape) == 5:
        d = int(task.shape[4])
        bwd = task.phase == "bwd" or "bwd" in task.name.lower() or "backward" in task.name.lower()
        f, b, _ = cal.attention_params(d, task.attention_kernel)
        table = "bwd_efficiency" if bwd else "fwd_efficiency"
        prefix: tuple[str, ...] = ("attention",) if not task.attention_kernel else (
            "attention", "kernels", task.attention_kernel)
        return (*prefix, table, str(d)), (b if bwd else f), "attention"
    if task.kind in MEMORY_BOUND_KINDS:
        return ("hbm_efficiency_by_kind", task.kind), cal.hbm_efficiency, "memory"
    return None


def with_value(cal: ArchCalibration, path: tuple[str, ...], value: float) -> ArchCalibration:
    """``cal`` with the constant at ``path`` set to ``value``."""
    if path[0] == "gemm_efficiency":
        return replace(cal, gemm_efficiency={**cal.gemm_efficiency, path[1]: value})
    if path[0] == "gemm_class_efficiency":
        return replace(cal, gemm_class_efficiency={**cal.gemm_class_efficiency, path[1]: value})
    if path[0] == "hbm_efficiency_by_kind":
        return replace(cal, hbm_efficiency_by_kind={**cal.hbm_efficiency_by_kind, path[1]: value})
    if path[0] == "launch_overhead_s":
        return replace(cal, launch_overhead_s=value)
    if path[0] == "attention":
        table, d = path[-2], int(path[-1])
        if len(path) == 3:
            if table == "fwd_efficiency":
                return replace(cal, attention_fwd_efficiency={**cal.attention_fwd_efficiency, d: value})
            return replace(cal, attention_bwd_efficiency={**cal.attention_bwd_efficiency, d: value})
        kernel = path[2]
        own = dict(cal.attention_kernels.get(kernel, {}))
        own[table] = {**{int(k): v for k, v in own.get(table, {}).items()}, d: value}
        return replace(cal, attention_kernels={**cal.attention_kernels, kernel: own})
    raise ValueError(f"unknown calibration constant {'.'.join(path)}")


def exec_time(model: KernelCostModel, cal: ArchCalibration, tasks: Any) -> float:
    """Modelled execution time (solo time less launch) of ``tasks`` under ``cal``, seconds."""
    saved = model.cal
    model.cal = cal
    model._cache.clear()
    try:
        return sum(model.cost(t).solo_time_s - cal.launch_overhead_s for t in tasks)
    finally:
        model.cal = saved
        model._cache.clear()


def _solve(model: KernelCostModel, cal: ArchCalibration, path: tuple[str, ...], tasks: list[Compute],
           measured: float, bounds: tuple[float, float]) -> tuple[float, str]:
    lo, hi = bounds
    f_lo = exec_time(model, with_value(cal, path, lo), tasks)
    f_hi = exec_time(model, with_value(cal, path, hi), tasks)
    if abs(f_lo - f_hi) <= 1e-12 * max(f_lo, 1e-30):
        return float("nan"), "not identifiable (time does not depend on it)"
    if measured >= f_lo:
        return lo, "at the lower bound"
    if measured <= f_hi:
        return hi, "at the upper bound"
    a, b = math.log(lo), math.log(hi)
    for _ in range(60):  # time falls as the efficiency rises
        m = (a + b) / 2
        if exec_time(model, with_value(cal, path, math.exp(m)), tasks) > measured:
            a = m
        else:
            b = m
    return math.exp((a + b) / 2), ""


def above_peak_note(path: tuple[str, ...]) -> str:
    """Why a fitted efficiency of the constant at ``path`` above 1 (faster than the datasheet peak) is not
    a faster GPU: what in the model's count it points at."""
    if path[0] == "gemm_class_efficiency" and re.match(r"conv3x3(_|@|$)", path[1]):  # unit stride only
        return ("above peak: cuDNN's Winograd/FFT convolutions do fewer multiplies than the direct "
                "(implicit-GEMM) FLOP count the model prices")
    if path[0] == "gemm_efficiency":
        return ("above peak: pooled over every GEMM row of the dtype, convolutions included, whose "
                "Winograd/FFT kernels do fewer multiplies than the direct FLOP count")
    if path[0] in ("gemm_class_efficiency", "attention"):
        return ("above peak: the measured kernels beat the datasheet peak, so the model's FLOP count or "
                "its small-shape (tile, wave) pricing of these shapes is too high")
    if path[0] == "hbm_efficiency_by_kind":
        return ("above peak: the measured kernels move bytes faster than HBM's datasheet rate, so the "
                "model's byte count for this kind is too high (fused reads, cache hits)")
    return "above 1"


def achieved_peak_fraction(model: KernelCostModel, tasks: list[Compute], measured_s: float) -> float:
    """How fast GEMM rows ran against the GPU's datasheet peak on the model's (direct) FLOP count: the time
    the rows' FLOPs take at :meth:`~hwmodel.specs.GPUSpec.peak_flops` over their measured time."""
    at_peak = sum(t.flops / float(model.gpu.peak_flops(normalise_dtype(t.dtype))) for t in tasks)
    return at_peak / measured_s if measured_s > 0 else 0.0


def _within_peak(model: KernelCostModel, cal: ArchCalibration, path: tuple[str, ...], tasks: list[Compute],
                 measured_s: float, value: float, note: str, bounds: tuple[float, float]) -> tuple[float, str]:
    """``value`` (fitted at ``path`` to ``tasks``) and its note, clamped where it would have kernels beat the
    datasheet peak (:mod:`hwmodel.calibration_schema` bounds what a profile may hold):

    - a GEMM class (``gemm_class_efficiency``) by what its rows achieved: its constant also absorbs the
      model's tile quantisation (a 64-wide GEMM priced in 128-wide tiles), so it may exceed 1 while the
      rows stay below the peak; rows faster than the peak (4x for unit-stride 3x3 convolutions, Winograd's
      saving) are refitted to run at it;
    - every other constant (the pooled ``gemm_efficiency.<dtype>``, attention, HBM fractions) at 1: a
      fraction of the datasheet peak, and the pooled GEMM value prices every GEMM no class covers.
    """
    if path[0] == "gemm_class_efficiency":
        ceiling = efficiency_ceiling(path[1])
        achieved = achieved_peak_fraction(model, tasks, measured_s)
        if achieved > ceiling:
            refit, _ = _solve(model, cal, path, tasks, measured_s * achieved / ceiling, bounds)
            return refit, (f"clamped (fitted {value:.3g}): its rows ran at {achieved:.3g}x the datasheet peak on "
                           f"the model's FLOP count, above the {ceiling:g}x a GPU can reach"
                           + (" with Winograd" if ceiling > 1 else "") + "; the trace's shapes or dtype were "
                           "misread, or the model's FLOP count is too high; fitted to run at the peak")
        return value, note or (above_peak_note(path) if value > 1 else "")
    if value > 1.0:
        what = above_peak_note(path).removeprefix("above peak: ")
        if path[0] == "gemm_efficiency":
            what += "; it prices every GEMM no class covers, where no such saving applies"
        return 1.0, (f"clamped to 1 (fitted {value:.3g}): {what}, or the trace's shapes or dtype were misread; "
                     f"a fraction of the datasheet peak cannot exceed 1")
    return value, note


def fit_kernels(matching: Matching, model: KernelCostModel, step_time_s: float, busy_s: float,
                holdout: frozenset[str] = frozenset()) -> KernelFit:
    """Fit the constants of :func:`constant_of` and ``launch_overhead_s`` (see the module docstring).

    Args:
        matching: the paired step.
        model: a cost model of the traced GPU (``sustained=True``, as the simulator prices training).
        step_time_s, busy_s: the step's GPU time and the sum of its GPU event durations.
        holdout: kernel names whose op instances (by longest kernel) stay out of the fit.
    """
    base = model.cal
    groups: dict[tuple[str, ...], tuple[float, str, list[Pair]]] = {}
    support: dict[tuple[str, ...], list[Pair]] = {}
    for pair in matching.pairs:
        c = constant_of(pair.task, base)
        if c is None or not pair.op.events:
            continue
        paths = [c[0]]
        if c[2] == "gemm" and SHAPE_BANDS:  # the class in either pass, the class, its shape bands
            paths = [("gemm_class_efficiency", cls) for cls in gemm_classes(pair.task)]
        for path in paths:
            support.setdefault(path, []).append(pair)
        if pair.op.main_kernel in holdout:
            continue
        for path in paths:
            groups.setdefault(path, (c[1], c[2], []))[2].append(pair)
        if c[2] == "gemm":  # the pooled GEMM efficiency of the dtype, behind every class
            dtype = normalise_dtype(pair.task.dtype)
            groups.setdefault(("gemm_efficiency", dtype), (base.gemm_eff(dtype), "gemm", []))[2].append(pair)
    cal = base
    fits = []
    # broadest first: the pooled GEMM efficiency, the classes, then their shape bands
    for path in sorted(groups, key=lambda p: (p[0] != "gemm_efficiency", _depth(p), p)):
        shipped, bounds_key, pairs = groups[path]
        tasks = [t for p in pairs for t in p.tasks]
        if path in support:  # a class whose rows are mostly held out keeps the pooled value
            whole = exec_time(model, cal, [t for p in support[path] for t in p.tasks])
            if exec_time(model, cal, tasks) < MIN_CLASS_SUPPORT * whole:
                continue
        measured = sum(p.op.dur_s for p in pairs)
        before = exec_time(model, base, tasks)
        value, note = _solve(model, cal, path, tasks, measured, BOUNDS[bounds_key])
        if math.isnan(value):
            value = shipped
        value, note = _within_peak(model, cal, path, tasks, measured, value, note, BOUNDS[bounds_key])
        cal = with_value(cal, path, value)
        after = exec_time(model, cal, tasks)
        fits.append(ConstantFit(path, shipped, value, len(pairs), measured, before, after, note))
    unmatched_busy = sum(op.dur_s for _, op in matching.unmatched_ops)
    idle = max(step_time_s - busy_s, 0.0)
    n_tasks = sum(len(p.tasks) for p in matching.pairs) + len(matching.unmatched_tasks)
    unmatched_model = exec_time(model, cal, matching.unmatched_tasks)
    launch = max((idle + unmatched_busy - unmatched_model) / max(n_tasks, 1), 0.0)
    cal = replace(cal, launch_overhead_s=launch)
    return KernelFit(fits, launch, base.launch_overhead_s, cal, holdout,
                     {"idle_s": idle, "unmatched_trace_s": unmatched_busy, "unmatched_model_s": unmatched_model,
                      "tasks": float(n_tasks)})


def _depth(path: tuple[str, ...]) -> int:
    """Fitting order of a GEMM class (:func:`hwmodel.costmodel.gemm_classes`), broadest first, each fitted
    over what the broader ones set: the op in either pass (``conv3x3``), the class (``conv3x3_fwd``), the
    shape band in either pass (``conv3x3@m13n8k11``), the shape band (``conv3x3_fwd@m13n8k11``)."""
    name = path[-1]
    if "@" not in name:
        return 1 if "_" in name else 0
    return 2 if "_" not in name.split("@")[0] else 3


def holdout_names(matching: Matching, every: int = 3) -> frozenset[str]:
    """Every ``every``-th distinct kernel name (by longest kernel of the paired op instances, sorted):
    a third of the kernels by name for ``every = 3``."""
    names = sorted({p.op.main_kernel for p in matching.pairs if p.op.events})
    return frozenset(n for i, n in enumerate(names) if i % every == every - 1)


HASH_SPLITS = 7
"""Hash splits :func:`holdout_splits` adds to the three ways of taking every third name."""


def holdout_splits(matching: Matching) -> dict[str, frozenset[str]]:
    """Several ways of holding out about a third of the kernel names: every third name in sorted order
    from each of the three offsets (``every3+k``), and :data:`HASH_SPLITS` splits by a salted SHA-1 of the
    name (``sha1/s``: the names whose digest is 0 mod 3) -- reproducible, and not tied to name order."""
    names = sorted({p.op.main_kernel for p in matching.pairs if p.op.events})
    out = {f"every3+{k}": frozenset(n for i, n in enumerate(names) if i % 3 == k) for k in range(3)}
    for salt in range(HASH_SPLITS):
        out[f"sha1/{salt}"] = frozenset(
            n for n in names if int(hashlib.sha1(f"{salt}:{n}".encode()).hexdigest(), 16) % 3 == 0)
    return out


def held_out_misses(matching: Matching, model: KernelCostModel, fit: KernelFit) -> list[tuple[str, str, float, float]]:
    """Where a held-out fit misses: (kernel name, kind, modelled s, measured s) of the held-out rows grouped by
    longest kernel name, largest |modelled - measured| first (seconds of execution, launch excluded)."""
    out: dict[tuple[str, str], list[float]] = {}
    for p in matching.pairs:
        if p.op.main_kernel in fit.held_out and p.op.events:
            row = out.setdefault((p.op.main_kernel, p.kind), [0.0, 0.0])
            row[0] += exec_time(model, fit.cal, p.tasks)
            row[1] += p.op.dur_s
    return sorted(((n, k, a, b) for (n, k), (a, b) in out.items()), key=lambda r: -abs(r[2] - r[3]))


def predicted_step_s(matching: Matching, model: KernelCostModel, cal: ArchCalibration) -> float:
    """The step as the sum of every model task's solo time under ``cal`` (one stream, one GPU)."""
    tasks = [t for p in matching.pairs for t in p.tasks] + matching.unmatched_tasks
    return exec_time(model, cal, tasks) + cal.launch_overhead_s * len(tasks)
