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

from typing import TYPE_CHECKING, Any, cast

from hwmodel.fluid import Resource
from hwmodel.nccl import algorithms as _algorithms

if TYPE_CHECKING:
    from hwmodel.nccl.engine import NcclEngine, Plan

Edge = tuple[str, str]


class EdgeContext:
    """The engine's flow context (:class:`hwmodel.nccl.algorithms.base.FlowContext`) with ``path``
    returning topology edges, not link resources; routes are not cached (a mirror's route is asked once
    per merged group)."""

    def __init__(self, engine: NcclEngine) -> None:
        self._engine = engine
        self._topo = engine.cluster.topology

    def path(self, a: str, b: str) -> tuple[Edge, ...]:
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
    as ``engine._link_weights(plan)`` gives per link resource. ``efficiency``: a cache, edge kind -> NCCL's
    link efficiency (:meth:`NcclEngine.link_efficiency_of_kind`)."""
    out: dict[Edge, float] = {}
    _add_edge_weights(engine, ctx, plan, efficiency, out, None)
    return out


def _add_edge_weights(engine: NcclEngine, ctx: EdgeContext, plan: Plan, efficiency: dict[str, float],
                      into: dict[Edge, float], shared: set[Edge] | None) -> None:
    """:func:`edge_weights` of ``plan`` added into ``into`` edge by edge (each new edge appended, as a
    dict update would), without the intermediate dict: a merge adds thousands of mirrors' weights.
    ``shared``: where given, the edges ``into`` already had (used by an earlier member) are added to it."""
    proto_w = engine.proto_weight(plan)
    flows = _algorithms.get(plan.algorithm).flows(ctx, plan.op, plan.gpus, plan.root)  # type: ignore[arg-type]
    path = cast(tuple[Edge, ...], flows[0].path) if len(flows) == 1 else ()
    if flows and path and flows[0].frac == 1.0 and len(set(path)) == len(path):
        per_byte: dict[Edge, float] | tuple[Edge, ...] = path  # (a send: each edge once, 0.0 + 1.0 == 1.0)
    else:
        per_byte = {}
        for f in flows:
            frac = f.frac
            for e in cast(tuple[Edge, ...], f.path):  # (EdgeContext's paths: edges)
                per_byte[e] = per_byte.get(e, 0.0) + frac
    adj = engine.cluster.topology.graph._adj  # (networkx's plain successor dicts: off its views)
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


def _sends_kept(engine: NcclEngine, ctx: EdgeContext, mirrors: list[Plan], own: dict[Edge, float],
                ends: set[str]) -> dict[Edge, float] | None:
    """The kept edge weights of :func:`merged_weights` when every mirror is a send (``PointToPoint.flows``:
    one flow, fraction 1, over the route between its GPUs) of one protocol weight, each route crossing an
    edge at most once; None otherwise (the caller lays the flows out). Each mirror adds
    ``x = 1.0 * proto_w / eff`` to every edge of its route, so the per-edge loop only counts the mirrors
    on each edge; the weights -- the same floats, added in the same order as the general merge adds them
    (``own``'s, then ``x`` once per mirror, left to right) -- are summed only for the edges kept."""
    proto_w = engine.proto_weight(mirrors[0])
    counts: dict[Edge, int] = {}
    get = counts.get
    for p in mirrors:
        if p.op != "p2p" or p.algorithm != "p2p" or engine.proto_weight(p) != proto_w:
            return None
        path = ctx.path(p.gpus[0], p.gpus[1])
        if not path or len(set(path)) != len(path):
            return None
        for e in path:
            counts[e] = get(e, 0) + 1
    adj = engine.cluster.topology.graph._adj
    kinds = engine.cluster.topology.device_kinds()
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
    for e, k in counts.items():
        if e in own:
            continue
        u, v = e
        if k > 1 or kinds[u] == kinds[v] == "ib_switch" or u in ends or v in ends:
            w = x = x_of(e)
            for _ in range(k - 1):
                w = w + x
            kept[e] = w
    return kept


def merged_weights(engine: NcclEngine, members: list[Plan], own: dict[Edge, float],
                   ends: set[str]) -> dict[Resource, float]:
    """Link weights of ``members`` (one plan and its mirrors) merged into one activity: weights added per
    link, in order of first use. ``own``: the first member's edge weights
    (:meth:`~hwmodel.nccl.engine.NcclEngine.edge_weights`). Kept: the first member's links, links
    several members share (leaf uplinks, spines), links between fabric switches even with one user (a
    mirror may cross a spine where the first member stays under its leaf: a scalable-unit or pod
    boundary between them), and links that start or end at one of ``ends`` (the
    representative's GPUs: a ring's send into it from the previous rank). A link only one mirror uses is,
    by symmetry, loaded exactly like its counterpart on the first member's path: it adds no constraint.
    Only kept links get a resource: one per class of links the merges load alike
    (:meth:`hwmodel.link_classes.LinkClasses.resolve`), or the link's own where anything else uses it."""
    ctx = EdgeContext(engine)
    if len(members) > 1:
        sends = _sends_kept(engine, ctx, members[1:], own, ends)
        if sends is not None:
            return engine.cluster.link_classes.resolve(sends)
    efficiency: dict[str, float] = {}
    weights: dict[Edge, float] = dict(own)
    shared: set[Edge] = set()  # edges several members use
    for p in members[1:]:
        _add_edge_weights(engine, ctx, p, efficiency, weights, shared)
    kinds = engine.cluster.topology.device_kinds()
    kept: dict[Edge, float] = {}
    for e, x in weights.items():
        u, v = e
        if e in own or e in shared or kinds[u] == kinds[v] == "ib_switch" or u in ends or v in ends:
            kept[e] = x
    return engine.cluster.link_classes.resolve(kept)
