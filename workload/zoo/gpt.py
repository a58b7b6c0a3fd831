"""GPT, Megatron-LM / GPT-3 style (nanoGPT layout), built as one tensor-parallel rank's shard.

Learned absolute positions, pre-LayerNorm blocks, fused QKV projection with biases, causal
attention, GELU MLP of width ``ffn_hidden_size`` (4h), final LayerNorm, output layer tied to the
input embedding (Megatron's default; untie with ``untie_embeddings_and_output_weights``).

Tensor parallelism follows Megatron-LM (Shoeybi et al. 2019, Fig. 3): QKV and fc1 are column-parallel,
the attention projection and fc2 row-parallel, the embedding and output layer vocab-parallel; with
sequence parallelism (Korthikanti et al. 2022) LayerNorm, dropout and residuals run on ``s / tp``
tokens. The communication is left in the traced graph by :class:`workload.parallel.tp.TPContext`.
With ``tp = 1`` (the default) this is the plain single-GPU model.

Forward FLOPs per micro-batch (2 per multiply-accumulate; Narayanan et al. SC'21 eq. 3 divided by 3):
``24·B·s·l·h² + 4·B·s²·l·h + 2·B·s·h·V`` for ``ffn_hidden_size = 4h``.
Shapes: B micro-batch, T sequence (T/tp outside the TP region with SP), C = h hidden, nh heads,
hs = ``kv_channels`` (C / nh unless ``head_dim`` is given); a trailing ``/tp`` marks a per-rank shard.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from workload.parallel.tp import ColumnParallelLinear, RowParallelLinear, TPContext
from workload.trace.masked_attention import AttentionPattern, masked_attention
from workload.zoo.config import TransformerConfig
from workload.zoo.family import Flops, ModelFamily, traced_flops

SERIAL = TPContext()
"""No tensor parallelism."""


def attention_pattern(cfg: TransformerConfig, layer: int) -> AttentionPattern:
    """Layer ``layer``'s sliding window (:meth:`TransformerConfig.layer_window`), its sinks and ALiBi."""
    window = cfg.layer_window(layer)
    return AttentionPattern(window=window, sinks=cfg.attention_sinks if window else 0,
                            alibi=cfg.position_embedding_type == "alibi")


def set_attention_patterns(layers: nn.ModuleList, cfg: TransformerConfig) -> None:
    """Give each block's :class:`SelfAttention` its layer's :func:`attention_pattern` (blocks are built
    alike; the layer index decides local or global).

    Raises:
        ValueError: a window or ALiBi for an attention module with its own ``forward``, which does not
            run them (Qwen3's QK-norm attention).
    """
    for i, block in enumerate(layers):
        for m in block.modules():
            if isinstance(m, SelfAttention):
                if m.masked and type(m).forward is not SelfAttention.forward:
                    raise ValueError(f"{cfg.name}: sliding_window / position_embedding_type='alibi': "
                                     f"{type(m).__name__} does not run them (only the GPT/Llama attention does)")
                m.attention_pattern = attention_pattern(cfg, i)


