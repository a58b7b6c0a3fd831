"""Memory per GPU for a parallel training configuration: parameters, gradients, optimizer states,
activations, and an out-of-memory verdict.

Plain arguments (tp, pp, dp, cp, ep, micro-batch, recompute, ZeRO stage), and a model config read by
attribute names (Megatron's: ``num_layers``, ``hidden_size``, ``num_attention_heads``, ``seq_length``,
``vocab_size``, ``ffn_hidden_size``, ``num_query_groups``, ...; Hugging Face names are accepted too), so
:class:`workload.zoo.config.TransformerConfig`, a ``SimpleNamespace`` or a dict all work.

**Activations** follow Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
Models" (arXiv:2205.05198), §4 and Table 2. Per transformer layer, in bytes, with 16-bit activations and
1-byte dropout masks (s sequence, b micro-batch, h hidden, a heads, t tensor-parallel size)::

    no parallelism                         s*b*h*(34 + 5*a*s/h)                 (eq. 1)
    tensor parallel (TP)                   s*b*h*(10 + 24/t + 5*a*s/(h*t))      (eq. 2)
    TP + sequence parallel (SP)            s*b*h/t*(34 + 5*a*s/h)               (eq. 4)
    selective recompute, TP                s*b*h*(10 + 24/t)                    (Table 2)
    selective recompute, TP + SP           34*s*b*h/t                           (eq. 6)
    full recompute                         2*s*b*h        (layer input only; /t with SP, see below)

Of the 34: 10 s*b*h are never split by TP (two layer-norm inputs 4, the QKV and MLP inputs 2+2, two
dropout masks 2), 24 s*b*h are (Q, K, V 6, attention-projection input 2, GeLU input and output 16);
5*a*s^2*b is the attention score, softmax and dropout.

**Dropout**: the paper's figures assume dropout on (GPT-3, Megatron: 0.1). Megatron stores no mask for a
dropout of probability 0 (``torch.nn.functional.dropout`` returns its input), so with ``hidden_dropout``
0 the two per-layer masks (``2sbh``) and the embedding's (``sbh``) go, and with ``attention_dropout`` 0
the attention core keeps only the softmax output, ``2*a*s^2*b`` of the ``5*a*s^2*b`` (the ``a*s^2*b``
mask and the ``2*a*s^2*b`` dropout output go; with FlashAttention nothing changes: it regenerates its
mask from the RNG state). A config without dropout fields gets Megatron's defaults, 0.1 and 0.1.

:func:`activation_bytes_per_layer` computes the same decomposition for any MLP width, grouped-query
attention, SwiGLU and top-k MoE; for GPT (4h GeLU MLP, MHA) it is exactly the paper's closed forms. With
full recompute Table 2 lists ``2sbhL`` (no SP); with SP Megatron checkpoints the sequence-sharded layer
input, so this module uses ``2sbh/t`` then. Full recomputation of some layers only (Megatron-LM's
``--recompute-method uniform|block``) stores per chunk what :mod:`workload.parallel.recompute` gives.

**Pipeline** (§4.2.3): with 1F1B the first stage holds ``p`` micro-batches in flight, each over ``L/p``
layers, i.e. ``L`` layers' worth regardless of ``p``; stage ``i`` holds ``p - i``. Uneven stages
(``stage_layers``, e.g. Megatron's ``num_layers_in_first_pipeline_stage``) scale a stage's parameters and
activations with its own layer count; the busiest stage is reported. Interleaving with ``v``
model chunks per stage multiplies the first stage's by ``1 + (p-1)/(p*v)``.

**Other activations** (§4.3): the embedding dropout mask, ``s*b*h`` bytes (/t with SP) per micro-batch in
flight on the first stage; and on the last stage the final layer norm input ``2sbh``, the output
projection input ``2sbh`` (both /t with SP) and the fp32 logits ``4*s*b*V/t`` for the loss
(``4sbh/t*(1 + V/h)`` with SP, the paper's figure for p = 1).

**Model states** (mixed-precision Adam): bf16 parameters (2 bytes/param); gradients in **fp32, 4 bytes/param,
by default**, because Megatron-LM accumulates and all-reduces main gradients in fp32 for bf16 training
(``accumulate_allreduce_grads_in_fp32``, set automatically with ``--bf16``); ``grad_bytes=2`` gives the
ZeRO paper's fp16 gradients. Optimizer: fp32 master weights + two fp32 Adam moments = 12 bytes/param
(8 when parameters are already fp32). Totals per parameter: 18 bytes (Megatron-LM's distributed-optimizer
doc: "bf16 param, fp32 grads: 18 bytes, 6 + 12/d with the distributed optimizer") or 16 (ZeRO, Rajbhandari
et al. 2020, arXiv:1910.02054, with K = 12). ZeRO stage 1 shards optimizer states over the data-parallel
ranks (dp x cp: context-parallel ranks hold the same weights), stage 2 also gradients, stage 3 also
parameters. fp16's optimizer step adds fp32 copies of the gradients (:attr:`MemoryBreakdown.optimizer_step_grads`).

**FP8 training** (``fp8=True``; Transformer Engine's hybrid recipe, :mod:`workload.fp8`): the bf16
parameters, fp32 gradients and fp32 optimizer states stay; TE adds an FP8 copy of every FP8-GEMM weight
(the weight matrices of QKV, attention projection, fc1 and fc2, experts included; not biases, norms,
router, embedding or output layer), cached across micro-batches, with its transpose for Hopper's dgrad
GEMM: ``FP8_WEIGHT_COPY_BYTES`` = 2 bytes per such weight (:attr:`MemoryBreakdown.fp8_weights`, sharded
over dp x cp with ZeRO-3 like the parameters). Saved activations change where TE keeps the FP8 GEMM
input for the weight gradient instead of the bf16 one (1 byte per element, Korthikanti's terms):

    QKV input, MLP input (norm outputs, quantised by the fused norm)   2 -> 1   (replicated part)
    fc2 input (GeLU / SwiGLU output)                                   2f -> 1f (split part, per token)
    attention projection input                                         2 -> 1 (2 -> 2 + 1 with FlashAttention,
                                                                       which keeps its bf16 output O)

so GPT with FlashAttention stores ``s*b*h*(8 + 21/t)`` per layer instead of ``s*b*h*(10 + 24/t)`` (plus the softmax
statistics). The layer input saved by full recomputation, the norm inputs, Q/K/V and the GeLU/SwiGLU input stay bf16.

**torchtitan's per-op selective checkpointing** (``recompute = "selective_op"``): a block keeps its input (``2sbh``, /t
with SP), every second ``mm``'s output, SDPA's and the TP reduce-scatters' (:func:`workload.parallel.sac.op_sac_bytes`).

The framework's own memory (CUDA context, NCCL buffers, cuBLAS workspace, the caching allocator's
reserved-but-unallocated bytes) and the HBM a process can use are :mod:`workload.allocator`'s;
:meth:`MemoryBreakdown.fits` compares them once :func:`workload.allocator.with_framework` has set them.
Not modelled: GEMM workspace beyond cuBLAS's; Inductor's memory planning beyond compiled SAC's (:func:`op_sac_bytes`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from workload.fp8 import FP8_WEIGHT_COPY_BYTES
from workload.parallel.recompute import stage_chunks, stored_activations
from workload.parallel.sac import op_sac_bytes
from workload.parallel.schedules import interleaved_in_flight

RECOMPUTE_MODES = ("none", "selective", "full", "selective_op")
"""Activation recomputation: none, selective (attention core), full (whole layer), selective_op (torchtitan's)."""

_MISSING = object()


def _attr(cfg: Any, names: tuple[str, ...], default: Any = _MISSING) -> Any:
    """First present, non-None attribute (or key, for a mapping) among ``names``."""
    for n in names:
        v = cfg.get(n) if isinstance(cfg, Mapping) else getattr(cfg, n, None)
        if v is not None:
            return v
    if default is _MISSING:
        raise ValueError(f"model config {getattr(cfg, 'name', '')!r} has none of the attributes {names}")
    return default


@dataclass(frozen=True, kw_only=True)
class TransformerShape:
    """The dimensions the memory model needs, read from any config by :meth:`of`."""

    num_layers: int
    """L."""
    hidden_size: int
    """h."""
    num_attention_heads: int
    """a (query heads)."""
    num_query_groups: int
    """Key/value heads (= a without grouped-query attention)."""
    head_dim: int | None = None
    """Channels per head, d; ``None`` means h / a (Qwen3: 128 with h / a = 64: ``a*d`` is not h)."""
    ffn_hidden_size: int
    """MLP inner width f (per expert)."""
    seq_length: int
    """s."""
    vocab_size: int
    """V."""
    gated_mlp: bool = False
    """SwiGLU-style MLP (three weight matrices, two f-wide fc1 outputs)."""
    learned_position_embeddings: bool = True
    """A learned s x h position table (GPT) rather than rotary (Llama)."""
    tied_embeddings: bool = True
    """The output layer reuses the input embedding."""
    bias: bool = True
    """Biases in the linear layers."""
    layernorm_bias: bool = True
    """LayerNorm (weight and bias) rather than RMSNorm (weight only)."""
    num_experts: int = 1
    """MoE experts per layer (1: dense)."""
    moe_topk: int = 1
    """Experts each token visits."""
    moe_capacity_factor: float = 1.0
    """Token capacity factor of an expert (>= 1)."""
    num_tokentypes: int = 0
    """BERT segment embeddings."""
    qk_norm: bool = False
    """RMSNorm on each head's query and key (Qwen3, Megatron ``qk_layernorm``): two d-wide weights."""
    embedding_norm: bool = False
    """A norm after the word embedding (BLOOM's ``word_embeddings_layernorm``): its weights, and its
    saved input on the first stage."""
    hidden_dropout: float = 0.1
    """Dropout probability after the attention and MLP blocks and on the embeddings (Megatron's default
    0.1 when the config has none); 0 stores no masks."""
    attention_dropout: float = 0.1
    """Dropout probability on the attention probabilities (Megatron's default 0.1 when the config has
    none); 0 stores neither mask nor dropout output."""

    @property
    def query_width(self) -> int:
        """Width of all query heads, ``a*d`` (= h unless ``head_dim`` says otherwise)."""
        return self.num_attention_heads * self.head_dim if self.head_dim else self.hidden_size

    @property
    def kv_width(self) -> int:
        """Width of all key (or value) heads, ``g*d`` (``h*g/a`` without ``head_dim``)."""
        if self.head_dim:
            return self.num_query_groups * self.head_dim
        return self.hidden_size * self.num_query_groups // self.num_attention_heads

    @classmethod
    def of(cls, cfg: Any) -> TransformerShape:
        """Read a config by attribute (or key), Megatron names first, then Hugging Face ones."""
        h = int(_attr(cfg, ("hidden_size", "n_embd", "d_model")))
        a = int(_attr(cfg, ("num_attention_heads", "n_head", "num_heads")))
        activation = str(_attr(cfg, ("activation", "hidden_act", "activation_function"), "gelu")).lower()
        gated = bool(_attr(cfg, ("gated_linear_unit", "swiglu"), False)) or activation in ("swiglu", "silu",
                                                                                           "geglu")
        pos = str(_attr(cfg, ("position_embedding_type",), "learned_absolute")).lower()
        norm = str(_attr(cfg, ("normalization",), "LayerNorm")).lower()
        tie = _attr(cfg, ("tie_word_embeddings",), None)
        untie = _attr(cfg, ("untie_embeddings_and_output_weights",), None)
        tied = (not untie) if untie is not None else (bool(tie) if tie is not None else True)
        experts = _attr(cfg, ("num_moe_experts", "num_experts", "num_local_experts"), 1) or 1
        head_dim = _attr(cfg, ("head_dim", "kv_channels"), None)
        return cls(
            num_layers=int(_attr(cfg, ("num_layers", "n_layer", "num_hidden_layers"))),
            hidden_size=h,
            num_attention_heads=a,
            num_query_groups=int(_attr(cfg, ("num_query_groups", "num_key_value_heads"), a)),
            head_dim=int(head_dim) if head_dim is not None else None,
            qk_norm=bool(_attr(cfg, ("qk_norm", "qk_layernorm"), False)),
            embedding_norm=bool(_attr(cfg, ("embedding_layernorm",), False)),
            ffn_hidden_size=int(_attr(cfg, ("ffn_hidden_size", "intermediate_size", "n_inner"), 4 * h)),
            seq_length=int(_attr(cfg, ("seq_length", "seq_len", "max_position_embeddings", "n_positions"))),
            vocab_size=int(_attr(cfg, ("padded_vocab_size", "vocab_size"))),
            gated_mlp=gated,
            learned_position_embeddings=pos in ("learned_absolute", "learned", "absolute"),
            tied_embeddings=tied,
            bias=bool(_attr(cfg, ("add_bias_linear",), True)),
            layernorm_bias=norm != "rmsnorm",
            num_experts=int(experts),
            moe_topk=int(_attr(cfg, ("moe_router_topk", "num_experts_per_tok"), 1)) if experts > 1 else 1,
            moe_capacity_factor=float(_attr(cfg, ("moe_capacity_factor",), 1.0)),
            num_tokentypes=int(_attr(cfg, ("num_tokentypes",), 0)),
            hidden_dropout=float(_attr(cfg, ("hidden_dropout", "hidden_dropout_prob", "resid_pdrop"), 0.1)),
            attention_dropout=float(_attr(cfg, ("attention_dropout", "attention_probs_dropout_prob", "attn_pdrop"),
                                          0.1)),
        )


# --------------------------------------------------------------------------------------------------
# Parameters
# --------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ParamCounts:
    """Parameter counts of a transformer (elements, not bytes)."""

    embedding: int
    """Word (+ token-type) embedding, V*h."""
    position: int
    """Learned position table, s*h (0 with rotary embeddings)."""
    layer_dense: int
    """One layer's attention + norms + router (+ dense MLP when not MoE)."""
    layer_experts: int
    """One layer's MoE expert MLPs, all experts (0 for dense models)."""
    layer_norms: int
    """Of ``layer_dense``: norm parameters (replicated across tensor-parallel ranks)."""
    final_norm: int
    """Final layer norm."""
    output: int
    """Separate output layer V*h (0 when tied to the embedding)."""
    num_layers: int
    layer_linear_weights: int = 0
    """Of ``layer_dense``: the weight matrices of the attention and (dense) MLP linears, no biases --
    what FP8 training runs in FP8."""
    layer_expert_linear_weights: int = 0
    """Of ``layer_experts``: the experts' weight matrices, no biases."""
    layer_router: int = 0
    """Of ``layer_dense``: the MoE router ``h x experts`` (replicated across tensor-parallel ranks)."""
    embedding_norm: int = 0
    """The norm after the word embedding (BLOOM: LayerNorm, ``2h``)."""

    @property
    def per_layer(self) -> int:
        return self.layer_dense + self.layer_experts

    @property
    def total(self) -> int:
        """All parameters; GPT-3 175B: 174.6e9 (12*L*h^2 + 13*L*h + V*h + s*h + 2h)."""
        return (self.embedding + self.position + self.embedding_norm + self.num_layers * self.per_layer
                + self.final_norm + self.output)


def parameter_count(cfg: Any) -> ParamCounts:
    """Count a transformer's parameters (Megatron GPT layout: per layer ``12h^2 + 13h`` for a 4h GeLU MLP,
    Narayanan et al. 2021 arXiv:2104.04473 §5.1), generalised to GQA, SwiGLU, MoE, RMSNorm, no biases,
    a head width d other than h / a (QKV ``h*(a + 2g)*d``, projection ``a*d*h``) and QK-norm (``2d``)."""
    m = cfg if isinstance(cfg, TransformerShape) else TransformerShape.of(cfg)
    h, f = m.hidden_size, m.ffn_hidden_size
    q, kv = m.query_width, m.kv_width  # query and key/value widths
    bias = 1 if m.bias else 0
    attn_w = h * (q + 2 * kv) + q * h
    mlp_w = (3 if m.gated_mlp else 2) * h * f
    attn = attn_w + bias * (q + 2 * kv) + bias * h
    mlp = mlp_w + bias * ((2 if m.gated_mlp else 1) * f + h)
    norm_one = 2 * h if m.layernorm_bias else h
    norms = 2 * norm_one + (2 * m.head_dim if m.qk_norm and m.head_dim else 0)
    router = h * m.num_experts if m.num_experts > 1 else 0
    dense = attn + norms + router + (mlp if m.num_experts == 1 else 0)
    experts = mlp * m.num_experts if m.num_experts > 1 else 0
    return ParamCounts(
        embedding=m.vocab_size * h + m.num_tokentypes * h,
        position=m.seq_length * h if m.learned_position_embeddings else 0,
        layer_dense=dense, layer_experts=experts, layer_norms=norms,
        final_norm=norm_one, output=0 if m.tied_embeddings else m.vocab_size * h,
        num_layers=m.num_layers,
        layer_linear_weights=attn_w + (mlp_w if m.num_experts == 1 else 0),
        layer_expert_linear_weights=mlp_w * m.num_experts if m.num_experts > 1 else 0,
        layer_router=router, embedding_norm=norm_one if m.embedding_norm else 0)


# --------------------------------------------------------------------------------------------------
# Activations
# --------------------------------------------------------------------------------------------------

# Over 80 lines only by its docstring, which documents each argument; the body is one closed form.
def activation_bytes_per_layer(seq_length: int, micro_batch_size: int, hidden_size: int,
                               num_attention_heads: int, *, tp: int = 1, sequence_parallel: bool = False,
                               recompute: str = "none", cp: int = 1, ffn_hidden_size: int | None = None,
                               num_query_groups: int | None = None, gated_mlp: bool = False,
                               moe_tokens_factor: float = 1.0, flash_attention: bool = False,
                               fp8: bool = False, hidden_dropout: float = 0.1,
                               attention_dropout: float = 0.1, head_dim: int | None = None,
                               qk_norm: bool = False, compiled: bool = False) -> float:
    """Bytes of activations one transformer layer stores for the backward pass, per micro-batch, per GPU.

    Korthikanti et al. 2022 Table 2 (see the module docstring), decomposed so that it generalises:
    ``replicated = 10*s*b*h`` (/t with SP), ``split = (2h + 4*h_kv + 2h + mlp)*s*b / t`` with
    ``mlp = 4f`` (GeLU input and output, 2 bytes each) or ``6f`` (SwiGLU: gate, up, product),
    ``attention core = 5*a*s^2*b / t``. For GPT (f = 4h, h_kv = h) ``10 + 24/t + 5as/(ht)`` exactly,
    with dropout on; without, ``8 + 24/t + 2as/(ht)`` (module docstring).

    Args:
        seq_length: s, tokens per sample (full sequence; divided by ``cp`` here).
        micro_batch_size: b.
        hidden_size: h.
        num_attention_heads: a.
        tp: tensor-parallel size t.
        sequence_parallel: Megatron sequence parallelism (splits the replicated part over t).
        recompute: ``none``, ``selective`` (attention core recomputed), ``full`` (only the layer input) or
            ``selective_op`` (torchtitan's per-op SAC: the region input and the saved op outputs).
        cp: context-parallel size; each rank keeps s/cp queries (the score term uses s/cp x s).
        ffn_hidden_size: f (default 4h).
        num_query_groups: key/value heads (default a).
        gated_mlp: SwiGLU-style MLP.
        moe_tokens_factor: MLP activations scale (top-k x capacity factor for MoE; 1 dense).
        flash_attention: FlashAttention stores no s x s matrices, only fp32 softmax statistics
            (``4*a*s*b/t`` bytes) instead of ``5*a*s^2*b/t``.
        fp8: FP8 training (Transformer Engine): the inputs of the FP8 GEMMs are saved in FP8, see the
            module docstring -- ``replicated = 8*s*b*h``, the attention projection input ``3h`` (with
            FlashAttention) or ``1h``, fc2 input ``1f`` instead of ``2f``.
        hidden_dropout: dropout probability after attention and MLP (default 0.1, Megatron's); 0: the
            two 1-byte masks (``2*s*b*h``) are not stored.
        attention_dropout: dropout probability on the attention probabilities (default 0.1); 0: the
            1-byte mask and the bf16 dropout output (``3*a*s^2*b / t``) are not stored.
        head_dim: channels per head d (default h / a); Q and the attention output are then ``a*d``
            wide, K and V ``g*d``, in place of h and ``h*g/a``.
        qk_norm: RMSNorm on the queries and keys (Qwen3): their inputs are saved too, ``2*(a + g)*d``
            bytes per token, split by t.
        compiled: torch.compile (``[training] compile``): changes ``selective_op`` only (:func:`op_sac_bytes`).

    Raises:
        ValueError: unknown ``recompute``, non-positive sizes or a dropout probability outside [0, 1).
    """
    for name, v in (("hidden_dropout", hidden_dropout), ("attention_dropout", attention_dropout)):
        if not 0.0 <= v < 1.0:
            raise ValueError(f"{name} must be in [0, 1), got {v}")
    if recompute not in RECOMPUTE_MODES:
        raise ValueError(f"recompute must be one of {RECOMPUTE_MODES}, got {recompute!r}")
    for name, v in (("seq_length", seq_length), ("micro_batch_size", micro_batch_size),
                    ("hidden_size", hidden_size), ("num_attention_heads", num_attention_heads), ("tp", tp),
                    ("cp", cp)):
        if v <= 0:
            raise ValueError(f"{name} must be positive, got {v}")
    s_full, b, h, a, t = seq_length, micro_batch_size, hidden_size, num_attention_heads, tp
    s = s_full / cp  # local sequence
    sp = t if sequence_parallel else 1
    if recompute == "full":  # Table 2: 2sbh per layer, the checkpointed layer input
        return 2.0 * s * b * h / sp
    f = ffn_hidden_size if ffn_hidden_size is not None else 4 * h
    q = a * head_dim if head_dim else h  # query / attention-output width
    kv = (num_query_groups or a) * head_dim if head_dim else h * (num_query_groups or a) / a
    if recompute == "selective_op":
        return op_sac_bytes(s * b, h, q, kv, f * moe_tokens_factor, a, t, sp, gated_mlp, compiled=compiled)
    gemm_in = 1.0 if fp8 else 2.0  # bytes per element of a saved FP8-GEMM input
    masks = 2.0 if hidden_dropout > 0 else 0.0  # two 1-byte hidden-dropout masks
    # layer-norm inputs 4, QKV and MLP inputs (norm outputs) 2 x gemm_in, dropout masks
    replicated = (4.0 + 2.0 * gemm_in + masks) * s * b * h / sp
    # MLP: fc1 output (GeLU input f, or SwiGLU gate and up 2f) in bf16, fc2 input f at gemm_in
    mlp = ((4.0 if gated_mlp else 2.0) + gemm_in) * f * moe_tokens_factor
    # attention projection input = attention output; FlashAttention also keeps it in bf16
    proj_in = 2.0 + 1.0 if fp8 and flash_attention else gemm_in
    qk_norm_in = 2.0 * (q + kv) if qk_norm else 0.0  # the query and key before their RMSNorm
    split = (2.0 * q + 4.0 * kv + proj_in * q + qk_norm_in + mlp) * s * b / t
    if recompute == "selective":
        core = 0.0
    elif flash_attention:
        core = 4.0 * a * s * b / t
    else:  # softmax output 2, attention-dropout mask 1 and output 2 (bytes per score)
        core = (5.0 if attention_dropout > 0 else 2.0) * a * s * s_full * b / t
    return replicated + split + core


# --------------------------------------------------------------------------------------------------
# The breakdown
# --------------------------------------------------------------------------------------------------

def _fmt(nbytes: float) -> str:
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(nbytes) >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes:.0f} B"


