"""Lowering (placement, program) pairs to per-rank NCCL collectives, costing and simulating them.

**Lowering.** A reduction program runs on every reduction group of the placement at once. Step ``i``
becomes, for every group and every communicator of the step (synthesis indices mapped to the group's
devices, devices = global ranks), one :class:`~hwmodel.ir.Collective` on stream ``comm`` of each member,
named ``p2.s{i}``, root = the communicator's first member. Ranks outside a step's communicators skip
it; per-rank stream order keeps the steps in sequence, and NCCL's matching makes a rank wait for the
peers it exchanges with (no global barrier). Sizes follow the semantics (``c = size_bytes / k`` bytes
per chunk, ``h`` = chunks a member holds before the step, ``m`` members):

* AllReduce: ``h*c`` (per-rank buffer); ReduceScatter: ``h*c`` (NCCL: the whole input buffer);
* AllGather: ``m*h*c`` (NCCL: the whole gathered buffer); Reduce / Broadcast: the root's ``h*c``.

**Simulation.** A fresh :class:`~hwmodel.cluster.Cluster` per candidate, the NCCL engine at the
requested fidelity, rank ``d`` on the hierarchy's GPU ``d``; the time is ``RunResult.end_time_s``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from hwmodel.ir import Collective, Program
from scenarios.p2.cost import QuickCost
from scenarios.p2.placement import Placement
from scenarios.p2.programs import NCCL_OP, Step, SynthSpace, program_label
from scenarios.p2.programs import Program as P2Program
from scenarios.p2.synth import DEFAULT_MAX_LEN, SynthResult, default_program, synthesize

LoweredStep = tuple[str, list[tuple[tuple[int, ...], int]]]
"""``(nccl_op, [(ranks, size_bytes), ...])`` for one step: its concurrent communicators."""


def synth_space(placement: Placement, reduce: Sequence[str]) -> SynthSpace:
    """The synthesis space of ``reduce`` on ``placement``.

    Raises:
        ValueError: unknown reduced axes, or reduced axes of total size 1 (nothing to reduce).
    """
    levels = placement.synthesis_levels(reduce)
    if not levels:
        raise ValueError(f"reduce {list(reduce)}: the reduced axes have total size 1; nothing to reduce")
    return SynthSpace([lv.size for lv in levels], [f"{lv.level}:{lv.axis}" for lv in levels])


_SYNTH_CACHE: dict[tuple[tuple[int, ...], int], SynthResult] = {}


def synthesize_cached(space: SynthSpace, max_len: int = DEFAULT_MAX_LEN) -> SynthResult:
    """:func:`~scenarios.p2.synth.synthesize`, memoised on (synthesis sizes, ``max_len``): every
    placement with the same synthesis hierarchy shares one program list."""
    key = (space.sizes, max_len)
    hit = _SYNTH_CACHE.get(key)
    if hit is None:
        hit = _SYNTH_CACHE[key] = synthesize(space, max_len)
    return hit


def lower_steps(placement: Placement, reduce: Sequence[str], program: Sequence[Step], size_bytes: int,
                space: SynthSpace | None = None) -> list[LoweredStep]:
    """Each step's NCCL op and its communicators (global ranks) with their NCCL sizes.

    Raises:
        InvalidStep: the program is invalid on this synthesis hierarchy.
        ValueError: ``size_bytes`` < 1.
    """
    if size_bytes < 1:
        raise ValueError(f"size_bytes must be >= 1, got {size_bytes}")
    space = space or synth_space(placement, reduce)
    groups = placement.reduction_groups(reduce)
    chunk = size_bytes / space.k
    held = space.trace_held(program)
    out: list[LoweredStep] = []
    for step, h in zip(program, held, strict=True):
        op = NCCL_OP[step.op]
        comms = []
        for comm in space.communicators(step):
            m = len(comm)
            nbytes = m * h[comm[0]] * chunk if step.op == "AllGather" else h[comm[0]] * chunk
            nbytes = max(1, int(round(nbytes)))
            for g in groups:
                comms.append((tuple(g[t] for t in comm), nbytes))
        out.append((op, comms))
    return out


def lower(placement: Placement, reduce: Sequence[str], program: Sequence[Step], size_bytes: int, *,
          dtype: str = "bf16", space: SynthSpace | None = None) -> dict[int, Program]:
    """One :class:`~hwmodel.ir.Program` per device (global rank) running ``program`` on every
    reduction group (see module doc). Every device gets a program, possibly empty."""
    progs = {r: Program(r) for r in range(placement.hierarchy.num_devices)}
    for i, (op, comms) in enumerate(lower_steps(placement, reduce, program, size_bytes, space)):
        for ranks, nbytes in comms:
            coll = Collective(op, nbytes, ranks, dtype=dtype, root=0, name=f"p2.s{i}")
            for r in ranks:
                progs[r].add(coll, stream="comm")
    return progs


def quick_cost_s(cost: QuickCost, lowered: Sequence[LoweredStep]) -> float:
    """Analytical time of a lowered program: the sum over steps of the slowest communicator."""
    return sum(cost.step_s(op, comms) for op, comms in lowered)


def simulate(topology, placement: Placement, programs: dict[int, Program], *, fidelity: str = "flow",
             engine_factory: Callable | None = None) -> float:
    """Simulated end time (s) of ``programs`` on a fresh cluster of ``topology``.

    ``engine_factory(cluster, fidelity)`` builds the collective engine (default: the hardware model's
    :class:`~hwmodel.nccl.engine.NcclEngine`); tests may pass a stub.

    Raises:
        ValueError: the hierarchy has no GPU names (build it with ``Hierarchy.from_topology``).
    """
    from hwmodel.cluster import Cluster
    from hwmodel.runtime import Runtime

    names = placement.hierarchy.gpu_names
    if not names:
        raise ValueError("simulate: the placement's hierarchy has no GPU names; "
                         "build it with Hierarchy.from_topology")
    cluster = Cluster(topology, record=False)
    if engine_factory is None:
        from hwmodel.nccl.engine import NcclEngine
        engine = NcclEngine(cluster, fidelity=fidelity)
    else:
        engine = engine_factory(cluster, fidelity)
    rt = Runtime(cluster, programs, placement={r: names[r] for r in programs}, nccl=engine)
    return float(rt.run().end_time_s)


@dataclass(slots=True)
class Candidate:
    """One program for one (placement, reduction) case, with its costs."""

    program: P2Program
    label: str
    quick_s: float
    """Analytical cost (s)."""
    sim_s: float | None = None
    """Simulated time (s); None when not simulated."""
    is_default: bool = False

    @property
    def time_s(self) -> float:
        """The simulated time when there is one, else the analytical cost."""
        return self.sim_s if self.sim_s is not None else self.quick_s

    def to_json(self) -> dict:
        return {"program": self.label, "steps": len(self.program), "quick_s": self.quick_s,
                "sim_s": self.sim_s, "default": self.is_default}


@dataclass(slots=True)
class CaseResult:
    """A (placement, reduction) case: all candidates, ranked."""

    placement: Placement
    reduce: tuple[str, ...]
    synth_levels: tuple[str, ...]
    candidates: list[Candidate]
    """All synthesised programs, best first (by simulated time among the simulated ones, then by
    analytical cost)."""
    default: Candidate
    synth_stats: dict = field(default_factory=dict)
    simulated: int = 0

    @property
    def best(self) -> Candidate:
        return self.candidates[0]

    @property
    def speedup(self) -> float:
        """Default all-reduce time / best program time (>= 1)."""
        b = self.best.time_s
        return self.default.time_s / b if b > 0 else 1.0

    def quick_rank_of_best(self) -> int:
        """1-based rank of the best (simulated) program in the analytical order."""
        order = sorted(self.candidates, key=lambda c: c.quick_s)
        return 1 + next(i for i, c in enumerate(order) if c is self.best)

    def to_json(self, top_k: int = 10) -> dict:
        return {
            "placement": self.placement.describe(), "matrix": [list(r) for r in self.placement.matrix],
            "reduce": list(self.reduce), "synthesis_hierarchy": list(self.synth_levels),
            "programs": len(self.candidates), "simulated": self.simulated,
            "default": self.default.to_json(), "best": self.best.to_json(), "speedup": self.speedup,
            "quick_rank_of_best": self.quick_rank_of_best(),
            "top": [c.to_json() for c in self.candidates[:top_k]], "synth_stats": self.synth_stats,
        }


def evaluate_case(placement: Placement, reduce: Sequence[str], size_bytes: int, *, cost: QuickCost,
                  topology=None, simulate_top: int | None = 10, max_len: int = DEFAULT_MAX_LEN,
                  fidelity: str = "flow", engine_factory: Callable | None = None,
                  dtype: str = "bf16") -> CaseResult:
    """Synthesise, cost and (optionally) simulate every program of one case.

    Args:
        placement, reduce, size_bytes: the case (``size_bytes`` per device, before the reduction).
        cost: the analytical model (pre-screen).
        topology: the system to simulate on; ``None`` ranks by the analytical cost only.
        simulate_top: simulate the ``simulate_top`` best programs by analytical cost, plus the default
            all-reduce; ``None`` simulates every program.
        max_len: program-length bound of the synthesiser.
        fidelity: NCCL engine fidelity (``flow`` or ``step``).
        engine_factory: see :func:`simulate`.
    """
    reduce = tuple([reduce] if isinstance(reduce, str) else reduce)
    space = synth_space(placement, reduce)
    res = synthesize_cached(space, max_len)
    dflt = default_program(space)
    cands = []
    for prog in res.programs:
        lowered = lower_steps(placement, reduce, prog, size_bytes, space)
        cands.append(Candidate(prog, program_label(prog, space.names), quick_cost_s(cost, lowered),
                               is_default=prog == dflt))
    default = next(c for c in cands if c.is_default)
    simulated = 0
    if topology is not None:
        by_quick = sorted(cands, key=lambda c: c.quick_s)
        chosen = by_quick if simulate_top is None else by_quick[:simulate_top]
        if default not in chosen:
            chosen = [*chosen, default]
        for c in chosen:
            progs = lower(placement, reduce, c.program, size_bytes, dtype=dtype, space=space)
            c.sim_s = simulate(topology, placement, progs, fidelity=fidelity, engine_factory=engine_factory)
            simulated += 1
    cands.sort(key=lambda c: (c.sim_s is None, c.time_s, c.quick_s, len(c.program)))
    return CaseResult(placement, reduce, space.names, cands, default, res.stats.as_dict(), simulated)
