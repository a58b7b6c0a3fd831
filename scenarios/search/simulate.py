"""Tier 2 of the search: co-simulate chosen plans (``scenarios.runner.run_scenario``) through any
``concurrent.futures.Executor``, with a resumable cache.

The executor is a local :class:`~concurrent.futures.ProcessPoolExecutor` by default, or a
``dask.distributed`` cluster's (``dask://host:port``; dask is the optional extra ``trainsim[dask]``,
imported only then). Start a local scheduler and two workers with::

    dask scheduler --port 8786 & dask worker tcp://127.0.0.1:8786 --nworkers 2 --nthreads 1 &

(each worker must import this package: run them from the repository root or install trainsim).

Each result is appended to a JSONL file as soon as it arrives, keyed by :func:`scenario_key` -- the
SHA-256 of the candidate scenario's canonical JSON (sorted keys; the sections that define the run, not
its name) -- so an interrupted search re-simulates only what is missing. Each record carries the
:data:`CACHE_SCHEMA` its result was written in; a record of another schema (an older trainsim's names,
``peak_memory_bytes``, flat ``bubble_s``) is not read back, and its plan is simulated again.
"""

from __future__ import annotations

import copy
import hashlib
import json
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Executor, ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from tqdm import tqdm

from scenarios.scenario import Scenario, parse_scenario
from scenarios.search.space import Candidate

RUN_SECTIONS = ("system", "model", "parallel", "training", "simulation")
CACHE_SCHEMA = 2
"""The layout of a cache record's ``result`` (the record's ``schema``): 2, ``run --json``'s names and nesting
(:func:`scenarios.metrics.run_summary`). Records without it (1: flat keys, and ``peak_memory_bytes`` in
older releases) or with another are stale: :func:`load_cache` skips them, :func:`stale_records` counts them."""


def candidate_data(base: Scenario, c: Candidate) -> dict[str, Any]:
    """The scenario dict (as TOML would give it) of plan ``c`` on ``base``'s model, system and training."""
    data = copy.deepcopy(base.to_dict())
    data["name"] = f"{base.name}-{c.short().replace(' ', '-').lower()}"
    batch = int(base.training.get("global_batch_size", 0)) or None
    layers = base.model.get("num_layers") if isinstance(base.model.get("num_layers"), int) else None
    data["description"] = f"{base.name} with {c.flags(batch, layers)} (found by trainsim search)"
    data["parallel"] = c.parallel_section(base.parallel)
    data["training"] = c.training_section(data.get("training", {}))
    return data


