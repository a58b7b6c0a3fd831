"""Parallelism placements as parallelism matrices (P², Xie et al. MLSys'22 §3).

A *parallelism matrix* ``P`` has one row per parallelism axis and one column per hierarchy level;
``P[i][j]`` is how many units of level ``j`` axis ``i`` is split across. Every row's product is the
axis size and every column's product the level size. Enumerating the factorisations gives every
topology-aware placement -- far fewer than the device permutations.

Order convention (fixed here; P²'s own is not recoverable from the public sources):

* A device's level coordinate ``c_j`` (see :class:`~scenarios.p2.hierarchy.Hierarchy`) is split in
  mixed radix over the column ``(P[0][j], ..., P[n-1][j])`` **in row order, the first axis most
  significant**: ``c_j = sum_i y_ij * prod_{i' > i} P[i'][j]``. So within a level the last axis varies
  fastest (``dp`` then ``tp`` puts tensor-parallel peers on consecutive GPUs).
* Axis coordinate ``x_i`` is the mixed-radix number of ``(y_i0, ..., y_i{m-1})`` with radices
  ``P[i][j]``, **the outermost level most significant**: ``x_i = sum_j y_ij * prod_{j' > j} P[i][j']``.
* The *reduction group* of a device for reduced axes ``R`` is the set of devices with the same ``x_i``
  for every axis ``i`` not in ``R``.
* The *synthesis hierarchy* of ``R`` is the list of factors ``P[i][j] > 1`` with ``i`` in ``R``,
  ordered by level (outer first) and, within a level, by row. A member's *synthesis coordinates* are its
  ``y_ij`` on those factors, and its *synthesis index* their mixed-radix value (outer first); members
  of a group are listed by synthesis index, which is also ascending device order.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from math import prod

from scenarios.p2.hierarchy import Hierarchy

Matrix = tuple[tuple[int, ...], ...]


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def normalise_axes(axes: Mapping[str, int] | Sequence[tuple[str, int]], num_devices: int
                   ) -> tuple[tuple[str, int], ...]:
    """Check axes against the device count and return them as ``((name, size), ...)``.

    Raises:
        ValueError: no axes, a size < 1, an empty name, or a product of sizes different from
            ``num_devices`` (the message names the axes).
    """
    items = tuple((str(n), int(s)) for n, s in (axes.items() if isinstance(axes, Mapping) else axes))
    if not items:
        raise ValueError("axes: at least one parallelism axis is needed")
    names = [n for n, _ in items]
    if len(set(names)) != len(names):
        raise ValueError(f"axes: duplicate axis names in {names}")
    for n, s in items:
        if not n:
            raise ValueError("axes: axis names must be non-empty")
        if s < 1:
            raise ValueError(f"axes: axis {n!r} has size {s}; sizes must be >= 1")
    total = prod(s for _, s in items)
    if total != num_devices:
        desc = " x ".join(f"{n}={s}" for n, s in items)
        raise ValueError(f"axes {desc} multiply to {total}, but the hierarchy has {num_devices} devices")
    return items


def parallelism_matrices(axis_sizes: Sequence[int], level_sizes: Sequence[int]) -> list[Matrix]:
    """All matrices with row products ``axis_sizes`` and column products ``level_sizes``.

    Enumerated column by column, each column a factorisation of the level size whose entries divide
    the remaining row budgets; the last column is forced. Deterministic order.

    Raises:
        ValueError: the two products differ.
    """
    axis_sizes = [int(a) for a in axis_sizes]
    level_sizes = [int(h) for h in level_sizes]
    if prod(axis_sizes) != prod(level_sizes):
        raise ValueError(f"axis sizes {axis_sizes} (product {prod(axis_sizes)}) do not match level sizes "
                         f"{level_sizes} (product {prod(level_sizes)})")
    n, m = len(axis_sizes), len(level_sizes)
    out: list[Matrix] = []

    def columns(level: int, budgets: list[int]) -> Iterator[list[int]]:
        # factorise level_sizes[level] into n entries, entry i dividing budgets[i]
        def rec(i: int, rest: int) -> Iterator[list[int]]:
            if i == n - 1:
                if budgets[i] % rest == 0:
                    yield [rest]
                return
            for d in _divisors(rest):
                if budgets[i] % d == 0:
                    for tail in rec(i + 1, rest // d):
                        yield [d, *tail]
        yield from rec(0, level_sizes[level])

    def rec_cols(level: int, budgets: list[int], cols: list[list[int]]) -> None:
        if level == m - 1:
            if prod(budgets) == level_sizes[level]:
                cols = [*cols, budgets]
                out.append(tuple(tuple(cols[j][i] for j in range(m)) for i in range(n)))
            return
        for col in columns(level, budgets):
            rec_cols(level + 1, [b // c for b, c in zip(budgets, col, strict=True)], [*cols, col])

    rec_cols(0, axis_sizes, [])
    return out


@dataclass(frozen=True, slots=True)
class SynthLevel:
    """One level of a synthesis hierarchy: the share of reduced axis ``axis`` on hierarchy ``level``."""

    level: str
    axis: str
    size: int


@dataclass(frozen=True)
class Placement:
    """Parallelism axes placed on a hierarchy by a parallelism matrix.

    Args:
        hierarchy: the system.
        axes: ``((name, size), ...)`` in row order (see :func:`normalise_axes`).
        matrix: rows = axes, columns = levels.

    Raises:
        ValueError: the matrix's shape or its row/column products do not fit.
    """

    hierarchy: Hierarchy
    axes: tuple[tuple[str, int], ...]
    matrix: Matrix

    def __post_init__(self) -> None:
        axes = normalise_axes(self.axes, self.hierarchy.num_devices)
        object.__setattr__(self, "axes", axes)
        mat = tuple(tuple(int(x) for x in row) for row in self.matrix)
        object.__setattr__(self, "matrix", mat)
        sizes = self.hierarchy.sizes
        if len(mat) != len(axes) or any(len(r) != len(sizes) for r in mat):
            raise ValueError(f"matrix {mat}: expected {len(axes)} rows x {len(sizes)} columns")
        for (name, a), row in zip(axes, mat, strict=True):
            if prod(row) != a:
                raise ValueError(f"matrix row of axis {name!r} {row} multiplies to {prod(row)}, not {a}")
        for j, (lname, h) in enumerate(self.hierarchy.levels):
            col = prod(r[j] for r in mat)
            if col != h:
                raise ValueError(f"matrix column of level {lname!r} multiplies to {col}, not {h}")

    # -- coordinates -----------------------------------------------------------------------------
    @property
    def axis_names(self) -> tuple[str, ...]:
        return tuple(n for n, _ in self.axes)

    def _split(self, device: int) -> list[list[int]]:
        """``y[i][j]``: axis ``i``'s digit at level ``j`` for ``device``."""
        cs = self.hierarchy.coords(device)
        n = len(self.axes)
        y = [[0] * len(cs) for _ in range(n)]
        for j, c in enumerate(cs):
            for i in reversed(range(n)):
                c, y[i][j] = divmod(c, self.matrix[i][j])
        return y

    def axis_coords(self, device: int) -> dict[str, int]:
        """Axis coordinate ``x_i`` of ``device`` for every axis (see module doc)."""
        y = self._split(device)
        out = {}
        for i, (name, _) in enumerate(self.axes):
            x = 0
            for j, f in enumerate(self.matrix[i]):
                x = x * f + y[i][j]
            out[name] = x
        return out

    def device_of(self, coords: Mapping[str, int]) -> int:
        """Device holding axis coordinates ``coords`` (inverse of :meth:`axis_coords`).

        Raises:
            ValueError: a missing axis or a coordinate out of range.
        """
        n, m = len(self.axes), len(self.hierarchy.levels)
        y = [[0] * m for _ in range(n)]
        for i, (name, size) in enumerate(self.axes):
            if name not in coords:
                raise ValueError(f"coords {dict(coords)}: missing axis {name!r}")
            x = int(coords[name])
            if not 0 <= x < size:
                raise ValueError(f"coords: axis {name!r} coordinate {x} not in [0, {size})")
            for j in reversed(range(m)):
                x, y[i][j] = divmod(x, self.matrix[i][j])
        level_coords = []
        for j in range(m):
            c = 0
            for i in range(n):
                c = c * self.matrix[i][j] + y[i][j]
            level_coords.append(c)
        return self.hierarchy.device(level_coords)

    # -- reductions -------------------------------------------------------------------------------
    def check_reduce(self, reduce: Sequence[str]) -> tuple[int, ...]:
        """Row indices of the reduced axes, in row order.

        Raises:
            ValueError: empty, duplicated or unknown axis names (the message names them).
        """
        if isinstance(reduce, str):
            reduce = [reduce]
        reduce = list(reduce)
        if not reduce:
            raise ValueError("reduce: name at least one axis to reduce over")
        unknown = [r for r in reduce if r not in self.axis_names]
        if unknown:
            raise ValueError(f"reduce: unknown axis {unknown}; axes are {list(self.axis_names)}")
        if len(set(reduce)) != len(reduce):
            raise ValueError(f"reduce: duplicate axes in {reduce}")
        return tuple(i for i, n in enumerate(self.axis_names) if n in reduce)

    def synthesis_levels(self, reduce: Sequence[str]) -> tuple[SynthLevel, ...]:
        """The synthesis hierarchy of ``reduce``: non-1 factors of the reduced rows, level-major."""
        rows = self.check_reduce(reduce)
        out = []
        for j, (lname, _) in enumerate(self.hierarchy.levels):
            for i in rows:
                if self.matrix[i][j] > 1:
                    out.append(SynthLevel(lname, self.axes[i][0], self.matrix[i][j]))
        return tuple(out)

    def reduction_groups(self, reduce: Sequence[str]) -> list[tuple[int, ...]]:
        """Reduction groups of ``reduce``: each a tuple of devices in synthesis-index order.

        Groups are listed by their smallest device."""
        rows = self.check_reduce(reduce)
        slots = [(j, i) for j in range(len(self.hierarchy.levels)) for i in rows if self.matrix[i][j] > 1]
        keep = [i for i in range(len(self.axes)) if i not in rows]
        groups: dict[tuple[int, ...], dict[int, int]] = {}
        for d in range(self.hierarchy.num_devices):
            y = self._split(d)
            key = tuple(tuple(y[i]) for i in keep)
            s = 0
            for j, i in slots:
                s = s * self.matrix[i][j] + y[i][j]
            groups.setdefault(key, {})[s] = d
        out = [tuple(g[s] for s in range(len(g))) for g in groups.values()]
        return sorted(out, key=min)

    # -- reporting ---------------------------------------------------------------------------------
    def describe(self) -> str:
        """E.g. ``dp: node 4 x gpu 2 | tp: gpu 4`` (factors of 1 omitted)."""
        parts = []
        for (name, _), row in zip(self.axes, self.matrix, strict=True):
            fs = [f"{ln} {f}" for (ln, _), f in zip(self.hierarchy.levels, row, strict=True) if f > 1]
            parts.append(f"{name}: {' x '.join(fs) if fs else '-'}")
        return " | ".join(parts)

    def matrix_str(self) -> str:
        """E.g. ``[[4,2],[1,4]]``."""
        return "[" + ",".join("[" + ",".join(map(str, r)) + "]" for r in self.matrix) + "]"


def enumerate_placements(hierarchy: Hierarchy, axes: Mapping[str, int] | Sequence[tuple[str, int]]
                         ) -> list[Placement]:
    """Every placement of ``axes`` on ``hierarchy`` (one per parallelism matrix).

    Raises:
        ValueError: the axis sizes do not multiply to the device count (the message names the axes).
    """
    items = normalise_axes(axes, hierarchy.num_devices)
    mats = parallelism_matrices([s for _, s in items], hierarchy.sizes)
    return [Placement(hierarchy, items, m) for m in mats]
