"""Cluster topology: typed devices joined by directed links, with deterministic routing.

A :class:`Topology` wraps an ``nx.DiGraph``. Nodes carry ``kind``: ``gpu``, ``nvswitch``,
``pcie_switch``, ``nic``, ``cpu`` or ``ib_switch`` (with ``tier``: leaf or spine). Node-local devices
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
  2 HDR NICs; servethehome.com), the switches off the CPUs. One compute NIC per GPU (``nic_of``).
- **Fabric.** Rail-optimised (NIC *i* of every node -> leaf *i* of its scalable unit, as the DGX
  SuperPOD reference architectures), plain two-level fat tree, or a single switch. The parallel cables
  between a leaf and a spine are ONE edge with their summed bandwidth, and every leaf connects to every
  spine, so the flow solver stays small.
- **Latency.** An edge leaving a switch pays that switch's hop latency; each NIC<->fabric-switch edge
  pays half the NIC's base latency (~1 us NIC to NIC, perftest issue 131).
- **Routing.** Deterministic shortest paths by routing cost (hops; a PCIe hop costs 1.5 so that an
  NVLink path beats an equally short PCIe path, as NCCL's path order NVL < PIX). Among equal-cost next
  hops (ECMP) the choice is a stable CRC32 hash of (source, destination, current node). GPUs,
  NICs and CPUs never forward other nodes' traffic; inter-node GPU traffic goes GPU -> PCIe switch ->
  its own NIC -> fabric -> NIC -> PCIe switch -> GPU.
"""

from __future__ import annotations

import heapq
import json
import math
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import networkx as nx

from hwmodel.specs import (
    GPUSpec,
    NICSpec,
    SwitchSpec,
    UnknownNameError,
    get_gpu,
    get_nic,
    get_pcie_switch,
    get_switch,
    known_switches,
    load_gpu_file,
    pcie_link_bandwidth_Bps,
)

try:  # Python >= 3.11
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

Edge = tuple[str, str]

FABRICS: tuple[str, ...] = ("rail_optimized", "fat_tree", "single_switch", "none")
"""Multi-node fabric kinds :func:`build_cluster` understands."""

ROUTE_COST: dict[str, float] = {"pcie": 1.5}
"""Routing cost per edge ``kind`` (default 1 per hop); an edge attribute ``route_cost`` overrides."""

_LOCAL_TRANSIT = frozenset({"nvswitch", "pcie_switch", "cpu"})
_FABRIC_TRANSIT = frozenset({"ib_switch"})
_FORMAT = "trainsim-topology"


# ----------------------------------------------------------------------------------------------------
# The topology


