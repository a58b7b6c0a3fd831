"""Cluster topology: typed devices joined by directed links, with deterministic routing.

A :class:`Topology` wraps an ``nx.DiGraph``. Nodes carry ``kind``: ``gpu``, ``nvswitch``,
``pcie_switch``, ``nic``, ``cpu`` or ``ib_switch`` (with ``tier``: leaf, spine or core). Node-local devices
also carry ``node`` (node index) and ``index`` (index within the node); GPUs are named ``n{node}.gpu{i}``
and carry ``rank`` (global index, node-major) and ``nic`` (their GPUDirect-RDMA NIC). Edges are
DIRECTED links (a full-duplex link is two edges) with ``bandwidth_Bps`` (per direction), ``latency_s``
and ``kind`` (nvlink, pcie, ib). No protocol efficiency is applied here: the NCCL layer does that.

Modelling choices (see also ``docs/DESIGN.md``):

- **NVSwitch aggregation.** A node's NVSwitch chips (6 on DGX A100, 4 on DGX H100) are one
  non-blocking node ``n{i}.nvswitch`` (attribute ``count`` = chips). Each GPU<->NVSwitch edge carries
  all the GPU's links: 12 x 25 GB/s = 300 GB/s per direction on A100, 18 x 25 = 450 GB/s on H100
  (NVIDIA HGX A100/H100 blogs: every NVSwitch is non-blocking and connects all eight GPUs, so the
  aggregate is exact for the per-GPU limits). A GPU-to-GPU transfer crosses two edges.
- **PCIe tree.** GPUs and NICs hang off PCIe switches (DGX A100: 4 Gen4 switches, each with 2 GPUs and
  2 HDR NICs; servethehome.com), the switches off the CPUs. A GPU's compute NIC is ``nic_of`` (one per
  GPU, or GPUs sharing NICs in equal groups: ``gpus_per_node`` / ``nics_per_node``).
- **Fabric.** Rail-optimised (NIC *i* of every node -> leaf *i* of its scalable unit, as the DGX
  SuperPOD reference architectures), plain two-level fat tree, either with a core layer above pods of
  leaves (three tiers, ``leaves_per_pod``), or a single switch. The parallel cables between two
  switches are ONE edge with their summed bandwidth, and every leaf connects to every spine (of its
  pod), so the flow solver stays small.
- **Latency.** An edge leaving a switch pays its hop latency; a NIC<->switch edge half the NIC's (perftest #131).
- **Routing.** Deterministic shortest paths by routing cost (hops; a PCIe hop costs 1.5: NCCL's path
  order NVL < PIX). Among equal-cost next hops (ECMP) a stable CRC32 hash of (source, destination, current
  node) chooses, per NCCL sub-flow (:mod:`hwmodel.ecmp`). GPUs, NICs and CPUs never forward other nodes'
  traffic: GPU -> PCIe switch -> its own NIC -> fabric -> NIC -> PCIe switch -> GPU.

Builders, re-exported here: :mod:`hwmodel.node`, :mod:`hwmodel.fabric`, :mod:`hwmodel.systems`.
"""

from __future__ import annotations

import heapq
import math
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from itertools import repeat
from operator import and_, eq
from typing import Any

import networkx as nx

# Re-exported: the builders live in their own modules (they import Topology only where they build one).
from hwmodel.ecmp import ADAPTIVE, RouteElement, combine, subflow_hkey
from hwmodel.fabric import FABRICS, build_cluster, fat_tree, rail_optimized, single_switch
from hwmodel.node import NodeSpec, generic_node
from hwmodel.routing import ROUTE_COST, ClosRoutes, CostRows, NodeClasses
from hwmodel.servers import AttributeTable, Lookup, ServerTable, servers_of
from hwmodel.specs import GPUSpec, NICSpec
from hwmodel.systems import SystemSpec, build_system, dgx_a100, dgx_h100, get_system, known_systems, load_cluster_file
from hwmodel.topology_file import TopologyFile

Edge = tuple[str, str]

_LOCAL_TRANSIT = frozenset({"nvswitch", "pcie_switch", "cpu"})
_FABRIC_TRANSIT = frozenset({"ib_switch"})


# ----------------------------------------------------------------------------------------------------
# The topology


