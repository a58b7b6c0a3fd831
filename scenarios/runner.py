"""Run a scenario end to end: cluster, model trace, per-rank programs, simulation, metrics.

With :mod:`scenarios.hierarchical`, the only modules that know both the workload and the hardware
model (``docs/DESIGN.md``). The metrics dict itself is :func:`scenarios.metrics.run_metrics`'s.
"""

from __future__ import annotations

import gc
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

import torch
from torch import nn
from tqdm import tqdm

from hwmodel import calibration_overlay
from hwmodel.cluster import Cluster
from hwmodel.costmodel import Calibration, KernelCostModel
from hwmodel.dtypes import check_gpu_has as check_dtype  # re-exported: the search's screen calls it
from hwmodel.nccl.engine import NcclEngine
from hwmodel.nccl.tuner_config import TunerConfigError, load_tuner_config
from hwmodel.runtime import DEFAULT_HOST_LAUNCH_OVERHEAD_S, RunResult, Runtime
from hwmodel.spec_ranges import check_gpu_ranges, check_rated_power, load_checked_gpu_file
from hwmodel.specs import get_gpu, with_overrides
from hwmodel.systems import get_system, node_shape
from hwmodel.topology import Topology, build_system
from hwmodel.variation import DEFAULT_GPU_SPEED_SPREAD, straggler_slowdown
from scenarios.analysis import RankBreakdown, breakdown
from scenarios.budget import TASKS_PER_S as TASKS_PER_S  # re-exported: runner's API before scenarios.budget
from scenarios.budget import TaskBudgetError as TaskBudgetError
from scenarios.budget import check_task_budget as check_task_budget
from scenarios.budget import duration
from scenarios.catalog import scenario_path as scenario_path  # re-exported: runner.scenario_path is API
from scenarios.hierarchical import macro_programs, step2_mirror
from scenarios.metrics import peak_dtype_for as peak_dtype_for  # re-exported, as scenario_path
from scenarios.metrics import run_metrics
from scenarios.modes import estimate_tasks as estimate_tasks  # re-exported: runner.estimate_tasks is API
from scenarios.modes import simulation_mode
from scenarios.notes import model_notes, parallel_notes, tp_span_notes, training_notes, what_if_notes
from scenarios.scenario import MAX_GPUS, MAX_NODES, Scenario, parallel_kwargs
from scenarios.steady_state import extrapolated, plan_for
from scenarios.user_code import check_trusted, load_factory
from workload.allocator import with_framework
from workload.custom import MODULE_KEYS, CustomModel
from workload.fp8 import DEFAULT_RECIPE, check_param_gather, check_recipe_gpu, get_recipe, with_fp8_params
from workload.parallel.builder import BuildResult, build_programs
from workload.parallel.config import ParallelConfig
from workload.parallel.placement import Layout
from workload.parallel.rank_trace import trace_rank
from workload.zoo import family_of, get_model_config
from workload.zoo import with_overrides as model_overrides
from workload.zoo.config import ResNetConfig, TransformerConfig
from workload.zoo.hf import config_from_hf

MODEL_SPECIAL_KEYS = ("name", "factory", "hf_config", "factory_args")
LONG_RUN_S = 60.0
"""A run estimated at this many seconds or more says so on stderr before it starts (with a progress bar)."""
DEFAULT_MAX_TASKS = 2_000_000
"""Default bound on the estimated tasks of one run (``trainsim run --max-tasks``): about four times the
largest catalog scenario (sc21-gpt-1t, about 524,000 tasks in 117 s), i.e. minutes, not hours."""


@dataclass
class Prepared:
    """A scenario resolved into objects: the cluster topology, the model, the parallel configuration."""

    scenario: Scenario
    topology: Topology
    model_cfg: Any
    config: ParallelConfig
    dtype: str
    trace: Any = None
    """The per-rank model trace (:func:`workload.parallel.rank_trace.trace_rank`), traced by
    :func:`prepare` so that its input checks come before any memory verdict."""


