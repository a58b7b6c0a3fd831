"""Read a Hugging Face ``config.json`` into a :class:`~workload.zoo.config.TransformerConfig`.

A local ``config.json`` (path or already-parsed dict) needs nothing extra. A Hub id or a model
directory goes through ``transformers.AutoConfig`` (the optional ``hf`` extra:
``pip install 'trainsim[hf]'``), imported only then. Each model family reads its own
``model_type`` s (:attr:`workload.zoo.family.ModelFamily.hf_model_types`;
:func:`workload.zoo.registry.hf_model_types` lists them all). Attention keys: ``sliding_window`` (null:
none), ``layer_types`` / ``sliding_window_pattern`` (which layers are local), BLOOM's ALiBi and
``word_embeddings_layernorm`` (``model_type = "bloom"``) map to the ``[model]`` keys of the same idea;
``head_dim`` is read by the Llama and Qwen3 families and refused, where it is not hidden / heads, by the others.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from workload.zoo.config import TransformerConfig
from workload.zoo.registry import hf_family, hf_model_types


def config_from_hf(source: str | os.PathLike | dict[str, Any], *, name: str | None = None,
                   seq_length: int | None = None) -> TransformerConfig:
    """Map HF config fields to Megatron names (``num_hidden_layers`` -> ``num_layers``, ...).

    A path ending in ``.json``, or an existing directory holding a ``config.json``, is read as a file
    (a missing ``.json`` file raises FileNotFoundError); anything else is a Hub id.

    Raises:
        FileNotFoundError: a ``.json`` path that does not exist.
        ImportError: ``source`` needs ``transformers`` and it is not installed.
        ValueError: malformed JSON (naming the file), an unsupported ``model_type``, missing fields, or
            a field of the wrong type (naming the Hugging Face key).
    """
    where = "Hugging Face config"
    if isinstance(source, dict):
        d = source
    elif str(source).endswith(".json") or (Path(source) / "config.json").is_file():
        path = Path(source) if str(source).endswith(".json") else Path(source) / "config.json"
        if path.is_dir() or not path.exists():
            raise FileNotFoundError(f"Hugging Face config file not found: {path}")
        where = f"Hugging Face config {path}"
        try:
            with path.open(encoding="utf-8") as f:
                d = json.load(f)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ValueError(f"{where}: malformed JSON: {e}") from None
        if not isinstance(d, dict):
            raise ValueError(f"{where}: expected a JSON object, got {type(d).__name__}")
    else:
        try:
            from transformers import AutoConfig
        except ImportError as e:
            raise ImportError(f"reading {source!r} needs the optional 'transformers' package: "
                              f"pip install 'trainsim[hf]' (or pass the path of a config.json)") from e
        d = AutoConfig.from_pretrained(str(source)).to_dict()
    mt = d.get("model_type", "")
    name = name or d.get("_name_or_path") or mt or "hf-model"
    _check_hf_types(d, where)
    family = hf_family(mt)
    if family is None:
        raise ValueError(f"unsupported Hugging Face model_type {mt!r}; supported: {', '.join(hf_model_types())}")
    check_hf_positive_ints(d, where, family.hf_positive_ints)
    try:
        cfg = family.from_hf(d, name=name, seq_length=seq_length)
    except KeyError as e:
        raise ValueError(f"{where} for {name!r} (model_type={mt!r}) lacks field {e}") from None
    head_dim = d.get("head_dim")  # Mistral-Nemo, Gemma: heads narrower or wider than hidden / heads
    if isinstance(head_dim, int) and getattr(cfg, "kv_channels", head_dim) != head_dim:
        raise ValueError(f"{where}: head_dim = {head_dim} differs from hidden_size / num_attention_heads = "
                         f"{cfg.kv_channels}, which the {family.name} family builds; not supported for "
                         f"model_type {mt!r}")
    return cfg


_HF_POSITIVE_INTS = ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads",
                     "intermediate_size", "vocab_size", "max_position_embeddings", "num_local_experts",
                     "num_experts_per_tok", "n_layer", "n_embd", "n_head", "n_inner", "n_positions", "n_embed",
                     "sliding_window", "sliding_window_pattern", "head_dim")
_HF_NUMBERS = ("rope_theta", "rms_norm_eps", "layer_norm_epsilon", "layer_norm_eps")


def _check_hf_types(d: dict[str, Any], where: str) -> None:
    """The sizes trainsim reads must be positive integers (``null`` where optional), the others numbers.

    Raises:
        ValueError: one line naming the Hugging Face key, what it must be and the value.
    """
    check_hf_positive_ints(d, where, _HF_POSITIVE_INTS)
    for key in _HF_NUMBERS:
        v = d.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0):
            raise ValueError(f"{where}: {key} must be a positive number, got {v!r}")
    v = d.get("type_vocab_size")
    if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
        raise ValueError(f"{where}: type_vocab_size must be an integer >= 0, got {v!r}")


def check_hf_positive_ints(d: dict[str, Any], where: str, keys: tuple[str, ...]) -> None:
    """Each of ``keys`` present in ``d`` is a positive integer (or ``null``).

    Raises:
        ValueError: one line naming the Hugging Face key and the value.
    """
    for key in keys:
        v = d.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v <= 0):
            raise ValueError(f"{where}: {key} must be a positive integer, got {v!r}")
