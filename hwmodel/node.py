"""One server of a cluster: :class:`NodeSpec` and the devices and links it adds to a topology graph.

A node is GPUs on one (aggregated) NVSwitch plane, GPUs and compute NICs under PCIe switches, and the
switches under CPU sockets. Device names are prefixed ``n{node}.``: ``n0.gpu3``, ``n0.nvswitch``,
``n0.pcie1``, ``n0.nic3``, ``n0.cpu0``. See :mod:`hwmodel.topology` for the node and edge attributes
and the modelling choices (NVSwitch aggregation, PCIe tree).
"""

from __future__ import annotations

from dataclasses import dataclass

import networkx as nx

from hwmodel.specs import (
    GPUSpec,
    NICSpec,
    SwitchSpec,
    get_gpu,
    get_nic,
    get_pcie_switch,
    get_switch,
    pcie_link_bandwidth_Bps,
)

NVSWITCH_FOR_NVLINK: dict[int, str] = {2: "NVSwitch-gen2", 3: "NVSwitch-gen2", 4: "NVSwitch-gen3",
                                       5: "NVSwitch-gen4"}
"""Default NVSwitch chip per NVLink generation (NVLink3 -> gen2 on DGX A100, NVLink4 -> gen3 on DGX H100,
NVLink5 -> gen4 on DGX B200); other generations default to NVSwitch-gen3."""


