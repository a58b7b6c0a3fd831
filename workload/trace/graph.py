"""The op graph of a traced training step: :class:`OpRecord` (one aten op) and :class:`OpGraph`.

**FLOP convention.** :attr:`OpRecord.flops` are *model* FLOPs, the count of Megatron-LM's formula
(Narayanan et al., SC'21, arXiv:2104.04473, eq. 3): 2 FLOPs per multiply-accumulate, the backward
pass twice the forward, attention counted over the full ``s × s`` score matrix (causality ignored).
:attr:`OpRecord.kernel_flops` is what the kernel executes: FlashAttention's backward recomputes
``QKᵀ`` (2.5× its forward, the registry's count). :meth:`OpGraph.to_compute_tasks` hands the kernel
count to the hardware model, halved for causal attention (FlashAttention-2 skips the masked blocks),
and marks causal attention kernels with :attr:`hwmodel.ir.Compute.causal`, which the cost model prices.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Literal

from hwmodel.attention_masks import attended_keys
from hwmodel.ir import Compute
from workload.parallel.sac import op_sac_recomputed

Part = Literal["pre", "block", "post"]


@dataclass(frozen=True, slots=True)
class OpRecord:
    """One aten op of a traced training step (one GPU kernel, unfused)."""

    index: int
    """Position in :attr:`OpGraph.ops` (issue order)."""
    name: str
    """aten op, e.g. ``aten.mm`` or ``aten._scaled_dot_product_flash_attention``."""
    kind: str
    """Kernel kind, one of :data:`hwmodel.ir.KERNEL_KINDS`."""
    phase: str
    """``fwd``, ``bwd`` or ``opt``."""
    layer: str
    """Module path that issued it, e.g. ``layers.3.attn.qkv``; ``""`` for the top-level module."""
    part: str
    """``pre`` (the part before the repeated blocks: embedding), ``block`` or ``post`` (final norm, head,
    loss) -- by model structure, so the bwd of the head is ``post`` though it is issued first."""
    block: int | None
    """Index of the repeated block (``layers.<i>``) it belongs to; ``None`` outside the blocks."""
    flops: float
    """Model FLOPs (FLOP), Megatron's convention (see the module docstring)."""
    kernel_flops: float
    """FLOPs the kernel executes (FLOP), causality ignored; differs from ``flops`` for attention bwd."""
    bytes_accessed: float
    """Bytes read + written (B), unfused; stride-0 (broadcast) dims counted once."""
    dtype: str
    """Math dtype: fp32, bf16, fp16, ... (first floating input)."""
    shape: tuple[int, ...]
    """gemm: (batch, m, n, k); attention: (batch, heads, seq_q, seq_kv, head_dim); else ()."""
    in_shapes: tuple[tuple[int, ...], ...]
    out_shapes: tuple[tuple[int, ...], ...]
    deps: tuple[int, ...]
    """Indices of the ops that produced this op's inputs."""
    causal: bool = False
    """Attention only: causal mask (the useful work is about half of ``kernel_flops``)."""
    fp8_scaling: str = ""
    """FP8 GEMMs only: :attr:`hwmodel.ir.Compute.fp8_scaling` (set by :func:`workload.fp8.to_fp8`)."""
    window: int = 0
    """Attention only: causal sliding window, keys per query counting itself; 0: none. ``flops`` count
    the windowed work (:func:`window_fraction`); ``kernel_flops`` stay the full-matrix count."""
    sinks: int = 0
    """Attention only, with ``window``: attention sinks (StreamingLLM's first keys, always visible)."""
    alibi: bool = False
    """Attention only: ALiBi bias on the scores (priced by the cost model, no FLOPs here)."""
    kv_heads: int = 0
    """Attention only: key/value heads the kernel reads (:func:`workload.trace.kinds.attention_kv_heads`);
    0: as many as the query heads, ``shape[1]``."""

    def to_compute(self, *, causal_discount: bool = True) -> Compute:
        """This op as a :class:`hwmodel.ir.Compute` kernel, marked :attr:`~hwmodel.ir.Compute.causal` for
        causal attention (and with its window, sinks and ALiBi). FLOPs are the executed kernel FLOPs:
        ``kernel_flops``, halved for causal attention (with a window: times the scored fraction of the
        ``seq_q x seq_kv`` matrix, :func:`hwmodel.attention_masks.attended_keys`) unless
        ``causal_discount`` is false (then the registry's full count)."""
        if causal_discount and self.window and len(self.shape) == 5:
            sq, skv = self.shape[2], self.shape[3]
            keys = attended_keys(sq, skv, causal=self.causal, window=self.window, sinks=self.sinks)
            flops = self.kernel_flops * keys / (sq * skv)
        else:
            flops = self.kernel_flops * (0.5 if causal_discount and self.causal else 1.0)
        return Compute(name=self.name, kind=self.kind, flops=flops, bytes_accessed=self.bytes_accessed,
                       dtype=self.dtype, shape=self.shape, layer=self.layer, phase=self.phase,
                       causal=self.causal, fp8_scaling=self.fp8_scaling, attention_window=self.window,
                       attention_sinks=self.sinks, attention_alibi=self.alibi, attention_kv_heads=self.kv_heads,
                       conv_stride=conv_stride(self.name, self.in_shapes, self.out_shapes))


