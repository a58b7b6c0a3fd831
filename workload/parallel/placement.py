"""Rank coordinates and communicator groups from a parallel configuration.

Megatron-LM's ``RankGenerator`` lays ranks out by an order string such as ``tp-cp-ep-dp-pp``: the first
axis varies fastest, so with that order the tensor-parallel peers are consecutive ranks (inside one
node) and pipeline stages are furthest apart. Expert parallelism is carved out of the data-parallel
axis (an expert-parallel group is ``ep`` consecutive data-parallel ranks), as in Megatron-Core.

A :class:`Layout` gives each rank its coordinates and each rank the groups it belongs to, as ordered
tuples of global ranks -- the communicators the program uses. Which GPU a rank runs on is a separate
``placement`` (rank -> GPU name), by default rank *i* on the topology's *i*-th GPU; other placements
(P²) only change that map.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from itertools import chain

import numpy as np

from workload.parallel.config import ParallelConfig


@dataclass(frozen=True)
class Layout:
    """Coordinates of every rank for a resolved :class:`ParallelConfig`."""

    config: ParallelConfig

    @cached_property
    def sizes(self) -> dict[str, int]:
        c = self.config
        return {"tp": c.tp, "cp": c.cp, "dp": c.dp, "pp": c.pp}

    @cached_property
    def _order(self) -> list[str]:
        return [a for a in self.config.rank_order.split("-") if a != "ep"]

    @property
    def world_size(self) -> int:
        return self.config.world_size

    def coords(self, rank: int) -> dict[str, int]:
        """``{"tp": i, "cp": j, "dp": k, "pp": s, "ep": e}`` of ``rank``."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} out of range for world size {self.world_size}")
        out = {}
        r = rank
        for axis in self._order:
            n = self.sizes[axis]
            out[axis] = r % n
            r //= n
        out["ep"] = out["dp"] % self.config.ep
        return out

    def rank(self, **coords: int) -> int:
        """Global rank at the given coordinates (missing axes are 0)."""
        r, stride = 0, 1
        for axis in self._order:
            r += coords.get(axis, 0) * stride
            stride *= self.sizes[axis]
        return r

    def group(self, rank: int, axes: str | tuple[str, ...]) -> tuple[int, ...]:
        """The communicator of ``rank`` along ``axes`` (e.g. "tp", or ("cp", "dp")): ranks that differ
        from ``rank`` only in those coordinates, in rank order. ``"ep"`` is the expert-parallel group
        (``ep`` consecutive data-parallel ranks); ``"edp"`` the expert data-parallel group."""
        axes = (axes,) if isinstance(axes, str) else tuple(axes)
        hit = self._groups.get((rank, axes))
        if hit is not None:  # (each rank's program builder asks its groups again: data-parallel ones grow)
            return hit
        unknown = set(axes) - {"tp", "cp", "dp", "pp", "ep", "edp"}
        if unknown:
            raise ValueError(f"unknown axes {sorted(unknown)}; allowed: tp, cp, dp, pp, ep, edp")
        me = self.coords(rank)
        ep = self.config.ep
        choices: dict[str, range | list[int]] = {}
        for axis in ("tp", "cp", "pp"):
            choices[axis] = range(self.sizes[axis]) if axis in axes else [me[axis]]
        if "dp" in axes:
            choices["dp"] = range(self.sizes["dp"])
        elif "ep" in axes:
            base = me["dp"] // ep * ep
            choices["dp"] = range(base, base + ep)
        elif "edp" in axes:
            choices["dp"] = range(me["dp"] % ep, self.sizes["dp"], ep)
        else:
            choices["dp"] = [me["dp"]]
        out = self._groups[(rank, axes)] = tuple(sorted(
            self.rank(tp=a, cp=b, dp=c, pp=d) for a in choices["tp"] for b in choices["cp"]
            for c in choices["dp"] for d in choices["pp"]))
        return out

    @cached_property
    def _groups(self) -> dict[tuple[int, tuple[str, ...]], tuple[int, ...]]:
        """:meth:`group`'s answers, by (rank, axes)."""
        return {}

    def stage_ranks(self, stage: int) -> list[int]:
        """All ranks of pipeline stage ``stage``."""
        return [r for r in range(self.world_size) if self.coords(r)["pp"] == stage]

    def representatives(self, *, every_cp: bool = True) -> list[int]:
        """The context-parallel ranks of each pipeline stage (tp = dp = 0; one rank per stage without
        CP): data-parallel replicas and tensor-parallel peers run the same program, shifted, so these
        stand for all (symmetry mode). Context-parallel peers run the same program too, but their ring
        attention is point-to-point: a send needs its receiver simulated, so every CP rank is, and
        :meth:`mirror` does not shift the CP coordinate. ``every_cp=False``: one rank per stage (cp = 0),
        for programs without ring attention's sends (the hierarchical engine's macro layer passes hold
        them), mirrored with ``mirror(..., shift_cp=True)``."""
        cps = range(self.sizes["cp"] if every_cp else 1)
        return sorted(self.rank(cp=c, pp=s) for s in range(self.sizes["pp"]) for c in cps)

    def mirror(self, ranks: tuple[int, ...], *, directed: bool = False,
               fixed: tuple[str, ...] = (), shift_cp: bool = False) -> list[tuple[int, ...]]:
        """``ranks`` shifted by every (tp, dp) offset, except along the axes in ``fixed`` (axes whose every
        coordinate is simulated, as TP in the hierarchical engine's step 1; CP is shifted only with
        ``shift_cp``, where one rank per stage is simulated, see :meth:`representatives`): the tuples
        that act like ``ranks`` at the same time in a symmetric run, ``ranks`` first, duplicates (as
        sets) removed -- as tuples when ``directed`` (a send ``(a, b)``: its shift ``(b, a)``, the
        reverse send in a ring of two, is another transfer).

        With expert parallelism a data-parallel offset ``q * ep + e`` moves whole expert-parallel blocks
        by ``q`` and rotates each block by ``e`` (:meth:`_shift_dp`), so that an expert-parallel group
        maps onto an expert-parallel group (a plain shift by ``e`` would straddle two blocks: a
        communicator no rank uses, with all-to-all traffic across nodes that never happens)."""
        coords = [self.coords(r) for r in ranks]
        T, D, C = self.sizes["tp"], self.sizes["dp"], self.sizes["cp"]
        axes = ("tp", "dp", "cp") if shift_cp else ("tp", "dp")
        whole = {axis: axis in fixed or self._whole_lines(ranks, coords, axis, directed) for axis in axes}
        dts = np.arange(1 if whole["tp"] else T)
        dds = np.arange(1 if whole["dp"] else D)
        dcs = np.arange(C if shift_cp and not whole["cp"] else 1)
        # every shift at once (numpy): rows in the order (tp offset, dp offset, cp offset), one column per rank
        cols = []
        for c in coords:
            tp = (c["tp"] + dts) % T
            dp = self._shift_dp_array(c["dp"], dds)
            cp = (c["cp"] + dcs) % C
            cols.append((tp[:, None, None] * self._stride["tp"] + dp[None, :, None] * self._stride["dp"]
                         + cp[None, None, :] * self._stride["cp"]).ravel() + c["pp"] * self._stride["pp"])
        first = tuple(ranks)
        rows = zip(*(col.tolist() for col in cols), strict=True)
        if directed:  # (duplicates as tuples: dropped by a dict, first occurrences in order)
            return list(dict.fromkeys(chain((first,), rows)))
        out: list[tuple[int, ...]] = [first]
        seen: set[frozenset[int]] = {frozenset(ranks)}
        for other in rows:
            key = frozenset(other)
            if key not in seen:
                seen.add(key)
                out.append(other)
        return out

    def _whole_lines(self, ranks: tuple[int, ...], coords: list[dict[str, int]], axis: str, directed: bool) -> bool:
        """Whether the set ``ranks`` holds every coordinate along ``axis`` wherever it holds one (e.g. a
        whole data-parallel group): each shift along ``axis`` (a bijection of that coordinate) then maps
        the set onto itself, so :meth:`mirror` finds nothing new there and can skip those shifts -- the
        same result without shifting a 1,536-rank group 1,536 times."""
        if directed:
            return False
        rest = [a for a in ("tp", "cp", "dp", "pp") if a != axis]
        lines = {tuple(c[a] for a in rest) for c in coords}
        return len(set(ranks)) == len(lines) * self.sizes[axis]

    @cached_property
    def _stride(self) -> dict[str, int]:
        """Rank distance between neighbours along each axis (:meth:`rank`'s strides)."""
        out, stride = {}, 1
        for axis in self._order:
            out[axis] = stride
            stride *= self.sizes[axis]
        return out

    def _shift_dp_array(self, dp: int, offsets: np.ndarray) -> np.ndarray:
        """:meth:`_shift_dp` of ``dp`` under each of ``offsets`` (an integer array)."""
        D, ep = self.sizes["dp"], self.config.ep
        if ep == 1:
            return (dp + offsets) % D
        q, e = np.divmod(offsets, ep)
        return ((dp // ep + q) % (D // ep)) * ep + (dp % ep + e) % ep

    def _shift_dp(self, dp: int, offset: int) -> int:
        """Data-parallel coordinate ``dp`` under the mirror offset ``offset`` (0 <= offset < dp size):
        ``offset = q * ep + e`` moves ``dp``'s expert-parallel block by ``q`` blocks and its place in the
        block by ``e``, both cyclically; ``(dp + offset) % dp size`` when ``ep`` is 1. It is a symmetry
        of every communicator: data-parallel groups, expert-parallel blocks and expert data-parallel
        groups (one place in every block) map onto their own kind."""
        ep = self.config.ep
        if ep == 1:
            return (dp + offset) % self.sizes["dp"]
        q, e = divmod(offset, ep)
        blocks = self.sizes["dp"] // ep
        return ((dp // ep + q) % blocks) * ep + (dp % ep + e) % ep
