"""Mixture-of-experts MLP, traceable on the meta device under a uniform-routing assumption.

Real routing is data-dependent (``nonzero``/``bincount`` of the router's choices), which has no meta
kernel. We keep the router (a GEMM, softmax and top-k, all static-shape) and the sort-based token
permutation (as Megablocks / Megatron's ``MoEAlltoAllTokenDispatcher``), but assume every expert
receives the same number of tokens::

    tokens_per_expert = ceil(capacity_factor · B·T · topk / num_experts)

The expert MLPs (SwiGLU) then run as one grouped GEMM, modelled as ``bmm`` over the expert dim, and
the outputs are scattered back with ``index_add``. FLOPs therefore equal a perfectly balanced router's
(times ``capacity_factor``, the padding a capacity-limited router computes).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from workload.zoo.config import TransformerConfig


class MoE(nn.Module):
    """Top-k routed SwiGLU experts; expert weights stacked (E, ...) for expert parallelism."""

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        assert cfg.num_moe_experts is not None
        self.num_experts, self.topk = cfg.num_moe_experts, cfg.moe_router_topk
        self.capacity_factor = cfg.moe_capacity_factor
        E, C, Fh = self.num_experts, cfg.hidden_size, cfg.ffn_hidden_size
        self.router = nn.Linear(C, E, bias=False)
        self.fc1 = nn.Parameter(torch.empty(E, C, 2 * Fh))  # gate and up, per expert
        self.fc2 = nn.Parameter(torch.empty(E, Fh, C))

    def tokens_per_expert(self, num_tokens: int) -> int:
        """Tokens each expert processes under uniform routing (padded by the capacity factor)."""
        return math.ceil(self.capacity_factor * num_tokens * self.topk / self.num_experts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        N, E, k = B * T, self.num_experts, self.topk
        cap = self.tokens_per_expert(N)
        x = x.reshape(N, C)  # (N, C)
        probs = F.softmax(self.router(x).float(), dim=-1)  # (N, E)
        weights, experts = probs.topk(k, dim=-1)  # (N, k) each
        weights = (weights / weights.sum(-1, keepdim=True)).to(x.dtype)
        # Permute: (token, choice) pairs sorted by expert; static shape (N·k,).
        order = experts.reshape(-1).argsort()  # (N·k,)
        token_of = order // k  # (N·k,) source token of each routed copy
        routed = x.index_select(0, token_of)  # (N·k, C)
        # Uniform routing: expert e takes rows [e·cap, (e+1)·cap) (zero rows pad a capacity factor > 1).
        routed = F.pad(routed, (0, 0, 0, E * cap - N * k)).view(E, cap, C)  # (E, cap, C)
        gate, up = torch.bmm(routed, self.fc1).chunk(2, dim=-1)  # (E, cap, F) each
        out = torch.bmm(F.silu(gate) * up, self.fc2)  # (E, cap, C)
        out = out.reshape(E * cap, C)[: N * k]  # (N·k, C)
        out = out * weights.reshape(-1).gather(0, order).unsqueeze(-1)  # weight each copy by its router prob
        y = torch.zeros_like(x).index_add(0, token_of, out)  # (N, C) un-permute and sum the k copies
        return y.view(B, T, C)