def scenario_key(data: Mapping[str, Any]) -> str:
    """SHA-256 of the canonical JSON of the sections that define a run (not its name or description)."""
    doc = {k: data.get(k, {}) for k in RUN_SECTIONS}
    return hashlib.sha256(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def simulate_plan(data: Mapping[str, Any], source: str = "", max_tasks: float | None = None) -> dict[str, Any]:
    """Simulate one scenario dict; the run's figures as ``run --json`` names and nests them
    (:func:`scenarios.metrics.run_summary`: ``iteration_time_s``, ``breakdown``, ``overlap``,
    ``busiest_links``, ``simulation``...) with the run's ``wall_s`` and ``cpu_s``, or ``{"error": ...}`` (never raises
    for a bad plan; ``"over_budget": True`` beside it for a run above ``max_tasks`` estimated tasks,
    refused before it is built, as ``trainsim run --max-tasks`` refuses it). Module level so that worker
    processes can run it."""
    import time

    from scenarios.metrics import run_summary
    from scenarios.runner import TaskBudgetError, memory_for, prepare, run_prepared

    data = copy.deepcopy(dict(data))
    data.setdefault("simulation", {}).setdefault("record_links", False)  # no link timelines: faster
    t0, c0 = time.perf_counter(), time.process_time()  # CPU beside wall: a shared machine stretches the wall
    try:
        prep = prepare(parse_scenario(data, source))  # run_scenario's steps, with run's task budget
        rep = run_prepared(prep, memory_for(prep), started_s=t0, max_tasks=max_tasks)
    except TaskBudgetError as exc:
        return {"error": f"not simulated: {exc}", "over_budget": True}
    except (ValueError, KeyError) as exc:
        return {"error": str(exc.args[0] if isinstance(exc, KeyError) and exc.args else exc)}
    return {**run_summary(rep.metrics), "wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0}


def _records(path: str | Path | None) -> Iterator[dict[str, Any]]:
    """The records of a JSONL cache (missing file: none; a torn line, from an interrupted write, skipped)."""
    if path is None or not Path(path).exists():
        return
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(rec, dict) and "key" in rec and "result" in rec:
            yield rec


def load_cache(path: str | Path | None) -> dict[str, dict[str, Any]]:
    """key -> result of a JSONL cache, records of :data:`CACHE_SCHEMA` only (missing file: empty; a torn
    last line, from an interrupted write, is ignored; the last record of a key wins)."""
    return {rec["key"]: rec["result"] for rec in _records(path) if rec.get("schema") == CACHE_SCHEMA}


def append_cache(path: str | Path | None, key: str, plan: Candidate, result: Mapping[str, Any], **extra: Any) -> None:
    """Append one record (``key``, :data:`CACHE_SCHEMA`, ``plan``, ``result``, and ``extra`` fields such as
    ``sampled_layers``) to the JSONL cache at ``path`` (``None``: no cache), on a line of its own even after
    a torn last line (which :func:`load_cache` then skips)."""
    if path is None:
        return
    rec = {"key": key, "schema": CACHE_SCHEMA, "plan": plan.to_dict(), "result": dict(result), **extra}
    line = json.dumps(rec, sort_keys=True) + "\n"
    with Path(path).open("a+b") as fh:  # (appends at the end whatever the read position)
        if fh.seek(0, 2):  # a torn last line, from an interrupted write, is ended first
            fh.seek(-1, 2)
            if fh.read(1) != b"\n":
                line = "\n" + line
        fh.write(line.encode("utf-8"))


def check_cache(path: str | Path) -> None:
    """Refuse, before any work, a ``--cache`` file that is not a search cache (a ``--json`` output given by
    mistake would have records appended to it): its first line must be a record.

    Raises:
        ValueError: one line naming the file.
    """
    p = Path(path)
    if not p.is_file():
        return
    with p.open(encoding="utf-8", errors="replace") as fh:
        first = fh.readline().strip()
    if not first:
        return
    try:
        rec = json.loads(first)
    except json.JSONDecodeError:
        rec = None
    if not (isinstance(rec, dict) and "key" in rec and "result" in rec):
        raise ValueError(f"--cache {path}: not a trainsim search cache (its first line is not a record); "
                         f"give a new file or one an earlier search wrote")


def stale_records(path: str | Path | None) -> int:
    """How many plans of a JSONL cache have only records of another :data:`CACHE_SCHEMA` (an older
    trainsim's): :func:`simulate_plans` simulates them again when the search picks them."""
    old, current = set(), set()
    for rec in _records(path):
        (current if rec.get("schema") == CACHE_SCHEMA else old).add(rec["key"])
    return len(old - current)


def make_executor(spec: str | None, workers: int) -> tuple[Executor, Callable[[], None]]:
    """``(executor, close)`` for ``--executor``: ``None`` or ``process`` a local process pool of
    ``workers``; ``dask://host:port`` a dask.distributed cluster.

    Raises:
        ValueError: an unknown spec, or dask not installed (one line with the install command).
    """
    if spec in (None, "", "process"):
        pool = ProcessPoolExecutor(max_workers=workers)
        return pool, lambda: pool.shutdown(cancel_futures=True)
    if spec.startswith("dask://"):
        try:
            from distributed import Client  # the optional extra
        except ImportError:
            raise ValueError(f"--executor {spec}: dask.distributed is not installed; "
                             f"pip install 'trainsim[dask]'") from None
        client = Client("tcp://" + spec[len("dask://"):])
        return client.get_executor(pure=False), client.close
    raise ValueError(f"--executor {spec!r}: unknown; allowed: process, dask://HOST:PORT")


def simulated_microbatches(base: Scenario, c: Candidate) -> int:
    """Micro-batches the run of plan ``c`` simulates (the short runs where the steady period is
    extrapolated, :func:`scenarios.steady_state.plan_for`): its cost in simulated work, since every plan
    of one model simulates all its layers once per micro-batch. ``0`` for a plan ``run`` would refuse."""
    from scenarios.steady_state import plan_for

    try:
        cfg = c.config(int(base.training["global_batch_size"]), base.parallel)
    except (ValueError, KeyError, TypeError):
        return 0
    steady = plan_for(cfg, dict(base.simulation))
    return steady.cost_microbatches if steady is not None else cfg.num_microbatches


def simulate_plans(base: Scenario, cands: Iterable[Candidate], *, executor: Executor | None = None,
                   cache: str | Path | None = None, progress: bool = False,
                   max_tasks: float | None = None) -> dict[Candidate, dict[str, Any]]:
    """Simulate every plan of ``cands`` (those in ``cache`` are read back, not re-run); results by plan.

    ``executor`` None runs them here, one after the other (tests, one worker). A plan above
    ``max_tasks`` is refused (:func:`simulate_plan`) and not cached: a larger budget runs it."""
    cands = list(dict.fromkeys(cands))
    done = load_cache(cache)
    keyed = {c: scenario_key(candidate_data(base, c)) for c in cands}
    out = {c: done[k] for c, k in keyed.items() if k in done}
    todo = [c for c in cands if c not in out]
    if executor is not None:  # the longest first, so that the last to finish is a short one (LPT)
        todo.sort(key=lambda c: -simulated_microbatches(base, c))
    bar = tqdm(total=len(cands), initial=len(out), desc="simulating plans", unit="plan", file=sys.stderr,
               disable=not progress, leave=False, dynamic_ncols=True)

    def record(c: Candidate, result: dict[str, Any]) -> None:
        out[c] = result
        if not result.get("over_budget"):  # written as it arrives: an interruption loses none
            append_cache(cache, keyed[c], c, result)
        bar.update()

    try:
        if executor is None:
            for c in todo:
                record(c, simulate_plan(candidate_data(base, c), base.source, max_tasks))
        else:
            futures = {executor.submit(simulate_plan, candidate_data(base, c), base.source, max_tasks): c
                       for c in todo}
            for fut in as_completed(futures):
                record(futures[fut], fut.result())
    finally:
        bar.close()
    return out
