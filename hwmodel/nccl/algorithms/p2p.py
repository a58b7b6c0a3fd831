"""Point-to-point (send/recv) and all-to-all: NCCL's p2p channel rules, not tuned by tuning.cc.

* :func:`p2p_channels_per_peer` / :func:`p2p_plan` are NCCL 2.30.7's send/recv channel rules
  (``src/graph/paths.cc``, ``src/enqueue.cc addP2pToPlan``, ``src/init.cc computeBuffSizes``).
* :class:`PointToPoint` is the engine's "algorithm" for a send/recv (one edge) and for all_to_all:
  one send/recv pair per ordered pair of ranks (NCCL >= 2.28 expands ``ncclAlltoAll`` this way), all
  in flight at once (one grouped kernel); each pair carries ``S/n``.
"""

from __future__ import annotations

from typing import NamedTuple

from hwmodel.nccl.algorithms.base import Algorithm, Flow, FlowContext
from hwmodel.nccl.comm import GB, MAXCHANNELS, ChannelPlan, CommTopology

P2P_PER_CHANNEL_NET_BW_GBPS = 14.0
"""``NCCL_P2P_PER_CHANNEL_NET_BW`` default 14 GB/s (nccl ``src/graph/paths.cc`` l.918, 2.30.7)."""

P2P_LL_THRESHOLD_BYTES = 16384
"""``NCCL_P2P_LL_THRESHOLD`` default 16384 B per channel (nccl ``src/enqueue.cc`` l.859, 2.30.7)."""

P2P_NVL_CHUNK_BYTES = 1 << 19
"""``NCCL_P2P_NVL_CHUNKSIZE`` 512 KiB (nccl ``src/init.cc`` l.820, 2.30.7): single node, all NVLink."""

P2P_NET_CHUNK_BYTES = 1 << 17
"""``NCCL_P2P_NET_CHUNKSIZE`` 128 KiB (init.cc l.818, 2.30.7): any multi-node communicator."""

P2P_PCI_CHUNK_BYTES = 1 << 17
"""``NCCL_P2P_PCI_CHUNKSIZE`` 128 KiB (init.cc l.819, 2.30.7): single node, not all NVLink."""

MAX_DEV_WORK_P2P_PER_BATCH = 8
"""``NCCL_MAX_DEV_WORK_P2P_PER_BATCH`` (device.h, 2.30.7)."""

P2P_FIFO_STEPS = 8
"""``NCCL_STEPS`` (``src/include/device.h``): slots of a connection's FIFO, per channel. A send kernel
writes a step into a free slot without waiting for its receiver (``prims_simple.h`` ``waitPeer``: a sender
waits only while ``head + NCCL_STEPS < step + 1``), so a send that fits in the free slots completes before
its receive is posted; the receive copies the slots out later."""

P2P_PEER_KINDS: tuple[str, ...] = ("nvlink", "pci", "net")


def _pow2_up(x: int) -> int:
    return 1 if x <= 1 else 1 << (x - 1).bit_length()


