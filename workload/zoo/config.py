"""Model configurations, with Megatron-LM's field names (``megatron/core/transformer/transformer_config.py``).

Frozen, keyword-only dataclasses; ``__post_init__`` checks raise ``ValueError`` naming the field.

A field derived from another when left out (:data:`DERIVED_FIELDS`: ``num_query_groups``,
``ffn_hidden_size``, ``max_position_embeddings``) is annotated with the type every built config holds
(``int``) and defaults to ``None``, which only ever reaches ``__post_init__``: it replaces it by the
derived value before anyone else can read the field.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass
from typing import Any, Literal

ATTENTION_BACKENDS = ("flash", "flash2", "flash3", "cudnn", "efficient", "unfused")
"""``[model] attention_backend`` values: every one but ``unfused`` is one fused kernel per pass."""


@dataclass(frozen=True, kw_only=True, slots=True)
class TransformerConfig:
    """A decoder (GPT, Llama, Mixtral) or encoder (BERT) transformer."""

    name: str
    """Zoo name, e.g. ``gpt3-175b``."""
    architecture: Literal["gpt", "llama", "mixtral", "bert"]
    """Its model family (:mod:`workload.zoo.registry`), whose module builds it: :class:`~workload.zoo.gpt.GPT`,
    :class:`~workload.zoo.llama.Llama` (also Mixtral, with ``num_moe_experts``) or
    :class:`~workload.zoo.bert.Bert`. A family with more fields subclasses this config and narrows the
    field (:class:`workload.zoo.qwen3_moe.Qwen3MoEConfig`: ``"qwen3_moe"``)."""
    num_layers: int
    """Transformer blocks, l."""
    hidden_size: int
    """Model width, h."""
    num_attention_heads: int
    """Query heads, a; must divide ``hidden_size`` unless ``head_dim`` is given."""
    # The three ``= None  # type: ignore[assignment]`` defaults: see the module docstring.
    num_query_groups: int = None  # type: ignore[assignment]
    """Key/value heads for grouped-query attention; left out (``None``): ``num_attention_heads`` (MHA)."""
    head_dim: int | None = None
    """Channels per attention head, d (Megatron-LM ``--kv-channels``, Hugging Face ``head_dim``); ``None``:
    ``hidden_size / num_attention_heads``. Q and the attention output are ``a*d`` wide, K and V ``g*d``: the
    QKV projection is ``h -> (a + 2g)*d`` and the output projection ``a*d -> h`` (Mistral-Nemo 12B: h 5120,
    a 32, d 128, so ``a*d = 4096 != h``; Qwen3: d 128 with h / a = 64). Read through :attr:`kv_channels`."""
    ffn_hidden_size: int = None  # type: ignore[assignment]
    """MLP inner width; left out (``None``): ``4 * hidden_size``."""
    seq_length: int = 2048
    """Training sequence length, s (tokens per sample)."""
    vocab_size: int = 51200
    """Vocabulary size, V (Megatron's padded size where the paper states it)."""
    max_position_embeddings: int = None  # type: ignore[assignment]
    """Rows of the learned position table; left out (``None``): ``seq_length``."""
    normalization: Literal["LayerNorm", "RMSNorm"] = "LayerNorm"
    activation: Literal["gelu", "swiglu", "squared_relu"] = "gelu"
    """MLP non-linearity: GELU (GPT, BERT), SwiGLU (the Llama family's gated MLP), or squared ReLU,
    relu(x)^2 (Nemotron-4, arXiv:2402.16819; Megatron-LM ``--squared-relu``)."""
    position_embedding_type: Literal["learned_absolute", "rope", "alibi", "none"] = "learned_absolute"
    """Megatron-LM ``--position-embedding-type``: a learned table (GPT), rotary (Llama), ``alibi`` (no
    position table, no RoPE kernels: a per-head linear distance bias on the attention scores, added by
    the fused kernel; Press et al. 2022, arXiv:2108.12409; BLOOM) or ``none`` (no positions, NoPE)."""
    rotary_base: float = 10000.0
    """RoPE base θ (Llama 2: 1e4, Llama 3: 5e5, Mixtral: 1e6)."""
    untie_embeddings_and_output_weights: bool = False
    """Separate output layer (Llama) instead of reusing the input embedding (GPT, BERT)."""
    add_bias_linear: bool = True
    """Biases in the linear layers (GPT/BERT yes, Llama no)."""
    causal: bool = True
    """Causal self-attention (decoders) or bidirectional (BERT)."""
    norm_epsilon: float = 1e-5
    num_moe_experts: int | None = None
    """Experts per MoE layer; ``None`` for a dense MLP."""
    moe_router_topk: int = 2
    """Experts each token is routed to."""
    moe_capacity_factor: float = 1.0
    """Tokens per expert = ceil(capacity_factor · tokens · topk / experts) (uniform routing assumed)."""
    sliding_window: int | None = None
    """Causal sliding-window attention (Mistral; Hugging Face ``sliding_window``, Megatron-LM
    ``--window-size (W - 1, 0)``): each query sees the ``W`` keys up to and including itself;
    ``None``: full causal attention. FlashAttention skips the key blocks outside it."""
    sliding_window_pattern: int | None = None
    """With ``sliding_window``: every K-th layer is global, the rest local (layer i, 0-based, is global
    when ``(i + 1) % K == 0``; Gemma 2: 2, Gemma 3: 6; Megatron-LM ``--window-attn-skip-freq``)."""
    window_layers: tuple[int, ...] | None = None
    """With ``sliding_window``: the (0-based) layers that use it, the others global (Hugging Face's
    ``layer_types`` entries ``"sliding_attention"``); exclusive with ``sliding_window_pattern``."""
    attention_sinks: int = 0
    """With ``sliding_window``: the first N tokens every query also attends to (StreamingLLM's attention
    sinks, Xiao et al. 2023, arXiv:2309.17453): a query at position p sees ``min(p + 1, W + N)`` keys."""
    embedding_layernorm: bool = False
    """A LayerNorm right after the word embedding (BLOOM's ``word_embeddings_layernorm``; RMSNorm when
    ``normalization`` is RMSNorm)."""
    num_tokentypes: int = 0
    """BERT segment (token-type) embeddings; 0 for decoders."""
    attention_backend: Literal["flash", "flash2", "flash3", "cudnn", "efficient", "unfused"] = "flash"
    """``flash``: the framework's default fused kernel for the GPU generation (one fwd, one bwd);
    ``flash2`` / ``flash3`` (FlashAttention-2 / -3), ``cudnn`` (cuDNN fused attention: TE, SDPA's cuDNN
    backend), ``efficient`` (SDPA's memory-efficient kernel): that kernel, priced by its calibration
    (:attr:`hwmodel.ir.Compute.attention_kernel`). ``unfused``: Megatron-LM's 2021-22 path -- QK^T
    batched GEMM, fused scale-mask-softmax, attention dropout, attention x V -- whose s x s tensors are
    what selective recomputation avoids storing (Korthikanti et al. 2022)."""
    separate_projections: bool | None = None
    """The block's input projections as separate GEMMs -- ``wq``, ``wk``, ``wv`` and SwiGLU's ``w1``, ``w3``
    (torchtitan's and Hugging Face's Llama) -- rather than Megatron-Core's fused ``linear_qkv`` and
    gate/up ``fc1``. Same parameters and FLOPs; each GEMM reads the input again, each data-gradient
    GEMM writes a gradient that autograd then sums, and per-op SAC counts seven GEMMs. With grouped-query
    attention both models also copy K and V to the query heads before SDPA (``repeat_kv``,
    :func:`workload.zoo.gpt.repeat_kv`), and the backward sums the copies' gradients. ``None`` (unset):
    the stack's own model -- separate under ``fsdp = true`` (PyTorch's stack, torchtitan's model), fused
    otherwise; an explicit ``true``/``false`` is kept."""
    rotary_complex: bool | None = None
    """RoPE as torchtitan's (Meta's Llama) ``apply_rotary_emb`` in ``torchtitan/models/llama3/model.py``:
    adjacent pairs of each head as fp32 complex numbers -- ``view_as_complex(x.float().reshape(..., -1,
    2))``, a complex multiply by ``freqs_cis``, ``view_as_real(...).flatten(3)``, ``.type_as(x)`` -- three
    kernels per q and per k in eager (cast to fp32, complex64 multiply, cast back), rather than the
    rotate-half form in the training dtype (Megatron-Core's unfused ``apply_rotary_pos_emb``). Same
    maths; unset (``None``), eager ``fsdp = true`` (PyTorch's stack, torchtitan's model) sets it, torch.compile fuses
    either form into one kernel."""
    hidden_dropout: float = 0.0
    """Dropout after the attention and MLP blocks (GPT-3 / Megatron: 0.1)."""
    attention_dropout: float = 0.0
    """Dropout on the attention probabilities (unfused backend only; GPT-3 / Megatron: 0.1)."""
    published_params: float | None = None
    """Parameter count the source states, in billions (a cross-check, not used for computation)."""
    source: str = ""
    """Where the dimensions come from."""

    def __post_init__(self) -> None:
        check_field_types(type(self), {f.name: getattr(self, f.name) for f in dataclasses.fields(self)},
                          str(self.name))
        # Megatron-Core's TransformerConfig asserts this only when kv_channels is not given
        if self.head_dim is None and self.hidden_size % self.num_attention_heads:
            raise ValueError(f"{self.name}: num_attention_heads={self.num_attention_heads} must divide "
                             f"hidden_size={self.hidden_size} (or give head_dim)")
        if self.head_dim is not None and self.position_embedding_type == "rope" and self.head_dim % 2:
            raise ValueError(f"{self.name}: head_dim must be a positive even integer (RoPE rotates pairs), "
                             f"got {self.head_dim}")
        if self.num_query_groups is None:
            object.__setattr__(self, "num_query_groups", self.num_attention_heads)
        if self.num_query_groups <= 0 or self.num_attention_heads % self.num_query_groups:
            raise ValueError(f"{self.name}: num_query_groups={self.num_query_groups} must divide "
                             f"num_attention_heads={self.num_attention_heads}")
        if self.ffn_hidden_size is None:
            object.__setattr__(self, "ffn_hidden_size", 4 * self.hidden_size)
        if self.max_position_embeddings is None:
            object.__setattr__(self, "max_position_embeddings", self.seq_length)
        if self.seq_length > self.max_position_embeddings and self.position_embedding_type == "learned_absolute":
            raise ValueError(f"{self.name}: seq_length={self.seq_length} exceeds "
                             f"max_position_embeddings={self.max_position_embeddings}")
        if self.num_moe_experts is not None and not 1 <= self.moe_router_topk <= self.num_moe_experts:
            raise ValueError(f"{self.name}: moe_router_topk={self.moe_router_topk} must be in "
                             f"[1, num_moe_experts={self.num_moe_experts}]")
        for f in ("hidden_dropout", "attention_dropout"):
            if not 0.0 <= getattr(self, f) < 1.0:
                raise ValueError(f"{self.name}: {f} must be in [0, 1), got {getattr(self, f)}")
        if self.attention_backend not in ATTENTION_BACKENDS:
            raise ValueError(f"{self.name}: attention_backend: unknown {self.attention_backend!r}; "
                             f"allowed: {', '.join(ATTENTION_BACKENDS)}")
        if self.moe_capacity_factor < 1.0:
            raise ValueError(f"{self.name}: moe_capacity_factor={self.moe_capacity_factor} must be >= 1")
        if self.num_layers > MAX_LAYERS:
            raise ValueError(f"{self.name}: num_layers={self.num_layers} is above {MAX_LAYERS} (the deepest published "
                             f"LLMs have ~100-200 layers; tracing builds every layer on the meta device)")
        self._check_attention_keys()

    def _check_attention_keys(self) -> None:
        """Windows, sinks and ALiBi: what needs what, and which kernels run them.

        Raises:
            ValueError: one line naming the field and what it needs.
        """
        name, window = self.name, self.sliding_window
        if window is None:
            for f in ("sliding_window_pattern", "window_layers"):
                if getattr(self, f) is not None:
                    raise ValueError(f"{name}: {f} needs sliding_window (the window's size in tokens)")
            if self.attention_sinks:
                raise ValueError(f"{name}: attention_sinks={self.attention_sinks} needs sliding_window "
                                 f"(without a window every key is visible already)")
        else:
            if not self.causal:
                raise ValueError(f"{name}: sliding_window is a causal window; this model is bidirectional "
                                 f"(causal = false)")
            if self.sliding_window_pattern is not None and self.window_layers is not None:
                raise ValueError(f"{name}: give sliding_window_pattern or window_layers, not both")
            bad = [i for i in self.window_layers or () if not 0 <= i < self.num_layers]
            if bad or len(set(self.window_layers or ())) != len(self.window_layers or ()):
                raise ValueError(f"{name}: window_layers must be distinct layer indices in [0, "
                                 f"{self.num_layers - 1}], got {list(self.window_layers or ())}")
        masked = window is not None or self.position_embedding_type == "alibi"
        if masked and self.attention_backend == "efficient":
            raise ValueError(f"{name}: attention_backend 'efficient' (SDPA's memory-efficient kernel) takes a "
                             f"window or ALiBi only as a dense mask; use flash, flash2, flash3, cudnn or unfused")
        if self.position_embedding_type == "alibi" and self.attention_backend == "flash3":
            raise ValueError(f"{name}: attention_backend 'flash3': FlashAttention-3 has no ALiBi (alibi_slopes "
                             f"is FlashAttention-2's); use flash, flash2, cudnn or unfused")
        if self.architecture == "bert" and self.position_embedding_type != "learned_absolute":
            raise ValueError(f"{name}: position_embedding_type: BERT is built with learned_absolute "
                             f"positions only, got {self.position_embedding_type!r}")

    def layer_window(self, layer: int) -> int:
        """The sliding window of layer ``layer`` (0-based), in keys; 0 for a global (full causal) layer."""
        if self.sliding_window is None:
            return 0
        if self.window_layers is not None:
            return self.sliding_window if layer in self.window_layers else 0
        if self.sliding_window_pattern is not None and (layer + 1) % self.sliding_window_pattern == 0:
            return 0
        return self.sliding_window

    @property
    def kv_channels(self) -> int:
        """Head dimension d: ``head_dim``, or h / a when it is not given."""
        return self.head_dim if self.head_dim is not None else self.hidden_size // self.num_attention_heads


@dataclass(frozen=True, kw_only=True, slots=True)
class ResNetConfig:
    """A bottleneck ResNet (He et al. 2016, arXiv:1512.03385, Table 1)."""

    name: str
    architecture: Literal["resnet"] = "resnet"
    """Its model family, :class:`workload.zoo.resnet.ResNetFamily`."""
    blocks_per_stage: tuple[int, ...] = (3, 4, 6, 3)
    """Bottleneck blocks in each of the four stages (ResNet-50: 3, 4, 6, 3)."""
    base_width: int = 64
    num_classes: int = 1000
    image_size: int = 224
    published_params: float | None = None
    source: str = ""

    def __post_init__(self) -> None:
        check_field_types(type(self), {f.name: getattr(self, f.name) for f in dataclasses.fields(self)},
                          str(self.name))
        if not self.blocks_per_stage or min(self.blocks_per_stage) <= 0:
            raise ValueError(f"{self.name}: blocks_per_stage must be positive, got {self.blocks_per_stage}")
        for f in ("base_width", "num_classes", "image_size"):
            if getattr(self, f) <= 0:
                raise ValueError(f"{self.name}: {f} must be positive, got {getattr(self, f)}")


ModelConfig = TransformerConfig | ResNetConfig

MAX_LAYERS = 2048
"""Upper bound on ``num_layers``: 16x the deepest published transformer (GPT 1T, 128 layers; Llama 3 405B,
126), so a typo (``100000``) is refused at once instead of tracing for minutes (1,000 layers trace in ~5 s)."""

POSITIVE_FIELDS = frozenset({
    "num_layers", "hidden_size", "num_attention_heads", "num_query_groups", "ffn_hidden_size", "seq_length",
    "vocab_size", "max_position_embeddings", "num_moe_experts", "moe_router_topk", "moe_capacity_factor",
    "rotary_base", "norm_epsilon", "base_width", "num_classes", "image_size", "blocks_per_stage",
    "sliding_window", "sliding_window_pattern", "head_dim"})
"""Sizes and other fields that must be > 0 (the rest of the numeric fields must be >= 0)."""


def _describe(tp: Any) -> str:
    """A field type in words: ``int | None`` -> "a positive integer", ``Literal["a", "b"]`` -> "one of ..."."""
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(a) for a in typing.get_args(tp) if a is not type(None))
    if origin is tuple:
        return "a list of integers"
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string"}.get(tp, str(tp))


