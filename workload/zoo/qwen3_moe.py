"""Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B): Llama-style MoE decoder with QK-norm and a wide head.

Differences from Mixtral (:mod:`workload.zoo.llama`): the head width ``head_dim`` (128) is not
``hidden_size / num_attention_heads`` (2048 / 32 = 64 for 30B-A3B), so the query projection is wider than
the model (h -> a·head_dim = 4096 -> h); RMSNorm on each head's query and key before RoPE (QK-norm, one
``head_dim`` weight each, shared by the heads); many small experts (128, 8 active, ``ffn_hidden_size`` =
the per-expert ``moe_intermediate_size``), every layer sparse, no shared expert; untied output layer.
The router is Mixtral's (softmax, top-k, renormalised: ``norm_topk_prob = true``).

Sources: the Hugging Face ``config.json`` of ``Qwen/Qwen3-30B-A3B`` and ``Qwen/Qwen3-235B-A22B``
(``model_type = "qwen3_moe"``; the same as Megatron arguments in slime's ``scripts/models/qwen3-30B-A3B.sh``
and ``qwen3-235B-A22B.sh``: ``--kv-channels 128 --qk-layernorm --num-query-groups 4 --num-experts 128
--moe-router-topk 8 --moe-ffn-hidden-size 768`` / ``1536``); the architecture table of the Qwen3
technical report (Yang et al. 2025, arXiv:2505.09388); the totals from the model cards (30.5B total,
3.3B activated; 235B, 22B). Training sequence 4096 (the report's pre-training stages 1-2).

Shapes: B micro-batch, T sequence, C hidden, nh query heads, nkv key/value heads, hs = head_dim.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from workload.parallel.tp import TPContext
from workload.zoo.config import TransformerConfig
from workload.zoo.family import ModelFamily
from workload.zoo.gpt import SERIAL, SelfAttention, apply_rope, apply_rope_complex, dropout, repeat_kv
from workload.zoo.llama import Llama, RMSNorm
from workload.zoo.moe import MoE


@dataclass(frozen=True, kw_only=True, slots=True)
class Qwen3MoEConfig(TransformerConfig):
    """A Qwen3-MoE decoder: :class:`TransformerConfig` (Megatron names; ``ffn_hidden_size`` is the
    per-expert width) plus the head width and QK-norm."""

    # A field's Literal is what a user may give for that class (check_field_types validates input
    # against it), so a family subclass names only itself: outside the base set by design.
    architecture: Literal["qwen3_moe"] = "qwen3_moe"  # type: ignore[assignment]
    head_dim: int | None = 128
    """:attr:`TransformerConfig.head_dim`, with Qwen3's 128 as the default (``None``: h / a)."""
    qk_norm: bool = True
    """RMSNorm on each head's query and key (Megatron ``qk_layernorm``)."""

    def __post_init__(self) -> None:
        TransformerConfig.__post_init__(self)  # zero-argument super() does not work in a slots dataclass
        if not self.num_moe_experts:
            raise ValueError(f"{self.name}: num_moe_experts must be set (Qwen3-MoE layers are all sparse)")


class Qwen3Attention(SelfAttention):
    """Grouped-query attention with QK-norm: RMSNorm over each head's ``hs`` channels of q and k, then RoPE."""

    def __init__(self, cfg: Qwen3MoEConfig, tp: TPContext = SERIAL) -> None:
        super().__init__(cfg, tp)
        self.q_norm = RMSNorm(self.head_dim, cfg.norm_epsilon)
        self.k_norm = RMSNorm(self.head_dim, cfg.norm_epsilon)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, ...] | None = None) -> torch.Tensor:
        x = self.tp.enter(x)  # (B, T, C): all-gather along T with SP
        B, T, _ = x.shape
        hs = self.head_dim
        if self.separate:  # torchtitan's wq, wk, wv (fsdp = true sets separate_projections)
            q, k, v = self.wq(x), self.wk(x), self.wv(x)
        else:
            q, k, v = self.qkv(x).split([self.n_head * hs, self.n_kv * hs, self.n_kv * hs], dim=-1)
        q = self.q_norm(q.view(B, T, self.n_head, hs))  # (B, T, nh/tp, hs)
        k = self.k_norm(k.view(B, T, self.n_kv, hs))  # (B, T, nkv/tp, hs)
        if rope is not None and len(rope) == 1:  # torchtitan's complex form (rotary_complex)
            q, k = apply_rope_complex(q, rope[0]), apply_rope_complex(k, rope[0])
        q, k = q.transpose(1, 2), k.transpose(1, 2)  # (B, nh/tp, T, hs), (B, nkv/tp, T, hs)
        v = v.view(B, T, self.n_kv, hs).transpose(1, 2)  # (B, nkv/tp, T, hs)
        if rope is not None and len(rope) == 2:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        if self.separate and self.backend != "unfused" and self.n_kv != self.n_head:
            rep = self.n_head // self.n_kv  # torchtitan repeats K/V heads before SDPA, as SelfAttention does
            k, v = (repeat_kv(t.transpose(1, 2), rep).transpose(1, 2) for t in (k, v))
        if self.backend != "unfused":  # every fused backend (flash, flash2, flash3, cudnn, efficient)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal,
                                               enable_gqa=k.shape[1] != q.shape[1])  # (B, nh/tp, T, hs)
        else:
            y = self._unfused(q, k, v)
        y = y.transpose(1, 2).reshape(B, T, self.n_head * hs)  # (B, T, nh·hs/tp)
        return self.tp.leave(self.proj(y))  # (B, T, C): all-reduce, or reduce-scatter along T with SP


