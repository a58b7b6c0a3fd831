"""Tracing one training step of a torch module into an :class:`OpGraph`, on the meta device.

One idea per module: :mod:`~workload.trace.graph` (the op graph), :mod:`~workload.trace.kinds`
(aten op -> kernel kind, shapes, bytes), :mod:`~workload.trace.fused_ops` (fused RMSNorm/dropout
custom ops), :mod:`~workload.trace.reroutes` (SDPA, MHA, RMSNorm, dropout reroutes),
:mod:`~workload.trace.recorder` (the dispatch recorder), :mod:`~workload.trace.tracker` (which module
an op runs in), :mod:`~workload.trace.blocks` (layer dedup), :mod:`~workload.trace.assemble` (cloning
the traced block into the graph), :mod:`~workload.trace.saved` (saved-tensor accounting),
:mod:`~workload.trace.optimizer` (the AdamW phase), :mod:`~workload.trace.masked_attention` (sliding
windows, sinks, ALiBi as one fused attention call) and :mod:`~workload.trace.api`
(:func:`trace_model`, the recipe).
"""

from __future__ import annotations

import importlib
from typing import Any

from workload.trace.api import trace_model
from workload.trace.blocks import block_path, repeated_blocks, submodule
from workload.trace.errors import TraceError
from workload.trace.graph import OpGraph, OpRecord
from workload.trace.kinds import dtype_name

# Earlier private names, still imported by callers.
_repeated_blocks = repeated_blocks
_submodule = submodule

# User-file loading is input handling and lives in the scenario layer; resolved on first use so that
# importing the tracer does not import the scenarios package.
_MOVED = {"FactoryError": "scenarios.user_code", "load_factory": "scenarios.user_code"}

__all__ = [
    "FactoryError", "OpGraph", "OpRecord", "TraceError", "block_path", "dtype_name", "load_factory",
    "repeated_blocks", "submodule", "trace_model",
]


def __getattr__(name: str) -> Any:
    if name in _MOVED:
        return getattr(importlib.import_module(_MOVED[name]), name)
    raise AttributeError(f"module 'workload.trace' has no attribute {name!r}")