def _type_ok(tp: Any, value: Any) -> bool:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return value in typing.get_args(tp) and not isinstance(value, bool)
    if origin in (typing.Union, types.UnionType):
        return any(_type_ok(a, value) for a in typing.get_args(tp))
    if tp is type(None):
        return value is None
    if origin is tuple:
        return isinstance(value, (tuple, list)) and all(_type_ok(int, v) for v in value)
    if tp is bool:
        return isinstance(value, bool)
    if tp is int:  # bool is an int subclass in Python, not in a config
        return isinstance(value, int) and not isinstance(value, bool)
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return isinstance(value, tp)


def check_field_types(cls: type, values: dict[str, Any], owner: str) -> None:
    """Check ``values`` against the field types of the config dataclass ``cls`` (``bool`` is not an
    ``int``; an ``int`` is accepted where a ``float`` is; ``None`` is, for a field of
    :data:`DERIVED_FIELDS`: "derive it"), and sizes (:data:`POSITIVE_FIELDS`) for > 0.

    Raises:
        ValueError: one line naming the field, what it must be and the value given.
    """
    hints = typing.get_type_hints(cls)
    for name, value in values.items():
        tp = hints.get(name)
        if tp is None or (value is None and name in DERIVED_FIELDS):
            continue
        positive = name in POSITIVE_FIELDS
        if not _type_ok(tp, value):
            want = _describe(tp)
            if positive:
                want = want.replace("an integer", "a positive integer").replace("a number", "a positive number")
            raise ValueError(f"{owner}: {name} must be {want}, got {value!r}")
        nums = value if isinstance(value, (tuple, list)) else (value,)
        for v in nums:
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                if positive and v <= 0:
                    raise ValueError(f"{owner}: {name} must be positive, got {value!r}")
                if v < 0:
                    raise ValueError(f"{owner}: {name} must be >= 0, got {value!r}")

