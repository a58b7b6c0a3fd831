"""Merging a collective with its symmetric mirrors into one activity's link weights, link by edge.

:meth:`hwmodel.nccl.engine.NcclEngine.start_together` starts a collective (or send/recv) of a simulated
rank together with its mirrors -- the same operation shifted to the ranks it stands for -- as ONE fluid
activity over the union of their links. Most of a mirror's links are used by that mirror alone (its own
NIC, PCIe and node links); the merge drops them (see :func:`merged_weights`). Laying the mirrors' flows
out as topology *edges* rather than link resources means those dropped links never get a resource, nor a
cached route: on a 131,072-GPU cluster a pipeline send has 8,191 mirrors, and the links only one of them
uses are most of the cluster's links.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from itertools import chain
from operator import eq, itemgetter
from typing import TYPE_CHECKING, Any, cast

from hwmodel import ecmp as _ecmp
from hwmodel.fluid import Resource
from hwmodel.nccl import algorithms as _algorithms

if TYPE_CHECKING:
    from hwmodel.nccl.engine import NcclEngine, Plan, _MergedGroup

Edge = tuple[str, str]


class EdgeContext:
    """The engine's flow context (:class:`hwmodel.nccl.algorithms.base.FlowContext`) with ``path``
    returning topology edges, not link resources; routes are not cached (a mirror's route is asked once
    per merged group). ``subflows``: the sub-flows NCCL's connections make of each NIC pair's traffic
    (:mod:`hwmodel.ecmp`); above 1, a route's fabric hops where they part are one
    :class:`~hwmodel.ecmp.Spread` (the weights below expand it)."""

    def __init__(self, engine: NcclEngine, subflows: int = 1) -> None:
        self._engine = engine
        self._topo = engine.cluster.topology
        self.subflows = subflows

    def path(self, a: str, b: str) -> tuple[Edge, ...]:
        if _ecmp.spreads(self.subflows):
            return cast(tuple[Edge, ...], self._topo.route_spread(a, b, self.subflows))
        return self._topo.route_edges(a, b)

    def rails(self, ppn: int) -> int:
        return self._engine.rails(ppn)

    def comm_topology(self, gpus: tuple[str, ...]) -> Any:
        return self._engine.comm_topology(gpus)

    def nodes_of(self, gpus: tuple[str, ...]) -> dict[int, list[str]]:
        return self._engine.nodes_of(gpus)

    @property
    def topology(self) -> Any:
        return self._topo


def edge_weights(engine: NcclEngine, ctx: EdgeContext, plan: Plan,
                 efficiency: dict[str, float]) -> dict[Edge, float]:
    """Edge -> bytes on it per byte of per-rank progress of ``plan``: the same figures, in the same order,
    as ``engine._link_weights(plan)`` gives per link resource (with ``ctx.subflows`` 1). ``efficiency``: a
    cache, edge kind -> NCCL's link efficiency (:meth:`NcclEngine.link_efficiency_of_kind`)."""
    out: dict[Edge, float] = {}
    flows = _algorithms.get(plan.algorithm).flows(ctx, plan.op, plan.gpus, plan.root)  # type: ignore[arg-type]
    _add_edge_weights(engine, plan, [(f.frac, cast(tuple[Edge, ...], f.path)) for f in flows], efficiency, out,
                      None, _ecmp.spreads(ctx.subflows))
    return out


Laid = list[tuple[float, tuple[Edge, ...]]]
"""A plan's flows as (fraction, edges of its path)."""


