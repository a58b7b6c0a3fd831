"""P² synthesis reports: :func:`run_synth` (one system, axes and reduction: the ``trainsim synth``
command), :func:`plot_spread`, and :func:`p2_findings` (P²'s three findings as trainsim sees them).
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from scenarios.p2.cost import QuickCost
from scenarios.p2.hierarchy import Hierarchy
from scenarios.p2.placement import enumerate_placements, normalise_axes
from scenarios.p2.rank import CaseResult, evaluate_case
from scenarios.p2.synth import DEFAULT_MAX_LEN

P2_PAPER = {"spread_x": 448.0, "beats_default_share": 0.69, "max_speedup_x": 2.04, "mean_speedup_x": 1.27,
            "top10_accuracy": 0.90}
"""P²'s headline numbers (Xie et al., MLSys'22 abstract; papers.md §2.4): all-reduce spread across
placements up to 448x; a synthesised program beats the default all-reduce in 69 % of cases, by up to
2.04x and 1.27x on average; the simulator's top-10 holds the best program in > 90 % of cases."""

DEFAULT_BEAT_MARGIN = 0.01
"""A program *beats* the default all-reduce when it is at least this much faster (relative): 1 %, so
that ties within the simulator's numerical noise do not count."""


def _fmt_time(s: float | None) -> str:
    if s is None:
        return "-"
    if s >= 1:
        return f"{s:.3f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.3f} ms"
    return f"{s * 1e6:.1f} us"


def _fmt_bytes(n: float) -> str:
    for unit, f in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= f:
            return f"{n / f:g} {unit}"
    return f"{n:g} B"


_SHORT = {"AllReduce": "AR", "ReduceScatter": "RS", "AllGather": "AG", "Reduce": "R", "Broadcast": "B"}


def _family(program) -> str:
    """A program's op sequence, e.g. ``RS;AR;AG``."""
    return ";".join(_SHORT[st.op] for st in program)


def _spread(times: Sequence[float]) -> float:
    pos = [t for t in times if t > 0]
    return max(pos) / min(pos) if pos else 1.0


