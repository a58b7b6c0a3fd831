"""The steps ``calibrate`` and ``compare`` share: resolve the scenario, read and pair the trace, simulate."""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from typing import Any

from hwmodel.calibration_overlay import Overlay, applied
from hwmodel.costmodel import KernelCostModel
from scenarios.calibrate import CalibrationInputError
from scenarios.calibrate.kineto import KinetoTrace, read_kineto
from scenarios.calibrate.matcher import Matching, check_same_model, graph_tasks, match


@dataclass
class Paired:
    """A scenario prepared, its trace read and paired."""

    prep: Any
    trace: KinetoTrace
    matching: Matching
    model: KernelCostModel
    """A cost model of the scenario's GPU, as the simulator prices training (``sustained=True``)."""


def trace_gpu(name: str) -> str | None:
    """trainsim's GPU name for a ``deviceProperties`` name (``Tesla V100-SXM2-32GB`` -> ``V100-SXM2``),
    ``None`` if it is not a known GPU."""
    from hwmodel.specs import get_gpu

    key = re.sub(r"^(nvidia|tesla)\s+", "", name.strip().lower())
    key = re.sub(r"^(nvidia|tesla)\s+", "", key).replace(" ", "-")
    try:
        return str(get_gpu(key).name)
    except (KeyError, ValueError):
        return None


def pair_trace(trace_path: str, scenario: Any) -> Paired:
    """Prepare ``scenario``, read ``trace_path`` and pair its steady step with rank 0's program.

    Raises:
        CalibrationInputError: an unreadable or non-Kineto trace, a trace of another GPU or model.
    """
    from scenarios.runner import prepare
    from workload.parallel.builder import build_programs

    trace = read_kineto(trace_path)
    prep = prepare(scenario)
    gpu = prep.topology.gpu_spec
    known = trace_gpu(trace.gpu_name) if trace.gpu_name else None
    if known is not None and known != gpu.name:
        raise CalibrationInputError(f"{trace_path}: traced on {trace.gpu_name} ({known}); the scenario "
                                    f"{scenario.name} runs on {gpu.name}: give a scenario on the traced GPU")
    family = gpu.name.split("-")[0].lower()  # "V100" of V100-SXM2: an unknown board of the same GPU passes
    if trace.gpu_name and known is None and family not in trace.gpu_name.lower():
        raise CalibrationInputError(f"{trace_path}: traced on {trace.gpu_name!r}, a GPU trainsim does not know and "
                                    f"not a {gpu.name.split('-')[0]}; the scenario {scenario.name} runs on "
                                    f"{gpu.name}: give a scenario on the traced GPU (trainsim list gpus)")
    if trace.gpu_name and known is None:
        print(f"note: {trace_path}: GPU {trace.gpu_name!r} is not one trainsim knows; fitting to {gpu.name}",
              file=sys.stderr)
    build = build_programs(prep.trace, prep.config, ranks=[0])
    matching = match(trace, graph_tasks(build.programs))
    check_same_model(matching, trace_path, getattr(prep.model_cfg, "name", scenario.name))
    return Paired(prep, trace, matching, KernelCostModel(gpu, sustained=True))


def simulate(prep: Any, overlay: Overlay | None) -> float:
    """The simulated iteration time of ``prep`` with ``overlay`` applied, seconds."""
    from scenarios.runner import memory_for, run_prepared

    with applied(overlay):
        return float(run_prepared(prep, memory_for(prep)).metrics["iteration_time_s"])