def system_gpu(system: dict, base_dir: str | Path | None = None):
    """The GPU of a ``[system]`` section (``gpu_file``, ``gpu`` and ``gpu_overrides`` applied), or
    ``None`` for the system's own.

    Raises:
        ValueError / FileNotFoundError: naming the ``[system]`` key at fault.
    """
    gpu = None
    if "gpu_file" in system:
        path = resolve_input_path("[system] gpu_file", system["gpu_file"], base_dir, (".toml",))
        try:
            gpu = load_checked_gpu_file(path)  # the checks of gpu_overrides, on every field it sets
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ValueError(f"[system] gpu_file {path}: malformed TOML: {exc}") from None
        except ValueError as exc:
            if _is_cluster_file(path):
                raise ValueError(f"[system] gpu_file {path} is a cluster file (for hwmodel.topology."
                                 f"load_cluster_file), not a GPU file; put its system, num_nodes, ... in "
                                 f"[system] as name, nodes, ... and its gpu_file here") from None
            raise ValueError(f"[system] gpu_file: {exc}") from None
    elif "gpu" in system:
        gpu = get_gpu(system["gpu"])
    if system.get("gpu_overrides"):
        base = gpu or build_system(system["name"], 1).gpu_spec
        try:
            check_rated_power(system["gpu_overrides"])  # before the spec's power_limit_W check reads it
            gpu = with_overrides(base, **system["gpu_overrides"])
            check_gpu_ranges(base, gpu, keys=system["gpu_overrides"])
        except ValueError as exc:
            raise ValueError(f"[system] gpu_overrides: {exc}") from None
    if gpu is not None and gpu.nvlink_links == 0 and system.get("gpus_per_node") != 1:
        field_ = "gpu_overrides nvlink_links" if "nvlink_links" in system.get("gpu_overrides", {}) else "the GPU"
        raise ValueError(f"[system] {field_}: nvlink_links = 0 leaves the GPUs of a {system['name']} node with "
                         f"no path to each other (trainsim's servers connect their GPUs by NVLink/NVSwitch only; "
                         f"there is no PCIe peer-to-peer route); give nvlink_links >= 1")
    return gpu


def resolve_input_path(key: str, value: str, base_dir: str | Path | None, suffixes: tuple[str, ...]) -> Path:
    """The one rule for a scenario's relative paths: beside the scenario file (``base_dir``; the working
    directory for a scenario without a file). The file must exist, be a file and end in ``suffixes``.

    Raises:
        FileNotFoundError / ValueError: one line naming the key, the path looked up and the rule.
    """
    path = Path(value)
    where = ""
    if not path.is_absolute() and base_dir is not None:
        path = Path(base_dir) / path
        where = " (relative paths are taken from the scenario file's folder)"
    if not path.exists():
        raise FileNotFoundError(f"{key} not found: {path}{where}")
    if path.is_dir():
        raise ValueError(f"{key} {path} is a directory; expected a {' or '.join(suffixes)} file")
    if path.suffix.lower() not in suffixes:
        raise ValueError(f"{key} {path}: expected a {' or '.join(suffixes)} file, got {path.suffix or 'no suffix'}")
    return path


def _is_cluster_file(path: Path) -> bool:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return "system" in data or "cluster" in data