def _add_edge_weights(engine: NcclEngine, plan: Plan, flows: Laid, efficiency: dict[str, float],
                      into: dict[Edge, float], shared: set[Edge] | None, spread: bool = False) -> None:
    """:func:`edge_weights` of ``plan`` (laid out as ``flows``) added into ``into`` edge by edge (each new
    edge appended, as a dict update would), without the intermediate dict: a merge adds thousands of
    mirrors' weights. ``shared``: where given, the edges ``into`` already had (used by an earlier member)
    are added to it. ``spread``: the paths may hold :class:`~hwmodel.ecmp.Spread` hops, summed as one
    element first and then split over their edges by share."""
    proto_w = engine.proto_weight(plan)
    path = flows[0][1] if len(flows) == 1 else ()
    if flows and path and flows[0][0] == 1.0 and len(set(path)) == len(path) and not spread:
        per_byte: dict[Edge, float] | tuple[Edge, ...] = path  # (a send: each edge once, 0.0 + 1.0 == 1.0)
    else:
        per_byte = {}
        for frac, edges in flows:
            for e in edges:
                per_byte[e] = per_byte.get(e, 0.0) + frac
        if spread:
            expanded: dict[Edge, float] = {}
            _ecmp.expand_into(per_byte, expanded)
            per_byte = expanded
    adj = engine.cluster.topology.link_rows()  # (plain successor dicts; no server made on demand for them)
    pairs = per_byte.items() if isinstance(per_byte, dict) else ((e, 1.0) for e in per_byte)
    for e, w in pairs:
        kind = adj[e[0]][e[1]].get("kind", "")
        eff = efficiency.get(kind)
        if eff is None:
            eff = efficiency[kind] = engine.link_efficiency_of_kind(kind)
        x = w * proto_w / eff
        had = into.get(e)
        if had is None:
            into[e] = x
        else:
            into[e] = had + x
            if shared is not None:
                shared.add(e)


class _Recorder(EdgeContext):
    """An :class:`EdgeContext` whose ``path(a, b)`` is a placeholder, ``(i,)`` for the ``i``-th route
    asked (``pairs[i] == (a, b)``): the members' flows are laid out first, their routes after, once it is
    known which routes the merge needs in full (:class:`_Routes`). Algorithms only concatenate paths."""

    def __init__(self, engine: NcclEngine, subflows: int = 1) -> None:
        super().__init__(engine, subflows)
        self.pairs: list[tuple[str, str]] = []

    def path(self, a: str, b: str) -> tuple[Edge, ...]:
        self.pairs.append((a, b))
        return cast(tuple[Edge, ...], (len(self.pairs) - 1,))


