"""NCCL's Ring algorithm (``NCCL_ALGO_RING`` = 1): every collective, every protocol.

Tuner terms (``ncclTopoTuneModel``, ``src/graph/tuning.cc`` 2.30.7): busBw = channels x bw, LL
``min(llMaxBw, busBw/2)``, LL128 ``min(0.92 busBw, channels x perChMaxRingLL128Bw)``; algBw = busBw x
nRanks/nsteps. Latency: broadcast/reduce one hop (``sameChannels``) or nsteps hops; otherwise
``(nsteps - nInter) x max(intraLat, netOverhead) + nInter x interLat`` with ``nInter`` = 2(nNodes-1)
for all-reduce, nNodes-1 otherwise. ``ncclTopoGetAlgoTime``: multi-node Simple all-reduce latency x1.4
(x1.9 before sm80) once ``nBytes/(nChannels x nRanks) >= 64`` (the "plateau"); ``latCount`` is every
pipelined op; FP8 Ring x1024 above 8 ranks (``updateCollCostTable``, enqueue.cc).

Flows (all_reduce: 2(n-1) steps, all_gather / reduce_scatter: n-1, broadcast / reduce: a pipeline
along the ring). Ranks are ordered node by node. With several nodes NCCL builds one ring per NIC
("rail"): ring *c* enters and leaves each node through the NIC of local GPU *c*, and the GPU that
closes the node's part of the ring forwards over NVLink to that GPU first (PXN, NCCL 2.12+), so
inter-node traffic stays on its rail. Each rail ring carries 1/K of the data.
"""

from __future__ import annotations

from typing import ClassVar

from hwmodel.nccl.algorithms.base import AG_RS, Algorithm, Flow, FlowContext, ModelInputs, rail_head, rotate
from hwmodel.nccl.algorithms.tree import Tree
from hwmodel.nccl.comm import (
    NCCL_LL128_MAX_NTHREADS,
    NCCL_LL_MAX_NTHREADS,
    NCCL_SIMPLE_MAX_NTHREADS,
    PCI_BW_GBPS,
    THREAD_THRESHOLD_BYTES,
    WARP_SIZE,
    ChannelPlan,
    CommTopology,
    size_scaled_channels,
)

PER_CH_MAX_RING_LL128_BW_GBPS: tuple[float, ...] = (20.0, 20.0, 36.7, 40.0)
"""``perChMaxRingLL128Bws`` GB/s per channel, Volta..Blackwell (same for N1/N2/N4; tuning.cc 2.30.7)."""

NET_OVERHEAD_US: dict[str, float] = {"intel": 1.0, "amd": 2.0, "other": 1.0}
"""``getNetOverhead`` µs (tuning.cc 2.30.7, ``NCCL_NET_OVERHEAD`` unset): x86 Intel 1.0, x86 AMD 2.0,
else 1.0; x3 for Simple. Multi-node rings pay ``max(intraLat, netOverhead)`` per intra-node step."""

RING_PLATEAU_FACTOR: dict[str, float] = {"volta": 1.9, "ampere": 1.4, "hopper": 1.4, "blackwell": 1.4}
"""``ncclTopoGetAlgoTime`` (tuning.cc 2.30.7) "Plateau effect of ring": multi-node Ring Simple
all-reduce latency x1.4 (x1.9 before sm80) when ``nBytes/(nChannels*nRanks) >= 64``."""

FP8_RING_PENALTY = 1024.0
"""``updateCollCostTable`` (enqueue.cc 2.30.7): FP8 Ring time x1024 when nRanks > 8 (precision)."""

FP8_DTYPES = frozenset({"fp8", "f8e4m3", "f8e5m2", "float8_e4m3fn", "float8_e5m2", "e4m3", "e5m2"})


def ring_steps(coll: str, n: int) -> int:
    """Ring steps per chunk in NCCL's model (tuning.cc ``nsteps``): 2(n-1) all-reduce, n-1 all-gather /
    reduce-scatter, n otherwise (broadcast/reduce pipelines)."""
    if coll == "all_reduce":
        return 2 * (n - 1)
    if coll in AG_RS:
        return n - 1
    return n


