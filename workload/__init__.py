"""Workloads: tracing torch modules into op graphs (:mod:`workload.trace`), the model zoo
(:mod:`workload.zoo`), and (elsewhere in the package) memory and parallel strategies.

Names are re-exported lazily so that ``import workload.<sub>`` does not import torch unless needed.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "OpGraph": "workload.trace", "OpRecord": "workload.trace", "TraceError": "workload.trace",
    "FactoryError": "scenarios.user_code", "trace_model": "workload.trace", "load_factory": "scenarios.user_code",
    "build_model": "workload.zoo", "get_model_config": "workload.zoo", "known_models": "workload.zoo",
    "UnknownModelError": "workload.zoo", "validate_tensor_parallel": "workload.zoo",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'workload' has no attribute {name!r}")
