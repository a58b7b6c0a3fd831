"""The reduction-program language and its semantics on per-device state (P² §4, made precise here).

A reduction runs on every reduction group at once, and all groups of a placement have the same
*synthesis hierarchy* (:meth:`~scenarios.p2.placement.Placement.synthesis_levels`), sizes
``s_0 .. s_{L-1}`` outer -> inner, ``k = prod(s)`` members. A member is named by its synthesis index
``t`` in ``[0, k)``, the mixed-radix number of its synthesis coordinates ``(u_0, ..., u_{L-1})``.

**Language.** A program is a sequence of :class:`Step` s. A step is ``Op(slice, form)``:

* ``op``: ``AllReduce | ReduceScatter | AllGather | Reduce | Broadcast``;
* ``slice``: a contiguous range ``[lo, hi)`` of synthesis levels. It cuts the group into *sub-groups*:
  members that agree on every coordinate outside the slice;
* ``form`` picks the communicators, which all run concurrently:

  - ``InsideGroup``: one communicator per sub-group (members that differ only inside the slice);
  - ``Parallel``: across sub-groups, one communicator per position inside the slice (members with
    the same slice coordinates; they differ only outside it);
  - ``Master``: one communicator of the sub-groups' masters (slice coordinates all 0), across
    sub-groups; the other members idle.

  Communicator members are ordered by synthesis index; the first is the root of Reduce/Broadcast.
  P²'s Figure 3 programs are ``AllReduce(all, InsideGroup)`` (the default),
  ``AllReduce(inner, InsideGroup); AllReduce(inner, Parallel)`` and
  ``Reduce(inner, InsideGroup); AllReduce(inner, Master); Broadcast(inner, InsideGroup)``.

**Semantics.** The buffer is split into ``k`` chunks. A member's state maps each chunk to the set of
sources (a ``k``-bit mask) whose contributions its copy contains; mask 0 means the member does not hold
that chunk (after a ReduceScatter it owns only its part). Start: member ``t`` holds every chunk with
mask ``{t}``. Goal: every member holds every chunk with the full mask. Per communicator
``(d_0, ..., d_{m-1})`` (a step is *invalid* if any communicator's precondition fails):

* ``AllReduce``: all members hold the same chunks, and per chunk their masks are pairwise disjoint
  (otherwise a contribution would be summed twice). Each member gets the union.
* ``ReduceScatter``: as AllReduce, and the number ``n`` of held chunks is divisible by ``m``. The held
  chunks, in chunk order, are cut into ``m`` equal parts; ``d_i`` keeps part ``i`` with the unions and
  drops the rest.
* ``AllGather``: members hold pairwise disjoint, equally many (>= 1) chunks. Each gets all of them.
* ``Reduce``: as AllReduce; the root gets the unions, the others' copies are consumed (dropped).
* ``Broadcast``: the root holds >= 1 chunk; every member's copy of those chunks becomes the root's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from math import prod

OPS = ("AllReduce", "ReduceScatter", "AllGather", "Reduce", "Broadcast")
"""Collectives of the language."""
FORMS = ("InsideGroup", "Parallel", "Master")
"""How a step's slice turns into communicators (see module doc)."""
NCCL_OP = {"AllReduce": "all_reduce", "ReduceScatter": "reduce_scatter", "AllGather": "all_gather",
           "Reduce": "reduce", "Broadcast": "broadcast"}
"""Language op -> :data:`hwmodel.ir.COLLECTIVE_OPS` name."""

State = tuple[tuple[int, ...], ...]
"""``state[t][c]``: source bitmask of member ``t``'s copy of chunk ``c`` (0 = not held)."""


class InvalidStep(ValueError):
    """A step's precondition fails on the current state."""


@dataclass(frozen=True, slots=True)
class Step:
    """``op(slice [lo, hi), form)`` -- see the module doc.

    Raises:
        ValueError: unknown op or form, or an empty slice.
    """

    op: str
    lo: int
    hi: int
    form: str = "InsideGroup"

    def __post_init__(self) -> None:
        if self.op not in OPS:
            raise ValueError(f"op {self.op!r} is not one of {OPS}")
        if self.form not in FORMS:
            raise ValueError(f"form {self.form!r} is not one of {FORMS}")
        if not 0 <= self.lo < self.hi:
            raise ValueError(f"slice [{self.lo}, {self.hi}) is empty or negative")

    def label(self, level_names: Sequence[str] | None = None) -> str:
        """E.g. ``ReduceScatter(gpu, InsideGroup)``; slice levels by name when given."""
        sl = f"{self.lo}:{self.hi}" if level_names is None else "+".join(level_names[self.lo:self.hi])
        return f"{self.op}({sl}, {self.form})"


