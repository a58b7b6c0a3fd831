"""README.md's quoted figures are what the code prints (as SimPy checks its examples' ``.out`` files).

Live figures (the default scenario's report, a short nccl-tests table) are recomputed here. Slow ones
(``trainsim validate``, the sweeps) are formatted from the REGRESSION GOLDENS in ``tests/docs/golden/``;
refresh those with ``python docs/readme_figures.py --refresh-golden`` (minutes) after a change that
moves them, then ``python docs/readme_figures.py --write`` to update README.md.
"""

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("readme_figures", ROOT / "docs" / "readme_figures.py")
figures = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(figures)

README = (ROOT / "README.md").read_text(encoding="utf-8")


@pytest.mark.parametrize("fig", figures.FIGURES, ids=[f.name for f in figures.FIGURES])
def test_readme_figure_matches_the_code(fig):
    problems = figures.drift(README, (fig,))
    assert not problems, "\n".join(problems)


def test_every_readme_figure_block_is_produced():
    assert set(figures.readme_bodies(README)) == {f.name for f in figures.FIGURES}


def test_a_drifted_figure_is_reported_by_name():
    fig = next(f for f in figures.FIGURES if f.name == "validation-sc21")
    good = f"<!-- figure: validation-sc21 -->{figures.body(fig)}<!-- /figure -->"
    assert figures.drift(good, (fig,)) == []
    bad = good.replace("sc21-gpt-1.7b", "sc21-gpt-1.8b")
    (problem,) = figures.drift(bad, (fig,))
    assert problem.startswith("README figure 'validation-sc21' differs from what the code prints now")
    assert "-SC'21 Table 1          sc21-gpt-1.8b" in problem and "+SC'21 Table 1          sc21-gpt-1.7b" in problem
    (missing,) = figures.drift(bad.replace("<!-- figure: validation-sc21 -->", ""), (fig,))
    assert "'validation-sc21' is missing" in missing


def test_the_goldens_are_the_commands_outputs():
    """The regression goldens have the shape their commands write (they are verbatim outputs)."""
    validate = json.loads((figures.GOLDEN / "validate.json").read_text())
    assert [s["rows"] for s in validate["summary"].values()] == [10, 8, 10]
    for row in validate["rows"]:
        assert row["error"] == pytest.approx(row["predicted"] / row["measured"] - 1, rel=1e-12)
    sweep = (figures.GOLDEN / "sweep_whatif-oversubscription.txt").read_text()
    assert sweep.startswith("Sweep whatif-oversubscription: 4 point(s)")
