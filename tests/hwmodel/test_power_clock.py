"""The sustained tensor-core clock per SKU (hwmodel/power.py): power limit -> clock by the cube law, from each
SKU's own rated power, and no Hopper/Blackwell SKU reading the clock residual fitted on A100 rows."""

import dataclasses
from importlib import resources

import pytest
import tomllib

from hwmodel.costmodel import Calibration, KernelCostModel
from hwmodel.ir import Compute
from hwmodel.power import (
    STATIC_POWER_FRACTION,
    power_limit_clock_ratio,
    sustained_clock_fraction,
    sustained_clock_hz,
    throughput_scale,
)
from hwmodel.specs import get_gpu, shipped_gpus, with_overrides

BIG_GEMM = Compute("aten.mm", "gemm", 2.0 * 8192**3, 3 * 2 * 8192**2, "fp16", (1, 8192, 8192, 8192))
"""Compute-bound on every shipped GPU (arithmetic intensity ~2,700 FLOP/byte, 64 or more full waves)."""


def _compute_time(model: KernelCostModel, task: Compute = BIG_GEMM) -> float:
    return model.cost(task).solo_time_s - model.launch_overhead_s


def _calibration_data() -> dict:
    with resources.files("hwmodel.data").joinpath("calibration.toml").open("rb") as f:
        return tomllib.load(f)


def test_cube_law_closed_form_500w_against_700w():
    # f(P) / f(P_rated) = ((P - Ps) / (P_rated - Ps))^(1/3), Ps = 10 % of the rated 700 W = 70 W
    assert STATIC_POWER_FRACTION == 0.10
    k = power_limit_clock_ratio(500, 700)
    assert k == pytest.approx((430 / 630) ** (1 / 3), rel=1e-12) == pytest.approx(0.8805, abs=5e-5)
    assert power_limit_clock_ratio(700, 700) == 1.0
    # the same law as the absolute clock: 1830 MHz at 700 W -> 1611 MHz at 500 W (the torchtitan part)
    assert sustained_clock_hz(500) == pytest.approx(1.83e9 * k, rel=1e-12)
    assert throughput_scale(500) == pytest.approx(k, rel=1e-12)
    # the power the dynamic part draws at the lower clock is back at the limit: P = Ps + (P_rated - Ps) k^3
    assert 70 + 630 * k**3 == pytest.approx(500, rel=1e-12)


def test_an_h100_capped_at_500w_runs_its_gemms_at_the_cube_law_clock():
    h100 = get_gpu("H100-SXM5")
    capped = with_overrides(h100, power_limit_W=500)
    assert capped.power_limit_w == 500.0 and capped.tdp_w == 700.0
    k = sustained_clock_fraction(capped)
    assert k == pytest.approx((430 / 630) ** (1 / 3), rel=1e-12)
    for sustained in (False, True):  # a kernel microbenchmark on the capped part is as slow as its training
        full, low = KernelCostModel(h100, sustained=sustained), KernelCostModel(capped, sustained=sustained)
        assert _compute_time(full) / _compute_time(low) == pytest.approx(k, rel=1e-9)
    # the shipped 500 W SKU (torchtitan's) holds the same figures, scaled in gpus.toml and rated at 500 W
    part = get_gpu("H100-SXM5-96GB-500W")
    assert part.tdp_w == 500.0 and sustained_clock_fraction(part) == 1.0
    assert part.peak_flops("bf16") == pytest.approx(h100.peak_flops("bf16") * k, abs=0.051e12)


def test_every_shipped_sku_gives_its_rated_power_and_runs_at_it():
    rated = {name: get_gpu(name).tdp_w for name in shipped_gpus()}
    assert rated == {"V100-SXM2": 300, "A100-SXM4-40GB": 400, "A100-SXM4-80GB": 400, "H100-SXM5": 700,
                     "H200-SXM": 700, "B200-HGX": 1000, "H100-SXM5-96GB-500W": 500, "B200-GB200": 1200}
    assert all(sustained_clock_fraction(get_gpu(n)) == 1.0 for n in rated)


