"""The program IR: what the workload asks the machine to do, rank by rank.

This is the machine's instruction set -- what CUDA and NCCL are asked to run -- so it lives in
``hwmodel`` and the workload generators depend on it, never the reverse.

A per-rank :class:`Program` is a list of :class:`Task` s. Each task wraps one operation
(:class:`Compute`, :class:`Collective`, :class:`SendRecv` or :class:`Memcpy`), names the CUDA stream
it is issued on and the ids of the tasks it waits for. Tasks on one stream run in list order (CUDA
stream semantics); ``deps`` are cross-stream events (``cudaStreamWaitEvent``). Everything is a small
frozen dataclass so programs can be shared between ranks and hashed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, get_args

KernelKind = Literal[
    "gemm", "attention", "elementwise", "norm", "softmax", "embedding", "loss", "optimizer",
    "reduction", "copy", "other", "macro",
]
"""What a compute kernel does; the kernel cost model prices each kind differently."""

KERNEL_KINDS: tuple[str, ...] = get_args(KernelKind)

CollectiveOp = Literal["all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all"]
COLLECTIVE_OPS: tuple[str, ...] = get_args(CollectiveOp)

Phase = Literal["fwd", "bwd", "opt", "other"]


@dataclass(frozen=True, slots=True)
class Compute:
    """One GPU kernel. Its duration comes from the GPU's kernel cost model, not from the task."""

    name: str
    """Kernel or aten op name, e.g. ``aten.mm`` or ``flash_attn_fwd``."""
    kind: str
    """One of :data:`KERNEL_KINDS`."""
    flops: float
    """Floating-point operations (FLOP) the kernel performs."""
    bytes_accessed: float
    """Bytes read from and written to HBM, unfused (an upper bound for fused kernels)."""
    dtype: str = "bf16"
    """Math dtype: fp32, tf32, fp16, bf16 or fp8."""
    shape: tuple[int, ...] = ()
    """For ``gemm``: (batch, m, n, k). For ``attention``: (batch, heads, seq_q, seq_kv, head_dim).
    Empty for other kinds."""
    layer: str = ""
    """Module path that issued the kernel, e.g. ``layers.3.attn``."""
    phase: str = "fwd"
    """fwd, bwd, opt or other."""
    fixed_time_s: float | None = None
    """Solo duration in seconds, when known instead of modelled: a measured kernel, or a macro task
    standing for a whole layer's pass (hierarchical engine). It still shares SMs and HBM when run."""
    pass_profile_s: tuple[float, ...] = ()
    """Macro tasks only: ``(time, compute, exposed communication, hidden communication)`` in seconds
    of the layer pass it stands for, so that reports can split it (``scenarios.hierarchical``)."""
    causal: bool = False
    """Attention only: the kernel applies a causal mask, so it runs only the key blocks on and below the
    diagonal, about half of the full ``seq_q x seq_kv`` work (FlashAttention-2; Dao 2023,
    arXiv:2307.08691 §3.1); the cost model prices those blocks from ``shape`` when this is set. ``flops``
    keep the executed count (the tracer halves the full count) and price only a shapeless task."""
    attention_window: int = 0
    """Attention only: causal sliding window, the keys each query sees counting itself (Mistral's and
    Hugging Face's ``sliding_window``); 0: no window. The cost model skips the key blocks wholly outside
    it (:func:`hwmodel.costmodel.attention_key_blocks`)."""
    attention_sinks: int = 0
    """Attention only, with a window: the first keys every query also sees (StreamingLLM's attention
    sinks; Xiao et al. 2023, arXiv:2309.17453)."""
    attention_alibi: bool = False
    """Attention only: the kernel adds an ALiBi bias to the scores in registers (Press et al. 2022,
    arXiv:2108.12409; FlashAttention-2's ``alibi_slopes``), priced as CUDA-core work per score."""
    attention_kv_heads: int = 0
    """Attention only: key/value heads the kernel reads -- ``num_query_groups / tp`` under grouped-query
    attention passed as such (Megatron-Core), the query heads after torchtitan's ``repeat_kv``; 0: as
    many as the query heads, ``shape[1]``. Context parallelism's ring passes blocks of these heads."""
    attention_kernel: str = ""
    """Attention only: the library kernel that runs it (``flash2``, ``flash3``, ``cudnn``, ``efficient``:
    ``[model] attention_backend``), priced from that kernel's calibration; ``""``: the framework's
    default flash kernel for the GPU generation (:mod:`hwmodel.costmodel`)."""
    fp8_scaling: str = ""
    """FP8 GEMMs only: how the operands are scaled when that changes the kernel -- ``rowwise`` (a
    per-row scaled CUTLASS GEMM), ``mxfp8`` (MX 1x32 block scales); ``""``: one scale per tensor (the
    cuBLAS FP8 GEMM). Priced by the calibration's ``fp8_gemm_time_factor``."""
    launches: int = 1
    """Memory-bound kinds only: back-to-back kernels of equal size this task stands for (e.g. PyTorch's
    per-rank copy-out of a list ``all_gather``): each pays the launch overhead, and each holds the SMs of
    ``bytes_accessed / launches`` while it runs."""
    conv_stride: int = 1
    """Convolutions only: the stride, the largest over the spatial dims (input over output size, rounded);
    1 for every other task. cuDNN's Winograd and FFT algorithms need a unit stride (cuDNN API reference,
    ``cudnnConvolutionFwdAlgo_t``), so a calibration profile fits strided convolutions apart
    (:func:`hwmodel.costmodel.gemm_class`); the shipped cost model does not read it."""


