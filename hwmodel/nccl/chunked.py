"""NCCL's chunked protocol pipeline, evaluated exactly per collective (``fidelity = "chunked"``).

NCCL's tuning model prices a collective as latency, then bytes at the tuner's bandwidth. Real NCCL
kernels move a buffer as a stream of chunks through a fixed-depth FIFO, and the bandwidth-vs-size ramp
comes from that pipeline. This module computes the time of that pipeline item by item (the reference;
the flow and step fidelities use its closed form, :mod:`hwmodel.nccl.pipeline_closed`):

* **Chunking** as ``calcCollChunking`` (``src/enqueue.cc``, NCCL 2.30.7): ``stepSize = buffSize /
  NCCL_STEPS``; Ring Simple chunks are ``ALLREDUCE_CHUNKSTEPS = NCCL_STEPS/2`` steps sent as slices of
  ``ALLREDUCE_SLICESTEPS = NCCL_STEPS/4`` steps; LL carries half of its step as data, LL128 15 of 16
  words; Tree LL128, NVLS, NVLSTree and PAT shrink the chunk for small buffers by NCCL's rules; a loop
  covers ``nChannels x nchunksPerLoop x chunkSize`` and the last loop's chunks shrink to fit
  (``divUp(remaining, nChannels x nRanks)``). A Simple slice is at least ``sliceSize/32``
  (``prims_simple.h`` ``genericOp``).
* **The pipeline** per channel, as a max-plus recurrence over the items (slices or chunks) each link
  carries, in order: an item starts when the link's previous item is sent, when its data has arrived
  from the previous hop (store-and-forward after the whole slice for Simple, cut-through per line for
  LL/LL128, whose receivers poll each line's flag), and when the receiver has a free FIFO slot
  (``NCCL_STEPS`` slots, ``sliceSteps`` per Simple slice; a slot frees when the receiver has forwarded
  its data, and the credit takes one step latency back). Every hop pays one step latency.
* **Ring** all-reduce / all-gather / reduce-scatter run on a symmetric ring: every link carries the same
  item sequence, so one link's recurrence, with the dependency on the item ``m`` places earlier (the
  same slice one ring step before, on the previous link), is exact. Tree (up then down, pipelined),
  broadcast/reduce pipelines, NVLS (up to the switch, down from it), NVLSTree and PAT run as a linear
  chain of hops.

What comes from where (nothing here is fitted):

* per-step latency: NCCL's own ``hwLatencies`` terms -- the tuner's latency less ``baseLatencies``,
  spread evenly over the algorithm's hops (for a multi-node ring, the average of its intra- and
  inter-node steps); ``baseLatencies`` is paid once before the pipeline;
* per-channel bandwidth: ``min(hardware link rate / active channels, tuner bandwidth / all channels)``:
  the links' unloaded rate (their capacity over bytes per byte, protocol payload efficiency and app-level
  link efficiency included, as the flow engine weighs them) shared by the channels a small buffer uses,
  capped by what one channel (one CTA, one SM) moves in NCCL's model (``bwIntra``/``bwInter`` per
  channel, ``perChMaxRingLL128Bw``, ``llMaxBw``...). At large sizes the pipeline therefore runs at the
  flow model's bandwidth; what differs is how latency and granularity shape the ramp.
* NVLS per-step cost: an NVLS item smaller than its full ``nvlsChunkSize`` step also pays NCCL's price of
  one Simple step over NVLink in series with its copy (:data:`NVLS_STEP_SYNC_S`, :func:`item_time_s`).
* P2P-read slice cost (opt-in, ``p2p_read_cost``): on one A100 node, where NCCL reads Simple data across
  NVLink, a slice below 1 MiB pays two such steps in series with its copy (:data:`P2P_READ_SLICE_SYNC_S`).

Not modelled: the Ring "plateau" x1.4 and Tree correction factors of ``ncclTopoGetAlgoTime`` (fitted
terms of NCCL's *model*, replaced here by the mechanism), and per-hop differences within a multi-node
ring (its hops share the average latency; the bottleneck link sets its bandwidth). Send/recv and
all-to-all are one hop each and keep the flow model's timing.

Units: bytes, seconds, bytes/s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hwmodel.nccl.algorithms.base import log2i
from hwmodel.nccl.algorithms.ring import Ring
from hwmodel.nccl.comm import NCCL_LL128_MAX_NTHREADS, NCCL_LL_MAX_NTHREADS, CommTopology

__all__ = [
    "BUFFSIZE_BYTES",
    "NCCL_STEPS",
    "NVLS_CHUNK_SIZE_BYTES",
    "Pipeline",
    "PipelineTime",
    "NVLS_STEP_SYNC_S",
    "P2P_READ_SLICE_SYNC_S",
    "chunk_size_bytes",
    "item_time_s",
    "pipeline_for",
    "pipeline_time",
]

NCCL_STEPS = 8
"""FIFO depth in steps per connection (``NCCL_STEPS``, ``src/include/device.h``)."""

NCCL_LL_LINES_PER_THREAD = 8
NCCL_LL128_ELEMS_PER_THREAD = 120
NCCL_LL128_LINEELEMS = 16
NCCL_LL128_DATAELEMS = 15
"""LL128 line: 16 uint64, 15 of them data (``device.h``)."""

BUFFSIZE_BYTES: dict[str, int] = {
    "simple": 1 << 22,
    "ll": NCCL_LL_LINES_PER_THREAD * NCCL_LL_MAX_NTHREADS * NCCL_STEPS * 16,
    "ll128": NCCL_LL128_ELEMS_PER_THREAD * NCCL_LL128_MAX_NTHREADS * NCCL_STEPS * 8,
}
"""Per-connection buffer (``comm->buffSizes``; ``device.h``): Simple ``DEFAULT_BUFFSIZE`` 4 MiB; LL
``NCCL_LL_LINES_PER_THREAD x NCCL_LL_MAX_NTHREADS x NCCL_STEPS x sizeof(ncclLLFifoLine)`` = 512 KiB;
LL128 ``NCCL_LL128_ELEMS_PER_THREAD x NCCL_LL128_MAX_NTHREADS x NCCL_STEPS x 8`` = 4,915,200 B."""

RING_CHUNK_STEPS = NCCL_STEPS // 2
"""``ALLREDUCE_CHUNKSTEPS`` (= ``ALLGATHER_``/``REDUCESCATTER_CHUNKSTEPS``, ``collectives.h``)."""
RING_SLICE_STEPS = NCCL_STEPS // 4
"""``ALLREDUCE_SLICESTEPS`` (and the all-gather / reduce-scatter ones)."""

NVLS_CHUNK_SIZE_BYTES = 128 * 1024
"""``comm->nvlsChunkSize`` default (``NCCL_NVLS_CHUNKSIZE`` 128 KiB, ``src/transport/nvls.cc``)."""

NVLS_STEP_SYNC_S = Ring.hw_latency_us["nvlink"][2] * 1e-6
"""Per-step synchronisation an NVLS channel pays in series with its copy (seconds): NCCL's own price of
one Simple step over NVLink, ``hwLat[NVLINK][RING][SIMPLE]`` = 3.4 us (``src/graph/tuning.cc``, the same
in 2.18.5, 2.20.5 and 2.30.7). NVLS all-reduce splits each CTA into warp groups (scatter, multimem
reduce, gather; ``all_reduce.h``) that run ``ProtoSimple`` steps: wait for the peers' flags, copy one
chunk per head, barrier, fence, post (``prims_simple.h``), all by the warps that copy, so the wait and
post are not hidden by the FIFO. NCCL's NVLS bandwidth figure holds this cost for a full ``nvlsChunkSize``
step (:func:`item_time_s`); the smaller chunks of its shrink rules pay it over fewer bytes. Not fitted:
docs/DESIGN.md ("NVLS: the per-step cost of small chunks") compares it with the public sweeps and says
why rings do not get it."""

P2P_READ_SLICE_SYNC_S = 2 * Ring.hw_latency_us["nvlink"][2] * 1e-6
"""Per-slice cost a Simple channel pays in series with its copy where NVLink peers use P2P read
(:attr:`~hwmodel.nccl.comm.CommTopology.p2p_read`: A100), in seconds: two of NCCL's Simple NVLink steps,
``2 x hwLat[NVLINK][RING][SIMPLE]`` = 6.8 us (``src/graph/tuning.cc``, the same from 2.18.5 to 2.30.7).
In read mode the Simple FIFO sits on the sender (``p2p.cc``), and one slice of ``prims_simple.h``'s
``genericOp`` is, for the CTA that receives it: wait until the sender's tail shows the slice (one step),
*then* load it across NVLink and wait for the data to come back (the second), reduce/copy, barrier, post.
With P2P write (Hopper and later) the sender's stores carry the data during its own copy, so the receiver
finds it local and only the flag's latency remains, which the pipeline's FIFO overlaps (``lat``). NCCL's
per-channel bandwidth holds this cost for a full slice (``stepSize x SLICESTEPS`` = 1 MiB); the smaller
slices of a buffer below ``nChannels x nRanks x chunkSize`` pay it over fewer bytes (:func:`item_time_s`).
Not fitted: docs/DESIGN.md ("Ring Simple on A100: the P2P-read slice") compares it with both public
8 x A100 sweeps, whose own best values (6.8-8 us) it lies in."""

PROTO_GRAIN_BYTES: dict[str, int] = {"simple": 512, "ll": 16, "ll128": 1920}
"""``ncclProtoGrainSize`` (enqueue.cc): the unit a chunk is aligned to -- Simple 512 B, LL one 16-byte
line's 8 data bytes twice, LL128 one warp's 15 x 16 x 8 bytes."""

MAX_SIMULATED_LOOPS = 2048
"""Loops of the recurrence run exactly; beyond, the steady state's per-loop increment (a max-plus
system's periodic regime, reached after a few loops) is extrapolated."""


