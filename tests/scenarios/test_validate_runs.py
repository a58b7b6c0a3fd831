"""How ``trainsim validate`` runs its simulations: the work units, results independent of the worker
count, and ``--only`` selecting rows by exact name or glob."""

import math

import pytest

from scenarios.cmd_validate import select
from scenarios.validation import provenance
from scenarios.validation.runs import predict, units
from scenarios.validation.tables import rows


def _marked(tables):
    rs = rows(tables)
    provenance.mark_in_sample(rs, provenance.fitted_to())
    return rs


def test_units_one_per_row_and_clock_largest_first():
    rs = _marked(("t4", "sc21", "readme2020"))
    one_gpu = next(r for r in rs if r.key == "readme2020" and r.gpus == 1)
    one_gpu.scenario, one_gpu.not_expressible = None, "marked not expressible by this test"
    us = units(rs, refit=True)
    f0, f1 = provenance.shipped_clock(), provenance.REFIT_PROBE
    # Table 4: forward and backward of a setting are one simulation, at each clock (in-sample)
    t4 = [u for u in us if rs[u.rows[0]].key == "t4"]
    assert len(t4) == 2 * 5 and all(len(u.rows) == 2 for u in t4)
    # SC'21 T1 rows are in-sample: two clocks each; README 2020 rows are not: one, and none for the
    # row no scenario expresses
    sc21 = [u for u in us if rs[u.rows[0]].key == "sc21"]
    assert sorted(u.clock for u in sc21) == sorted([f0] * 10 + [f1] * 10)
    readme = [u for u in us if rs[u.rows[0]].key == "readme2020"]
    assert len(readme) == 7 and {u.clock for u in readme} == {f0}
    # largest first, and a row's shipped clock before its probe
    gpus = [rs[u.rows[0]].gpus for u in us]
    assert gpus == sorted(gpus, reverse=True) and us[0].rows == us[1].rows and us[0].clock == f0
    assert [u for u in units(rs, refit=False) if u.clock == f1] == []


def test_results_do_not_depend_on_the_number_of_workers():
    serial, parallel = (select(_marked(("t4",)), "Baseline no recompute") for _ in range(2))
    seen: list[str] = []
    predict(serial, refit=True, jobs=1)
    predict(parallel, progress=lambda r: seen.append(r.metric), refit=True, jobs=2)
    assert sorted(seen) == ["layer backward", "layer forward"]  # once per row, when both clocks are done
    for a, b in zip(serial, parallel, strict=True):
        assert a.predicted == b.predicted and not math.isnan(a.predicted)
        assert a.curve == b.curve and a.curve is not None


def test_only_is_an_exact_name_or_a_glob():
    rs = rows(("sc21", "torchtitan"))
    # an exact name: "sc21-gpt-1t" only itself
    assert [r.name for r in select(rs, "sc21-gpt-1t")] == ["sc21-gpt-1t"]
    assert [r.name for r in select(rs, "sc21-gpt-1*")] == ["sc21-gpt-1.7b", "sc21-gpt-18b", "sc21-gpt-145b",
                                                             "sc21-gpt-1t"]
    # "8 GPUs" no longer selects the 128-GPU rows
    assert [r.name for r in select(rs, "*(8 GPUs)*")] == ["torchtitan-Table 1 (8 GPUs) FSDP",
                                                          "torchtitan-Table 1 (8 GPUs) FSDP + torch.compile"]
    assert [r.name for r in select(rs, "torchtitan-Table 1 (8 GPUs) FSDP")] == ["torchtitan-Table 1 (8 GPUs) FSDP"]
    assert select(rs, None) == rs


def test_only_matching_nothing_is_one_line_listing_the_names():
    rs = rows(("sc21",))
    with pytest.raises(ValueError, match=r"--only 'gpt-1t' matches no row .*exact name.*sc21-gpt-1.7b, ") as e:
        select(rs, "gpt-1t")
    assert "\n" not in str(e.value) and "sc21-gpt-1t" in str(e.value)
    with pytest.raises(ValueError, match="glob"):
        select(rs, "x*")
