"""What each calibration constant was fitted to (``[fitted_to]`` of ``hwmodel/data/calibration.toml``),
which validation rows are therefore in-sample, and the leave-one-source-out (LOSO) error.

LOSO: the only end-to-end constant (fitted to ``trainsim validate`` rows) is the A100 sustained clock
fraction f. For each source (table) it was fitted on, f is refitted -- minimum MAPE, golden-section
search on [0.5, 1] -- on the remaining sources' fitted rows, and the held-out source is predicted at
the refitted f. The cheap path: every in-sample row is simulated at the shipped f0 and once more at
f1 = ``REFIT_PROBE``; its time is t(f) = a + b / f through those two points (tensor-core work scales
as 1/f, memory-bound kernels, communication and host time do not), so the search needs no further
simulation. A source with no end-to-end constant fitted on it has LOSO error = its plain error.
Another end-to-end constant fitted only on its own source's rows (DeepSpeed's ``host_per_rank_s`` on
SC'21 Table 2's 175B ZeRO-3 rows) cannot be refitted without that source: those rows are left out of
the held-out figure, which then covers the source's other rows.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import tomllib

from scenarios.validation import stats
from scenarios.validation.tables import TABLES, Row

CLOCK_CONSTANT = "architecture.ampere.sustained_clock_fraction"
REFIT_PROBE = 0.95
"""Second clock fraction each in-sample row is simulated at (the shipped one is the first)."""


def fitted_to(path: str | Path | None = None) -> dict[str, list[str]]:
    """``{dotted constant: [row ids]}`` from the calibration file's ``[fitted_to]`` table (default: the
    shipped ``hwmodel/data/calibration.toml``)."""
    from hwmodel.costmodel import DEFAULT_CALIBRATION_PATH

    with Path(path or DEFAULT_CALIBRATION_PATH).open("rb") as f:
        return {k: list(v) for k, v in tomllib.load(f).get("fitted_to", {}).items()}


def validation_ids(ids: Sequence[str]) -> set[str]:
    """The entries of ``ids`` that name ``trainsim validate`` rows (``"<table key>:<row>"``)."""
    return {i for i in ids if i.split(":", 1)[0] in TABLES and ":" in i}


def end_to_end_constants(fits: dict[str, list[str]]) -> dict[str, set[str]]:
    """Constants fitted on at least one validation row -> those row ids."""
    return {c: ids for c, rows_ in fits.items() if (ids := validation_ids(rows_))}


def mark_in_sample(rows: Sequence[Row], fits: dict[str, list[str]]) -> None:
    """Set ``Row.in_sample`` for rows listed by any constant's ``fitted_to``."""
    listed = set().union(*end_to_end_constants(fits).values()) if fits else set()
    for r in rows:
        r.in_sample = r.row_id in listed


@contextmanager
def clock_fraction(value: float) -> Iterator[None]:
    """Within the block, simulations price A100 tensor-core work at sustained clock fraction ``value``
    (the shipped calibration with ``CLOCK_CONSTANT`` replaced; restored afterwards)."""
    import hwmodel.costmodel as cm

    base = cm._default_calibration()
    data: dict[str, Any] = copy.deepcopy(dict(base.data))
    data["architecture"]["ampere"]["sustained_clock_fraction"] = value
    saved = cm._DEFAULT_CAL
    cm._DEFAULT_CAL = cm.Calibration(data, base.path)
    try:
        yield
    finally:
        cm._DEFAULT_CAL = saved


def shipped_clock() -> float:
    """The A100 sustained clock fraction in the shipped calibration."""
    import hwmodel.costmodel as cm

    return float(cm._default_calibration().data["architecture"]["ampere"]["sustained_clock_fraction"])


def sample(r: Row) -> tuple[float, float, float, bool]:
    """``(a, b, measured, is_rate)`` of a row with a curve, for :func:`stats.refit_clock`."""
    assert r.curve is not None, r.row_id
    return (*r.curve, r.measured, r.is_rate)


def set_curve(r: Row, f0: float, value0: float, f1: float, value1: float) -> None:
    """Store the row's t(f) = a + b / f from its predictions at two clock fractions (a rate metric is
    inverted first: it is inversely proportional to time)."""
    inv = r.is_rate
    r.curve = stats.two_point_curve(f0, 1 / value0 if inv else value0, f1, 1 / value1 if inv else value1)


def leave_one_source_out(rows: Sequence[Row], fits: dict[str, list[str]]) -> dict[str, dict[str, Any]]:
    """Per table present: the held-out error after refitting the end-to-end constant without it.

    Returns:
        ``{table: {"refit": f or None, "mape", "max_abs_error", "rows", "note"}}``; ``refit`` is ``None``
        where the clock was not fitted on the table (its LOSO error is then its plain error) or where no
        other fitted source is present to refit on (``mape`` then ``nan``). Rows of the table that another
        end-to-end constant was fitted on are left out (``rows`` counts the rest; ``nan`` if none is left).
    """
    constants = end_to_end_constants(fits)
    fitted = constants.get(CLOCK_CONSTANT, set())
    others = {c: ids for c, ids in constants.items() if c != CLOCK_CONSTANT}
    done = [r for r in rows if r.expressible and r.predicted == r.predicted]
    out: dict[str, dict[str, Any]] = {}
    for table in dict.fromkeys(r.table for r in done):
        own = [r for r in done if r.table == table]
        # rows another constant was fitted on cannot be held out (its only source is this table)
        kept = [r for r in own if not any(r.row_id in ids for ids in others.values())]
        left = sorted(c for c, ids in others.items() if any(r.row_id in ids for r in own))
        own_note = f"; {len(own) - len(kept)} rows {', '.join(left)} was fitted on left out" if left else ""
        own = kept
        if not any(r.row_id in fitted for r in own):
            errs = [r.error for r in own]
            out[table] = {"refit": None, "mape": stats.mape(errs) if errs else float("nan"),
                          "max_abs_error": stats.max_abs(errs) if errs else float("nan"), "rows": len(own),
                          "note": "no A100 clock fitted on it: LOSO = plain error" + own_note}
            continue
        rest = [sample(r) for r in done if r.table != table and r.row_id in fitted and r.curve is not None]
        if not rest:
            out[table] = {"refit": None, "mape": float("nan"), "max_abs_error": float("nan"), "rows": len(own),
                          "note": "no other fitted source in this run to refit on"}
            continue
        f = stats.refit_clock(rest)
        errs = [stats.predicted_at(sample(r), f) / r.measured - 1 for r in own]
        out[table] = {"refit": f, "mape": stats.mape(errs), "max_abs_error": stats.max_abs(errs), "rows": len(own),
                      "note": f"A100 sustained clock refitted to {f:.3f} on {len(rest)} rows of the other sources"}
    return out


def pooled(per_table: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """All tables' held-out errors together: MAPE weighted by rows, the largest max (``nan`` if any table
    could not be computed)."""
    tables = [v for v in per_table.values() if v["rows"]]
    n = sum(v["rows"] for v in tables)
    return {"rows": n, "mape": sum(v["mape"] * v["rows"] for v in tables) / n if n else float("nan"),
            "max_abs_error": max((v["max_abs_error"] for v in tables), default=float("nan"))}