def _routes(topo: Any, pairs: list[tuple[str, str]], own: dict[Edge, float],
            ends: set[str], subflows: int = 1, owners: list[int] | None = None) -> list[tuple[Edge, ...]]:
    """The route of each of ``pairs`` (a merge's mirrors' routes, in the order their flows ask them),
    less the node-local segments the merge would drop. Between GPUs of two nodes whose ends are *private*
    (:meth:`hwmodel.topology.Topology.private_ends`: each GPU's segment to and from its NIC fixed, and
    all of them disjoint) a route is its source's segment, the fabric's hops and its destination's
    segment, and a segment is left out when its GPU is not one of ``ends``, ends no other route of the
    merge the same way (leaving or arriving; ``owners``: the member each pair belongs to, where routes of
    one member, e.g. a ring's channels, may share a segment), shares no edge with ``own``, and no route of the merge is
    inside its node or starts or ends at a device there that is not a GPU (:func:`_nodes_in_full`).
    Each of its edges is then crossed by this route alone, in all the merge: the merge drops it (kept:
    the first member's edges, edges several members share, edges between fabric switches and those
    touching ``ends``), and leaving it out changes neither a weight nor the order of the edges kept. So
    a mirrored send or ring costs the fabric's hashes, not every GPU's segments. ``subflows`` > 1: each
    route's fabric hops spread over the pair's sub-flows (:meth:`~hwmodel.topology.Topology.route_spread`)."""
    def route(a: str, b: str) -> tuple[Edge, ...]:  # (EdgeContext.path: the uncached route)
        return cast(tuple[Edge, ...], topo.route_spread(a, b, subflows))
    clos = topo.constructed_fabric()
    if clos is None:
        return [route(a, b) for a, b in pairs]
    gpu_nodes, nic_of = topo.gpu_nodes(), topo.gpu_nics()  # (GPU -> NIC, the server not made: hwmodel.servers)
    srcs, dsts = list(map(itemgetter(0), pairs)), list(map(itemgetter(1), pairs))
    src_nodes, dst_nodes = list(map(gpu_nodes.get, srcs)), list(map(gpu_nodes.get, dsts))  # (None: not a GPU)
    busy, own_nodes = _nodes_in_full(topo, pairs, own, ends, (src_nodes, dst_nodes))
    # routes leaving / reaching each device (those of devices in busy nodes are not looked at)
    ups, downs = _users(srcs, owners), _users(dsts, owners)
    private, segment = topo.private_ends, topo.end_segment

    def end(g: str, n: Any, leaving: bool) -> tuple[Edge, ...]:
        if n in busy or g in ends or (ups if leaving else downs)[g] != 1:
            return segment(g, leaving)
        if n in own_nodes:
            seg = segment(g, leaving)
            return seg if any(e in own for e in seg) else ()
        return ()

    full = busy | own_nodes  # (end's first test, inlined: most ends are left out)
    # (per merge, not per pair: the nodes whose ends are private, and whether an end is left out)
    privates = {n for n in set(src_nodes).union(dst_nodes) if n is not None and private(n)}
    whole_up, whole_down = _whole_ends(ups, len(srcs), ends, gpu_nodes, full), \
        _whole_ends(downs, len(dsts), ends, gpu_nodes, full)
    # the fabric's hops of every pair between GPUs of two private nodes, in one loop ("" for both NICs:
    # None, as for pairs the fabric does not join; those are searched)
    if not busy and privates.issuperset(src_nodes) and privates.issuperset(dst_nodes):
        # (no pair inside a node or at a device that is not a GPU: every pair's nodes differ)
        nics_a, nics_b = [nic_of[a] for a in srcs], [nic_of[b] for b in dsts]
    else:
        fabric = [na != nb and na in privates and nb in privates
                  for na, nb in zip(src_nodes, dst_nodes, strict=True)]
        nics_a = [nic_of[a] if f else "" for a, f in zip(srcs, fabric, strict=True)]
        nics_b = [nic_of[b] if f else "" for b, f in zip(dsts, fabric, strict=True)]
    hops = cast(list[tuple[Edge, ...] | None], clos.routes_between(nics_a, nics_b, srcs, dsts, subflows))
    if not whole_up and not whole_down and None not in hops:  # (every end left out: the fabric's hops)
        return cast(list[tuple[Edge, ...]], hops)
    out: list[tuple[Edge, ...]] = []
    append = out.append
    for a, b, na, nb, h in zip(srcs, dsts, src_nodes, dst_nodes, hops, strict=True):
        if h is None:
            append(route(a, b))
            continue
        if a in whole_up:
            h = end(a, na, True) + h
        if b in whole_down:
            h = h + end(b, nb, False)
        append(h)
    return out


def _users(devices: list[str], owners: list[int] | None) -> Counter[str]:
    """For :func:`_routes`: device -> how many members' routes leave (or reach) it, as 1 or more than 1:
    each route is its own member without ``owners`` (a route per member and device: the count itself).
    A segment only one member crosses is, by symmetry, loaded as its counterpart on the first member's
    path, however many of that member's routes cross it (a ring's channels)."""
    if owners is None:
        return Counter(devices)
    first: dict[str, int] = {}
    uses: Counter[str] = Counter()
    for d, o in zip(devices, owners, strict=True):
        had = first.setdefault(d, o)
        uses[d] = 1 if had == o and uses.get(d, 1) == 1 else 2
    return uses


