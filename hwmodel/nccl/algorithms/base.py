"""What one NCCL collective algorithm owns, as an object: availability, channels, tuner terms, flows.

An :class:`Algorithm` answers, for its algorithm only (NCCL 2.30.7, commit ``5067397c``):

* **availability** -- which collectives and protocols it runs, and on which communicators
  (``ncclTopoTuneModel``'s skip rules and the enable matrix in ``src/graph/tuning.cc``);
* **channels** -- CTAs and threads for one operation (``topoGetAlgoInfo``, ``src/enqueue.cc``);
* **tuner terms** -- bus bandwidth (per-channel graph bandwidth x channels, then NCCL's refinements),
  the bus-to-algorithm bandwidth conversion, latency, and the size-dependent corrections of
  ``ncclTopoGetAlgoTime``;
* **engine terms** -- the edges (:class:`Flow`) it loads and the bytes each carries per byte of
  per-rank progress, the progress (work) per rank, and the rate that NCCL's bandwidth allows.

The defaults here are NCCL's generic code paths; each algorithm module overrides what its
``if (a == NCCL_ALGO_X)`` branches change. Shared machinery (search graphs, protocol tables) lives in
:mod:`hwmodel.nccl.comm`.

Units: NCCL's model in µs and GB/s (``_us`` / ``_GBps`` names), everything else SI.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Protocol

from hwmodel.nccl.comm import NCCL_MAX_NTHREADS, THREAD_THRESHOLD_BYTES, ChannelPlan, CommTopology, SearchGraph

if TYPE_CHECKING:
    from hwmodel.fluid import Resource

AG_RS = ("all_gather", "reduce_scatter")


@dataclass(frozen=True, slots=True)
class Flow:
    """One edge of a collective: payload from GPU ``src`` to ``dst`` over ``path``.

    ``frac`` is the edge's bytes per byte of collective progress (1/rails for a rail ring).
    """

    src: str
    dst: str
    path: tuple[Resource, ...]
    frac: float


class FlowContext(Protocol):
    """What an algorithm needs from the engine to lay out its flows (see :class:`NcclEngine`)."""

    def path(self, a: str, b: str) -> tuple[Resource, ...]: ...

    def rails(self, ppn: int) -> int: ...

    def comm_topology(self, gpus: tuple[str, ...]) -> CommTopology: ...

    def nodes_of(self, gpus: tuple[str, ...]) -> dict[int, list[str]]: ...

    @property
    def topology(self): ...


@dataclass(frozen=True, slots=True)
class ModelInputs:
    """What ``ncclTopoTuneModel`` has computed when it reaches one (collective, algorithm, protocol)."""

    coll: str
    proto: str
    p: int
    """Protocol column (LL 0, LL128 1, Simple 2)."""
    topo: CommTopology
    graph: SearchGraph
    n: int
    nn: int
    ppn: float
    ci: int
    """``compCapIndex`` (Volta 0 .. Blackwell 3)."""
    index2: int
    """nNodes column of the per-channel tables: 0 (1 node), 1 (2), 2 (more)."""
    ll_max_bw: float
    nsteps: int
    base_lat: float
    """``baseLatencies[a][p]``, µs."""
    intra_lat: float
    """``hwLatencies[intraHw][a][p]``, µs."""
    inter_lat: float
    """``hwLatencies[NET][ppn == 1 ? TREE : a][p] + latencyInter`` (twice for Simple), µs."""


class Algorithm(ABC):
    """One NCCL collective algorithm; subclasses set the class attributes and override hooks."""

    name: ClassVar[str]
    """trainsim's name (``NCCL_ALGO`` token, lower case)."""
    nccl_index: ClassVar[int]
    """``NCCL_ALGO_*`` value (ties in :func:`hwmodel.nccl.tuner.choose` go to the lower one)."""
    aliases: ClassVar[tuple[str, ...]] = ()
    """Other spellings accepted for :attr:`name`."""
    collectives: ClassVar[frozenset[str]] = frozenset()
    protocols: ClassVar[frozenset[str]] = frozenset({"ll", "ll128", "simple"})
    tuned: ClassVar[bool] = True
    """Whether NCCL's tuning model prices it (p2p is not tuned)."""
    base_latency_us: ClassVar[tuple[float, float, float]] = (0.0, 0.0, 0.0)
    """``baseLatencies[a]`` (LL, LL128, Simple), µs."""
    hw_latency_us: ClassVar[dict[str, tuple[float, float, float]]] = {
        "nvlink": (0.0, 0.0, 0.0), "pci": (0.0, 0.0, 0.0), "net": (0.0, 0.0, 0.0)}
    """``hwLatencies[NVLINK|PCI|NET][a]`` (LL, LL128, Simple), µs per step."""
    aggregated_latency: ClassVar[bool] = True
    """``latCount = ceil(numPipeOps / 8)`` (aggregated launches); Ring pays every op."""

    # -- availability ---------------------------------------------------------------------------
    def available(self, coll: str, proto: str, topo: CommTopology) -> bool:
        """Whether NCCL would consider this algorithm with ``proto`` for ``coll`` on ``topo``."""
        return coll in self.collectives and proto in self.protocols and self.fits(coll, topo)

    def fits(self, coll: str, topo: CommTopology) -> bool:
        """Topology condition (hardware, node count); True unless the algorithm needs more."""
        return True

    # -- channels -------------------------------------------------------------------------------
    def graph(self, topo: CommTopology) -> SearchGraph:
        """The search graph NCCL's model reads (``graphs[a]`` in ``src/init.cc``)."""
        return topo.ring

    @abstractmethod
    def channels(self, proto: str, n_bytes: int, topo: CommTopology) -> ChannelPlan:
        """Channels and threads for one operation of ``n_bytes`` (``topoGetAlgoInfo``)."""

    def max_threads(self, proto: str, topo: CommTopology) -> int:
        """``comm->maxThreads[a][proto]`` (tuning.cc ``ncclTopoTuneModel``, no ``NCCL_NTHREADS``):
        ``NCCL_MAX_NTHREADS`` (640) unless the algorithm sets less."""
        return NCCL_MAX_NTHREADS

    def thread_threshold(self, proto: str, topo: CommTopology) -> int:
        """``comm->threadThresholds[a][proto]`` in bytes per thread (tuning.cc, comm.h 2.30.7)."""
        return THREAD_THRESHOLD_BYTES[proto]

    def max_channels(self, topo: CommTopology) -> int:
        """Upper bound on a tuner-plugin rule's ``channels`` (``comm->nChannels``)."""
        return topo.n_channels

    # -- tuner terms (ncclTopoTuneModel) --------------------------------------------------------
    def model(self, m: ModelInputs) -> tuple[float, float, float]:
        """(latency µs, bus bandwidth GB/s, algorithm bandwidth GB/s), as ``ncclTopoTuneModel``."""
        bus_bw = self.bus_bw_GBps(m, m.graph.n_channels * self.channel_bw_GBps(m))
        return self.latency_us(m), bus_bw, self.alg_bw_GBps(m, bus_bw)

    def channel_bw_GBps(self, m: ModelInputs) -> float:
        """Per-channel bandwidth: ``bwIntra`` up to 2 nodes, else ``bwInter``."""
        return m.graph.bw_intra_GBps if m.nn <= 2 else m.graph.bw_inter_GBps

    def bus_bw_GBps(self, m: ModelInputs, bus_bw: float) -> float:
        """NCCL's "various model refinements" of ``nChannels * bw``; none by default."""
        return bus_bw

    def alg_bw_GBps(self, m: ModelInputs, bus_bw: float) -> float:
        """Bus to algorithm bandwidth: none for all-gather/reduce-scatter, else x0.5 (tree-like)."""
        return bus_bw if m.coll in AG_RS else bus_bw * 0.5

    def latency_us(self, m: ModelInputs) -> float:
        """``comm->latencies``: the base latency unless the algorithm adds per-step terms."""
        return m.base_lat

    # -- ncclTopoGetAlgoTime corrections ---------------------------------------------------------
    def latency_factor(self, coll: str, proto: str, topo: CommTopology, n_bytes: int) -> float:
        """Size-dependent latency multiplier; 1 by default."""
        return 1.0

    def bandwidth_factor(self, coll: str, proto: str, topo: CommTopology, n_bytes: int) -> float:
        """Size-dependent bandwidth multiplier; 1 by default."""
        return 1.0

    def dtype_penalty(self, dtype: str, topo: CommTopology) -> float:
        """``updateCollCostTable`` time multiplier for a datatype; 1 by default."""
        return 1.0

    # -- engine terms ---------------------------------------------------------------------------
    def work_bytes(self, op: str, size_bytes: float, n: int) -> float:
        """Bytes each edge of weight 1 carries over the whole collective (progress units): the whole
        per-rank buffer by default (tree-like up/down algorithms)."""
        return size_bytes

    def progress_rate_Bps(self, op: str, algbw_Bps: float, n: int) -> float:
        """NCCL's algorithm bandwidth as this engine's progress rate (bytes per edge per s), such that
        ``work_bytes / rate == nBytes / algBw``."""
        return algbw_Bps

    def step_count(self, op: str, n: int) -> int:
        """Synchronised steps in step fidelity: 1 (a pipelined algorithm without barriers)."""
        return 1

    @abstractmethod
    def flows(self, ctx: FlowContext, op: str, gpus: tuple[str, ...], root: int) -> list[Flow]:
        """The edges one operation loads; see each algorithm's module docstring."""