class Ring(Algorithm):
    name = "ring"
    nccl_index = 1
    collectives = frozenset({"all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce"})
    base_latency_us = (6.6, 14.0, 8.4)
    hw_latency_us: ClassVar[dict[str, tuple[float, float, float]]] = {
        "nvlink": (0.6, 1.9, 3.4), "pci": (1.0, 2.5, 5.7), "net": (2.7, 4.0, 14.0)}
    aggregated_latency = False

    def max_threads(self, proto: str, topo: CommTopology) -> int:
        """LL 512, LL128 640; Simple 256 if ``ring.bwIntra * ring.nChannels <= PCI_BW`` else 512."""
        if proto == "ll":
            return NCCL_LL_MAX_NTHREADS
        if proto == "ll128":
            return NCCL_LL128_MAX_NTHREADS
        ring_bw = topo.ring.bw_intra_GBps * topo.ring.n_channels
        return 256 if ring_bw <= PCI_BW_GBPS else NCCL_SIMPLE_MAX_NTHREADS

    def thread_threshold(self, proto: str, topo: CommTopology) -> int:
        """``threadThresholds``; Ring LL multiplies by nRanks."""
        t = THREAD_THRESHOLD_BYTES[proto]
        return t * topo.n_ranks if proto == "ll" else t

    def channels(self, proto: str, n_bytes: int, topo: CommTopology) -> ChannelPlan:
        """Size-scaled channels and threads; Simple adds a sync warp; at least 3 warps."""
        nc, nt = size_scaled_channels(topo.n_channels, self.max_threads(proto, topo),
                                      self.thread_threshold(proto, topo), n_bytes)
        if proto == "simple":
            nt += WARP_SIZE
        return ChannelPlan(nc, max(nt, 3 * WARP_SIZE))

    def bus_bw_GBps(self, m: ModelInputs, bus_bw: float) -> float:
        if m.proto == "ll":
            return min(m.ll_max_bw, bus_bw * 0.5)
        if m.proto == "ll128":
            return min(bus_bw * 0.92, m.graph.n_channels * PER_CH_MAX_RING_LL128_BW_GBPS[m.ci])
        return bus_bw

    def alg_bw_GBps(self, m: ModelInputs, bus_bw: float) -> float:
        return bus_bw * (m.n / m.nsteps)

    def latency_us(self, m: ModelInputs) -> float:
        lat = m.base_lat
        hw = m.topo.intra_link if m.nn == 1 else "net"
        ring_lat = self.hw_latency_us[hw][m.p]
        if m.coll in ("broadcast", "reduce"):
            if m.topo.same_channels:
                return lat + ring_lat
            if m.proto == "simple":
                ring_lat = Tree.hw_latency_us[hw][m.p]
            return lat + m.nsteps * ring_lat
        net_overhead = 0.0
        if m.nn > 1:
            net_overhead = NET_OVERHEAD_US[m.topo.cpu_vendor] * (3 if m.proto == "simple" else 1)
        intra_lat = max(m.intra_lat, net_overhead)
        n_inter = 0 if m.nn == 1 else (2 * (m.nn - 1) if m.coll == "all_reduce" else m.nn - 1)
        return lat + ((m.nsteps - n_inter) * intra_lat + n_inter * m.inter_lat)

    def latency_factor(self, coll: str, proto: str, topo: CommTopology, n_bytes: int) -> float:
        if (proto == "simple" and topo.n_nodes > 1 and coll == "all_reduce"
                and n_bytes // (topo.n_channels * topo.n_ranks) >= 64):
            return RING_PLATEAU_FACTOR[topo.gpu_arch]
        return 1.0

    def dtype_penalty(self, dtype: str, topo: CommTopology) -> float:
        return FP8_RING_PENALTY if dtype.lower() in FP8_DTYPES and topo.n_ranks > 8 else 1.0

    def work_bytes(self, op: str, size_bytes: float, n: int) -> float:
        if op == "all_reduce":
            return size_bytes * 2 * (n - 1) / n
        if op in AG_RS:
            return size_bytes * (n - 1) / n
        return size_bytes  # broadcast / reduce: the whole buffer flows along the chain, pipelined

    def progress_rate_Bps(self, op: str, algbw_Bps: float, n: int) -> float:
        if op == "all_reduce":
            return algbw_Bps * 2 * (n - 1) / n
        if op in AG_RS:
            return algbw_Bps * (n - 1) / n
        return algbw_Bps

    def step_count(self, op: str, n: int) -> int:
        return ring_steps(op, n)

    def flows(self, ctx: FlowContext, op: str, gpus: tuple[str, ...], root: int) -> list[Flow]:
        P = ctx.path
        n = len(gpus)
        by_node = ctx.nodes_of(gpus)
        nodes = list(by_node)
        chain = op in ("broadcast", "reduce")
        if len(nodes) == 1:
            order = rotate(list(gpus), root) if chain else list(gpus)
            edges = [(order[i], order[(i + 1) % n]) for i in range(n - (1 if chain else 0))]
            return [Flow(a, b, P(a, b), 1.0) for a, b in edges]
        rails = ctx.rails(max(len(v) for v in by_node.values()))
        flows = []
        frac = 1.0 / rails
        for c in range(rails):
            for k, node in enumerate(nodes):
                local = rail_head(by_node[node], c, rails)
                for i in range(len(local) - 1):
                    flows.append(Flow(local[i], local[i + 1], P(local[i], local[i + 1]), frac))
                if chain and k == len(nodes) - 1:
                    continue
                nxt = rail_head(by_node[nodes[(k + 1) % len(nodes)]], c, rails)
                # PXN: the last GPU of the node's part hands over to the rail-c GPU over NVLink,
                # which sends through its own NIC.
                path = (P(local[-1], local[0]) if len(local) > 1 else ()) + P(local[0], nxt[0])
                flows.append(Flow(local[-1], nxt[0], path, frac))
        return flows