@dataclass(frozen=True)
class MemoryBreakdown:
    """Memory one GPU needs at its peak, in bytes (1 GB = 10^9 bytes, as HBM datasheets)."""

    parameters: float
    """Model weights held (after ZeRO-3 sharding)."""
    gradients: float
    """Gradients (after ZeRO-2 sharding)."""
    optimizer_states: float
    """fp32 master weights and Adam moments (after ZeRO-1 sharding)."""
    activations: float
    """Activations stored for the backward pass (Korthikanti et al. 2022)."""
    workspace: float = 0.0
    """Transient: one layer's activations rematerialised during backward under recomputation."""
    fp8_weights: float = 0.0
    """FP8 training: Transformer Engine's cached FP8 copies of the FP8-GEMM weights (and transposes)."""
    gather_buffers: float = 0.0
    """ZeRO-3 / FSDP: the unsharded parameters and gradient of the units being gathered and reduced."""
    optimizer_step_grads: float = 0.0
    """fp16 training: the fp32 copies of the gradients the optimizer step holds beside the fp16 ones, once
    the backward's activations are freed."""
    stage: int = 0
    """Pipeline stage this breakdown is for (the one with the largest total unless asked)."""
    params_per_gpu: float = 0.0
    """Parameter elements this GPU owns before ZeRO sharding."""
    detail: Mapping[str, float] = field(default_factory=dict, compare=False, repr=False)
    """Intermediate figures (per-layer activations, micro-batches in flight, ...)."""
    cuda_context: float = 0.0
    """CUDA context and library handles, outside the caching allocator (:mod:`workload.allocator`)."""
    nccl_buffers: float = 0.0
    """NCCL's connection buffers, outside the caching allocator."""
    cublas_workspace: float = 0.0
    """cuBLAS's workspace, allocated through the caching allocator."""
    fragmentation: float = 0.0
    """The caching allocator's reserved-but-unallocated bytes at the peak."""
    usable_hbm: float = 0.0
    """HBM the process can use (``totalGlobalMem``); 0 until :func:`workload.allocator.with_framework`
    has set the framework's figures."""

    @property
    def model_states(self) -> float:
        """Parameters + gradients + optimizer states (bytes)."""
        return self.parameters + self.gradients + self.optimizer_states

    @property
    def backward_peak(self) -> float:
        """Tensors at the backward's peak (bytes): model states, FP8 copies, activations, recompute workspace."""
        return self.model_states + self.fp8_weights + self.activations + self.workspace + self.gather_buffers

    @property
    def total(self) -> float:
        """Tensors at their peak (bytes): :attr:`backward_peak`, or the optimizer step's (no activations)."""
        return max(self.backward_peak, self.model_states + self.fp8_weights + self.optimizer_step_grads)

    @property
    def allocated(self) -> float:
        """Peak bytes the caching allocator hands out (``torch.cuda.max_memory_allocated``): :attr:`total`
        and cuBLAS's workspace."""
        return self.total + self.cublas_workspace

    @property
    def reserved(self) -> float:
        """Peak bytes the caching allocator holds (``torch.cuda.max_memory_reserved``, torchtitan's logged
        memory): :attr:`allocated` + fragmentation at the backward's peak; at the step cached blocks are freed."""
        return max(self.backward_peak + self.cublas_workspace + self.fragmentation,
                   self.model_states + self.fp8_weights + self.optimizer_step_grads + self.cublas_workspace)

    @property
    def device_used(self) -> float:
        """Bytes used on the device: :attr:`reserved`, the CUDA context and NCCL's buffers."""
        return self.reserved + self.cuda_context + self.nccl_buffers

    def need_and_capacity(self, gpu_hbm_bytes: float | Any, headroom_bytes: float = 0.0) -> tuple[float, float, str]:
        """(need, capacity, what) in bytes: device use vs usable HBM once set, else tensors vs ``gpu_hbm_bytes``."""
        if self.usable_hbm and hasattr(gpu_hbm_bytes, "hbm_capacity_bytes"):
            return self.device_used + headroom_bytes, self.usable_hbm, "usable HBM"
        cap = float(getattr(gpu_hbm_bytes, "hbm_capacity_bytes", gpu_hbm_bytes))
        return self.total + headroom_bytes, cap, "HBM"

    def fits(self, gpu_hbm_bytes: float | Any, headroom_bytes: float = 0.0) -> bool:
        """Whether the memory + ``headroom_bytes`` fits: :meth:`need_and_capacity`'s need <= its capacity."""
        need, cap, _ = self.need_and_capacity(gpu_hbm_bytes, headroom_bytes)
        return need <= cap

    def verdict(self, gpu_hbm_bytes: float | Any, headroom_bytes: float = 0.0) -> str:
        """One line: ``fits`` or ``OOM``, the comparison of :meth:`fits`, and the parts that add up to it."""
        need, cap, what = self.need_and_capacity(gpu_hbm_bytes, headroom_bytes)
        parts = (f"parameters {_fmt(self.parameters)}, gradients {_fmt(self.gradients)}, "
                 f"optimizer {_fmt(self.optimizer_states)}, activations {_fmt(self.activations)}")
        if self.fp8_weights:
            parts += f", fp8 weight copies {_fmt(self.fp8_weights)}"
        if self.workspace:
            parts += f", recompute workspace {_fmt(self.workspace)}"
        parts += f", fp32 gradient copies at the optimizer step {_fmt(self.optimizer_step_grads)}" * bool(
            self.optimizer_step_grads)
        g, r = (self.detail.get(f"deepspeed_{k}_elements", 0) for k in ("gathered", "gradient"))  # DeepSpeed's
        parts += (f", gathered parameters {_fmt(self.gather_buffers * g / (g + r))}, unpartitioned gradients "
                  f"{_fmt(self.gather_buffers * r / (g + r))}" if g + r else  # two parts, or FSDP's one term
                  f", ZeRO-3 gather buffers {_fmt(self.gather_buffers)}" * bool(self.gather_buffers))
        if what == "usable HBM":
            parts += (f", cuBLAS workspace {_fmt(self.cublas_workspace)}, fragmentation {_fmt(self.fragmentation)}"
                      f" (reserved {_fmt(self.reserved)}), CUDA context {_fmt(self.cuda_context)}, "
                      f"NCCL buffers {_fmt(self.nccl_buffers)}")
        if headroom_bytes:
            parts += f", headroom {_fmt(headroom_bytes)}"
        if need <= cap:
            share = f"{100 * need / cap:.0f} %"
            return f"fits: {_fmt(need)} of {_fmt(cap)} {what} ({share}; {parts}; stage {self.stage})"
        return f"OOM: needs {_fmt(need)} > {_fmt(cap)} {what} ({parts}; stage {self.stage})"


