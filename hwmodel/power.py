"""Power limit -> sustained clock: how a GPU SKU defined by its power limit is derived from the full-power part.

A data-centre GPU under dense tensor-core load runs at the power limit, and its firmware lowers the
clock (and with it the voltage, dynamic voltage and frequency scaling) until the board power fits. The
model is the textbook CMOS one: dynamic power ``P_dyn = a C V^2 f`` with the voltage proportional to the
frequency in the DVFS range, so ``P_dyn`` grows as ``f^3``; a static (leakage and idle) part does not
scale. Anchored at the full-power part's limit and the clock its published peaks are quoted at:

    P(f) = P_static + (P_ref - P_static) * (f / f_ref)^3
    f(P_limit) = min(f_max, f_ref * ((P_limit - P_static) / (P_ref - P_static))^(1/3))

Throughput-bound figures (tensor-core and FP32 FLOP/s) scale with ``f / f_ref``; HBM bandwidth does not
(the memory clock is separate from the SM clock).

Figures used for the H100 SXM5 (``gpus.toml``, ``H100-SXM5-96GB-500W``): ``P_ref`` = 700 W, the H100
SXM5 maximum thermal design power in NVIDIA's H100 Tensor Core GPU datasheet ("up to 700 W
(configurable)"); ``f_ref`` = 1830 MHz, the clock NVIDIA's dense peaks are quoted at (989.4 TFLOP/s
BF16 = 132 SMs x 4096 FLOP/clock x 1.83 GHz, H100 whitepaper table 3); ``f_max`` = 1980 MHz, the
deviceQuery maximum clock; ``P_static`` = 10 % of ``P_ref`` (70 W), an assumption (idle H100 SXM boards
report 60-90 W in nvidia-smi; no NVIDIA figure splits static from dynamic power). Nothing here is fitted
to a training measurement.
"""

from __future__ import annotations

import math

H100_SXM5_TDP_W = 700.0
"""H100 SXM5 maximum TDP (W): NVIDIA H100 Tensor Core GPU datasheet, SXM column ("up to 700 W")."""
H100_SXM5_PEAK_CLOCK_HZ = 1.83e9
"""Clock of the H100 SXM5's published dense peaks (Hz): 989.4e12 / (132 SMs x 4096 FLOP/clock)."""
H100_SXM5_MAX_CLOCK_HZ = 1.98e9
"""H100 SXM5 maximum clock (Hz): deviceQuery "GPU Max Clock rate: 1980 MHz" (gpus.toml)."""
STATIC_POWER_FRACTION = 0.10
"""Static (non-frequency-scaling) share of the reference power limit: an assumption (see the module doc)."""


def sustained_clock_hz(power_limit_w: float, *, ref_power_w: float = H100_SXM5_TDP_W,
                       ref_clock_hz: float = H100_SXM5_PEAK_CLOCK_HZ,
                       max_clock_hz: float = H100_SXM5_MAX_CLOCK_HZ,
                       static_fraction: float = STATIC_POWER_FRACTION) -> float:
    """The SM clock (Hz) a part sustains under dense load at ``power_limit_w`` (W), by the cube law of
    the module docstring, capped at ``max_clock_hz``. Defaults: the H100 SXM5.

    Raises:
        ValueError: a non-positive or non-finite power or clock, ``static_fraction`` outside [0, 1), or a
            limit at or below the static power (the part could not run).
    """
    for name, value in (("power_limit_w", power_limit_w), ("ref_power_w", ref_power_w),
                        ("ref_clock_hz", ref_clock_hz), ("max_clock_hz", max_clock_hz)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                or value <= 0:
            raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
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
