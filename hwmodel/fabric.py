"""Multi-node fabrics: the InfiniBand switches joining the nodes' NICs, and :func:`build_cluster`.

Rail-optimised (NIC *i* of every node -> leaf *i* of its scalable unit, as the DGX SuperPOD reference
architectures), plain two-level fat tree, either with a core layer above pods of leaves (three tiers,
:class:`Pods`), or a single switch. The parallel cables between a leaf and a
spine are ONE edge with their summed bandwidth, and every leaf connects to every spine, so the flow
solver stays small. Each NIC<->switch edge runs at the slower of NIC and switch port and pays half the
NIC's base latency (~1 us NIC to NIC, perftest issue 131); an edge leaving a switch adds its hop latency.
"""

from __future__ import annotations

import gc
import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

import networkx as nx

from hwmodel.node import NodeSpec, add_link, add_links, add_nodes
from hwmodel.routing import ClosRoutes
from hwmodel.servers import ServerTable
from hwmodel.specs import NICSpec, SwitchSpec, get_switch, known_switches

if TYPE_CHECKING:
    from hwmodel.topology import Topology

FABRICS: tuple[str, ...] = ("rail_optimized", "fat_tree", "single_switch", "none")
"""Multi-node fabric kinds :func:`build_cluster` understands."""

ON_DEMAND = True
""":func:`build_cluster` makes a server's devices and links when the run first reads one of them
(:mod:`hwmodel.servers`); False: every server up front (the same graph, as the reference of the tests)."""


def _spines_for(num_leaves: int, uplink_ports: float, radix: int) -> int:
    """Spine count: enough ports for every leaf's uplinks, at most one per uplink port (>= 1)."""
    return max(1, min(math.floor(uplink_ports), math.ceil(num_leaves * math.ceil(uplink_ports) / radix)))


def _most_nodes_per_leaf(nics_per_node: int, oversubscription: float, radix: int) -> int:
    """Most nodes a fat-tree leaf can take: their downlinks plus the ``downlinks / oversubscription`` uplinks
    within the switch's ports; at least 1 (a node with more NICs than a leaf has ports, e.g. a 72-GPU
    NVL72 rack on a 64-port switch, still hangs under one leaf as the model builds it)."""
    n = 1
    while (n + 1) * nics_per_node + math.ceil((n + 1) * nics_per_node / oversubscription) <= radix:
        n += 1
    return n


def _given_spines(g: nx.DiGraph, num_spines: int, uplink_ports: float, pods: Sequence[Sequence[Sequence[str]]],
                  k: float, swspec: SwitchSpec) -> int:
    """A user's spine count (per pod), checked against both ends of the cables. At most
    ``floor(uplink_ports)`` (>= 1): each spine takes at least one of a leaf's uplink ports, and more
    spines would split one leaf's uplink into links no cable provides. At least enough spines for the
    uplinks in use at the spine switch's radix: a leaf uses ``ceil(NICs under it / k)`` uplinks for the
    nodes present (not a full scalable unit's cabling), summed over the leaves of a pod (``pods``: each
    pod's leaves, each leaf's NICs), ``ceil(that / radix)`` spines -- capped at the most, as the default
    count (:func:`_spines_for`) is, where no count fits (a spine then has more ports than its radix).
    A count that does not divide the leaf's uplinks is allowed (the model splits a leaf's uplink capacity
    evenly over the spines, as its default count may too; the run says so, :mod:`scenarios.notes`). The
    range is recorded as the graph's ``spines_allowed``.

    Raises:
        ValueError: ``spines = N: ...`` naming the allowed range, ``fewest..most``.
    """
    most = max(1, math.floor(uplink_ports))
    used = max(sum(math.ceil(len(nics) / k - 1e-9) for nics in pod) for pod in pods)
    fewest = min(most, max(1, math.ceil(used / swspec.radix)))
    g.graph["spines_allowed"] = (fewest, most)
    if fewest <= num_spines <= most:
        return num_spines
    if 1 <= num_spines < fewest:
        leaves = max(len(pod) for pod in pods)
        each = max(math.ceil(len(nics) / k - 1e-9) for pod in pods for nics in pod)
        why = (f"the nodes present use {used} leaf uplinks ({leaves} leaves{' a pod' if len(pods) > 1 else ''}, up "
               f"to {each} each: the NICs under a leaf / oversubscription), more than {num_spines} {swspec.name} "
               f"spine(s) of {swspec.radix} ports take")
    else:
        why = (f"a leaf has {most} uplink port(s) here (its downlinks / oversubscription), one per spine at "
               f"least")
    allowed = f"{fewest}..{most}" if fewest < most else f"{most} only"
    raise ValueError(f"spines = {num_spines}: {why}; allowed {allowed}")


