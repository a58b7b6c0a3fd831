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
  pipelined, so every tree edge carries the payload in both directions. With several nodes the
  channels are spread over the rails as for rings: tree *c* has the rail-*c* GPU as node head and
  crosses the fabric through its NIC.
* **NVLS** (NVLink SHARP, NVSwitch gen3, one node): for all-reduce each GPU sends its buffer up to the
  switch, which reduces, and receives the reduced result by multicast: ``S`` up and ``S`` down per
  GPU. All-gather sends each GPU's ``S/n`` share up once and receives the other ``(n-1)S/n`` by
  multicast (reduce-scatter the mirror image).
* **NVLSTree** (all-reduce on several nodes, NVSwitch gen3+; NCCL's
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
* **all_to_all**: one send/recv pair per ordered pair of ranks (NCCL >= 2.28 expands ``ncclAlltoAll``
  this way), all in flight at once (one grouped kernel).

Fidelities: ``flow`` makes ONE fluid activity per collective over every link it loads, with the
weight of each link = bytes on that link per byte of per-rank progress, so contention with other
traffic emerges from the max-min solver; NCCL's latency terms (from the tuner) are paid first.
``step`` runs every algorithm step as a synchronised set of per-edge transfers (one fluid activity
per edge, a barrier after each step; the latency is split evenly over the steps): ring all-reduce
2(n-1) steps, all-gather / reduce-scatter n-1, ring broadcast / reduce n pipeline steps. Tree, NVLS
and NVLSTree are pipelined up-and-down algorithms without a step structure at this level, and
all_to_all is one grouped kernel, so they run as ONE synchronised step of per-edge transfers. Both
fidelities agree where nothing contends (tests/hwmodel/nccl/test_engine.py checks 2 %). NVLSTree, like
the others, runs at the tuner's bandwidth (its activity's rate bound) unless a link it loads is
contended (on DGX B200 x 16 the NICs bind first: ``S/4`` per NIC at the tuner's 193.5 GB/s would need
48.4 GB/s of a NIC's 47 GB/s).

Bandwidth efficiency enters as link weight: a protocol that carries 8 data bytes per 16-byte line (LL)
puts 2 bytes on the wire per payload byte; NCCL's app-level link efficiency likewise (NVLink
:data:`NVLINK_EFFICIENCY_FIT` on Ampere, else NCCL's ``SMxx_NVLINK_BW`` over the line rate;
InfiniBand :data:`hwmodel.nccl.tuner.IB_APP_EFFICIENCY`), so a link's ``carried`` counter is payload x
protocol overhead / efficiency. NCCL kernels also move their bytes through HBM, as side loads on each
member's HBM (hardware_nccl.md §5(b): at least one read and one write per hop, plus a read for
reductions).

