"""Power limit -> sustained clock: the SM clock a GPU SKU holds under dense tensor-core load.

A data-centre GPU under dense tensor-core load runs at its board power limit, and its firmware lowers the
clock (and with it the voltage, dynamic voltage and frequency scaling) until the board power fits. The
model is the textbook CMOS one: dynamic power ``P_dyn = a C V^2 f`` with the voltage proportional to the
frequency in the DVFS range, so ``P_dyn`` grows as ``f^3``; a static (leakage and idle) part does not
scale. Anchored at a part's rated power ``P_ref`` and the clock ``f_ref`` it holds there:

    P(f) = P_static + (P_ref - P_static) * (f / f_ref)^3
    f(P_limit) = min(f_max, f_ref * ((P_limit - P_static) / (P_ref - P_static))^(1/3))

Throughput-bound figures (tensor-core and FP32 FLOP/s) scale with ``f / f_ref``; HBM bandwidth does not
(the memory clock is separate from the SM clock).

*Per SKU* (:func:`power_limit_clock_ratio`, :func:`sustained_clock_fraction`). Every GPU in ``gpus.toml``
gives its rated board power ``tdp_W`` (the limit its datasheet peaks are quoted for and the default
limit it runs at) and may be run at a lower configured limit ``power_limit_W`` (``nvidia-smi -pl``;
scenario ``[system] gpu_overrides``): its SM clock, in training and in a microbenchmark alike, is then
``f(power_limit) / f(tdp)`` of the clock at its rated power.

*Burst and saturated clocks.* The kernel efficiencies of ``calibration.toml`` are fitted to bursts:
mamf-finder v2 (stas00/ml-engineering ``compute/accelerator/benchmarks/mamf-finder.py``) runs a 256 MiB
L2 flush and a copy before every timed GEMM, so its best shapes run near the boost clock with the board
below its limit (its v4 telemetry says so: "the clock sits at boost and the board stays far below its
power limit"). A training run is one saturated stream, at the power limit, where the clock settles
lower. That ratio is measured per architecture, on that architecture, at its rated power, and lives in
``calibration.toml`` (``[architecture.<arch>] sustained_clock_fraction``: H200 MSMF / MAMF for Hopper,
B200 saturated / burst clock for Blackwell); no architecture reads another's.

Figures used for the H100 SXM5 (``gpus.toml``, ``H100-SXM5-96GB-500W``): ``P_ref`` = 700 W, the H100
SXM5 maximum thermal design power in NVIDIA's H100 Tensor Core GPU datasheet ("up to 700 W
(configurable)"); ``f_ref`` = 1830 MHz, the clock NVIDIA's dense peaks are quoted at (989.4 TFLOP/s
BF16 = 132 SMs x 4096 FLOP/clock x 1.83 GHz, H100 whitepaper table 3); ``f_max`` = 1980 MHz, the
deviceQuery maximum clock; ``P_static`` = 10 % of ``P_ref`` (70 W), an assumption (idle H100 SXM boards
report 60-90 W in nvidia-smi; no NVIDIA figure splits static from dynamic power).
Nothing here is fitted to a training measurement.
"""

from __future__ import annotations

import math
from typing import Any

H100_SXM5_TDP_W = 700.0
"""H100 SXM5 maximum TDP (W): NVIDIA H100 Tensor Core GPU datasheet, SXM column ("up to 700 W")."""
H100_SXM5_PEAK_CLOCK_HZ = 1.83e9
"""Clock of the H100 SXM5's published dense peaks (Hz): 989.4e12 / (132 SMs x 4096 FLOP/clock)."""
H100_SXM5_MAX_CLOCK_HZ = 1.98e9
"""H100 SXM5 maximum clock (Hz): deviceQuery "GPU Max Clock rate: 1980 MHz" (gpus.toml)."""
STATIC_POWER_FRACTION = 0.10
"""Static (non-frequency-scaling) share of the reference power limit: an assumption (see the module doc)."""