def _fabric_link(g: nx.DiGraph, nic: str, sw: str, nic_spec: NICSpec, swspec: SwitchSpec) -> None:
    bw = min(nic_spec.bandwidth_Bps, swspec.port_bandwidth_Bps)
    half = nic_spec.latency_s / 2
    add_link(g, nic, sw, bw, "ib", half, half + swspec.hop_latency_s)


def _add_tree(g: nx.DiGraph, leaves: dict[str, list[str]], leaf_uplink_Bps: float, uplink_ports: float,
              swspec: SwitchSpec, num_spines: int | None, pods: Pods | None = None, k: float = 1.0) -> ClosRoutes:
    """Spines above ``leaves`` (leaf -> its NICs): each leaf joins every spine by ONE edge of uplink
    capacity / spines. With ``pods`` (and more than one pod), each pod of consecutive leaves gets its own
    spines and a core layer joins the pods (:func:`_add_core`). Returns the fabric's router by
    construction (:func:`_router`). ``k``: the oversubscription, for the uplinks a leaf uses
    (:func:`_given_spines`); the leaf's uplink count is recorded as the graph's ``leaf_uplink_ports``."""
    g.graph["leaf_uplink_ports"] = uplink_ports
    if pods is not None and len(leaves) > pods.leaves_per_pod:
        return _add_pods(g, leaves, leaf_uplink_Bps, uplink_ports, swspec, num_spines, pods, k)
    spines = (_given_spines(g, num_spines, uplink_ports, [list(leaves.values())], k, swspec)
              if num_spines is not None else _spines_for(len(leaves), uplink_ports, swspec.radix))
    if len(leaves) < 2 and num_spines is None:
        return _router(leaves, ())
    names = [f"spine{s}" for s in range(spines)]
    for s, name in enumerate(names):
        g.add_node(name, kind="ib_switch", tier="spine", index=s, spec=swspec.name)
    add_links(g, [(leaf, name) for leaf in leaves for name in names], leaf_uplink_Bps / spines, "ib",
              swspec.hop_latency_s)
    return _router(leaves, tuple(sorted(f"spine{s}" for s in range(spines))))


def _router(leaves: dict[str, list[str]], spines: tuple[str, ...] | dict[str, tuple[str, ...]],
            **three_tier) -> ClosRoutes:
    """The :class:`~hwmodel.routing.ClosRoutes` of a fabric built here (``leaves``: leaf -> its NICs;
    ``spines`` sorted by name, as the route search orders equal-cost next hops): what
    :meth:`ClosRoutes.detect` reads off the graph, without reading every NIC's links again (16,384 H100:
    about 0.1 s of CPU). ``tests/hwmodel/test_fabric_router.py`` compares the two on every fabric."""
    return ClosRoutes({n: leaf for leaf, nics in leaves.items() for n in nics}, spines, **three_tier)


class Pods:
    """The third tier of a Clos: ``leaves_per_pod`` consecutive leaves share a pod's spines, and the
    spines' uplinks (their downlink capacity / ``core_oversubscription``) go to a core layer."""

    def __init__(self, leaves_per_pod: int, core_oversubscription: float = 1.0) -> None:
        if isinstance(leaves_per_pod, bool) or not isinstance(leaves_per_pod, int) or leaves_per_pod < 1:
            raise ValueError(f"leaves_per_pod must be an integer >= 1, got {leaves_per_pod!r}")
        self.leaves_per_pod = leaves_per_pod
        self.core_oversubscription = _check_oversub(core_oversubscription, "core_oversubscription")


