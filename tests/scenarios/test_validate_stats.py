"""Closed forms behind `trainsim validate`'s report: Kendall's tau-b, the error trend per doubling, the
two-point clock curve and the leave-one-source-out refit on a synthetic case with a known answer."""

import math

import pytest

from scenarios.validation import provenance, stats
from scenarios.validation.tables import Row


def test_kendall_tau_b_hand_example_without_ties():
    # pairs of (1..5) against (3, 4, 1, 2, 5): 6 concordant, 4 discordant -> (6 - 4) / 10
    assert stats.kendall_tau_b([1, 2, 3, 4, 5], [3, 4, 1, 2, 5]) == pytest.approx(0.2, abs=1e-12)


def test_kendall_tau_b_hand_example_with_ties():
    # 4 concordant, 0 discordant, one pair tied in x, one in y: 4 / sqrt((6 - 1)(6 - 1)) = 0.8
    assert stats.kendall_tau_b([1, 1, 2, 3], [1, 2, 2, 3]) == pytest.approx(0.8, abs=1e-12)
    assert stats.kendall_tau_b([1, 2, 3], [3, 2, 1]) == -1.0
    assert math.isnan(stats.kendall_tau_b([1, 1], [2, 3]))
    with pytest.raises(ValueError, match="x has 2 values, y 3"):
        stats.kendall_tau_b([1, 2], [1, 2, 3])


def test_slope_per_doubling_of_a_linear_trend():
    # error -1 point per doubling: 256 -> 0 %, 512 -> -1 %, 1024 -> -2 %, 4096 -> -4 %
    assert stats.slope_per_doubling([256, 512, 1024, 4096], [0.0, -0.01, -0.02, -0.04]) == pytest.approx(-1.0)
    assert math.isnan(stats.slope_per_doubling([8, 8], [0.1, 0.2]))


def test_line_fit_recovers_slope_and_intercept():
    assert stats.line_fit([192, 96, 64, 48], [0.2 * m + 2.5 for m in (192, 96, 64, 48)]) == (
        pytest.approx(0.2), pytest.approx(2.5))
    # least squares through (0, 0), (1, 1), (2, 1): slope 1/2, intercept 1/6
    assert stats.line_fit([0, 1, 2], [0, 1, 1]) == (pytest.approx(0.5), pytest.approx(1 / 6))
    assert all(math.isnan(v) for v in stats.line_fit([4, 4], [1.0, 2.0]))
    with pytest.raises(ValueError, match="xs has 2 values, ys 1"):
        stats.line_fit([1, 2], [1])


def test_two_point_curve_recovers_a_plus_b_over_f():
    a, b = 2.0, 3.0
    ca, cb = stats.two_point_curve(0.85, a + b / 0.85, 0.95, a + b / 0.95)
    assert (ca, cb) == (pytest.approx(a), pytest.approx(b))
    with pytest.raises(ValueError, match="must differ"):
        stats.two_point_curve(0.9, 1.0, 0.9, 1.0)


def test_refit_clock_finds_the_clock_that_generated_the_data():
    samples = [(a, b, a + b / 0.8, False) for a, b in ((1.0, 4.0), (0.5, 2.0), (3.0, 1.0))]
    assert stats.refit_clock(samples) == pytest.approx(0.8, abs=1e-4)
    rate = [(1.0, 4.0, 1 / (1.0 + 4.0 / 0.7), True)]
    assert stats.refit_clock(rate) == pytest.approx(0.7, abs=1e-4)


def _row(table, key, name, a, b, measured):
    r = Row(table, name, "iteration time", "s", measured, key=key)
    r.curve, r.predicted = (a, b), a + b / 0.85
    return r


def test_leave_one_source_out_on_two_synthetic_sources():
    # Source A was measured as if the clock were 0.8, source B as if 0.9 (time = a + b / f). Held out,
    # A is predicted at B's clock 0.9 and B at A's 0.8: the LOSO errors are closed forms.
    a, b = 1.0, 4.0
    rows = [_row("A", "sc21", "a1", a, b, a + b / 0.8), _row("A", "sc21", "a2", a, 2 * b, a + 2 * b / 0.8),
            _row("B", "t5", "b1", a, b, a + b / 0.9), _row("C", "megascale", "c1", a, b, 5.0)]
    fits = {provenance.CLOCK_CONSTANT: ["sc21:a1", "sc21:a2", "t5:b1"]}
    provenance.mark_in_sample(rows, fits)
    assert [r.in_sample for r in rows] == [True, True, True, False]
    loso = provenance.leave_one_source_out(rows, fits)
    assert loso["A"]["refit"] == pytest.approx(0.9, abs=1e-4)
    e1 = (a + b / 0.9) / (a + b / 0.8) - 1
    e2 = (a + 2 * b / 0.9) / (a + 2 * b / 0.8) - 1
    assert loso["A"]["mape"] == pytest.approx((abs(e1) + abs(e2)) / 2, abs=1e-5)
    assert loso["A"]["max_abs_error"] == pytest.approx(max(abs(e1), abs(e2)), abs=1e-5)
    assert loso["B"]["refit"] == pytest.approx(0.8, abs=1e-4)
    assert loso["B"]["mape"] == pytest.approx(abs((a + b / 0.8) / (a + b / 0.9) - 1), abs=1e-5)
    # C has no end-to-end constant fitted on it: LOSO error is its plain error, and it says so
    assert loso["C"]["refit"] is None and "plain error" in loso["C"]["note"]
    assert loso["C"]["mape"] == pytest.approx(abs((a + b / 0.85) / 5.0 - 1))


def test_rows_of_a_table_only_constant_are_left_out_of_its_loso():
    # D's rows d1, d2 fixed another end-to-end constant whose only source is D: they cannot be held out,
    # so D's held-out figure is its remaining row d3, and the note names the constant.
    a, b = 1.0, 4.0
    rows = [_row("D", "sc21t2-zero3", "d1", a, b, 1.0), _row("D", "sc21t2-zero3", "d2", a, b, 2.0),
            _row("D", "sc21t2-zero3", "d3", a, b, 4.0)]
    fits = {"deepspeed.host_per_rank_s": ["sc21t2-zero3:d1", "sc21t2-zero3:d2"]}
    provenance.mark_in_sample(rows, fits)
    assert [r.in_sample for r in rows] == [True, True, False]
    d = provenance.leave_one_source_out(rows, fits)["D"]
    assert d["rows"] == 1 and d["mape"] == pytest.approx(abs((a + b / 0.85) / 4.0 - 1))
    assert "deepspeed.host_per_rank_s" in d["note"] and "2 rows" in d["note"]
    fits["deepspeed.host_per_rank_s"].append("sc21t2-zero3:d3")
    d = provenance.leave_one_source_out(rows, fits)["D"]
    assert d["rows"] == 0 and d["mape"] != d["mape"]
    assert provenance.pooled({"D": d, "E": {"rows": 2, "mape": 0.03, "max_abs_error": 0.04}}) == {
        "rows": 2, "mape": pytest.approx(0.03), "max_abs_error": 0.04}


def test_pooled_loso_weights_tables_by_rows():
    per = {"A": {"rows": 1, "mape": 0.10, "max_abs_error": 0.10}, "B": {"rows": 3, "mape": 0.02, "max_abs_error": 0.05}}
    assert provenance.pooled(per) == {"rows": 4, "mape": pytest.approx(0.04), "max_abs_error": 0.10}
