"""Llama 2 / Llama 3 (and Mixtral, with MoE MLPs), nanoGPT layout.

Pre-RMSNorm blocks, rotary position embeddings, grouped-query attention (``num_query_groups`` KV
heads), SwiGLU MLP (Shazeer 2020, arXiv:2002.05202) with a fused gate/up projection as Megatron's
``fc1``, no biases, separate output layer. Touvron et al. 2023 (arXiv:2307.09288), Dubey et al. 2024
(arXiv:2407.21783), Jiang et al. 2024 (arXiv:2401.04088).

Shapes: B micro-batch, T sequence, C hidden, F ffn_hidden_size, V vocabulary.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from workload.parallel.tp import ColumnParallelLinear, RowParallelLinear, TPContext
from workload.zoo.config import TransformerConfig
from workload.zoo.gpt import SERIAL, SelfAttention, VocabParallelEmbedding, dropout, vocab_parallel_loss
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
    """down(silu(gate(x)) * up(x)); gate and up fused into one (C -> 2F/tp) column-parallel GEMM."""

    def __init__(self, cfg: TransformerConfig, tp: TPContext = SERIAL) -> None:
        super().__init__()
        self.tp = tp
        self.fc1 = ColumnParallelLinear(cfg.hidden_size, 2 * cfg.ffn_hidden_size, tp, bias=False)
        self.fc2 = RowParallelLinear(cfg.ffn_hidden_size, cfg.hidden_size, tp, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.tp.enter(x)  # (B, T, C)
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

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x = x + dropout(self.attn(self.attn_norm(x), rope), self.p)  # (B, T/tp with SP, C)
        return x + dropout(self.mlp(self.mlp_norm(x)), self.p)


def rope_tables(seq_len: int, head_dim: int, base: float, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin tables, each (T, hs/2), for :func:`workload.zoo.gpt.apply_rope`."""
    inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(seq_len, device=device, dtype=torch.float32), inv_freq)
    return angles.cos(), angles.sin()


class Llama(nn.Module):
    """Llama / Mixtral language model; ``forward(idx, targets)`` returns the mean cross-entropy loss."""

    def __init__(self, cfg: TransformerConfig, tp: TPContext = SERIAL, ep: int = 1) -> None:
        super().__init__()
        self.config = cfg
        self.tp = tp
        self.tok_embeddings = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size, tp)  # (V/tp, C)
        self.layers = nn.ModuleList(LlamaBlock(cfg, tp, ep) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.norm_epsilon)
        self.output = ColumnParallelLinear(cfg.hidden_size, cfg.vocab_size, tp, bias=False)  # (V/tp, C)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        B, T = idx.shape
        x = self.tok_embeddings(idx)  # (B, T/tp with SP, C)
        cos, sin = rope_tables(T, self.config.kv_channels, self.config.rotary_base, idx.device)
        rope = (cos.to(x.dtype), sin.to(x.dtype))  # (T, hs/2) each
        for block in self.layers:
            x = block(x, rope)
        return vocab_parallel_loss(self.norm(x), self.output.weight, targets, self.tp)

    def example_inputs(self, micro_batch_size: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        """(idx, targets), each (B, s) int64 on the model's device."""
        device = self.output.weight.device
        shape = (micro_batch_size, self.config.seq_length)
        return (torch.randint(0, self.config.vocab_size, shape, device=device),
                torch.randint(0, self.config.vocab_size, shape, device=device))