class SelfAttention(nn.Module):
    """Multi-head (or grouped-query) self-attention with a fused QKV projection; ``nh/tp`` heads.

    A sliding window, attention sinks or ALiBi (``attention_pattern``, set per layer by
    :func:`set_attention_patterns`) run as one fused kernel with the pattern
    (:func:`workload.trace.masked_attention.masked_attention`, FlashAttention-2's ``window_size`` and
    ``alibi_slopes``); the unfused path computes the whole score matrix and adds ALiBi's bias in its
    ``baddbmm`` (BLOOM's, reading a ``(B·nh/tp, 1, T)`` bias)."""

    def __init__(self, cfg: TransformerConfig, tp: TPContext = SERIAL) -> None:
        super().__init__()
        self.tp = tp
        self.head_dim = cfg.kv_channels
        self.n_head = tp.shard(cfg.num_attention_heads, "num_attention_heads")
        self.n_kv = tp.shard(cfg.num_query_groups, "num_query_groups")
        self.causal = cfg.causal
        self.backend = cfg.attention_backend
        self.attn_dropout = cfg.attention_dropout
        self.masked = cfg.sliding_window is not None or cfg.position_embedding_type == "alibi"
        """Whether attention goes through :func:`masked_attention` (every layer of a windowed model, so that
        layer dedup can give each clone its own layer's pattern)."""
        self.attention_pattern = attention_pattern(cfg, 0)
        self.separate = bool(cfg.separate_projections)
        if self.separate:  # torchtitan's / Hugging Face's wq, wk, wv
            q_out, kv_out = cfg.num_attention_heads * self.head_dim, cfg.num_query_groups * self.head_dim
            self.wq = ColumnParallelLinear(cfg.hidden_size, q_out, tp, bias=cfg.add_bias_linear)
            self.wk = ColumnParallelLinear(cfg.hidden_size, kv_out, tp, bias=cfg.add_bias_linear)
            self.wv = ColumnParallelLinear(cfg.hidden_size, kv_out, tp, bias=cfg.add_bias_linear)
        else:
            qkv_out = (cfg.num_attention_heads + 2 * cfg.num_query_groups) * self.head_dim
            self.qkv = ColumnParallelLinear(cfg.hidden_size, qkv_out, tp, bias=cfg.add_bias_linear)
        self.proj = RowParallelLinear(cfg.num_attention_heads * self.head_dim, cfg.hidden_size, tp,
                                      bias=cfg.add_bias_linear)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, ...] | None = None) -> torch.Tensor:
        """``rope``: (cos, sin), each (T, hs/2), or torchtitan's (freqs_cis,), (T, hs/2) complex64."""
        x = self.tp.enter(x)  # (B, T, C): all-gather along T with SP
        B, T, _ = x.shape
        hs = self.head_dim
        if self.separate:
            q, k, v = self.wq(x), self.wk(x), self.wv(x)
        else:
            q, k, v = self.qkv(x).split([self.n_head * hs, self.n_kv * hs, self.n_kv * hs], dim=-1)
        q, k = q.view(B, T, self.n_head, hs), k.view(B, T, self.n_kv, hs)  # (B, T, nh/tp or nkv/tp, hs)
        if rope is not None and len(rope) == 1:  # torchtitan's form, before the transpose as there
            q, k = apply_rope_complex(q, rope[0]), apply_rope_complex(k, rope[0])
        q, k = q.transpose(1, 2), k.transpose(1, 2)  # (B, nh/tp, T, hs), (B, nkv/tp, T, hs)
        v = v.view(B, T, self.n_kv, hs).transpose(1, 2)  # (B, nkv/tp, T, hs)
        if rope is not None and len(rope) == 2:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        if self.separate and self.backend != "unfused" and self.n_kv != self.n_head:
            rep = self.n_head // self.n_kv  # repeated in torchtitan's (B, T, heads, hs) layout
            k, v = (repeat_kv(t.transpose(1, 2), rep).transpose(1, 2) for t in (k, v))
        if self.backend != "unfused" and self.masked:  # one fused kernel with the window / ALiBi
            y = masked_attention(q, k, v, self.attention_pattern, is_causal=self.causal,
                                 enable_gqa=k.shape[1] != q.shape[1])  # (B, nh/tp, T, hs)
        elif self.backend != "unfused":  # one fused kernel (which one: the cost model's business)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal,
                                               enable_gqa=k.shape[1] != q.shape[1])  # (B, nh/tp, T, hs)
        else:
            y = self._unfused(q, k, v)
        y = y.transpose(1, 2).reshape(B, T, self.n_head * hs)  # (B, T, nh·hs/tp)
        return self.tp.leave(self.proj(y))  # (B, T, C): all-reduce, or reduce-scatter along T with SP

    def _unfused(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Megatron-LM's core attention: baddbmm, fused scale-mask-softmax, dropout, bmm."""
        B, H, T, hs = q.shape
        if self.n_kv != self.n_head:
            rep = self.n_head // self.n_kv
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        q, k, v = (t.reshape(B * H, T, hs) for t in (q, k, v))  # (B·nh/tp, T, hs)
        # QK^T with the 1/sqrt(hs) scale folded into the GEMM (alpha), as Megatron's baddbmm does
        if self.attention_pattern.alibi:  # BLOOM: the (B·nh, 1, T) ALiBi bias is baddbmm's input
            scores = torch.baddbmm(q.new_empty(B * H, 1, T), q, k.transpose(1, 2), beta=1.0, alpha=hs ** -0.5)
        else:
            scores = torch.baddbmm(q.new_empty(B * H, T, T), q, k.transpose(1, 2), beta=0.0, alpha=hs ** -0.5)
        probs = torch.softmax(scores, dim=-1)  # Megatron fuses scale + causal mask + softmax
        if self.attn_dropout:
            probs = F.dropout(probs, self.attn_dropout)
        return torch.bmm(probs, v).view(B, H, T, hs)  # (B, nh/tp, T, hs)


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """K or V heads repeated to the query heads, (B, T, g, d) -> (B, T, g·n_rep, d), materialised: torchtitan's
    ``repeat_kv`` (``torchtitan/models/llama3/model.py`` at the Dec 2024 and Jun 2025 benchmark commits 9dec370
    and 820504e; Hugging Face's Llama has the same) -- ``unsqueeze``, ``expand``, ``reshape``, a copy kernel
    writing ``n_rep`` times the heads -- before SDPA, which then runs as multi-head attention. Its backward
    sums the ``n_rep`` gradients (a reduction); per-op SAC recomputes the copy (not in ``_save_list``)."""
    b, t, g, d = x.shape
    return x.unsqueeze(3).expand(b, t, g, n_rep, d).reshape(b, t, g * n_rep, d)


def apply_rope_complex(x: torch.Tensor, freqs_cis: torch.Tensor) -> torch.Tensor:
    """Rotary embedding as torchtitan's ``apply_rotary_emb`` (``rotary_complex``): x (B, T, H, hs) in
    the training dtype, freqs_cis (T, hs/2) complex64; adjacent pairs rotated in fp32, cast back."""
    xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))  # (B, T, H, hs/2) complex64
    return torch.view_as_real(xc * freqs_cis.view(1, x.shape[1], 1, -1)).flatten(3).type_as(x)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding (Su et al. 2021, arXiv:2104.09864), rotate-half form. x: (B, H, T, hs)."""
    x1, x2 = x.chunk(2, dim=-1)  # (B, H, T, hs/2) each
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class MLP(nn.Module):
    """h -> ffn/tp -> h with GELU (GPT, BERT) or squared ReLU (Nemotron: ``activation =
    "squared_relu"``, eager ``relu`` then ``pow``, as Megatron-LM's ``squared_relu``); fc1
    column-parallel, fc2 row-parallel."""

    def __init__(self, cfg: TransformerConfig, tp: TPContext = SERIAL) -> None:
        super().__init__()
        self.tp = tp
        self.squared_relu = cfg.activation == "squared_relu"
        self.fc1 = ColumnParallelLinear(cfg.hidden_size, cfg.ffn_hidden_size, tp, bias=cfg.add_bias_linear)
        self.fc2 = RowParallelLinear(cfg.ffn_hidden_size, cfg.hidden_size, tp, bias=cfg.add_bias_linear)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.tp.enter(x)  # (B, T, C)
        y = self.fc1(x)  # (B, T, ffn/tp)
        y = torch.pow(F.relu(y), 2) if self.squared_relu else F.gelu(y)
        return self.tp.leave(self.fc2(y))  # (B, T, C)


def dropout(x: torch.Tensor, p: float) -> torch.Tensor:
    return F.dropout(x, p) if p else x


class Block(nn.Module):
    """Pre-LN transformer block: x + drop(attn(ln(x))), then x + drop(mlp(ln(x)))."""

    def __init__(self, cfg: TransformerConfig, tp: TPContext = SERIAL) -> None:
        super().__init__()
        self.p = cfg.hidden_dropout
        self.ln1 = nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_epsilon)
        self.attn = SelfAttention(cfg, tp)
        self.ln2 = nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_epsilon)
        self.mlp = MLP(cfg, tp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + dropout(self.attn(self.ln1(x)), self.p)  # (B, T/tp with SP, C)
        return x + dropout(self.mlp(self.ln2(x)), self.p)


class VocabParallelEmbedding(nn.Embedding):
    """``nn.Embedding(V/tp, C)`` whose partial outputs are summed over TP (Megatron's
    ``VocabParallelEmbedding``): all-reduce, or reduce-scatter along the sequence with SP."""

    def __init__(self, vocab: int, dim: int, tp: TPContext) -> None:
        super().__init__(tp.shard(vocab, "vocab_size"), dim)
        self.tp = tp

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.tp.leave(super().forward(idx))


def vocab_parallel_loss(x: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, tp: TPContext,
                        bias: torch.Tensor | None = None) -> torch.Tensor:
    """Output layer and cross-entropy over this rank's V/tp logits (Megatron's
    ``vocab_parallel_cross_entropy``: the max, the target logit and the softmax denominator are each
    all-reduced over TP -- three (B, T) fp32 all-reduces)."""
    x = tp.enter(x)  # (B, T, C)
    B, T, _ = x.shape
    logits = F.linear(x, weight, bias).float()  # (B, T, V/tp)
    if tp.size > 1:
        stat = logits.detach().amax(dim=-1)  # (B, T)
        for _ in range(3):
            tp.all_reduce(stat)
    return F.cross_entropy(logits.view(B * T, -1), targets.reshape(B * T))


class GPT(nn.Module):
    """GPT language model; ``forward(idx, targets)`` returns the mean cross-entropy loss."""

    def __init__(self, cfg: TransformerConfig, tp: TPContext = SERIAL) -> None:
        super().__init__()
        self.config = cfg
        self.tp = tp
        self.p = cfg.hidden_dropout
        self.wte = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size, tp)  # (V/tp, C)
        no_table = cfg.position_embedding_type in ("alibi", "none")
        self.wpe = None if no_table else nn.Embedding(cfg.max_position_embeddings, cfg.hidden_size)  # (s, C)
        self.word_embeddings_layernorm = (nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_epsilon)
                                          if cfg.embedding_layernorm else None)  # BLOOM
        self.layers = nn.ModuleList(Block(cfg, tp) for _ in range(cfg.num_layers))
        set_attention_patterns(self.layers, cfg)
        self.ln_f = nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_epsilon)
        self.lm_head = (ColumnParallelLinear(cfg.hidden_size, cfg.vocab_size, tp, bias=False)
                        if cfg.untie_embeddings_and_output_weights else None)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        B, T = idx.shape
        if self.wpe is not None:
            pos = torch.arange(self.tp.local_seq(T), device=idx.device)  # (T/tp,) with SP
            x = self.wte(idx) + self.wpe(pos)  # (B, T/tp with SP, C)
        else:  # ALiBi or no positions
            x = self.wte(idx)
        if self.word_embeddings_layernorm is not None:
            x = self.word_embeddings_layernorm(x)
        x = dropout(x, self.p)  # (B, T/tp with SP, C)
        for block in self.layers:
            x = block(x)
        x = self.ln_f(x)
        weight = self.lm_head.weight if self.lm_head is not None else self.wte.weight
        return vocab_parallel_loss(x, weight, targets, self.tp)

    def example_inputs(self, micro_batch_size: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        """(idx, targets), each (B, s) int64 on the model's device."""
        device = self.wte.weight.device
        shape = (micro_batch_size, self.config.seq_length)
        return (torch.randint(0, self.config.vocab_size, shape, device=device),
                torch.randint(0, self.config.vocab_size, shape, device=device))


