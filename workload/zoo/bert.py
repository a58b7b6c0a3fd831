"""BERT (Devlin et al. 2018, arXiv:1810.04805), post-LayerNorm encoder with a masked-LM head.

Word + position + token-type embeddings, LayerNorm; blocks ``x = LN(x + attn(x)); x = LN(x + mlp(x))``
with bidirectional attention; MLM head dense-GELU-LN and a decoder tied to the word embedding.
Simplification: the MLM loss is taken over every position (real pre-training predicts ~15 % of the
tokens, which only shrinks the decoder GEMM); no next-sentence head, no dropout, no padding mask.
Shapes: B micro-batch, T sequence, C hidden, V vocabulary.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from workload.parallel.tp import TPContext
from workload.zoo.config import TransformerConfig
from workload.zoo.family import ModelFamily
from workload.zoo.gpt import MLP, SERIAL, SelfAttention, VocabParallelEmbedding, vocab_parallel_loss


class BertBlock(nn.Module):
    def __init__(self, cfg: TransformerConfig, tp: TPContext = SERIAL) -> None:
        super().__init__()
        self.attn = SelfAttention(cfg, tp)
        self.ln1 = nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_epsilon)
        self.mlp = MLP(cfg, tp)
        self.ln2 = nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_epsilon)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.ln1(x + self.attn(x))  # (B, T, C)
        return self.ln2(x + self.mlp(x))


class Bert(nn.Module):
    """BERT with an MLM head; ``forward(idx, token_types, targets)`` returns the mean MLM loss."""

    def __init__(self, cfg: TransformerConfig, tp: TPContext = SERIAL) -> None:
        super().__init__()
        self.config = cfg
        self.tp = tp
        C = cfg.hidden_size
        self.word = VocabParallelEmbedding(cfg.vocab_size, C, tp)  # (V/tp, C)
        self.position = nn.Embedding(cfg.max_position_embeddings, C)
        self.token_type = nn.Embedding(max(cfg.num_tokentypes, 1), C)
        self.ln_emb = nn.LayerNorm(C, eps=cfg.norm_epsilon)
        self.layers = nn.ModuleList(BertBlock(cfg, tp) for _ in range(cfg.num_layers))
        self.head_dense = nn.Linear(C, C)
        self.head_ln = nn.LayerNorm(C, eps=cfg.norm_epsilon)
        self.head_bias = nn.Parameter(torch.zeros(tp.shard(cfg.vocab_size, "vocab_size")))

    def forward(self, idx: torch.Tensor, token_types: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        B, T = idx.shape
        T_local = self.tp.local_seq(T)
        pos = torch.arange(T_local, device=idx.device)
        types = self.token_type(token_types[:, :T_local])
        x = self.ln_emb(self.word(idx) + self.position(pos) + types)  # (B, T/tp with SP, C)
        for block in self.layers:
            x = block(x)
        h = self.head_ln(F.gelu(self.head_dense(x)))  # (B, T/tp with SP, C)
        return vocab_parallel_loss(h, self.word.weight, targets, self.tp, self.head_bias)

    def example_inputs(self, micro_batch_size: int = 1) -> tuple[torch.Tensor, ...]:
        """(idx, token_types, targets), each (B, s) int64."""
        device = self.word.weight.device
        shape = (micro_batch_size, self.config.seq_length)
        return (torch.randint(0, self.config.vocab_size, shape, device=device),
                torch.zeros(shape, dtype=torch.long, device=device),
                torch.randint(0, self.config.vocab_size, shape, device=device))


class BertFamily(ModelFamily):
    """BERT encoders. FLOPs traced; memory from the Korthikanti closed forms."""

    name = "bert"
    activations = ("gelu", "squared_relu")
    config_type = TransformerConfig
    hf_model_types = ("bert",)

    def build(self, cfg: TransformerConfig, *, tp: TPContext | None = None, ep: int = 1) -> nn.Module:
        self.check_sizes(cfg, ep=ep)
        return Bert(cfg, tp) if tp is not None else Bert(cfg)

    def from_hf(self, d: dict, *, name: str, seq_length: int | None) -> TransformerConfig:
        return TransformerConfig(
            name=name, architecture="bert", num_layers=d["num_hidden_layers"],
            hidden_size=d["hidden_size"], num_attention_heads=d["num_attention_heads"],
            ffn_hidden_size=d["intermediate_size"], seq_length=seq_length or d["max_position_embeddings"],
            max_position_embeddings=d["max_position_embeddings"], vocab_size=d["vocab_size"],
            causal=False, num_tokentypes=d.get("type_vocab_size", 2),
            norm_epsilon=d.get("layer_norm_eps", 1e-12), source="Hugging Face config.json")


FAMILIES = (BertFamily(),)
CONFIGS = (
    TransformerConfig(name="bert-large", architecture="bert", num_layers=24, hidden_size=1024,
                      num_attention_heads=16, seq_length=512, vocab_size=30522, causal=False,
                      num_tokentypes=2, norm_epsilon=1e-12, published_params=0.34,
                      source="Devlin et al. 2018 (arXiv:1810.04805)"),
)
