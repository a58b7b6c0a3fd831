"""Routes by construction on structured clusters, so that routing costs O(hops), not a graph search.

:class:`hwmodel.topology.Topology` routes by reverse Dijkstra (shortest routing cost, ECMP ties broken by
a CRC32 hash over the sorted equal-cost next hops). On the clusters :mod:`hwmodel.fabric` builds, the
search over the fabric touches every NIC of the cluster once per destination, so routing the mirrored
point-to-point traffic of a large cluster cost O(NICs) per route (issue 14: 75 % of the wall time at
4,096 GPUs). This module gives the SAME routes from the structure instead:

- :class:`ClosRoutes`, the fabric between two NICs when the fabric is a two-level Clos (rail-optimised
  or plain fat tree), a three-level one (below), or a single switch: every NIC has exactly one fabric
  switch (its leaf), switches
  are leaves (with NICs) and spines (without), every leaf is joined both ways to every spine and to
  nothing else, and every fabric link has the same routing cost. Then a route is ``nic -> leaf -> nic``
  on one leaf, else ``nic -> leaf -> spine -> leaf -> nic`` with the spine chosen among ALL spines,
  sorted by name, by the same hash the search uses at the source leaf (every spine is at the same
  distance from the destination leaf, so all are equal-cost next hops; the other hops are unique).
  :meth:`ClosRoutes.detect` checks these conditions on the graph itself, so a user's topology file
  that has this shape is routed the same way, and any other shape keeps the graph search.
  *Three levels* (leaf / spine / core): leaves with the same spines form a pod, a pod's spines join
  exactly its leaves and some cores, and every core joins exactly one spine of every pod (fat-tree
  planes). Between pods the route is ``nic -> leaf -> spine -> core -> spine -> leaf -> nic``: the
  search's hash picks the spine among the source pod's (at the source leaf) and the core among that
  spine's (at the spine); the core's spine in the destination pod and the rest are unique.
- :class:`NodeClasses`, node-local segments (GPU <-> NIC, GPU <-> GPU) searched once per *equivalence
  class* of nodes: nodes whose devices, named ``n{i}.<local>``, have the same local names, kinds and
  routing costs between them route alike, so a segment found in the class's first node is renamed for
  the others. Only segments without an ECMP choice are shared (a tie-break hashes the global names).
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from itertools import chain, compress, repeat
from operator import eq
from typing import Any, cast

from hwmodel.ecmp import ADAPTIVE, RouteElement, Spread, combine, subflow_hkey

Edge = tuple[str, str]


class ClosRoutes:
    """Constructed NIC-to-NIC routes over a two- or three-level Clos or a single switch (see the module
    docstring).

    Args:
        leaf_of: NIC -> its leaf switch.
        spines: spine switch names, sorted (the search's order of equal-cost next hops). On a three-tier
            Clos: leaf -> its pod's spines, sorted.
        cores: three tiers only: spine -> its cores (its plane), sorted; and ``spine_to_pod``: (core,
            pod) -> the one spine of that pod below the core (``pod_of``: leaf -> pod).
    """

    def __init__(self, leaf_of: dict[str, str], spines: tuple[str, ...] | dict[str, tuple[str, ...]],
                 cores: dict[str, tuple[str, ...]] | None = None,
                 spine_to_pod: dict[tuple[str, int], str] | None = None,
                 pod_of: dict[str, int] | None = None) -> None:
        self.leaf_of = leaf_of
        self.spines = spines
        self.cores = cores
        self.spine_to_pod = spine_to_pod or {}
        self.pod_of = pod_of or {}
        # (routes_between's shared edge tuples: NIC -> its edge to / from its leaf; leaf -> its edges to /
        # from each spine, in the order of ``spines``)
        self._nic_up: dict[str, Edge] = {}
        self._nic_down: dict[str, Edge] = {}
        self._leaf_up: dict[str, tuple[Edge, ...]] = {}
        self._leaf_down: dict[str, tuple[Edge, ...]] = {}
        self._spread_memo: dict[tuple, Any] = {}
        self._switches: frozenset[str] | None = None

    @property
    def switches(self) -> frozenset[str]:
        """Every switch of the fabric: its leaves, spines and cores (found once)."""
        if self._switches is None:
            spines = self.spines
            found = set(self.leaf_of.values()).union(
                spines if isinstance(spines, tuple) else chain.from_iterable(spines.values()))
            self._switches = frozenset(found.union(*(self.cores or {}).values()))
        return self._switches

    @classmethod
    def detect(cls, kinds: dict[str, str], succ_cost: dict[str, dict[str, float]],
               pred_cost: dict[str, dict[str, float]]) -> ClosRoutes | None:
        """The constructed router of this fabric, or None when its shape is not the one handled.

        ``kinds``: device -> kind; ``succ_cost`` / ``pred_cost``: device -> {neighbour: routing cost}
        of its out-going / in-coming links. O(fabric links), once per topology.
        """
        switches = [n for n, k in kinds.items() if k == "ib_switch"]
        if not switches:
            return None
        costs: set[float] = set()
        leaf_of = _leaf_of(kinds, succ_cost, pred_cost, costs)
        if leaf_of is None:
            return None
        leaves = set(leaf_of.values())
        nbrs = _switch_neighbours(switches, leaves, kinds, succ_cost, pred_cost, costs)
        if nbrs is None or len(costs) > 1:
            return None
        spine_set = set().union(*(nbrs[leaf] for leaf in leaves)) if leaves else set()
        if spine_set & leaves:
            return None
        if spine_set | leaves == set(switches):
            spines = sorted(spine_set)
            if any(nbrs[sw] != (spine_set if sw in leaves else leaves) for sw in switches):
                return None
            return cls(leaf_of, tuple(spines))
        return cls._three_tier(leaf_of, leaves, spine_set, set(switches) - leaves - spine_set, nbrs)

    @classmethod
    def _three_tier(cls, leaf_of: dict[str, str], leaves: set[str], spines: set[str], cores: set[str],
                    nbrs: dict[str, set[str]]) -> ClosRoutes | None:
        """Pods (leaves with the same spines; a pod's spines join exactly its leaves and some cores), each
        core joined to exactly one spine of every pod and to nothing else; else None."""
        pods: dict[frozenset[str], int] = {}
        pod_of: dict[str, int] = {}
        for leaf in sorted(leaves):
            pod_of[leaf] = pods.setdefault(frozenset(nbrs[leaf]), len(pods))
        members: dict[int, set[str]] = {}
        for leaf, p in pod_of.items():
            members.setdefault(p, set()).add(leaf)
        spine_pod: dict[str, int] = {}
        for key, p in pods.items():
            for sp in key:
                if sp in spine_pod:  # a spine shared by two pods
                    return None
                spine_pod[sp] = p
        up: dict[str, tuple[str, ...]] = {}
        for sp in spines:
            below = nbrs[sp] & leaves
            if below != members[spine_pod[sp]] or not (nbrs[sp] - below) or not (nbrs[sp] - below) <= cores:
                return None
            up[sp] = tuple(sorted(nbrs[sp] - below))
        down: dict[tuple[str, int], str] = {}
        for c in cores:
            if not nbrs[c] <= spines:
                return None
            seen = sorted(spine_pod[sp] for sp in nbrs[c])
            if seen != list(range(len(pods))):  # exactly one spine of every pod
                return None
            for sp in nbrs[c]:
                down[(c, spine_pod[sp])] = sp
        return cls(leaf_of, {leaf: tuple(sorted(nbrs[leaf])) for leaf in leaves}, up, down, pod_of)

    def route(self, a: str, b: str, hkey: str) -> list[Edge] | None:
        """Links from NIC ``a`` to NIC ``b`` (``a != b``), the tie-break hashing ``hkey`` as the search
        does; None when either end is not a NIC of this fabric or the leaves have no spine between."""
        la, lb = self.leaf_of.get(a), self.leaf_of.get(b)
        if la is None or lb is None:
            return None
        if la == lb:
            return [(a, la), (la, b)]
        spines = self.spines if isinstance(self.spines, tuple) else self.spines[la]
        s = _pick(spines, hkey, la)
        if s is None:
            return None
        if self.cores is None or self.pod_of[la] == self.pod_of[lb]:
            return [(a, la), (la, s), (s, lb), (lb, b)]
        c = _pick(self.cores[s], hkey, s)
        assert c is not None
        t = self.spine_to_pod[(c, self.pod_of[lb])]
        return [(a, la), (la, s), (s, c), (c, t), (t, lb), (lb, b)]

    def route_between(self, a: str, b: str, src: str, dst: str) -> tuple[Edge, ...] | None:
        """:meth:`route` with ``hkey = f"{src}|{dst}"`` (the route from device ``src`` to ``dst``), as a
        tuple; None also when ``a == b``. One string is hashed per ECMP choice, nothing else is built:
        a merge asks it once per mirror."""
        if a == b:
            return None
        la, lb = self.leaf_of.get(a), self.leaf_of.get(b)
        if la is None or lb is None:
            return None
        if la == lb:
            return ((a, la), (la, b))
        spines = self.spines if isinstance(self.spines, tuple) else self.spines[la]
        n = len(spines)
        if n == 0:
            return None
        s = spines[0] if n == 1 else spines[zlib.crc32(f"{src}|{dst}|{la}".encode()) % n]
        if self.cores is None or self.pod_of[la] == self.pod_of[lb]:
            return ((a, la), (la, s), (s, lb), (lb, b))
        cores = self.cores[s]
        c = cores[0] if len(cores) == 1 else cores[zlib.crc32(f"{src}|{dst}|{s}".encode()) % len(cores)]
        t = self.spine_to_pod[(c, self.pod_of[lb])]
        return ((a, la), (la, s), (s, c), (c, t), (t, lb), (lb, b))

    def spread_between(self, a: str, b: str, src: str, dst: str,
                       subflows: int) -> tuple[RouteElement, ...] | None:
        """:meth:`route_between` of a pair whose traffic is ``subflows`` sub-flows (:mod:`hwmodel.ecmp`):
        sub-flow ``j`` hashes :func:`~hwmodel.ecmp.subflow_hkey` as the search would, and the hops where they part are
        one :class:`~hwmodel.ecmp.Spread`. ``subflows <= 1``: :meth:`route_between` itself;
        :data:`~hwmodel.ecmp.ADAPTIVE`: :meth:`adaptive_between`."""
        if subflows == ADAPTIVE:
            return self.adaptive_between(a, b)
        if subflows <= 1:
            return self.route_between(a, b, src, dst)
        if self.cores is not None and isinstance(self.spines, dict):  # (one loop for one pair or a merge's many)
            return self._spreads_three_tier([a], [b], [src], [dst], subflows)[0]
        if a == b:
            return None
        routes = []
        for j in range(subflows):
            r = self.route(a, b, subflow_hkey(src, dst, j))
            if r is None:
                return None
            routes.append(r)
        return combine(routes)

    def adaptive_between(self, a: str, b: str) -> tuple[RouteElement, ...] | None:
        """The route from NIC ``a`` to NIC ``b`` under adaptive routing (:data:`hwmodel.ecmp.ADAPTIVE`):
        their leaf links and, between two leaves, one :class:`~hwmodel.ecmp.Spread` of every equal-cost
        path's hops, each path an equal share (through each spine of the leaf's pod, and on three tiers
        each core of that spine to the destination pod's spine below it); kept per pair of leaves. None
        as :meth:`route_between`."""
        if a == b:
            return None
        la, lb = self.leaf_of.get(a), self.leaf_of.get(b)
        if la is None or lb is None:
            return None
        ea, eb = self._nic_up.setdefault(a, (a, la)), self._nic_down.setdefault(b, (lb, b))
        if la == lb:
            return ea, eb
        key = ("adaptive", la, lb)
        hops = self._spread_memo.get(key)
        if hops is None:
            spines = self.spines if isinstance(self.spines, tuple) else self.spines[la]
            if not spines:
                return None
            paths: list[tuple[Edge, ...]]
            if self.cores is None or self.pod_of[la] == self.pod_of[lb]:
                paths = [((la, s), (s, lb)) for s in spines]
            else:
                pod = self.pod_of[lb]
                paths = [((la, s), (s, c), (c, self.spine_to_pod[(c, pod)]), (self.spine_to_pod[(c, pod)], lb))
                         for s in spines for c in self.cores[s]]
            hops = self._spread_memo[key] = combine(paths)
        return (ea, *hops, eb)

    def routes_between(self, nics_a: list[str], nics_b: list[str], srcs: list[str],
                       dsts: list[str], subflows: int = 1) -> list[tuple[RouteElement, ...] | None]:
        """:meth:`route_between` of each ``(nics_a[i], nics_b[i], srcs[i], dsts[i])``, in one loop: the
        same routes (the same hash per ECMP choice), without a call per route. A merge asks it once
        for all its mirrors (16,384 H100: a thousand per pipeline send). ``subflows > 1`` (or
        :data:`~hwmodel.ecmp.ADAPTIVE`): each pair's :meth:`spread_between`."""
        if subflows == ADAPTIVE:
            return [self.adaptive_between(a, b) for a, b in zip(nics_a, nics_b, strict=True)]
        if subflows > 1:
            if self.cores is not None and isinstance(self.spines, dict):
                return self._spreads_three_tier(nics_a, nics_b, srcs, dsts, subflows)
            if self.cores is not None or not isinstance(self.spines, tuple) or len(self.spines) == 0:
                return [self.spread_between(*q, subflows) for q in zip(nics_a, nics_b, srcs, dsts, strict=True)]
            return self._spreads_two_tier(nics_a, nics_b, srcs, dsts, subflows)
        if self.cores is not None or not isinstance(self.spines, tuple):
            return [self.route_between(*q) for q in zip(nics_a, nics_b, srcs, dsts, strict=True)]
        n = len(self.spines)
        if n == 0:
            return [self.route_between(*q) for q in zip(nics_a, nics_b, srcs, dsts, strict=True)]
        # the edges as shared tuples, made once per NIC and per leaf (fewer objects; and a dict counting
        # them finds each key by identity)
        up, down, nic_up, nic_down = self._leaf_up, self._leaf_down, self._nic_up, self._nic_down
        crc = zlib.crc32
        out: list[tuple[Edge, ...] | None] = [None] * len(nics_a)
        # (_crossing_spines inlined: a merge's thousand pairs, each otherwise two calls)
        for k, (a, b, ea, eb) in enumerate(zip(nics_a, nics_b, map(nic_up.get, nics_a), map(nic_down.get, nics_b),
                                               strict=True)):
            if ea is None or eb is None or a == b:
                ends = self._pair_nic_edges(a, b)
                if ends is None:
                    continue
                ea, eb = ends
            la, lb = ea[1], eb[0]
            if la == lb:
                out[k] = (ea, eb)
                continue
            i = crc(f"{srcs[k]}|{dsts[k]}|{la}".encode()) % n if n > 1 else 0
            ups, downs = up.get(la), down.get(lb)
            if ups is None or downs is None:
                ups, downs = self._leaf_edges(la, lb)
            out[k] = (ea, ups[i], downs[i], eb)
        return out

    def _crossing_spines(self, nics_a: list[str], nics_b: list[str],
                         out: list[Any]) -> Iterator[tuple[int, Edge, Edge]]:
        """For each pair ``k`` of NICs ``(nics_a[k], nics_b[k])``: ``out[k]`` stays None where there is no
        fabric route, becomes (NIC up, NIC down) under one leaf; the others, which cross the spines, are
        yielded as ``(k, edge NIC a -> its leaf, edge leaf -> NIC b)``."""
        for k, (a, b) in enumerate(zip(nics_a, nics_b, strict=True)):
            ends = self._pair_nic_edges(a, b)
            if ends is None:
                continue
            ea, eb = ends
            if ea[1] == eb[0]:
                out[k] = ends
            else:
                yield k, ea, eb

    def _spreads_three_tier(self, nics_a: list[str], nics_b: list[str], srcs: list[str], dsts: list[str],
                            subflows: int) -> list[tuple[RouteElement, ...] | None]:
        """:meth:`routes_between` with ``subflows`` > 1 on a three-tier Clos: per pair, each sub-flow's spine
        and (across pods) core, hashed as :meth:`route` hashes them, and the paths combined
        (:func:`~hwmodel.ecmp.combine`) between the pair's two NIC links, as combining each sub-flow's
        :meth:`route` would, without a route list and a count per sub-flow (a 16,384-rank DP ring asks it
        per hop); :meth:`spread_between` on three tiers is this loop for one pair."""
        crc = zlib.crc32
        spines_of, cores_of, pod_of, down_spine = self.spines, self.cores, self.pod_of, self.spine_to_pod
        assert isinstance(spines_of, dict) and cores_of is not None
        out: list[tuple[RouteElement, ...] | None] = [None] * len(nics_a)
        for k, ea, eb in self._crossing_spines(nics_a, nics_b, out):
            src, dst, la, lb = srcs[k], dsts[k], ea[1], eb[0]
            spines = spines_of[la]
            n = len(spines)
            if n == 0:  # (no spine above the leaf: no route, as route() finds)
                continue
            pod = pod_of[lb]
            far = pod_of[la] != pod
            paths: list[tuple[Edge, ...]] = []
            for j in range(subflows):
                h = subflow_hkey(src, dst, j)
                sp = spines[0] if n == 1 else spines[crc(f"{h}|{la}".encode()) % n]
                if not far:
                    paths.append(((la, sp), (sp, lb)))
                    continue
                cores = cores_of[sp]
                c = cores[0] if len(cores) == 1 else cores[crc(f"{h}|{sp}".encode()) % len(cores)]
                t = down_spine[(c, pod)]
                paths.append(((la, sp), (sp, c), (c, t), (t, lb)))
            out[k] = (ea, *combine(paths), eb)
        return out

    def _spreads_two_tier(self, nics_a: list[str], nics_b: list[str], srcs: list[str], dsts: list[str],
                          subflows: int) -> list[tuple[RouteElement, ...] | None]:
        """:meth:`routes_between` with ``subflows`` > 1 on a two-tier Clos: per pair, the spine of each
        sub-flow (the hash :meth:`spread_between` takes), counted, and the up and down hops of each spine
        used as one :class:`~hwmodel.ecmp.Spread` (kept per leaf pair and counts: mirrors repeat them)."""
        n = len(self.spines)
        crc = zlib.crc32
        memo = self._spread_memo
        out: list[tuple[RouteElement, ...] | None] = [None] * len(nics_a)
        for k, ea, eb in self._crossing_spines(nics_a, nics_b, out):
            src, dst, la, lb = srcs[k], dsts[k], ea[1], eb[0]
            counts: dict[int, int] = {}
            for j in range(subflows):
                i = crc(f"{subflow_hkey(src, dst, j)}|{la}".encode()) % n
                counts[i] = counts.get(i, 0) + 1
            ups, downs = self._leaf_up.get(la), self._leaf_down.get(lb)
            if ups is None or downs is None:
                ups, downs = self._leaf_edges(la, lb)
            if len(counts) == 1:
                i = next(iter(counts))
                out[k] = (ea, ups[i], downs[i], eb)
                continue
            key = (la, lb, tuple(counts.items()))
            sp = memo.get(key)
            if sp is None:
                sp = memo[key] = Spread(chain.from_iterable(
                    ((ups[i], c / subflows), (downs[i], c / subflows)) for i, c in counts.items()))
            out[k] = (ea, sp, eb)
        return out

    def _pair_nic_edges(self, a: str, b: str) -> tuple[Edge, Edge] | None:
        """NIC ``a``'s edge up to its leaf and NIC ``b``'s down from its leaf, from the kept tables or
        :meth:`_nic_edges`; None where there is no fabric route (not NICs here, or ``a == b``)."""
        ea, eb = self._nic_up.get(a), self._nic_down.get(b)
        if ea is None or eb is None or a == b:
            ea, eb = self._nic_edges(a, b)
            if ea is None or eb is None:
                return None
        return ea, eb

    def _nic_edges(self, a: str, b: str) -> tuple[Edge | None, Edge | None]:
        """The edge from NIC ``a`` to its leaf and from its leaf to NIC ``b`` (None: not a NIC here, and
        both None for ``a == b``: no route), kept for :meth:`routes_between`."""
        if a == b:
            return None, None
        la, lb = self.leaf_of.get(a), self.leaf_of.get(b)
        ea = None if la is None else self._nic_up.setdefault(a, (a, la))
        eb = None if lb is None else self._nic_down.setdefault(b, (lb, b))
        return ea, eb

    def _leaf_edges(self, la: str, lb: str) -> tuple[tuple[Edge, ...], tuple[Edge, ...]]:
        """Leaf ``la``'s edges up to each spine and leaf ``lb``'s down from each (two-tier fabric), kept
        for :meth:`routes_between`."""
        spines = cast(tuple[str, ...], self.spines)
        ups = self._leaf_up.get(la)
        if ups is None:
            ups = self._leaf_up[la] = tuple((la, s) for s in spines)
        downs = self._leaf_down.get(lb)
        if downs is None:
            downs = self._leaf_down[lb] = tuple((s, lb) for s in spines)
        return ups, downs


def _neighbours(table: dict[str, dict[str, float]]):
    """``device -> its neighbours`` of a cost table, without making a lazy table's rows (``neighbours``)."""
    return getattr(table, "neighbours", table.__getitem__)


def _link_cost(table: dict[str, dict[str, float]]):
    """``(device, neighbour) -> routing cost`` of a cost table, without making a lazy table's rows."""
    cost = getattr(table, "cost", None)
    return cost if cost is not None else (lambda n, m: table[n][m])


def _leaf_of(kinds: dict[str, str], succ_cost: dict[str, dict[str, float]],
             pred_cost: dict[str, dict[str, float]], costs: set[float]) -> dict[str, str] | None:
    """NIC -> its one leaf (joined both ways, and the leaf's NIC links exactly its own NICs'), the link
    costs added to ``costs``; None when a NIC has no single leaf or joins another NIC."""
    succ, pred, succ_c, pred_c = _neighbours(succ_cost), _neighbours(pred_cost), _link_cost(succ_cost), \
        _link_cost(pred_cost)
    leaf_of: dict[str, str] = {}
    for n, k in kinds.items():
        if k != "nic":
            continue
        out = succ(n)
        up = [v for v in out if kinds[v] == "ib_switch"]
        down = [u for u in pred(n) if kinds[u] == "ib_switch"]
        if any(kinds[v] == "nic" for v in out) or len(up) != 1 or down != up:
            return None
        leaf_of[n] = up[0]
        costs.update((succ_c(n, up[0]), pred_c(n, up[0])))
    for n, leaf in leaf_of.items():
        if n not in succ(leaf):
            return None
    for leaf in set(leaf_of.values()):
        if any(leaf_of.get(v) != leaf for v in succ(leaf) if kinds[v] == "nic"):
            return None
    return leaf_of


def _switch_neighbours(switches: list[str], leaves: set[str], kinds: dict[str, str],
                       succ_cost: dict[str, dict[str, float]], pred_cost: dict[str, dict[str, float]],
                       costs: set[float]) -> dict[str, set[str]] | None:
    """Switch -> its switch neighbours (the same both ways), the link costs added to ``costs``; None when
    a switch joins anything but switches and NICs, or a non-leaf joins a NIC."""
    succ, pred, succ_c = _neighbours(succ_cost), _neighbours(pred_cost), _link_cost(succ_cost)
    nbrs: dict[str, set[str]] = {}
    for sw in switches:
        after, before = succ(sw), pred(sw)
        out = {v for v in after if kinds[v] == "ib_switch"}
        if out != {u for u in before if kinds[u] == "ib_switch"}:
            return None
        if any(kinds[v] not in ("ib_switch", "nic") for t in (after, before) for v in t):
            return None
        if sw not in leaves and any(kinds[v] == "nic" for v in after):
            return None
        nbrs[sw] = out
        costs.update(succ_c(sw, v) for v in out)
    return nbrs


def _pick(cands: tuple[str, ...], hkey: str, at: str) -> str | None:
    """The search's ECMP choice among sorted equal-cost next hops ``cands`` at device ``at``."""
    n = len(cands)
    if n == 0:
        return None
    return cands[0] if n == 1 else cands[zlib.crc32(f"{hkey}|{at}".encode()) % n]


class NodeClasses:
    """Equivalence classes of nodes for node-local routing (see the module docstring).

    Args:
        kinds: device -> kind.
        nodes: device -> node index (None for fabric devices).
        succ_cost: device -> {successor: routing cost}.
        adj: networkx's successor dicts (device -> {successor: link attributes}), when the routing cost
            is the one of :mod:`hwmodel.topology` (a function of the links' ``route_cost`` and ``kind``):
            nodes are then alike when their devices, in the graph's order, have the same local names and
            kinds and their links the same attributes in the same order (nothing sorted: stricter, so a
            class never holds unlike nodes; a node built in another order is a class of its own).
        copies: nodes ``1 .. copies - 1`` are renamed copies of node 0, links, attributes and their order
            included (:func:`hwmodel.node.add_nodes`), so their signature is node 0's and is not built
            (with ``adj`` only: the signature it keys). 0: every node's signature is built.
        first: node 0's devices in graph order, where listing them would read every device (servers made
            on demand, :mod:`hwmodel.servers`); None: found in ``nodes``.
    """

    def __init__(self, kinds: dict[str, str], nodes: dict[str, Any],
                 succ_cost: dict[str, dict[str, float]], adj: dict[str, dict[str, dict]] | None = None,
                 copies: int = 0, first: list[str] | None = None) -> None:
        self._kinds = kinds
        self._first = first
        self._copies = copies if adj is not None else 0
        self._nodes = nodes
        self._succ = succ_cost
        self._adj = adj
        self._members: dict[Any, list[str]] | None = None
        self._class_of: dict[Any, tuple[int, Any] | None] = {}
        self._classes: dict[tuple, tuple[int, Any]] = {}
        self._segments: dict[tuple[int, str, str], tuple[Edge, ...] | None] = {}
        self._named: dict[tuple[str, str], tuple[Edge, ...]] = {}
        """(src, dst) -> its segment once renamed, for segments without an ECMP choice: a GPU's segment
        to its NIC recurs in the route of every mirror the GPU is an end of (O(devices) entries)."""

    def _signature(self, node: Any) -> tuple | None:
        if self._copies and self._members is None:  # (node 0 alone is asked: its devices, by one C-level scan)
            devices = (list(self._first) if node == 0 and self._first is not None
                       else list(compress(self._nodes, map(eq, self._nodes.values(), repeat(node)))))
        else:
            if self._members is None:
                self._members = {}
                for n, k in self._nodes.items():
                    if k is not None:
                        self._members.setdefault(k, []).append(n)
            devices = self._members.get(node, [])
        prefix = f"n{node}."
        if not devices or any(not n.startswith(prefix) for n in devices):
            return None
        cut, nodes, kinds, adj = len(prefix), self._nodes, self._kinds, self._adj
        if adj is not None:  # the links' own attributes, in the graph's order: alike nodes built alike
            return tuple([(n[cut:], kinds[n], tuple([(v[cut:], d.get("route_cost"), d.get("kind"))
                                                     for v, d in adj[n].items() if nodes[v] == node]))
                          for n in devices])
        sig = []
        for n in sorted(devices):
            links = tuple(sorted((v[cut:], c) for v, c in self._succ[n].items() if nodes[v] == node))
            sig.append((n[cut:], kinds[n], links))
        return tuple(sig)

    def class_of(self, node: Any) -> tuple[int, Any] | None:
        """(class id, the class's first node) of ``node``, or None when its devices are not named
        ``n{node}.<local>``. O(node links) the first time a node is asked."""
        if node in self._class_of:
            return self._class_of[node]
        if type(node) is int and 0 < node < self._copies:  # (node 0's signature: O(node links) once, not per node)
            hit0 = self._class_of[node] = self.class_of(0)
            return hit0
        sig = self._signature(node)
        hit = None if sig is None else self._classes.setdefault(sig, (len(self._classes), node))
        self._class_of[node] = hit
        return hit

    def named(self, src: str, dst: str) -> tuple[Edge, ...] | None:
        """The segment ``src -> dst`` if :meth:`segment` has already constructed it (without an ECMP
        choice), else None."""
        return self._named.get((src, dst))

    def segment(self, src: str, dst: str, node: Any, search) -> list[Edge]:
        """The node-local segment ``src -> dst`` inside ``node``: ``search(src, dst, node)`` returns
        ``(edges, unique)`` for a node; a unique segment of the class's first node is renamed."""
        named = self._named.get((src, dst))
        if named is not None:
            return list(named)
        cls = self.class_of(node)
        if cls is None:
            return search(src, dst, node)[0]
        if cls[1] == node:
            edges, unique = search(src, dst, node)
            if unique:
                self._named[(src, dst)] = tuple(edges)
            return edges
        cid, rep = cls
        cut = len(f"n{node}.")
        key = (cid, src[cut:], dst[cut:])
        local = self._segments.get(key, ())
        if local == ():
            p = f"n{rep}."
            try:
                edges, unique = search(p + key[1], p + key[2], rep)
            except Exception:  # no such segment: let the node's own search say so, naming its devices
                edges, unique = [], False
            cr = len(p)
            local = self._segments[key] = tuple((u[cr:], v[cr:]) for u, v in edges) if unique else None
        if local is None:  # an ECMP choice inside the node (its hash names the devices), or no route
            return search(src, dst, node)[0]
        p = f"n{node}."
        edges = [(p + u, p + v) for u, v in local]
        self._named[(src, dst)] = tuple(edges)
        return edges


ROUTE_COST: dict[str, float] = {"pcie": 1.5}
"""Routing cost per edge ``kind`` (default 1 per hop); an edge attribute ``route_cost`` overrides."""


class CostRows(dict):
    """device -> {neighbour: routing cost of the link between them} over networkx's plain successor or
    predecessor dicts (``nbrs``), each device's row made on first use (an unknown device: KeyError)."""

    def __init__(self, nbrs: dict[str, dict[str, dict[str, Any]]]) -> None:
        super().__init__()
        self._nbrs = nbrs

    def __missing__(self, n: str) -> dict[str, float]:
        row = self[n] = {m: route_cost(data) for m, data in self._nbrs[n].items()}
        return row

    def neighbours(self, n: str) -> dict[str, Any]:
        """``n``'s neighbours (as keys), its row not made: a fabric's shape is read off every NIC."""
        row = self.get(n)
        return row if row is not None else self._nbrs[n]

    def cost(self, n: str, m: str) -> float:
        """The routing cost of the link between ``n`` and neighbour ``m``, the row not made."""
        row = self.get(n)
        return row[m] if row is not None else route_cost(self._nbrs[n][m])


def route_cost(data: dict[str, Any]) -> float:
    """A link's routing cost: its ``route_cost``, else :data:`ROUTE_COST` of its kind, else 1."""
    return float(data.get("route_cost", ROUTE_COST.get(data.get("kind", ""), 1.0)))