Program = tuple[Step, ...]


def program_label(program: Sequence[Step], level_names: Sequence[str] | None = None) -> str:
    """Steps joined by ``; ``."""
    return "; ".join(s.label(level_names) for s in program)


class SynthSpace:
    """The members, communicators and states of one synthesis hierarchy.

    Args:
        sizes: synthesis level sizes, outer -> inner, each >= 2 (a level of size 1 adds nothing).
        names: optional level labels for printing (default ``l0``, ``l1``, ...).

    Raises:
        ValueError: no levels, a size < 2, or ``names`` of the wrong length.
    """

    def __init__(self, sizes: Sequence[int], names: Sequence[str] | None = None) -> None:
        self.sizes = tuple(int(s) for s in sizes)
        if not self.sizes:
            raise ValueError("sizes: a synthesis hierarchy needs at least one level")
        if any(s < 2 for s in self.sizes):
            raise ValueError(f"sizes {self.sizes}: every synthesis level must have size >= 2")
        self.names = tuple(names) if names is not None else tuple(f"l{i}" for i in range(len(self.sizes)))
        if len(self.names) != len(self.sizes):
            raise ValueError(f"names {self.names}: expected {len(self.sizes)}")
        self.k = prod(self.sizes)
        """Members per reduction group (= chunks)."""
        self.full = (1 << self.k) - 1
        self._coords = [self._to_coords(t) for t in range(self.k)]
        self._comm_cache: dict[Step, tuple[tuple[int, ...], ...]] = {}

    def _to_coords(self, t: int) -> tuple[int, ...]:
        out = []
        for s in reversed(self.sizes):
            t, c = divmod(t, s)
            out.append(c)
        return tuple(reversed(out))

    def coords(self, t: int) -> tuple[int, ...]:
        """Synthesis coordinates of member ``t``."""
        return self._coords[t]

    # -- communicators ---------------------------------------------------------------------------
    def communicators(self, step: Step) -> tuple[tuple[int, ...], ...]:
        """The step's communicators with >= 2 members, each in synthesis-index order (root first).

        Raises:
            ValueError: the slice reaches past the last synthesis level.
        """
        hit = self._comm_cache.get(step)
        if hit is not None:
            return hit
        if step.hi > len(self.sizes):
            raise ValueError(f"step {step.label()}: slice beyond the {len(self.sizes)} synthesis levels")
        inside = range(step.lo, step.hi)
        groups: dict[tuple[int, ...], list[int]] = {}
        for t in range(self.k):
            c = self._coords[t]
            in_c = tuple(c[i] for i in inside)
            out_c = tuple(c[i] for i in range(len(c)) if not step.lo <= i < step.hi)
            if step.form == "InsideGroup":
                key = out_c
            elif step.form == "Parallel":
                key = in_c
            else:  # Master
                if any(in_c):
                    continue
                key = ()
            groups.setdefault(key, []).append(t)
        comms = tuple(tuple(g) for g in groups.values() if len(g) > 1)
        self._comm_cache[step] = comms
        return comms

    def alphabet(self) -> list[Step]:
        """Every step with at least one communicator of >= 2 members, one per distinct
        (op, communicators) -- the first in (op, InsideGroup/Parallel/Master, slice) order."""
        L = len(self.sizes)
        seen: set = set()
        out = []
        for op in OPS:
            for form in FORMS:
                for lo in range(L):
                    for hi in range(lo + 1, L + 1):
                        st = Step(op, lo, hi, form)
                        comms = self.communicators(st)
                        key = (op, frozenset(comms))
                        if comms and key not in seen:
                            seen.add(key)
                            out.append(st)
        return out

    # -- states ------------------------------------------------------------------------------------
    @cached_property
    def initial(self) -> State:
        """Member ``t`` holds every chunk with only its own contribution."""
        return tuple(tuple(1 << t for _ in range(self.k)) for t in range(self.k))

    @cached_property
    def goal(self) -> State:
        """Every member holds every chunk fully reduced."""
        return tuple(tuple(self.full for _ in range(self.k)) for _ in range(self.k))

    def is_goal(self, state: State) -> bool:
        return state == self.goal

    def may_reach_goal(self, state: State) -> bool:
        """Necessary condition for the goal: no contribution to any chunk has been lost."""
        for c in range(self.k):
            acc = 0
            for row in state:
                acc |= row[c]
            if acc != self.full:
                return False
        return True

    def held(self, state: State, t: int) -> tuple[int, ...]:
        """Chunks member ``t`` holds."""
        return tuple(c for c, m in enumerate(state[t]) if m)

    def apply(self, state: State, step: Step) -> State:  # noqa: C901
        """The state after ``step``.

        Raises:
            InvalidStep: a communicator's precondition fails (the message says which and why).
        """
        new = [list(row) for row in state]
        op = step.op
        for comm in self.communicators(step):
            held = [self.held(state, t) for t in comm]
            m = len(comm)
            if op in ("AllReduce", "ReduceScatter", "Reduce"):
                h = held[0]
                if not h:
                    raise InvalidStep(f"{step.label(self.names)}: member {comm[0]} holds no data")
                if any(x != h for x in held[1:]):
                    raise InvalidStep(f"{step.label(self.names)}: members {comm} hold different chunks")
                if op == "ReduceScatter" and len(h) % m:
                    raise InvalidStep(f"{step.label(self.names)}: {len(h)} chunks do not split into {m} parts")
                union = {}
                for c in h:
                    acc = 0
                    for t in comm:
                        mk = state[t][c]
                        if acc & mk:
                            raise InvalidStep(f"{step.label(self.names)}: chunk {c} would count a "
                                              f"contribution twice in communicator {comm}")
                        acc |= mk
                    union[c] = acc
                if op == "AllReduce":
                    for t in comm:
                        for c in h:
                            new[t][c] = union[c]
                elif op == "Reduce":
                    for c in h:
                        new[comm[0]][c] = union[c]
                        for t in comm[1:]:
                            new[t][c] = 0
                else:
                    part = len(h) // m
                    for i, t in enumerate(comm):
                        mine = set(h[i * part:(i + 1) * part])
                        for c in h:
                            new[t][c] = union[c] if c in mine else 0
            elif op == "AllGather":
                n0 = len(held[0])
                if n0 == 0 or any(len(x) != n0 for x in held):
                    raise InvalidStep(f"{step.label(self.names)}: members {comm} hold unequal or no parts")
                owner: dict[int, int] = {}
                for t, h in zip(comm, held, strict=True):
                    for c in h:
                        if c in owner:
                            raise InvalidStep(f"{step.label(self.names)}: chunk {c} held by both "
                                              f"{owner[c]} and {t}")
                        owner[c] = t
                for t in comm:
                    for c, o in owner.items():
                        new[t][c] = state[o][c]
            else:  # Broadcast
                root = comm[0]
                h = held[0]
                if not h:
                    raise InvalidStep(f"{step.label(self.names)}: root {root} holds no data")
                for t in comm[1:]:
                    for c in h:
                        new[t][c] = state[root][c]
        return tuple(tuple(r) for r in new)

    def try_apply(self, state: State, step: Step) -> State | None:
        """:meth:`apply`, or ``None`` for an invalid step."""
        try:
            return self.apply(state, step)
        except InvalidStep:
            return None

    def run(self, program: Sequence[Step], state: State | None = None) -> State:
        """Execute ``program`` from ``state`` (default: the initial state).

        Raises:
            InvalidStep: some step is invalid where it runs.
        """
        s = self.initial if state is None else state
        for st in program:
            s = self.apply(s, st)
        return s

    def is_valid(self, program: Sequence[Step]) -> bool:
        """Whether ``program`` runs without an invalid step and reaches the goal."""
        try:
            return self.is_goal(self.run(program))
        except InvalidStep:
            return False

    def trace_held(self, program: Sequence[Step]) -> list[tuple[int, ...]]:
        """Chunks held by each member *before* each step (for sizing the lowered collectives)."""
        s = self.initial
        out = []
        for st in program:
            out.append(tuple(len(self.held(s, t)) for t in range(self.k)))
            s = self.apply(s, st)
        return out
