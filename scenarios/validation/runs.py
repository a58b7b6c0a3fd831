"""Simulating ``trainsim validate``'s rows: one work unit per (row, clock fraction), run longest first in
worker processes, with a progress callback per finished row.

A row's value at the shipped A100 clock is one unit; an in-sample row (the leave-one-source-out refit,
:mod:`scenarios.validation.provenance`) has a second unit at ``provenance.REFIT_PROBE``. The two are
independent simulations, so they run side by side: the largest rows (minutes each) no longer hold one
worker for twice their time while the other idles. Korthikanti Table 4's forward and backward of one
setting are one simulation, so they form one unit. Results do not depend on the number of workers or
on the order units finish in: each unit is a deterministic simulation, combined in the parent.

Validation runs keep no per-link load timelines (``[simulation] record_links = false``, as the strategy
search): no compared figure reads them, and they cost time and memory on the largest rows.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from scenarios.validation import provenance
from scenarios.validation.tables import TABLE4, Row

NO_LINK_TIMELINES = {"record_links": False}
"""``[simulation]`` keys every validation run gets on top of its scenario's."""


@dataclass(frozen=True)
class Unit:
    """One simulation: the rows it gives values for (indices into the predicted list; several only for
    Table 4's forward and backward of one setting) at one sustained clock fraction."""

    rows: tuple[int, ...]
    clock: float


@dataclass
class UnitResult:
    """What a unit sends back: per row its value (the row's unit) and reserved memory (GiB, ``nan``:
    none compared), and the unit's wall and CPU seconds in its process."""

    values: list[float]
    memory_gib: list[float]
    wall_s: float
    cpu_s: float


def _simulate(row: Row) -> float:
    """The model's value of one scenario row (catalog or built), in the row's unit (one simulation);
    sets ``row.predicted_memory_gib`` where the row has a measured peak."""
    from scenarios.runner import run_scenario, scenario_path
    from scenarios.scenario import load_scenario, parse_scenario

    if row.scenario is not None:
        sc = parse_scenario({**row.scenario, "simulation": {**row.scenario.get("simulation", {}), **NO_LINK_TIMELINES}})
    else:
        sc = load_scenario(scenario_path(row.name), [f"simulation.{k}={str(v).lower()}" for k, v in
                                                      NO_LINK_TIMELINES.items()])
    m = run_scenario(sc).metrics
    if row.measured_memory_gib is not None and m["memory"] and "peak_reserved_bytes" in m["memory"]:
        row.predicted_memory_gib = m["memory"]["peak_reserved_bytes"] / 2**30  # torchtitan logs reserved GiB
    if row.unit == "tokens/s":  # per GPU
        return m["tokens_per_s"] / m["system"]["gpus"]
    return m["tflops_per_gpu"] if row.unit == "TFLOP/s" else m["iteration_time_s"]


def layer_times_22b(parallel: dict) -> tuple[float, float]:
    """Forward and backward seconds of one 22B layer (h 6144, 64 heads, s 2048, micro-batch 4), TP 8 on
    one DGX A100, Megatron 2022 kernels (unfused attention, dropout 0.1), as Korthikanti Table 4."""
    from hwmodel.nccl.engine import NcclEngine
    from hwmodel.runtime import DEFAULT_HOST_LAUNCH_OVERHEAD_S
    from scenarios.hierarchical import pass_times
    from scenarios.runner import prepare, run_cost_model
    from scenarios.scenario import parse_scenario
    from workload.parallel.rank_trace import trace_rank

    sc = parse_scenario({
        "name": "korthikanti-table4", "system": {"name": "dgx-a100", "nodes": 1},
        "model": {"name": "gpt-18b", "num_layers": 1, "hidden_size": 6144, "num_attention_heads": 64,
                  "attention_backend": "unfused", "hidden_dropout": 0.1, "attention_dropout": 0.1},
        "parallel": {"tensor_model_parallel_size": 8, **parallel},
        "training": {"global_batch_size": 4, "micro_batch_size": 4}})
    prep = prepare(sc)
    tr = trace_rank(prep.model_cfg, prep.config)
    t = pass_times(tr, prep.config, prep.topology, NcclEngine, DEFAULT_HOST_LAUNCH_OVERHEAD_S, run_cost_model(prep))
    return t[("block", "fwd")], t[("block", "bwd")]