class Topology:
    """A cluster: ``graph`` (nx.DiGraph of typed devices and directed links) plus the specs it uses.

    Args:
        graph: the devices and links (see the module docstring for the attributes).
        gpu_spec: the GPU model of every ``gpu`` node.
        nic_spec: the compute NIC model, or None for a cluster without NICs.
    """

    def __init__(self, graph: nx.DiGraph, gpu_spec: GPUSpec, nic_spec: NICSpec | None = None) -> None:
        if not isinstance(graph, nx.DiGraph):
            raise TypeError(f"graph must be an nx.DiGraph, got {type(graph).__name__}")
        self.graph = graph
        """Devices (nodes) and directed links (edges)."""
        self.gpu_spec = gpu_spec
        """The GPUSpec of every GPU."""
        self.nic_spec = nic_spec
        """The compute NICSpec (None if the cluster has no NICs)."""
        for n, data in graph.nodes(data=True):
            if "kind" not in data:
                raise ValueError(f"topology node {n!r} has no 'kind' attribute")
        for u, v, data in graph.edges(data=True):
            for attr in ("bandwidth_Bps", "latency_s"):
                if attr not in data:
                    raise ValueError(f"topology edge {u!r}->{v!r} has no {attr!r} attribute")
            if not data["bandwidth_Bps"] > 0 or not data["latency_s"] >= 0:
                raise ValueError(f"topology edge {u!r}->{v!r}: bandwidth_Bps must be > 0 and latency_s >= 0")
        gpus = [n for n, d in graph.nodes(data=True) if d["kind"] == "gpu"]
        for n in gpus:
            for attr in ("node", "index"):
                if graph.nodes[n].get(attr) is None:
                    raise ValueError(f"GPU node {n!r} has no {attr!r} attribute")
        self._gpus: tuple[str, ...] = tuple(
            sorted(gpus, key=lambda n: (graph.nodes[n]["node"], graph.nodes[n]["index"], n)))
        self._gpu_index = {g: i for i, g in enumerate(self._gpus)}
        self._routes: dict[Edge, tuple[Edge, ...]] = {}
        self._route_tables: tuple | None = None
        self._nics_per_node: int | None = None
        self._segments: dict[tuple[str, str, Any], tuple[Edge, ...]] = {}
        self._dist: dict[tuple[str, Any], tuple[dict[str, float], dict[str, tuple[str, ...]]]] = {}

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
        return int(self._check_gpu(gpu)["node"])

    def local_index(self, gpu: str) -> int:
        """Index of ``gpu`` within its node."""
        return int(self._check_gpu(gpu)["index"])

    def nic_of(self, gpu: str) -> str:
        """The compute NIC ``gpu`` uses for GPUDirect RDMA (same PCIe switch on DGX systems)."""
        nic = self._check_gpu(gpu).get("nic")
        if nic is None:
            raise ValueError(f"GPU {gpu!r} has no NIC in this topology")
        return str(nic)

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
        return [g for g in self._gpus if self.graph.nodes[g]["node"] == node]

    @property
    def num_nodes(self) -> int:
        """Number of nodes (servers) holding GPUs."""
        return len({self.graph.nodes[g]["node"] for g in self._gpus})

    @property
    def gpus_per_node(self) -> int:
        """GPUs per node; ValueError if nodes differ."""
        counts: dict[int, int] = {}
        for g in self._gpus:
            counts[self.graph.nodes[g]["node"]] = counts.get(self.graph.nodes[g]["node"], 0) + 1
        sizes = set(counts.values())
        if len(sizes) > 1:
            raise ValueError(f"nodes have different GPU counts: {sorted(sizes)}")
        return sizes.pop() if sizes else 0

    @property
    def nics_per_node(self) -> int:
        """Compute NICs per node (0 for a single node without a fabric)."""
        if self._nics_per_node is None:
            node = self.graph.nodes[self._gpus[0]]["node"] if self._gpus else None
            self._nics_per_node = len(self.nodes_of_kind("nic", node=node)) if self._gpus else 0
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
        return sorted(n for n, d in self.graph.nodes(data=True)
                      if d["kind"] == kind and all(d.get(k) == v for k, v in attrs.items()))

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

    def path_latency_s(self, route: Sequence[Edge]) -> float:
        """Sum of the links' latencies along ``route`` (s)."""
        edges = self.graph.edges
        return sum(edges[u, v]["latency_s"] for u, v in route)

    def bottleneck_Bps(self, route: Sequence[Edge]) -> float:
        """Smallest link bandwidth along ``route`` (bytes/s per direction); ``inf`` for an empty route."""
        edges = self.graph.edges
        return min((edges[u, v]["bandwidth_Bps"] for u, v in route), default=math.inf)

    def _check_node(self, n: str) -> dict[str, Any]:
        if n not in self.graph:
            if isinstance(n, str) and ".gpu" in n:
                self._check_gpu(n)
            raise ValueError(f"unknown device {n!r} in topology {self.name!r}")
        return self.graph.nodes[n]

    def _compute_route(self, src: str, dst: str) -> list[Edge]:
        sd, dd = self._check_node(src), self._check_node(dst)
        if src == dst:
            return []
        hkey = f"{src}|{dst}"
        s_node, d_node = sd.get("node"), dd.get("node")
        try:
            if s_node is not None and s_node == d_node:
                return self._path(src, dst, ("node", s_node), hkey)
            out: list[Edge] = []
            a = src
            if s_node is not None:
                a = self._exit_nic(src)
                out += self._path(src, a, ("node", s_node), hkey)
            b = dst
            if d_node is not None:
                b = self._exit_nic(dst)
            out += self._path(a, b, ("fabric",), hkey)
            if d_node is not None:
                out += self._path(b, dst, ("node", d_node), hkey)
            return out
        except _NoPath as exc:
            raise ValueError(f"no route from {src!r} to {dst!r} ({exc})") from None

    def _exit_nic(self, n: str) -> str:
        """The NIC node-local device ``n`` uses to leave its node."""
        data = self.graph.nodes[n]
        if data["kind"] == "nic":
            return n
        if data["kind"] == "gpu":
            if data.get("nic") is None:
                raise _NoPath(f"GPU {n!r} has no NIC")
            return str(data["nic"])
        nics = [m for m, d in self.graph.nodes(data=True)
                if d["kind"] == "nic" and d.get("node") == data["node"]]
        if not nics:
            raise _NoPath(f"node {data['node']} has no NIC")
        return min(nics, key=lambda m: (self._dist_to(m, ("node", data["node"])).get(n, math.inf), m))

    def _tables(self) -> tuple[dict[str, str], dict[str, Any], dict[str, dict[str, float]]]:
        """(device -> kind, device -> node index, device -> {predecessor: routing cost}), built once:
        plain dicts keep the Dijkstra loops off networkx's views."""
        if self._route_tables is None:
            g = self.graph
            kinds = {n: d["kind"] for n, d in g.nodes(data=True)}
            nodes = {n: d.get("node") for n, d in g.nodes(data=True)}
            pred_cost: dict[str, dict[str, float]] = {n: {} for n in g}
            for u, v, data in g.edges(data=True):
                pred_cost[v][u] = float(data.get("route_cost", ROUTE_COST.get(data.get("kind", ""), 1.0)))
            self._route_tables = (kinds, nodes, pred_cost)
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
        if src == dst:
            return []
        seg = self._segments.get((src, dst, scope))
        if seg is not None:  # a segment without ECMP choices does not depend on hkey
            return list(seg)
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
        return out

    def clear_route_cache(self) -> None:
        """Forget cached routes; call after changing :attr:`graph` (treat it as read-only otherwise)."""
        self._routes.clear()
        self._dist.clear()
        self._segments.clear()
        self._route_tables = None

    # -- save / load --------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict: networkx node-link data plus the specs (inverse: :meth:`from_dict`)."""
        data = nx.node_link_data(self.graph, edges="links")
        return {"format": _FORMAT, "version": 1, "gpu_spec": self.gpu_spec.to_dict(),
                "nic_spec": None if self.nic_spec is None else self.nic_spec.to_dict(), "topology": data}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Topology:
        """Inverse of :meth:`to_dict`. ``gpu_spec`` may also be a GPU name (e.g. ``"H100"``)."""
        if d.get("format") != _FORMAT:
            raise ValueError(f"not a trainsim topology (format {d.get('format')!r}, expected {_FORMAT!r})")
        graph = nx.node_link_graph(d["topology"], directed=True, multigraph=False, edges="links")
        gs = d["gpu_spec"]
        gpu = get_gpu(gs) if isinstance(gs, str) else GPUSpec.from_dict(gs)
        ns = d.get("nic_spec")
        nic = None if ns is None else (get_nic(ns) if isinstance(ns, str) else NICSpec.from_dict(ns))
        return cls(graph, gpu, nic)

    def save(self, path: str | Path) -> None:
        """Write the topology as JSON (node-link data) so users can describe their own clusters."""
        Path(path).write_text(json.dumps(self.to_dict(), indent=1), encoding="utf-8")

    @classmethod
    def load(cls, path: str | Path) -> Topology:
        """Read a topology written by :meth:`save` (or by hand in the same format)."""
        return cls.from_dict(json.loads(Path(path).read_text(encoding="utf-8")))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Topology):
            return NotImplemented
        return (self.gpu_spec == other.gpu_spec and self.nic_spec == other.nic_spec
                and self.graph.graph == other.graph.graph
                and dict(self.graph.nodes(data=True)) == dict(other.graph.nodes(data=True))
                and {(u, v): d for u, v, d in self.graph.edges(data=True)}
                == {(u, v): d for u, v, d in other.graph.edges(data=True)})

    __hash__ = None  # type: ignore[assignment]