def conv_stride(name: str, in_shapes: tuple[tuple[int, ...], ...], out_shapes: tuple[tuple[int, ...], ...]) -> int:
    """The stride of a convolution op from its tensors' shapes: the largest over the spatial dims of input
    size / output size, rounded (a 3x3 "same" convolution: 1; ResNet's downsampling ones: 2); 1 for any
    other op. ``aten.convolution``'s first input and output are x and y; ``aten.convolution_backward``'s
    first two inputs are dL/dy and x (ATen's native_functions.yaml signatures)."""
    if name.endswith(".convolution") and in_shapes and out_shapes:
        x, y = in_shapes[0], out_shapes[0]
    elif name.endswith(".convolution_backward") and len(in_shapes) >= 2:
        y, x = in_shapes[0], in_shapes[1]
    else:
        return 1
    if len(x) != len(y) or len(x) < 3:
        return 1
    return max(1, *(round(i / o) for i, o in zip(x[2:], y[2:], strict=True) if o > 0))


def window_fraction(shape: tuple[int, ...], causal: bool, window: int, sinks: int = 0) -> float:
    """Of the causal work of an attention op of ``shape`` (batch, heads, seq_q, seq_kv, head_dim), the
    fraction a sliding window of ``window`` keys (and ``sinks`` sink keys) keeps; 1 without a window.
    Model FLOPs of a windowed op are the convention's full count times this (S=4096, W=1024: 0.4376)."""
    if not window or len(shape) != 5:
        return 1.0
    sq, skv = shape[2], shape[3]
    return (attended_keys(sq, skv, causal=causal, window=window, sinks=sinks)
            / attended_keys(sq, skv, causal=causal))


