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
        return tuple(sorted(self.rank(tp=a, cp=b, dp=c, pp=d) for a in choices["tp"] for b in choices["cp"]
                            for c in choices["dp"] for d in choices["pp"]))

    def stage_ranks(self, stage: int) -> list[int]:
        """All ranks of pipeline stage ``stage``."""
        return [r for r in range(self.world_size) if self.coords(r)["pp"] == stage]

    def representatives(self) -> list[int]:
        """One rank per pipeline stage (tp = dp = 0) and, under context parallelism, per context-parallel
        index: data-parallel replicas and tensor-parallel peers run the same program, shifted, so these
        stand for all (symmetry mode). Context-parallel peers are all kept because ring attention passes
        K/V blocks between them by send/recv, and a send needs its receiving rank simulated."""
        return [self.rank(pp=s, cp=c) for s in range(self.sizes["pp"]) for c in range(self.sizes["cp"])]

    def mirror(self, ranks: tuple[int, ...]) -> list[tuple[int, ...]]:
        """``ranks`` shifted by every (tp, cp, dp) offset: the tuples that act like ``ranks`` at the
        same time in a symmetric run, ``ranks`` first, duplicates (as sets) removed. Under context
        parallelism a shift along CP alone is left out: it lands on a tuple that the simulated
        context-parallel peers (:meth:`representatives`) issue themselves."""
        coords = [self.coords(r) for r in ranks]
        T, C, D = self.sizes["tp"], self.sizes["cp"], self.sizes["dp"]
        out: list[tuple[int, ...]] = [tuple(ranks)]
        seen = {frozenset(ranks)}
        for dt in range(T):
            for dc in range(C):
                for dd in range(D):
                    other = tuple(self.rank(tp=(c["tp"] + dt) % T, cp=(c["cp"] + dc) % C,
                                            dp=(c["dp"] + dd) % D, pp=c["pp"]) for c in coords)
                    key = frozenset(other)
                    if dc and not dt and not dd:  # simulated: the CP peers are representatives too
                        seen.add(key)
                    elif key not in seen:
                        seen.add(key)
                        out.append(other)
        return out

