"""``Layout.mirror`` skips the shifts along an axis a group holds whole (they map it onto itself): the
result is the same as shifting by every (tp, dp) offset."""

import pytest

from workload.parallel.config import ParallelConfig
from workload.parallel.placement import Layout


def _every_shift(lay: Layout, ranks: tuple[int, ...], directed: bool) -> list[tuple[int, ...]]:
    """``mirror`` without the shortcut: every (tp, dp) offset, first occurrence of each set kept."""
    coords = [lay.coords(r) for r in ranks]
    t = lay.sizes["tp"]
    out = [tuple(ranks)]
    seen = {tuple(ranks) if directed else frozenset(ranks)}
    for dt in range(t):
        for dd in range(lay.sizes["dp"]):
            other = tuple(lay.rank(tp=(c["tp"] + dt) % t, cp=c["cp"], dp=lay._shift_dp(c["dp"], dd), pp=c["pp"])
                          for c in coords)
            key = other if directed else frozenset(other)
            if key not in seen:
                seen.add(key)
                out.append(other)
    return out


@pytest.mark.parametrize("kw,world", [
    ({"tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 2}, 16),
    ({"tensor_model_parallel_size": 2, "context_parallel_size": 2}, 16),
    ({"expert_model_parallel_size": 2, "tensor_model_parallel_size": 2}, 16),
    ({"rank_order": "dp-tp-cp-ep-pp", "tensor_model_parallel_size": 4}, 16),
])
def test_mirror_equals_every_shift(kw, world):
    lay = Layout(ParallelConfig(**kw).resolve(world))
    groups = {lay.group(0, axes) for axes in ("tp", "dp", ("cp", "dp"), "pp", "ep", "edp", ("tp", "dp"))}
    groups |= {(0, 1), (1, 0), (0, lay.world_size - 1)}
    for g in groups:
        for directed in (False, True):
            assert lay.mirror(g, directed=directed) == _every_shift(lay, g, directed), (g, directed)


def test_a_whole_data_parallel_group_is_its_only_mirror():
    """1,536 ranks of data parallelism: the group maps onto itself under every shift."""
    lay = Layout(ParallelConfig().resolve(1536))
    g = lay.group(0, "dp")
    assert lay.mirror(g) == [g]
