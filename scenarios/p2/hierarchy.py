"""A system hierarchy: named levels, outer to inner, each with a fan-out (P², Xie et al. MLSys'22 §3).

``Hierarchy(levels=(("node", 4), ("gpu", 8)))`` is 4 nodes of 8 GPUs: 32 devices. Devices are numbered
in mixed radix over the levels, the outermost level most significant: device ``d`` has level
coordinates ``(c_0, ..., c_{m-1})`` with ``d = ((c_0 * h_1 + c_1) * h_2 + c_2) ...``. A hierarchy built
from a topology also names the GPU behind each device (``gpu_names[d]``), so device ``d`` is global rank
``d`` when programs are lowered and simulated.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from math import prod


@dataclass(frozen=True, slots=True)
class Hierarchy:
    """Hierarchy levels, outer -> inner.

    Args:
        levels: ``(name, size)`` pairs, outermost first; names unique, sizes >= 1.
        gpu_names: optional topology GPU name per device (length = number of devices).

    Raises:
        ValueError: no levels, a duplicate or empty level name, a size < 1, or ``gpu_names`` of the
            wrong length.
    """

    levels: tuple[tuple[str, int], ...]
    """``(name, size)`` per level, outermost first."""
    gpu_names: tuple[str, ...] = ()
    """Topology GPU name of each device, in device order; empty for an abstract hierarchy."""

    def __post_init__(self) -> None:
        levels = tuple((str(n), int(s)) for n, s in self.levels)
        object.__setattr__(self, "levels", levels)
        object.__setattr__(self, "gpu_names", tuple(self.gpu_names))
        if not levels:
            raise ValueError("levels: a hierarchy needs at least one level")
        names = [n for n, _ in levels]
        for n, s in levels:
            if not n:
                raise ValueError("levels: level names must be non-empty")
            if s < 1:
                raise ValueError(f"levels: level {n!r} has size {s}; sizes must be >= 1")
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"levels: duplicate level names {dup}")
        if self.gpu_names and len(self.gpu_names) != self.num_devices:
            raise ValueError(f"gpu_names: {len(self.gpu_names)} names for {self.num_devices} devices")

    @property
    def names(self) -> tuple[str, ...]:
        """Level names, outer -> inner."""
        return tuple(n for n, _ in self.levels)

    @property
    def sizes(self) -> tuple[int, ...]:
        """Level sizes, outer -> inner."""
        return tuple(s for _, s in self.levels)

    @property
    def num_devices(self) -> int:
        """Product of the level sizes."""
        return prod(self.sizes)

    def coords(self, device: int) -> tuple[int, ...]:
        """Level coordinates of ``device`` (outermost first).

        Raises:
            ValueError: ``device`` out of range.
        """
        if not 0 <= device < self.num_devices:
            raise ValueError(f"device {device} out of range [0, {self.num_devices})")
        out = []
        for s in reversed(self.sizes):
            device, c = divmod(device, s)
            out.append(c)
        return tuple(reversed(out))

    def device(self, coords: Sequence[int]) -> int:
        """Device index of level coordinates ``coords`` (outermost first).

        Raises:
            ValueError: wrong number of coordinates or one out of range.
        """
        if len(coords) != len(self.levels):
            raise ValueError(f"coords {tuple(coords)}: expected {len(self.levels)} coordinates")
        d = 0
        for (n, s), c in zip(self.levels, coords, strict=True):
            if not 0 <= c < s:
                raise ValueError(f"coords {tuple(coords)}: level {n!r} coordinate {c} not in [0, {s})")
            d = d * s + c
        return d

    def level_index(self, name: str) -> int:
        """Index of the level called ``name``.

        Raises:
            ValueError: no such level (the message lists the levels).
        """
        try:
            return self.names.index(name)
        except ValueError:
            raise ValueError(f"unknown level {name!r}; levels are {list(self.names)}") from None

    def __str__(self) -> str:
        return " > ".join(f"{n}[{s}]" for n, s in self.levels)

    @classmethod
    def from_topology(cls, topology, *, level_names: tuple[str, str] = ("node", "gpu"),
                      nodes_per_unit: int | None = None, unit_name: str = "su") -> Hierarchy:
        """The node -> GPU hierarchy of a topology (optionally scalable unit -> node -> GPU).

        Uses ``topology.gpus()`` and ``topology.node_of(gpu)``: GPUs are grouped by node in order of
        first appearance, devices numbered node by node. With ``nodes_per_unit`` an outer level of
        units (e.g. SuperPOD scalable units) of that many consecutive nodes is added.

        Raises:
            ValueError: nodes with different GPU counts, or ``nodes_per_unit`` not dividing the nodes.
        """
        by_node: dict[object, list[str]] = {}
        for g in topology.gpus():
            by_node.setdefault(topology.node_of(g), []).append(g)
        counts = {len(v) for v in by_node.values()}
        if len(counts) != 1:
            raise ValueError(f"topology: nodes have different GPU counts {sorted(counts)}; "
                             "a hierarchy needs a uniform fan-out")
        gpn = counts.pop()
        n_nodes = len(by_node)
        names = tuple(g for gs in by_node.values() for g in gs)
        levels: list[tuple[str, int]] = []
        if nodes_per_unit is not None:
            if nodes_per_unit < 1 or n_nodes % nodes_per_unit:
                raise ValueError(f"nodes_per_unit={nodes_per_unit} does not divide {n_nodes} nodes")
            levels.append((unit_name, n_nodes // nodes_per_unit))
            levels.append((level_names[0], nodes_per_unit))
        else:
            levels.append((level_names[0], n_nodes))
        levels.append((level_names[1], gpn))
        return cls(tuple(levels), names)