class _NoPath(Exception):
    pass


# ----------------------------------------------------------------------------------------------------
# Builders


@dataclass(frozen=True, kw_only=True, slots=True)
class NodeSpec:
    """One server: GPUs on an NVSwitch plane, GPUs and NICs under PCIe switches, switches under CPUs."""

    gpu: GPUSpec
    """GPU model."""
    gpus_per_node: int = 8
    """GPUs in the server."""
    nvlink_links: int = 0
    """NVLink links per GPU into the NVSwitch plane (0: no NVLink; GPUs talk over PCIe)."""
    nvlink_bandwidth_per_link_Bps: float = 0.0
    """Per-link NVLink bandwidth per direction (bytes/s)."""
    nvswitch: SwitchSpec | None = None
    """NVSwitch chip model (its hop latency is used)."""
    nvswitch_count: int = 0
    """Physical NVSwitch chips, recorded on the aggregated NVSwitch node."""
    nics_per_node: int = 8
    """Compute NICs (one port each)."""
    nic: NICSpec | None = None
    """Compute NIC model."""
    pcie_switch: SwitchSpec
    """PCIe switch model (its generation's bandwidth and hop latency)."""
    pcie_switches: int = 4
    """PCIe switches; GPUs and NICs are spread over them in order."""
    pcie_generation: int = 4
    """PCIe generation of the GPU links and switch uplinks."""
    cpus: int = 2
    """CPU sockets; PCIe switches are spread over them in order (no inter-socket link modelled)."""

    def __post_init__(self) -> None:
        for fname in ("gpus_per_node", "pcie_switches", "cpus"):
            if int(getattr(self, fname)) < 1:
                raise ValueError(f"NodeSpec: field {fname!r} must be >= 1, got {getattr(self, fname)!r}")
        for fname in ("nvlink_links", "nics_per_node", "nvswitch_count"):
            if int(getattr(self, fname)) < 0:
                raise ValueError(f"NodeSpec: field {fname!r} must be >= 0, got {getattr(self, fname)!r}")
        if self.nvlink_links > 0 and not self.nvlink_bandwidth_per_link_Bps > 0:
            raise ValueError("NodeSpec: field 'nvlink_bandwidth_per_link_Bps' must be > 0 with NVLink")
        if self.nics_per_node > 0 and self.nic is None:
            raise ValueError("NodeSpec: field 'nic' is required when nics_per_node > 0")

    @property
    def nvlink_bandwidth_Bps(self) -> float:
        """Per-GPU NVLink bandwidth into the NVSwitch plane per direction (bytes/s)."""
        return self.nvlink_links * self.nvlink_bandwidth_per_link_Bps