@dataclass(frozen=True, slots=True)
class Pipeline:
    """One collective's pipeline on one channel (every channel runs the same one)."""

    ring: bool
    """Symmetric ring (one link's sequence is every link's) or a linear chain of hops."""
    hops: int
    """Ring steps per chunk (2(n-1), n-1) or chain hops."""
    loop_bytes: tuple[float, ...]
    """Data bytes one item of each loop carries: a ring chunk, or a chain item."""
    slices_per_item: tuple[int, ...]
    """Simple ring slices each chunk is sent as (1 or 2)."""
    fifo_slots: int
    """FIFO slots an item may hold ahead of the receiver (``NCCL_STEPS / sliceSteps``)."""
    store_and_forward: bool
    """Simple (True) forwards a slice once it has fully arrived; LL/LL128 forward line by line."""
    step_latency_s: float
    base_latency_s: float
    channel_rate_Bps: float
    """Data bytes per second one channel moves over one hop."""
    min_slice_bytes: float = 0.0
    """A two-slice chunk's first slice is at least this (``sliceSize/32``), the second the rest."""
    step_sync_s: float = 0.0
    """Per-item synchronisation the sending warps pay in series with their copy (seconds), beyond what
    ``channel_rate_Bps`` already holds for an item of ``sync_free_bytes``: an item of ``b`` bytes takes
    ``b / rate + step_sync_s x max(0, 1 - b / sync_free_bytes)`` on its link (:func:`item_time_s`)."""
    sync_free_bytes: float = math.inf
    """The item size at which ``channel_rate_Bps`` (NCCL's per-channel figure) was taken (bytes)."""


