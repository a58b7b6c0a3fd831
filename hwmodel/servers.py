"""A cluster's servers made on demand: a graph that holds only the servers a run touches.

Every server of :func:`hwmodel.fabric.build_cluster` is a renamed copy of server 0 (:func:`hwmodel.node.add_nodes`),
so its devices, links and attributes follow from its index alone. :class:`ServerTable` installs dicts in a
``networkx.DiGraph`` in place of its node, successor and predecessor dicts (:class:`OnDemandDict`) that make
a server's devices and links, copied from the template, the first time one of its device names is read
(``g._node["n7.gpu3"]``, ``"n7.pcie1" in g``, ``g.edges["n7.gpu3", "n7.nvswitch"]``). The fabric's switches
are built as before; a NIC's link to its leaf is written on the switch's side when the fabric is built, and
on the NIC's side when its server is made (the same two data dicts, as :func:`hwmodel.node.add_link` shares
them). A device's own successor and predecessor dicts are therefore exactly those of the full build, in the
same order; only the order of the devices in the outer dicts differs until something reads them all.

Whatever reads the whole graph (iterating its devices or links, ``number_of_edges``, ``copy``, equality,
``node_link_data``) first makes every server and puts the devices back in the full build's order (servers
in index order, then the fabric), so it sees exactly the full graph. :class:`hwmodel.topology.Topology`
answers the cluster-wide questions it asks often without that (device kinds and node indices, each link's
position in edge order, the GPUs, the number of links) from the template and the index, by arithmetic.
Reading the graph's dicts is unchanged for every caller; a caller that changes the graph calls
:meth:`hwmodel.topology.Topology.clear_route_cache`, which makes every server first.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import networkx as nx

from hwmodel.node import NodeSpec, add_node, server_attrs

_MISSING = object()


class OnDemandDict(dict):
    """A dict whose missing key is offered to ``fill(key)`` (True: it now holds the key) and whose whole
    reads (iteration, views, ``copy``, equality) call ``complete()`` first. ``size()`` is its length
    counting the keys not made yet. Once ``complete()`` has run it is a plain dict in all but its type."""

    def __init__(self, fill: Callable[[Any], bool], complete: Callable[[], None], size: Callable[[], int]) -> None:
        super().__init__()
        self._fill, self._complete, self._size = fill, complete, size
        self.whole = False
        """Every key is made: whole reads need nothing first."""

    def __missing__(self, key: Any) -> Any:
        if not self.whole and self._fill(key):
            return dict.__getitem__(self, key)
        raise KeyError(key)

    def __contains__(self, key: object) -> bool:
        return dict.__contains__(self, key) or (not self.whole and self._fill(key))

    def get(self, key: Any, default: Any = None) -> Any:
        hit = dict.get(self, key, _MISSING)
        if hit is not _MISSING:
            return hit
        return dict.__getitem__(self, key) if not self.whole and self._fill(key) else default

    def _all(self) -> None:
        if not self.whole:
            self._complete()

    def __len__(self) -> int:
        return dict.__len__(self) if self.whole else self._size()

    def __iter__(self) -> Iterator[Any]:
        self._all()
        return dict.__iter__(self)

    def keys(self):
        self._all()
        return dict.keys(self)

    def values(self):
        self._all()
        return dict.values(self)

    def items(self):
        self._all()
        return dict.items(self)

    def copy(self) -> dict:
        self._all()
        return dict(dict.items(self))

    def __eq__(self, other: object) -> bool:
        self._all()
        if isinstance(other, OnDemandDict):
            other._all()
        return dict.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        return not self == other

    __hash__ = None

    def __repr__(self) -> str:
        self._all()
        return dict.__repr__(self)

    def __reduce__(self) -> tuple:
        self._all()  # (pickled and copied as the plain dict it then is)
        return (dict, (dict(dict.items(self)),))


class ServerTable:
    """Servers ``0 .. num_nodes - 1`` of ``spec`` in ``g`` (which must be new and empty), made on demand.

    Installs the graph's dicts (see the module docstring); :meth:`defer_link` takes a fabric link of a
    server not made yet. Names, attributes, links and their order are those of
    :func:`hwmodel.node.add_nodes` (``tests/hwmodel/test_servers_on_demand.py`` compares the two).
    """

    def __init__(self, g: nx.DiGraph, spec: NodeSpec, num_nodes: int) -> None:
        if g._node or g._succ or g._pred:
            raise ValueError("ServerTable: the graph must be empty")
        t = nx.DiGraph()
        nics0 = add_node(t, spec, 0, 0)
        cut = len("n0.")
        self.num_nodes = num_nodes
        self.gpus_per_node = spec.gpus_per_node
        self.local = [d[cut:] for d in t._node]
        """Server 0's devices by local name, in the order :func:`hwmodel.node.add_node` adds them."""
        self._attrs = [t._node[f"n0.{d}"] for d in self.local]
        self._succ = [[(v[cut:], data) for v, data in t._succ[f"n0.{d}"].items()] for d in self.local]
        self._pred = [[u[cut:] for u in t._pred[f"n0.{d}"]] for d in self.local]
        self.kind = {d: a["kind"] for d, a in zip(self.local, self._attrs, strict=True)}
        """Local name -> device kind."""
        self.nics = [n[cut:] for n in nics0]
        """The server's NICs by local name, in order."""
        self._gpus = [d for d in self.local if self.kind[d] == "gpu"]
        self._template_degree = [len(s) for s in self._succ]
        self._at = {d: k for k, d in enumerate(self.local)}
        self._split: dict[str, tuple[int, str] | None] = {}
        self._extra: dict[str, list[tuple[str, dict, dict]]] = {}
        """Device of a server not made yet -> its links to the fabric (other end, data out, data in)."""
        self._extra_degree: dict[str, int] = {}
        """Local name -> links to the fabric that every server's device of that name has (see seal)."""
        self._links_of: dict[str, int] = {}
        self._most: dict[str, int] = {}
        """Local name -> deferred fabric links of all its devices, and the most of one device."""
        self._made = bytearray(num_nodes)
        self._count = 0
        self._fabric: list[str] | None = None
        self.whole = False
        """Every server is made and the graph's dicts are in the full build's order: a plain graph."""
        self._node = OnDemandDict(self._fill, self.complete, self._size)
        self._succd = OnDemandDict(self._fill, self.complete, self._size)
        self._predd = OnDemandDict(self._fill, self.complete, self._size)
        g._node, g._succ, g._adj, g._pred = self._node, self._succd, self._succd, self._predd
        g.on_demand = self  # (read by hwmodel.node.add_link and by servers_of)

    def __getstate__(self) -> dict[str, Any]:
        self.complete()  # (pickled or copied whole: the graph's dicts go as plain dicts)
        return self.__dict__

    # -- names --------------------------------------------------------------------------------------

    def split(self, name: Any) -> tuple[int, str] | None:
        """``(server, local name)`` of a server device's name ``n{server}.{local}``, else None."""
        if type(name) is not str:
            return None
        hit = self._split.get(name, _MISSING)  # (a device's name is read for its row, kind, node and NIC)
        if hit is not _MISSING:
            return hit  # type: ignore[return-value]
        hit = None
        dot = name.find(".")
        num = name[1:dot]
        if name.startswith("n") and dot >= 2 and num.isdigit() and (num[0] != "0" or len(num) == 1):
            local, i = name[dot + 1:], int(num)
            hit = (i, local) if i < self.num_nodes and local in self.kind else None
        self._split[name] = hit
        return hit

    def kind_of(self, name: Any) -> str | None:
        """A server device's kind, its server not made (None: not a server device)."""
        hit = self.split(name)
        return None if hit is None else self.kind[hit[1]]

    def gpu_names(self) -> list[str]:
        """Every GPU, node-major (``n0.gpu0 ...``): the order of their ranks."""
        return [f"n{i}.{d}" for i in range(self.num_nodes) for d in self._gpus]

    def gpu_nodes(self) -> dict[str, int]:
        """GPU name -> its server, for every GPU, in rank order."""
        return {f"n{i}.{d}": i for i in range(self.num_nodes) for d in self._gpus}

    def names_of_kind(self, kind: str) -> list[str]:
        """Every server's devices of ``kind``, server by server (fabric devices not included)."""
        mine = [d for d in self.local if self.kind[d] == kind]
        return [f"n{i}.{d}" for i in range(self.num_nodes) for d in mine] if mine else []

    def made(self, i: int) -> bool:
        """Whether server ``i``'s devices are in the graph already (else they are the template's, renamed)."""
        return bool(self._made[i])

    def gpu_nic(self, gpu: str) -> str | None:
        """A server GPU's ``nic`` attribute (None: none), its server not made (KeyError: not a GPU)."""
        hit = self.split(gpu)
        if hit is None or self.kind[hit[1]] != "gpu":
            raise KeyError(gpu)
        if self._made[hit[0]] or self.whole:
            return dict.__getitem__(self._node, gpu).get("nic")
        nic = self._attrs[self._at[hit[1]]].get("nic")
        return None if nic is None else f"n{hit[0]}.{nic[len('n0.'):]}"

    def copy_of_0(self, node: Any) -> bool:
        """Whether ``node`` is a server not made (yet): a renamed copy of server 0, attributes included."""
        return type(node) is int and 0 <= node < self.num_nodes and not self._made[node] and not self.whole

    def names_by_kind(self) -> dict[str, list[str]]:
        """Kind -> every device of it (servers' by index, then the fabric's), no server made."""
        out = {k: self.names_of_kind(k) for k in dict.fromkeys(self.kind.values())}
        for n in self.fabric_names():
            out.setdefault(dict.__getitem__(self._node, n)["kind"], []).append(n)
        return out

    def row(self, u: Any) -> dict[str, dict[str, Any]]:
        """``u``'s successor dict (successor -> link attributes, in the graph's order) for reading: the
        graph's own, or for a device of a server not made a renamed one of the template's (the same
        attribute values, the template's dicts: read-only). KeyError: not a device."""
        if self.whole or dict.__contains__(self._succd, u):
            return dict.__getitem__(self._succd, u)
        hit = self.split(u)
        if hit is None:
            raise KeyError(u)
        p = f"n{hit[0]}."
        out = {p + v: data for v, data in self._succ[self._at[hit[1]]]}
        for w, d_out, _ in self._extra.get(u, ()):
            out[w] = d_out
        return out

    def first_devices(self) -> list[str]:
        """Server 0's devices in graph order."""
        return [f"n0.{d}" for d in self.local]

    # -- making servers -----------------------------------------------------------------------------

    def defer_link(self, u: str, v: str, data_uv: dict, data_vu: dict) -> bool:
        """Take the link ``u -> v`` (and back) whose ``u`` is a device of a server not made yet and ``v`` a
        device that exists (a fabric switch): written now on ``v``'s side, on ``u``'s when its server is
        made. False (nothing done): not such a link, or the servers are sealed (see :meth:`seal`)."""
        if self._fabric is not None or self.whole or dict.__contains__(self._succd, u) \
                or not dict.__contains__(self._succd, v) or self.split(u) is None:
            return False
        links = self._extra.setdefault(u, [])
        links.append((v, data_uv, data_vu))
        d = u[u.index(".") + 1:]
        self._links_of[d] = self._links_of.get(d, 0) + 1
        if len(links) > self._most.get(d, 0):
            self._most[d] = len(links)
        dict.__getitem__(self._succd, v)[u] = data_vu
        dict.__getitem__(self._predd, v)[u] = data_uv
        return True

    def defer_links(self, links: list[tuple[str, str]], data_uv: dict, data_vu: dict,
                    otherwise: Callable[[str, str], None]) -> None:
        """:meth:`defer_link` of each ``(u, v)`` of ``links`` in order, each with its own copies of the two
        data dicts, and ``otherwise(u, v)`` for a link it does not take: one loop, not a call per link."""
        if self._fabric is not None or self.whole:
            for u, v in links:
                otherwise(u, v)
            return
        has, succd, predd, extra, split = dict.__contains__, self._succd, self._predd, self._extra, self.split
        links_of, most, get = self._links_of, self._most, dict.__getitem__
        for u, v in links:
            if has(succd, u) or not has(succd, v) or split(u) is None:
                otherwise(u, v)
                continue
            d_uv, d_vu = data_uv.copy(), data_vu.copy()
            mine = extra.get(u)
            if mine is None:
                mine = extra[u] = []
            mine.append((v, d_uv, d_vu))
            d = u[u.index(".") + 1:]
            links_of[d] = links_of.get(d, 0) + 1
            if len(mine) > most.get(d, 0):
                most[d] = len(mine)
            get(succd, v)[u] = d_vu
            get(predd, v)[u] = d_uv

    def seal(self) -> None:
        """The build is over: what the graph holds now besides servers is its fabric, in order. If the
        fabric links are not the same for every server's device of a local name (the arithmetic of
        :meth:`edge_offsets` needs it), or a server was made during the build, every server is made now."""
        uniform = all(total == self.num_nodes * self._most[d] for d, total in self._links_of.items())
        if self._count or not uniform:
            self.complete()
            return
        self._extra_degree = dict(self._most)
        self._fabric = list(dict.keys(self._node))

    def _fill(self, key: Any) -> bool:
        hit = self.split(key)
        if hit is None or self._made[hit[0]]:
            return False
        self._make(hit[0])
        return True

    def _size(self) -> int:
        return dict.__len__(self._node) + (self.num_nodes - self._count) * len(self.local)

    def _make(self, i: int) -> None:
        """Write server ``i``'s devices and links, as :func:`hwmodel.node.add_nodes` does, plus the fabric
        links taken by :meth:`defer_link` (after the server's own, as the full build adds them)."""
        p = f"n{i}."
        rank0 = i * self.gpus_per_node
        names = [p + d for d in self.local]
        name_of = dict(zip(self.local, names, strict=True))
        succ: dict[str, dict] = {}
        for name, links in zip(names, self._succ, strict=True):
            succ[name] = {name_of[v]: dict(data) for v, data in links}
        node_attr, succd, predd = self._node, self._succd, self._predd
        for name, t_a, froms in zip(names, self._attrs, self._pred, strict=True):
            attrs = server_attrs(t_a, i, rank0, p)
            s = succ[name]
            pr = {name_of[u]: succ[name_of[u]][name] for u in froms}
            for v, d_out, d_in in self._extra.pop(name, ()):
                s[v] = d_out
                pr[v] = d_in
            dict.__setitem__(node_attr, name, attrs)
            dict.__setitem__(succd, name, s)
            dict.__setitem__(predd, name, pr)
        self._made[i] = 1
        self._count += 1

    def complete(self) -> None:
        """Make every server and put the graph's devices in the full build's order (servers in index
        order, then everything else as it was): the graph is then the full one, and stays plain."""
        if self.whole:
            return
        for i in range(self.num_nodes):
            if not self._made[i]:
                self._make(i)
        for table in (self._node, self._succd, self._predd):
            rest = [(k, v) for k, v in dict.items(table) if self.split(k) is None]
            servers = [(k, dict.__getitem__(table, k)) for i in range(self.num_nodes)
                       for k in (f"n{i}.{d}" for d in self.local)]
            dict.clear(table)
            for k, v in servers:
                dict.__setitem__(table, k, v)
            for k, v in rest:
                dict.__setitem__(table, k, v)
            table.whole = True
        self.whole = True

    # -- the graph's order, by arithmetic -------------------------------------------------------------

    def edge_offsets(self) -> tuple[dict[str, int], int]:
        """(device -> position of its first out-going link in ``graph.edges()`` order of the full graph,
        each found on first use; number of links), without making a server. Needs :meth:`seal` to have
        kept the servers on demand."""
        assert self._fabric is not None  # (sealed: the arithmetic holds while the graph is unchanged)
        first, total = {}, 0
        for d, deg in zip(self.local, self._template_degree, strict=True):
            first[d] = total
            total += deg + self._extra_degree.get(d, 0)
        per_server = total
        fabric, succd = {}, self._succd
        total = per_server * self.num_nodes
        for name in self._fabric:
            fabric[name] = total
            total += len(dict.__getitem__(succd, name))

        def offset(name: str) -> int:
            hit = fabric.get(name)
            if hit is not None:
                return hit
            s = self.split(name)
            if s is None:
                raise KeyError(name)
            return s[0] * per_server + first[s[1]]

        return Lookup(offset), total

    def fabric_names(self) -> list[str]:
        """The devices other than the servers', in graph order (the fabric's switches)."""
        assert self._fabric is not None
        return list(self._fabric)

    def sealed(self) -> bool:
        """The servers are on demand and the graph's order is known by arithmetic."""
        return self._fabric is not None and not self.whole


