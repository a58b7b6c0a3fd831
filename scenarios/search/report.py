"""A search's output: the ranked table, the rejections, the speed-ups, the Pareto plot, the winner as a
scenario file, and the ``--json`` document."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from scenarios.search.driver import VARIANTS_PER_SHAPE, SearchResult, kendall_tau, plan_shape
from scenarios.search.simulate import candidate_data

MAX_REJECTION_LINES = 12


def _ms(s: float | None) -> str:
    """Seconds as milliseconds to 3 significant figures (whole ms from 100 ms): plans 0.5 ms apart at
    24 ms read apart (24.2, 24.7), as whole milliseconds did not."""
    if s is None or (isinstance(s, float) and math.isnan(s)):
        return "-"
    ms = s * 1e3
    return f"{ms:,.0f}" if abs(ms) >= 99.95 else f"{ms:.3g}" if abs(ms) < 1 else f"{ms:.{2 - (abs(ms) >= 9.995)}f}"


def _pct(x: float | None) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.0f}%"


def _hbm_note(res: SearchResult) -> str:
    """What the memory verdict compares (``run``'s: :func:`scenarios.runner.memory_of`)."""
    return " usable HBM (reserved + CUDA context + NCCL buffers, as run checks)"


def _batch(res: SearchResult) -> int:
    """The scenario's global batch (samples), as the screen reads it: torchtitan's batch flags need it."""
    return int(res.scenario.training.get("global_batch_size", res.world_size))


def _flags(res: SearchResult, c) -> str:
    """``c``'s flags with the scenario's batch and layer count (torchtitan's batch and stage-split flags)."""
    return c.flags(_batch(res), res.num_layers or None)


def _mark(res: SearchResult, c) -> str:
    tags = []
    if c == res.baseline:
        tags.append("baseline")
    if c == res.given:
        tags.append("scenario's plan")
    if c in res.outside:
        tags.append("outside --fix/--space: for comparison only")
    return f" [{', '.join(tags)}]" if tags else ""


def format_table(res: SearchResult) -> str:
    """The simulated plans, fastest first, one line each."""
    head = (f"{'#':>3} {'iter ms':>9} {'screen ms':>9} {'tok/s/GPU':>10} {'MFU':>5} {'mem GB':>7} {'free GB':>7} "
            f"{'bubble':>6} {'comm':>5}  plan (Megatron-LM flags; torchtitan's where it says so)")
    lines = [head]
    for i, (c, r) in enumerate(res.ranked, 1):
        e = res.estimate_of(c)
        T, b = r["iteration_time_s"], r["breakdown"]
        tok = (r.get("tokens_per_s") or 0.0) / res.world_size
        mem = e.memory_bytes if e else float("nan")
        lines.append(f"{i:>3} {_ms(T):>9} {_ms(e.iteration_time_s if e else None):>9} {tok:>10,.0f} "
                     f"{_pct(r['mfu']):>5} {mem / 1e9:>7.1f} {(res.hbm_bytes - mem) / 1e9:>7.1f} "
                     f"{_pct(b['bubble_s'] / T if T else None):>6} {_pct(b['exposed_comm_s'] / T if T else None):>5}  "
                     f"{_flags(res, c)}{_mark(res, c)}")
    failed = [(c, r) for c, r in res.simulated.items() if r.get("error") or r.get("oom")]
    for c, r in failed:
        lines.append(f"  - {_flags(res, c)}: {r.get('error') or 'OOM in the simulation'}")
    return "\n".join(lines)


def format_rejections(res: SearchResult) -> str:
    """One line per rejected family: invalid plans by reason, then plans that do not fit by the memory
    term that breaks them (with the closest)."""
    lines = []
    for r in res.rejections[:MAX_REJECTION_LINES]:
        lines.append(f"  {r.count:>6} plans: {r.reason}")
    if len(res.rejections) > MAX_REJECTION_LINES:
        rest = res.rejections[MAX_REJECTION_LINES:]
        lines.append(f"  {sum(r.count for r in rest):>6} plans: {len(rest)} more reasons (see --json)")
    by_term: dict[str, list] = {}
    for e in res.estimates:
        if not e.fits:
            found = re.search(r"largest term (.+?) [\d.]+ GB", e.oom_reason)
            term = found.group(1) if found else "?"
            by_term.setdefault(term, []).append(e)
    for term, es in sorted(by_term.items(), key=lambda kv: -len(kv[1])):
        close = min(es, key=lambda e: e.memory_bytes)
        lines.append(f"  {len(es):>6} plans: OOM, largest term {term}; closest {close.candidate.short()}: "
                     f"{close.oom_reason}")
    return "\n".join(lines) if lines else "  none"


def speedups(res: SearchResult) -> dict[str, Any]:
    """The best simulated plan against the worst simulated, the worst screened, and the baseline."""
    best = res.best
    if best is None:
        return {}
    T = best[1]["iteration_time_s"]
    ranked = res.ranked
    out: dict[str, Any] = {"best_iteration_time_s": T,
                           "worst_simulated_iteration_time_s": ranked[-1][1]["iteration_time_s"]}
    out["speedup_over_worst_simulated"] = out["worst_simulated_iteration_time_s"] / T
    fitting = [e for e in res.estimates if e.fits]
    if fitting:
        worst = max(fitting, key=lambda e: e.iteration_time_s)
        out["worst_screened_plan"] = _flags(res, worst.candidate)
        out["speedup_over_worst_screened"] = worst.iteration_time_s / (res.estimate_of(best[0]).iteration_time_s)
    b = res.simulated.get(res.baseline) if res.baseline is not None else None
    if b and not b.get("error"):
        out["baseline"] = res.baseline_kind
        out["baseline_iteration_time_s"] = b["iteration_time_s"]
        out["speedup_over_baseline"] = b["iteration_time_s"] / T
    g = res.simulated.get(res.given) if res.given is not None else None
    if g and not g.get("error"):
        out["scenario_plan_iteration_time_s"] = g["iteration_time_s"]
        out["speedup_over_scenario_plan"] = g["iteration_time_s"] / T
    return out


def agreement(res: SearchResult) -> dict[str, Any]:
    """Screen vs simulation over the simulated plans: Kendall tau, and whether the simulated best is
    among the screen's top 10."""
    pairs = [(res.estimate_of(c).iteration_time_s, r["iteration_time_s"]) for c, r in res.ranked]
    if not pairs:
        return {}
    fitting = [e.candidate for e in res.estimates if e.fits]  # the screen's order (its refined head first)
    ahead = fitting[:fitting.index(res.best[0])] if res.best[0] in fitting else fitting
    shapes_ahead = {plan_shape(c) for c in ahead} - {plan_shape(res.best[0])}
    return {"kendall_tau": kendall_tau([p[0] for p in pairs], [p[1] for p in pairs]), "simulated_plans": len(pairs),
            "best_screen_rank": 1 + len(ahead), "best_in_screen_top10": len(ahead) < 10,
            "best_shape_screen_rank": 1 + len(shapes_ahead)}


def format_picks(res: SearchResult) -> str:
    """One line: how the top K were picked (:func:`scenarios.search.driver.simulate_top_k`)."""
    k = res.info.get("picked", len(res.picks))
    if res.info.get("top_k_rule") == "screen":
        return f"top {k}: the screen's {k} fastest plans" + _over_budget(res)
    shapes = res.info.get("shapes_picked", 0)
    variants = [c for c, why in res.picks.items() if why == "variant"]
    plural = "" if len(variants) == 1 else "s"
    line = (f"top {k}: the screen's fastest plan of each of its {shapes} fastest shapes (TP, CP, EP, PP, VPP, DP, "
            f"micro-batch, recomputation), then {len(variants)} variant{plural} (ZeRO, overlaps, TP comm overlap, rank "
            f"order...) of the shapes that simulated fastest, up to {VARIANTS_PER_SHAPE} each, in the screen's order")
    per: dict[tuple, list] = {}
    for c in variants:
        per.setdefault(plan_shape(c), []).append(c)
    if per:
        line += ": " + ", ".join(f"{len(cs)} of {_shape_label(cs[0])}" for cs in per.values())
    return line + _over_budget(res)


def _over_budget(res: SearchResult) -> str:
    over = [c for c in res.picks if res.simulated.get(c, {}).get("over_budget")]
    if not over:
        return ""
    return (f"; {len(over)} not simulated, above --max-tasks {res.info.get('max_tasks') or 0:,.0f} estimated tasks "
            f"(the screen's fastest of them: {over[0].short()}; raise --max-tasks to simulate them)")


def _shape_label(c) -> str:
    label = f"TP{c.tp}" + (f" CP{c.cp}" if c.cp > 1 else "") + (f" EP{c.ep}" if c.ep > 1 else "")
    label += f" PP{c.pp}" + (f"x{c.vpp}" if c.vpp > 1 else "") + f" DP{c.dp} mbs{c.mbs} {c.recompute}"
    return label + (f"-{c.recompute_method}{c.recompute_num_layers}" if c.recompute_method else "")


def _refine_line(res: SearchResult) -> str:
    n = res.info.get("refined", 0)
    return (f"re-priced by the simulator: the screen's {n:,} fastest plans ({res.info.get('refine_runs', 0)} short "
            f"simulations: step-1 passes, data-parallel probes or sampled layers) in "
            f"{res.info.get('refine_cpu_s', 0.0):.1f} s CPU, "
            f"{res.info.get('refine_wall_s', 0.0):.1f} s wall")


def format_search(res: SearchResult) -> str:
    """The whole text report."""
    sc = res.scenario
    n_fit = res.info["fitting"]
    lines = [f"trainsim search {sc.name}: {res.info['candidates']:,} valid plans on {res.world_size} GPUs, "
             f"{n_fit:,} fit in {res.hbm_bytes / 1e9:.1f} GB{_hbm_note(res)}; "
             f"{sum(r.count for r in res.rejections):,} invalid",
             f"screen: {res.screen_rate_per_s:,.0f} plans/s after {res.traces} shard traces "
             f"({res.trace_wall_s:.1f} s); simulated {len(res.simulated)} plans in {res.simulate_wall_s:.1f} s",
             _refine_line(res), ""]
    lines.append(format_table(res))
    lines.append(format_picks(res))
    if any(c.async_tp for c in res.simulated) and not sc.training.get("compile", False):
        lines.append("note: async TP plans set [training] compile = true (torchtitan runs async TP only compiled)")
    sp = speedups(res)
    if sp:
        lines.append("")
        best = res.best[0]
        lines.append(f"best: {_flags(res, best)}")
        lines.append(f"  {sp['speedup_over_worst_simulated']:.2f}x over the slowest simulated plan, "
                     f"{sp.get('speedup_over_worst_screened', float('nan')):.2f}x over the slowest plan that fits "
                     f"(screen estimate)")
        if "speedup_over_baseline" in sp:
            lines.append(f"  {sp['speedup_over_baseline']:.2f}x over the baseline, {sp['baseline']} "
                         f"({_ms(sp['baseline_iteration_time_s'])} ms)")
        if "speedup_over_scenario_plan" in sp:
            lines.append(f"  {sp['speedup_over_scenario_plan']:.2f}x over the scenario's own plan "
                         f"({_ms(sp['scenario_plan_iteration_time_s'])} ms)")
    ag = agreement(res)
    if ag:
        lines.append(f"screen vs simulation: Kendall tau {ag['kendall_tau']:.2f} over {ag['simulated_plans']} plans; "
                     f"the simulated best is #{ag['best_screen_rank']} by the screen"
                     + (f" (its shape #{ag['best_shape_screen_rank']} of the screen's shapes)"
                        if ag["best_shape_screen_rank"] != ag["best_screen_rank"] else ""))
    lines += ["", "rejected:", format_rejections(res)]
    return "\n".join(lines)


def search_json(res: SearchResult) -> dict[str, Any]:
    """The ``--json`` document: every plan's estimate (and simulation, where run), rejections, summary."""
    plans, batch = [], _batch(res)
    for e in res.estimates:
        d = e.to_dict(batch, res.num_layers or None)
        r = res.simulated.get(e.candidate)
        if r is not None:
            d["simulated"] = r
        why = res.picks.get(e.candidate)
        if why is not None:
            d["picked_as"] = why
        plans.append(d)
    return {"scenario": res.scenario.name, "gpus": res.world_size,
            "screen_rate_per_s": res.screen_rate_per_s, "screen_wall_s": res.screen_wall_s, "traces": res.traces,
            "trace_wall_s": res.trace_wall_s, "simulate_wall_s": res.simulate_wall_s, **res.info,
            "best": res.best[0].to_dict() if res.best else None, "speedups": speedups(res), "agreement": agreement(res),
            "rejections": [{"reason": r.reason, "count": r.count, "example": r.example.to_dict()}
                           for r in res.rejections],
            "plans": plans}


def pareto_front(points: list[tuple[float, float]]) -> list[int]:
    """Indices of the points (time, memory) no other point beats in both, by time."""
    order = sorted(range(len(points)), key=lambda i: points[i])
    front, best_mem = [], math.inf
    for i in order:
        if points[i][1] < best_mem:
            front.append(i)
            best_mem = points[i][1]
    return front


def plot_pareto(res: SearchResult, path: str | Path) -> Path:
    """PNG: every fitting plan's screen time against its memory, the Pareto front, the simulated plans."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fit = [e for e in res.estimates if e.fits]
    pts = [(e.iteration_time_s, e.memory_bytes / 1e9) for e in fit]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.scatter([p[0] for p in pts], [p[1] for p in pts], s=6, c="0.7", label="screened (estimate)")
    front = [pts[i] for i in pareto_front(pts)]
    ax.plot([p[0] for p in front], [p[1] for p in front], "-o", ms=3, c="tab:blue", label="Pareto front (screen)")
    sim = [(r["iteration_time_s"], res.estimate_of(c).memory_bytes / 1e9) for c, r in res.ranked]
    ax.scatter([p[0] for p in sim], [p[1] for p in sim], s=24, c="tab:red", marker="x", label="simulated")
    ax.axhline(res.hbm_bytes / 1e9, ls="--", c="k", lw=0.8,
               label=f"usable HBM {res.hbm_bytes / 1e9:.1f} GB (run's limit)")
    ax.set_xlabel("iteration time (s)")
    ax.set_ylabel("memory per GPU (GB)")
    ax.set_title(f"{res.scenario.name}: plans, time vs memory")
    ax.legend(fontsize=8)
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, Mapping):
        return "{ " + ", ".join(f"{k} = {_toml_value(x)}" for k, x in v.items()) + " }"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'


def to_toml(data: Mapping[str, Any]) -> str:
    """A scenario dict as TOML (scalars, inline tables and arrays: all a scenario holds)."""
    lines = [f"{k} = {_toml_value(data[k])}" for k in ("name", "description") if data.get(k)]
    for sec in ("system", "model", "parallel", "training", "simulation"):
        table = data.get(sec) or {}
        if not table and sec == "simulation":
            continue
        lines += ["", f"[{sec}]"] + [f"{k} = {_toml_value(v)}" for k, v in table.items()]
    return "\n".join(lines) + "\n"


def emit_scenario(res: SearchResult, path: str | Path) -> Path:
    """Write the best simulated plan as a runnable scenario file.

    Raises:
        ValueError: nothing was simulated successfully.
    """
    if res.best is None:
        raise ValueError("--emit-scenario: no simulated plan to write")
    data = candidate_data(res.scenario, res.best[0])
    src = Path(res.scenario.source) if res.scenario.source else None
    if src is not None and src.is_file() and not src.parent.samefile(Path(path).resolve().parent):
        for sec, key in (("system", "gpu_file"), ("simulation", "nccl_tuner_config"), ("model", "hf_config")):
            v = data.get(sec, {}).get(key)
            if isinstance(v, str) and not Path(v).is_absolute() and (src.parent / v).exists():
                data[sec][key] = str((src.parent / v).resolve())  # relative paths: from the new file's folder
    out = Path(path)
    out.write_text(to_toml(data), encoding="utf-8")
    return out