def log2i(n: int) -> int:
    """``log2i`` (NCCL ``src/include/utils.h``): floor(log2 n), -1 for n <= 0."""
    return n.bit_length() - 1 if n > 0 else -1


def rotate(xs: list[str], k: int) -> list[str]:
    """``xs`` rotated left by ``k``."""
    k %= len(xs)
    return xs[k:] + xs[:k]


def rail_head(local: list[str], c: int, rails: int) -> list[str]:
    """A node's part of a communicator rotated so that it starts at the GPU that heads rail ``c``.

    With a NIC per GPU (``rails`` >= the node's GPUs) that is its ``c``-th GPU; when GPUs share NICs
    (fewer rails than GPUs, e.g. 8 GPUs on 4 NICs) the rails' heads are spread evenly, ``c * len /
    rails``, so that consecutive GPUs, which share a NIC, head different rails' NICs."""
    return rotate(local, c * len(local) // rails if rails < len(local) else c)


def binary_tree(n: int) -> list[tuple[int, int]]:
    """NCCL's tree 0 over ``n`` nodes as (child, parent) pairs (``ncclGetBtree``, trees.cc)."""
    pairs = []
    for rank in range(1, n):
        bit = 1
        while not rank & bit:
            bit <<= 1
        up = (rank ^ bit) | (bit << 1)
        if up >= n:
            up = rank ^ bit
        pairs.append((rank, up))
    return pairs


def double_binary_tree(n: int) -> list[list[tuple[int, int]]]:
    """Tree 0 and tree 1 (mirror when n is even, shifted by one when odd) (``ncclGetDtree``)."""
    t0 = binary_tree(n)
    t1 = [(n - 1 - c, n - 1 - p) for c, p in t0] if n % 2 == 0 else [((c + 1) % n, (p + 1) % n) for c, p in t0]
    return [t0, t1]
