"""Fit what one measured end-to-end iteration time leaves free: the GPU's sustained clock fraction.

``sustained_clock_fraction`` scales the tensor-core rate of GEMMs and attention in a training run
(``calibration.toml``); it is the constant the shipped calibration itself fits to end-to-end rows, so it
is the one a single end-to-end number moves, set for the scenario's GPU in the profile. Solved by the
secant method on the full simulation (a few runs), within 0.3-1.0: the fraction is of the GPU's
microbenchmark clock (``hwmodel/data``), which a sustained run cannot exceed, so a fraction above 1 would
be unphysical. A measured time the bounds cannot reach is refused rather than clamped silently.
"""

from __future__ import annotations

from typing import Any

from hwmodel.calibration_overlay import Overlay, merge
from scenarios.calibrate import CalibrationInputError
from scenarios.calibrate.pipeline import simulate

BOUNDS = (0.3, 1.0)
"""The fraction's range: 1.0 is the microbenchmark clock (the ceiling); 0.3 a floor no GPU sustains below."""
TOLERANCE = 1e-3
"""Relative error at which the secant iteration stops."""
UNREACHABLE = 1e-2
"""Relative error, with the fraction at a bound, above which the measured time is refused as out of reach."""


def fit_clock(prep: Any, measured_s: float, sections: dict[str, Any], shipped: float) -> tuple[float, float, float]:
    """(fitted fraction, simulated time before, simulated time after), seconds.

    Raises:
        CalibrationInputError: ``measured_s`` is not reachable with the fraction within :data:`BOUNDS`.
    """
    gpu = prep.topology.gpu_spec.name

    def t_of(x: float) -> float:
        return simulate(prep, Overlay("(fit)", "fit", merge(sections, {"gpu": {gpu: {"sustained_clock_fraction": x}}}),
                                      ()))

    x0, t0 = shipped, t_of(shipped)
    first = t0
    x1 = min(max(shipped * t0 / measured_s, BOUNDS[0]), BOUNDS[1])  # exact if all time scaled with the clock
    t1 = t_of(x1)
    for _ in range(4):
        if abs(t1 / measured_s - 1) < TOLERANCE or t1 == t0:
            break
        x2 = x1 + (measured_s - t1) * (x1 - x0) / (t1 - t0)
        x0, t0 = x1, t1
        x1 = min(max(x2, BOUNDS[0]), BOUNDS[1])
        t1 = t_of(x1)
    if x1 in BOUNDS and abs(t1 / measured_s - 1) > UNREACHABLE:
        faster = x1 == BOUNDS[1]
        why = ("the clock fraction is at its ceiling 1.0 (the microbenchmark clock); the time not scaled by "
               "the clock (memory-bound kernels, communication, launches) is too long: fit those with --kineto "
               "or --nccl-log") if faster else f"the clock fraction is at its floor {BOUNDS[0]}"
        raise CalibrationInputError(f"--measured: iteration_time_s={measured_s:.6g} s cannot be reached; the "
                                    f"{'fastest' if faster else 'slowest'} reachable is {t1:.6g} s: {why}")
    return x1, first, t1