def _whole_ends(uses: Counter[str], n: int, ends: set[str], gpu_nodes: dict[str, int], full: set[Any]) -> set[str]:
    """For :func:`_routes`: the devices of ``uses`` (device -> routes leaving it, or reaching it; ``n``
    routes) whose segment is looked at: used by several routes, one of ``ends``, or in a node of
    ``full``. Without a device used twice or a node in full (a mirrored send or ring), ``ends``' only,
    by set operations."""
    if len(uses) == n and not full:
        return ends.intersection(uses)
    return {a for a, k in uses.items() if k != 1 or a in ends or gpu_nodes.get(a) in full}


def _nodes_in_full(topo: Any, pairs: list[tuple[str, str]], own: dict[Edge, float], ends: set[str],
                   nodes: tuple[list[Any], list[Any]] | None = None) -> tuple[set[Any], set[Any]]:
    """For :func:`_routes`: the nodes where some route is not between GPUs of two nodes (every segment
    there in full), and those where an edge of ``own`` may lie on another GPU's segment (each segment
    there compared with ``own``): not the edges of its GPUs' own segments, which the segments of the
    other GPUs of their (private) nodes do not cross. ``nodes``: the node of each pair's source and of
    its destination (None: not a GPU), when the caller has them."""
    gpu_nodes, node_of = topo.gpu_nodes(), topo.device_nodes()  # (no server made on demand: hwmodel.servers)
    if nodes is None:
        nodes = [gpu_nodes.get(a) for a, _ in pairs], [gpu_nodes.get(b) for _, b in pairs]
    busy: set[Any] = set()
    src_nodes, dst_nodes = nodes
    if None not in src_nodes and None not in dst_nodes and not any(map(eq, src_nodes, dst_nodes)):
        pairs = []  # (every pair between GPUs of two nodes: no node is busy)
    for (a, b), na, nb in zip(pairs, *nodes, strict=False):
        if na is None or nb is None or na == nb:
            busy.add(node_of.get(a) if na is None else na)
            busy.add(node_of.get(b) if nb is None else nb)
    own_rest = set(own)
    for g in ends:
        n = gpu_nodes.get(g)
        if n is not None and n not in busy and topo.private_ends(n):
            own_rest.difference_update(topo.end_segment(g, True))
            own_rest.difference_update(topo.end_segment(g, False))
    own_nodes = set()  # (a segment's edges join devices of its node: a NIC's link to its leaf is not one)
    for u, v in own_rest:
        n = node_of[u]
        if n is not None and node_of[v] == n:
            own_nodes.add(n)
    return busy, own_nodes


def _sends_kept(engine: NcclEngine, mirrors: list[Plan], own: dict[Edge, float],
                ends: set[str]) -> dict[Edge, float] | None:
    """The kept edge weights of :func:`merged_weights` when every mirror is a send (``PointToPoint.flows``:
    one flow, fraction 1, over the route between its GPUs) of one protocol weight, each route crossing an
    edge at most once; None otherwise (the caller lays the flows out). Each mirror adds
    ``x = 1.0 * proto_w / eff`` to every edge of its route, so the per-edge loop only counts the mirrors
    on each edge; the weights -- the same floats, added in the same order as the general merge adds them
    (``own``'s, then ``x`` once per mirror, left to right) -- are summed only for the edges kept."""
    proto_w = _sends_weight(engine, mirrors)
    if proto_w is None:
        return None
    return _pairs_kept(engine, proto_w, [(p.gpus[0], p.gpus[1]) for p in mirrors], own, ends)


def _sends_weight(engine: NcclEngine, plans: Iterable[Plan]) -> float | None:
    """The one protocol weight of ``plans`` when all are sends (``p2p``) of that weight (the first's
    protocol and correction, or another with the same weight); None otherwise."""
    first, *rest = plans
    proto_w = engine.proto_weight(first)
    for p in (first, *rest):
        if p.op != "p2p" or p.algorithm != "p2p" or (
                (p.protocol != first.protocol or p.busbw_correction != first.busbw_correction)
                and engine.proto_weight(p) != proto_w):
            return None
    return proto_w


