"""Llama 2 / Llama 3 (and Mixtral, with MoE MLPs), nanoGPT layout.

Pre-RMSNorm blocks, rotary position embeddings, grouped-query attention (``num_query_groups`` KV
heads, each ``head_dim`` wide: QKV ``h -> (a + 2g)*d``, output projection ``a*d -> h``, with ``a*d``
not necessarily h), SwiGLU MLP (Shazeer 2020, arXiv:2002.05202) with a fused gate/up projection as
Megatron's ``fc1``, no biases, separate output layer. Touvron et al. 2023 (arXiv:2307.09288), Dubey et al. 2024
(arXiv:2407.21783), Jiang et al. 2024 (arXiv:2401.04088).

Shapes: B micro-batch, T sequence, C hidden, F ffn_hidden_size, V vocabulary.
"""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from workload.parallel.tp import ColumnParallelLinear, RowParallelLinear, TPContext
from workload.zoo.config import TransformerConfig
from workload.zoo.family import ModelFamily
from workload.zoo.gpt import (
    SERIAL,
    SelfAttention,
    VocabParallelEmbedding,
    dropout,
    set_attention_patterns,
    vocab_parallel_loss,
)
from workload.zoo.moe import MoE


class RMSNorm(nn.Module):
    """RMSNorm (Zhang & Sennrich 2019); traced as one fused ``aten._fused_rms_norm`` kernel."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


class SwiGLU(nn.Module):
    """down(silu(gate(x)) * up(x)); gate and up fused into one (C -> 2F/tp) column-parallel GEMM, or with
    ``separate_projections`` torchtitan's ``w2(silu(w1(x)) * w3(x))`` (w1 gate, w3 up, w2 down)."""

    def __init__(self, cfg: TransformerConfig, tp: TPContext = SERIAL) -> None:
        super().__init__()
        self.tp = tp
        self.separate = bool(cfg.separate_projections)
        if self.separate:
            self.w1 = ColumnParallelLinear(cfg.hidden_size, cfg.ffn_hidden_size, tp, bias=False)
            self.w3 = ColumnParallelLinear(cfg.hidden_size, cfg.ffn_hidden_size, tp, bias=False)
        else:
            self.fc1 = ColumnParallelLinear(cfg.hidden_size, 2 * cfg.ffn_hidden_size, tp, bias=False)
        self.fc2 = RowParallelLinear(cfg.ffn_hidden_size, cfg.hidden_size, tp, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.tp.enter(x)  # (B, T, C)
        if self.separate:
            return self.tp.leave(self.fc2(F.silu(self.w1(x)) * self.w3(x)))  # (B, T, C)
        gate, up = self.fc1(x).chunk(2, dim=-1)  # (B, T, F/tp) each
        return self.tp.leave(self.fc2(F.silu(gate) * up))  # (B, T, C)


class LlamaBlock(nn.Module):
    def __init__(self, cfg: TransformerConfig, tp: TPContext = SERIAL, ep: int = 1) -> None:
        super().__init__()
        self.p = cfg.hidden_dropout
        self.attn_norm = RMSNorm(cfg.hidden_size, cfg.norm_epsilon)
        self.attn = SelfAttention(cfg, tp)
        self.mlp_norm = RMSNorm(cfg.hidden_size, cfg.norm_epsilon)
        self.mlp = MoE(cfg, tp, ep) if cfg.num_moe_experts else SwiGLU(cfg, tp)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, ...] | None) -> torch.Tensor:
        x = x + dropout(self.attn(self.attn_norm(x), rope), self.p)  # (B, T/tp with SP, C)
        return x + dropout(self.mlp(self.mlp_norm(x)), self.p)


