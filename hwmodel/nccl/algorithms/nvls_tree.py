"""NCCL's NVLSTree algorithm (``NCCL_ALGO_NVLS_TREE`` = 5): NVLink SHARP in each node, trees between.

NCCL's multi-node all-reduce on NVSwitch gen3+ nodes (Hopper, Blackwell), Simple only. It needs no
CollNet/SHARP plugin, only an NVLS graph of >= 2 channels (multicast-capable NVSwitch, two or more GPUs
per node) and more than one node (tuning.cc 2.30.7: "NVLS/NVLStree needs at least 2 channels",
"Disable NVLS Tree on a single node"; the all-gather/reduce-scatter loop skips it).

Tuner terms (tuning.cc 2.30.7): per channel ``min(NVLS intraBw, bwInter x (2 on two nodes, "Handle 2
node case of NVLSTree"), perChMaxNVLSTreeBw)``; algBw = busBw x nRanks/nsteps; latency ``base +
intraLat + 2 log2(nNodes) interLat``. ``ncclTopoGetAlgoTime`` applies the Tree correction factor to
NVLSTree all-reduce below 2^30 B on Blackwell with an x86 host. Channels: ``nvlsChannels``, 640 threads.

Worked example, DGX H100 (NVLS graph 8 channels, bwIntra 40, bwInter 48 GB/s): per channel
``intraBw = 40 * 0.85 * 7/8 * 2 = 59.5``, ``interBw = 48 * 2 = 96`` on 2 nodes (48 on more), capped by
``perChMaxNVLSTreeBws`` 57.7 (2 nodes) / 45.5 (more); busBw = 8 x 57.7 = 461.6 GB/s (2 nodes) or 364
GB/s, algBw = busBw * n / (2(n-1)) = 246.2 GB/s on 16 ranks, 183.4 GB/s on 128; latency ``0 + 25 + 2 *
log2(nNodes) * 20.9`` = 66.8 us (2 nodes), 108.6 us (4), 192.2 us (16).

Flows (NCCL's
``RunWorkColl<ncclFuncAllReduce, T, RedOp, NCCL_ALGO_NVLS_TREE, NCCL_PROTO_SIMPLE>`` in
``src/device/all_reduce.h``, trees from ``connectNvls`` in ``src/graph/connect.cc``). Each node has
``H`` NVLS heads, one per NIC (the NIC's local GPU); every channel cuts its part of the buffer into
``H`` chunks and head ``h`` owns chunk ``h``. Per channel: every GPU scatters its data into its own
NVLS buffer (local HBM); head ``h``'s reduce warps read chunk ``h`` through the multicast address
(``multimem.ld_reduce``: the NVSwitch pulls that chunk from every GPU of the node, adds it up and
returns the sum to the head), add the partial sums arriving from up to two network children and
send the result to the tree parent through the head's NIC (``FanAsymmetric<3, 1>``); the broadcast
warps receive the final sum from the parent, pass it to the children and store it through the
multicast address (``multimem.st``: one copy to the switch, which writes it into every GPU of the
node); the tree root reduces and broadcasts in one step. The inter-node trees are NCCL's double
binary tree over the nodes (``ncclGetDtree``), made of the head-``h`` GPUs of every node; channel
``c`` uses tree ``c mod 2``, so each tree carries half of every head's chunk. Per byte of the
all-reduce buffer ``S``:

- NVLink GPU->NVSwitch and NVSwitch->GPU: ``1 + 1/H`` for a head (its share of every reduction up,
  its reduced chunk back, its broadcast up, everyone's broadcast down), ``1`` for a GPU that is not
  a head;
- NIC of head ``h`` on node ``k``, each direction: ``deg(k) / (2H)``, where ``deg(k)`` counts node
  ``k``'s tree links (parent + children) in both trees: 2 on two nodes (``S/H`` per NIC), up to 4
  on more (interior in one tree, leaf in the other: ``2S/H``, what a Tree channel pair puts on a
  NIC), so DGX H100 x 2 carries ``S/8`` per NIC and direction, x 16 up to ``S/4``.

NVLSTree runs at the tuner's bandwidth (its activity's rate bound) unless a link it loads binds first
(on DGX B200 x 16 the NICs do: ``S/4`` per NIC at the tuner's 193.5 GB/s would need 48.4 GB/s of a NIC's
47 GB/s).
"""

from __future__ import annotations

from typing import ClassVar

from hwmodel.nccl.algorithms.base import Algorithm, Flow, FlowContext, ModelInputs, double_binary_tree, log2i
from hwmodel.nccl.algorithms.nvls import nvls_intra_bw_GBps
from hwmodel.nccl.algorithms.tree import PROTOCOL_ROW, TREE_CORRECTION_FACTOR
from hwmodel.nccl.comm import NCCL_MAX_NTHREADS, ChannelPlan, CommTopology, SearchGraph

