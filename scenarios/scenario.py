"""Scenario files: what to simulate, as TOML with five sections.

```toml
[system]      # the cluster: name (dgx-a100, dgx-h100, gb200-nvl72, ...), nodes, gpus_per_node,
              # nics_per_node, fabric, oversubscription, ...
[model]       # a zoo name plus overrides (num_layers, hidden_size, ...), or factory = "pkg.mod:fn"
[parallel]    # ParallelConfig fields, Megatron names (tensor_model_parallel_size, ...)
[training]    # global_batch_size, micro_batch_size, dtype (bf16, fp16, fp32, fp8), seq_length, compile,
              # fp8_recipe (delayed, tensorwise, rowwise, mxfp8), fp8_param_gather
[simulation]  # fidelity (flow/step/chunked), mode (auto/full/symmetric/hierarchical), nccl_algo, nccl_proto,
              # nccl_tuner_config (a path: NCCL tuner-plugin CSV rules), host_launch_overhead_s, record_links,
              # gpu_speed_spread (per-GPU compute-time variation, default 0.02: hwmodel/variation.py),
              # steady_state (auto/off: extrapolate the steady pipeline period, scenarios/steady_state.py)
              # nccl_ib_qps_per_connection (1..128, default 1: QPs per NCCL connection, hwmodel/ecmp.py),
              # nccl_ib_adaptive_routing (default false: fabric switches hash each flow; true: spread evenly)
```

Unknown sections and keys are rejected by name with the allowed ones listed; values are type-checked.
``--set section.key=value`` overrides parse ``value`` as a TOML value (``8``, ``true``, ``"ring"``),
falling back to a plain string.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import sys
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from hwmodel.dtypes import TRAINING_DTYPES
from hwmodel.ecmp import check_qps_per_connection
from workload.fp8 import DEFAULT_RECIPE, get_recipe
from workload.parallel.config import ParallelConfig

SYSTEM_KEYS = {
    "name": str, "nodes": int, "fabric": str, "oversubscription": (int, float), "su_size": int,
    "gpu": str, "gpu_file": str, "nic": str, "fabric_switch": str, "gpu_overrides": dict,
    "nodes_per_leaf": int, "spines": int, "leaves_per_pod": int, "core_oversubscription": (int, float),
    "gpus_per_node": int, "nics_per_node": int,
}
TRAINING_KEYS = {"global_batch_size": int, "micro_batch_size": int, "dtype": str, "seq_length": int,
                 "compile": bool, "fp8_recipe": str, "fp8_param_gather": bool, "recompute_method": str,
                 "recompute_num_layers": int}
TRAINING_PARALLEL_KEYS = ("micro_batch_size", "global_batch_size", "recompute_method", "recompute_num_layers")
"""``[training]`` keys that are :class:`ParallelConfig` fields (Megatron-LM lists them among its training
arguments); :func:`parallel_kwargs` joins them to ``[parallel]``."""
SIMULATION_KEYS = {
    "fidelity": str, "mode": str, "host_launch_overhead_s": (int, float), "nccl_algo": str, "nccl_proto": str,
    "record_links": bool, "nccl_tuner_config": str, "calibration": str, "gpu_speed_spread": (int, float),
    "steady_state": str, "nccl_ib_qps_per_connection": int, "nccl_ib_adaptive_routing": bool,
}
MAX_NODES = 16384
MAX_GPUS = 131072
"""The most GPUs a scenario may have (nodes x GPUs per node)."""
"""The most servers a scenario (or ``nccl-tests --nodes``) may have: 131,072 GPUs at 8 per node, the size
of today's largest training clusters (Llama 3 405B ran on 16,384 H100). Building the fabric grows with the
node count (16,384 nodes: ~400,000 topology vertices, tens of seconds to build); routes, link resources
and mirrored traffic cost what the simulated ranks touch, not the cluster."""
MODES = ("auto", "full", "symmetric", "hierarchical")
STEADY_STATES = ("auto", "off")
"""``[simulation] steady_state``: extrapolate the steady pipeline period where it applies, or simulate every
micro-batch (:mod:`scenarios.steady_state`)."""
DTYPES = tuple(TRAINING_DTYPES)
"""Training dtypes (:data:`hwmodel.dtypes.TRAINING_DTYPES`); fp8 is bf16 mixed precision with Transformer
Engine FP8 Linear GEMMs (H100 and later)."""
PARALLEL_KEYS = {f.name for f in dataclasses.fields(ParallelConfig)} - set(TRAINING_PARALLEL_KEYS)
SECTIONS = ("system", "model", "parallel", "training", "simulation", "name", "description")

DEFAULT_SCENARIO = """
name = "default"
description = "GPT-3 175B (8 of its 96 layers), TP 8 x PP 2 x DP 2 on 4 DGX A100, simulated in seconds"