# --------------------------------------------------------------------------------------------------
# The family: named configurations, FLOP formula
# --------------------------------------------------------------------------------------------------

SC21_FORMULA = ("Megatron-LM (Narayanan et al. SC'21 eq. 3): 96·B·s·l·h²·(1 + s/6h + V/16lh) with full "
                "recomputation, 72·B·s·l·h²·(1 + s/6h + V/12lh) without (+ 4·B·s²·h·l for selective)")


def sc21_applies(cfg: TransformerConfig) -> bool:
    """Whether eq. 3 counts this GPT's FLOPs: its derivation assumes a 4h MLP and full causal attention
    over ``a`` heads of ``h / a`` channels (QKV ``3h^2``, projection ``h^2`` per token) -- not another MLP
    width, a sliding window, grouped-query attention or a ``head_dim`` with ``a*d != h``."""
    return (cfg.ffn_hidden_size == 4 * cfg.hidden_size and cfg.sliding_window is None
            and cfg.num_query_groups == cfg.num_attention_heads
            and cfg.kv_channels * cfg.num_attention_heads == cfg.hidden_size)


def sc21_flops_per_iteration(*, batch: int, seq: int, layers: int, hidden: int, vocab: int,
                             full_recompute: bool) -> float:
    """Narayanan et al. SC'21 eq. 3: ``96·B·s·l·h²·(1 + s/6h + V/16lh)`` FLOPs per iteration with full
    activation recomputation; ``72·B·s·l·h²·(1 + s/6h + V/12lh)`` without (fwd + bwd only)."""
    if full_recompute:
        return 96 * batch * seq * layers * hidden ** 2 * (1 + seq / (6 * hidden) + vocab / (16 * layers * hidden))
    return 72 * batch * seq * layers * hidden ** 2 * (1 + seq / (6 * hidden) + vocab / (12 * layers * hidden))


