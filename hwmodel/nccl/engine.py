"""NCCL collectives executed on the contended hardware model.

:class:`NcclEngine` turns a :class:`~hwmodel.ir.Collective` on a list of GPUs into traffic on the
cluster's fluid resources, decomposed the way NCCL 2.30 does it:

* **Ring** (all_reduce: 2(n-1) steps, all_gather / reduce_scatter: n-1, broadcast / reduce: a
  pipeline along the ring). Ranks are ordered node by node. With several nodes NCCL builds one ring
  per NIC ("rail"): ring *c* enters and leaves each node through the NIC of local GPU *c*, and the
  GPU that closes the node's part of the ring forwards over NVLink to that GPU first (PXN, NCCL
  2.12+), so inter-node traffic stays on its rail. Each rail ring carries 1/K of the data.
* **Tree**: a chain inside each node and NCCL's double binary tree across nodes
  (``src/graph/trees.cc``); each of the two trees carries half the data, reduce up and broadcast down
  pipelined, so every tree edge carries the payload in both directions.
* **NVLS** (NVLink SHARP, NVSwitch gen3, one node): each GPU sends its buffer up to the switch, which
  reduces, and receives the reduced result by multicast: ``S`` up and ``S`` down per GPU.
* **all_to_all**: one send/recv pair per ordered pair of ranks (NCCL >= 2.28 expands ``ncclAlltoAll``
  this way).

Fidelities: ``flow`` makes ONE fluid activity per collective over every link it loads, with the
weight of each link = bytes on that link per byte of per-rank progress, so contention with other
traffic emerges from the max-min solver; NCCL's latency terms (from the tuner) are paid first. ``step``
runs every algorithm step as a synchronised set of transfers (teaching, small systems); both agree
where nothing contends.

Bandwidth efficiency enters as link weight: a protocol that carries 8 data bytes per 16-byte line (LL)
puts 2 bytes on the wire per payload byte; NCCL's app-level NVLink efficiency (20 of 25 GB/s per link,
``src/graph/topo.h`` SM80_NVLINK_BW) likewise. NCCL kernels also move their bytes through HBM, as side
loads on each member's HBM (hardware_nccl.md §5(b): at least one read and one write per hop, plus a
read for reductions).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import simpy

from hwmodel.cluster import Cluster
from hwmodel.fluid import Resource
from hwmodel.ir import COLLECTIVE_OPS, Collective
from hwmodel.nccl import tuner as _tuner

FIDELITIES = ("flow", "step")

HBM_BYTES_PER_BYTE = {"all_reduce": 3.0, "reduce_scatter": 3.0, "reduce": 3.0,
                      "all_gather": 2.0, "broadcast": 2.0, "all_to_all": 2.0, "p2p": 2.0}
"""HBM bytes each member moves per payload byte it sends: write of the incoming data and read to
forward it, plus a read of the local input where the step reduces (hardware_nccl.md §5(b), DERIVED,
not measured)."""


@dataclass(slots=True)
class Plan:
    """A collective resolved to an algorithm, a protocol and channels, ready to start."""

    op: str
    size_bytes: int
    gpus: tuple[str, ...]
    algorithm: str
    protocol: str
    n_channels: int
    latency_s: float
    predicted_time_s: float
    rate_bound_Bps: float | None
    root: int = 0
    name: str = ""
    peer_channels: int = 0
    info: dict = field(default_factory=dict)


class NcclEngine:
    """Runs collectives and point-to-point transfers on a :class:`Cluster`.

    Args:
        cluster: the machine.
        fidelity: ``flow`` (default) or ``step``.
        algorithm, protocol: global overrides, as ``NCCL_ALGO`` / ``NCCL_PROTO``.

    Raises:
        ValueError: unknown fidelity, algorithm or protocol (the message lists the allowed values).
    """

    def __init__(self, cluster: Cluster, *, fidelity: str = "flow", algorithm: str | None = None,
                 protocol: str | None = None) -> None:
        if fidelity not in FIDELITIES:
            raise ValueError(f"fidelity: unknown value {fidelity!r}; allowed: {', '.join(FIDELITIES)}")
        self.cluster = cluster
        self.env: simpy.Environment = cluster.env
        self.fidelity = fidelity
        self.algorithm = _tuner.normalise_algorithm(algorithm) if algorithm else None
        self.protocol = _tuner.normalise_protocol(protocol) if protocol else None
        topo = cluster.topology
        self._node_of = {g: topo.node_of(g) for g in topo.gpus()}
        self._comm_topo_cache: dict[tuple[str, ...], object] = {}
        self._plan_cache: dict[tuple, Plan] = {}
        self._weights_cache: dict[tuple, tuple[dict[Resource, float], dict[Resource, float]]] = {}

    # -- planning ------------------------------------------------------------------------------
    def comm_topology(self, gpus: tuple[str, ...]):
        """NCCL's view of a communicator on these GPUs (see :class:`tuner.CommTopology`)."""
        ct = self._comm_topo_cache.get(gpus)
        if ct is None:
            topo = self.cluster.topology
            nodes: dict[str, int] = {}
            for g in gpus:
                n = self._node_of[g]
                nodes[n] = nodes.get(n, 0) + 1
            spec = topo.gpu_spec
            ct = _tuner.CommTopology.from_system(
                gpu_arch=_tuner.arch_of(spec.compute_capability),
                n_nodes=len(nodes),
                ppn=max(nodes.values()),
                nvlink_bw_per_gpu_GBps=spec.nccl_nvlink_bandwidth_Bps / 1e9,
                nic_bw_GBps=topo.nic_spec.bandwidth_Bps / 1e9,
                nics_per_node=topo.nics_per_node,
                cpu_vendor=getattr(topo, "cpu_vendor", "amd"),
                nvswitch_gen=getattr(topo, "nvswitch_generation", 0),
                n_ranks=len(gpus),
            )
            self._comm_topo_cache[gpus] = ct
        return ct

    def plan(self, coll: Collective, gpus: tuple[str, ...]) -> Plan:
        """Pick algorithm, protocol and channels for ``coll`` on ``gpus`` (NCCL's tuner).

        Raises:
            ValueError: unknown collective, duplicate GPUs, or a forced algorithm the collective or
                system does not support.
        """
        if coll.op not in COLLECTIVE_OPS:
            raise ValueError(f"collective op: unknown {coll.op!r}; allowed: {', '.join(COLLECTIVE_OPS)}")
        if len(set(gpus)) != len(gpus):
            raise ValueError(f"collective {coll.op}: duplicate GPUs in group {gpus}")
        if coll.size_bytes < 0:
            raise ValueError(f"collective {coll.op}: size_bytes must be >= 0, got {coll.size_bytes}")
        algo = coll.algorithm or self.algorithm
        proto = coll.protocol or self.protocol
        key = (coll.op, coll.size_bytes, gpus, algo, proto, coll.root)
        hit = self._plan_cache.get(key)
        if hit is not None:
            return hit
        n = len(gpus)
        if n == 1:
            p = Plan(coll.op, coll.size_bytes, gpus, "none", "simple", 0, 0.0, 0.0, None, coll.root,
                     coll.name)
        elif coll.op == "all_to_all":
            p = self._plan_all_to_all(coll, gpus)
        else:
            ct = self.comm_topology(gpus)
            ch = _tuner.choose(coll.op, coll.size_bytes, ct, algo=algo, proto=proto)
            bw = _tuner.algo_bandwidth_Bps(coll.op, ch.algorithm, ch.protocol, ct)
            # The tuner's bandwidth assumes every channel; small messages run on fewer.
            full = _tuner.nccl_channels(ch.algorithm, ch.protocol, 1 << 40, ct)[0]
            scale = ch.n_channels / full if full else 1.0
            bound = _bus_rate(coll.op, ch.algorithm, bw, n) * scale if bw else None
            p = Plan(coll.op, coll.size_bytes, gpus, ch.algorithm, ch.protocol, ch.n_channels,
                     ch.latency_s, ch.predicted_time_s, bound, coll.root, coll.name)
        self._plan_cache[key] = p
        return p

    def plan_p2p(self, src: str, dst: str, size_bytes: int) -> Plan:
        """A send/recv of ``size_bytes`` from GPU ``src`` to GPU ``dst``."""
        same_node = self._node_of[src] == self._node_of[dst]
        ct = self.comm_topology((src, dst))
        nch, lat = _tuner.p2p_channels_and_latency(size_bytes, ct, same_node=same_node)
        return Plan("p2p", size_bytes, (src, dst), "p2p", "simple", nch, lat, 0.0, None)

    def _plan_all_to_all(self, coll: Collective, gpus: tuple[str, ...]) -> Plan:
        ct = self.comm_topology(gpus)
        per_peer = coll.size_bytes // max(len(gpus), 1)
        multi = len({self._node_of[g] for g in gpus}) > 1
        nch, lat = _tuner.p2p_channels_and_latency(per_peer, ct, same_node=not multi)
        return Plan("all_to_all", coll.size_bytes, gpus, "p2p", "simple", nch, lat, 0.0, None, 0, coll.name)

    # -- execution -----------------------------------------------------------------------------
    def start(self, plan: Plan) -> simpy.Event:
        """Start a planned collective now (every member has arrived). Returns its completion event."""
        if plan.algorithm == "none" or plan.size_bytes == 0 and plan.latency_s == 0:
            ev = self.env.event()
            ev.succeed()
            return ev
        if self.fidelity == "step" and plan.op != "p2p":
            return self.env.process(self._run_steps(plan))
        work, weights, side = self._flow(plan)
        act = self.cluster.fs.start(work, weights, latency_s=plan.latency_s, rate_bound=plan.rate_bound_Bps,
                                    side_loads=side, name=plan.name or plan.op)
        return act.done

    def run(self, coll: Collective, gpus: tuple[str, ...] | list[str]) -> simpy.Event:
        """Plan and start ``coll`` on ``gpus`` now (standalone use, e.g. nccl-tests)."""
        return self.start(self.plan(coll, tuple(gpus)))

    # -- flow fidelity: one activity per collective --------------------------------------------
    def _flow(self, plan: Plan) -> tuple[float, dict[Resource, float], dict[Resource, float]]:
        """Work (payload bytes per member per edge) and link/HBM weights of a planned collective."""
        n = len(plan.gpus)
        S = float(plan.size_bytes)
        op, algo = plan.op, plan.algorithm
        if op == "p2p":
            work = S
        elif op == "all_to_all":
            work = S / n
        elif algo == "ring":
            if op == "all_reduce":
                work = S * 2 * (n - 1) / n
            elif op in ("all_gather", "reduce_scatter"):
                work = S * (n - 1) / n
            else:  # broadcast / reduce: the whole buffer flows along the chain, pipelined
                work = S
        else:  # tree, nvls: every edge carries the whole per-rank buffer (each way)
            work = S
        key = (op, algo, plan.protocol, plan.gpus, plan.root)
        hit = self._weights_cache.get(key)
        if hit is None:
            hit = self._weights(plan)
            self._weights_cache[key] = hit
        return work, hit[0], hit[1]

    def _weights(self, plan: Plan) -> tuple[dict[Resource, float], dict[Resource, float]]:
        proto_w = 1.0 / _tuner.PROTOCOL_EFFICIENCY[plan.protocol]
        flows = self._edge_flows(plan)  # list of ((src_gpu, dst_gpu, via_nic_gpu|None), fraction)
        weights: dict[Resource, float] = {}
        for path, frac in flows:
            for r in path:
                eff = self._link_efficiency(r)
                weights[r] = weights.get(r, 0.0) + frac * proto_w / eff
        hbm = HBM_BYTES_PER_BYTE.get(plan.op if plan.op != "p2p" else "p2p", 2.0)
        side = {self.cluster.gpus[g].hbm: hbm for g in plan.gpus}
        return weights, side

    def _link_efficiency(self, r: Resource) -> float:
        kind = r.meta[3] if isinstance(r.meta, tuple) and len(r.meta) > 3 else ""
        spec = self.cluster.topology.gpu_spec
        if kind == "nvlink":
            return spec.nccl_nvlink_bandwidth_per_link_Bps / spec.nvlink_bandwidth_per_link_Bps
        if kind in ("ib", "net", "ethernet"):
            return _tuner.NET_APP_EFFICIENCY
        return 1.0

    def _path(self, a: str, b: str) -> list[Resource]:
        return self.cluster.path(a, b)[0]

    def _rail_hop(self, src: str, dst_node_gpu: str, rail_gpu_src: str) -> list[Resource]:
        """Inter-node hop of a rail ring: src GPU -> (NVLink, PXN) -> rail GPU -> its NIC -> ... -> dst."""
        path: list[Resource] = []
        if src != rail_gpu_src:
            path += self._path(src, rail_gpu_src)
        path += self._path(rail_gpu_src, dst_node_gpu)
        return path

    def _edge_flows(self, plan: Plan) -> list[tuple[list[Resource], float]]:
        gpus = list(plan.gpus)
        n = len(gpus)
        op = plan.op
        if op == "p2p":
            return [(self._path(gpus[0], gpus[1]), 1.0)]
        if op == "all_to_all":
            return [(self._path(a, b), 1.0) for a in gpus for b in gpus if a != b]
        by_node: dict[str, list[str]] = {}
        for g in gpus:
            by_node.setdefault(self._node_of[g], []).append(g)
        nodes = list(by_node)
        if plan.algorithm == "nvls":
            topo = self.cluster.topology
            flows = []
            for g in gpus:
                sw = topo.nvswitch_of(g)
                flows.append((self._path(g, sw), 1.0))
                flows.append((self._path(sw, g), 1.0))
            return flows
        if plan.algorithm == "tree":
            return self._tree_flows(by_node, nodes)
        # Ring (and ring-pipelined broadcast/reduce).
        chain = op in ("broadcast", "reduce")
        if len(nodes) == 1:
            order = _rotate(gpus, plan.root) if chain else gpus
            edges = [(order[i], order[(i + 1) % n]) for i in range(n - (1 if chain else 0))]
            return [(self._path(a, b), 1.0) for a, b in edges]
        ppn = len(by_node[nodes[0]])
        rails = max(1, min(ppn, self.cluster.topology.nics_per_node))
        flows = []
        for c in range(rails):
            frac = 1.0 / rails
            for k, node in enumerate(nodes):
                local = _rotate(by_node[node], c % len(by_node[node]))
                for i in range(len(local) - 1):
                    flows.append((self._path(local[i], local[i + 1]), frac))
                if chain and k == len(nodes) - 1:
                    continue
                nxt = _rotate(by_node[nodes[(k + 1) % len(nodes)]], c % len(by_node[nodes[(k + 1) % len(nodes)]]))
                flows.append((self._rail_hop(local[-1], nxt[0], local[0]), frac))
        return flows

    def _tree_flows(self, by_node: dict[str, list[str]], nodes: list[str]) -> list[tuple[list[Resource], float]]:
        flows = []
        # Intra-node chains, up and down (each direction carries the payload once).
        for node in nodes:
            local = by_node[node]
            for i in range(len(local) - 1):
                flows.append((self._path(local[i + 1], local[i]), 1.0))
                flows.append((self._path(local[i], local[i + 1]), 1.0))
        if len(nodes) > 1:
            for tree in _double_binary_tree(len(nodes)):
                for child, parent in tree:
                    a, b = by_node[nodes[child]][0], by_node[nodes[parent]][0]
                    flows.append((self._path(a, b), 0.5))
                    flows.append((self._path(b, a), 0.5))
        return flows

    # -- step fidelity ---------------------------------------------------------------------------
    def _run_steps(self, plan: Plan):
        """Every algorithm step as a synchronised set of transfers (ring and chain algorithms)."""
        env = self.env
        gpus = list(plan.gpus)
        n = len(gpus)
        steps = _tuner.ring_steps(plan.op, n) if plan.algorithm == "ring" else 1
        hop_lat = plan.latency_s / max(steps, 1)
        work, weights, side = self._flow(plan)
        per_step = work / steps
        for _ in range(steps):
            act = self.cluster.fs.start(per_step, weights, latency_s=hop_lat,
                                        rate_bound=plan.rate_bound_Bps, side_loads=side,
                                        name=f"{plan.name or plan.op}/step")
            yield act.done
        return env.now


def _rotate(xs: list[str], k: int) -> list[str]:
    k %= len(xs)
    return xs[k:] + xs[:k]


def _bus_rate(op: str, algo: str, algbw_Bps: float, n: int) -> float:
    """Convert NCCL's algorithm bandwidth into this engine's progress rate (bytes per edge per s)."""
    if algo == "ring":
        if op == "all_reduce":
            return algbw_Bps * 2 * (n - 1) / n
        if op in ("all_gather", "reduce_scatter"):
            return algbw_Bps * (n - 1) / n
    return algbw_Bps


def _binary_tree(n: int) -> list[tuple[int, int]]:
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


def _double_binary_tree(n: int) -> list[list[tuple[int, int]]]:
    """Tree 0 and tree 1 (mirror when n is even, shifted by one when odd) (``ncclGetDtree``)."""
    t0 = _binary_tree(n)
    if n % 2 == 0:
        t1 = [(n - 1 - c, n - 1 - p) for c, p in t0]
    else:
        t1 = [((c + 1) % n, (p + 1) % n) for c, p in t0]
    return [t0, t1]
