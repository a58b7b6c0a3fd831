"""NCCL's NVLS algorithm (``NCCL_ALGO_NVLS`` = 4): NVLink SHARP inside one node, Simple only.

Available for all-reduce, all-gather and reduce-scatter on NVSwitch gen3+ (Hopper or later) with an
NVLS graph of >= 2 channels, on one node: multi-node NVLS needs CollNet/IB SHARP, which tuning.cc
disables without ``collnetEnable`` ("Disable Collnet+Direct, Collnet+Chain or Collnet+NVLS if collnet
is not supported").

Tuner terms (tuning.cc 2.30.7): per channel ``bwIntra x nvlsEfficiency x (nCh-1)/nCh``, x2 for
all-reduce (two pipelined operations) else x (ppn-1)/ppn, capped by ``bwInter``; algBw = busBw x
nRanks/nsteps for all-reduce, busBw for all-gather/reduce-scatter. Latency = intraLat (+ interLat on
several nodes), no base latency. Channels: ``nvlsChannels`` (on several nodes at most ``nChannels``),
640 threads.

Flows: for all-reduce each GPU sends its buffer up to the switch, which reduces, and receives the
reduced result by multicast: ``S`` up and ``S`` down per GPU. All-gather sends each GPU's ``S/n``
share up once and receives the other ``(n-1)S/n`` by multicast (reduce-scatter the mirror image).
"""

from __future__ import annotations

from typing import ClassVar

from hwmodel.nccl.algorithms.base import AG_RS, Algorithm, Flow, FlowContext, ModelInputs
from hwmodel.nccl.comm import NCCL_MAX_NTHREADS, ChannelPlan, CommTopology, SearchGraph

NVLS_EFFICIENCY: tuple[float, ...] = (0.0, 0.0, 0.85, 0.74)
"""``nvlsEfficiency`` Volta..Blackwell (tuning.cc 2.30.7)."""


def nvls_intra_bw_GBps(m: ModelInputs) -> float:
    """NVLS busBw per channel inside the node (shared with NVLSTree, tuning.cc 2.30.7)."""
    g = m.graph
    intra_bw = g.bw_intra_GBps * NVLS_EFFICIENCY[m.ci] * (g.n_channels - 1) / g.n_channels
    intra_bw *= 2.0 if m.coll == "all_reduce" else (m.ppn - 1) / m.ppn
    return intra_bw


class Nvls(Algorithm):
    name = "nvls"
    nccl_index = 4
    collectives = frozenset({"all_reduce", "all_gather", "reduce_scatter"})
    protocols = frozenset({"simple"})
    hw_latency_us: ClassVar[dict[str, tuple[float, float, float]]] = {
        "nvlink": (0.0, 0.0, 25.0), "pci": (0.0, 0.0, 0.0), "net": (0.0, 0.0, 18.0)}

    def fits(self, coll: str, topo: CommTopology) -> bool:
        return topo.nvls_available

    def graph(self, topo: CommTopology) -> SearchGraph:
        assert topo.nvls is not None
        return topo.nvls

    def channels(self, proto: str, n_bytes: int, topo: CommTopology) -> ChannelPlan:
        if not topo.nvls_available:
            raise ValueError("NVLS is not available on this communicator")
        nc = topo.nvls_channels if topo.n_nodes == 1 else min(topo.nvls_channels, topo.n_channels)
        return ChannelPlan(nc, NCCL_MAX_NTHREADS)

    def max_channels(self, topo: CommTopology) -> int:
        return topo.nvls_channels

    def channel_bw_GBps(self, m: ModelInputs) -> float:
        return min(nvls_intra_bw_GBps(m), m.graph.bw_inter_GBps)

    def alg_bw_GBps(self, m: ModelInputs, bus_bw: float) -> float:
        return bus_bw if m.coll in AG_RS else bus_bw * (m.n / m.nsteps)

    def latency_us(self, m: ModelInputs) -> float:
        return m.intra_lat + (m.inter_lat if m.nn > 1 else 0.0)

    def work_bytes(self, op: str, size_bytes: float, n: int) -> float:
        return size_bytes * (n - 1) / n if op in AG_RS else size_bytes

    def progress_rate_Bps(self, op: str, algbw_Bps: float, n: int) -> float:
        return algbw_Bps * (n - 1) / n if op in AG_RS else algbw_Bps

    def flows(self, ctx: FlowContext, op: str, gpus: tuple[str, ...], root: int) -> list[Flow]:
        topo = ctx.topology
        n = len(gpus)
        up = 1.0 / (n - 1) if op == "all_gather" else 1.0
        down = 1.0 / (n - 1) if op == "reduce_scatter" else 1.0
        flows = []
        for g in gpus:
            sw = topo.nvswitch_of(g)
            flows.append(Flow(g, g, ctx.path(g, sw), up))
            flows.append(Flow(g, g, ctx.path(sw, g), down))
        return flows