def rope_tables(seq_len: int, head_dim: int, base: float, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin tables, each (T, hs/2), for :func:`workload.zoo.gpt.apply_rope`."""
    inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(seq_len, device=device, dtype=torch.float32), inv_freq)
    return angles.cos(), angles.sin()


class Llama(nn.Module):
    """Llama / Mixtral language model; ``forward(idx, targets)`` returns the mean cross-entropy loss.

    ``block_type`` is the decoder block; a family with Llama's embedding, RoPE (over ``kv_channels``),
    final norm and output layer subclasses this and sets its own block."""

    block_type: type[nn.Module] = LlamaBlock

    def __init__(self, cfg: TransformerConfig, tp: TPContext = SERIAL, ep: int = 1) -> None:
        super().__init__()
        self.config = cfg
        self.tp = tp
        self.tok_embeddings = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size, tp)  # (V/tp, C)
        self.embedding_norm = None
        if cfg.embedding_layernorm:
            self.embedding_norm = (RMSNorm(cfg.hidden_size, cfg.norm_epsilon) if cfg.normalization == "RMSNorm"
                                   else nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_epsilon))
        self.layers = nn.ModuleList(self.block_type(cfg, tp, ep) for _ in range(cfg.num_layers))
        set_attention_patterns(self.layers, cfg)
        self.norm = RMSNorm(cfg.hidden_size, cfg.norm_epsilon)
        self.output = ColumnParallelLinear(cfg.hidden_size, cfg.vocab_size, tp, bias=False)  # (V/tp, C)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        B, T = idx.shape
        x = self.tok_embeddings(idx)  # (B, T/tp with SP, C)
        if self.embedding_norm is not None:
            x = self.embedding_norm(x)
        rope: tuple[torch.Tensor, ...] | None = None  # ALiBi (a bias in the attention kernel) or no positions
        if self.config.position_embedding_type not in ("alibi", "none"):
            cos, sin = rope_tables(T, self.config.kv_channels, self.config.rotary_base, idx.device)
            # torchtitan's precomputed complex64 freqs_cis, or (cos, sin) in the training dtype
            rope = (torch.complex(cos, sin),) if self.config.rotary_complex else (cos.to(x.dtype), sin.to(x.dtype))
        for block in self.layers:
            x = block(x, rope)
        return vocab_parallel_loss(self.norm(x), self.output.weight, targets, self.tp)

    def example_inputs(self, micro_batch_size: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        """(idx, targets), each (B, s) int64 on the model's device."""
        device = self.output.weight.device
        shape = (micro_batch_size, self.config.seq_length)
        return (torch.randint(0, self.config.vocab_size, shape, device=device),
                torch.randint(0, self.config.vocab_size, shape, device=device))



# --------------------------------------------------------------------------------------------------
# The families (dense Llama; Mixtral, the same module with MoE MLPs) and their named configurations
# --------------------------------------------------------------------------------------------------

class LlamaFamily(ModelFamily):
    """Llama 2 / 3 (dense). FLOPs traced; memory from the Korthikanti closed forms (SwiGLU, GQA, ``head_dim``)."""

    name = "llama"
    activations = ("swiglu",)
    config_type = TransformerConfig
    hf_model_types: ClassVar[tuple[str, ...]] = ("llama", "mistral", "mixtral")

    def build(self, cfg: TransformerConfig, *, tp: TPContext | None = None, ep: int = 1) -> nn.Module:
        self.check_sizes(cfg, ep=ep)
        return Llama(cfg, tp, ep) if tp is not None else Llama(cfg, ep=ep)

    def from_hf(self, d: dict, *, name: str, seq_length: int | None) -> TransformerConfig:
        """``llama``, ``mistral`` and ``mixtral`` configs (``num_local_experts`` makes it Mixtral); a
        non-null ``sliding_window`` (Mistral 7B v0.1: 4096) is the window of every layer (Hugging Face's
        ``layer_types``, when given, says which layers are ``"sliding_attention"``); ``head_dim``, when
        given, is the head width even where it is not ``hidden_size / num_attention_heads`` (Mistral-Nemo
        12B: 128, not 5120 / 32 = 160)."""
        experts = d.get("num_local_experts")
        seq = seq_length or min(d.get("max_position_embeddings", 4096), 8192)
        window = hf_window_keys(d)
        return TransformerConfig(
            name=name, architecture="mixtral" if experts else "llama",
            num_layers=d["num_hidden_layers"], hidden_size=d["hidden_size"],
            num_attention_heads=d["num_attention_heads"],
            num_query_groups=d.get("num_key_value_heads") or d["num_attention_heads"], head_dim=d.get("head_dim"),
            ffn_hidden_size=d["intermediate_size"], seq_length=seq, vocab_size=d["vocab_size"],
            max_position_embeddings=d.get("max_position_embeddings", seq), normalization="RMSNorm",
            activation="swiglu", position_embedding_type="rope", rotary_base=d.get("rope_theta", 1e4),
            untie_embeddings_and_output_weights=not d.get("tie_word_embeddings", False),
            add_bias_linear=False, norm_epsilon=d.get("rms_norm_eps", 1e-5), num_moe_experts=experts,
            moe_router_topk=d.get("num_experts_per_tok", 2), source="Hugging Face config.json", **window)


def hf_window_keys(d: dict) -> dict:
    """``sliding_window`` / ``window_layers`` / ``sliding_window_pattern`` of a Hugging Face config:
    ``sliding_window`` when not null (and not switched off by Qwen2's ``use_sliding_window: false``),
    the layers ``layer_types`` marks ``"sliding_attention"``, or Gemma 3's ``sliding_window_pattern``."""
    window = d.get("sliding_window")
    if window is None or d.get("use_sliding_window") is False:
        return {}
    keys: dict = {"sliding_window": window}
    if isinstance(d.get("layer_types"), list):
        keys["window_layers"] = tuple(i for i, t in enumerate(d["layer_types"]) if t == "sliding_attention")
    elif d.get("sliding_window_pattern"):
        keys["sliding_window_pattern"] = d["sliding_window_pattern"]
    return keys


class MixtralFamily(LlamaFamily):
    """Mixtral: Llama blocks with top-k routed SwiGLU experts (:class:`workload.zoo.moe.MoE`)."""

    name = "mixtral"
    hf_model_types = ()  # read by LlamaFamily.from_hf


def _llama(name: str, params: float, layers: int, hidden: int, heads: int, kv: int, ffn: int, vocab: int,
           seq: int, theta: float, source: str, **kw) -> TransformerConfig:
    return TransformerConfig(
        name=name, architecture="mixtral" if kw.get("num_moe_experts") else "llama", num_layers=layers,
        hidden_size=hidden, num_attention_heads=heads, num_query_groups=kv, ffn_hidden_size=ffn,
        seq_length=seq, vocab_size=vocab, normalization="RMSNorm", activation="swiglu",
        position_embedding_type="rope", rotary_base=theta, untie_embeddings_and_output_weights=True,
        add_bias_linear=False, published_params=params, source=source, **kw)


_L2, _L3 = "Touvron et al. 2023 (arXiv:2307.09288)", "Dubey et al. 2024 (arXiv:2407.21783) Table 3"
FAMILIES = (LlamaFamily(), MixtralFamily())
CONFIGS = (
    _llama("llama2-7b", 6.74, 32, 4096, 32, 32, 11008, 32000, 4096, 1e4, _L2),
    _llama("llama2-13b", 13.0, 40, 5120, 40, 40, 13824, 32000, 4096, 1e4, _L2),
    _llama("llama2-70b", 69.0, 80, 8192, 64, 8, 28672, 32000, 4096, 1e4, _L2),
    _llama("llama3-8b", 8.03, 32, 4096, 32, 8, 14336, 128256, 8192, 5e5, _L3),
    _llama("llama3-70b", 70.6, 80, 8192, 64, 8, 28672, 128256, 8192, 5e5, _L3),
    _llama("llama3-405b", 405.9, 126, 16384, 128, 8, 53248, 128256, 8192, 5e5, _L3),
    _llama("mistral-7b", 7.24, 32, 4096, 32, 8, 14336, 32000, 8192, 1e4,
           "Jiang et al. 2023 (arXiv:2310.06825) Table 1 (window 4096, context 8192)", sliding_window=4096),
    _llama("mistral-nemo-12b", 12.2, 40, 5120, 32, 8, 14336, 131072, 8192, 1e6,
           "Hugging Face mistralai/Mistral-Nemo-Base-2407 config.json and model card (head_dim 128: a*d = 4096 "
           "< h = 5120; 12.2B parameters)", head_dim=128),
    _llama("mixtral-8x7b", 46.7, 32, 4096, 32, 8, 14336, 32000, 4096, 1e6,
           "Jiang et al. 2024 (arXiv:2401.04088) Table 1", num_moe_experts=8, moe_router_topk=2),
)
"""Llama 2 from Touvron et al. 2023 (arXiv:2307.09288) and the released ``params.json``; Llama 3 / 3.1
from Dubey et al. 2024 (arXiv:2407.21783) Table 3; Mistral 7B (v0.1, sliding window 4096) from Jiang
et al. 2023 (arXiv:2310.06825) Table 1; Mistral-Nemo 12B (its heads 128 wide, not h / a = 160) from its
Hugging Face ``config.json``; Mixtral from Jiang et al. 2024 (arXiv:2401.04088) Table 1."""