@dataclass(slots=True)
class SynthReport:
    """Every placement of ``axes`` on the system, and the ranked reduction programs of each."""

    system: str
    nodes: int
    hierarchy: Hierarchy
    axes: tuple[tuple[str, int], ...]
    reduce: tuple[str, ...]
    size_bytes: int
    cases: list[CaseResult]
    """One per placement, in enumeration order."""
    simulated: bool
    fidelity: str
    top_k: int = 10
    max_len: int = DEFAULT_MAX_LEN
    beat_margin: float = DEFAULT_BEAT_MARGIN

    @property
    def allreduce_spread(self) -> float:
        """Max / min default all-reduce time across placements."""
        return _spread([c.default.time_s for c in self.cases])

    @property
    def best_spread(self) -> float:
        """Max / min best-program time across placements (synthesis narrows the spread)."""
        return _spread([c.best.time_s for c in self.cases])

    def beats(self, case: CaseResult) -> bool:
        """Whether a synthesised program beats the default all-reduce by ``beat_margin``."""
        return not case.best.is_default and case.best.time_s < case.default.time_s * (1 - self.beat_margin)

    def to_text(self) -> str:
        """The printed table: placements, then the best programs of each against the all-reduce."""
        axes = " x ".join(f"{n}={s}" for n, s in self.axes)
        how = f"simulated ({self.fidelity})" if self.simulated else "analytical (alpha-beta)"
        lines = [
            f"P2 synthesis: {self.system}, {self.nodes} node(s), hierarchy {self.hierarchy}",
            f"axes {axes}; reduce over {list(self.reduce)}; {_fmt_bytes(self.size_bytes)} per device; "
            f"programs up to {self.max_len} steps; times {how}",
            f"{len(self.cases)} placements; all-reduce spread across placements {self.allreduce_spread:.2f}x, "
            f"best-program spread {self.best_spread:.2f}x",
            "",
            f"{'#':>3}  {'placement':<34} {'matrix':<16} {'progs':>5} {'all-reduce':>11} {'best':>11} "
            f"{'speedup':>8}  best program",
        ]
        for i, c in enumerate(self.cases, 1):
            lines.append(f"{i:>3}  {c.placement.describe():<34} {c.placement.matrix_str():<16} "
                         f"{len(c.candidates):>5} {_fmt_time(c.default.time_s):>11} "
                         f"{_fmt_time(c.best.time_s):>11} {c.speedup:>7.2f}x  {c.best.label}")
        n_beat = sum(self.beats(c) for c in self.cases)
        lines.append(f"A synthesised program beats the all-reduce (by >= {self.beat_margin:.0%}) in "
                     f"{n_beat} of {len(self.cases)} placements.")
        for i, c in enumerate(self.cases, 1):
            lines += ["", f"Placement {i}: {c.placement.describe()}  (synthesis hierarchy "
                      f"{' > '.join(c.synth_levels)}; {len(c.candidates)} programs, {c.simulated} simulated)",
                      f"  {'rank':>4} {'time':>11} {'quick':>11} {'vs AR':>7}  program"]
            shown = c.candidates[:self.top_k]
            if c.default not in shown:
                shown = [*shown, c.default]
            for c2 in shown:
                rank = c.candidates.index(c2) + 1
                rel = c.default.time_s / c2.time_s if c2.time_s > 0 else 1.0
                mark = "  (default)" if c2.is_default else ""
                lines.append(f"  {rank:>4} {_fmt_time(c2.sim_s):>11} {_fmt_time(c2.quick_s):>11} "
                             f"{rel:>6.2f}x  {c2.label}{mark}")
        return "\n".join(lines)

    def to_json(self) -> dict:
        """A JSON-serialisable dict of the whole report."""
        return {
            "system": self.system, "nodes": self.nodes, "hierarchy": [list(lv) for lv in self.hierarchy.levels],
            "axes": dict(self.axes), "reduce": list(self.reduce), "size_bytes": self.size_bytes,
            "simulated": self.simulated, "fidelity": self.fidelity, "max_len": self.max_len,
            "allreduce_spread": self.allreduce_spread, "best_spread": self.best_spread,
            "beats_default": [self.beats(c) for c in self.cases],
            "cases": [c.to_json(self.top_k) for c in self.cases],
        }


def run_synth(system: str, nodes: int, axes: dict[str, int], reduce: list[str], size_bytes: int, *,
              top_k: int = 10, simulate: bool = True, fidelity: str = "flow",
              max_len: int = DEFAULT_MAX_LEN, simulate_top: int | None = None, simulate_all: bool = False,
              nodes_per_unit: int | None = None, engine_factory: Callable | None = None,
              topology=None) -> SynthReport:
    """Enumerate the placements of ``axes`` on ``nodes`` nodes of ``system``, synthesise the reduction
    programs over ``reduce`` for each, rank them and report.

    Args:
        system: a :func:`hwmodel.topology.build_system` name (e.g. ``dgx-a100``).
        nodes: number of nodes.
        axes: axis name -> size, in row order; the sizes must multiply to the GPU count.
        reduce: axes to reduce over (e.g. ``["dp"]``).
        size_bytes: per-device buffer to reduce, bytes.
        top_k: programs listed per placement.
        simulate: simulate candidates on the hardware model (else rank by the analytical cost only).
        fidelity: NCCL engine fidelity, ``flow`` or ``step``.
        max_len: program-length bound.
        simulate_top: simulate only the best ``simulate_top`` programs by analytical cost, plus the
            default all-reduce (default: ``top_k``).
        simulate_all: simulate every program (overrides ``simulate_top``).
        nodes_per_unit: add an outer scalable-unit level of this many nodes to the hierarchy.
        engine_factory: collective-engine factory for the simulation (tests).
        topology: a prebuilt topology (skips ``build_system``).

    Raises:
        ValueError: axis sizes that do not multiply to the GPU count, an unknown reduced axis, a bad
            size or ``top_k``.
    """
    if size_bytes < 1:
        raise ValueError(f"size_bytes must be >= 1, got {size_bytes}")
    if top_k < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k}")
    if topology is None:
        from hwmodel.topology import build_system
        topology = build_system(system, nodes)
    hier = Hierarchy.from_topology(topology, nodes_per_unit=nodes_per_unit)
    items = normalise_axes(axes, hier.num_devices)
    reduce = [reduce] if isinstance(reduce, str) else list(reduce)
    placements = enumerate_placements(hier, items)
    placements[0].check_reduce(reduce)
    cost = QuickCost.from_topology(topology, hier.gpu_names)
    n_sim = None if simulate_all else (top_k if simulate_top is None else simulate_top)
    cases = [evaluate_case(p, reduce, size_bytes, cost=cost, topology=topology if simulate else None,
                           simulate_top=n_sim, max_len=max_len, fidelity=fidelity,
                           engine_factory=engine_factory) for p in placements]
    return SynthReport(system, nodes, hier, items, tuple(reduce), int(size_bytes), cases, simulate, fidelity,
                       top_k, max_len)


