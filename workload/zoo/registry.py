"""The registry of model families and of the zoo's named configurations.

Each module in :data:`FAMILY_MODULES` defines ``FAMILIES`` (its :class:`~workload.zoo.family.ModelFamily`
instances) and, optionally, ``CONFIGS`` (the named configurations it publishes). Adding a family is
one new module and one line here. Modules are imported on first use (they import torch).

>>> family_of(get_model_config("llama3-8b")).name
'llama'
"""

from __future__ import annotations

import importlib
from typing import Any

from workload.zoo.family import ModelFamily

FAMILY_MODULES = (
    "workload.zoo.gpt",        # gpt: Megatron GPT / GPT-3 (SC'21 Table 1 sizes, GPT-3 175B)
    "workload.zoo.llama",      # llama, mixtral: Llama 2 / 3, Mixtral 8x7B
    "workload.zoo.bert",       # bert: BERT-large
    "workload.zoo.resnet",     # resnet: ResNet-50
    "workload.zoo.qwen3_moe",  # qwen3_moe: Qwen3-30B-A3B, Qwen3-235B-A22B
    "workload.custom",         # custom: a user's own nn.Module
)
"""Modules that define families, in registration order (Hugging Face model types are tried in it)."""

_FAMILIES: dict[str, ModelFamily] = {}
_CONFIGS: dict[str, Any] = {}


class UnknownModelError(KeyError):
    """A zoo name that does not exist; the message lists the known names."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0])


def _loaded() -> None:
    if _FAMILIES:
        return
    found: dict[str, ModelFamily] = {}
    configs: dict[str, Any] = {}
    for module_name in FAMILY_MODULES:
        module = importlib.import_module(module_name)
        for family in module.FAMILIES:
            if family.name in found:
                raise ValueError(f"model family {family.name!r} registered twice ({module_name})")
            found[family.name] = family
        for cfg in getattr(module, "CONFIGS", ()):
            if cfg.name in configs:
                raise ValueError(f"zoo model {cfg.name!r} registered twice ({module_name})")
            configs[cfg.name] = cfg
    _CONFIGS.update(configs)
    _FAMILIES.update(found)  # last: a failed import leaves the registry empty, to be retried


def families() -> dict[str, ModelFamily]:
    """Every family by name, in registration order."""
    _loaded()
    return dict(_FAMILIES)


def family_of(cfg: Any) -> ModelFamily:
    """The family of a configuration, by its ``architecture``.

    Raises:
        ValueError: the configuration names no registered family (listing them).
    """
    _loaded()
    arch = getattr(cfg, "architecture", None)
    if not isinstance(arch, str) or arch not in _FAMILIES:
        raise ValueError(f"{getattr(cfg, 'name', 'model')}: architecture {arch!r} is no model family; "
                         f"families: {', '.join(_FAMILIES)}")
    return _FAMILIES[arch]


def hf_family(model_type: str) -> ModelFamily | None:
    """The family that reads Hugging Face configs of ``model_type``, or ``None``."""
    _loaded()
    return next((f for f in _FAMILIES.values() if model_type in f.hf_model_types), None)


def hf_model_types() -> list[str]:
    """Every Hugging Face ``model_type`` some family reads, in registration order."""
    _loaded()
    return [t for f in _FAMILIES.values() for t in f.hf_model_types]


def known_models() -> list[str]:
    """Names accepted by :func:`get_model_config`, sorted."""
    _loaded()
    return sorted(_CONFIGS)


def get_model_config(name: str) -> Any:
    """The configuration of a zoo model.

    Raises:
        UnknownModelError: listing the known names.
    """
    _loaded()
    try:
        return _CONFIGS[name]
    except KeyError:
        raise UnknownModelError(f"unknown model {name!r}; known models: {', '.join(known_models())}") from None


__all__ = ["FAMILY_MODULES", "UnknownModelError", "families", "family_of", "get_model_config", "hf_family",
           "hf_model_types", "known_models"]