@dataclass
class OpGraph:
    """The ops of one training step for one micro-batch, in issue order, with dependency edges."""

    ops: list[OpRecord]
    num_blocks: int = 0
    """Number of repeated blocks (``len(model.layers)``); 0 when the model has none."""
    block_attr: str = "layers"
    """Attribute of the model holding the repeated blocks."""
    info: dict[str, Any] = field(default_factory=dict)
    """Free-form facts about the trace (model class, micro-batch shape, dedup used, ...)."""
    _index: dict[tuple[Any, str], list[OpRecord]] | None = field(default=None, init=False, repr=False,
                                                                  compare=False)

    def __len__(self) -> int:
        return len(self.ops)

    def select(self, phase: str | None = None) -> list[OpRecord]:
        """Ops of one phase (``fwd``/``bwd``/``opt``), or all."""
        return [o for o in self.ops if phase is None or o.phase == phase]

    def total_flops(self, phase: str | None = None, *, kernel: bool = False) -> float:
        """Model FLOPs (or executed kernel FLOPs) of one phase, or of the whole step (FLOP)."""
        return float(sum(o.kernel_flops if kernel else o.flops for o in self.select(phase)))

    def total_bytes(self, phase: str | None = None) -> float:
        """Unfused bytes read + written (B)."""
        return float(sum(o.bytes_accessed for o in self.select(phase)))

    def by_layer(self, phase: str | None = None) -> dict[str, list[OpRecord]]:
        """Ops grouped by module path, in first-issue order."""
        out: dict[str, list[OpRecord]] = defaultdict(list)
        for o in self.select(phase):
            out[o.layer].append(o)
        return dict(out)

    def _lookup(self, key: Any, phase: str) -> list[OpRecord]:
        if self._index is None:
            idx: dict[tuple[Any, str], list[OpRecord]] = defaultdict(list)
            for o in self.ops:
                k = o.block if o.part == "block" else o.part
                idx[(k, o.phase)].append(o)
                idx[(k, "*")].append(o)
            self._index = dict(idx)
        return list(self._index.get((key, phase or "*"), []))

    def block_ops(self, i: int, phase: str | None = None) -> list[OpRecord]:
        """Ops of repeated block ``i`` (``layers.i``), e.g. ``block_ops(3, "bwd")``."""
        if not 0 <= i < self.num_blocks:
            raise IndexError(f"block {i} out of range: the graph has {self.num_blocks} blocks")
        return self._lookup(i, phase or "*")

    def pre_ops(self, phase: str | None = None) -> list[OpRecord]:
        """Ops of the part before the blocks: the embedding (in ``bwd``: its backward, issued last)."""
        return self._lookup("pre", phase or "*")

    def post_ops(self, phase: str | None = None) -> list[OpRecord]:
        """Ops of the part after the blocks: final norm, output head, loss (in ``bwd``: issued first)."""
        return self._lookup("post", phase or "*")

    def recompute_flops(self, granularity: Literal["full", "selective", "selective_op"] = "full") -> float:
        """Extra model FLOPs of activation recomputation for one micro-batch (FLOP).

        ``full`` re-runs every block's forward before its backward (Megatron ``--recompute-granularity
        full``): fwd+bwd+recompute of a GPT then equals Megatron's ``96·B·s·l·h²·(1 + s/6h +
        V/16lh)`` (SC'21 eq. 3; the logit layer is not recomputed). ``selective`` re-runs only the
        attention core (Korthikanti et al. 2022, arXiv:2205.05198); ``selective_op`` what torchtitan's
        per-op SAC re-runs (:mod:`workload.parallel.sac`).
        """
        fwd = [o for o in self.ops if o.phase == "fwd" and o.part == "block"]
        if not fwd and self.num_blocks == 0:
            fwd = self.select("fwd")
        if granularity == "full":
            return float(sum(o.flops for o in fwd))
        if granularity == "selective":
            return float(sum(o.flops for o in fwd if o.kind == "attention"))
        if granularity == "selective_op":  # per block, as the builder re-runs them
            blocks = sorted({o.block for o in fwd if o.block is not None})
            return float(sum(sum(o.flops for o in op_sac_recomputed([x for x in fwd if x.block == i]))
                             for i in blocks))
        raise ValueError(f"granularity must be 'full', 'selective' or 'selective_op', got {granularity!r}")

    def to_compute_tasks(self, phase: str | None = None, *, causal_discount: bool = True) -> list[Compute]:
        """The ops as :class:`hwmodel.ir.Compute` kernels (see :meth:`OpRecord.to_compute`)."""
        return [o.to_compute(causal_discount=causal_discount) for o in self.select(phase)]