def generic_node(gpu: str | GPUSpec, *, gpus_per_node: int = 8, nvlink_links: int | None = None,
                 nvlink_bandwidth_per_link_Bps: float | None = None, nvswitch: str | SwitchSpec | None = None,
                 nvswitch_count: int = 0, nics_per_node: int = 8, nic: str | NICSpec | None = None,
                 pcie_switches: int = 4, pcie_generation: int | None = None, cpus: int = 2) -> NodeSpec:
    """Describe a server. NVLink links and per-link speed default to the GPU's; PCIe generation to the
    GPU's; ``nvswitch`` defaults to the NVSwitch generation matching the GPU's NVLink (gen3 -> NVSwitch
    gen2, gen4 -> gen3, gen5 -> gen4). Names are looked up in :mod:`hwmodel.specs`."""
    g = get_gpu(gpu)
    links = g.nvlink_links if nvlink_links is None else nvlink_links
    per_link = (g.nvlink_bandwidth_per_link_Bps if nvlink_bandwidth_per_link_Bps is None
                else nvlink_bandwidth_per_link_Bps)
    sw = None
    if links > 0:
        default_sw = {2: "NVSwitch-gen2", 3: "NVSwitch-gen2", 4: "NVSwitch-gen3", 5: "NVSwitch-gen4"}
        sw = get_switch(nvswitch if nvswitch is not None
                        else default_sw.get(g.nvlink_generation, "NVSwitch-gen3"))
        if sw.kind != "nvswitch":
            raise ValueError(f"nvswitch {sw.name!r} is a {sw.kind} switch, not an NVSwitch")
    gen = g.pcie_generation if pcie_generation is None else pcie_generation
    return NodeSpec(gpu=g, gpus_per_node=gpus_per_node, nvlink_links=links,
                    nvlink_bandwidth_per_link_Bps=per_link, nvswitch=sw, nvswitch_count=nvswitch_count,
                    nics_per_node=nics_per_node, nic=None if nic is None else get_nic(nic),
                    pcie_switch=get_pcie_switch(gen), pcie_switches=pcie_switches, pcie_generation=gen,
                    cpus=cpus)


def _add_link(g: nx.DiGraph, u: str, v: str, bandwidth_Bps: float, kind: str, lat_uv: float,
              lat_vu: float | None = None) -> None:
    """A full-duplex link: two directed edges of ``bandwidth_Bps`` each."""
    g.add_edge(u, v, bandwidth_Bps=float(bandwidth_Bps), latency_s=float(lat_uv), kind=kind)
    g.add_edge(v, u, bandwidth_Bps=float(bandwidth_Bps),
               latency_s=float(lat_uv if lat_vu is None else lat_vu), kind=kind)


