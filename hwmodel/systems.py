"""Named systems (``hwmodel/data/systems.toml``), :func:`build_system`, and cluster files.

A system is one server layout (GPU, GPUs per node, NVSwitch chips, compute NICs, PCIe switches and
generation, CPU sockets) plus its default fabric (InfiniBand switch, scalable-unit size), each figure
with a source in ``systems.toml``. Adding a system is one table in that file. GPU, NIC and switch names
refer to ``gpus.toml`` / ``network.toml`` (:mod:`hwmodel.specs`).
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hwmodel.fabric import build_cluster
from hwmodel.node import generic_node
from hwmodel.spec_ranges import load_checked_gpu_file
from hwmodel.specs import GPUSpec, NICSpec, SwitchSpec, UnknownNameError, get_gpu

if TYPE_CHECKING:
    from hwmodel.topology import Topology

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib


@dataclass(frozen=True, kw_only=True, slots=True)
class SystemSpec:
    """One named system, as a ``systems.toml`` table (see that file's header for each key).

    Names of GPUs, NICs and switches are resolved when the system is built, so a what-if GPU or NIC
    may replace them. ``sources`` maps each key to the source of its figure.
    """

    name: str
    """System name, e.g. ``"dgx-a100"``."""
    description: str = ""
    """One line for humans."""
    gpu: str
    """GPU name (``gpus.toml``)."""
    gpus_per_node: int
    """GPUs per server, i.e. per NVLink domain (a whole rack for ``gb200-nvl72``); the most a scenario's
    ``gpus_per_node`` may ask for (:func:`node_shape`)."""
    nvswitch: str
    """NVSwitch chip name (``network.toml``)."""
    nvswitch_count: int
    """NVSwitch chips per node (aggregated into one switch node; recorded on it)."""
    nic: str
    """Compute NIC name (``network.toml``)."""
    nics_per_node: int
    """Compute NICs per node (one port each); fewer than the GPUs means GPUs share them in equal groups."""
    pcie_switches: int
    """PCIe switches per node."""
    pcie_generation: int
    """PCIe generation of the GPU links and switch uplinks."""
    cpus: int
    """CPU sockets per node."""
    fabric_switch: str
    """InfiniBand switch name (``network.toml``) of the leaves and spines."""
    su_size: int
    """Nodes per scalable unit of the rail-optimised fabric."""
    fabric: str = "rail_optimized"
    """Default fabric kind (:data:`hwmodel.fabric.FABRICS`); a scenario's ``fabric`` replaces it."""
    nodes_per_leaf: int | None = None
    """Default nodes under each leaf of a ``fat_tree`` (None: as many as the leaf's ports allow)."""
    oversubscription: float = 1.0
    """Default k:1 at the leaf uplinks."""
    leaves_per_pod: int | None = None
    """Default leaves per pod of a three-tier fabric (None: two tiers)."""
    core_oversubscription: float = 1.0
    """Default k:1 at the spine uplinks to the core layer (three tiers)."""
    sources: dict[str, str] = field(default_factory=dict)
    """Key -> source of the figure."""


_STR_KEYS = ("description", "gpu", "nvswitch", "nic", "fabric_switch", "fabric")
_MIN_INT = {"gpus_per_node": 1, "nvswitch_count": 0, "nics_per_node": 0, "pcie_switches": 1,
            "pcie_generation": 1, "cpus": 1, "su_size": 1, "nodes_per_leaf": 1, "leaves_per_pod": 1}
_RATIO_KEYS = ("oversubscription", "core_oversubscription")
_OPTIONAL = ("description", "sources", "fabric", "nodes_per_leaf", "leaves_per_pod") + _RATIO_KEYS
_KEYS = tuple(f.name for f in dataclasses.fields(SystemSpec) if f.name != "name")
_SYSTEMS: dict[str, SystemSpec] = {}
_LOADED = False


def _check_value(where: str, key: str, value: Any) -> None:
    """Raise ValueError naming ``key`` unless ``value`` has the key's type and range."""
    if key in _STR_KEYS:
        if not isinstance(value, str) or (key != "description" and not value.strip()):
            raise ValueError(f"{where}: key {key!r} must be a non-empty string, got {value!r}")
    elif key in _MIN_INT:
        if isinstance(value, bool) or not isinstance(value, int) or value < _MIN_INT[key]:
            raise ValueError(f"{where}: key {key!r} must be an integer >= {_MIN_INT[key]}, got {value!r}")
    elif key in _RATIO_KEYS:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 1:
            raise ValueError(f"{where}: key {key!r} must be a number >= 1 (k for k:1), got {value!r}")
    elif key == "sources":
        if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
            raise ValueError(f"{where}: 'sources' must be a table of key = \"source\"")
        unknown = sorted(set(value) - set(_KEYS))
        if unknown:
            raise ValueError(f"{where}: sources has unknown keys {unknown}; allowed keys: {', '.join(_KEYS)}")


def system_from_table(name: str, table: dict[str, Any], where: str = "systems.toml") -> SystemSpec:
    """A :class:`SystemSpec` from one ``systems.toml`` table. Unknown or missing keys and values of the
    wrong type raise ValueError naming the key (and listing the allowed keys)."""
    where = f"{where} [{name}]"
    unknown = sorted(set(table) - set(_KEYS))
    if unknown:
        raise ValueError(f"{where}: unknown keys {unknown}; allowed keys: {', '.join(_KEYS)}")
    missing = [k for k in _KEYS if k not in table and k not in _OPTIONAL]
    if missing:
        raise ValueError(f"{where}: missing keys {missing}")
    for key, value in table.items():
        _check_value(where, key, value)
    return SystemSpec(name=name, **table)


def _ensure_loaded() -> None:
    global _LOADED
    if _LOADED:
        return
    text = resources.files("hwmodel").joinpath("data").joinpath("systems.toml").read_text(encoding="utf-8")
    for name, table in tomllib.loads(text).items():
        _SYSTEMS[name] = system_from_table(name, table)
    _LOADED = True


def known_systems() -> list[str]:
    """Names :func:`build_system` accepts, in ``systems.toml`` order."""
    _ensure_loaded()
    return list(_SYSTEMS)


def get_system(name: str) -> SystemSpec:
    """The system called ``name`` (case-insensitive, ``_`` as ``-``). Raises UnknownNameError."""
    _ensure_loaded()
    key = str(name).strip().lower().replace("_", "-")
    if key not in _SYSTEMS:
        raise UnknownNameError("system", name, _SYSTEMS)
    return _SYSTEMS[key]


@dataclass(frozen=True, kw_only=True, slots=True)
class NodeShape:
    """How many of a system's GPUs, NICs, PCIe switches and CPU sockets one node has (see
    :func:`node_shape`)."""

    gpus_per_node: int
    nics_per_node: int
    pcie_switches: int
    cpus: int
    nvswitch_count: int


def _count(where: str, key: str, value: Any, lo: int, hi: int, why: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ValueError(f"{where}{key} must be an integer in {lo}..{hi} ({why}), got {value!r}")
    return value


def node_shape(system: SystemSpec, gpus_per_node: int | None = None, nics_per_node: int | None = None,
               *, num_nodes: int = 1, where: str = "") -> NodeShape:
    """The node of ``system`` with ``gpus_per_node`` of its GPUs and ``nics_per_node`` compute NICs.

    A smaller node keeps the system's design per GPU: its NICs default to the system's NIC:GPU ratio
    (at least 1), its PCIe switches to the system's GPUs per switch, its CPU sockets to at most one per
    switch. GPUs share a NIC in equal groups (GPU *j* uses NIC ``j * nics // gpus``, through their PCIe
    switch), so ``nics_per_node`` must divide ``gpus_per_node``. A node of one GPU has no NVLink peers,
    hence no NVSwitch (``nvswitch_count`` 0). ``where`` prefixes the messages (e.g. ``"[system] "``).

    Raises:
        ValueError: one line naming the key: ``gpus_per_node`` outside 1..the system's GPUs per node,
            ``nics_per_node`` outside 0..the system's NICs, not dividing ``gpus_per_node``, leaving a CPU
            socket's GPUs without a NIC on that socket, or 0 on a multi-node cluster (it would have no fabric).
    """
    full = system.gpus_per_node
    g = full if gpus_per_node is None else _count(
        where, "gpus_per_node", gpus_per_node, 1, full, f"a {system.name} node holds {full} GPUs")
    if nics_per_node is None:
        nics = max(1, system.nics_per_node * g // full) if system.nics_per_node else 0
    else:
        nics = _count(where, "nics_per_node", nics_per_node, 0, min(g, system.nics_per_node),
                      f"a {system.name} node has {system.nics_per_node} compute NICs; at most one per GPU")
    pcie = max(1, system.pcie_switches * g // full)
    cpus = min(system.cpus, pcie)
    ok = [d for d in range(1, min(g, system.nics_per_node) + 1)
          if g % d == 0 and _nics_on_every_socket(g, d, pcie, cpus)]
    if nics and g % nics:
        raise ValueError(f"{where}nics_per_node = {nics} does not divide gpus_per_node = {g}: GPUs share NICs "
                         f"in equal groups; allowed: {', '.join(map(str, ok))}")
    if nics == 0 and num_nodes > 1:
        raise ValueError(f"{where}nics_per_node = 0 leaves {num_nodes} nodes without a fabric; "
                         f"give 1..{min(g, system.nics_per_node)}")
    if nics and not _nics_on_every_socket(g, nics, pcie, cpus):
        raise ValueError(f"{where}nics_per_node = {nics} leaves GPUs of the node's {cpus} CPU sockets without a NIC "
                         f"on their own socket (the model has no link between sockets, nor NCCL's PXN relay through "
                         f"an NVLink peer); allowed: {', '.join(map(str, ok))}")
    return NodeShape(gpus_per_node=g, nics_per_node=nics, pcie_switches=pcie, cpus=cpus,
                     nvswitch_count=system.nvswitch_count if g > 1 else 0)


def _nics_on_every_socket(gpus: int, nics: int, pcie: int, cpus: int) -> bool:
    """Whether every GPU's NIC (``j * nics // gpus``) hangs off a PCIe switch of the GPU's own CPU socket,
    with devices spread over switches and switches over sockets in order, as :func:`hwmodel.node.add_node`
    lays them out."""
    def socket(index: int, count: int) -> int:
        return (index * pcie // count) * cpus // pcie

    return all(socket(j, gpus) == socket(j * nics // gpus, nics) for j in range(gpus))


def build_system(name: str, num_nodes: int = 1, fabric: str | None = None, oversubscription: float | None = None,
                 gpu_override: str | GPUSpec | None = None, nic_override: str | NICSpec | None = None, *,
                 su_size: int | None = None, num_spines: int | None = None,
                 nodes_per_leaf: int | None = None, fabric_switch: str | SwitchSpec | None = None,
                 gpus_per_node: int | None = None, nics_per_node: int | None = None,
                 leaves_per_pod: int | None = None, core_oversubscription: float | None = None) -> Topology:
    """Build a named system (:func:`known_systems`: dgx-a100, dgx-a100-40gb, dgx-h100, hgx-h200,
    dgx-b200, dgx-2-v100, gb200-nvl72, gb200-nvl36) of ``num_nodes`` servers. ``gpu_override`` /
    ``nic_override`` swap in another (e.g. what-if) GPU or NIC, by name or spec, ``fabric_switch`` the
    InfiniBand switch (a NIC link runs at the slower of NIC and switch port, so a faster NIC needs a
    faster switch); the node layout stays. ``gpus_per_node`` / ``nics_per_node`` (default: the
    system's) shape a smaller node of the same design (:func:`node_shape`). The fabric keys
    (``fabric``, ``oversubscription``, ``nodes_per_leaf``, ``leaves_per_pod``, ``core_oversubscription``;
    :func:`~hwmodel.fabric.build_cluster`) default to the system's (a published cluster's layout); a
    fabric other than the system's drops its ``nodes_per_leaf`` and pods. Unknown names raise
    :class:`~hwmodel.specs.UnknownNameError`; a bad node shape or fabric arguments ValueError
    (:func:`node_shape`, :func:`~hwmodel.fabric.build_cluster`)."""
    s = get_system(name)
    shape = node_shape(s, gpus_per_node, nics_per_node,
                       num_nodes=num_nodes if isinstance(num_nodes, int) else 1)
    gpu = get_gpu(gpu_override if gpu_override is not None else s.gpu)
    node = generic_node(gpu, gpus_per_node=shape.gpus_per_node, nvswitch=s.nvswitch,
                        nvlink_links=None if shape.gpus_per_node > 1 else 0,
                        nvswitch_count=shape.nvswitch_count, nics_per_node=shape.nics_per_node,
                        nic=nic_override if nic_override is not None else s.nic,
                        pcie_switches=shape.pcie_switches, pcie_generation=s.pcie_generation, cpus=shape.cpus)
    own = fabric is None or fabric == s.fabric  # the system's own fabric keeps its layout defaults
    return build_cluster(node, num_nodes, fabric=s.fabric if fabric is None else fabric,
                         oversubscription=s.oversubscription if oversubscription is None else oversubscription,
                         fabric_switch=fabric_switch or s.fabric_switch,
                         su_size=s.su_size if su_size is None else su_size,
                         nodes_per_leaf=s.nodes_per_leaf if nodes_per_leaf is None and own else nodes_per_leaf,
                         num_spines=num_spines,
                         leaves_per_pod=s.leaves_per_pod if leaves_per_pod is None and own else leaves_per_pod,
                         core_oversubscription=(s.core_oversubscription if core_oversubscription is None
                                                else core_oversubscription),
                         name=s.name)


def dgx_a100(num_nodes: int = 1, *, fabric: str = "rail_optimized", oversubscription: float = 1.0,
             su_size: int | None = None, gpu: str | GPUSpec | None = None, nic: str | NICSpec | None = None,
             fabric_switch: str | SwitchSpec | None = None, num_spines: int | None = None) -> Topology:
    """``build_system("dgx-a100", ...)``: 8 A100-SXM4-80GB, 6 NVSwitch gen2 (aggregated; 12 x 25 GB/s =
    300 GB/s per GPU per direction), 4 PCIe Gen4 switches each with 2 GPUs and 2 HDR ConnectX-6 NICs
    (one per GPU), 2 CPUs; HDR Quantum QM8700 fabric, scalable unit 20 nodes. Defaults (None) and
    sources: ``systems.toml``."""
    return build_system("dgx-a100", num_nodes, fabric, oversubscription, gpu, nic, su_size=su_size,
                        num_spines=num_spines, fabric_switch=fabric_switch)


def dgx_h100(num_nodes: int = 1, *, fabric: str = "rail_optimized", oversubscription: float = 1.0,
             su_size: int | None = None, gpu: str | GPUSpec | None = None, nic: str | NICSpec | None = None,
             fabric_switch: str | SwitchSpec | None = None, num_spines: int | None = None) -> Topology:
    """``build_system("dgx-h100", ...)``: 8 H100-SXM5, 4 NVSwitch gen3 (aggregated; 18 x 25 GB/s =
    450 GB/s per GPU per direction), 8 NDR ConnectX-7 NICs (one per GPU) under 4 PCIe Gen5 switches,
    2 CPUs; NDR Quantum-2 QM9700 fabric, scalable unit 32 nodes. Defaults (None) and sources:
    ``systems.toml``."""
    return build_system("dgx-h100", num_nodes, fabric, oversubscription, gpu, nic, su_size=su_size,
                        num_spines=num_spines, fabric_switch=fabric_switch)


_CLUSTER_KEYS = ("system", "num_nodes", "fabric", "oversubscription", "gpu", "gpu_file", "nic", "su_size",
                 "num_spines", "nodes_per_leaf", "gpus_per_node", "nics_per_node", "leaves_per_pod",
                 "core_oversubscription")


def load_cluster_file(path: str | Path) -> Topology:
    """Build a cluster from a TOML file: ``system`` (see :func:`known_systems`), ``num_nodes``, and
    optionally ``fabric``, ``oversubscription``, ``su_size``, ``num_spines``, ``nodes_per_leaf``,
    ``leaves_per_pod``, ``core_oversubscription``,
    ``gpus_per_node``, ``nics_per_node`` (:func:`node_shape`), ``gpu`` (a GPU name), ``gpu_file`` (a
    what-if GPU file, relative to this file) and ``nic``.
    The keys may sit in a ``[cluster]`` table. Unknown keys raise ValueError listing the allowed ones."""
    path = Path(path)
    with path.open("rb") as fh:
        data = tomllib.load(fh)
    if set(data) == {"cluster"}:
        data = data["cluster"]
    unknown = sorted(set(data) - set(_CLUSTER_KEYS))
    if unknown:
        raise ValueError(f"cluster file {path.name}: unknown keys {unknown}; "
                         f"allowed keys: {', '.join(_CLUSTER_KEYS)}")
    if "system" not in data:
        raise ValueError(f"cluster file {path.name}: key 'system' is required; "
                         f"known: {', '.join(known_systems())}")
    if "gpu" in data and "gpu_file" in data:
        raise ValueError(f"cluster file {path.name}: give 'gpu' or 'gpu_file', not both")
    gpu: str | GPUSpec | None = data.get("gpu")
    if "gpu_file" in data:
        gpu = load_checked_gpu_file(path.parent / data["gpu_file"])
    return build_system(data["system"], data.get("num_nodes", 1), fabric=data.get("fabric"),
                        oversubscription=data.get("oversubscription"), gpu_override=gpu,
                        nic_override=data.get("nic"), su_size=data.get("su_size"),
                        num_spines=data.get("num_spines"), nodes_per_leaf=data.get("nodes_per_leaf"),
                        gpus_per_node=data.get("gpus_per_node"), nics_per_node=data.get("nics_per_node"),
                        leaves_per_pod=data.get("leaves_per_pod"),
                        core_oversubscription=data.get("core_oversubscription"))
