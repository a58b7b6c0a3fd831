"""The model zoo: named configurations and the torch modules that build them on the meta device.

>>> from workload.zoo import build_model, get_model_config
>>> get_model_config("gpt3-175b").hidden_size
12288
>>> model = build_model("llama3-8b", seq_length=4096)   # on torch.device("meta"): no memory

Each model family (:mod:`workload.zoo.family`) lives in its own module with its named
configurations and their sources; :mod:`workload.zoo.registry` lists them.
"""

from __future__ import annotations

import torch
from torch import nn

from workload.zoo.config import (
    ModelConfig,
    ResNetConfig,
    TransformerConfig,
    padded_vocab_size,
    validate_tensor_parallel,
    with_overrides,
)
from workload.zoo.hf import config_from_hf
from workload.zoo.registry import UnknownModelError, family_of, get_model_config, known_models

__all__ = [
    "ModelConfig", "ResNetConfig", "TransformerConfig", "UnknownModelError", "build_model",
    "build_model_from_config", "config_from_hf", "family_of", "get_model_config", "known_models",
    "padded_vocab_size", "validate_tensor_parallel", "with_overrides",
]


def build_model(name: str, *, device: str | torch.device = "meta", dtype: torch.dtype | None = None,
                **overrides) -> nn.Module:
    """Build a zoo model (on the meta device by default), with config fields overridden by keyword.

    >>> build_model("gpt3-175b", num_layers=2, seq_length=4096)

    Raises:
        UnknownModelError: unknown ``name``.
        ValueError: an override is not a config field, or makes the config invalid.
    """
    cfg = get_model_config(name)
    if overrides:
        cfg = with_overrides(cfg, **overrides)
    return build_model_from_config(cfg, device=device, dtype=dtype)


def build_model_from_config(cfg: ModelConfig, *, device: str | torch.device = "meta",
                            dtype: torch.dtype | None = None, tensor_parallel=None,
                            expert_model_parallel_size: int = 1) -> nn.Module:
    """Instantiate the module for a configuration (its family, ``cfg.architecture``, builds it).

    Args:
        tensor_parallel: a :class:`workload.parallel.tp.TPContext`: build ONE tensor-parallel rank's
            shard (heads, FFN and vocabulary divided; collectives left in the traced graph).
        expert_model_parallel_size: MoE experts per rank = num_moe_experts / this.

    Raises:
        ValueError: the parallel sizes do not divide the model (naming both numbers), or the
            family does not support them (ResNet-50 is data-parallel only).
    """
    with torch.device(device):
        model = family_of(cfg).build(cfg, tp=tensor_parallel, ep=expert_model_parallel_size)
    return model.to(dtype) if dtype is not None else model