# Fields whose ``None`` default is derived from another field: (field, source field, factor).
_DERIVED = (("num_query_groups", "num_attention_heads", 1), ("ffn_hidden_size", "hidden_size", 4),
            ("max_position_embeddings", "seq_length", 1))
DERIVED_FIELDS = frozenset(f for f, _, _ in _DERIVED)
"""Fields that may be given as ``None`` (or left out) and are then derived in ``__post_init__``."""


def with_overrides(config: ModelConfig, **overrides) -> ModelConfig:
    """``dataclasses.replace`` that re-derives defaulted fields (``ffn_hidden_size = 4h`` follows a new
    ``hidden_size`` unless it was set explicitly).

    Raises:
        ValueError: an unknown field, or an invalid result.
    """
    fields = {f.name for f in dataclasses.fields(config)}
    bad = sorted(set(overrides) - fields)
    if bad:
        raise ValueError(f"{config.name}: unknown config field(s) {bad}; fields: {sorted(fields)}")
    check_field_types(type(config), overrides, config.name)
    for f in ("blocks_per_stage", "window_layers"):  # a TOML array is a list; the config holds a tuple
        if isinstance(overrides.get(f), list):
            overrides[f] = tuple(overrides[f])
    if isinstance(config, TransformerConfig):
        for f, src, factor in _DERIVED:
            if f not in overrides and src in overrides and getattr(config, f) == factor * getattr(config, src):
                overrides[f] = None
    return dataclasses.replace(config, **overrides)