def _check_positive(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")


def power_limit_clock_ratio(power_limit_w: float, rated_power_w: float, *,
                            static_fraction: float = STATIC_POWER_FRACTION) -> float:
    """``f(power_limit_w) / f(rated_power_w)`` (dimensionless) by the cube law of the module docstring:
    ``((P - P_s) / (P_rated - P_s))^(1/3)`` with ``P_s = static_fraction * P_rated`` (W).

    Raises:
        ValueError: one line naming the value, if a power is not a finite number > 0,
            ``static_fraction`` is outside [0, 1), or ``power_limit_w`` is outside
            ``(P_s, rated_power_w]`` (at or below the static power the part cannot run; above the rated
            power is beyond the limit the board may be set to).
    """
    _check_positive("power_limit_w", power_limit_w)
    _check_positive("rated_power_w", rated_power_w)
    if not 0 <= static_fraction < 1:
        raise ValueError(f"static_fraction must be in [0, 1), got {static_fraction!r}")
    static_w = static_fraction * rated_power_w
    if not static_w < power_limit_w <= rated_power_w:
        raise ValueError(f"power_limit_w = {power_limit_w:g}: allowed ({static_w:g}, {rated_power_w:g}] W "
                         f"(above the {static_fraction:.0%} static power, at most the rated {rated_power_w:g} W)")
    return float(((power_limit_w - static_w) / (rated_power_w - static_w)) ** (1.0 / 3.0))


def sustained_clock_hz(power_limit_w: float, *, ref_power_w: float = H100_SXM5_TDP_W,
                       ref_clock_hz: float = H100_SXM5_PEAK_CLOCK_HZ,
                       max_clock_hz: float = H100_SXM5_MAX_CLOCK_HZ,
                       static_fraction: float = STATIC_POWER_FRACTION) -> float:
    """The SM clock (Hz) a part sustains under dense load at ``power_limit_w`` (W), by the cube law of
    the module docstring, capped at ``max_clock_hz``. Defaults: the H100 SXM5. Unlike
    :func:`power_limit_clock_ratio`, a limit above ``ref_power_w`` is allowed (a different board).

    Raises:
        ValueError: a non-positive or non-finite power or clock, ``static_fraction`` outside [0, 1), or a
            limit at or below the static power (the part could not run).
    """
    for name, value in (("power_limit_w", power_limit_w), ("ref_power_w", ref_power_w),
                        ("ref_clock_hz", ref_clock_hz), ("max_clock_hz", max_clock_hz)):
        _check_positive(name, value)
    if not 0 <= static_fraction < 1:
        raise ValueError(f"static_fraction must be in [0, 1), got {static_fraction!r}")
    static_w = static_fraction * ref_power_w
    if power_limit_w <= static_w:
        raise ValueError(f"power_limit_w must exceed the static power {static_w:g} W, got {power_limit_w!r}")
    f = ref_clock_hz * ((power_limit_w - static_w) / (ref_power_w - static_w)) ** (1.0 / 3.0)
    return min(max_clock_hz, f)


def throughput_scale(power_limit_w: float, **kw: float) -> float:
    """FLOP/s of the power-limited part / FLOP/s of the reference part: ``f(power_limit_w) / f_ref``
    (dimensionless). Keywords as :func:`sustained_clock_hz`."""
    ref_clock = kw.get("ref_clock_hz", H100_SXM5_PEAK_CLOCK_HZ)
    return sustained_clock_hz(power_limit_w, **kw) / ref_clock


def sustained_clock_fraction(gpu: Any) -> float:
    """Clock a GPU SKU sustains under dense load at its configured limit / the clock it sustains at its
    rated power, where its datasheet peaks hold (dimensionless, in (0, 1]):
    ``power_limit_clock_ratio(gpu.power_limit_w, gpu.tdp_w)``; 1 when no limit below the rated power is
    set or the spec gives no ``tdp_w`` (a what-if GPU without power data).

    Raises:
        ValueError: the limit is out of range (see :func:`power_limit_clock_ratio`).
    """
    tdp = getattr(gpu, "tdp_w", None)
    limit = getattr(gpu, "power_limit_w", None)
    if limit is None or tdp is None:
        return 1.0
    return power_limit_clock_ratio(limit, tdp)