def _add_pods(g: nx.DiGraph, leaf_nics: dict[str, list[str]], leaf_uplink_Bps: float, uplink_ports: float,
              swspec: SwitchSpec, num_spines: int | None, pods: Pods, k: float = 1.0) -> ClosRoutes:
    """A three-tier Clos (leaf / spine / core), as the DGX SuperPOD RAs above 4 SUs and Meta's Llama 3
    clusters (arXiv:2407.21783 sec. 3.3.1): pod *p* holds leaves ``p*L .. p*L+L-1`` and spines
    ``pod{p}.spine{s}`` (each joined to every leaf of its pod, as the two-tier tree); spine *s* of every
    pod joins each core of *plane s*, ``core{s}.{c}`` (the usual fat-tree planes), by ONE edge of the
    spine's uplink capacity / cores per plane. Core count per plane: enough ports for the pods' spine
    uplinks at the switch radix, at most one per uplink port (as the spines of a two-tier tree). Returns
    the fabric's router by construction (:func:`_router`)."""
    leaves = list(leaf_nics)
    per_pod = pods.leaves_per_pod
    num_pods = math.ceil(len(leaves) / per_pod)
    nics = list(leaf_nics.values())
    spines = (_given_spines(g, num_spines, uplink_ports, [nics[p:p + per_pod] for p in range(0, len(nics), per_pod)],
                            k, swspec) if num_spines is not None
              else _spines_for(per_pod, uplink_ports, swspec.radix))
    spine_down_Bps = per_pod * leaf_uplink_Bps / spines  # a full pod's cabling, as a partly filled SU
    spine_up_ports = per_pod * uplink_ports / spines / pods.core_oversubscription
    cores = _spines_for(num_pods, spine_up_ports, swspec.radix)
    hop = swspec.hop_latency_s
    for s in range(spines):
        for c in range(cores):
            g.add_node(f"core{s}.{c}", kind="ib_switch", tier="core", plane=s, index=c, spec=swspec.name)
    up: dict[str, tuple[str, ...]] = {}
    down: dict[tuple[str, int], str] = {}
    pod_of: dict[str, int] = {}
    by_leaf: dict[str, tuple[str, ...]] = {}
    for p in range(num_pods):
        names = [f"pod{p}.spine{s}" for s in range(spines)]
        for s, name in enumerate(names):
            g.add_node(name, kind="ib_switch", tier="spine", pod=p, index=s, spec=swspec.name)
        for leaf in leaves[p * per_pod:(p + 1) * per_pod]:
            g.nodes[leaf]["pod"] = p
            for name in names:
                add_link(g, leaf, name, leaf_uplink_Bps / spines, "ib", hop)
        for s, name in enumerate(names):
            for c in range(cores):
                add_link(g, name, f"core{s}.{c}", spine_down_Bps / pods.core_oversubscription / cores, "ib", hop)
            up[name] = tuple(sorted(f"core{s}.{c}" for c in range(cores)))
            for c in range(cores):
                down[(f"core{s}.{c}", p)] = name
        pod_spines = tuple(sorted(names))
        for leaf in leaves[p * per_pod:(p + 1) * per_pod]:
            pod_of[leaf] = p
            by_leaf[leaf] = pod_spines
    return _router(leaf_nics, by_leaf, cores=up, spine_to_pod=down, pod_of=pod_of)


def _check_oversub(oversubscription: float, key: str = "oversubscription") -> float:
    if isinstance(oversubscription, bool) or not isinstance(oversubscription, (int, float)) \
            or not math.isfinite(oversubscription) or oversubscription < 1:
        raise ValueError(f"{key} must be a number >= 1 (k for k:1), got {oversubscription!r}")
    return float(oversubscription)


