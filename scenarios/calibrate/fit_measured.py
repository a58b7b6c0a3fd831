"""Fit what one measured end-to-end iteration time leaves free: the GPU's sustained clock fraction.

``sustained_clock_fraction`` scales the tensor-core rate of GEMMs and attention in a training run
(``calibration.toml``); it is the constant the shipped calibration itself fits to end-to-end rows, so it
is the one a single end-to-end number moves, set for the scenario's GPU in the profile. Solved by the
secant method on the full simulation (a few runs), within 0.3-1.2.
"""

from __future__ import annotations

from typing import Any

from hwmodel.calibration_overlay import Overlay, merge
from scenarios.calibrate.pipeline import simulate

BOUNDS = (0.3, 1.2)
TOLERANCE = 1e-3
"""Relative error at which the secant iteration stops."""


def fit_clock(prep: Any, measured_s: float, sections: dict[str, Any], shipped: float) -> tuple[float, float, float]:
    """(fitted fraction, simulated time before, simulated time after), seconds."""
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
    return x1, first, t1