class GPTFamily(ModelFamily):
    """Megatron GPT. FLOPs: SC'21 eq. 3 where it applies (:func:`sc21_applies`), else traced."""

    name = "gpt"
    activations = ("gelu", "squared_relu")
    config_type = TransformerConfig
    hf_model_types = ("gpt2", "bloom")

    def build(self, cfg: TransformerConfig, *, tp: TPContext | None = None, ep: int = 1) -> nn.Module:
        self.check_sizes(cfg, ep=ep)
        return GPT(cfg, tp) if tp is not None else GPT(cfg)

    def flops(self, cfg: TransformerConfig, parallel, graph) -> Flops:
        if not sc21_applies(cfg):
            return traced_flops(parallel, graph)
        gbs = parallel.global_batch_size
        args = {"batch": gbs, "seq": cfg.seq_length, "layers": cfg.num_layers, "hidden": cfg.hidden_size,
                "vocab": cfg.vocab_size}
        model = sc21_flops_per_iteration(full_recompute=False, **args)
        hw = sc21_flops_per_iteration(full_recompute=parallel.recompute_granularity == "full", **args)
        if parallel.recompute_granularity == "full" and parallel.recompute_method is not None:  # some layers
            hw = model + (hw - model) * parallel.recomputed_layer_fraction(cfg.num_layers)
        if parallel.recompute_granularity == "selective":  # the attention core's QK^T and AV again
            hw += 4 * gbs * cfg.seq_length ** 2 * cfg.hidden_size * cfg.num_layers
        return Flops(model, hw, SC21_FORMULA)

    def from_hf(self, d: dict, *, name: str, seq_length: int | None) -> TransformerConfig:
        """``gpt2`` configs, and ``bloom`` ones (ALiBi, the embedding LayerNorm, no position table)."""
        if d.get("model_type") == "bloom":
            return self._from_hf_bloom(d, name=name, seq_length=seq_length)
        return TransformerConfig(
            name=name, architecture="gpt", num_layers=d["n_layer"], hidden_size=d["n_embd"],
            num_attention_heads=d["n_head"], ffn_hidden_size=d.get("n_inner") or 4 * d["n_embd"],
            seq_length=seq_length or d["n_positions"], max_position_embeddings=d["n_positions"],
            vocab_size=d["vocab_size"], norm_epsilon=d.get("layer_norm_epsilon", 1e-5),
            source="Hugging Face config.json")

    @staticmethod
    def _from_hf_bloom(d: dict, *, name: str, seq_length: int | None) -> TransformerConfig:
        """BLOOM (``BloomConfig``: ``n_layer``, ``hidden_size``, ``n_head``; 4h GELU MLP with biases, ALiBi,
        ``word_embeddings_layernorm``, tied output layer). Sequence: 2048 (BLOOM's training length) unless
        given."""
        hidden = d.get("hidden_size") or d["n_embed"]
        return TransformerConfig(
            name=name, architecture="gpt", num_layers=d["n_layer"], hidden_size=hidden,
            num_attention_heads=d["n_head"], seq_length=seq_length or 2048, vocab_size=d["vocab_size"],
            position_embedding_type="alibi", embedding_layernorm=True,
            norm_epsilon=d.get("layer_norm_epsilon", 1e-5), source="Hugging Face config.json")