def padded_vocab_size(config: TransformerConfig, tensor_parallel_degree: int = 1,
                      divisible_by: int = 128) -> int:
    """Megatron's ``_vocab_size_with_padding``: V rounded up to a multiple of ``divisible_by · tp``."""
    multiple = divisible_by * tensor_parallel_degree
    return -(-config.vocab_size // multiple) * multiple


def validate_tensor_parallel(config: ModelConfig, tensor_parallel_degree: int) -> None:
    """Check that Megatron-style tensor parallelism of degree ``tp`` can split this model.

    Heads, query groups and the MLP width must divide evenly (column/row-parallel linears split them).
    The vocabulary is not checked here: Megatron pads it (:func:`padded_vocab_size`), but the zoo's
    vocab-parallel embedding shards it unpadded, so :meth:`workload.parallel.config.ParallelConfig.validate_model`
    requires ``tp`` to divide it.

    Raises:
        ValueError: naming the quantity and both numbers.
    """
    tp = tensor_parallel_degree
    if tp < 1:
        raise ValueError(f"tensor_parallel_degree must be >= 1, got {tp}")
    from workload.zoo.registry import family_of

    if not family_of(config).transformer:  # no Megatron layers to split (ResNet)
        return
    for f in ("num_attention_heads", "num_query_groups", "ffn_hidden_size"):
        v = getattr(config, f)
        if v % tp:
            raise ValueError(f"{config.name}: {f}={v} is not divisible by tensor_parallel_degree={tp}")
