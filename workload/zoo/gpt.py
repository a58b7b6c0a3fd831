"""GPT, Megatron-LM / GPT-3 style (nanoGPT layout).

Learned absolute positions, pre-LayerNorm blocks, fused QKV projection with biases, causal
attention, GELU MLP of width ``ffn_hidden_size`` (4h), final LayerNorm, output layer tied to the
input embedding (Megatron's default; untie with ``untie_embeddings_and_output_weights``).
Dropout is omitted (p = 0): it adds only elementwise kernels.

Forward FLOPs per micro-batch (2 per multiply-accumulate; Narayanan et al. SC'21 eq. 3 divided by 3):
``24·B·s·l·h² + 4·B·s²·l·h + 2·B·s·h·V`` for ``ffn_hidden_size = 4h``.
Shapes: B micro-batch, T sequence, C = h hidden, nh heads, hs = C / nh.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from workload.zoo.config import TransformerConfig


class SelfAttention(nn.Module):
    """Multi-head (or grouped-query) self-attention with a fused QKV projection."""

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.n_head, self.n_kv, self.head_dim = cfg.num_attention_heads, cfg.num_query_groups, cfg.kv_channels
        self.causal = cfg.causal
        qkv_out = (self.n_head + 2 * self.n_kv) * self.head_dim
        self.qkv = nn.Linear(cfg.hidden_size, qkv_out, bias=cfg.add_bias_linear)
        self.proj = nn.Linear(cfg.hidden_size, cfg.hidden_size, bias=cfg.add_bias_linear)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(
            [self.n_head * self.head_dim, self.n_kv * self.head_dim, self.n_kv * self.head_dim], dim=-1)
        q = q.view(B, T, self.n_head, self.head_dim).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(B, T, self.n_kv, self.head_dim).transpose(1, 2)  # (B, nkv, T, hs)
        v = v.view(B, T, self.n_kv, self.head_dim).transpose(1, 2)  # (B, nkv, T, hs)
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal,
                                           enable_gqa=self.n_kv != self.n_head)  # (B, nh, T, hs)
        y = y.transpose(1, 2).reshape(B, T, C)  # (B, T, C)
        return self.proj(y)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding (Su et al. 2021, arXiv:2104.09864), rotate-half form. x: (B, H, T, hs)."""
    x1, x2 = x.chunk(2, dim=-1)  # (B, H, T, hs/2) each
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class MLP(nn.Module):
    """h -> ffn -> h with GELU (GPT, BERT)."""

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.fc1 = nn.Linear(cfg.hidden_size, cfg.ffn_hidden_size, bias=cfg.add_bias_linear)
        self.fc2 = nn.Linear(cfg.ffn_hidden_size, cfg.hidden_size, bias=cfg.add_bias_linear)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))  # (B, T, C) -> (B, T, ffn) -> (B, T, C)


class Block(nn.Module):
    """Pre-LN transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_epsilon)
        self.attn = SelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_epsilon)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))  # (B, T, C)
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """GPT language model; ``forward(idx, targets)`` returns the mean cross-entropy loss."""

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.config = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.hidden_size)  # (V, C)
        self.wpe = nn.Embedding(cfg.max_position_embeddings, cfg.hidden_size)  # (s, C)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.num_layers))
        self.ln_f = nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_epsilon)
        self.lm_head = (nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
                        if cfg.untie_embeddings_and_output_weights else None)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        B, T = idx.shape
        pos = torch.arange(T, device=idx.device)  # (T,)
        x = self.wte(idx) + self.wpe(pos)  # (B, T, C)
        for block in self.layers:
            x = block(x)
        x = self.ln_f(x)
        weight = self.lm_head.weight if self.lm_head is not None else self.wte.weight
        logits = F.linear(x, weight)  # (B, T, V)
        return F.cross_entropy(logits.float().view(B * T, -1), targets.view(B * T))

    def example_inputs(self, micro_batch_size: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        """(idx, targets), each (B, s) int64 on the model's device."""
        device = self.wte.weight.device
        shape = (micro_batch_size, self.config.seq_length)
        return (torch.randint(0, self.config.vocab_size, shape, device=device),
                torch.randint(0, self.config.vocab_size, shape, device=device))