def _pairs_kept(engine: NcclEngine, proto_w: float, pairs: list[tuple[str, ...]], own: dict[Edge, float],
                ends: set[str]) -> dict[Edge, float] | None:
    """:func:`_sends_kept` of sends between ``pairs`` (source, destination) of protocol weight ``proto_w``."""
    routes = _routes(engine.cluster.topology, pairs, own, ends)  # type: ignore[arg-type]
    if not all(routes) or list(map(len, map(set, routes))) != list(map(len, routes)):
        return None  # (a route that is empty or crosses an edge twice; by map: a thousand routes a merge)
    counts: Counter[Edge] = Counter()  # (first use order, as the edge-by-edge loop: a dict)
    counts.update(chain.from_iterable(routes))
    adj = engine.cluster.topology.link_rows()
    x_of_kind: dict[str, float] = {}
    efficiency: dict[str, float] = {}

    def x_of(e: Edge) -> float:
        kind = adj[e[0]][e[1]].get("kind", "")
        x = x_of_kind.get(kind)
        if x is None:
            eff = efficiency[kind] = efficiency.get(kind) or engine.link_efficiency_of_kind(kind)
            x = x_of_kind[kind] = 1.0 * proto_w / eff
        return x

    kept: dict[Edge, float] = {}
    for e, w in own.items():
        k = counts.get(e, 0)
        if k:
            x = x_of(e)
            for _ in range(k):
                w = w + x
        kept[e] = w
    switches = _fabric_switches(engine)
    for e, k in counts.items():
        if k == 1:  # (most edges: one mirror's NIC link, dropped, or a fabric link, kept)
            u, v = e
            if ((u in switches and v in switches) or u in ends or v in ends) and e not in own:
                kept[e] = x_of(e)
        elif e not in own:
            w = x = x_of(e)
            for _ in range(k - 1):
                w = w + x
            kept[e] = w
    return kept


def _fabric_switches(engine: NcclEngine) -> frozenset[str] | dict[str, None]:
    """The cluster's fabric switches (``ib_switch`` devices), to test an edge's ends by membership: the
    constructed fabric's own list, else every device of that kind (a user's topology, built whole)."""
    topo = engine.cluster.topology
    clos = topo.constructed_fabric()
    if clos is not None:
        return clos.switches
    return dict.fromkeys(topo.nodes_of_kind("ib_switch"))


