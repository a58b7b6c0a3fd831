"""Layout.mirror (vectorised) against its definition: ``ranks`` shifted by every (tp, dp) offset, and every
cp offset with ``shift_cp`` (the hierarchical engine's step 2, one rank per stage)."""

import itertools

import pytest

from workload.parallel.config import ParallelConfig
from workload.parallel.placement import Layout


def _by_definition(lay: Layout, ranks, directed, fixed, shift_cp=False):
    T, D, C = lay.sizes["tp"], lay.sizes["dp"], lay.sizes["cp"]
    out, seen = [tuple(ranks)], {tuple(ranks) if directed else frozenset(ranks)}
    for dt, dd, dc in itertools.product(range(1 if "tp" in fixed else T), range(1 if "dp" in fixed else D),
                                        range(C if shift_cp else 1)):
        other = []
        for r in ranks:
            c = lay.coords(r)
            other.append(lay.rank(tp=(c["tp"] + dt) % T, cp=(c["cp"] + dc) % C, dp=lay._shift_dp(c["dp"], dd),
                                  pp=c["pp"]))
        key = tuple(other) if directed else frozenset(other)
        if key not in seen:
            seen.add(key)
            out.append(tuple(other))
    return out


@pytest.mark.parametrize("tp,cp,dp,pp,ep,order", [(2, 1, 4, 2, 1, "tp-cp-ep-dp-pp"), (4, 2, 4, 2, 2, "tp-cp-ep-dp-pp"),
                                                  (2, 1, 8, 3, 4, "tp-cp-ep-dp-pp"), (2, 2, 4, 2, 1, "tp-pp-ep-dp-cp"),
                                                  (8, 1, 6, 2, 1, "dp-ep-tp-pp-cp")])
def test_mirror_matches_its_definition(tp, cp, dp, pp, ep, order):
    lay = Layout(ParallelConfig(tensor_model_parallel_size=tp, context_parallel_size=cp, data_parallel_size=dp,
                                pipeline_model_parallel_size=pp, expert_model_parallel_size=ep, rank_order=order))
    w = lay.world_size
    cases = [(0,), (w - 1,), (0, w - 1), (1, tp * cp), tuple(range(0, w, max(w // 5, 1)))]
    cases.append(lay.group(0, ("dp", "cp")))  # a gradient reduction's group: whole along dp and cp
    for ranks, directed, fixed, shift_cp in itertools.product(cases, (False, True), ((), ("tp",), ("dp",)),
                                                              (False, True)):
        got = lay.mirror(ranks, directed=directed, fixed=fixed, shift_cp=shift_cp)
        assert got == _by_definition(lay, ranks, directed, fixed, shift_cp)
        assert all(type(x) is int for t in got for x in t)


def test_mirror_of_a_pipeline_send_on_131072_gpus_has_one_mirror_per_tp_dp_offset():
    lay = Layout(ParallelConfig(tensor_model_parallel_size=8, data_parallel_size=1024, pipeline_model_parallel_size=16))
    got = lay.mirror((0, 8 * 1024), directed=True)
    assert len(got) == 8 * 1024 and len(set(got)) == len(got)
    assert got[1] == (8, 8 * 1024 + 8) and got[-1] == (7 + 8 * 1023, 8 * 1024 + 7 + 8 * 1023)