def _layers_per_stage(m: TransformerShape, *, tp: int, pp: int, dp: int, cp: int, ep: int,
                      micro_batch_size: int, virtual_pipeline_size: int, zero_stage: int, recompute: str,
                      stage: int | None, stage_layers: Sequence[int] | None) -> list[int]:
    """Check :func:`memory_per_gpu`'s arguments and return the layers of each pipeline stage (all its
    model chunks).

    Raises:
        ValueError: see :func:`memory_per_gpu`.
    """
    for name, v in (("tp", tp), ("pp", pp), ("dp", dp), ("cp", cp), ("ep", ep),
                    ("micro_batch_size", micro_batch_size), ("virtual_pipeline_size", virtual_pipeline_size)):
        if int(v) != v or v < 1:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")
    if zero_stage not in (0, 1, 2, 3):
        raise ValueError(f"zero_stage must be 0, 1, 2 or 3, got {zero_stage!r}")
    if recompute not in RECOMPUTE_MODES:
        raise ValueError(f"recompute must be one of {RECOMPUTE_MODES}, got {recompute!r}")
    if m.num_attention_heads % tp:
        raise ValueError(f"tp={tp} must divide num_attention_heads={m.num_attention_heads}")
    if pp > m.num_layers:
        raise ValueError(f"pp={pp} exceeds num_layers={m.num_layers}")
    if m.num_experts > 1 and m.num_experts % ep:
        raise ValueError(f"ep={ep} must divide num_experts={m.num_experts}")
    if stage is not None and not 0 <= stage < pp:
        raise ValueError(f"stage must be in [0, {pp}), got {stage}")
    if stage_layers is None:
        return [m.num_layers // pp + (1 if i < m.num_layers % pp else 0) for i in range(pp)]
    if len(stage_layers) != pp * virtual_pipeline_size or sum(stage_layers) != m.num_layers or any(
            n < 0 for n in stage_layers):
        raise ValueError(f"stage_layers must give pp x virtual_pipeline_size = {pp * virtual_pipeline_size} "
                         f"layer counts summing to num_layers={m.num_layers}, got {list(stage_layers)}")
    return [sum(stage_layers[c * pp + i] for c in range(virtual_pipeline_size)) for i in range(pp)]


# Over 80 lines by its docstring (one entry per argument); the argument checks are in _layers_per_stage,
# and one_stage keeps the per-stage closed forms next to the values they share (hence C901: its branches).
def memory_per_gpu(model_cfg: Any, *, tp: int = 1, pp: int = 1, dp: int = 1, cp: int = 1, ep: int = 1,  # noqa: C901
                   micro_batch_size: int = 1, num_microbatches_in_flight: int | None = None,
                   num_microbatches: int | None = None, virtual_pipeline_size: int = 1,
                   sequence_parallel: bool = False, recompute: str = "none", recompute_method: str | None = None,
                   recompute_num_layers: int | None = None, zero_stage: int = 0,
                   param_bytes: int = 2, grad_bytes: int = 4, optimizer_bytes_per_param: int | None = None,
                   flash_attention: bool = False, fp8: bool = False, unfused_loss: bool = False, compiled: bool = False,
                   stage: int | None = None, stage_layers: Sequence[int] | None = None) -> MemoryBreakdown:
    """Peak memory of one GPU training ``model_cfg`` under a parallel configuration.

    Args:
        model_cfg: a transformer config, read by attribute (see :class:`TransformerShape`).
        tp, pp, dp, cp, ep: tensor, pipeline, data, context and expert parallel sizes.
        micro_batch_size: b, samples per micro-batch.
        num_microbatches_in_flight: micro-batches whose activations the first stage holds at its peak;
            default ``pp`` (1F1B, Korthikanti §4.2.3), capped by ``num_microbatches``. Stage i holds
            ``max(1, in_flight - i)``.
        num_microbatches: micro-batches per iteration (caps the in-flight count), default unlimited.
        virtual_pipeline_size: model chunks per stage, interleaved (1: 1F1B); :func:`interleaved_in_flight`.
        sequence_parallel: Megatron sequence parallelism (with tp > 1).
        recompute: ``none``, ``selective``, ``full`` or ``selective_op`` (torchtitan's per-op SAC).
        recompute_method, recompute_num_layers: with ``full``, Megatron-LM's ``uniform`` / ``block`` over
            each model chunk (:func:`workload.parallel.recompute.stored_activations`); unset: every layer.
        zero_stage: 0-3 (1: optimizer states, 2: + gradients, 3: + parameters sharded over dp*cp; 3 adds
            FSDP's gather buffers, :attr:`MemoryBreakdown.gather_buffers`).
        param_bytes: bytes per parameter (2 for bf16/fp16, 4 for fp32).
        grad_bytes: bytes per gradient element (4: Megatron's fp32 main grads, the default; 2: bf16/fp16).
        optimizer_bytes_per_param: default 12 (fp32 master + Adam m, v) or 8 when ``param_bytes == 4``.
        flash_attention: activations without the s x s score matrices.
        fp8: FP8 training (Transformer Engine hybrid recipe): FP8 weight copies of
            ``FP8_WEIGHT_COPY_BYTES`` (2) bytes per FP8-GEMM weight and FP8 saved GEMM inputs (module
            docstring). ``param_bytes`` and ``grad_bytes`` keep their bf16-training meaning.
        unfused_loss: the loss as ``F.cross_entropy(logits.float(), labels)`` on the bf16 logits (torchtitan's
            ``cross_entropy_loss``), not Megatron's vocab-parallel cross entropy (one fp32 ``4sbV/t``, gradient in
            place): at the loss's backward the bf16 logits (``2sbV/t``, held by the training loop), the fp32 upcast
            (``4sbV/t``), then the log-softmax output's and input's gradients, ``8sbV/t`` beyond the saved ``4sbV/t``.
        compiled: torch.compile of the blocks (``[training] compile``, :func:`activation_bytes_per_layer`).
        stage: report this pipeline stage; default the stage with the largest total.
        stage_layers: layers of each virtual pipeline stage, ``pp * virtual_pipeline_size`` entries in
            Megatron's order (chunk ``c`` of stage ``i`` is entry ``c*pp + i``), as
            :meth:`workload.parallel.config.ParallelConfig.stage_layers` gives them; default the even
            split (the first ``num_layers % pp`` stages one layer more).

    Raises:
        ValueError: a size is not positive, tp does not divide the heads, pp exceeds the layers, an
            unknown recompute mode or ZeRO stage, or ``stage_layers`` of the wrong length or total.
    """
    m = TransformerShape.of(model_cfg)
    per_stage = _layers_per_stage(m, tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, micro_batch_size=micro_batch_size,
                                  virtual_pipeline_size=virtual_pipeline_size, zero_stage=zero_stage,
                                  recompute=recompute, stage=stage, stage_layers=stage_layers)
    opt_bytes = optimizer_bytes_per_param if optimizer_bytes_per_param is not None else (
        12 if param_bytes < 4 else 8)
    sp = sequence_parallel and tp > 1

    counts = parameter_count(m)
    s, b, h, v = m.seq_length, micro_batch_size, m.hidden_size, m.vocab_size
    s_local = s / cp
    def layer_activations(mode: str) -> float:
        return activation_bytes_per_layer(
            s, b, h, m.num_attention_heads, tp=tp, sequence_parallel=sp, recompute=mode, cp=cp,
            ffn_hidden_size=m.ffn_hidden_size, num_query_groups=m.num_query_groups, gated_mlp=m.gated_mlp,
            moe_tokens_factor=m.moe_topk * m.moe_capacity_factor, flash_attention=flash_attention, fp8=fp8,
            hidden_dropout=m.hidden_dropout, attention_dropout=m.attention_dropout, head_dim=m.head_dim,
            qk_norm=m.qk_norm, compiled=compiled)

    per_layer_act = layer_activations(recompute)
    # one layer rematerialised at a time during backward
    workspace = layer_activations("none") - per_layer_act if recompute != "none" else 0.0
    k_layers = recompute == "full" and recompute_method is not None  # Megatron's --recompute-method

    in_flight_first = num_microbatches_in_flight if num_microbatches_in_flight is not None else pp
    if num_microbatches is not None:
        in_flight_first = min(in_flight_first, num_microbatches)
    in_flight_first = max(1, in_flight_first)
    shard = dp * cp  # ranks holding identical weights

    def one_stage(i: int) -> MemoryBreakdown:
        layers = per_stage[i]
        # parameters this GPU owns (elements): tensor-parallel layers, replicated norms and router (a
        # full copy per rank, as the module keeps it), experts over ep
        replicated = counts.layer_norms + counts.layer_router
        dense = (counts.layer_dense - replicated) / tp + replicated
        experts = counts.layer_experts / (ep * tp)
        params = layers * (dense + experts)
        expert_params = layers * experts
        fp8_dense = layers * counts.layer_linear_weights / tp if fp8 else 0.0
        fp8_expert = layers * counts.layer_expert_linear_weights / (ep * tp) if fp8 else 0.0
        if i == 0:
            params += counts.embedding / tp + counts.position + counts.embedding_norm
        if i == pp - 1:
            params += counts.final_norm
            if pp > 1 or not m.tied_embeddings:  # the last stage keeps its own output matrix
                params += m.vocab_size * h / tp
        in_flight = max(1, in_flight_first - i)
        layer_in_flight: float = in_flight
        if virtual_pipeline_size > 1 and pp > 1 and num_microbatches_in_flight is None:  # the layers' chunks
            layer_in_flight = interleaved_in_flight(pp, i, virtual_pipeline_size, num_microbatches)
        act, stage_workspace = per_layer_act * layers * layer_in_flight, workspace
        if k_layers:  # checkpointed groups per model chunk
            chunks = stage_chunks(stage_layers, pp, virtual_pipeline_size, i, layers)
            stored, stage_workspace = stored_activations(recompute_method, recompute_num_layers, chunks,
                                                         full_layer_bytes=layer_activations("none"),
                                                         input_bytes=per_layer_act)
            act = stored * layer_in_flight
        extra = 0.0
        if i == 0 and m.hidden_dropout > 0:  # embedding dropout mask, 1 byte per element (§4.3)
            extra += s_local * b * h / (tp if sp else 1) * in_flight
        if i == 0 and m.embedding_norm:  # the embedding norm's saved input, 2 bytes per element
            extra += 2.0 * s_local * b * h / (tp if sp else 1) * in_flight
        if i == pp - 1:  # final norm input, output projection input, fp32 logits (§4.3)
            extra += (4.0 * s_local * b * h / (tp if sp else 1) + 4.0 * s_local * b * v / tp) * in_flight
            if unfused_loss:  # the log-softmax's two fp32 gradients at the loss's backward, once
                extra += 8.0 * s_local * b * v / tp
        # ZeRO: expert weights are replicated over dp*cp/ep ranks only
        dense_params = params - expert_params
        expert_shard = max(1, shard // ep) if m.num_experts > 1 else shard

        def sharded(nbytes: float, on: bool) -> float:
            if not on:
                return (dense_params + expert_params) * nbytes
            return dense_params * nbytes / shard + expert_params * nbytes / expert_shard

        fp8_copies = FP8_WEIGHT_COPY_BYTES * (fp8_dense / (shard if zero_stage >= 3 else 1)
                                              + fp8_expert / (expert_shard if zero_stage >= 3 else 1))
        return MemoryBreakdown(
            parameters=sharded(param_bytes, zero_stage >= 3),
            gradients=sharded(grad_bytes, zero_stage >= 2),
            optimizer_states=sharded(opt_bytes, zero_stage >= 1),
            activations=act + extra,
            workspace=stage_workspace,
            fp8_weights=fp8_copies,
            gather_buffers=_gather_buffers(counts, m, tp=tp, ep=ep, param_bytes=param_bytes,
                                           grad_bytes=grad_bytes) if zero_stage >= 3 and shard > 1 else 0.0,
            stage=i,
            params_per_gpu=params,
            detail={"activation_bytes_per_layer": per_layer_act, "layers": layers,
                    "microbatches_in_flight": layer_in_flight, "other_activations": extra},
        )

    if stage is not None:
        return one_stage(stage)
    return max((one_stage(i) for i in range(pp)), key=lambda r: (r.total, -r.stage))


def _gather_buffers(counts: ParamCounts, m: TransformerShape, *, tp: int, ep: int, param_bytes: int,
                    grad_bytes: int) -> float:
    """ZeRO-3 / FSDP's unsharded buffers at the backward's peak, bytes: PyTorch FSDP2 (``fully_shard``,
    one unit per block, the embedding and the output layer units of their own, as torchtitan wraps them)
    all-gathers a unit's parameters before its backward and prefetches the next unit's, and reduce-scatters
    the unit's whole gradient (``param_bytes`` each, gradient at ``grad_bytes``: torchtitan reduces in
    fp32). The largest unit is gathered and reduced while the next block is prefetched."""
    layer = (counts.layer_dense - counts.layer_norms) / tp + counts.layer_norms + counts.layer_experts / (ep * tp)
    units = [layer, counts.embedding / tp, (counts.output or m.vocab_size * m.hidden_size) / tp]
    return max(units) * (param_bytes + grad_bytes) + layer * param_bytes


def gb(nbytes: float) -> float:
    """Bytes -> GB (10^9 bytes)."""
    return nbytes / 1e9


__all__ = ["RECOMPUTE_MODES", "TransformerShape", "ParamCounts", "parameter_count",
           "activation_bytes_per_layer", "MemoryBreakdown", "memory_per_gpu", "gb"]

