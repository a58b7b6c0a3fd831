"""The model zoo: named configurations and the torch modules that build them on the meta device.

>>> from workload.zoo import build_model, get_model_config
>>> get_model_config("gpt3-175b").hidden_size
12288
>>> model = build_model("llama3-8b", seq_length=4096)   # on torch.device("meta"): no memory

Sources: Megatron GPT sizes from Narayanan et al. SC'21 (arXiv:2104.04473) Table 1 (vocabulary 51200,
sequence 2048); GPT-3 175B from Brown et al. 2020 (arXiv:2005.14165) Table 2.1; Llama 2 from
Touvron et al. 2023 (arXiv:2307.09288) and the released ``params.json``; Llama 3 / 3.1 from Dubey et
al. 2024 (arXiv:2407.21783) Table 3; Mixtral from Jiang et al. 2024 (arXiv:2401.04088) Table 1;
BERT-large from Devlin et al. 2018; ResNet-50 from He et al. 2016 Table 1.
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

__all__ = [
    "ModelConfig", "ResNetConfig", "TransformerConfig", "UnknownModelError", "build_model",
    "build_model_from_config", "config_from_hf", "get_model_config", "known_models", "padded_vocab_size",
    "validate_tensor_parallel", "with_overrides",
]


class UnknownModelError(KeyError):
    """A zoo name that does not exist; the message lists the known names."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0])


_SC21 = "Narayanan et al. SC'21 (arXiv:2104.04473) Table 1"
# (name, published params in billions, heads, hidden, layers): SC'21 Table 1, weak-scaling rows.
_SC21_TABLE1 = [
    ("gpt-1.7b", 1.7, 24, 2304, 24), ("gpt-3.6b", 3.6, 32, 3072, 30), ("gpt-7.5b", 7.5, 32, 4096, 36),
    ("gpt-18b", 18.4, 48, 6144, 40), ("gpt-39b", 39.1, 64, 8192, 48), ("gpt-76b", 76.1, 80, 10240, 60),
    ("gpt-145b", 145.6, 96, 12288, 80), ("gpt-310b", 310.1, 128, 16384, 96),
    ("gpt-530b", 529.6, 128, 20480, 105), ("gpt-1t", 1008.0, 160, 25600, 128),
]


def _gpt(name: str, params: float, heads: int, hidden: int, layers: int, source: str) -> TransformerConfig:
    return TransformerConfig(name=name, architecture="gpt", num_layers=layers, hidden_size=hidden,
                             num_attention_heads=heads, seq_length=2048, vocab_size=51200,
                             published_params=params, source=source)


def _llama(name: str, params: float, layers: int, hidden: int, heads: int, kv: int, ffn: int, vocab: int,
           seq: int, theta: float, source: str, **kw) -> TransformerConfig:
    return TransformerConfig(
        name=name, architecture="mixtral" if kw.get("num_moe_experts") else "llama", num_layers=layers,
        hidden_size=hidden, num_attention_heads=heads, num_query_groups=kv, ffn_hidden_size=ffn,
        seq_length=seq, vocab_size=vocab, normalization="RMSNorm", activation="swiglu",
        position_embedding_type="rope", rotary_base=theta, untie_embeddings_and_output_weights=True,
        add_bias_linear=False, published_params=params, source=source, **kw)


_L2, _L3 = "Touvron et al. 2023 (arXiv:2307.09288)", "Dubey et al. 2024 (arXiv:2407.21783) Table 3"
_CONFIGS: dict[str, ModelConfig] = {c.name: c for c in [
    *(_gpt(*row, source=_SC21) for row in _SC21_TABLE1),
    _gpt("gpt3-175b", 175.0, 96, 12288, 96, "Brown et al. 2020 (arXiv:2005.14165) Table 2.1"),
    _llama("llama2-7b", 6.74, 32, 4096, 32, 32, 11008, 32000, 4096, 1e4, _L2),
    _llama("llama2-13b", 13.0, 40, 5120, 40, 40, 13824, 32000, 4096, 1e4, _L2),
    _llama("llama2-70b", 69.0, 80, 8192, 64, 8, 28672, 32000, 4096, 1e4, _L2),
    _llama("llama3-8b", 8.03, 32, 4096, 32, 8, 14336, 128256, 8192, 5e5, _L3),
    _llama("llama3-70b", 70.6, 80, 8192, 64, 8, 28672, 128256, 8192, 5e5, _L3),
    _llama("llama3-405b", 405.9, 126, 16384, 128, 8, 53248, 128256, 8192, 5e5, _L3),
    _llama("mixtral-8x7b", 46.7, 32, 4096, 32, 8, 14336, 32000, 4096, 1e6,
           "Jiang et al. 2024 (arXiv:2401.04088) Table 1", num_moe_experts=8, moe_router_topk=2),
    TransformerConfig(name="bert-large", architecture="bert", num_layers=24, hidden_size=1024,
                      num_attention_heads=16, seq_length=512, vocab_size=30522, causal=False,
                      num_tokentypes=2, norm_epsilon=1e-12, published_params=0.34,
                      source="Devlin et al. 2018 (arXiv:1810.04805)"),
    ResNetConfig(name="resnet-50", published_params=0.0256, source="He et al. 2016 (arXiv:1512.03385)"),
]}


def known_models() -> list[str]:
    """Names accepted by :func:`get_model_config` and :func:`build_model`, sorted."""
    return sorted(_CONFIGS)


def get_model_config(name: str) -> ModelConfig:
    """The configuration of a zoo model.

    Raises:
        UnknownModelError: listing the known names.
    """
    try:
        return _CONFIGS[name]
    except KeyError:
        raise UnknownModelError(f"unknown model {name!r}; known models: {', '.join(known_models())}") from None


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
    """Instantiate the module for a configuration (``cfg.architecture`` picks the class).

    Args:
        tensor_parallel: a :class:`workload.parallel.tp.TPContext`: build ONE tensor-parallel rank's
            shard (heads, FFN and vocabulary divided; collectives left in the traced graph).
        expert_model_parallel_size: MoE experts per rank = num_moe_experts / this.

    Raises:
        ValueError: the parallel sizes do not divide the model (naming both numbers), or the
            architecture does not support them (ResNet-50 is data-parallel only).
    """
    from workload.zoo.bert import Bert
    from workload.zoo.gpt import GPT
    from workload.zoo.llama import Llama
    from workload.zoo.resnet import ResNet

    tp = tensor_parallel
    ep = expert_model_parallel_size
    arch = cfg.architecture
    with torch.device(device):
        if arch == "resnet":
            if (tp is not None and tp.size > 1) or ep > 1:
                raise ValueError(f"{cfg.name}: ResNet supports data parallelism only "
                                 f"(tensor_model_parallel_size and expert_model_parallel_size must be 1)")
            model = ResNet(cfg)
        elif arch in ("llama", "mixtral"):
            model = Llama(cfg, tp, ep) if tp is not None else Llama(cfg, ep=ep)
        else:
            if ep > 1:
                raise ValueError(f"{cfg.name}: expert_model_parallel_size={ep} needs a MoE model")
            cls = {"gpt": GPT, "bert": Bert}[arch]
            model = cls(cfg, tp) if tp is not None else cls(cfg)
    return model.to(dtype) if dtype is not None else model