def check_nodes(system: dict) -> int:
    """``[system] nodes``, checked against 1..:data:`MAX_NODES` and the GPUs against :data:`MAX_GPUS`
    (nodes x the node's GPUs, which differ by system: 8 on a DGX, 72 on a GB200 NVL72 rack), and 1 under
    ``fabric = "none"``."""
    nodes = system.get("nodes", 1)
    try:
        per_node = system.get("gpus_per_node") or get_system(system["name"]).gpus_per_node
    except (KeyError, ValueError):  # an unknown system is named by build_topology's own error
        per_node = 1
    if not 1 <= nodes <= MAX_NODES or nodes * per_node > MAX_GPUS:
        most = min(MAX_NODES, MAX_GPUS // per_node)
        raise ValueError(f"[system] nodes must be in 1..{most}, got {nodes} ({most:,} nodes x {per_node} GPUs; "
                         f"{MAX_GPUS:,} GPUs, as today's largest training clusters, is the most trainsim is "
                         f"built to simulate)")
    if system.get("fabric") == "none" and nodes > 1:  # no NIC links: the servers could not reach each other
        raise ValueError(f"[system] fabric = 'none' connects no servers; it needs nodes = 1, got {nodes}")
    return nodes


def node_shape_keys(system: dict) -> dict[str, int]:
    """``[system] gpus_per_node`` / ``nics_per_node`` as :func:`~hwmodel.systems.build_system` keywords,
    checked against the named system (:func:`~hwmodel.systems.node_shape`).

    Raises:
        ValueError: one line naming the ``[system]`` key and its allowed range.
        UnknownNameError: an unknown system name.
    """
    keys = {k: system[k] for k in ("gpus_per_node", "nics_per_node") if k in system}
    if keys:
        node_shape(get_system(system["name"]), **keys, num_nodes=system.get("nodes", 1), where="[system] ")
    return keys


def build_topology(system: dict, base_dir: str | Path | None = None, gpu=None) -> Topology:
    """The cluster of a ``[system]`` section (``gpu``: its GPU from :func:`system_gpu`, when known). Raises
    ValueError naming the ``[system]`` key (the fabric's errors prefixed ``[system] ``), UnknownNameError."""
    if gpu is None:
        gpu = system_gpu(system, base_dir)
    nodes = check_nodes(system)
    ratio = {k: float(system[k]) for k in ("oversubscription", "core_oversubscription") if k in system}
    try:
        return build_system(system["name"], nodes, fabric=system.get("fabric"), gpu_override=gpu,
                            nic_override=system.get("nic"), su_size=system.get("su_size"),
                            fabric_switch=system.get("fabric_switch"), nodes_per_leaf=system.get("nodes_per_leaf"),
                            num_spines=system.get("spines"), leaves_per_pod=system.get("leaves_per_pod"),
                            **ratio, **node_shape_keys(system))
    except ValueError as exc:  # the fabric's errors start with the key (hwmodel.fabric): named as [system] keys
        raise ValueError(str(exc) if str(exc).startswith("[") else f"[system] {exc}") from None


def build_model_config(model: dict, training: dict, base_dir: str | Path | None = None, *,
                       trust_code: bool = True):
    """The model configuration of a ``[model]`` section (zoo name + overrides, or a Hugging Face
    config); ``training.seq_length`` overrides the model's.

    ``factory = "package.module:fn"`` (or ``"path/to/file.py:fn"``, relative to ``base_dir``, the
    scenario file's folder) is called as ``fn(**factory_args)`` under ``torch.device("meta")``. It returns
    a zoo configuration (the overrides then apply), or a ``torch.nn.Module`` / ``(module,
    example_inputs)``: a :class:`workload.custom.CustomModel` is returned (see :mod:`workload.custom`).
    It runs only when ``trust_code`` (or ``TRAINSIM_TRUST_CODE=1``): :mod:`scenarios.user_code`.

    A model with a learned position table (``position_embedding_type = "learned_absolute"``: BERT,
    GPT) keeps its ``max_position_embeddings`` when ``seq_length`` grows, so a sequence longer than
    the table is refused unless ``max_position_embeddings`` is given too.

    Raises:
        ValueError: naming the ``[model]`` key at fault.
        scenarios.user_code.UntrustedCodeError: a factory without ``trust_code``.
    """
    given = [k for k in ("name", "factory", "hf_config") if k in model]
    if len(given) > 1:
        raise ValueError(f"[model] give one of name, factory, hf_config; got {' and '.join(given)}")
    if "factory" in model:
        check_trusted(model["factory"], trust_code, base_dir)
        return _from_factory(model, training, base_dir)
    overrides = {k: v for k, v in model.items() if k not in MODEL_SPECIAL_KEYS}
    if "seq_length" in training:
        overrides["seq_length"] = training["seq_length"]
    if "hf_config" in model:
        source = model["hf_config"]
        if not isinstance(source, str) or not source:
            raise ValueError(f"[model] hf_config must be a path to a config.json or a Hub id, got {source!r}")
        local = Path(source) if Path(source).is_absolute() or base_dir is None else Path(base_dir) / source
        if source.endswith(".json") or local.is_file():  # a file beside the scenario, as every relative path
            source = str(resolve_input_path("[model] hf_config", source, base_dir, (".json",)))
        elif local.is_dir():  # a Hugging Face model folder: its config.json
            source = str(local)
        try:
            cfg = config_from_hf(source)  # raises ImportError without the optional transformers
        except ImportError as exc:
            raise ValueError(f"[model] hf_config {model['hf_config']!r}: {exc}") from None
        except FileNotFoundError as exc:
            raise FileNotFoundError(f"[model] hf_config: {exc}") from None
        except ValueError as exc:
            raise ValueError(f"[model] hf_config: {exc}") from None
    else:
        cfg = get_model_config(model["name"])
    return _model_overrides(cfg, overrides)


def _model_overrides(cfg, overrides: dict):
    """``with_overrides`` with its errors prefixed by the section, ``[model]``; a learned position
    table keeps its size when only ``seq_length`` changes (:func:`build_model_config`)."""
    if not overrides:
        return cfg
    if isinstance(cfg, TransformerConfig) and cfg.position_embedding_type == "learned_absolute" and \
            "seq_length" in overrides and "max_position_embeddings" not in overrides and \
            isinstance(overrides["seq_length"], int) and overrides["seq_length"] > cfg.max_position_embeddings:
        raise ValueError(f"[training] seq_length={overrides['seq_length']} exceeds {cfg.name}'s learned position table "
                         f"(max_position_embeddings={cfg.max_position_embeddings}); give [model] "
                         f"max_position_embeddings too to model a longer table")
    try:
        return model_overrides(cfg, **overrides)
    except ValueError as exc:
        raise ValueError(f"[model] {exc}") from None


def _from_factory(model: dict, training: dict, base_dir: str | Path | None):
    spec = model["factory"]
    args = model.get("factory_args", {})
    if not isinstance(args, dict):
        raise ValueError(f"[model] factory_args must be a table of keyword arguments, got {args!r}")
    fn = load_factory(spec, base_dir)
    try:
        with torch.device("meta"):
            result = fn(**args)
    except (Exception, SystemExit, KeyboardInterrupt) as exc:  # the user's code: one line, never an exit
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise ValueError(f"[model] factory {spec!r} raised {type(exc).__name__}: {first}") from None
    if isinstance(result, (TransformerConfig, ResNetConfig)):
        extra = sorted(set(model) & (set(MODULE_KEYS) - set(MODEL_SPECIAL_KEYS)))
        if extra:
            raise ValueError(f"[model] {', '.join(extra)}: factory {spec!r} returned a model configuration; "
                             f"these keys are for a factory returning an nn.Module")
        overrides = {k: v for k, v in model.items() if k not in MODEL_SPECIAL_KEYS}
        if "seq_length" in training:
            overrides["seq_length"] = training["seq_length"]
        return _model_overrides(result, overrides)
    if isinstance(result, nn.Module) or isinstance(result, tuple) and result and isinstance(result[0], nn.Module):
        unknown = sorted(set(model) - set(MODULE_KEYS))
        if unknown:
            raise ValueError(f"[model] unknown key(s) {', '.join(unknown)} for factory {spec!r}, which returns an "
                             f"nn.Module; allowed: {', '.join(MODULE_KEYS)} (pass your model's settings in "
                             f"factory_args)")
        if "seq_length" in training:
            raise ValueError(f"[training] seq_length applies to zoo transformers; factory {spec!r} returns an "
                             f"nn.Module: give one sample's shape in [model] input_shape")
        return CustomModel.from_factory(result, spec, model)
    raise ValueError(f"[model] factory {spec!r} returned a {type(result).__name__}; it must return a "
                     f"torch.nn.Module, (module, example_inputs), or a model configuration "
                     f"(workload.zoo.config.TransformerConfig, e.g. with_overrides(get_model_config('llama3-8b'), "
                     f"num_layers=4))")


def scenario_dir(scenario: Scenario) -> Path | None:
    """The folder a scenario's relative paths are taken from: its file's (``None``: not from a file)."""
    src = Path(scenario.source) if scenario.source else None
    return src.parent if src is not None and src.is_file() else None


def prepare(scenario: Scenario) -> Prepared:
    """Resolve a scenario into a topology, a model configuration and a resolved ParallelConfig.

    Raises:
        ValueError / UnknownNameError: naming the field at fault.
    """
    tr = scenario.training
    base_dir = scenario_dir(scenario)
    system = scenario.system
    # The cheap checks first: a mistake in a huge cluster is reported before its fabric is built.
    nodes = check_nodes(system)
    gpu = system_gpu(system, base_dir)
    one_node = build_system(system["name"], 1, gpu_override=gpu, nic_override=system.get("nic"),
                            **node_shape_keys(system))
    cfg = ParallelConfig(**parallel_kwargs(scenario.parallel, tr)).resolve(nodes * one_node.num_gpus)
    dtype = tr.get("dtype", "bf16")
    check_dtype(dtype, one_node.gpu_spec)
    check_fp8_keys(tr, cfg, one_node.gpu_spec)
    check_async_tp_compile(tr, cfg)
    model_cfg = build_model_config(scenario.model, tr, base_dir, trust_code=scenario.trust_code)
    if isinstance(model_cfg, CustomModel):  # first: says why a plain module cannot use a strategy
        model_cfg.check_parallel(cfg)
    cfg.validate_model(model_cfg)
    # its checks (e.g. TP vs the vocabulary) come before the memory verdict
    trace = trace_rank(model_cfg, cfg, **trace_options(tr))
    topo = build_topology(system, base_dir, gpu=gpu)
    return Prepared(scenario, topo, model_cfg, cfg, dtype, trace)


def trace_options(training: dict) -> dict[str, Any]:
    """The :func:`~workload.parallel.rank_trace.trace_rank` keywords of a ``[training]`` section."""
    return {"dtype": training.get("dtype", "bf16"), "compile": training.get("compile", False),
            "fp8_recipe": training.get("fp8_recipe", DEFAULT_RECIPE),
            "fp8_param_gather": training.get("fp8_param_gather", False)}


def check_fp8_keys(training: dict, cfg: ParallelConfig, gpu) -> None:
    """``[training] fp8_recipe`` and ``fp8_param_gather`` against the dtype, the GPU and the parallel
    configuration (:func:`workload.fp8.check_recipe_gpu`, :func:`workload.fp8.check_param_gather`).

    Raises:
        ValueError: one line naming the key.
    """
    dtype, recipe = training.get("dtype", "bf16"), training.get("fp8_recipe", DEFAULT_RECIPE)
    if dtype == "fp8":
        from hwmodel.costmodel import Calibration
        check_recipe_gpu(recipe, gpu.name, Calibration.architecture_of(gpu))
    if training.get("fp8_param_gather", False):
        check_param_gather(recipe, dtype, cfg.effective_zero_stage)


def check_async_tp_compile(training: Mapping[str, Any], cfg: ParallelConfig) -> None:
    """``[parallel] async_tp`` needs ``[training] compile``: torchtitan's async TP is an Inductor pass
    (``torch._inductor.config._micro_pipeline_tp``), and torchtitan refuses it without the compiled model
    (``maybe_enable_async_tp`` in ``torchtitan/distributed/tensor_parallel.py``: "Async TP requires 'model'
    in --compile.components and --compile.enable").

    Raises:
        ValueError: one line naming both keys.
    """
    if cfg.async_tp and not training.get("compile", False):
        raise ValueError("[parallel] async_tp = true needs [training] compile = true (torchtitan's async TP is a "
                         "torch.compile pass; torchtitan refuses it without --compile.enable)")


@dataclass
class RunReport:
    """Everything a run produced, with :meth:`to_json` for machines."""

    scenario: Scenario
    prepared: Prepared
    result: RunResult
    build: BuildResult
    mode: str
    per_rank: dict[int, RankBreakdown]
    memory: Any
    metrics: dict[str, Any] = field(default_factory=dict)
    wall_s: float = 0.0
    simulated: RunResult | None = None
    """The run ``--trace`` / ``--plots`` draw where ``result`` is extrapolated (:mod:`scenarios.steady_state`)."""
    mode_reason: str = ""
    """Why ``mode`` (:func:`scenarios.modes.simulation_mode`): the report's mode line says it."""

    def to_json(self) -> dict[str, Any]:
        return self.metrics


def run_scenario(scenario: Scenario, *, progress: bool = False) -> RunReport:
    """Simulate one training iteration of ``scenario`` and analyse it (:func:`prepare`, then
    :func:`run_prepared`).

    Raises:
        ValueError / UnknownNameError: naming the field at fault.
    """
    t0 = time.perf_counter()
    prep = prepare(scenario)
    return run_prepared(prep, memory_for(prep), progress=progress, started_s=t0)


def run_prepared(prep: Prepared, memory: Any, *, progress: bool = False,
                 started_s: float | None = None, max_tasks: float | None = None) -> RunReport:
    """Simulate one training iteration of a prepared scenario and analyse it.

    Args:
        prep: from :func:`prepare` (resolved once: callers that check memory first pass theirs on).
        memory: ``memory_for(prep)`` (``None``: not modelled for this model).
        progress: show a progress bar on stderr (tasks simulated of the iteration's); callers pass
            ``sys.stderr.isatty()`` so that only a terminal shows one. stdout and the results do not
            change.
        started_s: ``time.perf_counter()`` when the run began (default: now), for ``wall_s``.
        max_tasks: refuse (:class:`TaskBudgetError`) a run estimated above this many tasks
            (:func:`check_task_budget`); ``None``: no bound.

    Raises:
        ValueError: naming the ``[simulation]`` key at fault.
        TaskBudgetError: the estimate exceeds ``max_tasks``.
    """
    t0 = time.perf_counter() if started_s is None else started_s
    overlay = calibration_overlay.active() or scenario_profile(prep.scenario)
    from hwmodel.nccl.calibration import fidelity_warning, group_size_warning, recording_corrections

    with calibration_overlay.applied(overlay), recording_corrections() as used_curves, _prepared_frozen():
        report = _run_prepared(prep, memory, progress=progress, max_tasks=max_tasks)
    if overlay is not None:  # only then: a run on the shipped calibration keeps its JSON bytes
        gpu = prep.topology.gpu_spec
        changed = overlay.applying_to(gpu.name, Calibration.architecture_of(gpu))
        report.metrics["calibration"] = {"profile": overlay.path, "name": overlay.name, "changed": list(changed)}
        shadowed = [k for k in overlay.changed if k.startswith("default.") and k not in changed]
        other = [k for k in overlay.changed if k not in changed and k not in shadowed]
        why = ([f"{len(other)} for other GPUs ({', '.join(other[:3])}{', ...' if len(other) > 3 else ''})"] if other
               else []) + ([f"{len(shadowed)} [default] key(s) that {gpu.name}'s architecture or GPU section sets, "
                            f"which wins ({', '.join(shadowed[:3])}{', ...' if len(shadowed) > 3 else ''})"]
                           if shadowed else [])
        if why:
            report.metrics.setdefault("warnings", []).append(
                f"calibration {overlay.name} ({overlay.path}): "
                + ("changes nothing for this run" if not changed else "some constants change nothing here")
                + f" on {gpu.name}: " + "; ".join(why))
        if used_curves:  # only the shapes this run priced: a curve for another collective warns of nothing
            fidelity = prep.scenario.simulation.get("fidelity", "flow")
            with calibration_overlay.applied(overlay):
                lines = [w for w in (fidelity_warning(overlay.name, fidelity, used_curves),
                                     group_size_warning(overlay.name, used_curves)) if w]
            if lines:
                report.metrics.setdefault("warnings", []).extend(lines)
    report.wall_s = time.perf_counter() - t0
    return report


@contextmanager
def _prepared_frozen() -> Iterator[None]:
    """The objects alive before the simulation (the topology graph, the traced programs) kept out of
    the garbage collector's full passes while it runs (``gc.freeze``), and handed back after: they
    live through the run, and each full pass re-walked all of them, a cost that grows with the
    cluster (16,384 H100: about 0.2 s of CPU). Meanwhile the youngest generation is collected every
    :data:`RUN_GC_THRESHOLD0` allocations (see there). Nothing is frozen or changed if the caller
    already froze objects (its freeze is its own)."""
    if gc.get_freeze_count():
        yield
        return
    threshold = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(max(threshold[0], RUN_GC_THRESHOLD0), *threshold[1:])
    try:
        yield
    finally:
        gc.set_threshold(*threshold)
        gc.unfreeze()


RUN_GC_THRESHOLD0 = 20_000
"""Allocations between two young collections while a run simulates (CPython: 700). A mirrored run's
merges allocate per mirror and keep caches that grow with the mirrors, so at the default every tenth
middle collection found survivors enough for a full pass: 55, 6.8 s of a 30 s run at 131,072 H100.
Reference cycles (SimPy processes and events) are freed at most this many allocations later."""


def scenario_profile(scenario: Scenario) -> calibration_overlay.Overlay | None:
    """The profile ``[simulation] calibration`` names (relative to the scenario file), loaded.

    Raises:
        ValueError / FileNotFoundError: one line naming the key.
    """
    value = scenario.simulation.get("calibration")
    if not value:
        return None
    path = resolve_input_path("simulation.calibration", value, scenario_dir(scenario), (".toml",))
    try:
        return calibration_overlay.load_overlay(path)
    except ValueError as exc:
        raise ValueError(f"simulation.calibration: {exc}") from None


def _run_prepared(prep: Prepared, memory: Any, *, progress: bool, max_tasks: float | None,
                  resolved: tuple[str, list[str], str] | None = None) -> RunReport:
    cfg, topo, sim = prep.config, prep.topology, prep.scenario.simulation
    trace = prep.trace if prep.trace is not None else trace_rank(
        prep.model_cfg, cfg, **trace_options(prep.scenario.training))
    layout = Layout(cfg)
    mode, mode_note, mode_reason = resolved or simulation_mode(cfg, sim, trace, topo.gpus_per_node,
                                                               getattr(prep.model_cfg, "name", "the model"))
    if (steady := plan_for(cfg, sim)) is not None:  # a few micro-batches simulated in the real run's mode
        return extrapolated(replace(prep, trace=trace), steady, model_flops(prep, trace), lambda p: _run_prepared(
            p, memory, progress=progress, max_tasks=max_tasks, resolved=(mode, mode_note, mode_reason)))
    if max_tasks is not None:
        seconds = check_task_budget(prep, trace, mode, max_tasks)
        if progress and seconds >= LONG_RUN_S:  # (told before a long run, as a refused one is)
            print(f"trainsim run: {prep.scenario.name} is estimated at {duration(seconds)} (tasks and the "
                  f"data-parallel rings' mirrored routes: scenarios.budget)", file=sys.stderr)
    ranks = None if mode == "full" else layout.representatives()
    build = None if mode == "hierarchical" else build_programs(trace, cfg, ranks=ranks)
    engine = _engine_factory(sim, scenario_dir(prep.scenario))
    host = float(sim.get("host_launch_overhead_s", DEFAULT_HOST_LAUNCH_OVERHEAD_S))
    cost = run_cost_model(prep)
    if build is None:
        build = macro_programs(trace, cfg, topo, engine, host_launch_overhead_s=host, cost_model=cost)
    gpus = topo.gpus()
    cluster = Cluster(topo, record=sim.get("record_links", True), cost_model=cost)
    mirror = None if mode == "full" else step2_mirror(layout) if mode == "hierarchical" else layout.mirror
    runtime = Runtime(cluster, build.programs, placement={r: gpus[r] for r in range(cfg.world_size)},
                      host_launch_overhead_s=host, nccl=engine(cluster), mirror=mirror)
    with _progress_bar(progress, f"simulating {prep.scenario.name}") as tick:
        result = runtime.run(progress=tick)
    per_rank = breakdown(result.events, result.end_time_s, pipeline=cfg.pp > 1)
    report = RunReport(prep.scenario, prep, result, build, mode, per_rank, memory, mode_reason=mode_reason)
    report.metrics = run_metrics(report, model_flops(prep, trace))
    notes = (what_if_notes(prep.scenario.system, topo, scenario_dir(prep.scenario), runtime.copies_requested_peak,
                           prep.scenario.simulation)
             + model_notes(prep.model_cfg) + parallel_notes(prep.config, prep.scenario.parallel)
             + tp_span_notes(prep.config, topo.gpus_per_node, prep.model_cfg)
             + training_notes(prep.scenario.training, prep.config) + mode_note)
    if notes:  # only then: the JSON of a scenario without notes keeps its bytes
        report.metrics["warnings"] = notes
    return report


def run_cost_model(prep: Prepared) -> KernelCostModel:
    """The kernel cost model of a run: the sustained training clock, slowed by the expected slowest of
    the run's GPUs (``[simulation] gpu_speed_spread``, :func:`hwmodel.variation.straggler_slowdown`)."""
    spread = float(prep.scenario.simulation.get("gpu_speed_spread", DEFAULT_GPU_SPEED_SPREAD))
    return KernelCostModel(prep.topology.gpu_spec, sustained=True,
                           speed_scale=1.0 / straggler_slowdown(spread, prep.config.world_size))


def _engine_factory(sim: dict, base_dir: Path | None = None) -> Callable[[Cluster], NcclEngine]:
    """The NCCL engine of a cluster, as ``[simulation]`` configures it (``nccl_tuner_config``, relative
    to ``base_dir``, the scenario file's folder, as every path of a scenario).

    Raises:
        ValueError: ``nccl_tuner_config`` cannot be read.
    """
    tuner_rules = None
    if sim.get("nccl_tuner_config"):
        path = Path(sim["nccl_tuner_config"])
        if not path.is_absolute() and base_dir is not None:
            path = base_dir / path
        try:
            tuner_rules = load_tuner_config(path)
        except TunerConfigError as exc:
            raise ValueError(f"simulation.nccl_tuner_config: {exc}") from None

    def engine(cluster: Cluster) -> NcclEngine:
        return NcclEngine(cluster, fidelity=sim.get("fidelity", "flow"), algorithm=sim.get("nccl_algo"),
                          protocol=sim.get("nccl_proto"), tuner_config=tuner_rules,
                          ib_qps_per_connection=sim.get("nccl_ib_qps_per_connection", 1),
                          ib_adaptive_routing=sim.get("nccl_ib_adaptive_routing", False))

    return engine


@contextmanager
def _progress_bar(enabled: bool, desc: str) -> Iterator[Callable[[int, int], None] | None]:
    """A ``progress(tasks_done, tasks_total)`` callback drawing a tqdm bar on stderr (closed and
    cleared on exit), or ``None`` when not ``enabled``."""
    if not enabled:
        yield None
        return
    bar = tqdm(total=0, desc=desc, unit="task", unit_scale=True, file=sys.stderr, leave=False,
               dynamic_ncols=True)

    def tick(done: int, total: int) -> None:
        if bar.total != total:
            bar.total = total
        bar.update(done - bar.n)

    try:
        yield tick
    finally:
        bar.close()


def memory_for(prep: Prepared):
    """Peak memory of the busiest GPU of a prepared run (:func:`memory_of`; ``None``: not modelled)."""
    return memory_of(prep.model_cfg, prep.config, prep.scenario.training, prep.topology.gpu_spec)


def memory_of(model_cfg: Any, cfg: ParallelConfig, training: Mapping[str, Any], gpu: Any):
    """Peak memory of the busiest GPU training ``model_cfg`` under the resolved ``cfg`` with the
    ``[training]`` keys ``training`` on ``gpu``, by the model family's memory model (``None``: it has
    none); FP8 parameters with ``fp8_param_gather`` (:func:`workload.fp8.with_fp8_params`), and the
    framework's own memory on the GPU (:func:`workload.allocator.with_framework`). ``run``'s verdict and
    the search's screen both call this, so they agree on every plan (``MemoryBreakdown.fits(gpu)``)."""
    dtype = training.get("dtype", "bf16")  # a recipe that keeps no FP8 state between passes holds bf16's memory
    if dtype == "fp8" and not get_recipe(training.get("fp8_recipe", DEFAULT_RECIPE)).fp8_saved_state:
        dtype = "bf16"
    mem = family_of(model_cfg).memory(model_cfg, cfg, dtype, compiled=bool(training.get("compile", False)))
    if mem is None:
        return None
    if training.get("fp8_param_gather", False):
        mem = with_fp8_params(mem, cfg.memory_zero_stage)
    return with_framework(mem, cfg, gpu)


def model_flops(prep: Prepared, trace) -> tuple[float, float, str]:
    """(model FLOPs per iteration, hardware FLOPs incl. recomputation, formula used), by the model family."""
    return tuple(family_of(prep.model_cfg).flops(prep.model_cfg, prep.config, trace.graph))

