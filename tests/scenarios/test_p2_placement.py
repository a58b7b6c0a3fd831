"""P² hierarchy and placements: matrix enumeration counts, the coordinate map, reduction groups."""

import itertools
from math import prod

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scenarios.p2.hierarchy import Hierarchy
from scenarios.p2.placement import Placement, enumerate_placements, parallelism_matrices


def test_hierarchy_coords_roundtrip_and_errors():
    h = Hierarchy((("node", 4), ("gpu", 8)))
    assert h.num_devices == 32 and h.sizes == (4, 8) and str(h) == "node[4] > gpu[8]"
    assert h.coords(13) == (1, 5) and h.device((1, 5)) == 13
    assert all(h.device(h.coords(d)) == d for d in range(32))
    with pytest.raises(ValueError, match="duplicate"):
        Hierarchy((("a", 2), ("a", 2)))
    with pytest.raises(ValueError, match="size 0"):
        Hierarchy((("a", 0),))
    with pytest.raises(ValueError, match="out of range"):
        h.coords(32)
    with pytest.raises(ValueError, match="unknown level 'rack'"):
        h.level_index("rack")


def test_counts_two_levels_2x4_axes_a2_b4():
    # Levels [2, 4], axes a=2, b=4. Rows a=(a0,a1), b=(b0,b1): a0*a1=2, b0*b1=4, a0*b0=2, a1*b1=4.
    #   a0=1 -> a1=2, b0=2, b1=2 (2*2=4 ok)  -> [[1,2],[2,2]]
    #   a0=2 -> a1=1, b0=1, b1=4 (1*4=4 ok)  -> [[2,1],[1,4]]
    # so exactly 2 matrices.
    assert sorted(parallelism_matrices([2, 4], [2, 4])) == [((1, 2), (2, 2)), ((2, 1), (1, 4))]


def test_counts_by_hand():
    # [4, 8], dp=16, tp=2: t0 in {1,2}: t0=1 -> dp (4,4), tp (1,2); t0=2 -> dp (2,8), tp (2,1): 2.
    assert len(parallelism_matrices([16, 2], [4, 8])) == 2
    # [2, 2, 4], a=4, b=4: a's row (a0,a1,a2) with a0,a1 | 2, a2 | 4, product 4:
    # (1,1,4), (1,2,2), (2,1,2), (2,2,1) -> 4 (b's row is forced).
    assert len(parallelism_matrices([4, 4], [2, 2, 4])) == 4
    # [4, 8], x=2, y=4, z=4: column 0 = 4 split over (x,y,z) with x | 2:
    # (1,1,4), (1,4,1), (1,2,2), (2,1,2), (2,2,1) -> 5 (column 1 forced, always consistent).
    assert len(parallelism_matrices([2, 4, 4], [4, 8])) == 5
    # one axis: one matrix, the level sizes.
    assert parallelism_matrices([32], [4, 8]) == [((4, 8),)]


def _brute_force(axes, levels):
    divs = [[d for d in range(1, a + 1) if a % d == 0] for a in axes]
    out = set()
    for rows in itertools.product(*[list(itertools.product(dv, repeat=len(levels))) for dv in divs]):
        if all(prod(r) == a for r, a in zip(rows, axes, strict=True)) and all(
                prod(r[j] for r in rows) == h for j, h in enumerate(levels)):
            out.add(tuple(rows))
    return out


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sampled_from([1, 2, 3, 4]), min_size=1, max_size=3),
       st.lists(st.sampled_from([1, 2, 4]), min_size=1, max_size=3), st.randoms())
def test_enumeration_matches_brute_force(levels, axes_seed, rnd):
    n = prod(levels)
    # split n into random axis sizes
    factors = []
    m = n
    for p in (2, 3):
        while m % p == 0:
            factors.append(p)
            m //= p
    k = len(axes_seed)
    axes = [1] * k
    for f in factors:
        axes[rnd.randrange(k)] *= f
    mats = parallelism_matrices(axes, levels)
    assert len(mats) == len(set(mats))
    assert set(mats) == _brute_force(axes, levels)


def test_coordinate_convention_worked_example():
    # H = (2 nodes, 8 GPUs), dp=4, tp=4, matrix [[2,2],[1,4]]: dp spans nodes, tp inside a node.
    h = Hierarchy((("node", 2), ("gpu", 8)))
    p = Placement(h, (("dp", 4), ("tp", 4)), ((2, 2), (1, 4)))
    # gpu-local index = y_dp1 * 4 + y_tp1 (row order: dp most significant); dp = y_dp0 * 2 + y_dp1
    assert p.axis_coords(5) == {"dp": 1, "tp": 1}
    assert p.axis_coords(12) == {"dp": 3, "tp": 0}
    assert p.reduction_groups(["dp"]) == [(0, 4, 8, 12), (1, 5, 9, 13), (2, 6, 10, 14), (3, 7, 11, 15)]
    assert p.reduction_groups(["tp"])[0] == (0, 1, 2, 3)
    assert p.reduction_groups(["dp", "tp"]) == [tuple(range(16))]
    lv = p.synthesis_levels(["dp"])
    assert [(x.level, x.axis, x.size) for x in lv] == [("node", "dp", 2), ("gpu", "dp", 2)]
    assert p.describe() == "dp: node 2 x gpu 2 | tp: gpu 4" and p.matrix_str() == "[[2,2],[1,4]]"


@pytest.mark.parametrize("levels,axes", [((4, 8), (("dp", 16), ("tp", 2))),
                                         ((2, 2, 4), (("a", 4), ("b", 2), ("c", 2)))])
def test_coordinate_map_is_a_bijection_and_groups_partition(levels, axes):
    h = Hierarchy(tuple((f"l{i}", s) for i, s in enumerate(levels)))
    for p in enumerate_placements(h, axes):
        seen = set()
        for d in range(h.num_devices):
            c = p.axis_coords(d)
            assert p.device_of(c) == d
            seen.add(tuple(c.values()))
        assert len(seen) == h.num_devices
        first = axes[0][0]
        for red in ([first], list(dict(axes))):
            groups = p.reduction_groups(red)
            flat = sorted(d for g in groups for d in g)
            assert flat == list(range(h.num_devices))
            size = prod(dict(axes)[r] for r in red)
            assert all(len(g) == size for g in groups)
            for g in groups:  # synthesis order is ascending device order
                assert list(g) == sorted(g)
                keep = [a for a in dict(axes) if a not in red]
                assert len({tuple(p.axis_coords(d)[a] for a in keep) for d in g}) == 1


def test_bad_input_names_axes():
    h = Hierarchy((("node", 4), ("gpu", 8)))
    with pytest.raises(ValueError, match=r"dp=8 x tp=2 multiply to 16.*32 devices"):
        enumerate_placements(h, {"dp": 8, "tp": 2})
    p = enumerate_placements(h, {"dp": 16, "tp": 2})[0]
    with pytest.raises(ValueError, match=r"unknown axis \['pp'\]"):
        p.reduction_groups(["pp"])
    with pytest.raises(ValueError, match="at least one"):
        p.reduction_groups([])
    with pytest.raises(ValueError, match="row of axis 'dp'"):
        Placement(h, (("dp", 16), ("tp", 2)), ((4, 2), (1, 4)))