_SC21 = "Narayanan et al. SC'21 (arXiv:2104.04473) Table 1"
# (name, published params in billions, heads, hidden, layers): SC'21 Table 1, weak-scaling rows.
_SC21_TABLE1 = [
    ("gpt-1.7b", 1.7, 24, 2304, 24), ("gpt-3.6b", 3.6, 32, 3072, 30), ("gpt-7.5b", 7.5, 32, 4096, 36),
    ("gpt-18b", 18.4, 48, 6144, 40), ("gpt-39b", 39.1, 64, 8192, 48), ("gpt-76b", 76.1, 80, 10240, 60),
    ("gpt-145b", 145.6, 96, 12288, 80), ("gpt-310b", 310.1, 128, 16384, 96),
    ("gpt-530b", 529.6, 128, 20480, 105), ("gpt-1t", 1008.0, 160, 25600, 128),
]


def _gpt(name: str, params: float, heads: int, hidden: int, layers: int, source: str) -> TransformerConfig:
    return TransformerConfig(name=name, architecture="gpt", num_layers=layers, hidden_size=hidden,
                             num_attention_heads=heads, seq_length=2048, vocab_size=51200,
                             published_params=params, source=source)


FAMILIES = (GPTFamily(),)
CONFIGS = (
    *(_gpt(*row, source=_SC21) for row in _SC21_TABLE1),
    _gpt("gpt3-175b", 175.0, 96, 12288, 96, "Brown et al. 2020 (arXiv:2005.14165) Table 2.1"),
    TransformerConfig(name="bloom-176b", architecture="gpt", num_layers=70, hidden_size=14336,
                      num_attention_heads=112, seq_length=2048, vocab_size=250880, position_embedding_type="alibi",
                      embedding_layernorm=True, published_params=176.247271424,
                      source="BigScience Workshop 2022 (arXiv:2211.05100) Table 3 and the bigscience/bloom model "
                             "card: 176,247,271,424 parameters"),
)
"""Megatron GPT sizes from Narayanan et al. SC'21 (arXiv:2104.04473) Table 1 (vocabulary 51200,
sequence 2048); GPT-3 175B from Brown et al. 2020 (arXiv:2005.14165) Table 2.1; BLOOM 176B (Megatron-
DeepSpeed GPT with ALiBi and the embedding LayerNorm) from BigScience Workshop 2022 (arXiv:2211.05100)."""
