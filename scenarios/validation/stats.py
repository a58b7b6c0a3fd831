"""Error statistics of a validation: MAPE, Kendall's tau-b, error trend per doubling, a straight-line fit,
and the 1-D refit behind the leave-one-source-out error. Pure functions on numbers (no simulation)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence


def mape(errors: Sequence[float]) -> float:
    """Mean absolute error of signed fractional errors (``nan`` for none)."""
    return sum(abs(e) for e in errors) / len(errors) if errors else float("nan")


def max_abs(errors: Sequence[float]) -> float:
    """Largest absolute error (``nan`` for none)."""
    return max(abs(e) for e in errors) if errors else float("nan")


def kendall_tau_b(x: Sequence[float], y: Sequence[float]) -> float:
    """Kendall's tau-b of paired samples, O(n^2): (concordant - discordant) / sqrt((n0 - n1)(n0 - n2)),
    n0 = n(n-1)/2 and n1, n2 the pairs tied in x, in y (Kendall 1945). ``nan`` when either side is all
    ties or there are fewer than two pairs.

    Raises:
        ValueError: ``x`` and ``y`` differ in length.
    """
    if len(x) != len(y):
        raise ValueError(f"kendall_tau_b: x has {len(x)} values, y {len(y)}")
    concordant = discordant = ties_x = ties_y = 0
    for i in range(len(x)):
        for j in range(i + 1, len(x)):
            dx, dy = x[i] - x[j], y[i] - y[j]
            ties_x += dx == 0
            ties_y += dy == 0
            if dx * dy > 0:
                concordant += 1
            elif dx * dy < 0:
                discordant += 1
    n0 = len(x) * (len(x) - 1) // 2
    denom = math.sqrt((n0 - ties_x) * (n0 - ties_y))
    return (concordant - discordant) / denom if denom else float("nan")


def slope_per_doubling(gpus: Sequence[int], errors: Sequence[float]) -> float:
    """Least-squares slope of signed error (in percentage points) against log2(GPUs): how much the error
    changes per doubling of the GPU count. ``nan`` with fewer than two distinct GPU counts."""
    xs = [math.log2(g) for g in gpus]
    ys = [100 * e for e in errors]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx if sxx else float("nan")


def line_fit(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Least-squares ``(slope, intercept)`` of y = slope * x + intercept; ``(nan, nan)`` with fewer than
    two distinct x.

    Raises:
        ValueError: ``xs`` and ``ys`` differ in length.
    """
    if len(xs) != len(ys):
        raise ValueError(f"line_fit: xs has {len(xs)} values, ys {len(ys)}")
    if len(set(xs)) < 2:
        return float("nan"), float("nan")
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = (sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
             / sum((x - mx) ** 2 for x in xs))
    return slope, my - slope * mx


def two_point_curve(f0: float, t0: float, f1: float, t1: float) -> tuple[float, float]:
    """``(a, b)`` with t(f) = a + b / f through (f0, t0) and (f1, t1): the part of a time priced at the
    clock fraction f (tensor-core work) scales as 1/f, the rest (memory-bound kernels, communication,
    host) does not.

    Raises:
        ValueError: ``f0 == f1``.
    """
    if f0 == f1:
        raise ValueError("two_point_curve: the two clock fractions must differ")
    b = (t0 - t1) / (1 / f0 - 1 / f1)
    return t0 - b / f0, b


def golden_min(fn: Callable[[float], float], lo: float, hi: float, tol: float = 1e-5) -> float:
    """The x in [lo, hi] minimising a unimodal ``fn`` (golden-section search, to ``tol``)."""
    g = (math.sqrt(5) - 1) / 2
    a, b = lo, hi
    c, d = b - g * (b - a), a + g * (b - a)
    fc, fd = fn(c), fn(d)
    while b - a > tol:
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - g * (b - a)
            fc = fn(c)
        else:
            a, c, fc = c, d, fd
            d = a + g * (b - a)
            fd = fn(d)
    return (a + b) / 2


def refit_clock(samples: Sequence[tuple[float, float, float, bool]], lo: float = 0.5, hi: float = 1.0) -> float:
    """The clock fraction f in [lo, hi] minimising the MAPE of ``samples`` (see :func:`predicted_at`).

    Args:
        samples: per row ``(a, b, measured, is_rate)``: the modelled time is a + b / f (for a rate,
            1 / rate = a + b / f); ``measured`` is in the row's own unit.

    Raises:
        ValueError: no samples.
    """
    if not samples:
        raise ValueError("refit_clock: no rows to fit")
    return golden_min(lambda f: mape([predicted_at(s, f) / s[2] - 1 for s in samples]), lo, hi)


def predicted_at(sample: tuple[float, float, float, bool], f: float) -> float:
    """The prediction of one ``(a, b, measured, is_rate)`` sample at clock fraction ``f``: a + b / f, or
    its reciprocal for a rate (whose curve is stored as 1 / rate = a + b / f)."""
    a, b, _, is_rate = sample
    t = a + b / f
    return 1 / t if is_rate else t