def run_unit(rows_: Sequence[Row], clock: float) -> UnitResult:
    """Simulate ``rows_`` (one row, or Table 4's forward and backward of one setting) at sustained clock
    fraction ``clock``. Runs in a worker process, too (``rows_`` arrive pickled; nothing is written back
    to them there, so every result travels in the returned value)."""
    t0, c0 = time.perf_counter(), time.process_time()
    values, memory = [], []
    layer: tuple[float, float] | None = None
    with provenance.clock_fraction(clock):
        for row in rows_:
            if row.key == "t4":
                layer = layer or layer_times_22b(TABLE4[row.name])
                values.append(1e3 * (layer[0] if row.metric == "layer forward" else layer[1]))
            else:
                values.append(_simulate(row))
            memory.append(row.predicted_memory_gib)
    return UnitResult(values, memory, time.perf_counter() - t0, time.process_time() - c0)


def units(rows_: Sequence[Row], refit: bool) -> list[Unit]:
    """The simulations that give every expressible row of ``rows_`` its value at the shipped clock and,
    with ``refit``, every in-sample row its value at ``provenance.REFIT_PROBE``; largest first (by GPU
    count: the simulated ranks and micro-batches grow with it), each row's shipped clock before its probe."""
    groups: dict[tuple[str, str], list[int]] = {}
    for i, row in enumerate(rows_):
        if row.expressible:
            groups.setdefault((row.key, row.name) if row.key == "t4" else (row.key, str(i)), []).append(i)
    f0 = provenance.shipped_clock()
    out = []
    for idx in groups.values():
        out.append(Unit(tuple(idx), f0))
        if refit and any(rows_[i].in_sample for i in idx):
            out.append(Unit(tuple(idx), provenance.REFIT_PROBE))
    order = {u: n for n, u in enumerate(out)}
    return sorted(out, key=lambda u: (-rows_[u.rows[0]].gpus, order[u]))


def predict(rows_: list[Row], progress: Callable[[Row], None] | None = None, *, refit: bool = False,
            jobs: int = 1) -> list[Row]:
    """Fill ``predicted`` (and ``wall_s``, the seconds of its simulations; ``predicted_memory_gib`` where
    compared) for every expressible row of ``rows_``. With ``refit``, in-sample rows are simulated once
    more at ``provenance.REFIT_PROBE`` and get their clock curve (``Row.curve``) for the
    leave-one-source-out error. ``jobs`` > 1 runs the simulations in that many worker processes;
    results do not depend on it. ``progress(row)`` is called once per row, when its last simulation is
    done (in order of completion).

    Returns:
        ``rows_`` (filled in place).
    """
    todo = units(rows_, refit)
    f0 = provenance.shipped_clock()
    pending = {i: sum(i in u.rows for u in todo) for u in todo for i in u.rows}
    at: dict[tuple[int, float], float] = {}

    def done(unit: Unit, res: UnitResult) -> None:
        for i, value, mem in zip(unit.rows, res.values, res.memory_gib, strict=True):
            row = rows_[i]
            at[(i, unit.clock)] = value
            row.wall_s += res.wall_s / len(unit.rows)
            if unit.clock == f0:
                row.predicted, row.predicted_memory_gib = value, mem
            pending[i] -= 1
            if pending[i]:
                continue
            if (i, provenance.REFIT_PROBE) in at and f0 != provenance.REFIT_PROBE:
                provenance.set_curve(row, f0, at[(i, f0)], provenance.REFIT_PROBE, at[(i, provenance.REFIT_PROBE)])
            if progress is not None:
                progress(row)

    for i in pending:
        rows_[i].wall_s = 0.0
    if jobs <= 1 or len(todo) <= 1:
        for u in todo:
            done(u, run_unit([rows_[i] for i in u.rows], u.clock))
        return rows_
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    # spawn, not fork: the parent may have torch (and its thread pools) loaded
    with ProcessPoolExecutor(max_workers=min(jobs, len(todo)), mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {pool.submit(run_unit, [rows_[i] for i in u.rows], u.clock): u for u in todo}
        for fut in as_completed(futures):
            done(futures[fut], fut.result())
    return rows_