def p2p_channels_per_peer(topo: CommTopology, peer: str = "nvlink") -> int:
    """Channels NCCL assigns to one send/recv peer (``comm->p2pnChannelsPerPeer``), 2.30.7.

    ``ncclTopoGetNchannels`` (paths.cc): NVLink peer ``2*max(1, pathBw/nvlBw)`` (= 2 x NVLinks per GPU
    through NVSwitch), PCIe peer 2, network peer ``max(nNics, ceil(nicBw/14 GB/s))``. NCCL takes the
    minimum over every peer of the communicator, so pass the slowest peer kind present. Then
    ``ncclTopoComputeP2pChannels``: round up to a power of two; multi-node, halve while
    ``perPeer * ceil(nRanks/8) > p2pnChannels``; else clamp to ``p2pnChannels``.
    """
    if peer not in P2P_PEER_KINDS:
        raise ValueError(f"unknown p2p peer kind {peer!r}; allowed: {', '.join(P2P_PEER_KINDS)}")
    if peer == "nvlink":
        per_peer = 2 * max(1, topo.nvlink_links)
    elif peer == "pci":
        per_peer = 2
    else:
        nic_gbps = topo.nic_bw_Bps / GB * topo.nics_per_gpu
        per_peer = max(topo.nics_per_gpu, -(-int(nic_gbps) // int(P2P_PER_CHANNEL_NET_BW_GBPS)))
    p2p_n = p2p_n_channels(topo)
    per_peer = _pow2_up(per_peer)
    if topo.n_nodes > 1:
        groups = -(-topo.n_ranks // MAX_DEV_WORK_P2P_PER_BATCH)
        while per_peer * groups > p2p_n and per_peer > 1:
            per_peer //= 2
    else:
        per_peer = min(p2p_n, per_peer)
    return per_peer


def p2p_n_channels(topo: CommTopology) -> int:
    """``comm->p2pnChannels = pow2Up(min(nChannels, NCCL_MAX_P2P_NCHANNELS=64))`` (paths.cc 2.30.7)."""
    return _pow2_up(min(topo.n_channels, MAXCHANNELS))


class P2PPlan(NamedTuple):
    """How NCCL runs one send (or recv) of ``n_bytes`` to one peer."""

    n_channels: int
    protocol: str
    """``ll`` or ``simple`` (NCCL never uses LL128 for p2p)."""
    chunk_bytes: int
    """``comm->p2pChunkSize`` (Simple step size), bytes."""
    latency_s: float
    """trainsim's latency estimate, seconds (see :func:`p2p_plan`)."""


# Latency constants reused from tuning.cc (µs): Ring base (LL, Simple) and per-hop hw latency.
_P2P_BASE_US = {"ll": 6.6, "simple": 8.4}
_P2P_HW_US = {
    "nvlink": {"ll": 0.6, "simple": 3.4},
    "pci": {"ll": 1.0, "simple": 5.7},
    "net": {"ll": 2.7, "simple": 14.0},
}


def p2p_plan(n_bytes: int, topo: CommTopology, peer: str = "nvlink", n_peers: int | None = None) -> P2PPlan:
    """Channels, protocol and chunk for one p2p operation (``addP2pToPlan``, enqueue.cc 2.30.7).

    ``nChannelsMax = p2pnChannelsPerPeer``; ``nChannelsMin`` halves it while
    ``nChannelsMin * n_peers > p2pnChannels`` (``n_peers`` defaults to ``n_ranks``, as NCCL uses
    nRanks). Then ``nCh = min(nChannelsMin, ceil(bytes/minPart))`` and doubles while the part exceeds
    ``maxPart`` (multi-node: chunk/2 .. chunk; single node chunk/8 .. 32*chunk). LL when
    ``bytes <= nCh * 16384``.

    NCCL has no p2p time model; ``latency_s`` is trainsim's estimate from tuning.cc's Ring constants:
    base latency of the protocol + one hop of the link's hardware latency (+ ``latencyInter``, twice
    for Simple, over the network).
    """
    if peer not in P2P_PEER_KINDS:
        raise ValueError(f"unknown p2p peer kind {peer!r}; allowed: {', '.join(P2P_PEER_KINDS)}")
    if topo.n_nodes > 1:
        chunk = P2P_NET_CHUNK_BYTES
    elif topo.intra_link == "nvlink":
        chunk = P2P_NVL_CHUNK_BYTES
    else:
        chunk = P2P_PCI_CHUNK_BYTES
    ch_max = p2p_channels_per_peer(topo, peer)
    ch_min = ch_max
    peers = topo.n_ranks if n_peers is None else n_peers
    p2p_n = p2p_n_channels(topo)
    while ch_min * peers > p2p_n and ch_min > 1:
        ch_min //= 2
    if n_bytes <= 0:
        n_ch = 1
    else:
        min_part = chunk // 2 if topo.n_nodes > 1 else chunk // 8
        max_part = chunk if topo.n_nodes > 1 else chunk * 32
        n_ch = min(ch_min, -(-n_bytes // min_part))
        part = max(min_part, -(-n_bytes // n_ch))
        while part > max_part and n_ch <= ch_max // 2:
            n_ch *= 2
            part = -(-n_bytes // n_ch)
    proto = "ll" if n_bytes <= n_ch * P2P_LL_THRESHOLD_BYTES else "simple"
    lat_us = _P2P_BASE_US[proto] + _P2P_HW_US[peer][proto]
    lat_s = lat_us * 1e-6
    if peer == "net":
        lat_s += topo.latency_inter_s * (2 if proto == "simple" else 1)
    return P2PPlan(n_ch, proto, chunk, lat_s)


def p2p_fifo_steps(n_bytes: int, plan: P2PPlan, multi_node: bool) -> int:
    """FIFO steps per channel that a send of ``n_bytes`` planned as ``plan`` fills (of
    :data:`P2P_FIFO_STEPS`), NCCL 2.30.7 ``addP2pToPlan`` (enqueue.cc l.~898-945).

    The message is cut into ``n_channels`` parts of ``ceil(n_bytes / n_channels)`` bytes; a part moves in
    steps of ``chunkSize`` bytes: LL carries at most ``NCCL_P2P_LL_THRESHOLD`` bytes per channel, one
    step; Simple's chunk is ``p2pChunkSize`` (``plan.chunk_bytes``), over the network a quarter of it for a
    message below one step and half of it below eight steps. 0 bytes is one (empty) step.
    """
    if n_bytes <= 0 or plan.protocol == "ll":
        return 1
    chunk = plan.chunk_bytes
    if multi_node:
        if n_bytes < plan.chunk_bytes:
            chunk //= 4
        elif n_bytes < P2P_FIFO_STEPS * plan.chunk_bytes:
            chunk //= 2
    part = -(-n_bytes // plan.n_channels)
    return -(-part // chunk)


class PointToPoint(Algorithm):
    """Send/recv and all-to-all (not priced by NCCL's tuning model)."""

    name = "p2p"
    nccl_index = -1
    tuned = False

    def channels(self, proto: str, n_bytes: int, topo: CommTopology) -> ChannelPlan:
        """Send/recv has no per-operation channel choice in NCCL's tuner: its channels come from the
        peer rules (:func:`p2p_channels_per_peer`, used by
        :func:`hwmodel.nccl.channels.p2p_plan`), so asking here is a caller error."""
        raise ValueError("p2p: channels are set per peer (p2p_channels_per_peer), not by the tuner's channel plan")

    def work_bytes(self, op: str, size_bytes: float, n: int) -> float:
        return size_bytes if op == "p2p" else size_bytes / n

    def flows(self, ctx: FlowContext, op: str, gpus: tuple[str, ...], root: int) -> list[Flow]:
        P = ctx.path
        if op == "p2p":
            return [Flow(gpus[0], gpus[1], P(gpus[0], gpus[1]), 1.0)]
        return [Flow(a, b, P(a, b), 1.0) for a in gpus for b in gpus if a != b]
