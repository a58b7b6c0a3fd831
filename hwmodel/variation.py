"""Per-GPU speed variation (stragglers) and its cost at a synchronisation.

Identical GPUs do not run at identical speed: manufacturing variation and each chip's power management
give every GPU of a cluster its own sustained clock. Sinha et al., "Not All GPUs Are Created Equal:
Characterizing Variability in Large-Scale, Accelerator-Rich Systems" (SC'22, arXiv:2208.11035) measured
over 90 % of the GPUs of five large clusters (Summit, Vortex, Frontera, Longhorn, Corona) and report
an 8 % average performance variation between GPUs of one SKU running the same compute-bound kernel
(up to 22 %, outliers 1.5x slower, excluded here).

A training iteration synchronises every GPU with every other, transitively: tensor-parallel collectives
each layer, pipeline send/recv each micro-batch, the data-parallel reduction each step. With speeds that
persist over the run, the steady state of a pipeline runs at its slowest stage, each stage at its slowest
tensor-parallel rank, and the data-parallel reduction waits for the slowest replica: the compute of the
iteration takes as long as on the slowest of the N GPUs. With per-GPU compute time t * (1 + s * Z),
Z standard normal and s the spread (coefficient of variation), the expected slowdown is
``1 + s * E[max of N draws of Z]`` (:func:`straggler_slowdown`).
"""

from __future__ import annotations

import math
from functools import lru_cache

__all__ = ["DEFAULT_GPU_SPEED_SPREAD", "expected_max_standard_normal", "straggler_slowdown"]

DEFAULT_GPU_SPEED_SPREAD = 0.02
"""Coefficient of variation of per-GPU compute time (``[simulation] gpu_speed_spread``). [UNCERTAIN
conversion] Sinha et al. SC'22 (arXiv:2208.11035): 8 % average performance variation across GPUs of one
SKU; read as the range of the middle ~95 % of GPUs (+-2 standard deviations), 8 % / 4 = 2 %."""

_GRID_HALF_WIDTH = 12.0
_GRID_POINTS = 4800  # even, for Simpson's rule; the integrand is smooth, error < 1e-6 up to N = 2^20


@lru_cache(maxsize=256)
def expected_max_standard_normal(n: int) -> float:
    """E[max(Z_1..Z_n)] for n independent standard normal draws (0 for n = 1).

    Computed as the integral of x * d/dx Phi(x)^n, by Simpson's rule on [-12, 12] (closed forms: n = 2
    gives 1/sqrt(pi), n = 3 gives 3/(2 sqrt(pi))).

    Raises:
        ValueError: n < 1.
    """
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"expected_max_standard_normal: n must be an integer >= 1, got {n!r}")
    if n == 1:
        return 0.0
    h = 2 * _GRID_HALF_WIDTH / _GRID_POINTS
    total = 0.0
    for i in range(_GRID_POINTS + 1):
        x = -_GRID_HALF_WIDTH + i * h
        upper = 0.5 * math.erfc(x / math.sqrt(2))  # 1 - Phi(x), accurate in the upper tail
        log_cdf = math.log1p(-upper) if upper < 1 else -math.inf
        pdf = math.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)
        density = n * pdf * math.exp((n - 1) * log_cdf) if log_cdf > -math.inf else 0.0
        w = 1 if i in (0, _GRID_POINTS) else (4 if i % 2 else 2)
        total += w * x * density
    return total * h / 3


def straggler_slowdown(spread: float, n_gpus: int) -> float:
    """Expected factor on an iteration's compute time from the slowest of ``n_gpus`` synchronised GPUs
    whose compute times vary with coefficient of variation ``spread``: ``1 + spread * E[max of n]``.

    Raises:
        ValueError: ``spread`` outside [0, 0.5) or ``n_gpus`` < 1.
    """
    if not 0 <= spread < 0.5:
        raise ValueError(f"gpu_speed_spread must be in [0, 0.5), got {spread!r}")
    return 1.0 + spread * expected_max_standard_normal(n_gpus)