def test_no_hopper_or_blackwell_sku_reads_the_a100_fitted_clock():
    data = _calibration_data()
    fitted_to = data["fitted_to"]
    ampere_value = data["architecture"]["ampere"]["sustained_clock_fraction"]
    a100_sources = ("sc21", "t4:", "t5:", "megascale", "readme2020", "A100", "ampere")
    cal = Calibration.load()
    others = [n for n in shipped_gpus() if get_gpu(n).architecture != "Ampere"]
    assert {"H100-SXM5", "H200-SXM", "B200-HGX", "B200-GB200", "H100-SXM5-96GB-500W"} <= set(others)
    for name in others:
        gpu = get_gpu(name)
        arch = gpu.architecture.lower()
        # the section the value comes from: [gpu."name"], else [architecture.<arch>], else [default]
        if "sustained_clock_fraction" in data.get("gpu", {}).get(name, {}):
            path = f'gpu."{name}".sustained_clock_fraction'
        elif "sustained_clock_fraction" in data.get("architecture", {}).get(arch, {}):
            path = f"architecture.{arch}.sustained_clock_fraction"
        else:
            path = "default.sustained_clock_fraction"
        rows = fitted_to.get(path, [])
        assert not [r for r in rows if any(s in r for s in a100_sources)], (name, path, rows)
        value = cal.for_gpu(gpu).sustained_clock_fraction
        assert value != ampere_value, (name, path, "the A100 fit copied to another architecture")
        if path.startswith("default"):  # no data for the architecture (Volta): no scaling, no copy
            assert value == 1.0, (name, value)
        sustained, bench = KernelCostModel(gpu, sustained=True), KernelCostModel(gpu)
        assert _compute_time(bench) / _compute_time(sustained) == pytest.approx(value, rel=1e-9), name
    # the A100 residual stays where it was fitted, on Ampere only
    a100 = cal.for_gpu(get_gpu("A100-SXM4-80GB"))
    assert a100.sustained_clock_fraction == ampere_value and "ampere" in a100.name
    assert "default.sustained_clock_fraction" not in fitted_to


@pytest.mark.parametrize("limit, message", [
    (800, r"power_limit_W = 800: allowed \(70, 700\] W"),       # above the rated power
    (70, r"power_limit_W = 70: allowed \(70, 700\] W"),         # at the static power: cannot run
    (0, "field 'power_limit_W' must be > 0, got 0"),
    (-5, "field 'power_limit_W' must be > 0, got -5"),
    (float("nan"), "field 'power_limit_W' must be finite, got nan"),
    (True, "field 'power_limit_W' must be a number, got True"),
    ("500", "field 'power_limit_W' must be a number, got '500'"),
])
def test_power_limit_out_of_range_is_a_one_line_error(limit, message):
    with pytest.raises(ValueError, match=message) as exc:
        with_overrides(get_gpu("H100-SXM5"), power_limit_W=limit)
    assert "\n" not in str(exc.value) and "H100-SXM5" in str(exc.value)


def test_a_power_limit_needs_a_rated_power_and_the_ratio_checks_its_inputs():
    with pytest.raises(ValueError, match="'power_limit_W' needs the rated power 'tdp_W'"):
        dataclasses.replace(get_gpu("H100-SXM5"), tdp_w=None, power_limit_w=500.0)
    with pytest.raises(ValueError, match="rated_power_w must be a finite number > 0"):
        power_limit_clock_ratio(500, 0)
    with pytest.raises(ValueError, match=r"static_fraction must be in \[0, 1\)"):
        power_limit_clock_ratio(500, 700, static_fraction=1.0)
    assert sustained_clock_fraction(object()) == 1.0  # a duck-typed spec without power data: no scaling


def test_scenario_power_limit_out_of_range_exits_2_with_one_line(capsys):
    from scenarios.cli import main

    assert main(["run", "--set", "system.gpu_overrides.power_limit_W=900"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert "[system] gpu_overrides" in err and "power_limit_W = 900: allowed (40, 400] W" in err


def test_hopper_and_blackwell_ratios_are_their_own_measurements():
    cal = Calibration.load()
    # Hopper: H200 SXM at 700 W, saturated / burst matmul (MSMF 755 / MAMF 834 BF16 TFLOP/s)
    for name in ("H100-SXM5", "H200-SXM", "H100-SXM5-96GB-500W"):
        assert cal.for_gpu(get_gpu(name)).sustained_clock_fraction == pytest.approx(755 / 834, abs=5e-5)
    # Blackwell: B200 at 1000 W, saturated ~1450 MHz / burst 1965 MHz
    for name in ("B200-HGX", "B200-GB200"):
        assert cal.for_gpu(get_gpu(name)).sustained_clock_fraction == pytest.approx(1450 / 1965, abs=5e-5)
    # a capped part multiplies its architecture's ratio by the cube-law clock of the cap
    h100, capped = get_gpu("H100-SXM5"), with_overrides(get_gpu("H100-SXM5"), power_limit_W=500)
    full, low = KernelCostModel(h100, sustained=True), KernelCostModel(capped, sustained=True)
    assert _compute_time(full) / _compute_time(low) == pytest.approx((430 / 630) ** (1 / 3), rel=1e-9)
