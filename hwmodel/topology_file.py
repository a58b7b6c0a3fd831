"""Saving and loading a :class:`hwmodel.topology.Topology` as JSON (networkx node-link data plus the specs),
and comparing two topologies: the file format, apart from the routing the topology module owns."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TypeVar

import networkx as nx

from hwmodel.specs import GPUSpec, NICSpec, get_gpu, get_nic

_FORMAT = "trainsim-topology"
T = TypeVar("T", bound="TopologyFile")


class TopologyFile:
    """What :class:`hwmodel.topology.Topology` saves, loads and compares: its ``graph``, ``gpu_spec`` and
    ``nic_spec``."""

    graph: nx.DiGraph
    gpu_spec: GPUSpec
    nic_spec: NICSpec | None

    def __init__(self, graph: nx.DiGraph, gpu_spec: GPUSpec, nic_spec: NICSpec | None = None) -> None:
        self.graph, self.gpu_spec, self.nic_spec = graph, gpu_spec, nic_spec

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict: networkx node-link data plus the specs (inverse: :meth:`from_dict`)."""
        data = nx.node_link_data(self.graph, edges="links")
        return {"format": _FORMAT, "version": 1, "gpu_spec": self.gpu_spec.to_dict(),
                "nic_spec": None if self.nic_spec is None else self.nic_spec.to_dict(), "topology": data}

    @classmethod
    def from_dict(cls: type[T], d: dict[str, Any]) -> T:
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
    def load(cls: type[T], path: str | Path) -> T:
        """Read a topology written by :meth:`save` (or by hand in the same format)."""
        return cls.from_dict(json.loads(Path(path).read_text(encoding="utf-8")))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TopologyFile):
            return NotImplemented
        return (self.gpu_spec == other.gpu_spec and self.nic_spec == other.nic_spec
                and self.graph.graph == other.graph.graph
                and dict(self.graph.nodes(data=True)) == dict(other.graph.nodes(data=True))
                and {(u, v): d for u, v, d in self.graph.edges(data=True)}
                == {(u, v): d for u, v, d in other.graph.edges(data=True)})

    __hash__ = None  # type: ignore[assignment]
