"""A built cluster: the topology's links and GPUs as resources on one fluid system.

:class:`Cluster` is what the runtime and the NCCL model act on. Each directed topology edge becomes a
:class:`~hwmodel.fluid.Resource` of its bandwidth (full duplex: each direction its own capacity, as
SimGrid's SPLITDUPLEX), each GPU a :class:`~hwmodel.gpu.GPU`.

Both are made on first use, so that building a cluster costs O(devices) integers, not a resource per
link: a simulation that runs 16 ranks of a 131,072-GPU cluster touches a few thousand of its millions of
links. Each resource still gets the solver tie-break index (:attr:`hwmodel.maxmin.Resource.index`) it
had when every resource was made up front -- links in topology edge order, then each GPU's SM pool and
HBM in rank order -- so the order in which a run first touches them changes no result.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Generic, TypeVar

import simpy

from hwmodel.costmodel import KernelCostModel
from hwmodel.fluid import Activity, FluidSystem, Resource
from hwmodel.gpu import GPU
from hwmodel.link_classes import LinkBundle, LinkClasses, LinkView
from hwmodel.topology import Topology

K = TypeVar("K")
V = TypeVar("V")


class OnDemand(Mapping, Generic[K, V]):
    """A read-only mapping over ``keys`` whose value for a key is made by ``make(key)`` on first access;
    iterating over the values makes every one, in key order."""

    def __init__(self, contains: Callable[[K], bool], keys: Callable[[], Iterator[K]],
                 count: Callable[[], int], make: Callable[[K], V]) -> None:
        self._made: dict[K, V] = {}
        self._contains, self._keys, self._count, self._make = contains, keys, count, make

    def __getitem__(self, key: K) -> V:
        hit = self._made.get(key)
        if hit is None:
            if not self._contains(key):
                raise KeyError(key)
            hit = self._made[key] = self._make(key)
        return hit

    def __contains__(self, key: object) -> bool:
        return key in self._made or self._contains(key)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[K]:
        return self._keys()

    def __len__(self) -> int:
        return self._count()

    def made(self) -> list[V]:
        """The values made so far (in the order they were made)."""
        return list(self._made.values())


class Cluster:
    """Topology + fluid resources + GPUs on one SimPy environment.

    Args:
        topology: the machine.
        env: a SimPy environment (a new one by default).
        record: keep per-resource load timelines (utilisation plots).
        cost_model: kernel cost model shared by all GPUs; by default one for the GPU spec priced at the
            sustained training clock (``KernelCostModel(spec, sustained=True)``).
        link_classes: links that merged mirrored traffic alone loads alike are one resource per class
            (:mod:`hwmodel.link_classes`; the same rates, bytes and timelines); False: one per link.
    """

    def __init__(self, topology: Topology, env: simpy.Environment | None = None, *, record: bool = True,
                 cost_model: KernelCostModel | None = None, link_classes: bool = True) -> None:
        self.topology = topology
        self.env = env or simpy.Environment()
        self.fs = FluidSystem(self.env, record=record)
        g = topology.graph
        self._edge_base = topology.edge_offsets()  # device -> index of its first out-going edge
        self._edge_pos: dict[str, dict[str, int]] = {}
        self._num_edges = topology.num_links()
        self.links: OnDemand[tuple[str, str], Resource] = OnDemand(
            self._has_link, lambda: iter(g.edges()),
            topology.num_links, self._make_link)
        """Directed edge -> resource (capacity in bytes/s), made on first use (a link of a class is
        pinned: taken out of it, see :mod:`hwmodel.link_classes`)."""
        self.link_classes = LinkClasses(self.fs, topology.link_rows(), self._edge_index, self.links._made,
                                        self.links.__getitem__, link_classes)
        """The links only merged mirrored traffic loads, in classes of equivalent links."""
        self._cost_model = cost_model or KernelCostModel(topology.gpu_spec, sustained=True)
        gpu_names = topology.gpus()
        self._gpu_rank = topology.gpu_indices()  # (shared, read-only: a cluster per hierarchical pass)
        self.gpus: OnDemand[str, GPU] = OnDemand(self._gpu_rank.__contains__, lambda: iter(gpu_names),
                                                 lambda: len(gpu_names), self._make_gpu)
        """GPU node name -> GPU, made on first use."""
        self._route_res: dict[tuple[str, str], tuple[list[Resource], float]] = {}

    def _make_link(self, edge: tuple[str, str]) -> Resource:
        if edge in self.link_classes:
            return self.link_classes.pin(edge)
        u, v = edge
        data = self.topology.link_data(u, v)
        r = self.fs.add_resource(f"{u}->{v}", float(data["bandwidth_Bps"]), meta=("link", u, v, data.get("kind", "")))
        r.index = self._edge_index(edge)
        return r

    def _edge_index(self, edge: tuple[str, str]) -> int:
        """The link's solver tie-break index: its position in topology edge order."""
        u, v = edge
        pos = self._edge_pos.get(u)
        if pos is None:
            pos = self._edge_pos[u] = {w: i for i, w in enumerate(self.topology.link_rows()[u])}
        return self._edge_base[u] + pos[v]

    def _has_link(self, edge: object) -> bool:
        """Whether ``edge`` is a directed link (:meth:`Topology.link_rows`: no server made on demand for it)."""
        try:
            return isinstance(edge, tuple) and len(edge) == 2 and edge[1] in self.topology.link_rows()[edge[0]]
        except (KeyError, TypeError):
            return False

    def _make_gpu(self, name: str) -> GPU:
        gpu = GPU(self.fs, name, self.topology.gpu_spec, self._cost_model)
        base = self._num_edges + 2 * self._gpu_rank[name]
        gpu.sm.index, gpu.hbm.index = base, base + 1
        return gpu

    @property
    def now(self) -> float:
        return self.env.now

    def path(self, src: str, dst: str) -> tuple[list[Resource], float]:
        """Link resources on the route from ``src`` to ``dst`` and its latency in seconds."""
        key = (src, dst)
        hit = self._route_res.get(key)
        if hit is None:
            route = self.topology.route(src, dst)
            hit = ([self.links[e] for e in route], self.topology.path_latency_s(route))
            self._route_res[key] = hit
        return hit

    def transfer(self, src: str, dst: str, size_bytes: float, *, weight: float = 1.0,
                 rate_bound: float | None = None, name: str = "",
                 extra_latency_s: float = 0.0) -> Activity:
        """Send ``size_bytes`` from ``src`` to ``dst`` over the routed path.

        ``weight`` is the bytes put on each link per payload byte (protocol overhead, e.g. 2 for
        NCCL's LL protocol). Returns the activity; ``yield activity.done`` waits for delivery.

        Raises:
            ValueError: negative size, or no route between the endpoints.
        """
        if size_bytes < 0:
            raise ValueError(f"transfer {src}->{dst}: size_bytes must be >= 0, got {size_bytes}")
        links, lat = self.path(src, dst)
        return self.fs.start(size_bytes, [(r, weight) for r in links], latency_s=lat + extra_latency_s,
                             rate_bound=rate_bound, name=name or f"{src}->{dst}")

    def pcie_link(self, gpu: str, direction: str) -> Resource:
        """The GPU's PCIe link towards (``d2h``) or from (``h2d``) its PCIe switch."""
        sw = self.topology.pcie_switch_of(gpu)
        return self.links[(gpu, sw)] if direction == "d2h" else self.links[(sw, gpu)]

    def link_resources(self) -> list[Resource | LinkView]:
        """The links used so far (every link a route or a merge has crossed), in topology edge order: a
        link's own resource, or a view of its class's (same bytes and timeline); the others have carried
        nothing. ``links.values()`` makes and lists all."""
        return sorted([*self.links.made(), *self.link_classes.views()], key=lambda r: r.index)

    def link_bundles(self) -> list[Resource | LinkBundle]:
        """:meth:`link_resources` with each link class as one :class:`~hwmodel.link_classes.LinkBundle`
        (``count`` links, ``names()``) instead of a view per link: for a report that ranks links by load
        (:func:`scenarios.metrics.link_groups`), whose cost then follows the classes, not the links."""
        return [*sorted(self.links.made(), key=lambda r: r.index), *self.link_classes.bundles()]