@dataclass(frozen=True, slots=True)
class PipelineTime:
    """The pipeline's time and its two parts (seconds; rates bytes/s)."""

    time_s: float
    """Total, ``base_latency_s`` included."""
    base_latency_s: float
    bytes_per_channel: float
    """Data bytes one channel sends over one hop (all items)."""
    channel_rate_Bps: float


def item_time_s(p: Pipeline, b: float) -> float:
    """Seconds an item of ``b`` bytes occupies its link: ``b / rate``, plus the share of the per-step
    synchronisation ``channel_rate_Bps`` does not already contain (:attr:`Pipeline.step_sync_s`).

    The channel rate is NCCL's per-channel figure, reached with full items of ``sync_free_bytes``, where
    one step costs ``b / r0 + sync`` with ``1 / r0 = 1 / rate - sync / sync_free_bytes``; a smaller item pays
    the same ``sync`` over fewer bytes: ``b / r0 + sync = b / rate + sync (1 - b / sync_free_bytes)``."""
    s = b / p.channel_rate_Bps
    if p.step_sync_s > 0.0 and b < p.sync_free_bytes:
        s += p.step_sync_s * (1.0 - b / p.sync_free_bytes)
    return s


def chunk_size_bytes(op: str, algo: str, proto: str, n_bytes: int, n_channels: int, topo: CommTopology) -> int:
    """``calcCollChunking``'s chunk size (bytes of data) for one operation (enqueue.cc 2.30.7).

    ``n_bytes`` is NCCL's ``nBytes`` (the per-rank buffer for all-reduce, the total for all-gather and
    reduce-scatter, as nccl-tests' S)."""
    step = BUFFSIZE_BYTES[proto] // NCCL_STEPS
    ring_simple = algo == "ring" and proto == "simple" and op not in ("broadcast", "reduce")
    chunk = step * (RING_CHUNK_STEPS if ring_simple else 1)
    if proto == "ll":
        chunk //= 2
    elif proto == "ll128":
        chunk = chunk // NCCL_LL128_LINEELEMS * NCCL_LL128_DATAELEMS
    nc = max(1, n_channels)
    nn = max(1, topo.n_nodes)
    if algo == "nvls":
        chunk = min(chunk, NVLS_CHUNK_SIZE_BYTES)
        ops = nc * topo.n_ranks // nn  # nChannels x nvls.nHeads (one head per GPU of the node)
        for factor, floor in ((64, 65536), (8, 32768), (2, 16384)):
            if n_bytes < factor * ops * chunk and chunk > floor:
                chunk = floor
    elif algo == "nvls_tree":
        ops = nc * _nvls_tree_heads(topo)
        chunk = NVLS_CHUNK_SIZE_BYTES if nn < 4 else 65536
        for factor, floor in ((32, 262144), (16, 131072), (4, 65536), (1, 32768)):
            if n_bytes < factor * ops * chunk and chunk > floor:
                chunk = floor
    elif algo == "tree" and proto == "ll128":
        ppn = topo.n_ranks / nn
        steps = 1 + log2i(nn) + 0.1 * ppn
        while n_bytes // (nc * chunk) < steps * 64 / ppn and chunk > 131072:
            chunk //= 2
        while n_bytes // (nc * chunk) < steps * 16 / ppn and chunk > 32768:
            chunk //= 2
    elif algo == "pat":
        factor = 32 if op == "all_gather" else 16
        while chunk * nc * factor > n_bytes and chunk > 65536:
            chunk //= 2
    grain = PROTO_GRAIN_BYTES[proto]
    return max(grain, chunk // grain * grain)


def _hops(op: str, algo: str, topo: CommTopology) -> tuple[bool, int]:
    """(ring?, hops per chunk) of NCCL's pattern for ``op`` on ``algo`` (``ncclPattern*``)."""
    n = topo.n_ranks
    nn = max(1, topo.n_nodes)
    if algo == "ring":
        if op == "all_reduce":
            return True, 2 * (n - 1)
        if op in ("all_gather", "reduce_scatter"):
            return True, n - 1
        return False, n - 1  # broadcast / reduce: PipelineFrom / PipelineTo along the ring
    if algo == "tree":  # TreeUpDown: up the tree and down again, pipelined (runTreeSplit)
        return False, max(1, 2 * (n // nn - 1 + log2i(nn)))
    if algo == "nvls":  # multimem reduce up to the switch, multicast down
        return False, 2
    if algo == "nvls_tree":
        return False, 2 + 2 * max(1, log2i(nn))
    if algo == "pat":
        return False, max(1, log2i(n) + (0 if n & (n - 1) == 0 else 1))
    raise ValueError(f"chunked pipeline: unknown algorithm {algo!r}; allowed: ring, tree, nvls, nvls_tree, pat")


def _chunks_per_loop(algo: str, ring: bool, topo: CommTopology) -> int:
    """``nchunksPerLoop`` (enqueue.cc): nRanks for a ring, ``nvls.nHeads`` for NVLS (one head per GPU of
    the node) and NVLSTree (one per NIC, :func:`_nvls_tree_heads`), else 1."""
    if ring:
        return topo.n_ranks
    if algo == "nvls":
        return max(1, topo.n_ranks // max(1, topo.n_nodes))
    if algo == "nvls_tree":
        return _nvls_tree_heads(topo)
    return 1


def _nvls_tree_heads(topo: CommTopology) -> int:
    """NVLSTree heads per node: one per NIC, i.e. the multi-node NVLS graph's channels (tuner.py)."""
    return max(1, topo.nvls.n_channels) if topo.nvls is not None else 1


def pipeline_for(op: str, algo: str, proto: str, n_bytes: int, n_channels: int, topo: CommTopology, *,
                 channel_rate_Bps: float, base_latency_s: float, step_latency_total_s: float,
                 progress_per_byte: float = 1.0, p2p_read_cost: bool = False) -> Pipeline:
    """The :class:`Pipeline` of one operation.

    Args:
        op, algo, proto: collective (``hwmodel.ir`` name), algorithm and protocol (registry names).
        n_bytes: NCCL's ``nBytes`` (see :func:`chunk_size_bytes`).
        n_channels: channels the operation runs on.
        channel_rate_Bps: data bytes/s one channel moves over one hop (see the module docstring).
        base_latency_s: paid once (NCCL's ``baseLatencies``).
        step_latency_total_s: the tuner's per-step latency terms summed over its steps; spread evenly
            over the pipeline's hops.
        progress_per_byte: a chain hop's bytes per byte of ``nBytes`` (the flow engine's work per
            edge over the buffer: 1 for Tree and NVLS all-reduce, (n-1)/n for NVLS/PAT all-gather and
            reduce-scatter), so that the channel rate and the item sizes count the same bytes. A ring
            item is its chunk.
        p2p_read_cost: charge :data:`P2P_READ_SLICE_SYNC_S` where ``topo.p2p_read`` (off by default: on
            its own it makes Ring Simple lose to LL/LL128 where NCCL picks it; docs/DESIGN.md).

    Raises:
        ValueError: unknown algorithm, or a rate that is not positive.
    """
    if not channel_rate_Bps > 0:
        raise ValueError(f"chunked pipeline: channel rate must be > 0 B/s, got {channel_rate_Bps!r}")
    ring, hops = _hops(op, algo, topo)
    nc = max(1, n_channels)
    chunk = chunk_size_bytes(op, algo, proto, n_bytes, nc, topo)
    per_loop_chunks = _chunks_per_loop(algo, ring, topo)
    per_loop = nc * per_loop_chunks * chunk  # nChannels x nchunksPerLoop x chunkSize
    loops = max(1, math.ceil(n_bytes / per_loop))
    rem = n_bytes - (loops - 1) * per_loop
    if ring:  # one chunk per ring step; the last loop's chunks shrink to fit
        items: list[float] = [float(chunk)] * (loops - 1) + [max(1.0, math.ceil(rem / (nc * per_loop_chunks)))]
    else:  # a chain item is the loop's share of one channel, in the hop's bytes
        full = per_loop_chunks * chunk * progress_per_byte
        items = [full] * (loops - 1) + [max(1.0, rem / nc * progress_per_byte)]
    ring_simple = ring and proto == "simple"
    slice_min = BUFFSIZE_BYTES["simple"] // NCCL_STEPS * RING_SLICE_STEPS / 32
    slices = tuple((2 if b > slice_min else 1) if ring_simple else 1 for b in items)
    slots = NCCL_STEPS // (RING_SLICE_STEPS if ring_simple else 1)
    sync, sync_free = 0.0, math.inf
    full_item = per_loop_chunks * chunk_size_bytes(op, algo, proto, 1 << 62, nc, topo) * progress_per_byte
    if algo == "nvls":  # the per-step cost NCCL's figure holds for a full chunk, paid by smaller ones
        sync, sync_free = NVLS_STEP_SYNC_S, full_item
    elif p2p_read_cost and proto == "simple" and topo.p2p_read and topo.n_nodes == 1 and algo in ("ring", "tree"):
        # every hop an NVLink P2P read: the slice's load waits for its flag (P2P_READ_SLICE_SYNC_S)
        sync = P2P_READ_SLICE_SYNC_S
        sync_free = BUFFSIZE_BYTES["simple"] // NCCL_STEPS * RING_SLICE_STEPS if ring_simple else full_item
    return Pipeline(ring=ring, hops=hops, loop_bytes=tuple(items), slices_per_item=slices, fifo_slots=slots,
                    store_and_forward=proto == "simple", step_latency_s=max(0.0, step_latency_total_s) / hops,
                    base_latency_s=base_latency_s, channel_rate_Bps=channel_rate_Bps,
                    min_slice_bytes=slice_min if ring_simple else 0.0, step_sync_s=sync, sync_free_bytes=sync_free)


def pipeline_time(p: Pipeline) -> PipelineTime:
    """Time of pipeline ``p``: the base latency, then the exact recurrence (see the module docstring)."""
    run = _ring_run if p.ring else _chain_run
    loops = len(p.loop_bytes)
    if loops <= MAX_SIMULATED_LOOPS:
        t = run(p, p.loop_bytes, p.slices_per_item)
    else:  # steady state: the last exact loops' increment, for the loops in between
        head = MAX_SIMULATED_LOOPS // 2
        t1 = run(p, p.loop_bytes[:head], p.slices_per_item[:head])
        t2 = run(p, p.loop_bytes[:head + 1], p.slices_per_item[:head + 1])
        tail = run(p, p.loop_bytes[:head] + p.loop_bytes[-1:], p.slices_per_item[:head] + p.slices_per_item[-1:])
        t = tail + (t2 - t1) * (loops - head - 1)
    hop_bytes = sum(p.loop_bytes) * (p.hops if p.ring else 1)
    return PipelineTime(p.base_latency_s + t, p.base_latency_s, hop_bytes, p.channel_rate_Bps)


def _ring_run(p: Pipeline, loop_bytes: tuple[float, ...], slices: tuple[int, ...]) -> float:
    """One ring link's item sequence (loop, step, slice), by symmetry every link's: seconds from the
    first send to the last item's arrival.

    ``S[i] >= E[i-1]`` (in order on the link); ``S[i] >= A[i-m]`` for a step > 0 (the same slice one
    step earlier, which by symmetry the previous link carried ``m`` items before); the FIFO credit
    ``S[i] >= C[i-D] + lat`` with ``C[k]`` the receiver's forward of item ``k`` (``E[k+m]``) or, at the
    chunk's last step, its arrival. ``E[i] = S[i] + bytes/rate``; arrival ``A = E + lat``. LL/LL128
    forward line by line: the dependency is ``S[i-m] + lat`` and ``E[i] >= E[i-m] + lat``."""
    lat = p.step_latency_s
    saf = p.store_and_forward
    D = p.fifo_slots
    H = p.hops
    S: list[float] = []
    E: list[float] = []
    fwd: list[int] = []  # index of the item that forwards item k (-1: consumed on arrival)
    for b, m in zip(loop_bytes, slices, strict=True):
        first = b if m == 1 else min(b, max(b / m, p.min_slice_bytes))
        times = [item_time_s(p, first)] + ([item_time_s(p, (b - first) / (m - 1))] * (m - 1) if m > 1 else [])
        base = len(S)
        for h in range(H):
            for j in range(m):
                s = times[j]
                i = base + h * m + j
                t = E[i - 1] if i else 0.0
                if h:
                    t = max(t, (E[i - m] if saf else S[i - m]) + lat)
                k = i - D
                if k >= 0:
                    c = E[fwd[k]] if fwd[k] >= 0 else E[k] + lat
                    t = max(t, c + lat)
                e = t + s
                if h and not saf:
                    e = max(e, E[i - m] + lat)
                S.append(t)
                E.append(e)
                fwd.append(i + m if h < H - 1 else -1)
    return E[-1] + lat


def _chain_run(p: Pipeline, loop_bytes: tuple[float, ...], slices: tuple[int, ...]) -> float:
    """Items through a chain of hops (each hop its own link and sender): seconds from the first send to
    the last item's arrival at the last hop. ``S[h][i] >= E[h][i-1]``, ``>= E[h-1][i] + lat`` (Simple;
    LL/LL128: ``S[h-1][i] + lat`` and ``E[h][i] >= E[h-1][i] + lat``), and the FIFO credit
    ``>= C[h][i-D] + lat`` with ``C`` the receiver's forward of that item (``E[h+1][i-D]``) or, at the
    last hop, its arrival."""
    lat = p.step_latency_s
    saf = p.store_and_forward
    D = p.fifo_slots
    H = p.hops
    S = [[0.0] * len(loop_bytes) for _ in range(H)]
    E = [[0.0] * len(loop_bytes) for _ in range(H)]
    for i, b in enumerate(loop_bytes):
        s = item_time_s(p, b)
        for h in range(H):
            t = E[h][i - 1] if i else 0.0
            if h:
                t = max(t, (E[h - 1][i] if saf else S[h - 1][i]) + lat)
            k = i - D
            if k >= 0:
                c = E[h + 1][k] if h + 1 < H else E[h][k] + lat
                t = max(t, c + lat)
            e = t + s
            if h and not saf:
                e = max(e, E[h - 1][i] + lat)
            S[h][i] = t
            E[h][i] = e
    del slices
    return E[H - 1][-1] + lat
