"""A quick analytical (alpha-beta) cost of a lowered reduction program, for pre-screening (P² §6).

Every step's communicators run concurrently; a step costs the slowest of them and a program the sum
of its steps. A communicator of ``n`` GPUs running a ring collective on ``S`` bytes (NCCL's size
convention: per-rank buffer for all-reduce/reduce/broadcast, the whole buffer for
all-gather/reduce-scatter) costs, for the cheapest NCCL protocol ``p``::

    t = base_p + steps * hop_p(level) + f_op(n) * S / (B(level) * eff_p)

with ring factors ``f = 2(n-1)/n`` (all-reduce), ``(n-1)/n`` (reduce-scatter, all-gather) and ``1``
(pipelined reduce/broadcast), ``2(n-1)`` or ``n-1`` steps, and ``level`` the outermost hierarchy level
the communicator spans:

* inside a node: ``B`` = the GPU's NVLink bandwidth (topology link) x NCCL's app-level efficiency;
* across nodes: ``B = min(B_nvlink, K * B_nic)`` with ``K`` the NICs the communicator can drive in its
  busiest node: one per member GPU there (rail rings), at most the node's NICs, shared
  proportionally with the other communicators of the same step that cross nodes from that node.

Latencies are NCCL 2.30.7's ring constants (``src/graph/tuning.cc``: ``baseLat`` and
``hwLat[NVLINK|NET]`` for LL / LL128 / Simple); LL and LL128 carry 1/2 and 120/128 payload per wire
byte. It ignores tree algorithms, HBM traffic and launch overheads: a pre-screen, not the simulator.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

BASE_LATENCY_S = {"ll": 6.6e-6, "ll128": 14.0e-6, "simple": 8.4e-6}
"""NCCL ring ``baseLat`` per protocol (tuning.cc 2.30.7), seconds."""
HOP_LATENCY_S = {
    "nvlink": {"ll": 0.6e-6, "ll128": 1.9e-6, "simple": 3.4e-6},
    "net": {"ll": 2.7e-6, "ll128": 4.0e-6, "simple": 14.0e-6},
}
"""NCCL ring ``hwLat`` per step (tuning.cc 2.30.7), seconds."""
PROTOCOL_EFFICIENCY = {"ll": 0.5, "ll128": 120.0 / 128.0, "simple": 1.0}
"""Payload bytes per wire byte (LL: 8 of 16-byte lines; LL128: 120 of 128)."""
DEFAULT_NVLINK_EFFICIENCY = 0.8
"""NCCL's app-level NVLink bandwidth over line rate (20 of 25 GB/s per link, nccl topo.h) when the
GPU spec does not give its own figures."""
DEFAULT_NIC_EFFICIENCY = 0.94
"""Achieved / line rate of one InfiniBand NIC through NCCL (~23.5 of 25 GB/s on HDR)."""

RING_FACTOR = {
    "all_reduce": lambda n: 2.0 * (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce": lambda n: 1.0,
    "broadcast": lambda n: 1.0,
}
"""Bytes each rank moves per byte of the NCCL size, ring algorithm."""
RING_STEPS = {"all_reduce": lambda n: 2 * (n - 1), "reduce_scatter": lambda n: n - 1,
              "all_gather": lambda n: n - 1, "reduce": lambda n: n - 1, "broadcast": lambda n: n - 1}


@dataclass(frozen=True, kw_only=True, slots=True)
class QuickCost:
    """Per-level bandwidths of a system and the device -> node map.

    Build with :meth:`from_topology`; all fields in SI units.
    """

    node_of: tuple[int, ...]
    """Node index of each device (global rank)."""
    intra_Bps: float
    """Per-GPU NVLink (or intra-node) bandwidth NCCL achieves, bytes/s per direction."""
    nic_Bps: float
    """Per-NIC bandwidth NCCL achieves, bytes/s per direction."""
    nics_per_node: int
    """Compute NICs per node."""

    def __post_init__(self) -> None:
        if self.intra_Bps <= 0 or self.nic_Bps <= 0:
            raise ValueError(f"bandwidths must be > 0 (intra_Bps={self.intra_Bps}, nic_Bps={self.nic_Bps})")
        if self.nics_per_node < 1:
            raise ValueError(f"nics_per_node must be >= 1, got {self.nics_per_node}")

    @classmethod
    def from_topology(cls, topology, gpu_names: Sequence[str]) -> QuickCost:
        """Bandwidths from the topology's links: the route between two GPUs of node 0 (NVLink) and
        between GPU 0 of nodes 0 and 1 (its bottleneck is the NIC), scaled by NCCL's app-level
        efficiencies; ``gpu_names[d]`` is the GPU of device ``d``."""
        node_of = tuple(int(topology.node_of(g)) for g in gpu_names)
        spec = topology.gpu_spec
        line = getattr(spec, "nvlink_bandwidth_per_link_Bps", 0) or 0
        app = getattr(spec, "nccl_nvlink_bandwidth_per_link_Bps", 0) or 0
        nvl_eff = app / line if line and app else DEFAULT_NVLINK_EFFICIENCY
        n0 = topology.gpus_of_node(0)
        intra = topology.bottleneck_Bps(topology.route(n0[0], n0[1])) * nvl_eff if len(n0) > 1 else float("inf")
        nics = {topology.graph.nodes[g].get("nic") for g in n0} - {None}
        nic_bw = 25e9
        if topology.num_nodes > 1:
            n1 = topology.gpus_of_node(1)
            nic_bw = topology.bottleneck_Bps(topology.route(n0[0], n1[0]))
        elif topology.nic_spec is not None:
            nic_bw = float(getattr(topology.nic_spec, "bandwidth_Bps", nic_bw))
        if intra == float("inf"):
            intra = nic_bw
        return cls(node_of=node_of, intra_Bps=float(intra), nic_Bps=float(nic_bw) * DEFAULT_NIC_EFFICIENCY,
                   nics_per_node=max(1, len(nics)))

    def collective_s(self, op: str, size_bytes: float, ranks: Sequence[int], nic_share: float = 1.0) -> float:
        """Time of one ring collective on ``ranks`` (see module doc); ``nic_share`` is the fraction of
        the busiest node's NICs this communicator gets.

        Raises:
            ValueError: unknown op.
        """
        if op not in RING_FACTOR:
            raise ValueError(f"op {op!r}: expected one of {sorted(RING_FACTOR)}")
        n = len(ranks)
        if n < 2:
            return 0.0
        per_node = Counter(self.node_of[r] for r in ranks)
        if len(per_node) == 1:
            bw, hop = self.intra_Bps, HOP_LATENCY_S["nvlink"]
        else:
            k = min(min(per_node.values()), self.nics_per_node) * nic_share
            bw, hop = min(self.intra_Bps, max(k, 1e-9) * self.nic_Bps), HOP_LATENCY_S["net"]
        f = RING_FACTOR[op](n)
        steps = RING_STEPS[op](n)
        return min(BASE_LATENCY_S[p] + steps * hop[p] + f * size_bytes / (bw * PROTOCOL_EFFICIENCY[p])
                   for p in BASE_LATENCY_S)

    def step_s(self, op: str, comms: Sequence[tuple[Sequence[int], float]]) -> float:
        """Time of one step: ``comms`` = ``(ranks, size_bytes)`` of its concurrent communicators.

        Communicators crossing nodes share each node's NICs in proportion to their members there."""
        demand: Counter = Counter()
        crossing = []
        for ranks, _ in comms:
            per_node = Counter(self.node_of[r] for r in ranks)
            if len(per_node) > 1:
                crossing.append(per_node)
                for node, m in per_node.items():
                    demand[node] += min(m, self.nics_per_node)
            else:
                crossing.append(None)
        worst = 0.0
        for (ranks, size), per_node in zip(comms, crossing, strict=True):
            share = 1.0
            if per_node is not None:
                share = min(min(1.0, self.nics_per_node / demand[node]) for node in per_node)
            worst = max(worst, self.collective_s(op, size, ranks, share))
        return worst
