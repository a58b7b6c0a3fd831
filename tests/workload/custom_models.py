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
