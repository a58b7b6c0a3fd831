"""Per-operation channel and thread counts, and the names this package has always exported here.

* :func:`nccl_channels` is ``topoGetAlgoInfo`` (``src/enqueue.cc``, NCCL 2.30.7): how many channels
  (CTAs, one SM each) and threads per CTA one collective of ``n_bytes`` uses; each algorithm's rule
  lives in its module (:mod:`hwmodel.nccl.algorithms`).
* The communicator model and NCCL's topology search are in :mod:`hwmodel.nccl.comm`; send/recv
  channels in :mod:`hwmodel.nccl.algorithms.p2p`. Both are re-exported here.

Units: bandwidths in bytes/s and times in seconds; ``_GBPS`` names hold NCCL's GB/s numbers.
"""

from __future__ import annotations

from hwmodel.nccl import algorithms as _algorithms
from hwmodel.nccl.algorithms.p2p import (
    MAX_DEV_WORK_P2P_PER_BATCH,
    P2P_LL_THRESHOLD_BYTES,
    P2P_NET_CHUNK_BYTES,
    P2P_NVL_CHUNK_BYTES,
    P2P_PCI_CHUNK_BYTES,
    P2P_PEER_KINDS,
    P2P_PER_CHANNEL_NET_BW_GBPS,
    P2PPlan,
    p2p_channels_per_peer,
    p2p_n_channels,
    p2p_plan,
)
from hwmodel.nccl.comm import (
    ARCHITECTURES,
    DEFAULT_PCIE_BW_GBPS,
    GB,
    MAXCHANNELS,
    NCCL_LL128_MAX_NTHREADS,
    NCCL_LL_MAX_NTHREADS,
    NCCL_MAX_NTHREADS,
    NCCL_SIMPLE_MAX_NTHREADS,
    NVLINK_BW_PER_LINK_GBPS,
    NVLS_CHANNELS,
    NVLS_CHANNELS_SM100_MULTINODE,
    NVLS_MAX_ARITY,
    PCI_BW_GBPS,
    PROTOCOLS,
    RING_SEARCH_MAX_CHANNELS,
    SPEED_ARRAY_INTER,
    SPEED_ARRAY_INTRA,
    THREAD_THRESHOLD_BYTES,
    WARP_SIZE,
    ChannelPlan,
    CommTopology,
    SearchGraph,
    arch_from_compute_capability,
    nvls_runtime_channels,
)

__all__ = [
    "ALGORITHM_ALIASES", "ARCHITECTURES", "DEFAULT_PCIE_BW_GBPS", "GB", "MAXCHANNELS",
    "MAX_DEV_WORK_P2P_PER_BATCH", "NCCL_LL128_MAX_NTHREADS", "NCCL_LL_MAX_NTHREADS", "NCCL_MAX_NTHREADS",
    "NCCL_SIMPLE_MAX_NTHREADS", "NVLINK_BW_PER_LINK_GBPS", "NVLS_CHANNELS", "NVLS_CHANNELS_SM100_MULTINODE",
    "NVLS_MAX_ARITY", "P2PPlan", "P2P_LL_THRESHOLD_BYTES", "P2P_NET_CHUNK_BYTES", "P2P_NVL_CHUNK_BYTES",
    "P2P_PCI_CHUNK_BYTES", "P2P_PEER_KINDS", "P2P_PER_CHANNEL_NET_BW_GBPS", "PCI_BW_GBPS",
    "RING_SEARCH_MAX_CHANNELS", "SPEED_ARRAY_INTER", "SPEED_ARRAY_INTRA", "THREAD_THRESHOLD_BYTES",
    "WARP_SIZE", "ChannelPlan", "CommTopology", "SearchGraph", "arch_from_compute_capability", "max_threads",
    "nccl_channels", "nvls_runtime_channels", "p2p_channels_per_peer", "p2p_n_channels", "p2p_plan",
    "thread_threshold",
]

ALGORITHM_ALIASES: dict[str, str] = _algorithms.ALIASES
"""Other spellings of trainsim's algorithm names: NCCL's ``NCCL_ALGO`` token ``NVLSTree`` (matched
case-insensitively, ``ncclAlgoStr`` in ``src/init.cc``) is trainsim's ``nvls_tree``, the name the
tuner plugin's config file uses (``parseAlgorithm``)."""


def _algorithm(algo: str, proto: str) -> _algorithms.Algorithm:
    a = _algorithms.get(algo)
    if not a.tuned:
        raise ValueError(f"unknown NCCL algorithm {algo!r}; allowed: {', '.join(_algorithms.ALGORITHMS)}")
    if str(proto).lower() not in PROTOCOLS:
        raise ValueError(f"unknown NCCL protocol {proto!r}; allowed: simple, ll, ll128")
    return a


def max_threads(algo: str, proto: str, topo: CommTopology) -> int:
    """``comm->maxThreads[algo][proto]`` (tuning.cc ``ncclTopoTuneModel``, 2.30.7, no NCCL_NTHREADS).

    Ring Simple: 256 if ``ring.bwIntra * ring.nChannels <= PCI_BW`` (12 GB/s) else 512; Tree Simple
    512; LL 512; LL128 640; NVLS and NVLSTree 640; PAT 0 (never set).
    """
    return _algorithm(algo, proto).max_threads(proto.lower(), topo)


def thread_threshold(algo: str, proto: str, topo: CommTopology) -> int:
    """``comm->threadThresholds[algo][proto]`` in bytes per thread (tuning.cc, comm.h 2.30.7)."""
    return _algorithm(algo, proto).thread_threshold(proto.lower(), topo)


def nccl_channels(algo: str, proto: str, n_bytes: int, topo: CommTopology) -> ChannelPlan:
    """Channels and threads NCCL launches for one collective (``topoGetAlgoInfo``, enqueue.cc 2.30.7).

    Ring/Tree: start from ``comm->nChannels`` and ``maxThreads``; ``while nBytes < nc*nt*threshold:
    nc -= 1`` (down to 1); then halve ``nt`` while the same holds and ``nt % 128 == 0``. Simple adds a
    sync warp (Ring); at least 3 warps; Tree always runs 640 threads. NVLS uses ``nvlsChannels``
    (multi-node: at most ``comm->nChannels``) and 640 threads; NVLSTree ``nvlsChannels`` and 640
    threads, whatever the size; PAT every channel and 640 threads.

    ``n_bytes`` is NCCL's ``nBytes``: the per-rank buffer for all-reduce/broadcast/reduce, the total
    (gathered) buffer for all-gather/reduce-scatter -- nccl-tests' ``S``.

    Example: DGX A100 (24 channels), Ring Simple, 64 KiB: ``nc`` drops while ``65536 < nc*512*64``,
    stopping at ``nc = 2`` (2*512*64 = 65536), so 2 channels of 512+32 threads.

    Raises:
        ValueError: unknown algorithm or protocol, or NVLS/NVLSTree where the communicator lacks them.
    """
    return _algorithm(algo, proto).channels(proto.lower(), n_bytes, topo)