def _add_node(g: nx.DiGraph, spec: NodeSpec, i: int, rank0: int) -> list[str]:
    """Add server ``i``'s devices and internal links; return its NIC names in order."""
    p = f"n{i}."
    pcie_hop = spec.pcie_switch.hop_latency_s
    pcie_bw = pcie_link_bandwidth_Bps(spec.pcie_generation)
    for s in range(spec.cpus):
        g.add_node(f"{p}cpu{s}", kind="cpu", node=i, index=s)
    for k in range(spec.pcie_switches):
        sw = f"{p}pcie{k}"
        g.add_node(sw, kind="pcie_switch", node=i, index=k, spec=spec.pcie_switch.name)
        _add_link(g, sw, f"{p}cpu{k * spec.cpus // spec.pcie_switches}", pcie_bw, "pcie", pcie_hop, 0.0)
    if spec.nvlink_links > 0:
        assert spec.nvswitch is not None
        g.add_node(f"{p}nvswitch", kind="nvswitch", node=i, index=0, spec=spec.nvswitch.name,
                   count=spec.nvswitch_count, aggregated=True)
    nics = []
    for j in range(spec.nics_per_node):
        assert spec.nic is not None
        nic = f"{p}nic{j}"
        nics.append(nic)
        g.add_node(nic, kind="nic", node=i, index=j, spec=spec.nic.name)
        nic_bw = pcie_link_bandwidth_Bps(min(spec.nic.pcie_generation, spec.pcie_generation))
        _add_link(g, nic, f"{p}pcie{j * spec.pcie_switches // spec.nics_per_node}", nic_bw, "pcie",
                  0.0, pcie_hop)
    for j in range(spec.gpus_per_node):
        gpu = f"{p}gpu{j}"
        nic = nics[j * spec.nics_per_node // spec.gpus_per_node] if nics else None
        g.add_node(gpu, kind="gpu", node=i, index=j, rank=rank0 + j, nic=nic, spec=spec.gpu.name)
        _add_link(g, gpu, f"{p}pcie{j * spec.pcie_switches // spec.gpus_per_node}", pcie_bw, "pcie", 0.0,
                  pcie_hop)
        if spec.nvlink_links > 0:
            assert spec.nvswitch is not None
            _add_link(g, gpu, f"{p}nvswitch", spec.nvlink_bandwidth_Bps, "nvlink", 0.0,
                      spec.nvswitch.hop_latency_s)
    return nics


def _spines_for(num_leaves: int, uplink_ports: float, radix: int) -> int:
    """Spine count: enough ports for every leaf's uplinks, at most one per uplink port (>= 1)."""
    return max(1, min(math.floor(uplink_ports), math.ceil(num_leaves * math.ceil(uplink_ports) / radix)))


def _fabric_link(g: nx.DiGraph, nic: str, sw: str, nic_spec: NICSpec, swspec: SwitchSpec) -> None:
    bw = min(nic_spec.bandwidth_Bps, swspec.port_bandwidth_Bps)
    half = nic_spec.latency_s / 2
    _add_link(g, nic, sw, bw, "ib", half, half + swspec.hop_latency_s)


def _add_tree(g: nx.DiGraph, leaves: dict[str, list[str]], leaf_uplink_Bps: float, uplink_ports: float,
              swspec: SwitchSpec, num_spines: int | None) -> None:
    """Spines above ``leaves``: each leaf joins every spine by ONE edge of uplink capacity / spines."""
    spines = num_spines if num_spines is not None else _spines_for(len(leaves), uplink_ports, swspec.radix)
    if spines < 1:
        raise ValueError(f"num_spines must be >= 1, got {spines}")
    if len(leaves) < 2 and num_spines is None:
        return
    for s in range(spines):
        g.add_node(f"spine{s}", kind="ib_switch", tier="spine", index=s, spec=swspec.name)
    for leaf in leaves:
        for s in range(spines):
            _add_link(g, leaf, f"spine{s}", leaf_uplink_Bps / spines, "ib", swspec.hop_latency_s)


def _check_oversub(oversubscription: float) -> float:
    if isinstance(oversubscription, bool) or not isinstance(oversubscription, (int, float)) \
            or not math.isfinite(oversubscription) or oversubscription < 1:
        raise ValueError(f"oversubscription must be a number >= 1 (k for k:1), got {oversubscription!r}")
    return float(oversubscription)


def rail_optimized(g: nx.DiGraph, node_nics: Sequence[Sequence[str]], *, nic: NICSpec, switch: SwitchSpec,
                   su_size: int, oversubscription: float = 1.0, num_spines: int | None = None) -> None:
    """Add a rail-optimised two-level fat tree (DGX SuperPOD RA): NIC *r* of every node of scalable
    unit *u* -> leaf ``su{u}.leaf{r}``; every leaf -> every spine. Leaf uplink capacity is
    ``su_size x NIC bandwidth / oversubscription`` (the SU's full cabling, so a partly filled SU is not
    throttled); the spine count fills the uplink ports at the switch radix (H100 RA: 1 SU = 8 leaves,
    4 spines)."""
    k = _check_oversub(oversubscription)
    if su_size < 1:
        raise ValueError(f"su_size must be >= 1, got {su_size}")
    leaves: dict[str, list[str]] = {}
    for i, nics in enumerate(node_nics):
        u = i // su_size
        for r, n in enumerate(nics):
            leaf = f"su{u}.leaf{r}"
            if leaf not in g:
                g.add_node(leaf, kind="ib_switch", tier="leaf", su=u, rail=r, spec=switch.name)
                leaves[leaf] = []
            leaves[leaf].append(n)
            _fabric_link(g, n, leaf, nic, switch)
    port = min(nic.bandwidth_Bps, switch.port_bandwidth_Bps)
    _add_tree(g, leaves, su_size * port / k, su_size / k, switch, num_spines)


def fat_tree(g: nx.DiGraph, node_nics: Sequence[Sequence[str]], *, nic: NICSpec, switch: SwitchSpec,
             nodes_per_leaf: int | None = None, oversubscription: float = 1.0,
             num_spines: int | None = None) -> None:
    """Add a plain two-level fat tree: leaves take whole nodes in blocks of ``nodes_per_leaf`` (default:
    as many as fit in the leaf's downlink ports, ``radix x k/(k+1)``), spines above."""
    k = _check_oversub(oversubscription)
    nics_per_node = max((len(n) for n in node_nics), default=1) or 1
    if nodes_per_leaf is None:
        nodes_per_leaf = max(1, int(switch.radix * k / (k + 1)) // nics_per_node)
    if nodes_per_leaf < 1:
        raise ValueError(f"nodes_per_leaf must be >= 1, got {nodes_per_leaf}")
    leaves: dict[str, list[str]] = {}
    for i, nics in enumerate(node_nics):
        leaf = f"leaf{i // nodes_per_leaf}"
        if leaf not in g:
            g.add_node(leaf, kind="ib_switch", tier="leaf", index=i // nodes_per_leaf, spec=switch.name)
            leaves[leaf] = []
        for n in nics:
            leaves[leaf].append(n)
            _fabric_link(g, n, leaf, nic, switch)
    port = min(nic.bandwidth_Bps, switch.port_bandwidth_Bps)
    down = nodes_per_leaf * nics_per_node
    _add_tree(g, leaves, down * port / k, down / k, switch, num_spines)


def single_switch(g: nx.DiGraph, node_nics: Sequence[Sequence[str]], *, nic: NICSpec,
                  switch: SwitchSpec) -> None:
    """Add one switch ``switch0`` joining every NIC (non-blocking; the radix is not enforced)."""
    g.add_node("switch0", kind="ib_switch", tier="leaf", index=0, spec=switch.name)
    for nics in node_nics:
        for n in nics:
            _fabric_link(g, n, "switch0", nic, switch)


def build_cluster(node: NodeSpec, num_nodes: int = 1, *, fabric: str = "rail_optimized",
                  oversubscription: float = 1.0, fabric_switch: str | SwitchSpec = "QM9700",
                  su_size: int = 32, nodes_per_leaf: int | None = None, num_spines: int | None = None,
                  name: str = "custom") -> Topology:
    """``num_nodes`` identical servers joined by ``fabric`` (one of :data:`FABRICS`).

    ``oversubscription`` k means k:1 (leaf uplink capacity = downlink capacity / k); ``su_size`` is
    the rail-optimised scalable unit in nodes; ``num_spines`` overrides the spine count.
    """
    if isinstance(num_nodes, bool) or not isinstance(num_nodes, int) or num_nodes < 1:
        raise ValueError(f"num_nodes must be an integer >= 1, got {num_nodes!r}")
    if fabric not in FABRICS:
        raise ValueError(f"fabric must be one of {', '.join(FABRICS)}, got {fabric!r}")
    sw = get_switch(fabric_switch)
    if sw.kind != "ib":
        raise ValueError(f"fabric_switch {sw.name!r} is a {sw.kind} switch; "
                         f"known IB switches: {', '.join(known_switches('ib'))}")
    g = nx.DiGraph(name=name, num_nodes=num_nodes, gpus_per_node=node.gpus_per_node, fabric=fabric,
                   oversubscription=float(oversubscription), su_size=su_size, fabric_switch=sw.name)
    node_nics = [_add_node(g, node, i, i * node.gpus_per_node) for i in range(num_nodes)]
    if fabric != "none" and node.nics_per_node > 0:
        assert node.nic is not None
        if fabric == "rail_optimized":
            rail_optimized(g, node_nics, nic=node.nic, switch=sw, su_size=su_size,
                           oversubscription=oversubscription, num_spines=num_spines)
        elif fabric == "fat_tree":
            fat_tree(g, node_nics, nic=node.nic, switch=sw, nodes_per_leaf=nodes_per_leaf,
                     oversubscription=oversubscription, num_spines=num_spines)
        else:
            if oversubscription != 1:
                raise ValueError("oversubscription applies to tree fabrics, not to 'single_switch'")
            single_switch(g, node_nics, nic=node.nic, switch=sw)
    return Topology(g, node.gpu, node.nic)


def dgx_a100(num_nodes: int = 1, *, fabric: str = "rail_optimized", oversubscription: float = 1.0,
             su_size: int = 20, gpu: str | GPUSpec = "A100-SXM4-80GB", nic: str | NICSpec = "ConnectX-6-HDR",
             fabric_switch: str | SwitchSpec = "QM8700", num_spines: int | None = None) -> Topology:
    """DGX A100 servers: 8 A100-SXM4-80GB, 6 NVSwitch gen2 (aggregated; 12 x 25 GB/s = 300 GB/s per
    GPU per direction), 4 PCIe Gen4 switches each with 2 GPUs and 2 HDR ConnectX-6 NICs (one per GPU),
    2 CPUs; HDR Quantum QM8700 fabric, scalable unit 20 nodes (SuperPOD A100 RA, [UNCERTAIN])."""
    node = generic_node(gpu, nvswitch="NVSwitch-gen2", nvswitch_count=6, nic=nic, pcie_switches=4,
                        pcie_generation=4)
    return build_cluster(node, num_nodes, fabric=fabric, oversubscription=oversubscription,
                         fabric_switch=fabric_switch, su_size=su_size, num_spines=num_spines, name="dgx-a100")


def dgx_h100(num_nodes: int = 1, *, fabric: str = "rail_optimized", oversubscription: float = 1.0,
             su_size: int = 32, gpu: str | GPUSpec = "H100-SXM5", nic: str | NICSpec = "ConnectX-7-NDR",
             fabric_switch: str | SwitchSpec = "QM9700", num_spines: int | None = None) -> Topology:
    """DGX H100 servers: 8 H100-SXM5, 4 NVSwitch gen3 (aggregated; 18 x 25 GB/s = 450 GB/s per GPU per
    direction), 8 NDR ConnectX-7 NICs (one per GPU) under 4 PCIe Gen5 switches, 2 CPUs; NDR Quantum-2
    QM9700 fabric, scalable unit 32 nodes (SuperPOD H100 RA)."""
    node = generic_node(gpu, nvswitch="NVSwitch-gen3", nvswitch_count=4, nic=nic, pcie_switches=4,
                        pcie_generation=5)
    return build_cluster(node, num_nodes, fabric=fabric, oversubscription=oversubscription,
                         fabric_switch=fabric_switch, su_size=su_size, num_spines=num_spines, name="dgx-h100")


# ----------------------------------------------------------------------------------------------------
# System registry


@dataclass(frozen=True, kw_only=True, slots=True)
class _System:
    gpu: str
    nic: str
    nvswitch: str
    nvswitch_count: int
    pcie_generation: int
    fabric_switch: str
    su_size: int
    doc: str


_SYSTEMS: dict[str, _System] = {
    "dgx-a100": _System(gpu="A100-SXM4-80GB", nic="ConnectX-6-HDR", nvswitch="NVSwitch-gen2",
                        nvswitch_count=6, pcie_generation=4, fabric_switch="QM8700", su_size=20,
                        doc="DGX A100 80GB, HDR fabric (SuperPOD A100 RA; SU of 20 [UNCERTAIN])"),
    "dgx-a100-40gb": _System(gpu="A100-SXM4-40GB", nic="ConnectX-6-HDR", nvswitch="NVSwitch-gen2",
                             nvswitch_count=6, pcie_generation=4, fabric_switch="QM8700", su_size=20,
                             doc="DGX A100 40GB, HDR fabric"),
    "dgx-h100": _System(gpu="H100-SXM5", nic="ConnectX-7-NDR", nvswitch="NVSwitch-gen3", nvswitch_count=4,
                        pcie_generation=5, fabric_switch="QM9700", su_size=32,
                        doc="DGX H100, NDR fabric (SuperPOD H100 RA: SU of 32)"),
    "hgx-h200": _System(gpu="H200-SXM", nic="ConnectX-7-NDR", nvswitch="NVSwitch-gen3", nvswitch_count=4,
                        pcie_generation=5, fabric_switch="QM9700", su_size=32,
                        doc="HGX H200 laid out as a DGX H100, NDR fabric"),
    "dgx-b200": _System(gpu="B200-HGX", nic="ConnectX-7-NDR", nvswitch="NVSwitch-gen4", nvswitch_count=2,
                        pcie_generation=5, fabric_switch="QM9700", su_size=32,
                        doc="DGX B200 [UNCERTAIN node layout: as DGX H100 with NVLink5], NDR fabric, "
                            "SU of 32 (SuperPOD B200 RA)"),
}


def known_systems() -> list[str]:
    """Names :func:`build_system` accepts."""
    return list(_SYSTEMS)


def build_system(name: str, num_nodes: int = 1, fabric: str = "rail_optimized", oversubscription: float = 1.0,
                 gpu_override: str | GPUSpec | None = None, nic_override: str | NICSpec | None = None, *,
                 su_size: int | None = None, num_spines: int | None = None,
                 nodes_per_leaf: int | None = None, fabric_switch: str | None = None) -> Topology:
    """Build a named system (:func:`known_systems`: dgx-a100, dgx-a100-40gb, dgx-h100, hgx-h200,
    dgx-b200) of ``num_nodes`` servers. ``gpu_override`` / ``nic_override`` swap in another (e.g.
    what-if) GPU or NIC, by name or spec, ``fabric_switch`` the InfiniBand switch (a NIC link runs at
    the slower of NIC and switch port, so a faster NIC needs a faster switch); the node layout stays.
    Unknown names raise
    :class:`~hwmodel.specs.UnknownNameError`."""
    key = str(name).strip().lower().replace("_", "-")
    if key not in _SYSTEMS:
        raise UnknownNameError("system", name, _SYSTEMS)
    s = _SYSTEMS[key]
    gpu = get_gpu(gpu_override if gpu_override is not None else s.gpu)
    node = generic_node(gpu, nvswitch=s.nvswitch, nvswitch_count=s.nvswitch_count,
                        nic=nic_override if nic_override is not None else s.nic,
                        pcie_generation=s.pcie_generation)
    return build_cluster(node, num_nodes, fabric=fabric, oversubscription=oversubscription,
                         fabric_switch=fabric_switch or s.fabric_switch,
                         su_size=s.su_size if su_size is None else su_size,
                         nodes_per_leaf=nodes_per_leaf, num_spines=num_spines, name=key)


_CLUSTER_KEYS = ("system", "num_nodes", "fabric", "oversubscription", "gpu", "gpu_file", "nic", "su_size",
                 "num_spines", "nodes_per_leaf")


def load_cluster_file(path: str | Path) -> Topology:
    """Build a cluster from a TOML file: ``system`` (see :func:`known_systems`), ``num_nodes``, and
    optionally ``fabric``, ``oversubscription``, ``su_size``, ``num_spines``, ``nodes_per_leaf``,
    ``gpu`` (a GPU name), ``gpu_file`` (a what-if GPU file, relative to this file) and ``nic``.
    The keys may sit in a ``[cluster]`` table. Unknown keys raise ValueError listing the allowed ones."""
    path = Path(path)
    with path.open("rb") as fh:
        data = tomllib.load(fh)
    if set(data) == {"cluster"}:
        data = data["cluster"]
    unknown = sorted(set(data) - set(_CLUSTER_KEYS))
    if unknown:
        raise ValueError(f"cluster file {path.name}: unknown keys {unknown}; "
                         f"allowed keys: {', '.join(_CLUSTER_KEYS)}")
    if "system" not in data:
        raise ValueError(f"cluster file {path.name}: key 'system' is required; known: {', '.join(_SYSTEMS)}")
    if "gpu" in data and "gpu_file" in data:
        raise ValueError(f"cluster file {path.name}: give 'gpu' or 'gpu_file', not both")
    gpu: str | GPUSpec | None = data.get("gpu")
    if "gpu_file" in data:
        gpu = load_gpu_file(path.parent / data["gpu_file"])
    return build_system(data["system"], data.get("num_nodes", 1), fabric=data.get("fabric", "rail_optimized"),
                        oversubscription=data.get("oversubscription", 1.0), gpu_override=gpu,
                        nic_override=data.get("nic"), su_size=data.get("su_size"),
                        num_spines=data.get("num_spines"), nodes_per_leaf=data.get("nodes_per_leaf"))


def iter_links(topo: Topology, kind: str | None = None) -> Iterable[tuple[str, str, dict[str, Any]]]:
    """Directed links ``(u, v, attrs)`` of ``topo``, optionally only one ``kind`` (nvlink, pcie, ib)."""
    for u, v, d in topo.graph.edges(data=True):
        if kind is None or d.get("kind") == kind:
            yield u, v, d