The nccl-tests emulation (:func:`simulate_nccl_tests`) adds the host side of a single-threaded
``-g G`` run (:data:`HOST_LAUNCH_PER_GPU_S`, :data:`HOST_PER_CHANNEL_PER_GPU_S`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import simpy

from hwmodel.cluster import Cluster
from hwmodel.fluid import Resource
from hwmodel.ir import COLLECTIVE_OPS, Collective
from hwmodel.nccl import nccltests as _nt
from hwmodel.nccl import tuner as _tuner
from hwmodel.nccl.channels import p2p_plan
from hwmodel.nccl.tuner_config import TunerConfig

if TYPE_CHECKING:
    from hwmodel.topology import Topology

FIDELITIES = ("flow", "step")

HBM_BYTES_PER_BYTE = {"all_reduce": 3.0, "reduce_scatter": 3.0, "reduce": 3.0,
                      "all_gather": 2.0, "broadcast": 2.0, "all_to_all": 2.0, "p2p": 2.0}
"""HBM bytes each member moves per payload byte it sends: write of the incoming data and read to
forward it, plus a read of the local input where the step reduces (hardware_nccl.md §5(b), DERIVED,
not measured)."""

NVLINK_EFFICIENCY_FIT: dict[str, float] = {"ampere": 234.9e9 / 300e9}
"""NCCL's achieved NVLink bandwidth / line rate, per GPU generation, where a measurement exists.

Ampere: 234.9 GB/s (the 16 GiB all-reduce busbw of 8x A100 SXM4 in stas00/ml-engineering
``network/README.md``, copied to ``tests/data/nccl_tests_a100_8gpu.csv``) over 12 x 25 GB/s = 300 GB/s,
i.e. 0.783 instead of NCCL's own model figure 20/25 = 0.80 (``SM80_NVLINK_BW``). [FITTED to that one
row]; NCCL <= 2.12's tuning.cc had the same number as a cap (``busBw = min(busBw, 235)`` on Ampere).
Other generations use NCCL's ``SMxx_NVLINK_BW`` / line rate (the GPU spec's figures)."""

HOST_LAUNCH_PER_GPU_S = 41.3e-6 / 8
"""Host time to enqueue one NCCL collective on one GPU when one thread drives several GPUs (s): the
41.3 µs intercept of ``t = 41.3 µs + 2.5 µs x nChannels`` over 8 GPUs. [FITTED] to the 32 KiB .. 1 MiB
rows of ``tests/data/nccl_tests_a100_8gpu.csv`` (nccl-tests ``-g 8``, one thread, A100), where the
measured time is flat in size and linear in NCCL's channel count (1, 2, 4, 8, 16, 24): the host, not
the GPU, is the bottleneck (fit within 2 % on all six rows)."""

HOST_PER_CHANNEL_PER_GPU_S = 2.5e-6 / 8
"""Host time per channel per GPU to enqueue one collective (s): the 2.5 µs/channel slope of the same
fit over 8 GPUs (NCCL prepares one work element per channel, ``src/enqueue.cc``). [FITTED] as
:data:`HOST_LAUNCH_PER_GPU_S`."""


@dataclass(slots=True)
class Plan:
    """A collective resolved to an algorithm, a protocol and channels, ready to start.

    Times in seconds, rates in bytes/s (``rate_bound_Bps``: bytes per ring edge per second).
    """

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


@dataclass(frozen=True, slots=True)
class Flow:
    """One edge of a collective: payload from GPU ``src`` to ``dst`` over ``path``.

    ``frac`` is the edge's bytes per byte of collective progress (1/rails for a rail ring).
    """

    src: str
    dst: str
    path: tuple[Resource, ...]
    frac: float


class NcclEngine:
    """Runs collectives and point-to-point transfers on a :class:`Cluster`.

    Args:
        cluster: the machine.
        fidelity: ``flow`` (default) or ``step``.
        algorithm, protocol: global overrides, as ``NCCL_ALGO`` / ``NCCL_PROTO``.
        nvlink_efficiency: achieved / line rate of NVLink for NCCL traffic; default
            :data:`NVLINK_EFFICIENCY_FIT` for the GPU generation, else NCCL's ``SMxx_NVLINK_BW`` ratio.
        tuner_config: tuner-plugin rules (:mod:`hwmodel.nccl.tuner_config`) that override NCCL's
            model per collective and size; default: the module-wide rules
            (:func:`hwmodel.nccl.tuner.set_default_tuner_config`), usually none.

    Raises:
        ValueError: unknown fidelity, algorithm or protocol (the message lists the allowed values).
    """

    def __init__(self, cluster: Cluster, *, fidelity: str = "flow", algorithm: str | None = None,
                 protocol: str | None = None, nvlink_efficiency: float | None = None,
                 tuner_config: TunerConfig | None = None) -> None:
        if fidelity not in FIDELITIES:
            raise ValueError(f"fidelity: unknown value {fidelity!r}; allowed: {', '.join(FIDELITIES)}")
        self.cluster = cluster
        self.env: simpy.Environment = cluster.env
        self.fidelity = fidelity
        self.algorithm = _tuner.normalise_algorithm(algorithm) if algorithm else None
        self.protocol = _tuner.normalise_protocol(protocol) if protocol else None
        self.tuner_config = tuner_config
        """Tuner-plugin rules of this engine (``None``: the module-wide ones, if any)."""
        topo = cluster.topology
        spec = topo.gpu_spec
        if nvlink_efficiency is None:
            arch = _tuner.arch_of(spec.compute_capability)
            nvlink_efficiency = NVLINK_EFFICIENCY_FIT.get(arch)
        if nvlink_efficiency is None and spec.nvlink_bandwidth_per_link_Bps > 0:
            nvlink_efficiency = spec.nccl_nvlink_bandwidth_per_link_Bps / spec.nvlink_bandwidth_per_link_Bps
        if nvlink_efficiency is not None and not 0 < nvlink_efficiency <= 1:
            raise ValueError(f"nvlink_efficiency must be in (0, 1], got {nvlink_efficiency!r}")
        self.nvlink_efficiency = nvlink_efficiency or 1.0
        """Achieved / line rate of NVLink for NCCL traffic."""
        self._node_of = {g: topo.node_of(g) for g in topo.gpus()}
        self._comm_topo_cache: dict[tuple[str, ...], object] = {}
        self._p2p_cache: dict[tuple, object] = {}
        self._merged_cache: dict[tuple, tuple[dict[Resource, float], dict[Resource, float]]] = {}
        self._plan_cache: dict[tuple, Plan] = {}
        self._weights_cache: dict[tuple, tuple[dict[Resource, float], dict[Resource, float]]] = {}
        self._flows_cache: dict[tuple, list[Flow]] = {}
        self._eff_cache: dict[Resource, float] = {}

    # -- planning ------------------------------------------------------------------------------
    def comm_topology(self, gpus: tuple[str, ...]):
        """NCCL's view of a communicator on these GPUs (see :class:`tuner.CommTopology`)."""
        nodes: dict[str, int] = {}
        for g in gpus:
            n = self._node_of[g]
            nodes[n] = nodes.get(n, 0) + 1
        key = (len(nodes), max(nodes.values()), len(gpus))  # all NCCL's model depends on
        ct = self._comm_topo_cache.get(key)
        if ct is None:
            topo = self.cluster.topology
            spec = topo.gpu_spec
            nic = topo.nic_spec
            ct = _tuner.CommTopology.from_system(
                gpu_arch=_tuner.arch_of(spec.compute_capability),
                n_nodes=len(nodes),
                ppn=max(nodes.values()),
                nvlink_bw_per_gpu_GBps=spec.nccl_nvlink_bandwidth_Bps / 1e9,
                nic_bw_GBps=nic.bandwidth_Bps / 1e9 if nic is not None else 25.0,
                nics_per_node=topo.nics_per_node,
                cpu_vendor=_cpu_vendor(topo),
                nvswitch_gen=_nvswitch_generation(topo),
                n_ranks=len(gpus),
            )
            self._comm_topo_cache[key] = ct
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
            dup = sorted({g for g in gpus if gpus.count(g) > 1})
            raise ValueError(f"collective {coll.op} ({coll.name or 'unnamed'}): duplicate GPUs {dup} "
                             f"in group {gpus}")
        if coll.size_bytes < 0:
            raise ValueError(f"collective {coll.op}: size_bytes must be >= 0, got {coll.size_bytes}")
        algo = coll.algorithm or self.algorithm
        proto = coll.protocol or self.protocol
        tuner = self.tuner_config if self.tuner_config is not None else _tuner.get_default_tuner_config()
        key = (coll.op, coll.size_bytes, gpus, algo, proto, coll.root, id(tuner))
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
            ch = _tuner.choose(coll.op, coll.size_bytes, ct, algo=algo, proto=proto, tuner=tuner)
            bw = _tuner.algo_bandwidth_Bps(coll.op, ch.algorithm, ch.protocol, ct)
            # The tuner's bandwidth assumes every channel; small messages run on fewer.
            full = _tuner.nccl_channels(ch.algorithm, ch.protocol, 1 << 40, ct)[0]
            scale = ch.n_channels / full if full else 1.0
            bound = _bus_rate(coll.op, ch.algorithm, bw, n) * scale if bw else None
            p = Plan(coll.op, coll.size_bytes, gpus, ch.algorithm, ch.protocol, ch.n_channels,
                     ch.latency_s, ch.predicted_time_s, bound, coll.root, coll.name,
                     info={"decided_by": ch.decided_by})
        self._plan_cache[key] = p
        return p

    def plan_p2p(self, src: str, dst: str, size_bytes: int) -> Plan:
        """A send/recv of ``size_bytes`` from GPU ``src`` to GPU ``dst``."""
        same_node = self._node_of[src] == self._node_of[dst]
        key = (same_node, size_bytes)
        pp = self._p2p_cache.get(key)
        if pp is None:
            ct = self.comm_topology((src, dst))
            peer = ("nvlink" if ct.intra_link == "nvlink" else "pci") if same_node else "net"
            pp = self._p2p_cache[key] = p2p_plan(size_bytes, ct, peer)
        return Plan("p2p", size_bytes, (src, dst), "p2p", pp.protocol, pp.n_channels, pp.latency_s, 0.0, None)

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

    def start_together(self, plans: list[Plan]) -> simpy.Event:
        """Start ``plans`` -- one collective and its symmetric mirrors, begun at the same instant --
        as ONE fluid activity over the union of their links (weights added per link); returns the
        completion event. All members then progress at the rate of the most loaded link among them,
        which is exact when the mirrors load their links alike (the symmetric case this is for) and
        cuts the number of activities by the number of mirrors. Plans that differ in work, latency or
        rate bound, and step fidelity, are started separately."""
        first = plans[0]
        if len(plans) == 1 or self.fidelity == "step":
            done = self.start(first)
            for p in plans[1:]:
                self.start(p)
            return done
        groups: dict[tuple, list[Plan]] = {}
        for p in plans:
            if p.algorithm == "none":
                continue
            groups.setdefault((self._work(p), p.latency_s, p.rate_bound_Bps), []).append(p)
        done = None
        for (work, lat, bound), members in groups.items():
            key = tuple((p.op, p.algorithm, p.protocol, p.gpus, p.root) for p in members)
            hit = self._merged_cache.get(key)
            if hit is None:
                weights: dict[Resource, float] = {}
                users: dict[Resource, int] = {}
                # HBM side loads only for the first plan: mirrors run on GPUs whose kernels are not
                # simulated, so their HBM traffic would load nothing anyone waits for.
                side = dict(self._flow(members[0])[2]) if members[0] is first else {}
                for p in members:
                    for r, x in self._flow(p)[1].items():
                        weights[r] = weights.get(r, 0.0) + x
                        users[r] = users.get(r, 0) + 1
                # A link only one mirror uses is, by symmetry, loaded exactly like its counterpart on
                # the representative's own path, so it adds no constraint: keep the representative's
                # links and the links several members share (leaf uplinks, spines).
                own = self._flow(members[0])[1]
                weights = {r: x for r, x in weights.items() if r in own or users[r] > 1}
                hit = self._merged_cache[key] = (weights, side)
            act = self.cluster.fs.start(work, hit[0], latency_s=lat, rate_bound=bound, side_loads=hit[1],
                                        name=first.name or first.op)
            if first in members:
                done = act.done
        return done if done is not None else self.start(first)

    def run(self, coll: Collective, gpus: Sequence[str]) -> simpy.Event:
        """Plan and start ``coll`` on ``gpus`` now (standalone use, e.g. nccl-tests)."""
        return self.start(self.plan(coll, tuple(gpus)))

    def flows(self, plan: Plan) -> list[Flow]:
        """The edges ``plan`` loads (cached): see the module docstring for each algorithm."""
        key = (plan.op, plan.algorithm, plan.gpus, plan.root)
        hit = self._flows_cache.get(key)
        if hit is None:
            hit = self._flows_cache[key] = self._edge_flows(plan)
        return hit

    # -- flow fidelity: one activity per collective --------------------------------------------
    def _work(self, plan: Plan) -> float:
        """Bytes each edge of weight 1 carries over the whole collective (progress units)."""
        n = len(plan.gpus)
        S = float(plan.size_bytes)
        op, algo = plan.op, plan.algorithm
        if op == "p2p":
            return S
        if op == "all_to_all":
            return S / n
        if algo == "ring":
            if op == "all_reduce":
                return S * 2 * (n - 1) / n
            if op in ("all_gather", "reduce_scatter"):
                return S * (n - 1) / n
            return S  # broadcast / reduce: the whole buffer flows along the chain, pipelined
        if algo == "nvls" and op in ("all_gather", "reduce_scatter"):
            return S * (n - 1) / n
        return S  # tree, nvls all-reduce: every edge carries the whole per-rank buffer (each way)

    def _flow(self, plan: Plan) -> tuple[float, dict[Resource, float], dict[Resource, float]]:
        """Work (payload bytes per member per edge) and link/HBM weights of a planned collective."""
        key = (plan.op, plan.algorithm, plan.protocol, plan.gpus, plan.root)
        hit = self._weights_cache.get(key)
        if hit is None:
            hit = self._weights_cache[key] = self._weights(plan)
        return self._work(plan), hit[0], hit[1]

    def _proto_weight(self, plan: Plan) -> float:
        return 1.0 / _tuner.PROTOCOL_EFFICIENCY[plan.protocol]

    def _weights(self, plan: Plan) -> tuple[dict[Resource, float], dict[Resource, float]]:
        proto_w = self._proto_weight(plan)
        per_byte: dict[Resource, float] = {}  # edge fractions summed per link first, then scaled
        for f in self.flows(plan):
            frac = f.frac
            for r in f.path:
                per_byte[r] = per_byte.get(r, 0.0) + frac
        weights = {r: w * proto_w / self._link_efficiency(r) for r, w in per_byte.items()}
        hbm = HBM_BYTES_PER_BYTE.get(plan.op, 2.0)
        side = {self.cluster.gpus[g].hbm: hbm for g in plan.gpus}
        return weights, side

    def _link_efficiency(self, r: Resource) -> float:
        eff = self._eff_cache.get(r)
        if eff is None:
            eff = self._eff_cache[r] = self._link_efficiency_uncached(r)
        return eff

    def _link_efficiency_uncached(self, r: Resource) -> float:
        kind = r.meta[3] if isinstance(r.meta, tuple) and len(r.meta) > 3 else ""
        if kind == "nvlink":
            return self.nvlink_efficiency
        if kind in ("ib", "net", "ethernet"):
            return _tuner.NET_APP_EFFICIENCY
        return 1.0

    def _path(self, a: str, b: str) -> tuple[Resource, ...]:
        return tuple(self.cluster.path(a, b)[0])

    def _rails(self, ppn: int) -> int:
        return max(1, min(ppn, self.cluster.topology.nics_per_node or 1))

    def _edge_flows(self, plan: Plan) -> list[Flow]:
        gpus = list(plan.gpus)
        n = len(gpus)
        op = plan.op
        P = self._path
        if op == "p2p":
            return [Flow(gpus[0], gpus[1], P(gpus[0], gpus[1]), 1.0)]
        if op == "all_to_all":
            return [Flow(a, b, P(a, b), 1.0) for a in gpus for b in gpus if a != b]
        by_node: dict[int, list[str]] = {}
        for g in gpus:
            by_node.setdefault(self._node_of[g], []).append(g)
        nodes = list(by_node)
        if plan.algorithm == "nvls":
            topo = self.cluster.topology
            up = 1.0 / (n - 1) if op == "all_gather" else 1.0
            down = 1.0 / (n - 1) if op == "reduce_scatter" else 1.0
            flows = []
            for g in gpus:
                sw = topo.nvswitch_of(g)
                flows.append(Flow(g, g, P(g, sw), up))
                flows.append(Flow(g, g, P(sw, g), down))
            return flows
        if plan.algorithm == "tree":
            return self._tree_flows(by_node, nodes)
        if plan.algorithm == "nvls_tree":
            return self._nvls_tree_flows(plan, by_node, nodes)
        # Ring (and ring-pipelined broadcast/reduce).
        chain = op in ("broadcast", "reduce")
        if len(nodes) == 1:
            order = _rotate(gpus, plan.root) if chain else gpus
            edges = [(order[i], order[(i + 1) % n]) for i in range(n - (1 if chain else 0))]
            return [Flow(a, b, P(a, b), 1.0) for a, b in edges]
        rails = self._rails(max(len(v) for v in by_node.values()))
        flows = []
        frac = 1.0 / rails
        for c in range(rails):
            for k, node in enumerate(nodes):
                local = _rotate(by_node[node], c)
                for i in range(len(local) - 1):
                    flows.append(Flow(local[i], local[i + 1], P(local[i], local[i + 1]), frac))
                if chain and k == len(nodes) - 1:
                    continue
                nxt = _rotate(by_node[nodes[(k + 1) % len(nodes)]], c)
                # PXN: the last GPU of the node's part hands over to the rail-c GPU over NVLink,
                # which sends through its own NIC.
                path = (P(local[-1], local[0]) if len(local) > 1 else ()) + P(local[0], nxt[0])
                flows.append(Flow(local[-1], nxt[0], path, frac))
        return flows

    def _tree_flows(self, by_node: dict[int, list[str]], nodes: list[int]) -> list[Flow]:
        P = self._path
        flows = []
        rails = self._rails(max(len(v) for v in by_node.values())) if len(nodes) > 1 else 1
        frac = 1.0 / rails
        trees = _double_binary_tree(len(nodes)) if len(nodes) > 1 else []
        for c in range(rails):
            heads = []
            for node in nodes:
                # Intra-node chain from the rail-c GPU, up and down (each direction carries it once).
                local = _rotate(by_node[node], c)
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

    def _nvls_heads(self, gpus: list[str]) -> list[str]:
        """One NVLS head per NIC among ``gpus`` (one node), in local order: the first GPU of the
        communicator on each NIC, as NCCL's NVLS search makes each NIC's local GPU a head."""
        topo = self.cluster.topology
        heads, seen = [], set()
        for g in sorted(gpus, key=topo.local_index):
            nic = topo.nic_of(g)
            if nic not in seen:
                seen.add(nic)
                heads.append(g)
        return heads

    def _nvls_tree_flows(self, plan: Plan, by_node: dict[int, list[str]], nodes: list[int]) -> list[Flow]:
        """NVLSTree edges (see the module docstring): NVLink up/down for every GPU, and per head index
        the two binary trees over the nodes' head GPUs, each edge carrying ``1/(2H)`` each way."""
        topo = self.cluster.topology
        P = self._path
        heads = [self._nvls_heads(by_node[node]) for node in nodes]
        n_heads = min(len(h) for h in heads)
        ct = self.comm_topology(plan.gpus)
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
            for tree in _double_binary_tree(len(nodes)):
                for child, parent in tree:
                    a, b = heads[child][h], heads[parent][h]
                    flows.append(Flow(a, b, P(a, b), 0.5 * share))
                    flows.append(Flow(b, a, P(b, a), 0.5 * share))
        return flows

    # -- step fidelity ---------------------------------------------------------------------------
    def n_steps(self, plan: Plan) -> int:
        """Synchronised steps of ``plan`` in step fidelity (see the module docstring)."""
        if plan.algorithm == "ring":
            return _tuner.ring_steps(plan.op, len(plan.gpus))
        return 1

    def _run_steps(self, plan: Plan):
        """Every algorithm step as a synchronised set of per-edge transfers (a barrier per step).

        Each step moves ``work / steps`` on every edge (times its fraction), each edge its own fluid
        activity bounded by the plan's per-edge rate, and pays ``latency / steps`` first. The edge's
        HBM traffic is a side load, half on the sender and half on the receiver.
        """
        env = self.env
        fs = self.cluster.fs
        steps = self.n_steps(plan)
        hop_lat = plan.latency_s / steps
        per_step = self._work(plan) / steps
        proto_w = self._proto_weight(plan)
        hbm = HBM_BYTES_PER_BYTE.get(plan.op, 2.0) / 2
        gpus = self.cluster.gpus
        edges = []
        for f in self.flows(plan):
            w: dict[Resource, float] = {}
            for r in f.path:
                w[r] = w.get(r, 0.0) + proto_w / self._link_efficiency(r)
            side = {gpus[f.src].hbm: hbm}
            side[gpus[f.dst].hbm] = side.get(gpus[f.dst].hbm, 0.0) + hbm
            bound = plan.rate_bound_Bps * f.frac if plan.rate_bound_Bps else None
            edges.append((per_step * f.frac, w, side, bound))
        name = f"{plan.name or plan.op}/step"
        for _ in range(steps):
            acts = [fs.start(work, w, latency_s=hop_lat, rate_bound=bound, side_loads=side, name=name)
                    for work, w, side, bound in edges]
            yield simpy.AllOf(env, [a.done for a in acts])
        return env.now


def simulate_nccl_tests(topology: Topology, collective: str, sizes: Iterable[int | str], *,
                        gpus_per_thread: int = 1, gpus: Sequence[str] | None = None, dtype: str = "float",
                        algorithm: str | None = None, protocol: str | None = None,
                        fidelity: str = "flow", tuner_config: TunerConfig | None = None,
                        ) -> list[_nt.NcclTestsRow]:
    """Emulate an nccl-tests sweep on the hardware model: one row per size, as nccl-tests prints it.

    Each size runs once on an otherwise idle cluster (``fidelity`` flow or step). The reported time is
    nccl-tests' time per iteration of back-to-back asynchronous launches, ``max(GPU time, host time)``:
    when one thread drives ``gpus_per_thread`` > 1 GPUs (``-g``), the host enqueues every collective on
    every GPU itself, costing ``G x (HOST_LAUNCH_PER_GPU_S + HOST_PER_CHANNEL_PER_GPU_S x nChannels)``
    per iteration, which bounds small sizes (see the constants; fitted to 8x A100 ``-g 8``). With one
    GPU per thread the host cost is hidden behind the GPU (NCCL's base latency already contains the
    launch) and not added. A single-rank communicator reports one kernel launch.

    Args:
        topology: the machine.
        gpus: the communicator's GPUs in rank order (default: every GPU of ``topology``).
        collective: nccl-tests binary or collective name (``all_reduce_perf``, ``allreduce``,
            ``all_reduce``, ``sendrecv`` ...).
        sizes: requested sizes (``-b`` .. ``-e``), bytes or nccl-tests size strings.
        gpus_per_thread: nccl-tests ``-g``.
        dtype: nccl-tests ``-d`` type name (float, half, bfloat16, ...).
        algorithm, protocol: force NCCL's choice (``NCCL_ALGO`` / ``NCCL_PROTO``).
        tuner_config: tuner-plugin rules (``NCCL_TUNER_CONFIG_FILE``), applied after ``algorithm`` /
            ``protocol`` restrict the enabled pairs.

    Returns:
        :class:`hwmodel.nccl.nccltests.NcclTestsRow` per size (SI units).

    Raises:
        ValueError: unknown collective or dtype, bad size, unknown or duplicate GPUs, or an algorithm the
            collective does not support.
    """
    coll = _nt.canonical_collective(collective)
    dt = _nt.nccltests_dtype(dtype)
    if gpus_per_thread < 1:
        raise ValueError(f"gpus_per_thread must be >= 1, got {gpus_per_thread}")
    gpus = tuple(topology.gpus() if gpus is None else gpus)
    n = len(gpus)
    if n < 1:
        raise ValueError("simulate_nccl_tests needs at least one GPU")
    cluster = Cluster(topology, record=False)
    eng = NcclEngine(cluster, fidelity=fidelity, algorithm=algorithm, protocol=protocol,
                     tuner_config=tuner_config)
    env = cluster.env
    rows = []
    for size in sizes:
        b = _nt.parse_size(size)
        s_bytes = _nt.nccltests_size_bytes(coll, b, dt, n)
        t0 = env.now
        if coll == "sendrecv":
            plans = [eng.plan_p2p(gpus[i], gpus[(i + 1) % n], s_bytes) for i in range(n)] if n > 1 else []
            done = simpy.AllOf(env, [eng.start(p) for p in plans])
            algo = "p2p"
            proto = plans[0].protocol if plans else "simple"
            nch = plans[0].n_channels if plans else 0
        else:
            plan = eng.plan(Collective(coll, s_bytes, tuple(range(n)), dtype=dt), gpus)
            done = eng.start(plan)
            algo, proto, nch = plan.algorithm, plan.protocol, plan.n_channels
        env.run(until=done)
        t = env.now - t0
        if gpus_per_thread > 1:
            t = max(t, gpus_per_thread * (HOST_LAUNCH_PER_GPU_S + HOST_PER_CHANNEL_PER_GPU_S * nch))
        if n == 1:
            t = max(t, HOST_LAUNCH_PER_GPU_S)
        rows.append(_nt.make_row(coll, b, t, n, dt, algorithm=algo, protocol=proto))
    return rows


CPU_VENDOR_BY_SYSTEM: dict[str, str] = {"dgx-a100": "amd", "dgx-a100-40gb": "amd", "dgx-h100": "intel",
                                         "hgx-h200": "intel", "dgx-b200": "intel"}
"""Host CPU vendor of the named systems (NCCL's ``llMaxBws`` row and ``getNetOverhead``): DGX A100 has
AMD EPYC 7742, DGX H100/H200/B200 Intel Xeon (NVIDIA DGX user guides). Other topologies: AMD, as the
topology carries no CPU vendor yet."""


def _cpu_vendor(topo) -> str:
    vendor = getattr(topo, "cpu_vendor", None)
    return vendor or CPU_VENDOR_BY_SYSTEM.get(topo.name, "amd")


def _nvswitch_generation(topo) -> int:
    """NVSwitch generation from the first ``nvswitch`` device's spec name (``NVSwitch-gen3`` -> 3);
    0 without NVSwitch. NVLS needs generation 3 (Hopper's NVLink SHARP)."""
    for sw in topo.nodes_of_kind("nvswitch"):
        spec = str(topo.graph.nodes[sw].get("spec", ""))
        digits = "".join(ch for ch in spec.rsplit("gen", 1)[-1] if ch.isdigit())
        return int(digits) if "gen" in spec and digits else 0
    return 0


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
    if algo == "nvls" and op in ("all_gather", "reduce_scatter"):
        return algbw_Bps * (n - 1) / n
    return algbw_Bps  # tree, nvls and nvls_tree all-reduce: progress is the per-rank buffer


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
    t1 = [(n - 1 - c, n - 1 - p) for c, p in t0] if n % 2 == 0 else [((c + 1) % n, (p + 1) % n) for c, p in t0]
    return [t0, t1]
