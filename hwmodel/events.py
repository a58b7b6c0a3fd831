"""The records of an executed run: one :class:`TraceEvent` per task, with typed, kind-specific details.

Plain frozen dataclasses with SI units, no SimPy: reports, analyses and plots read them without
importing the simulator. :class:`hwmodel.runtime.Runtime` writes them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class KernelInfo:
    """What a compute kernel's event records beside its times."""

    flops: float
    """Floating-point operations of the kernel (``Compute.flops``)."""
    solo_time_s: float
    """The cost model's duration of the kernel alone on an idle GPU (s)."""


@dataclass(frozen=True, slots=True)
class MacroInfo(KernelInfo):
    """A hierarchical macro task (one layer pass): a kernel plus how its pass splits, in seconds
    (``Compute.pass_profile_s``, from ``scenarios.hierarchical.PassProfile``)."""

    pass_time_s: float = 0.0
    """Duration of the pass when it was measured alone (step 1 of the hierarchical engine)."""
    pass_compute_s: float = 0.0
    """Of it, time with a kernel running."""
    pass_exposed_comm_s: float = 0.0
    """Of it, time moving data with no kernel running."""
    pass_hidden_comm_s: float = 0.0
    """Time moving data under running kernels (overlaps ``pass_compute_s``)."""


@dataclass(frozen=True, slots=True)
class CollectiveInfo:
    """What an NCCL collective's event records: the plan the engine chose and the buffer size."""

    algorithm: str
    """NCCL algorithm (ring, tree, nvls, ...)."""
    protocol: str
    """NCCL protocol (simple, ll, ll128)."""
    channels: int
    """Channels, one SM each held while the kernel runs."""
    size_bytes: int
    """nccl-tests' ``S`` (``Collective.size_bytes``)."""
    latency_s: float = 0.0
    """The plan's latency term: its predicted time less its bytes over its bandwidth bound (NCCL's base
    latency plus every step's; a ring all-reduce of ``n`` ranks has ``2 (n - 1)`` steps). 0: not recorded."""
    ranks: int = 0
    """Ranks in the communicator (``len(Collective.group)``; 0: not recorded)."""


@dataclass(frozen=True, slots=True)
class P2PInfo:
    """What a send's or receive's event records."""

    peer: int
    """The other rank."""
    size_bytes: int


@dataclass(frozen=True, slots=True)
class MemcpyInfo:
    """What a copy's event records."""

    size_bytes: int


EventInfo = KernelInfo | CollectiveInfo | P2PInfo | MemcpyInfo
"""The kind-specific details of a :class:`TraceEvent` (:class:`MacroInfo` is a :class:`KernelInfo`)."""


@dataclass(frozen=True, slots=True)
class TraceEvent:
    """One executed task: where and when it ran. Times in seconds."""

    rank: int
    stream: str
    task_id: int
    name: str
    category: str
    """kernel kind for Compute, ``nccl:<op>`` for collectives, ``send``/``recv``, ``memcpy``."""
    start_s: float
    end_s: float
    phase: str = ""
    layer: str = ""
    info: EventInfo | None = None
    """Details by kind: :class:`KernelInfo` (or :class:`MacroInfo` for a hierarchical macro task) for
    kernels, :class:`CollectiveInfo` for collectives, :class:`P2PInfo` for send/recv,
    :class:`MemcpyInfo` for copies."""
    xfer_start_s: float | None = None
    """Communication only: when data started to move (every peer had arrived). Before it the task
    waited for its peers -- idle or pipeline bubble, not communication."""
    dtype: str | None = None
    """Collectives only: the element type reduced or moved (``Collective.dtype``)."""

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s