def rail_optimized(g: nx.DiGraph, node_nics: Sequence[Sequence[str]], *, nic: NICSpec, switch: SwitchSpec,
                   su_size: int, oversubscription: float = 1.0, num_spines: int | None = None,
                   pods: Pods | None = None) -> ClosRoutes:
    """Add a rail-optimised two-level fat tree (DGX SuperPOD RA): NIC *r* of every node of scalable
    unit *u* -> leaf ``su{u}.leaf{r}``; every leaf -> every spine. Leaf uplink capacity is
    ``su_size x NIC bandwidth / oversubscription`` (the SU's full cabling, so a partly filled SU is not
    throttled); the spine count fills the uplink ports at the switch radix (H100 RA: 1 SU = 8 leaves,
    4 spines). ``pods``: a core layer above pods of leaves (``su{u}.leaf{r}`` in order, so a pod of
    ``8 x m`` leaves is ``m`` DGX H100 SUs). Returns the fabric's router by construction."""
    k = _check_oversub(oversubscription)
    if su_size < 1:
        raise ValueError(f"su_size must be >= 1, got {su_size}")
    rails = max((len(n) for n in node_nics), default=1) or 1
    if pods is not None and pods.leaves_per_pod % rails:  # a pod of part of an SU: its rails in two pods
        raise ValueError(f"leaves_per_pod = {pods.leaves_per_pod} on fabric 'rail_optimized': a pod holds whole "
                         f"scalable units of {rails} rail leaves (one per NIC of a node; DGX SuperPOD RAs group "
                         f"SUs), so allowed: multiples of {rails} ({rails}, {2 * rails}, ...); "
                         f"{pods.leaves_per_pod} would put one SU's rails under different pods' spines")
    leaves: dict[str, list[str]] = {}
    bw, half = min(nic.bandwidth_Bps, switch.port_bandwidth_Bps), nic.latency_s / 2  # (_fabric_link's, once)
    names: list[str] = []  # (the current SU's leaf of each rail)
    links: list[tuple[str, str]] = []  # (NIC, its leaf)
    for i, nics in enumerate(node_nics):
        u = i // su_size
        if i % su_size == 0 or len(names) < len(nics):
            names = [f"su{u}.leaf{r}" for r in range(len(nics))]
        for r, n in enumerate(nics):
            leaf = names[r]
            on = leaves.get(leaf)
            if on is None:
                if leaf in g._node:
                    raise ValueError(f"rail_optimized: the graph already has a device {leaf!r}")
                g.add_node(leaf, kind="ib_switch", tier="leaf", su=u, rail=r, spec=switch.name)
                on = leaves[leaf] = []
            on.append(n)
            links.append((n, leaf))
    add_links(g, links, bw, "ib", half, half + switch.hop_latency_s)  # (after its leaves: the same graph)
    port = min(nic.bandwidth_Bps, switch.port_bandwidth_Bps)
    return _add_tree(g, leaves, su_size * port / k, su_size / k, switch, num_spines, pods, k)


