"""Plain PyTorch modules for the custom-model tests (loaded by file path, as a user's would be)."""

from __future__ import annotations

import torch
from torch import nn


class MLPBlock(nn.Module):
    """x + fc2(gelu(fc1(x))), no biases: (B, T, d) -> (B, T, d)."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d, 4 * d, bias=False)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(4 * d, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(self.act(self.fc1(x)))


class TokenMLP(nn.Module):
    """Token ids (B, T) -> embedding (B, T, d) -> ``layers`` MLP blocks -> logits (B, T, classes)."""

    def __init__(self, vocab: int = 64, d: int = 32, layers: int = 3, classes: int = 16) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(MLPBlock(d) for _ in range(layers))
        self.head = nn.Linear(d, classes, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def token_mlp(**kw) -> TokenMLP:
    return TokenMLP(**kw)


class GPTBlock(nn.Module):
    """Pre-LN transformer block, (B, T, d) -> (B, T, d): ``nn.MultiheadAttention`` (``mha``, batch first,
    need_weights=False) or the same projections around ``F.scaled_dot_product_attention``, then a GeLU MLP."""

    def __init__(self, d: int, heads: int, mha: bool) -> None:
        super().__init__()
        self.heads, self.mha = heads, mha
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        if mha:
            self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        else:
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.ln1(x)
        if self.mha:
            x = x + self.attn(y, y, y, need_weights=False)[0]
        else:
            B, T, C = x.shape
            q, k, v = self.qkv(y).view(B, T, 3, self.heads, C // self.heads).permute(2, 0, 3, 1, 4)
            a = nn.functional.scaled_dot_product_attention(q, k, v)
            x = x + self.proj(a.transpose(1, 2).reshape(B, T, C))
        return x + self.mlp(self.ln2(x))


class TokenGPT(nn.Module):
    """Token ids (B, T) -> embedding -> ``layers`` :class:`GPTBlock` s -> final LayerNorm -> logits (B, T, vocab)."""

    def __init__(self, vocab: int = 64, d: int = 32, heads: int = 4, layers: int = 3, mha: bool = True) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(GPTBlock(d, heads, mha) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for b in self.blocks:
            x = b(x)
        return self.head(self.ln(x))


def plain_mlp() -> nn.Sequential:
    """Five different top-level children, no repeated blocks."""
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))


def mlp_with_inputs(batch: int = 4):
    """The (module, example_inputs) form: inputs for one micro-batch of ``batch`` samples."""
    return plain_mlp(), (torch.randn(batch, 64),)


class DataDependent(nn.Module):
    """Its forward needs tensor values, which the meta device does not have."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x)
        return y[y > 0]


def data_dependent() -> DataDependent:
    return DataDependent()


def not_a_model() -> str:
    return "a string"
