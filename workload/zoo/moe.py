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

from workload.parallel.tp import TPContext, all_to_all
from workload.zoo.config import TransformerConfig


class MoE(nn.Module):
    """Top-k routed SwiGLU experts; expert weights stacked (E/ep, ...).

    Expert parallelism (Megatron-Core ``MoEAlltoAllTokenDispatcher``): each of the ``ep`` ranks holds
    E/ep experts; routed tokens are exchanged by an all-to-all before the experts (dispatch) and after
    them (combine). Under uniform routing every rank sends and receives the same N·k·cf tokens. With
    TP the expert FFN dimension is split like a dense MLP.
    """

    def __init__(self, cfg: TransformerConfig, tp: TPContext | None = None, ep: int = 1) -> None:
        super().__init__()
        if cfg.num_moe_experts is None:
            raise ValueError(f"{cfg.name}: MoE needs num_moe_experts")
        self.tp = tp or TPContext()
        self.ep = ep
        self.num_experts, self.topk = cfg.num_moe_experts, cfg.moe_router_topk
        if self.num_experts % ep:
            raise ValueError(f"expert_model_parallel_size={ep} does not divide num_moe_experts={self.num_experts}")
        self.capacity_factor = cfg.moe_capacity_factor
        E, C = self.num_experts, cfg.hidden_size
        Fh = self.tp.shard(cfg.ffn_hidden_size, "ffn_hidden_size")
        self.router = nn.Linear(C, E, bias=False)
        self.fc1 = nn.Parameter(torch.empty(E // ep, C, 2 * Fh))  # gate and up, per local expert
        self.fc2 = nn.Parameter(torch.empty(E // ep, Fh, C))

    def expert_parameters(self) -> tuple[nn.Parameter, ...]:
        """The stacked expert weights (E/ep experts; the router is not an expert weight)."""
        return (self.fc1, self.fc2)

    def tokens_per_expert(self, num_tokens: int) -> int:
        """Tokens each expert processes under uniform routing (padded by the capacity factor)."""
        return math.ceil(self.capacity_factor * num_tokens * self.topk / self.num_experts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.tp.enter(x)  # (B, T, C)
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
        routed = F.pad(routed, (0, 0, 0, E * cap - N * k))  # (E·cap, C)
        if self.ep > 1:  # dispatch: each rank keeps its E/ep experts' tokens from every EP rank
            routed = all_to_all(routed, "ep")
        routed = routed.view(E // self.ep, cap * self.ep, C)  # (E/ep, ep·cap, C)
        gate, up = torch.bmm(routed, self.fc1).chunk(2, dim=-1)  # (E/ep, ep·cap, F/tp) each
        out = torch.bmm(F.silu(gate) * up, self.fc2).reshape(E * cap, C)  # (E·cap, C)
        if self.ep > 1:  # combine
            out = all_to_all(out, "ep")
        out = out[: N * k]  # (N·k, C)
        out = out * weights.reshape(-1).gather(0, order).unsqueeze(-1)  # weight each copy by its router prob
        y = torch.zeros_like(x).index_add(0, token_of, out)  # (N, C) un-permute and sum the k copies
        return self.tp.leave(y.view(B, T, C))