PER_CH_MAX_NVLS_TREE_BW_GBPS: tuple[tuple[float, float, float], ...] = (
    (26.5, 18.5, 10.0),
    (24.0, 23.6, 17.8),
    (0.0, 57.7, 45.5),
    (0.0, 96.0, 80.0),
)
"""``perChMaxNVLSTreeBws`` GB/s per channel [generation][N1/N2/N4] (tuning.cc 2.30.7). NVLSTree needs
NVSwitch gen3 (Hopper+) and several nodes, so only the Hopper/Blackwell N2 and N4 entries are ever used."""


class NvlsTree(Algorithm):
    name = "nvls_tree"
    nccl_index = 5
    aliases = ("nvlstree", "nvls-tree")
    collectives = frozenset({"all_reduce"})
    protocols = frozenset({"simple"})
    hw_latency_us: ClassVar[dict[str, tuple[float, float, float]]] = {
        "nvlink": (0.0, 0.0, 25.0), "pci": (0.0, 0.0, 0.0), "net": (0.0, 0.0, 20.9)}

    def fits(self, coll: str, topo: CommTopology) -> bool:
        return topo.nvls_tree_available

    def graph(self, topo: CommTopology) -> SearchGraph:
        assert topo.nvls is not None
        return topo.nvls

    def channels(self, proto: str, n_bytes: int, topo: CommTopology) -> ChannelPlan:
        if not topo.nvls_tree_available:
            raise ValueError("NVLSTree is not available on this communicator (needs NVLS, i.e. NVSwitch gen3+, "
                             "and several nodes)")
        return ChannelPlan(topo.nvls_channels, NCCL_MAX_NTHREADS)

    def max_channels(self, topo: CommTopology) -> int:
        return topo.nvls_channels

    def channel_bw_GBps(self, m: ModelInputs) -> float:
        inter_bw = m.graph.bw_inter_GBps * (2.0 if m.nn <= 2 else 1.0)
        bw = min(nvls_intra_bw_GBps(m), inter_bw)
        return min(bw, PER_CH_MAX_NVLS_TREE_BW_GBPS[m.ci][m.index2])

    def alg_bw_GBps(self, m: ModelInputs, bus_bw: float) -> float:
        return bus_bw * (m.n / m.nsteps)

    def latency_us(self, m: ModelInputs) -> float:
        return m.base_lat + (m.intra_lat + 2 * log2i(m.nn) * m.inter_lat)

    def bandwidth_factor(self, coll: str, proto: str, topo: CommTopology, n_bytes: int) -> float:
        log_size = log2i(int(n_bytes) >> 6)
        if (coll == "all_reduce" and 0 <= log_size < 24 and topo.gpu_arch == "blackwell"
                and topo.cpu_vendor in ("intel", "amd")):
            return TREE_CORRECTION_FACTOR[PROTOCOL_ROW[proto]][log_size]
        return 1.0

    def flows(self, ctx: FlowContext, op: str, gpus: tuple[str, ...], root: int) -> list[Flow]:
        """NVLink up/down for every GPU, and per head index the two binary trees over the nodes' head
        GPUs, each edge carrying ``1/(2H)`` each way."""
        topo = ctx.topology
        P = ctx.path
        by_node = ctx.nodes_of(gpus)
        nodes = list(by_node)
        heads = [nvls_heads(topo, by_node[node]) for node in nodes]
        n_heads = min(len(h) for h in heads)
        ct = ctx.comm_topology(gpus)
        if ct.nvls_heads:
            n_heads = min(n_heads, ct.nvls_heads)
        share = 1.0 / n_heads
        flows = []
        for node, node_heads in zip(nodes, heads, strict=True):
            head_set = set(node_heads[:n_heads])
            for g in by_node[node]:
                sw = topo.nvswitch_of(g)
                w = 1.0 + (share if g in head_set else 0.0)
                flows.append(Flow(g, g, P(g, sw), w))
                flows.append(Flow(g, g, P(sw, g), w))
        for h in range(n_heads):
            for tree in double_binary_tree(len(nodes)):
                for child, parent in tree:
                    a, b = heads[child][h], heads[parent][h]
                    flows.append(Flow(a, b, P(a, b), 0.5 * share))
                    flows.append(Flow(b, a, P(b, a), 0.5 * share))
        return flows


def nvls_heads(topo, gpus: list[str]) -> list[str]:
    """One NVLS head per NIC among ``gpus`` (one node), in local order: the first GPU of the
    communicator on each NIC, as NCCL's NVLS search makes each NIC's local GPU a head."""
    heads, seen = [], set()
    for g in sorted(gpus, key=topo.local_index):
        nic = topo.nic_of(g)
        if nic not in seen:
            seen.add(nic)
            heads.append(g)
    return heads