@dataclass(frozen=True, kw_only=True, slots=True)
class NodeSpec:
    """One server: GPUs on an NVSwitch plane, GPUs and NICs under PCIe switches, switches under CPUs.

    Raises ValueError naming the field for counts below their minimum, NVLink links without a per-link
    bandwidth, or NICs without a NIC model.
    """

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
    GPU's; ``nvswitch`` defaults to the NVSwitch generation matching the GPU's NVLink
    (:data:`NVSWITCH_FOR_NVLINK`). Names are looked up in :mod:`hwmodel.specs` (UnknownNameError);
    a non-NVSwitch ``nvswitch`` raises ValueError."""
    g = get_gpu(gpu)
    links = g.nvlink_links if nvlink_links is None else nvlink_links
    per_link = (g.nvlink_bandwidth_per_link_Bps if nvlink_bandwidth_per_link_Bps is None
                else nvlink_bandwidth_per_link_Bps)
    sw = None
    if links > 0:
        sw = get_switch(nvswitch if nvswitch is not None
                        else NVSWITCH_FOR_NVLINK.get(g.nvlink_generation, "NVSwitch-gen3"))
        if sw.kind != "nvswitch":
            raise ValueError(f"nvswitch {sw.name!r} is a {sw.kind} switch, not an NVSwitch")
    gen = g.pcie_generation if pcie_generation is None else pcie_generation
    return NodeSpec(gpu=g, gpus_per_node=gpus_per_node, nvlink_links=links,
                    nvlink_bandwidth_per_link_Bps=per_link, nvswitch=sw, nvswitch_count=nvswitch_count,
                    nics_per_node=nics_per_node, nic=None if nic is None else get_nic(nic),
                    pcie_switch=get_pcie_switch(gen), pcie_switches=pcie_switches, pcie_generation=gen,
                    cpus=cpus)


def add_link(g: nx.DiGraph, u: str, v: str, bandwidth_Bps: float, kind: str, lat_uv: float,
             lat_vu: float | None = None) -> None:
    """A full-duplex link: two directed edges of ``bandwidth_Bps`` (bytes/s) each; ``lat_uv`` (s) on
    ``u -> v`` and ``lat_vu`` (default ``lat_uv``) on ``v -> u``. ValueError, naming the link, for a
    bandwidth not > 0 or a latency not >= 0 (the check :class:`~hwmodel.topology.Topology` makes of
    every link, made here for the clusters :func:`hwmodel.fabric.build_cluster` builds)."""
    if not (bandwidth_Bps > 0 and lat_uv >= 0 and (lat_vu is None or lat_vu >= 0)):
        bad = (u, v) if not (bandwidth_Bps > 0 and lat_uv >= 0) else (v, u)
        raise ValueError(f"topology edge {bad[0]!r}->{bad[1]!r}: bandwidth_Bps must be > 0 and latency_s >= 0")
    on_demand = getattr(g, "on_demand", None)
    if on_demand is not None:  # (a fabric link of a server not made yet: hwmodel.servers)
        d_uv = {"bandwidth_Bps": float(bandwidth_Bps), "latency_s": float(lat_uv), "kind": kind}
        d_vu = {"bandwidth_Bps": float(bandwidth_Bps), "latency_s": float(lat_uv if lat_vu is None else lat_vu),
                "kind": kind}
        if on_demand.defer_link(u, v, d_uv, d_vu):
            return
    succ, pred = g._succ, g._pred
    if u in succ and v in succ and v not in succ[u] and u not in succ[v]:
        # two new edges between existing devices: networkx's dicts written as its add_edge writes them
        # (one data dict per edge, seen from both ends), without its per-call overhead
        succ[u][v] = pred[v][u] = {"bandwidth_Bps": float(bandwidth_Bps), "latency_s": float(lat_uv), "kind": kind}
        succ[v][u] = pred[u][v] = {"bandwidth_Bps": float(bandwidth_Bps),
                                   "latency_s": float(lat_uv if lat_vu is None else lat_vu), "kind": kind}
        cache = getattr(g, "__networkx_cache__", None)
        if cache:
            cache.clear()
        return
    g.add_edge(u, v, bandwidth_Bps=float(bandwidth_Bps), latency_s=float(lat_uv), kind=kind)
    g.add_edge(v, u, bandwidth_Bps=float(bandwidth_Bps),
               latency_s=float(lat_uv if lat_vu is None else lat_vu), kind=kind)


def add_links(g: nx.DiGraph, links: list[tuple[str, str]], bandwidth_Bps: float, kind: str, lat_uv: float,
              lat_vu: float | None = None) -> None:
    """:func:`add_link` of each ``(u, v)`` of ``links``, in order, all of one bandwidth and latencies: the
    values checked once, and a fabric's links to servers made on demand taken in one loop
    (:meth:`hwmodel.servers.ServerTable.defer_links`; 16,384 H100: 16,384 NIC links)."""
    if not links:
        return
    u0, v0 = links[0]
    add_link(g, u0, v0, bandwidth_Bps, kind, lat_uv, lat_vu)  # (checks the values, once for all)
    d_uv = {"bandwidth_Bps": float(bandwidth_Bps), "latency_s": float(lat_uv), "kind": kind}
    d_vu = {"bandwidth_Bps": float(bandwidth_Bps), "latency_s": float(lat_uv if lat_vu is None else lat_vu),
            "kind": kind}
    succ, pred, has = g._succ, g._pred, dict.__contains__

    def add(u: str, v: str) -> None:  # (add_link's path for two existing devices, without its checks)
        if has(succ, u) and has(succ, v) and v not in succ[u] and u not in succ[v]:
            succ[u][v] = pred[v][u] = d_uv.copy()
            succ[v][u] = pred[u][v] = d_vu.copy()
        else:
            add_link(g, u, v, bandwidth_Bps, kind, lat_uv, lat_vu)

    on_demand = getattr(g, "on_demand", None)
    if on_demand is not None:
        on_demand.defer_links(links[1:], d_uv, d_vu, add)
    else:
        for u, v in links[1:]:
            add(u, v)
    cache = getattr(g, "__networkx_cache__", None)
    if cache:
        cache.clear()


def add_node(g: nx.DiGraph, spec: NodeSpec, i: int, rank0: int) -> list[str]:
    """Add server ``i``'s devices and internal links (its GPUs get ranks ``rank0 ...``); return its NIC
    names in order. An edge leaving a switch pays that switch's hop latency."""
    p = f"n{i}."
    pcie_hop = spec.pcie_switch.hop_latency_s
    pcie_bw = pcie_link_bandwidth_Bps(spec.pcie_generation)
    for s in range(spec.cpus):
        g.add_node(f"{p}cpu{s}", kind="cpu", node=i, index=s)
    for k in range(spec.pcie_switches):
        sw = f"{p}pcie{k}"
        g.add_node(sw, kind="pcie_switch", node=i, index=k, spec=spec.pcie_switch.name)
        add_link(g, sw, f"{p}cpu{k * spec.cpus // spec.pcie_switches}", pcie_bw, "pcie", pcie_hop, 0.0)
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
        add_link(g, nic, f"{p}pcie{j * spec.pcie_switches // spec.nics_per_node}", nic_bw, "pcie",
                 0.0, pcie_hop)
    for j in range(spec.gpus_per_node):
        gpu = f"{p}gpu{j}"
        gpu_nic = nics[j * spec.nics_per_node // spec.gpus_per_node] if nics else None
        g.add_node(gpu, kind="gpu", node=i, index=j, rank=rank0 + j, nic=gpu_nic, spec=spec.gpu.name)
        add_link(g, gpu, f"{p}pcie{j * spec.pcie_switches // spec.gpus_per_node}", pcie_bw, "pcie", 0.0,
                 pcie_hop)
        if spec.nvlink_links > 0:
            assert spec.nvswitch is not None
            add_link(g, gpu, f"{p}nvswitch", spec.nvlink_bandwidth_Bps, "nvlink", 0.0,
                     spec.nvswitch.hop_latency_s)
    return nics


def server_attrs(template: dict, i: int, rank0: int, prefix: str) -> dict:
    """Server ``i``'s copy of a device's attributes on server 0 (``template``): its node index, its rank
    (``rank0`` + the template's) and its NIC's name under ``prefix`` (``"n{i}."``)."""
    attrs = dict(template)
    attrs["node"] = i
    if "rank" in attrs:
        attrs["rank"] = rank0 + attrs["rank"]
    if attrs.get("nic") is not None:
        attrs["nic"] = prefix + attrs["nic"][len("n0."):]
    return attrs


def add_nodes(g: nx.DiGraph, spec: NodeSpec, num_nodes: int) -> list[list[str]]:
    """:func:`add_node` for servers ``0 .. num_nodes - 1`` (ranks node-major), giving the same graph --
    devices, links, attributes and the order of each -- without networkx's per-call overhead: server 0
    is built once in a graph of its own and every server is a renamed copy of it, written into ``g``'s
    dicts in the order :func:`add_node` would add them (edge order is the links' solver tie-break).
    ``g`` must not hold any of these servers' devices yet. Returns each server's NIC names."""
    t = nx.DiGraph()
    nics0 = add_node(t, spec, 0, 0)
    cut = len("n0.")
    local = [d[cut:] for d in t._node]  # server 0's devices, in the order add_node added them
    t_attrs = [t._node[f"n0.{d}"] for d in local]
    t_succ = [[(v[cut:], data) for v, data in t._succ[f"n0.{d}"].items()] for d in local]
    t_pred = [[u[cut:] for u in t._pred[f"n0.{d}"]] for d in local]
    node_attr, succ, pred = g._node, g._succ, g._pred
    out: list[list[str]] = []
    for i in range(num_nodes):
        p = f"n{i}."
        rank0 = i * spec.gpus_per_node
        names = [p + d for d in local]
        name_of = dict(zip(local, names, strict=True))  # (one string per device, shared by its links' keys)
        for name, t_a in zip(names, t_attrs, strict=True):
            succ[name], pred[name], node_attr[name] = {}, {}, server_attrs(t_a, i, rank0, p)
        for name, links in zip(names, t_succ, strict=True):
            succ[name] = {name_of[v]: dict(data) for v, data in links}
        for name, froms in zip(names, t_pred, strict=True):  # (a link's one data dict, both ways)
            pred[name] = {name_of[u]: succ[name_of[u]][name] for u in froms}
        out.append([p + n[cut:] for n in nics0])
    cache = getattr(g, "__networkx_cache__", None)
    if cache:  # (views networkx caches on the graph: none may predate these dicts)
        cache.clear()
    return out