class Topology(TopologyFile):
    """A cluster: ``graph`` (nx.DiGraph of typed devices and directed links) plus the specs it uses.

    Args:
        graph: the devices and links (see the module docstring for the attributes).
        gpu_spec: the GPU model of every ``gpu`` node.
        nic_spec: the compute NIC model, or None for a cluster without NICs.
        node_copies: servers ``1 .. node_copies - 1`` are renamed copies of server 0 (``add_nodes``): their
            node classes need no signature; forgotten by :meth:`clear_route_cache` (``graph`` changed).
        fabric_routes: the fabric's router as its builder made it (:func:`hwmodel.fabric.build_cluster`):
            what :meth:`ClosRoutes.detect` would find, not read off every NIC again; forgotten by
            :meth:`clear_route_cache`. None: detected on first use.
        links_checked: every link was made by :func:`hwmodel.node.add_link`, which checks its bandwidth
            and latency: not checked again here (a 16,384-GPU cluster has 130,000 links).
    """

    def __init__(self, graph: nx.DiGraph, gpu_spec: GPUSpec, nic_spec: NICSpec | None = None, *,
                 node_copies: int = 0, fabric_routes: ClosRoutes | None = None, links_checked: bool = False) -> None:
        if not isinstance(graph, nx.DiGraph):
            raise TypeError(f"graph must be an nx.DiGraph, got {type(graph).__name__}")
        self.graph = graph
        """Devices (nodes) and directed links (edges)."""
        self.gpu_spec = gpu_spec
        """The GPUSpec of every GPU."""
        self.nic_spec = nic_spec
        """The compute NICSpec (None if the cluster has no NICs)."""
        # (networkx's plain node and successor dicts, in its iteration order: off its views, which cost
        # more than the checks on a 100,000-GPU cluster)
        node_data, adj = graph._node, graph._adj
        servers = self._on_demand = servers_of(graph)  # (servers made on demand: hwmodel.servers)
        for n, data in dict.items(node_data) if servers is not None else node_data.items():
            if "kind" not in data:
                raise ValueError(f"topology node {n!r} has no 'kind' attribute")
        for u, nbrs in () if links_checked else adj.items():
            for v, data in nbrs.items():  # (one test per link in the common case: a cluster has millions)
                if "bandwidth_Bps" in data and "latency_s" in data and data["bandwidth_Bps"] > 0 \
                        and data["latency_s"] >= 0:
                    continue
                for attr in ("bandwidth_Bps", "latency_s"):
                    if attr not in data:
                        raise ValueError(f"topology edge {u!r}->{v!r} has no {attr!r} attribute")
                raise ValueError(f"topology edge {u!r}->{v!r}: bandwidth_Bps must be > 0 and latency_s >= 0")
        gpus = [n for n, d in node_data.items() if d["kind"] == "gpu"] if servers is None else []
        for n in gpus:
            for attr in ("node", "index"):
                if node_data[n].get(attr) is None:
                    raise ValueError(f"GPU node {n!r} has no {attr!r} attribute")
        self._gpus: tuple[str, ...] = tuple(servers.gpu_names()) if servers is not None else tuple(  # (as sorted)
            sorted(gpus, key=lambda n: (node_data[n]["node"], node_data[n]["index"], n)))
        self._gpu_index = {g: i for i, g in enumerate(self._gpus)}
        self._routes: dict[Edge, tuple[Edge, ...]] = {}
        self._route_tables: tuple | None = None
        self._succ_costs: dict[str, dict[str, float]] | None = None
        self._nics_per_node: int | None = None
        self._segments: dict[tuple[str, str, Any], tuple[Edge, ...]] = {}
        self._dist: dict[tuple[str, Any], tuple[dict[str, float], dict[str, tuple[str, ...]]]] = {}
        self._clos: ClosRoutes | None | bool = False if fabric_routes is None else fabric_routes  # False: to detect
        self._node_classes: NodeClasses | None = None
        self._ends_up: dict[str, tuple[Any, str, tuple[Edge, ...]]] = {}
        """Device -> (its node, its exit NIC, the segment to it): see _remember_end."""
        self._ends_down: dict[str, tuple[Any, str, tuple[Edge, ...]]] = {}
        """Device -> (its node, its exit NIC, the segment from it to the device)."""
        self._private: dict[Any, bool] = {}
        self._private_nics: dict[int, tuple[tuple[str, str], ...] | None] = {}
        self._edge_offsets: Mapping[str, int] | None = None
        self._num_links = 0
        self._gpu_nodes: dict[str, int] | None = None
        self._gpu_nics: Mapping[str, str | None] | None = None
        self._link_rows: Mapping[str, dict[str, dict[str, Any]]] = adj if servers is None else Lookup(servers.row)
        self._by_kind: dict[str, list[str]] | None = None
        self._node_copies = node_copies
        self.route_by_construction = True
        """Route structured fabrics and alike nodes by construction (:mod:`hwmodel.routing`); False
        searches every route (the reference the constructed routes are tested against)."""

    # -- devices ------------------------------------------------------------------------------------

    def __repr__(self) -> str:
        return (f"Topology({self.graph.graph.get('name', 'custom')!r}, nodes={self.num_nodes}, "
                f"gpus={len(self._gpus)}, gpu={self.gpu_spec.name!r}, "
                f"fabric={self.graph.graph.get('fabric', '?')!r})")

    @property
    def name(self) -> str:
        """System name (e.g. ``dgx-a100``), or ``custom``."""
        return str(self.graph.graph.get("name", "custom"))

    def gpus(self) -> list[str]:
        """GPU node names, node-major (``n0.gpu0 ... n0.gpu7, n1.gpu0 ...``): index = global rank."""
        return list(self._gpus)

    @property
    def num_gpus(self) -> int:
        """Number of GPUs."""
        return len(self._gpus)

    def _check_gpu(self, gpu: str) -> dict[str, Any]:
        if gpu not in self._gpu_index:
            few = ", ".join(self._gpus[:4]) + (", ..." if len(self._gpus) > 4 else "")
            raise ValueError(f"unknown GPU {gpu!r}; GPUs are named like {few} ({len(self._gpus)} in all)")
        return self.graph.nodes[gpu]

    def gpu_indices(self) -> dict[str, int]:
        """GPU name -> its global index in :meth:`gpus` (the topology's own dict: treat it as read-only)."""
        return self._gpu_index

    def gpu_index(self, gpu: str) -> int:
        """Global index (rank) of ``gpu`` in :meth:`gpus`."""
        self._check_gpu(gpu)
        return self._gpu_index[gpu]

    def gpu_name(self, node: int, local: int) -> str:
        """Name of GPU ``local`` of node ``node``, e.g. ``gpu_name(1, 3) == "n1.gpu3"``."""
        name = f"n{node}.gpu{local}"
        self._check_gpu(name)
        return name

    def node_of(self, gpu: str) -> int:
        """Node index of ``gpu``."""
        node = self.gpu_nodes().get(gpu)
        return int(self._check_gpu(gpu)["node"]) if node is None else node

    def local_index(self, gpu: str) -> int:
        """Index of ``gpu`` within its node."""
        return int(self._check_gpu(gpu)["index"])

    def nic_of(self, gpu: str) -> str:
        """The compute NIC ``gpu`` uses for GPUDirect RDMA (same PCIe switch on DGX systems)."""
        nic = self._check_gpu(gpu).get("nic")
        if nic is None:
            raise ValueError(f"GPU {gpu!r} has no NIC in this topology")
        return str(nic)

    def gpu_nics(self) -> Mapping[str, str | None]:
        """GPU -> its ``nic`` attribute (None: none; KeyError: not a GPU), read on first use, no server made."""
        if self._gpu_nics is None:
            self._gpu_nics = Lookup(self._on_demand.gpu_nic if self._on_demand is not None else self._nic_attr)
        return self._gpu_nics

    def _nic_attr(self, gpu: str) -> str | None:
        self._gpu_index[gpu]  # (KeyError: not a GPU)
        return self.graph._node[gpu].get("nic")

    def pcie_switch_of(self, gpu: str) -> str:
        """The PCIe switch ``gpu`` hangs off."""
        self._check_gpu(gpu)
        for v in self.graph.successors(gpu):
            if self.graph.nodes[v]["kind"] == "pcie_switch":
                return v
        raise ValueError(f"GPU {gpu!r} has no PCIe switch in this topology")

    def host_of(self, gpu: str) -> str:
        """The CPU (host socket) above ``gpu``'s PCIe switch."""
        sw = self.pcie_switch_of(gpu)
        for v in self.graph.successors(sw):
            if self.graph.nodes[v]["kind"] == "cpu":
                return v
        raise ValueError(f"GPU {gpu!r} has no host CPU in this topology")

    def gpus_of_node(self, node: int) -> list[str]:
        """GPU names of node ``node``, in local order."""
        return [g for g, n in self.gpu_nodes().items() if n == node]  # (off networkx's views: one per GPU)

    @property
    def num_nodes(self) -> int:
        """Number of nodes (servers) holding GPUs."""
        return len(set(self.gpu_nodes().values()))

    @property
    def gpus_per_node(self) -> int:
        """GPUs per node; ValueError if nodes differ."""
        counts: dict[int, int] = {}
        for node in self.gpu_nodes().values():
            counts[node] = counts.get(node, 0) + 1
        sizes = set(counts.values())
        if len(sizes) > 1:
            raise ValueError(f"nodes have different GPU counts: {sorted(sizes)}")
        return sizes.pop() if sizes else 0

    @property
    def nics_per_node(self) -> int:
        """Compute NICs per node (0 for a single node without a fabric)."""
        if self._nics_per_node is None and self._on_demand is not None:  # (the first GPU's: server 0's)
            self._nics_per_node = len(self._on_demand.nics) if self._gpus else 0
        if self._nics_per_node is None:  # (the NICs of the first GPU's node, by C-level scans of the tables)
            kinds, nodes, _ = self._tables()
            node = self.graph.nodes[self._gpus[0]]["node"] if self._gpus else None
            self._nics_per_node = sum(map(and_, map(eq, kinds.values(), repeat("nic")),
                                          map(eq, nodes.values(), repeat(node)))) if self._gpus else 0
        return self._nics_per_node

    def nvswitch_of(self, gpu: str) -> str:
        """The (aggregated) NVSwitch ``gpu`` connects to; ValueError if it has none."""
        self._check_gpu(gpu)
        for nbr in self.graph.successors(gpu):
            if self.graph.nodes[nbr]["kind"] == "nvswitch":
                return nbr
        raise ValueError(f"GPU {gpu!r} is not connected to an NVSwitch")

    def nodes_of_kind(self, kind: str, **attrs: Any) -> list[str]:
        """Names of devices of ``kind`` (e.g. ``ib_switch``) whose attributes match ``attrs``."""
        node_data = self.graph._node
        if self._by_kind is None and self._on_demand is not None:  # (names by arithmetic: no server made)
            self._by_kind = self._on_demand.names_by_kind()
        if self._by_kind is None:  # (built once, of names: a (name, attributes) pair stays tracked by the gc)
            self._by_kind = {}
            for n, d in node_data.items():
                self._by_kind.setdefault(d["kind"], []).append(n)
        names = self._by_kind.get(kind, [])
        names.sort()  # (in place: sorted once, then a linear check; a cluster has thousands of each kind)
        for k, v in attrs.items():  # (one filter per attribute: no generator per device)
            names = [n for n in names if node_data[n].get(k) == v]
        return list(names)

    def edge_offsets(self) -> Mapping[str, int]:
        """Device -> position of its first out-going link in ``graph.edges()`` order (cached), so that a
        link's position is ``offset[u]`` + its place among ``u``'s successors without listing all links
        (servers made on demand: by arithmetic, :meth:`ServerTable.edge_offsets`)."""
        if self._edge_offsets is None and self._on_demand is not None:
            self._edge_offsets, self._num_links = self._on_demand.edge_offsets()
        if self._edge_offsets is None:
            total = 0
            self._edge_offsets = {}
            for u, nbrs in self.graph._adj.items():  # (networkx's plain successor dicts: off its views)
                self._edge_offsets[u] = total
                total += len(nbrs)
            self._num_links = total
        return self._edge_offsets

    def num_links(self) -> int:
        """Number of directed links (``graph.number_of_edges()``, counted once with :meth:`edge_offsets`:
        networkx counts them by summing every device's degree on each call)."""
        self.edge_offsets()
        return self._num_links

    def gpu_nodes(self) -> dict[str, int]:
        """GPU name -> its node index, for every GPU (built once; treat it as read-only)."""
        if self._gpu_nodes is None and self._on_demand is not None:
            self._gpu_nodes = self._on_demand.gpu_nodes()
        if self._gpu_nodes is None:
            nodes = self.graph._node
            self._gpu_nodes = {g: int(nodes[g]["node"]) for g in self._gpus}
        return self._gpu_nodes

    def link_rows(self) -> Mapping[str, dict[str, dict[str, Any]]]:
        """Device -> {successor: link attributes} in the graph's order, to read, not change: the graph's
        successor dicts, where no server made on demand is made for a read (:meth:`ServerTable.row`)."""
        return self._link_rows

    def link_data(self, u: str, v: str) -> dict[str, Any]:
        """Attributes of the directed link ``u -> v`` to read (KeyError if absent): :meth:`link_rows`."""
        return self._link_rows[u][v]

    def link(self, u: str, v: str) -> dict[str, Any]:
        """Attributes of the directed link ``u -> v`` (KeyError naming it if absent)."""
        try:
            return self.graph.edges[u, v]
        except KeyError:
            raise KeyError(f"no link {u!r} -> {v!r}") from None

    # -- routing ------------------------------------------------------------------------------------

    def route(self, src: str, dst: str) -> list[Edge]:
        """Directed edges from ``src`` to ``dst`` (empty if equal). Deterministic; cached.

        GPU to GPU in one node: through the NVSwitch (or PCIe when there is no NVLink). Across nodes:
        GPU -> PCIe switch -> ``nic_of(src)`` -> leaf (-> spine -> leaf) -> ``nic_of(dst)`` -> PCIe
        switch -> GPU. ECMP ties are broken by CRC32 of (src, dst, hop). Raises ValueError naming both
        endpoints when there is no route, or naming an unknown endpoint.
        """
        key = (src, dst)
        hit = self._routes.get(key)
        if hit is None:
            hit = self._routes[key] = tuple(self._compute_route(src, dst))
        return list(hit)

    def device_kinds(self) -> dict[str, str]:
        """Device -> its kind (``gpu``, ``nic``, ``ib_switch``, ...), as a plain dict (built once)."""
        return self._tables()[0]

    def device_nodes(self) -> dict[str, Any]:
        """Device -> its node index (None for a fabric device), as :meth:`device_kinds` (built once)."""
        return self._tables()[1]

    def route_edges(self, src: str, dst: str) -> tuple[Edge, ...]:
        """:meth:`route` as a tuple, from the cache when there, else computed and NOT cached: for the
        routes of symmetric mirrors, asked once each, whose cache would grow with the cluster."""
        hit = self._routes.get((src, dst))
        return hit if hit is not None else tuple(self._compute_route(src, dst))

    def route_spread(self, src: str, dst: str, subflows: int) -> tuple[RouteElement, ...]:
        """:meth:`route_edges` of traffic crossing the fabric as ``subflows`` sub-flows hashed each on its
        own (:mod:`hwmodel.ecmp`; or adaptive routing's even spread), their parting hops one Spread. Not cached."""
        if 0 <= subflows <= 1:
            return self.route_edges(src, dst)
        return tuple(self._compute_route(src, dst, subflows))

    def path_latency_s(self, route: Sequence[Edge]) -> float:
        """Sum of the links' latencies along ``route`` (s)."""
        return sum(self.link_data(u, v)["latency_s"] for u, v in route)

    def bottleneck_Bps(self, route: Sequence[Edge]) -> float:
        """Smallest link bandwidth along ``route`` (bytes/s per direction); ``inf`` for an empty route."""
        data = self.link_data
        return min((data(u, v)["bandwidth_Bps"] for u, v in route), default=math.inf)

    def _check_node(self, n: str) -> dict[str, Any]:
        data = self.graph._node.get(n)  # (networkx's plain node dict: off its views, once per route end)
        if data is not None:
            return data
        if n not in self.graph:
            if isinstance(n, str) and ".gpu" in n:
                self._check_gpu(n)
            raise ValueError(f"unknown device {n!r} in topology {self.name!r}")
        return self.graph.nodes[n]

    def _compute_route(self, src: str, dst: str, subflows: int = 1) -> list[Any] | tuple[Any, ...]:
        up = self._ends_up.get(src)
        if up is not None:  # two nodes' known end segments and the fabric's constructed hops
            down = self._ends_down.get(dst)
            clos = self._clos
            if down is not None and up[0] != down[0] and self.route_by_construction \
                    and isinstance(clos, ClosRoutes):
                fabric = clos.spread_between(up[1], down[1], src, dst, subflows)
                if fabric is not None:
                    return up[2] + fabric + down[2]
        nodes = self._tables()[1]  # (a device's node: a server's made on demand is not made for it)
        if src not in nodes:
            self._check_node(src)
        if dst not in nodes:
            self._check_node(dst)
        if src == dst:
            return []
        hkey = f"{src}|{dst}"
        s_node, d_node = nodes[src], nodes[dst]
        try:
            if s_node is not None and s_node == d_node:
                return self._local(src, dst, s_node, hkey)
            out: list[Any] = []
            a = src
            if s_node is not None:
                a = self._exit_nic(src)
                out += self._local(src, a, s_node, hkey)
                self._remember_end(src, a, s_node, True)
            b = dst if d_node is None else self._exit_nic(dst)
            clos = self.constructed_fabric() if subflows == ADAPTIVE and a != b else None
            if clos is not None:  # (adaptive routing: a built fabric, ecmp.check_adaptive_routing)
                out += clos.adaptive_between(a, b) or self._fabric(a, b, hkey)
            elif subflows > 1 and a != b:  # (sub-flow j's key as ClosRoutes.spread_between hashes it)
                out += combine([self._fabric(a, b, subflow_hkey(src, dst, j)) for j in range(subflows)])
            else:
                out += self._fabric(a, b, hkey)
            if d_node is not None:
                out += self._local(b, dst, d_node, hkey)
                self._remember_end(dst, b, d_node, False)
            return out
        except _NoPath as exc:
            raise ValueError(f"no route from {src!r} to {dst!r} ({exc})") from None

    def _remember_end(self, device: str, nic: str, node: Any, leaving: bool) -> None:
        """Keep ``device``'s segment to (``leaving``) or from its exit ``nic`` once it is known not to
        depend on the route's hash (constructed without an ECMP choice: :meth:`NodeClasses.named`),
        with its node: the route between two nodes' known ends is then these segments and the fabric's.
        O(devices) entries, as the named segments."""
        ends = self._ends_up if leaving else self._ends_down
        if device in ends or self._node_classes is None:
            return
        seg = () if nic == device else self._node_classes.named(*((device, nic) if leaving else (nic, device)))
        if seg is not None:
            ends[device] = (node, nic, seg)

    def _clos_route(self, a: str, b: str, hkey: str) -> tuple[Edge, ...] | None:
        """The constructed fabric segment between NICs ``a`` and ``b`` (None: not a constructed fabric,
        or ``a == b``, or ends it does not know: the caller searches)."""
        clos = self._clos
        if a == b or not self.route_by_construction or clos is None or isinstance(clos, bool):
            return None
        edges = clos.route(a, b, hkey)
        return None if edges is None else tuple(edges)

    def _local(self, src: str, dst: str, node: Any, hkey: str) -> list[Edge]:
        """Segment inside ``node``: searched once per class of alike nodes where both ends are in it."""
        if src == dst:
            return []
        classes = self._node_classes
        # a segment already constructed: a GPU's to its NIC recurs in the route of every mirror it ends
        if classes is not None and self.route_by_construction:
            named = classes.named(src, dst)
            if named is not None:
                return list(named)
        nodes = self._tables()[1]
        if not self.route_by_construction or nodes.get(src) != node or nodes.get(dst) != node:
            return self._path(src, dst, ("node", node), hkey)
        return self._classes().segment(src, dst, node, lambda s, d, n: self._search(s, d, ("node", n), hkey))

    def _classes(self) -> NodeClasses:
        if self._node_classes is None:
            kinds, nodes, _ = self._tables()
            self._node_classes = NodeClasses(kinds, nodes, self._succ_cost(), self.graph._succ, self._node_copies,
                                             None if self._on_demand is None else self._on_demand.first_devices())
        return self._node_classes

    def constructed_fabric(self) -> ClosRoutes | None:
        """The fabric's router by construction (:class:`ClosRoutes`: its :meth:`ClosRoutes.route_between`
        is the fabric part of :meth:`route` between two nodes' NICs), or None where the fabric is
        searched (another shape, or :attr:`route_by_construction` off)."""
        if not self.route_by_construction:
            return None
        if self._clos is False:
            kinds, _, pred_cost = self._tables()
            self._clos = ClosRoutes.detect(kinds, self._succ_cost(), pred_cost)
        return None if isinstance(self._clos, bool) else self._clos

    def private_ends(self, node: Any) -> bool:
        """Whether the node-local ends of ``node``'s routes to other nodes are *private*: every GPU of
        ``node`` reaches its NIC (``nic_of``), and is reached from it, over a segment without an ECMP
        choice, and all these segments together cross each link at most once. Then the routes between
        nodes that end at distinct GPUs of ``node`` share no link inside it, whatever their number. Decided
        once per class of alike nodes (:class:`NodeClasses`: the class's first node is searched) and, per
        node, that its GPUs use the same NICs as there; False where routes are not constructed."""
        hit = self._private.get(node)
        if hit is None:
            hit = self._private[node] = self.route_by_construction and self._private_ends(node)
        return hit

    def end_segment(self, gpu: str, leaving: bool) -> tuple[Edge, ...]:
        """The segment of :meth:`route` from ``gpu`` to its NIC (``leaving``) or from its NIC to it, for a
        GPU of a node whose ends are private (:meth:`private_ends`): a route between GPUs of two such
        nodes is the source's segment, the fabric's (:meth:`constructed_fabric`) and the destination's."""
        ends = self._ends_up if leaving else self._ends_down
        hit = ends.get(gpu)
        if hit is not None:
            return hit[2]
        node, nic = self._tables()[1][gpu], self._exit_nic(gpu)
        seg = tuple(self._local(gpu, nic, node, "") if leaving else self._local(nic, gpu, node, ""))
        self._remember_end(gpu, nic, node, leaving)
        return seg

    def _private_ends(self, node: Any) -> bool:
        cls = self._classes().class_of(node)
        if cls is None:
            return False
        cid, rep = cls
        if cid not in self._private_nics:  # the class's first node: its GPUs' NICs, if its ends are private
            self._private_nics[cid] = self._private_nics_of(rep)
        nics = self._private_nics[cid]
        if nics is None:
            return False
        if self._on_demand is not None and self._on_demand.copy_of_0(node):  # (its GPUs' NICs: its class's)
            return True
        p, node_data = f"n{node}.", self.graph._node
        return all(node_data[p + g].get("nic") == p + nic for g, nic in nics)

    def _private_nics_of(self, node: Any) -> tuple[tuple[str, str], ...] | None:
        """(GPU, its NIC) of ``node`` by local name when its ends are private (:meth:`private_ends`)."""
        p, node_data, nodes = f"n{node}.", self.graph._node, self._tables()[1]
        out, edges = [], []
        for g in self.gpus_of_node(node):
            nic = node_data[g].get("nic")
            if nic is None or not g.startswith(p) or not str(nic).startswith(p) or nodes.get(nic) != node:
                return None
            try:
                up, up_unique = self._search(g, nic, ("node", node), "")
                down, down_unique = self._search(nic, g, ("node", node), "")
            except _NoPath:
                return None
            if not (up_unique and down_unique):
                return None
            edges += up + down
            out.append((g[len(p):], str(nic)[len(p):]))
        return tuple(out) if out and len(set(edges)) == len(edges) else None

    def _fabric(self, a: str, b: str, hkey: str) -> list[Edge]:
        """Segment between two fabric endpoints: constructed on a two-level Clos, else searched."""
        if a == b:
            return []
        clos = self.constructed_fabric()
        if clos is not None:
            edges = clos.route(a, b, hkey)
            if edges is not None:
                return edges
        return self._path(a, b, ("fabric",), hkey)

    def _succ_cost(self) -> dict[str, dict[str, float]]:
        """device -> {successor: routing cost} (built once, each device's on first use; read-only)."""
        if self._succ_costs is None:
            self._succ_costs = CostRows(self.graph._succ)
        return self._succ_costs

    def _exit_nic(self, n: str) -> str:
        """The NIC node-local device ``n`` uses to leave its node."""
        kind = self._tables()[0][n]
        if kind == "nic":
            return n
        if kind == "gpu":  # (its NIC attribute, its server not made: gpu_nics)
            nic = self.gpu_nics()[n]
            if nic is None:
                raise _NoPath(f"GPU {n!r} has no NIC")
            return str(nic)
        data = self.graph._node[n]
        nics = [m for m, d in self.graph.nodes(data=True)
                if d["kind"] == "nic" and d.get("node") == data["node"]]
        if not nics:
            raise _NoPath(f"node {data['node']} has no NIC")
        return min(nics, key=lambda m: (self._dist_to(m, ("node", data["node"])).get(n, math.inf), m))

    def _tables(self) -> tuple[dict[str, str], dict[str, Any], dict[str, dict[str, float]]]:
        """(device -> kind, device -> node index, device -> {predecessor: routing cost}), built once:
        plain dicts keep the Dijkstra loops off networkx's views. A device's routing costs are read from
        the graph when first asked (:class:`CostRows`): constructed routes ask few devices."""
        servers = self._on_demand
        if self._route_tables is None and servers is not None:  # (a server device's from its name)
            self._route_tables = (AttributeTable(servers, "kind"), AttributeTable(servers, "node"),
                                  CostRows(self.graph._pred))
        if self._route_tables is None:
            node_data = self.graph._node  # (networkx's plain dicts, in its order: off its views)
            kinds = {n: d["kind"] for n, d in node_data.items()}
            nodes = {n: d.get("node") for n, d in node_data.items()}
            self._route_tables = (kinds, nodes, CostRows(self.graph._pred))
        return self._route_tables

    def _allowed(self, scope: tuple[Any, ...]) -> Callable[[str], bool]:
        kinds, nodes, _ = self._tables()
        if scope[0] == "fabric":
            return lambda n: kinds[n] in _FABRIC_TRANSIT
        k = scope[1]
        return lambda n: kinds[n] in _LOCAL_TRANSIT and nodes[n] == k

    def _cost(self, u: str, v: str) -> float:
        return self._tables()[2][v][u]

    def _dist_to(self, dst: str, scope: tuple[Any, ...]) -> dict[str, float]:
        """Routing cost to ``dst`` from every device that can reach it through ``scope``'s transit
        devices (reverse Dijkstra; non-transit devices are reached but not expanded). Cached."""
        return self._sssp(dst, scope)[0]

    def _sssp(self, dst: str, scope: tuple[Any, ...]) -> tuple[dict[str, float], dict[str, tuple[str, ...]]]:
        key = (dst, scope)
        hit = self._dist.get(key)
        if hit is not None:
            return hit
        allowed = self._allowed(scope)
        dist = {dst: 0.0}
        heap = [(0.0, dst)]
        pred_cost = self._tables()[2]
        while heap:
            d, v = heapq.heappop(heap)
            if d > dist[v] or (v != dst and not allowed(v)):
                continue
            for u, c in pred_cost[v].items():
                nd = d + c
                if nd < dist.get(u, math.inf) - 1e-12:
                    dist[u] = nd
                    if allowed(u):  # non-transit devices are reached, never expanded: keep them off the heap
                        heapq.heappush(heap, (nd, u))
        hit = self._dist[key] = (dist, {})
        return hit

    def _path(self, src: str, dst: str, scope: tuple[Any, ...], hkey: str) -> list[Edge]:
        return self._search(src, dst, scope, hkey)[0]

    def _search(self, src: str, dst: str, scope: tuple[Any, ...], hkey: str) -> tuple[list[Edge], bool]:
        """Shortest path ``src -> dst`` through ``scope``'s transit devices and whether it had no ECMP
        choice (then it does not depend on ``hkey``)."""
        if src == dst:
            return [], True
        seg = self._segments.get((src, dst, scope))
        if seg is not None:  # a segment without ECMP choices does not depend on hkey
            return list(seg), True
        dist, nexthops = self._sssp(dst, scope)
        if src not in dist:
            raise _NoPath(f"{dst!r} is not reachable from {src!r} within {scope[0]}")
        allowed = self._allowed(scope)
        out: list[Edge] = []
        u = src
        unique = True
        while u != dst:
            cands = nexthops.get(u)
            if cands is None:  # equal-cost next hops towards dst, sorted (computed once per (u, dst))
                du = dist[u]
                cands = nexthops[u] = tuple(sorted(
                    v for v in self.graph.succ[u]
                    if v in dist and (v == dst or allowed(v))
                    and abs(dist[v] + self._cost(u, v) - du) < 1e-9))
            if len(cands) == 1:
                v = cands[0]
            else:
                unique = False
                v = cands[zlib.crc32(f"{hkey}|{u}".encode()) % len(cands)]
            out.append((u, v))
            u = v
        if unique:
            self._segments[(src, dst, scope)] = tuple(out)
        return out, unique

    def clear_route_cache(self) -> None:
        """Forget cached routes (and make every server made on demand); call after changing :attr:`graph`."""
        if isinstance(getattr(self.graph, "on_demand", None), ServerTable):
            self.graph.on_demand.complete()
        self._on_demand = None
        self._link_rows = self.graph._adj
        self._routes.clear()
        self._dist.clear()
        self._segments.clear()
        self._route_tables = None
        self._succ_costs = None
        self._clos = False
        self._node_classes = None
        self._node_copies = 0
        self._private.clear()
        self._private_nics.clear()
        self._ends_up.clear()
        self._ends_down.clear()
        self._edge_offsets = None
        self._gpu_nodes = None
        self._by_kind = None
        self._gpu_nics = None


class _NoPath(Exception):
    pass


def iter_links(topo: Topology, kind: str | None = None) -> Iterable[tuple[str, str, dict[str, Any]]]:
    """Directed links ``(u, v, attrs)`` of ``topo``, optionally only one ``kind`` (nvlink, pcie, ib)."""
    for u, v, d in topo.graph.edges(data=True):
        if kind is None or d.get("kind") == kind:
            yield u, v, d


__all__ = [
    "FABRICS", "ROUTE_COST", "Edge", "NodeSpec", "SystemSpec", "Topology", "build_cluster", "build_system",
    "dgx_a100", "dgx_h100", "fat_tree", "generic_node", "get_system", "iter_links", "known_systems",
    "load_cluster_file", "rail_optimized", "single_switch",
]