def fat_tree(g: nx.DiGraph, node_nics: Sequence[Sequence[str]], *, nic: NICSpec, switch: SwitchSpec,
             nodes_per_leaf: int | None = None, oversubscription: float = 1.0,
             num_spines: int | None = None, pods: Pods | None = None) -> ClosRoutes:
    """Add a plain two-level fat tree: leaves take whole nodes in blocks of ``nodes_per_leaf`` (default:
    as many as fit in the leaf's downlink ports, ``radix x k/(k+1)``), spines above; with ``pods``, a
    core layer above pods of leaves (three tiers). Returns the fabric's router by construction."""
    k = _check_oversub(oversubscription)
    nics_per_node = max((len(n) for n in node_nics), default=1) or 1
    if nodes_per_leaf is None:
        nodes_per_leaf = max(1, int(switch.radix * k / (k + 1)) // nics_per_node)
    elif not 1 <= nodes_per_leaf <= (most := _most_nodes_per_leaf(nics_per_node, k, switch.radix)):
        down = nodes_per_leaf * nics_per_node
        raise ValueError(f"nodes_per_leaf = {nodes_per_leaf}: {down} downlinks ({nics_per_node} NICs a node) + "
                         f"{math.ceil(down / k)} uplinks (oversubscription {k:g}:1) need more than a {switch.name} "
                         f"leaf's {switch.radix} ports; allowed 1..{most} (a larger oversubscription or a "
                         f"higher-radix fabric_switch takes more)")
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
    return _add_tree(g, leaves, down * port / k, down / k, switch, num_spines, pods, k)


def single_switch(g: nx.DiGraph, node_nics: Sequence[Sequence[str]], *, nic: NICSpec,
                  switch: SwitchSpec) -> ClosRoutes:
    """Add one switch ``switch0`` joining every NIC (non-blocking; the radix is not enforced). Returns
    the fabric's router by construction."""
    g.add_node("switch0", kind="ib_switch", tier="leaf", index=0, spec=switch.name)
    for nics in node_nics:
        for n in nics:
            _fabric_link(g, n, "switch0", nic, switch)
    return _router({"switch0": [n for nics in node_nics for n in nics]}, ())


def build_cluster(node: NodeSpec, num_nodes: int = 1, *, fabric: str = "rail_optimized",
                  oversubscription: float = 1.0, fabric_switch: str | SwitchSpec = "QM9700",
                  su_size: int = 32, nodes_per_leaf: int | None = None, num_spines: int | None = None,
                  leaves_per_pod: int | None = None, core_oversubscription: float = 1.0,
                  name: str = "custom") -> Topology:
    """``num_nodes`` identical servers joined by ``fabric`` (one of :data:`FABRICS`).

    ``oversubscription`` k means k:1 (leaf uplink capacity = downlink capacity / k); ``su_size`` is
    the rail-optimised scalable unit in nodes; ``num_spines`` overrides the spine count (per pod).
    ``leaves_per_pod`` makes a tree fabric three-tier when it has more leaves than that (:class:`Pods`;
    ``core_oversubscription`` k': spine uplink capacity = spine downlink capacity / k'). Bad values
    raise ValueError naming the argument (``num_spines`` by the scenario's key, ``spines``, with its allowed
    range: :func:`_given_spines`); an unknown switch raises UnknownNameError.
    """
    from hwmodel.topology import Topology  # here, not at the top: hwmodel.topology re-exports this module

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
    pods = None if leaves_per_pod is None else Pods(leaves_per_pod, core_oversubscription)
    if pods is None and core_oversubscription != 1:
        _check_oversub(core_oversubscription, "core_oversubscription")
        raise ValueError("core_oversubscription needs leaves_per_pod (a core layer above pods of leaves)")
    if pods is not None:
        g.graph.update(leaves_per_pod=leaves_per_pod, core_oversubscription=pods.core_oversubscription)
    router: ClosRoutes | None = None
    with _collector_paused():
        servers = ServerTable(g, node, num_nodes) if ON_DEMAND else None  # (hwmodel.servers)
        node_nics = ([[f"n{i}.{n}" for n in servers.nics] for i in range(num_nodes)] if servers is not None
                     else add_nodes(g, node, num_nodes))
        if fabric != "none" and node.nics_per_node > 0:
            assert node.nic is not None
            if fabric == "rail_optimized":
                router = rail_optimized(g, node_nics, nic=node.nic, switch=sw, su_size=su_size,
                               oversubscription=oversubscription, num_spines=num_spines, pods=pods)
            elif fabric == "fat_tree":
                router = fat_tree(g, node_nics, nic=node.nic, switch=sw, nodes_per_leaf=nodes_per_leaf,
                         oversubscription=oversubscription, num_spines=num_spines, pods=pods)
            else:
                if oversubscription != 1 or pods is not None:
                    raise ValueError("oversubscription and leaves_per_pod apply to tree fabrics, "
                                     "not to 'single_switch'")
                router = single_switch(g, node_nics, nic=node.nic, switch=sw)
        if servers is not None:
            servers.seal()
        return Topology(g, node.gpu, node.nic, node_copies=num_nodes, fabric_routes=router, links_checked=True)


@contextmanager
def _collector_paused() -> Iterator[None]:
    """The cyclic garbage collector off while a cluster's graph is built (and back as it was after):
    the graph is hundreds of thousands of dicts without reference cycles, so the collections their
    allocation triggers free nothing, while each full one walks every live object (16,384 H100:
    about a quarter of the build's time)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