def plot_spread(report: SynthReport, path: str | Path) -> Path:
    """Bar chart of the default all-reduce time and the best program's time per placement (log scale
    when they span more than 10x, else linear from zero), saved as a PNG with the Agg backend (no
    pyplot global state). Returns the path."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    path = Path(path)
    n = len(report.cases)
    fig = Figure(figsize=(max(6.0, 0.9 * n + 2), 4.5))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    xs = list(range(n))
    ar = [c.default.time_s * 1e3 for c in report.cases]
    best = [c.best.time_s * 1e3 for c in report.cases]
    w = 0.4
    ax.bar([x - w / 2 for x in xs], ar, w, label="default all-reduce", color="#888888")
    ax.bar([x + w / 2 for x in xs], best, w, label="best synthesised program", color="#1f77b4")
    if max(ar + best) > 10 * min(ar + best):  # wide spreads (P² reports up to 448x) need a log axis
        ax.set_yscale("log")
    else:
        ax.set_ylim(0, max(ar + best) * 1.1)
    ax.set_xticks(xs)
    ax.set_xticklabels([c.placement.matrix_str() for c in report.cases], rotation=30, ha="right", fontsize=8)
    ax.set_xlabel("placement (parallelism matrix, rows = " + ", ".join(n for n, _ in report.axes) + ")")
    ax.set_ylabel("time (ms)")
    ax.set_title(f"{report.system} x{report.nodes}: reduce {list(report.reduce)}, "
                 f"{_fmt_bytes(report.size_bytes)}; all-reduce spread {report.allreduce_spread:.1f}x",
                 fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", dpi=120)
    return path


# ------------------------------------------------------------------------------------------------
# P²'s findings


def default_axes_sets(num_devices: int, gpus_per_node: int = 8) -> list[tuple[dict[str, int], list[list[str]]]]:
    """The sweep's ``(axes, [reduced axes, ...])`` for ``num_devices`` GPUs: data x tensor parallel
    with tp = a node (reduce dp, reduce tp) and dp x pp x tp with pp = tp = 2 (reduce dp, dp+pp)."""
    out: list[tuple[dict[str, int], list[list[str]]]] = []
    if num_devices % gpus_per_node == 0 and num_devices > gpus_per_node:
        out.append(({"dp": num_devices // gpus_per_node, "tp": gpus_per_node}, [["dp"], ["tp"]]))
    if num_devices % 4 == 0 and num_devices >= 8:
        out.append(({"dp": num_devices // 4, "pp": 2, "tp": 2}, [["dp"], ["dp", "pp"]]))
    return out


@dataclass(slots=True)
class FindingRow:
    """One (nodes, axes, reduction) sweep point: all its placements."""

    nodes: int
    axes: dict[str, int]
    reduce: tuple[str, ...]
    cases: list[CaseResult]

    @property
    def spread(self) -> float:
        return _spread([c.default.time_s for c in self.cases])


@dataclass(slots=True)
class FindingsReport:
    """P²'s findings measured on trainsim, beside the paper's numbers."""

    system: str
    size_bytes: int
    rows: list[FindingRow]
    fidelity: str
    simulated: bool
    beat_margin: float = DEFAULT_BEAT_MARGIN
    top: int = 10
    paper: dict = field(default_factory=lambda: dict(P2_PAPER))

    def _cases(self) -> list[CaseResult]:
        return [c for r in self.rows for c in r.cases]

    def summary(self) -> dict:
        """The headline numbers (see :data:`P2_PAPER` for the paper's)."""
        cases = self._cases()
        beat = [c for c in cases
                if not c.best.is_default and c.best.time_s < c.default.time_s * (1 - self.beat_margin)]
        spd = [c.speedup for c in beat]
        topk = [c.quick_rank_of_best() <= self.top for c in cases]
        big = [c.quick_rank_of_best() <= self.top for c in cases if len(c.candidates) > self.top]
        return {
            "cases": len(cases),
            "spread_x": max((r.spread for r in self.rows), default=1.0),
            "beats_default_share": len(beat) / len(cases) if cases else 0.0,
            "max_speedup_x": max(spd, default=1.0),
            "mean_speedup_x": statistics.fmean(spd) if spd else 1.0,
            "mean_speedup_all_x": statistics.fmean(c.speedup for c in cases) if cases else 1.0,
            "top10_accuracy": sum(topk) / len(topk) if topk else 0.0,
            "top10_accuracy_nontrivial": sum(big) / len(big) if big else 1.0,
            "nontrivial_cases": len(big),
            "top1_accuracy": sum(c.quick_rank_of_best() == 1 for c in cases) / len(cases) if cases else 0.0,
            "winners": dict(Counter(_family(c.best.program) for c in beat).most_common()),
        }

    def to_text(self) -> str:
        s = self.summary()
        how = f"simulated, {self.fidelity} fidelity" if self.simulated else "analytical cost only"
        lines = [f"P2 findings on {self.system}, {_fmt_bytes(self.size_bytes)} per device ({how}); "
                 f"{s['cases']} (placement, reduction) cases", "",
                 f"{'nodes':>5}  {'axes':<22} {'reduce':<10} {'placements':>10} {'AR spread':>10} "
                 f"{'beats':>6} {'max spd':>8}"]
        for r in self.rows:
            axes = " x ".join(f"{k}={v}" for k, v in r.axes.items())
            nb = sum(not c.best.is_default and c.best.time_s < c.default.time_s * (1 - self.beat_margin)
                     for c in r.cases)
            lines.append(f"{r.nodes:>5}  {axes:<22} {'+'.join(r.reduce):<10} {len(r.cases):>10} "
                         f"{r.spread:>9.2f}x {nb:>3}/{len(r.cases):<2} "
                         f"{max(c.speedup for c in r.cases):>7.2f}x")
        p = self.paper
        lines += ["", f"{'finding':<58} {'trainsim':>10} {'P2 paper':>10}",
                  f"{'max/min all-reduce time across placements':<58} {s['spread_x']:>9.2f}x "
                  f"{p['spread_x']:>9.0f}x",
                  f"{'share of cases a synthesised program beats all-reduce':<58} "
                  f"{s['beats_default_share']:>10.0%} {p['beats_default_share']:>10.0%}",
                  f"{'max speedup over all-reduce':<58} {s['max_speedup_x']:>9.2f}x {p['max_speedup_x']:>9.2f}x",
                  f"{'mean speedup over all-reduce (cases where it beats)':<58} {s['mean_speedup_x']:>9.2f}x "
                  f"{p['mean_speedup_x']:>9.2f}x",
                  f"{'quick cost top-10 holds the simulated best':<58} {s['top10_accuracy']:>10.0%} "
                  f"{'>' + format(p['top10_accuracy'], '.0%'):>10}",
                  f"{'  ... in cases with more than 10 programs (' + str(s['nontrivial_cases']) + ')':<58} "
                  f"{s['top10_accuracy_nontrivial']:>10.0%} {'-':>10}",
                  f"{'quick cost top-1 is the simulated best':<58} {s['top1_accuracy']:>10.0%} {'-':>10}",
                  "", "winning programs by op sequence: "
                  + (", ".join(f"{k} x{v}" for k, v in s["winners"].items()) or "none")]
        return "\n".join(lines)

    def to_json(self) -> dict:
        return {"system": self.system, "size_bytes": self.size_bytes, "fidelity": self.fidelity,
                "simulated": self.simulated, "summary": self.summary(), "paper": self.paper,
                "rows": [{"nodes": r.nodes, "axes": r.axes, "reduce": list(r.reduce), "spread_x": r.spread,
                          "cases": [c.to_json(self.top) for c in r.cases]} for r in self.rows]}


def p2_findings(nodes_list: Sequence[int] = (4, 8, 16), size_bytes: int = 64 * 2**20,
                axes_sets: Sequence[tuple[Mapping[str, int], Sequence[Sequence[str]]]]
                | Callable[[int], Sequence] | None = None, *, system: str = "dgx-a100",
                simulate: bool = True, fidelity: str = "flow", max_len: int = DEFAULT_MAX_LEN,
                simulate_top: int | None = None, top: int = 10, engine_factory: Callable | None = None,
                progress: Callable[[str], None] | None = None) -> FindingsReport:
    """P²'s findings on ``system`` for each node count: the all-reduce spread across placements, the
    share of cases a synthesised program beats the default all-reduce, the max and mean speedup, and
    the analytical cost's top-``top`` accuracy against the simulator.

    Args:
        nodes_list: node counts to sweep.
        size_bytes: per-device buffer reduced.
        axes_sets: ``[(axes, [reduce, ...]), ...]`` or a function of the device count returning that
            (default :func:`default_axes_sets`).
        simulate_top: simulate only the best ``simulate_top`` programs by analytical cost (plus the
            default); ``None`` (default) simulates every program, which the accuracy figure needs.
        progress: called with a line per sweep point.
    """
    from hwmodel.topology import build_system

    rows = []
    for nodes in nodes_list:
        topo = build_system(system, nodes)
        hier = Hierarchy.from_topology(topo)
        cost = QuickCost.from_topology(topo, hier.gpu_names)
        sets = axes_sets(hier.num_devices) if callable(axes_sets) else axes_sets
        if sets is None:
            sets = default_axes_sets(hier.num_devices, topo.gpus_per_node)
        for axes, reduces in sets:
            placements = enumerate_placements(hier, dict(axes))
            for red in reduces:
                red = tuple([red] if isinstance(red, str) else red)
                cases = []
                for p in placements:
                    if not p.synthesis_levels(red):
                        continue
                    cases.append(evaluate_case(p, red, size_bytes, cost=cost,
                                               topology=topo if simulate else None,
                                               simulate_top=simulate_top, max_len=max_len,
                                               fidelity=fidelity, engine_factory=engine_factory))
                rows.append(FindingRow(nodes, dict(axes), red, cases))
                if progress is not None:
                    progress(f"{nodes} nodes, axes {dict(axes)}, reduce {list(red)}: {len(cases)} placements, "
                             f"spread {rows[-1].spread:.2f}x")
    return FindingsReport(system, int(size_bytes), rows, fidelity, simulate, top=top)
