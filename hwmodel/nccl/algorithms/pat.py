"""NCCL's PAT algorithm (``NCCL_ALGO_PAT`` = 6, Parallel Aggregated Trees; NCCL 2.23+).

All-gather and reduce-scatter only, Simple protocol only, and only with one GPU per node. Sources,
NCCL 2.30.7 (commit ``5067397c``):

* availability -- ``ncclPatEnable`` (``src/graph/tuning.cc``): ``NCCL_PAT_ENABLE`` default 2 enables it
  when ``nNodes == nRanks`` ("PAT only supports 1 GPU per node"), ``minCompCap >= 60`` (every GPU this
  model covers) and the network is not device-offloaded (trainsim's NICs are host NICs);
  ``ncclTopoTuneModel`` skips it for all-reduce, broadcast and reduce and for LL/LL128.
  (``updateCollCostTable`` also skips reduce-scatter with PreMulSum/SumPostDiv ops, i.e. averaging;
  trainsim's collectives carry no reduction op, so that case is not modelled.)
* search graph -- ``graphs[NCCL_ALGO_PAT] = treeGraph`` (``src/init.cc``).
* tuner terms -- ``busBw = nChannels x (bwIntra up to 2 nodes, else bwInter) x 0.75``, no bus-to-algorithm
  conversion (all-gather/reduce-scatter), so ``algBw = busBw``; latency
  ``baseLatencies[PAT] + log2i(nNodes) x interLat / 3.5 + nRanks x 2.8`` µs ("Log latency" plus "still a
  linear part"), with ``baseLatencies[PAT][Simple] = 8.0`` and, since ppn is 1, ``interLat =
  hwLatencies[NET][TREE][Simple] + 2 x latencyInter = 14 + 2 latencyInter``. No size-dependent
  correction in ``ncclTopoGetAlgoTime``; ``latCount = ceil(numPipeOps / 8)``.
* channels -- ``topoGetAlgoInfo`` (``src/enqueue.cc``) starts from ``comm->nChannels`` and
  ``maxThreads[PAT][Simple]``, which ``ncclTopoTuneModel`` never sets (0), so the size loop keeps every
  channel; then ``nt = NCCL_MAX_NTHREADS`` (640) for PAT.
* data movement -- ``PatAGAlgorithm`` / ``PatRSAlgorithm`` (``src/include/collectives.h``) and the proxy
  peers (``src/proxy.cc``, ``ncclPatternPatDown`` / ``PatUp``): dimension ``d`` (0 .. log2Up(n)-1)
  connects each rank to the rank ``2^d`` away: all-gather sends to ``rank - 2^d`` and receives from
  ``rank + 2^d``; reduce-scatter sends to ``rank + 2^d``. The block of the rank at offset ``s``
  (1 <= s < n) is forwarded along a binomial tree: it enters its destination over the dimension of
  the lowest set bit of ``s`` (``sendDim = firstBitSet(s)``). Each rank therefore sends, over
  dimension ``d``, ``c_d`` blocks of ``S/n`` bytes, ``c_d`` = the odd multiples of ``2^d`` below
  ``n`` (``n/2^(d+1)`` for a power of two: n/2 to the nearest peer, 1 to the farthest), ``sum c_d =
  n - 1``: the bandwidth-optimal ``(n-1)/n x S`` per NIC and direction, as Ring, in log2(n) steps.

Engine: ONE activity, work ``(n-1)/n x S`` per rank; edge (rank, rank -/+ 2^d) weighs ``c_d/(n-1)``.
PAT pipelines its aggregated steps across dimensions (up to ``parallelFactor`` steps in flight), so
step fidelity runs it as one synchronised step, like Tree.
"""

from __future__ import annotations

from typing import ClassVar

from hwmodel.nccl.algorithms.base import AG_RS, Algorithm, Flow, FlowContext, ModelInputs, log2i
from hwmodel.nccl.comm import NCCL_MAX_NTHREADS, ChannelPlan, CommTopology, SearchGraph

PAT_BUS_BW_FACTOR = 0.75
"""``if (a == NCCL_ALGO_PAT) busBw *= .75`` (tuning.cc 2.30.7)."""

PAT_LOG_LATENCY_DIVISOR = 3.5
"""``log2i(nNodes) * (interLat / 3.5)`` (tuning.cc 2.30.7)."""

PAT_LINEAR_LATENCY_US = 2.8
"""``nRanks * 2.8`` µs (tuning.cc 2.30.7: "Still a linear part")."""


def log2_up(n: int) -> int:
    """``log2Up`` (NCCL ``src/include/utils.h``): ceil(log2 n), 0 for n <= 1."""
    return (n - 1).bit_length() if n > 1 else 0


def blocks_per_dimension(n: int) -> list[int]:
    """``c_d``: blocks each rank sends over dimension ``d`` = offsets ``1 <= s < n`` whose lowest set
    bit is ``d`` (see the module docstring); sums to ``n - 1``."""
    return [len(range(1 << d, n, 1 << (d + 1))) for d in range(log2_up(n))]


class Pat(Algorithm):
    name = "pat"
    nccl_index = 6
    collectives = frozenset(AG_RS)
    protocols = frozenset({"simple"})
    base_latency_us = (8.0, 8.0, 8.0)
    hw_latency_us: ClassVar[dict[str, tuple[float, float, float]]] = {
        "nvlink": (0.0, 0.0, 4.0), "pci": (0.0, 0.0, 4.0), "net": (0.0, 0.0, 14.0)}

    def fits(self, coll: str, topo: CommTopology) -> bool:
        return topo.n_nodes == topo.n_ranks

    def graph(self, topo: CommTopology) -> SearchGraph:
        return topo.tree

    def max_threads(self, proto: str, topo: CommTopology) -> int:
        """0: ``ncclTopoTuneModel`` never sets ``maxThreads[PAT]`` (the communicator is zeroed)."""
        return 0

    def channels(self, proto: str, n_bytes: int, topo: CommTopology) -> ChannelPlan:
        """Every channel (``nBytes < nc * 0 * threshold`` never holds) and 640 threads."""
        return ChannelPlan(topo.n_channels, NCCL_MAX_NTHREADS)

    def bus_bw_GBps(self, m: ModelInputs, bus_bw: float) -> float:
        return bus_bw * PAT_BUS_BW_FACTOR

    def latency_us(self, m: ModelInputs) -> float:
        return m.base_lat + (log2i(m.nn) * (m.inter_lat / PAT_LOG_LATENCY_DIVISOR) + m.n * PAT_LINEAR_LATENCY_US)

    def work_bytes(self, op: str, size_bytes: float, n: int) -> float:
        return size_bytes * (n - 1) / n

    def progress_rate_Bps(self, op: str, algbw_Bps: float, n: int) -> float:
        return algbw_Bps * (n - 1) / n

    def flows(self, ctx: FlowContext, op: str, gpus: tuple[str, ...], root: int) -> list[Flow]:
        n = len(gpus)
        sign = -1 if op == "all_gather" else 1
        flows = []
        for d, blocks in enumerate(blocks_per_dimension(n)):
            frac = blocks / (n - 1)
            for i, src in enumerate(gpus):
                dst = gpus[(i + sign * (1 << d)) % n]
                flows.append(Flow(src, dst, ctx.path(src, dst), frac))
        return flows
