"""A built cluster: the topology's links and GPUs as resources on one fluid system.

:class:`Cluster` is what the runtime and the NCCL model act on. Each directed topology edge becomes a
:class:`~hwmodel.fluid.Resource` of its bandwidth (full duplex: each direction its own capacity, as
SimGrid's SPLITDUPLEX), each GPU a :class:`~hwmodel.gpu.GPU`.
"""

from __future__ import annotations

import simpy

from hwmodel.costmodel import KernelCostModel
from hwmodel.fluid import Activity, FluidSystem, Resource
from hwmodel.gpu import GPU
from hwmodel.topology import Topology


class Cluster:
    """Topology + fluid resources + GPUs on one SimPy environment.

    Args:
        topology: the machine.
        env: a SimPy environment (a new one by default).
        record: keep per-resource load timelines (utilisation plots).
        cost_model: kernel cost model shared by all GPUs; by default one for the GPU spec priced at the
            sustained training clock (``KernelCostModel(spec, sustained=True)``).
    """

    def __init__(self, topology: Topology, env: simpy.Environment | None = None, *, record: bool = True,
                 cost_model: KernelCostModel | None = None) -> None:
        self.topology = topology
        self.env = env or simpy.Environment()
        self.fs = FluidSystem(self.env, record=record)
        g = topology.graph
        self.links: dict[tuple[str, str], Resource] = {}
        """Directed edge -> resource (capacity in bytes/s)."""
        for u, v, data in g.edges(data=True):
            self.links[(u, v)] = self.fs.add_resource(f"{u}->{v}", float(data["bandwidth_Bps"]),
                                                     meta=("link", u, v, data.get("kind", "")))
        cm = cost_model or KernelCostModel(topology.gpu_spec, sustained=True)
        self.gpus: dict[str, GPU] = {name: GPU(self.fs, name, topology.gpu_spec, cm)
                                     for name in topology.gpus()}
        """GPU node name -> GPU."""
        self._route_res: dict[tuple[str, str], tuple[list[Resource], float]] = {}

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

    def link_resources(self) -> list[Resource]:
        """All link resources, in topology edge order."""
        return list(self.links.values())