[system]
name = "dgx-a100"
nodes = 4

[model]
name = "gpt3-175b"
num_layers = 8

[parallel]
tensor_model_parallel_size = 8
pipeline_model_parallel_size = 2
sequence_parallel = true
overlap_grad_reduce = true

[training]
global_batch_size = 16
micro_batch_size = 1
"""


@dataclasses.dataclass
class Scenario:
    """A parsed, checked scenario (plain dicts per section, validated against the allowed keys)."""

    name: str
    system: dict[str, Any]
    model: dict[str, Any]
    parallel: dict[str, Any]
    training: dict[str, Any]
    simulation: dict[str, Any]
    description: str = ""
    source: str = ""
    overrides: tuple[str, ...] = ()
    """The ``--set`` overrides applied on top of the file (the description does not know them)."""
    trust_code: bool = True
    """Whether ``[model] factory`` may run: a scenario built in Python is code already (True); one read
    from a file (:func:`load_scenario`) is data, trusted only when asked (``--trust-code``) or shipped
    in the catalog."""

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "system": self.system, "model": self.model,
                "parallel": self.parallel, "training": self.training, "simulation": self.simulation}


UNEVEN_STAGE_KEYS = ("num_layers_in_first_pipeline_stage", "num_layers_in_last_pipeline_stage")
"""``[parallel]`` keys of an uneven pipeline split; ``"none"`` unsets one (as ``trainsim search --fix`` takes it)."""


def parallel_kwargs(parallel: dict[str, Any], training: dict[str, Any]) -> dict[str, Any]:
    """The :class:`ParallelConfig` keywords of a scenario: ``[parallel]`` and the ``[training]`` keys that
    are config fields (micro-batch 1 by default)."""
    kw = dict(parallel)
    for key in UNEVEN_STAGE_KEYS:  # TOML has no null: "none" unsets a file's uneven split from --set
        if isinstance(kw.get(key), str) and kw[key].lower() == "none":
            del kw[key]
    kw["micro_batch_size"] = training.get("micro_batch_size", 1)
    kw.update({k: training[k] for k in TRAINING_PARALLEL_KEYS[1:] if k in training})
    if sp_turned_off(parallel):  # as Megatron-LM's validate_args, which warns (scenarios.notes.parallel_notes)
        kw["sequence_parallel"] = False
    return kw


def sp_turned_off(parallel: dict[str, Any]) -> bool:
    """``sequence_parallel = true`` at ``tensor_model_parallel_size = 1``: Megatron-LM's ``validate_args``
    turns it off with a warning ("Disabling sequence parallelism because tensor model parallelism is
    disabled"), and so do scenarios -- a sweep over TP 1, 2, 4 with sequence parallelism runs its TP 1 point."""
    return parallel.get("sequence_parallel") is True and parallel.get("tensor_model_parallel_size", 1) == 1


def _check_types(section: str, data: dict, spec: dict) -> None:
    unknown = sorted(set(data) - set(spec))
    if unknown:
        raise ValueError(f"[{section}] unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(spec))}")
    for k, v in data.items():
        want = spec[k]
        types_ = want if isinstance(want, tuple) else (want,)
        # bool is an int in Python, not in a scenario: ``nodes = true`` is a mistake
        if not isinstance(v, want) or isinstance(v, bool) and bool not in types_:
            names = " or ".join("bool (true or false)" if t is bool else t.__name__ for t in types_)
            shown = str(v).lower() if isinstance(v, bool) else repr(v)
            raise ValueError(f"[{section}] {k} must be {names}, got {shown}")


def _check_finite(section: str, table: dict, prefix: str = "") -> None:
    """NaN and infinities are TOML floats but no scenario quantity: reject them, naming the key.
    ``[model] factory_args`` are the user's own and pass through unchecked."""
    for k, v in table.items():
        if section == "model" and not prefix and k == "factory_args":
            continue
        if isinstance(v, float) and not math.isfinite(v):
            raise ValueError(f"[{section}] {prefix}{k} must be a finite number, got {v}")
        if isinstance(v, dict):
            _check_finite(section, v, f"{prefix}{k}.")
        elif isinstance(v, list):
            for i, item in enumerate(v):
                if isinstance(item, float) and not math.isfinite(item):
                    raise ValueError(f"[{section}] {prefix}{k}[{i}] must be a finite number, got {item}")


def _check_ranges(system: dict, simulation: dict) -> None:
    """Bounds of the numeric ``[system]`` / ``[simulation]`` keys the fabric and runtime take as is; ``gpu``
    and ``gpu_file`` together (the GPU file used to win silently)."""
    for key in ("nodes_per_leaf", "spines", "leaves_per_pod"):
        if key in system and system[key] < 1:
            raise ValueError(f"[system] {key} must be >= 1, got {system[key]}")
    if "nccl_ib_qps_per_connection" in simulation:  # (NCCL_IB_QPS_PER_CONNECTION: 1..NCCL_IB_MAX_QPS)
        check_qps_per_connection(simulation["nccl_ib_qps_per_connection"])
    if not 0 <= simulation.get("gpu_speed_spread", 0) < 0.5:
        raise ValueError(f"[simulation] gpu_speed_spread must be in [0, 0.5) (coefficient of variation of "
                         f"per-GPU compute time), got {simulation['gpu_speed_spread']}")
    if "gpu" in system and "gpu_file" in system:  # neither may silently win over the other
        raise ValueError(f"[system] gpu = {system['gpu']!r} and gpu_file = {system['gpu_file']!r}: give one, not "
                         f"both (gpu names a known GPU; gpu_file defines one, starting from the GPU its base names)")
    if not 0 <= simulation.get("host_launch_overhead_s", 0) <= 1e-3:
        # a kernel launch costs microseconds (CUDA's launch latency, ~2-10 us): 1 ms and above is a unit slip
        raise ValueError(f"[simulation] host_launch_overhead_s must be in [0, 1e-3] seconds (a launch takes "
                         f"microseconds, e.g. 4e-6), got {simulation['host_launch_overhead_s']}")


def parse_scenario(data: dict[str, Any], source: str = "") -> Scenario:
    """Check a scenario dict (as read from TOML) and return a :class:`Scenario`.

    Raises:
        ValueError: unknown sections or keys, wrong types, missing required keys; the message names them.
    """
    unknown = sorted(set(data) - set(SECTIONS))
    if unknown:
        raise ValueError(f"unknown section(s) {', '.join(unknown)}; allowed: "
                         f"[system], [model], [parallel], [training], [simulation] (and name, description)")
    for sec in ("system", "model", "parallel", "training", "simulation"):
        if sec in data and not isinstance(data[sec], dict):
            raise ValueError(f"[{sec}] must be a table")
    system = dict(data.get("system", {}))
    model = dict(data.get("model", {}))
    parallel = dict(data.get("parallel", {}))
    training = dict(data.get("training", {}))
    simulation = dict(data.get("simulation", {}))
    _check_types("system", system, SYSTEM_KEYS)
    _check_types("training", training, TRAINING_KEYS)
    _check_types("simulation", simulation, SIMULATION_KEYS)
    for sec, table in (("system", system), ("model", model), ("parallel", parallel), ("training", training),
                       ("simulation", simulation)):
        _check_finite(sec, table)
    _check_ranges(system, simulation)
    bad = sorted(set(parallel) - PARALLEL_KEYS)
    if bad:
        moved = [k for k in TRAINING_PARALLEL_KEYS if k in bad]
        hint = f" (put {' and '.join(moved)} in [training])" if moved else ""
        raise ValueError(f"[parallel] unknown key(s) {', '.join(bad)}{hint}; "
                         f"allowed: {', '.join(sorted(PARALLEL_KEYS))}")
    if "name" not in system:
        raise ValueError("[system] name is required (e.g. dgx-a100, dgx-h100)")
    if not ({"name", "factory", "hf_config"} & set(model)):
        raise ValueError("[model] needs name (a zoo model), factory (\"package.module:function\") or hf_config")
    for key, allowed in (("mode", MODES), ("fidelity", ("flow", "step", "chunked")), ("steady_state", STEADY_STATES)):
        if simulation.get(key, allowed[0]) not in allowed:
            raise ValueError(f"[simulation] {key}: unknown {simulation[key]!r}; allowed: {', '.join(allowed)}")
    if training.get("dtype", "bf16") not in DTYPES:
        raise ValueError(f"[training] dtype: unknown {training['dtype']!r}; allowed: {', '.join(DTYPES)}")
    if "fp8_recipe" in training:
        get_recipe(training["fp8_recipe"])  # an unknown name, in one line
        if training.get("dtype", "bf16") != "fp8" and training["fp8_recipe"] != DEFAULT_RECIPE:
            raise ValueError(f"[training] fp8_recipe {training['fp8_recipe']!r} applies to dtype = 'fp8', "
                             f"got dtype {training.get('dtype', 'bf16')!r}")
    for key in ("name", "description"):
        if key in data and not isinstance(data[key], str):
            raise ValueError(f"{key} must be a string, got {data[key]!r}")
    name = data.get("name") or (Path(source).stem if source else "scenario")
    return Scenario(str(name), system, model, parallel, training, simulation, str(data.get("description", "")),
                    source)


def load_scenario(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = (), *,
                  trust_code: bool = False) -> Scenario:
    """Read a scenario file (``None``: the embedded default) and apply ``section.key=value`` overrides.

    ``trust_code``: let its ``[model] factory`` run (:func:`shipped_and_unchanged` files are trusted
    anyway; see :mod:`scenarios.user_code`).

    Raises:
        FileNotFoundError: the file does not exist.
        ValueError: malformed TOML (with the line), bad keys or values.
    """
    if path is None:
        data, source = tomllib.loads(DEFAULT_SCENARIO), "<default>"
    else:
        p = Path(path)
        data, source = read_toml_file(p), str(p)
    data = apply_overrides(data, overrides)
    sc = parse_scenario(data, source)
    sc.overrides = tuple(overrides)
    sc.trust_code = trust_code or shipped_and_unchanged(path, overrides)
    return sc


def shipped_and_unchanged(path: str | Path | None, overrides: list[str] | tuple[str, ...] = ()) -> bool:
    """Whether ``path`` is a catalog file shipped with trainsim (or the built-in default) and no
    override touches ``[model]`` factory keys: such a scenario's code is trainsim's own."""
    if any(o.split("=", 1)[0].strip().startswith("model.factory") for o in overrides):
        return False
    if path is None:
        return True
    catalog = Path(__file__).parent / "catalog"
    return Path(path).resolve().parent == catalog.resolve()


def read_toml_file(path: str | Path, what: str = "scenario file") -> dict[str, Any]:
    """A TOML file's contents.

    Raises:
        FileNotFoundError: it does not exist.
        ValueError: one line naming the file: a directory, not UTF-8 (as TOML must be), or malformed TOML.
    """
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"{what} not found: {p}")
    if p.is_dir():
        raise ValueError(f"{p} is a directory; expected a {what} (TOML)")
    try:
        return tomllib.loads(p.read_text(encoding="utf-8-sig"))  # -sig: a leading BOM is not TOML
    except UnicodeDecodeError as exc:
        raise ValueError(f"{p}: not UTF-8 text (byte {exc.start}); a {what} is TOML, which is UTF-8") from None
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{p}: malformed TOML: {exc}") from None


def apply_overrides(data: dict[str, Any], overrides: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """``["parallel.tensor_model_parallel_size=4", ...]`` applied to a copy of ``data``."""
    data = copy.deepcopy(data)
    for item in overrides:
        if "=" not in item or "." not in item.split("=", 1)[0]:
            raise ValueError(f"--set {item!r}: expected section.key=value, e.g. parallel.tensor_model_parallel_size=4")
        key, raw = item.split("=", 1)
        parts = key.strip().split(".")
        if not all(parts):
            raise ValueError(f"--set {item!r}: empty section or key; expected section.key=value")
        try:
            value = tomllib.loads(f"v = {raw}")["v"]
        except tomllib.TOMLDecodeError:
            value = raw
        node = data
        for p in parts[:-1]:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ValueError(f"--set {item!r}: {p} is not a section")
        node[parts[-1]] = value
    return data