@dataclass(frozen=True, slots=True)
class Collective:
    """An NCCL collective on a communicator (an ordered tuple of global ranks).

    Matched across the ranks of ``group`` by (group, sequence number on that group), as NCCL does.
    ``size_bytes`` is nccl-tests' ``S``: the per-rank buffer for all_reduce/broadcast/reduce, the
    *total* (gathered) buffer for all_gather/reduce_scatter/all_to_all.
    """

    op: str
    """One of :data:`COLLECTIVE_OPS`."""
    size_bytes: int
    group: tuple[int, ...]
    dtype: str = "bf16"
    root: int = 0
    """Index in ``group`` of the root for broadcast/reduce."""
    algorithm: str | None = None
    """Force an algorithm (ring, tree, nvls, nvls_tree), as NCCL_ALGO; ``None`` lets the tuner pick."""
    protocol: str | None = None
    """Force a protocol (simple, ll, ll128), as NCCL_PROTO; ``None`` lets the tuner pick."""
    name: str = ""
    """Label for reports, e.g. ``tp_allreduce`` or ``dp_grad_bucket_3``."""


@dataclass(frozen=True, slots=True)
class SendRecv:
    """One side of a point-to-point transfer (pipeline activations, ring attention blocks).

    A ``send`` on rank a to peer b is matched with the next ``recv`` on rank b from peer a with the
    same ``tag`` (FIFO per ordered pair and tag, as NCCL send/recv per communicator)."""

    direction: Literal["send", "recv"]
    peer: int
    size_bytes: int
    name: str = ""
    tag: str = ""
    """Matching key besides the rank pair (e.g. ``fwd``/``bwd`` activations vs gradients)."""


@dataclass(frozen=True, slots=True)
class Memcpy:
    """A copy served by a copy engine: host<->device over PCIe, or device<->device (peer)."""

    direction: Literal["h2d", "d2h", "d2d", "peer"]
    size_bytes: int
    peer: int | None = None
    """Destination rank for ``peer`` copies."""
    name: str = ""


Operation = Compute | Collective | SendRecv | Memcpy


@dataclass(frozen=True, slots=True)
class Task:
    """An operation issued on a stream, after the tasks in ``deps`` (ids in the same program)."""

    id: int
    op: Operation
    stream: str = "compute"
    """CUDA stream name: compute, comm, p2p, copy, ... Tasks on one stream run in order."""
    deps: tuple[int, ...] = ()
    """Ids of tasks (on any stream of this rank) that must finish first (CUDA events)."""


@dataclass(slots=True)
class Program:
    """One rank's work for one iteration: tasks in issue order.

    Build with :meth:`add`, which assigns ids and checks that dependencies exist.

    Raises:
        ValueError: a dependency names a task that does not exist yet.
    """

    rank: int
    tasks: list[Task] = field(default_factory=list)

    def add(self, op: Operation, stream: str = "compute", deps: tuple[int, ...] | list[int] = ()) -> int:
        tid = len(self.tasks)
        deps = tuple(deps)
        for d in deps:
            if not 0 <= d < tid:
                raise ValueError(f"task {tid} ({op!r}) depends on unknown task id {d}")
        self.tasks.append(Task(tid, op, stream, deps))
        return tid

    def streams(self) -> list[str]:
        """Stream names in order of first use."""
        return list(dict.fromkeys(t.stream for t in self.tasks))
