"""Links that no solver can tell apart, as one fluid resource: the link classes of mirrored traffic.

A collective or send merged with its symmetric mirrors (:mod:`hwmodel.nccl.mirrors`) loads every
leaf-spine (and spine-core) link its mirrors cross: thousands of links on a 16,384-GPU cluster, each
a constraint the max-min solver re-reads and a byte counter and timeline the engine updates at every
rate change of the activity. Yet most of those links are interchangeable. Two links are *equivalent*
when they have the same capacity and edge kind and every activity that loads one loads the other with
the same weight: their constraints ``sum_a w[a] x_a <= C`` are then the same inequality, so their
loads, byte counters and timelines are equal at every instant and the max-min rates (and the
bottleneck the solver picks: one resource per class carries the lowest index of its links) do not
depend on whether the solver sees one of them or all. A :class:`LinkClass` is such a set of links and
its one :class:`~hwmodel.maxmin.Resource`, the *representative* (same capacity, same weight: no
scaling is needed, so shares are computed on the same floats).

The partition is refined as merged weights arrive: :meth:`LinkClasses.resolve` takes one merge's
``edge -> weight`` and splits every class whose links it loads unevenly (or only in part) into classes
that it loads evenly. A split may happen while activities run on the class: the new representative is a
copy of the old one's state (load, bytes, timeline, users, rate classes: :func:`duplicate_resource`), so
it is the same constraint until loads diverge, and every cached merge that uses the old one gets the new
one with the same weight. A link that anything else uses -- a route of the representative ranks' own
traffic, a test reading ``cluster.links[e]`` -- is *pinned*: split out into its own resource first
(:meth:`LinkClasses.pin`), so a class is only ever loaded through merges. The classes depend on the ECMP
hash (which spine each mirror's flow takes): at 16,384 H100 the merges of Llama 3 405B (TP 8 x PP 16,
hierarchical engine) load 39,972 links that fall into 764 classes (2,048 H100: 4,194 links, 157).

The links report lists every link of a class under its own name with the class's bytes and timeline
(:class:`LinkView`), which are that link's own: nothing in a report changes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from hwmodel.fluid import Activity, FluidSystem, Resource

Edge = tuple[str, str]


class LinkClass:
    """Equivalent links (``edges``, ascending edge index) and their representative resource; ``merges``:
    the cached merged weight dicts that use the representative (a split adds the new one to each)."""

    __slots__ = ("rep", "edges", "merges")

    def __init__(self, rep: Resource, edges: list[Edge]) -> None:
        self.rep = rep
        self.edges = edges
        self.merges: list[dict[Resource, float]] = []


class _ClassLoad:
    """What every link of a class shares, read from the class's representative resource ``_rep``: its bytes
    (``carried``), ``timeline`` and capacities."""

    __slots__ = ()
    _rep: Resource

    @property
    def carried(self) -> float:
        return self._rep.carried

    @property
    def timeline(self) -> list[tuple[float, float]]:
        return self._rep.timeline

    @property
    def nominal_capacity(self) -> float:
        return self._rep.nominal_capacity

    @property
    def capacity(self) -> float:
        return self._rep.capacity


class LinkView(_ClassLoad):
    """One link of a class in the links report: its own name and edge index, the class's bytes
    (``carried``), ``timeline`` and capacities (equal for every link of the class)."""

    __slots__ = ("name", "index", "meta", "_rep")

    def __init__(self, name: str, index: int, meta: tuple, rep: Resource) -> None:
        self.name, self.index, self.meta, self._rep = name, index, meta, rep

    def utilisation(self) -> list[tuple[float, float]]:
        return self._rep.utilisation()


class LinkBundle(_ClassLoad):
    """All links of a class in the links report as one row source: ``count`` links named ``names()``,
    each with the class's bytes (``carried``), ``timeline`` and capacities (equal for every link of the
    class); ``name``: the first of ``names()`` in string order, the one a report sorted by name meets
    first. A report that ranks links by load needs one entry per class, not one per link: at 16,384
    GPUs 39,158 class links are 764 bundles."""

    __slots__ = ("name", "count", "_edges", "_rep")

    def __init__(self, edges: list[Edge], rep: Resource) -> None:
        self._edges, self._rep, self.count = edges, rep, len(edges)
        self.name = min(f"{u}->{v}" for u, v in edges)

    def names(self) -> list[str]:
        """Every link's name, in the class's order (ascending edge index)."""
        return [f"{u}->{v}" for u, v in self._edges]

    @property
    def meta(self) -> tuple:
        return self._rep.meta  # type: ignore[return-value]


class LinkClasses:
    """The partition of a cluster's merge-only links into classes (see the module doc).

    Args:
        fs: the cluster's fluid system.
        adj: device -> {successor: link attributes} (``bandwidth_Bps``, ``kind``; read only):
            :meth:`hwmodel.topology.Topology.link_rows`.
        edge_index: a link's solver tie-break index (its position in topology edge order).
        pinned: the link resources made for single use (:attr:`hwmodel.cluster.Cluster.links`).
        link: the cluster's link resource of an edge (made, pinned, on first use).
        enabled: False keeps every link its own resource (the reference the classes are tested against).
    """

    def __init__(self, fs: FluidSystem, adj: Mapping[str, Mapping[str, dict[str, Any]]],
                 edge_index: Callable[[Edge], int], pinned: Mapping[Edge, Resource], link: Callable[[Edge], Resource],
                 enabled: bool = True) -> None:
        self._fs, self._adj, self._edge_index, self._pinned = fs, adj, edge_index, pinned
        self._link, self.enabled = link, enabled
        self._class_of: dict[Edge, LinkClass] = {}
        self._class_by_rep: dict[Resource, LinkClass] = {}
        self._waiting: list[Activity] = []  # merged activities started while paying their latency

    def __contains__(self, edge: object) -> bool:
        return edge in self._class_of

    def resolve(self, weights: dict[Edge, float]) -> dict[Resource, float]:
        """One merge's ``edge -> weight`` as ``resource -> weight`` (representatives in order of first
        use; a pinned link is its own resource), after splitting the classes it loads unevenly. The
        result is registered: later splits keep it up to date, so it may be cached and started again."""
        if not self.enabled:
            return {self._link(e): w for e, w in weights.items()}
        by_class: dict[LinkClass, dict[float, list[Edge]]] = {}
        fresh: dict[tuple[float, str, float], list[Edge]] = {}
        adj, class_of, pinned = self._adj, self._class_of, self._pinned
        for e, w in weights.items():
            if e in pinned:
                continue
            k = class_of.get(e)
            if k is None:
                data = adj[e[0]][e[1]]
                fresh.setdefault((float(data["bandwidth_Bps"]), data.get("kind", ""), w), []).append(e)
            else:
                by_class.setdefault(k, {}).setdefault(w, []).append(e)
        for k, groups in by_class.items():
            untouched = len(k.edges) - sum(len(g) for g in groups.values())
            parts = list(groups.values())
            if untouched == 0:  # the first part keeps the class; the others split off
                parts = parts[1:]
            for part in parts:
                self._split(k, part)
        for (_, kind, _), edges in fresh.items():
            edges.sort(key=self._edge_index)
            u, v = edges[0]
            data = adj[u][v]
            rep = self._fs.add_resource(f"{u}->{v}", float(data["bandwidth_Bps"]), meta=("link", u, v, kind))
            rep.index = self._edge_index(edges[0])
            k = LinkClass(rep, edges)
            self._class_by_rep[rep] = k
            for e in edges:
                class_of[e] = k
        out: dict[Resource, float] = {}
        for e, w in weights.items():
            r = pinned[e] if e in pinned else class_of[e].rep
            if r not in out:
                out[r] = w
        by_rep = self._class_by_rep
        for r in out:
            k2 = by_rep.get(r)
            if k2 is not None:
                k2.merges.append(out)
        return out

    def pin(self, edge: Edge) -> Resource:
        """``edge`` taken out of its class, as a resource of its own with the class's state (the
        caller keeps it as the link's resource)."""
        k = self._class_of.pop(edge)
        if len(k.edges) == 1:
            del self._class_by_rep[k.rep]
            _rename(k.rep, edge, self._edge_index(edge))
            return k.rep
        return self._split(k, [edge], pinned=True).rep

    def edges_of(self, r: Resource) -> list[Edge]:
        """The links resource ``r`` stands for: its class's, or its own link."""
        k = self._class_by_rep.get(r)
        return list(k.edges) if k is not None else [(r.meta[1], r.meta[2])]  # type: ignore[index]

    def track(self, act: Activity) -> None:
        """``act`` was started with a registered merge and pays its latency: a split before it joins
        must give it the new representative too."""
        if act.active_time is None:
            if len(self._waiting) >= 1024:
                self._waiting = [a for a in self._waiting if a.active_time is None and a.end_time is None]
            self._waiting.append(act)

    def views(self) -> list[LinkView]:
        """Every link of every class, as :class:`LinkView` (the links report's view of it)."""
        out = []
        for e, k in self._class_of.items():
            u, v = e
            out.append(LinkView(f"{u}->{v}", self._edge_index(e), ("link", u, v, k.rep.meta[3]), k.rep))  # type: ignore[index]
        return out

    def bundles(self) -> list[LinkBundle]:
        """Every class as one :class:`LinkBundle` (its links' view as a group), in representative index
        order: what :meth:`views` lists link by link."""
        return [LinkBundle(k.edges, r) for r, k in sorted(self._class_by_rep.items(), key=lambda rk: rk[0].index)]

    def _split(self, k: LinkClass, part: list[Edge], pinned: bool = False) -> LinkClass:
        """Move the links ``part`` of ``k`` into a new class whose representative duplicates ``k``'s."""
        gone = set(part)
        k.edges = [e for e in k.edges if e not in gone]
        part = sorted(part, key=self._edge_index)
        old = k.rep
        _rename(old, k.edges[0], self._edge_index(k.edges[0]))
        self._waiting = [a for a in self._waiting if a.active_time is None and a.end_time is None]
        new = duplicate_resource(self._fs, old, part[0], self._edge_index(part[0]), self._waiting)
        for merge in k.merges:
            merge[new] = merge[old]
        nk = LinkClass(new, part)
        nk.merges = list(k.merges)
        if not pinned:
            self._class_by_rep[new] = nk
            for e in part:
                self._class_of[e] = nk
        return nk


