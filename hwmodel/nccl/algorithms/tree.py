"""NCCL's Tree algorithm (``NCCL_ALGO_TREE`` = 0): all-reduce, every protocol.

NCCL's model also has Tree entries for other collectives, with no latency or bandwidth refinement;
NCCL never picks them in practice, and trainsim disables them.

Tuner terms (``ncclTopoTuneModel``, ``src/graph/tuning.cc`` 2.30.7): busBw = channels x bw, then
all-reduce ``min(0.92 busBw, channels x perChMaxTreeBw)``, LL ``min(busBw/3.8, llMaxBw)``, LL128
``min(busBw x (7/9 on one node, else 120/128), channels x perChMaxTreeLL128Bw)``, x0.85 with the plain
TREE pattern; algBw = busBw/2. Latency ``base + 2((ppn-1) intraLat + log2(nNodes) interLat)``.
``ncclTopoGetAlgoTime`` multiplies the bandwidth by :data:`TREE_CORRECTION_FACTOR` for medium sizes.

Flows: a chain inside each node and NCCL's double binary tree across nodes (``src/graph/trees.cc``);
each of the two trees carries half the data, reduce up and broadcast down pipelined, so every tree
edge carries the payload in both directions. With several nodes the channels are spread over the
rails as for rings: tree *c* has the rail-*c* GPU as node head and crosses the fabric through its NIC.
"""

from __future__ import annotations

from typing import ClassVar

from hwmodel.nccl.algorithms.base import Algorithm, Flow, FlowContext, ModelInputs, double_binary_tree, log2i, rail_head
from hwmodel.nccl.comm import (
    NCCL_LL128_MAX_NTHREADS,
    NCCL_MAX_NTHREADS,
    NCCL_SIMPLE_MAX_NTHREADS,
    ChannelPlan,
    CommTopology,
    SearchGraph,
    size_scaled_channels,
)

PER_CH_MAX_TREE_LL128_BW_GBPS: tuple[tuple[float, float, float], ...] = (
    (20.0, 20.0, 20.0),
    (20.0, 20.0, 20.0),
    (36.7, 36.7, 29.0),
    (55.6, 31.67, 20.0),
)
"""``perChMaxTreeLL128Bws`` GB/s per channel [generation][N1/N2/N4] (tuning.cc 2.30.7)."""

PER_CH_MAX_TREE_BW_GBPS: tuple[tuple[float, float, float], ...] = (
    (26.5, 18.5, 10.0),
    (24.0, 23.6, 17.8),
    (38.7, 41.4, 36.0),
    (70.0, 42.8, 24.0),
)
"""``perChMaxTreeBws`` GB/s per channel [generation][N1/N2/N4] (tuning.cc 2.30.7)."""

TREE_CORRECTION_FACTOR: tuple[tuple[float, ...], ...] = (
    (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0, 1.0),
    (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0, 1.0),
    (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9, .9),
)
"""``treeCorrectionFactor[proto][log2(nBytes/64)]`` (tuning.cc 2.30.7): Tree all-reduce bandwidth is
multiplied by it for ``0 <= floor(log2(nBytes >> 6)) < 23`` ("Trees are not perfectly sticking to the
model for medium sizes"). Rows LL, LL128, Simple; columns 64 B, 128 B, ... (powers of two).
``ncclTopoGetAlgoTime`` applies the same table (Simple row, up to index 23) to NVLSTree all-reduce, but
only on Blackwell (``minCompCap >= 100``) with x86 hosts (``cpuArch == NCCL_TOPO_CPU_ARCH_X86``)."""

PROTOCOL_ROW = {"ll": 0, "ll128": 1, "simple": 2}


class Tree(Algorithm):
    name = "tree"
    nccl_index = 0
    collectives = frozenset({"all_reduce"})
    base_latency_us = (6.8, 14.0, 8.4)
    hw_latency_us: ClassVar[dict[str, tuple[float, float, float]]] = {
        "nvlink": (0.6, 1.25, 4.0), "pci": (1.0, 1.9, 4.0), "net": (5.0, 8.5, 14.0)}

    def graph(self, topo: CommTopology) -> SearchGraph:
        return topo.tree

    def max_threads(self, proto: str, topo: CommTopology) -> int:
        """Simple 512, LL 512, LL128 640."""
        return NCCL_LL128_MAX_NTHREADS if proto == "ll128" else NCCL_SIMPLE_MAX_NTHREADS

    def channels(self, proto: str, n_bytes: int, topo: CommTopology) -> ChannelPlan:
        """Size-scaled channels from ``maxThreads``; Tree then always runs ``NCCL_MAX_NTHREADS`` = 640
        threads."""
        nc, _ = size_scaled_channels(topo.n_channels, self.max_threads(proto, topo),
                                     self.thread_threshold(proto, topo), n_bytes)
        return ChannelPlan(nc, NCCL_MAX_NTHREADS)

    def bus_bw_GBps(self, m: ModelInputs, bus_bw: float) -> float:
        nch = m.graph.n_channels
        if m.coll == "all_reduce":
            bus_bw = min(bus_bw * 0.92, nch * PER_CH_MAX_TREE_BW_GBPS[m.ci][m.index2])
        if m.proto == "ll":
            bus_bw = min(bus_bw / 3.8, m.ll_max_bw)
        if m.proto == "ll128":
            bus_bw = min(bus_bw * (7.0 / 9.0 if m.nn == 1 else 120.0 / 128.0),
                         nch * PER_CH_MAX_TREE_LL128_BW_GBPS[m.ci][m.index2])
        if m.topo.tree_pattern == "tree":
            bus_bw *= 0.85
        return bus_bw

    def latency_us(self, m: ModelInputs) -> float:
        if m.coll != "all_reduce":
            return m.base_lat
        return m.base_lat + 2 * ((m.n // m.nn - 1) * m.intra_lat + log2i(m.nn) * m.inter_lat)

    def bandwidth_factor(self, coll: str, proto: str, topo: CommTopology, n_bytes: int) -> float:
        log_size = log2i(int(n_bytes) >> 6)
        if coll == "all_reduce" and 0 <= log_size < 23:
            return TREE_CORRECTION_FACTOR[PROTOCOL_ROW[proto]][log_size]
        return 1.0

    def flows(self, ctx: FlowContext, op: str, gpus: tuple[str, ...], root: int) -> list[Flow]:
        P = ctx.path
        by_node = ctx.nodes_of(gpus)
        nodes = list(by_node)
        flows = []
        rails = ctx.rails(max(len(v) for v in by_node.values())) if len(nodes) > 1 else 1
        frac = 1.0 / rails
        trees = double_binary_tree(len(nodes)) if len(nodes) > 1 else []
        for c in range(rails):
            heads = []
            for node in nodes:
                # Intra-node chain from the rail-c GPU, up and down (each direction carries it once).
                local = rail_head(by_node[node], c, rails)
                heads.append(local[0])
                for i in range(len(local) - 1):
                    flows.append(Flow(local[i + 1], local[i], P(local[i + 1], local[i]), frac))
                    flows.append(Flow(local[i], local[i + 1], P(local[i], local[i + 1]), frac))
            for tree in trees:
                for child, parent in tree:
                    a, b = heads[child], heads[parent]
                    flows.append(Flow(a, b, P(a, b), 0.5 * frac))
                    flows.append(Flow(b, a, P(b, a), 0.5 * frac))
        return flows
