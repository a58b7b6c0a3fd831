"""Your own model in trainsim: a Vision Transformer written in plain PyTorch, nothing from trainsim.

ViT-B/16 by default (Dosovitskiy et al. 2021, arXiv:2010.11929, Table 1: 12 layers, width 768, MLP
3072, 12 heads, 86.6 M parameters with a 1000-class head). Shapes: B images (B, 3, 224, 224) -> 196
patches of 16 x 16 px + a class token = (B, 197, 768) through the blocks -> logits (B, classes).

The scenario ``scenarios/catalog/custom-vit-b16-dp.toml`` simulates it:

    [model]
    factory = "../../examples/vit.py:build"   # a file, relative to the scenario; or "package.module:build"
    input_shape = [3, 224, 224]               # one sample; trainsim prepends the micro-batch size

trainsim calls ``build()`` under ``torch.device("meta")`` (no memory is allocated), finds the repeated
``blocks`` (an ``nn.ModuleList`` of identical blocks: pipeline stages, recomputation and FSDP units),
traces one micro-batch and adds the loss ``logits.sum()``. ``[model] factory_args = {depth = 24}``
passes keyword arguments to ``build``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Attention(nn.Module):
    """Multi-head self-attention: (B, N, C) -> (B, N, C)."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, N, C = x.shape
        q, k, v = self.qkv(x).reshape(B, N, 3, self.heads, C // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v)  # (B, heads, N, C / heads)
        return self.proj(y.transpose(1, 2).reshape(B, N, C))


class Block(nn.Module):
    """Pre-norm transformer encoder block."""

    def __init__(self, dim: int, heads: int, mlp_dim: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = Attention(dim, heads)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(dim, mlp_dim), nn.GELU(), nn.Linear(mlp_dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class ViT(nn.Module):
    """Images (B, 3, S, S) -> class logits (B, num_classes)."""

    def __init__(self, image_size: int = 224, patch_size: int = 16, dim: int = 768, depth: int = 12,
                 heads: int = 12, mlp_dim: int = 3072, num_classes: int = 1000) -> None:
        super().__init__()
        patches = (image_size // patch_size) ** 2
        self.patch_embed = nn.Conv2d(3, dim, patch_size, stride=patch_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, patches + 1, dim))
        self.blocks = nn.ModuleList(Block(dim, heads, mlp_dim) for _ in range(depth))
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(images).flatten(2).transpose(1, 2)  # (B, patches, dim)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x)[:, 0])


def build(**kwargs) -> ViT:
    """A ViT; keyword arguments as :class:`ViT` (default ViT-B/16, 1000 classes)."""
    return ViT(**kwargs)