def _rename(r: Resource, edge: Edge, index: int) -> None:
    """A representative named after (and tie-broken as) the first link of its class."""
    u, v = edge
    r.name = f"{u}->{v}"
    r.meta = ("link", u, v, r.meta[3])  # type: ignore[index]
    r.index = index


def duplicate_resource(fs: FluidSystem, old: Resource, edge: Edge, index: int,
                       waiting: list[Activity]) -> Resource:
    """A new resource of ``fs`` that is ``old``'s constraint again: same capacity, load, bytes so far and
    timeline, the same weight in every activity and rate class that uses ``old`` (active ones and the
    ``waiting`` ones, paying their latency). Rates are unchanged (a constraint repeated), so nothing is
    re-solved. It reaches into the engine's state (:class:`~hwmodel.fluid.FluidSystem`'s classes by key):
    a class's key names its resources, so it is re-keyed with the new one where new activities from the
    updated merges will look it up."""
    u, v = edge
    new = fs.add_resource(f"{u}->{v}", old.nominal_capacity, meta=("link", u, v, old.meta[3]))  # type: ignore[index]
    new.index = index
    new.capacity, new.load, new.side_load, new.carried = old.capacity, old.load, old.side_load, old.carried
    new._accounted_at_s, new.timeline, new.bottleneck = old._accounted_at_s, list(old.timeline), old.bottleneck
    for a, w in old.users.items():
        new.users[a] = w
        a.weights = (*a.weights, (new, w))
    for a in waiting:
        for r, w in a.weights:
            if r is old:
                a.weights = (*a.weights, (new, w))
                a._class_key = (*a._class_key[:-1], new, a._class_key[-1])
                break
    classes = fs._classes
    for c, w in old.classes.items():
        new.classes[c] = w
        c.weights[new] = w
        del classes[c.key]
        c.key = (*c.key[:-1], new, c.key[-1])
        classes[c.key] = c
        for m in c.members:
            m._class_key = c.key
    fs._spare_classes.clear()  # (their keys name ``old`` alone: no activity will ask for them again)
    if old in fs._dirty_resources:
        fs._dirty_resources[new] = None
    return new