class Qwen3MoEBlock(nn.Module):
    def __init__(self, cfg: Qwen3MoEConfig, tp: TPContext = SERIAL, ep: int = 1) -> None:
        super().__init__()
        self.p = cfg.hidden_dropout
        self.attn_norm = RMSNorm(cfg.hidden_size, cfg.norm_epsilon)
        self.attn = Qwen3Attention(cfg, tp) if cfg.qk_norm else SelfAttention(cfg, tp)
        self.mlp_norm = RMSNorm(cfg.hidden_size, cfg.norm_epsilon)
        self.mlp = MoE(cfg, tp, ep)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, ...]) -> torch.Tensor:
        x = x + dropout(self.attn(self.attn_norm(x), rope), self.p)  # (B, T/tp with SP, C)
        return x + dropout(self.mlp(self.mlp_norm(x)), self.p)


class Qwen3MoE(Llama):
    """Qwen3-MoE language model: Llama's embedding, RoPE over ``head_dim`` (its ``kv_channels``), final
    norm and output layer around :class:`Qwen3MoEBlock`; ``forward(idx, targets)`` returns the mean
    cross-entropy loss."""

    block_type = Qwen3MoEBlock


class Qwen3MoEFamily(ModelFamily):
    """Qwen3-MoE. TP/SP/CP/EP/PP as Mixtral (TP up to the 4 key/value heads); FLOPs traced; memory from
    the Korthikanti closed forms with ``head_dim`` and QK-norm (:func:`workload.memory.memory_per_gpu`)."""

    name = "qwen3_moe"
    activations = ("swiglu",)
    config_type = Qwen3MoEConfig
    hf_model_types = ("qwen3_moe",)
    hf_positive_ints = ("num_experts", "moe_intermediate_size", "head_dim", "decoder_sparse_step")

    def build(self, cfg: Qwen3MoEConfig, *, tp: TPContext | None = None, ep: int = 1) -> nn.Module:
        return Qwen3MoE(cfg, tp or SERIAL, ep)

    def from_hf(self, d: dict, *, name: str, seq_length: int | None) -> Qwen3MoEConfig:
        """A ``qwen3_moe`` ``config.json``: every layer sparse (``decoder_sparse_step`` 1, no
        ``mlp_only_layers``), the experts ``moe_intermediate_size`` wide.

        Raises:
            ValueError: dense layers mixed in, which this module does not build.
        """
        if d.get("decoder_sparse_step", 1) != 1 or d.get("mlp_only_layers"):
            raise ValueError(f"Hugging Face config for {name!r}: decoder_sparse_step / mlp_only_layers (dense "
                             f"layers among the MoE ones) are not supported; every layer must be sparse")
        heads = d["num_attention_heads"]
        seq = seq_length or min(d.get("max_position_embeddings", 4096), 8192)
        return Qwen3MoEConfig(
            name=name, num_layers=d["num_hidden_layers"], hidden_size=d["hidden_size"],
            num_attention_heads=heads, num_query_groups=d.get("num_key_value_heads") or heads,
            head_dim=d.get("head_dim"), ffn_hidden_size=d["moe_intermediate_size"],
            seq_length=seq, max_position_embeddings=d.get("max_position_embeddings", seq), vocab_size=d["vocab_size"],
            normalization="RMSNorm", activation="swiglu", position_embedding_type="rope",
            rotary_base=d.get("rope_theta", 1e6), untie_embeddings_and_output_weights=not d.get(
                "tie_word_embeddings", False), add_bias_linear=False, norm_epsilon=d.get("rms_norm_eps", 1e-6),
            num_moe_experts=d["num_experts"], moe_router_topk=d["num_experts_per_tok"],
            source="Hugging Face config.json")


def _qwen3(name: str, params: float, layers: int, hidden: int, heads: int, ffn: int, source: str) -> Qwen3MoEConfig:
    return Qwen3MoEConfig(
        name=name, num_layers=layers, hidden_size=hidden, num_attention_heads=heads, num_query_groups=4,
        head_dim=128, ffn_hidden_size=ffn, num_moe_experts=128, moe_router_topk=8, seq_length=4096,
        max_position_embeddings=40960, vocab_size=151936, normalization="RMSNorm", activation="swiglu",
        position_embedding_type="rope", rotary_base=1e6, untie_embeddings_and_output_weights=True,
        add_bias_linear=False, norm_epsilon=1e-6, published_params=params, source=source)


_HF = "Hugging Face Qwen/{} config.json and model card; Yang et al. 2025 (arXiv:2505.09388)"
FAMILIES = (Qwen3MoEFamily(),)
CONFIGS = (
    _qwen3("qwen3-30b-a3b", 30.5, 48, 2048, 32, 768, _HF.format("Qwen3-30B-A3B")),
    _qwen3("qwen3-235b-a22b", 235.0, 94, 4096, 64, 1536, _HF.format("Qwen3-235B-A22B")),
)
"""Published totals (activated): 30.5B (3.3B) and 235B (22B)."""