def merged_weights(engine: NcclEngine, members: list[Plan], own: dict[Edge, float],
                   ends: set[str], subflows: int | None = None) -> dict[Resource, float]:
    """Link weights of ``members`` (one plan and its mirrors) merged into one activity: weights added per
    link, in order of first use. ``own``: the first member's edge weights
    (:meth:`~hwmodel.nccl.engine.NcclEngine.edge_weights`). Kept: the first member's links, links
    several members share (leaf uplinks, spines), links between fabric switches even with one user (a
    mirror may cross a spine where the first member stays under its leaf: a scalable-unit or pod
    boundary between them), and links that start or end at one of ``ends`` (the
    representative's GPUs: a ring's send into it from the previous rank). A link only one mirror uses is,
    by symmetry, loaded exactly like its counterpart on the first member's path: it adds no constraint.
    Only kept links get a resource: one per class of links the merges load alike
    (:meth:`hwmodel.link_classes.LinkClasses.resolve`), or the link's own where anything else uses it.
    The mirrors' routes are laid out only as far as the merge needs them (:func:`_routes`). ``subflows``:
    the sub-flows of each NIC pair's traffic (default: :func:`hwmodel.ecmp.plan_subflows` of the first
    member, as ``own`` was laid out; sends are one flow)."""
    if subflows is None:
        subflows = _ecmp.plan_subflows(engine, members[0])
    if len(members) > 1 and subflows == 1:  # (sends spread by adaptive routing: laid out below)
        sends = _sends_kept(engine, members[1:], own, ends)
        if sends is not None:
            return engine.cluster.link_classes.resolve(sends)
    rec = _Recorder(engine, subflows)
    laid: list[tuple[Plan, Any]] = []
    owners: list[int] = []
    for i, p in enumerate(members[1:]):
        laid.append((p, _algorithms.get(p.algorithm).flows(rec, p.op, p.gpus, p.root)))  # type: ignore[arg-type]
        owners.extend([i] * (len(rec.pairs) - len(owners)))
    routes = _routes(engine.cluster.topology, rec.pairs, own, ends, subflows, owners)
    efficiency: dict[str, float] = {}
    weights: dict[Edge, float] = dict(own)
    shared: set[Edge] = set()  # edges several members use
    for p, flows in laid:
        paths = [(f.frac, _resolved(cast(tuple[int, ...], f.path), routes)) for f in flows]
        _add_edge_weights(engine, p, paths, efficiency, weights, shared, _ecmp.spreads(subflows))
    switches = _fabric_switches(engine)
    kept: dict[Edge, float] = {}
    for e, x in weights.items():
        u, v = e
        if e in own or e in shared or (u in switches and v in switches) or u in ends or v in ends:
            kept[e] = x
    return engine.cluster.link_classes.resolve(kept)


def _resolved(path: tuple[int, ...], routes: list[tuple[Edge, ...]]) -> tuple[Edge, ...]:
    """A :class:`_Recorder` path (placeholders, concatenated) as the edges of its routes."""
    if len(path) == 1:
        return routes[path[0]]
    return tuple(chain.from_iterable(routes[i] for i in path))


def merged_sends(engine: NcclEngine, plan: Plan, pairs: list[tuple[str, ...]]) -> list[_MergedGroup] | None:
    """The merged groups (:meth:`~hwmodel.nccl.engine.NcclEngine._merged_groups`) of the send ``plan`` and
    its mirrors, a send of the same size between each ``(source, destination)`` of ``pairs``, without a
    plan per mirror: ``plan_p2p`` plans a send by its size and by whether its two GPUs share a node, so
    one plan of each kind stands for the mirrors of that kind (a pipeline send on 16,384 GPUs has 1,023
    mirrors). None where the members would not be one group of sends of one protocol weight (a mirror
    inside a node with a latency of its own, say): the caller then plans every mirror."""
    if _ecmp.plan_subflows(engine, plan) != 1:  # (adaptive routing spreads each send: the general merge)
        return None
    node_of, size = engine._node_of, plan.size_bytes
    local = list(map(eq, map(node_of.__getitem__, map(itemgetter(0), pairs)),
                     map(node_of.__getitem__, map(itemgetter(1), pairs))))  # (by map: a thousand mirrors)
    if not local:
        return None
    kinds = {same: engine.plan_p2p(pairs[i][0], pairs[i][1], size)
             for same, i in ((same, local.index(same)) for same in dict.fromkeys(local))}
    work = engine._work(plan)
    group = (work, plan.latency_s, plan.rate_bound_Bps)
    if any((engine._work(p), p.latency_s, p.rate_bound_Bps) != group for p in kinds.values()):
        return None
    proto_w = _sends_weight(engine, [kinds[local[0]], *kinds.values()])
    if plan.op != "p2p" or plan.algorithm != "p2p" or proto_w is None:
        return None
    side = dict(engine._flow(plan)[2])  # (its links' classes first: the merge adds to them)
    kept = _pairs_kept(engine, proto_w, pairs, engine.edge_weights(plan), set(plan.gpus))
    if kept is None:
        return None
    return [(work, plan.latency_s, plan.rate_bound_Bps, engine.cluster.link_classes.resolve(kept), side, True)]
