"""Enumerative synthesis of reduction programs with semantic pruning (P² §5).

Breadth-first over program length, extending each kept prefix by every step of the alphabet
(:meth:`~scenarios.p2.programs.SynthSpace.alphabet`). An extension is pruned when

* the step is **invalid** on the prefix's state (precondition fails);
* it makes **no progress** (state unchanged);
* the state is a **dead end** (some contribution to some chunk is lost everywhere);
* the state was **already reached by a shorter prefix** (equal-length prefixes are all kept: they
  reach the same data by different collectives, which cost differently).

An extension that reaches the goal is a synthesised program and is not extended further.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from scenarios.p2.programs import Program, State, Step, SynthSpace

DEFAULT_MAX_LEN = 4
"""Default program-length bound: enough for the 2-level ``RS; AR; AG`` / ``Reduce; AR; Bcast`` and for
three-level programs such as ``RS; RS; AR; ...`` truncated at 4 steps."""


@dataclass(slots=True)
class SynthStats:
    """How many extensions each pruning rule removed."""

    expanded: int = 0
    """Extensions tried (prefix x step)."""
    invalid: int = 0
    no_progress: int = 0
    dead_end: int = 0
    revisited: int = 0
    at_bound: int = 0
    """Valid, incomplete programs of the maximum length (not extended)."""
    kept: int = 0
    """Prefixes kept for further extension."""
    programs: int = 0
    """Complete programs found."""

    def as_dict(self) -> dict[str, int]:
        return {k: getattr(self, k) for k in self.__slots__}


@dataclass(slots=True)
class SynthResult:
    """The programs synthesised for one synthesis hierarchy."""

    space: SynthSpace
    programs: list[Program]
    """Complete programs, shortest first, in deterministic enumeration order."""
    stats: SynthStats = field(default_factory=SynthStats)


def synthesize(space: SynthSpace, max_len: int = DEFAULT_MAX_LEN, *, max_programs: int | None = None
               ) -> SynthResult:
    """All valid reduction programs of at most ``max_len`` steps on ``space`` (see module doc).

    Args:
        space: the synthesis hierarchy.
        max_len: program-length bound (>= 1).
        max_programs: stop after this many programs (``None``: no limit).

    Raises:
        ValueError: ``max_len`` < 1.
    """
    if max_len < 1:
        raise ValueError(f"max_len must be >= 1, got {max_len}")
    alphabet = space.alphabet()
    stats = SynthStats()
    depth: dict[State, int] = {space.initial: 0}
    frontier: list[tuple[Program, State]] = [((), space.initial)]
    found: list[Program] = []
    for length in range(1, max_len + 1):
        nxt: list[tuple[Program, State]] = []
        for prog, state in frontier:
            for step in alphabet:
                stats.expanded += 1
                ns = space.try_apply(state, step)
                if ns is None:
                    stats.invalid += 1
                    continue
                if ns == state:
                    stats.no_progress += 1
                    continue
                p2 = (*prog, step)
                if space.is_goal(ns):
                    found.append(p2)
                    stats.programs += 1
                    if max_programs is not None and len(found) >= max_programs:
                        return SynthResult(space, found, stats)
                    continue
                if length == max_len:
                    stats.at_bound += 1
                    continue
                d = depth.get(ns)
                if d is not None and d < length:
                    stats.revisited += 1
                    continue
                if d is None:
                    if not space.may_reach_goal(ns):
                        stats.dead_end += 1
                        continue
                    depth[ns] = length
                stats.kept += 1
                nxt.append((p2, ns))
        frontier = nxt
        if not frontier:
            break
    return SynthResult(space, found, stats)


def default_program(space: SynthSpace) -> Program:
    """The single AllReduce over the whole reduction group."""
    return (Step("AllReduce", 0, len(space.sizes), "InsideGroup"),)