def servers_of(g: nx.DiGraph) -> ServerTable | None:
    """The graph's :class:`ServerTable` while its servers are on demand (sealed, not made whole), else None."""
    sv = getattr(g, "on_demand", None)
    return sv if isinstance(sv, ServerTable) and sv.sealed() else None


class Lookup(dict):
    """A dict whose value for a missing key is ``find(key)`` (KeyError: none), found once and kept."""

    def __init__(self, find: Callable[[Any], Any]) -> None:
        super().__init__()
        self._find = find

    def __missing__(self, key: Any) -> Any:
        hit = self[key] = self._find(key)
        return hit


class AttributeTable(OnDemandDict):
    """Device -> its ``kind`` or its ``node`` (None for a fabric device) for every device of a graph whose
    servers are on demand (``servers``), a server device's value found from its name: no server is made.
    A whole read lists every device in the full graph's order."""

    def __init__(self, servers: ServerTable, attr: str) -> None:
        if attr not in ("kind", "node"):
            raise ValueError(f"AttributeTable: attr must be 'kind' or 'node', got {attr!r}")
        super().__init__(self._fill_one, self._fill_all, servers._size)
        self._servers, self._attr = servers, attr

    def _value(self, data: dict[str, Any]) -> Any:
        return data["kind"] if self._attr == "kind" else data.get("node")

    def _fill_one(self, key: Any) -> bool:
        sv = self._servers
        hit = None if sv.whole else sv.split(key)
        if hit is not None:
            value = sv.kind[hit[1]] if self._attr == "kind" else hit[0]
        else:
            data = dict.get(sv._node, key)
            if data is None:
                return False
            value = self._value(data)
        dict.__setitem__(self, key, value)
        return True

    def _fill_all(self) -> None:
        sv, node = self._servers, self._servers._node
        dict.clear(self)
        if sv.whole:
            for n, data in dict.items(node):
                dict.__setitem__(self, n, self._value(data))
        else:
            kinds = sv.kind
            for i in range(sv.num_nodes):
                for d in sv.local:
                    dict.__setitem__(self, f"n{i}.{d}", kinds[d] if self._attr == "kind" else i)
            for n in sv.fabric_names():
                dict.__setitem__(self, n, self._value(dict.__getitem__(node, n)))
        self.whole = True
