"""Hardware specifications: GPUs, NICs and switches as frozen dataclasses in SI units.

The figures live in ``hwmodel/data/gpus.toml`` and ``hwmodel/data/network.toml``, each with a source
string (and a confidence tag: [SRC], [2ND], [DERIVED], [UNCERTAIN]). Those files store human units
(MHz, TFLOPS, GB, GB/s, Gb/s, us, ns) with the unit in the key name; they are converted to SI in exactly
one place, the ``*_KEYS`` tables of :mod:`hwmodel.spec_units`. In code everything is SI: FLOP/s, bytes, bytes/s, Hz,
seconds. Bandwidths are *per direction* (NVIDIA quotes NVLink as the bidirectional sum).

Lookup is by name, case-insensitive and tolerant of spaces, ``-`` and ``_`` and of an ``NVIDIA``
prefix; short aliases pick documented defaults: ``"A100"`` is A100-SXM4-80GB, ``"H100"`` is H100-SXM5,
``"H200"`` is H200-SXM, ``"B200"`` is B200-HGX, ``"V100"`` is V100-SXM2 (32 GB). Unknown names raise
:class:`UnknownNameError` (a ``KeyError``) listing the known ones.

What-if devices: :func:`load_gpu_file` reads a TOML file that defines a GPU in full, or names a
``base`` GPU and overrides some fields (same keys as ``gpus.toml``, or the SI field names);
:func:`register_gpu` makes a spec available by name; :func:`with_overrides` is the
``dataclasses.replace`` of scenario ``[system]`` overrides, with the same key handling and checks.
"""

from __future__ import annotations

import dataclasses
import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from hwmodel.power import power_limit_clock_ratio
from hwmodel.spec_units import (
    GPU_KEY_MEANING,
    GPU_KEYS,
    GPU_TABLE_SCALE,
    NIC_KEYS,
    SWITCH_KEYS,
    TENSOR_DTYPES,
    Conv,
    check_number,
    convert,
    parse_compute_capability,
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

SWITCH_KINDS: tuple[str, ...] = ("ib", "pcie", "nvswitch")
"""Allowed :attr:`SwitchSpec.kind` values."""

_DTYPE_ALIASES = {
    "float32": "fp32", "float": "fp32", "f32": "fp32",
    "float16": "fp16", "half": "fp16", "f16": "fp16",
    "bfloat16": "bf16",
    "tensorfloat32": "tf32",
    "float8": "fp8", "fp8_e4m3": "fp8", "fp8_e5m2": "fp8", "float8_e4m3fn": "fp8", "float8_e5m2": "fp8",
    "float4": "fp4",
}


class UnknownNameError(KeyError):
    """A GPU, NIC, switch or system name that is not known. Subclasses ``KeyError``.

    ``field`` names what was looked up (``"gpu"``, ``"nic"``, ...), ``name`` the name given and
    ``known`` the canonical names that exist.
    """

    def __init__(self, field: str, name: object, known: Iterable[str]):
        self.field = field
        self.name = name
        self.known = tuple(known)
        super().__init__(f"unknown {field} {name!r}; known {field} names: {', '.join(self.known)}")

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0])


# ----------------------------------------------------------------------------------------------------
# Dataclasses


@dataclass(frozen=True, kw_only=True, slots=True)
class GPUSpec:
    """One GPU model. SI units; bandwidths per direction; FLOP/s dense (no 2:4 sparsity).

    Figures and their sources: ``hwmodel/data/gpus.toml`` (``sources`` maps each field to its source).
    """

    name: str
    """Canonical name, e.g. ``"A100-SXM4-80GB"``."""
    architecture: str
    """Architecture family: Volta, Ampere, Hopper, Blackwell."""
    compute_capability: tuple[int, int]
    """CUDA compute capability, e.g. ``(8, 0)``."""
    sm_count: int
    """Streaming multiprocessors."""
    boost_clock_hz: float
    """Maximum boost clock (Hz)."""
    tensor_flops: dict[str, float]
    """Dense tensor-core peak per math dtype (FLOP/s); keys from :data:`TENSOR_DTYPES`, absent where
    the GPU lacks the dtype (e.g. no ``fp8`` before Hopper). Treat as read-only."""
    fp32_flops: float
    """Non-tensor FP32 peak (FLOP/s)."""
    hbm_capacity_bytes: int
    """HBM capacity (bytes; the datasheet's GB = 10^9 bytes)."""
    hbm_bandwidth_Bps: float
    """HBM peak bandwidth (bytes/s)."""
    l2_bytes: int
    """L2 cache size (bytes)."""
    nvlink_generation: int
    """NVLink generation (0: none)."""
    nvlink_links: int
    """NVLink links per GPU (0: none)."""
    nvlink_bandwidth_per_link_Bps: float
    """NVLink line rate per link, per direction (bytes/s)."""
    nccl_nvlink_bandwidth_per_link_Bps: float
    """NCCL's app-level per-link NVLink bandwidth (nccl ``src/graph/topo.h`` ``SMxx_NVLINK_BW``), per
    direction (bytes/s); about 80% of the line rate."""
    pcie_generation: int
    """PCIe generation of the GPU's host link (x16)."""
    pcie_bandwidth_Bps: float
    """Raw PCIe x16 bandwidth per direction (bytes/s)."""
    copy_engines: int
    """Asynchronous copy engines (CUDA ``asyncEngineCount``)."""
    tdp_w: float | None = None
    """Rated board power (W): the limit the datasheet peaks are quoted for and the default limit the part
    runs at (``None``: unknown, a what-if GPU without power data)."""
    power_limit_w: float | None = None
    """Configured board power limit (W, ``nvidia-smi -pl``) in ``(static power, tdp_w]``; ``None``: the
    rated ``tdp_w``. Below it the SM clock falls by :func:`hwmodel.power.power_limit_clock_ratio`."""
    sources: dict[str, str] = field(default_factory=dict)
    """Field name -> source of the figure."""

    def __post_init__(self) -> None:
        owner = f"GPUSpec {self.name!r}"
        if not isinstance(self.name, str) or not self.name.strip():
            raise ValueError(f"GPUSpec: field 'name' must be a non-empty string, got {self.name!r}")
        object.__setattr__(self, "compute_capability", parse_compute_capability(owner, self.compute_capability))
        for fname in ("sm_count", "hbm_capacity_bytes", "l2_bytes", "pcie_generation"):
            check_number(owner, fname, getattr(self, fname), integer=True)
        for fname in ("nvlink_generation", "nvlink_links", "copy_engines"):
            check_number(owner, fname, getattr(self, fname), positive=False, integer=True)
        for fname in ("boost_clock_hz", "fp32_flops", "hbm_bandwidth_Bps", "pcie_bandwidth_Bps"):
            check_number(owner, fname, getattr(self, fname))
        for fname in ("nvlink_bandwidth_per_link_Bps", "nccl_nvlink_bandwidth_per_link_Bps"):
            check_number(owner, fname, getattr(self, fname), positive=self.nvlink_links > 0)
        for fname in ("sm_count", "hbm_capacity_bytes", "l2_bytes", "pcie_generation",
                      "nvlink_generation", "nvlink_links", "copy_engines"):
            object.__setattr__(self, fname, int(getattr(self, fname)))
        if not isinstance(self.tensor_flops, Mapping):
            raise ValueError(f"{owner}: field 'tensor_flops' must be a dtype -> FLOP/s table")
        for dtype, value in self.tensor_flops.items():
            if dtype not in TENSOR_DTYPES:
                raise ValueError(f"{owner}: field 'tensor_flops' has unknown dtype {dtype!r}; "
                                 f"allowed: {', '.join(TENSOR_DTYPES)}")
            check_number(owner, f"tensor_flops[{dtype!r}]", value)
        object.__setattr__(self, "tensor_flops", {k: float(v) for k, v in self.tensor_flops.items()})
        object.__setattr__(self, "sources", dict(self.sources))
        self._check_power(owner)

    def _check_power(self, owner: str) -> None:
        for fname, key in (("tdp_w", "tdp_W"), ("power_limit_w", "power_limit_W")):  # named as gpus.toml
            if getattr(self, fname) is not None:
                check_number(owner, key, getattr(self, fname))
                object.__setattr__(self, fname, float(getattr(self, fname)))
        if self.power_limit_w is None:
            return
        if self.tdp_w is None:
            raise ValueError(f"{owner}: field 'power_limit_W' needs the rated power 'tdp_W' to scale from")
        try:
            power_limit_clock_ratio(self.power_limit_w, self.tdp_w)
        except ValueError as exc:
            raise ValueError(f"{owner}: field {str(exc).replace('power_limit_w', 'power_limit_W')}") from None

    def __hash__(self) -> int:  # dict fields are unhashable; a spec is identified by its scalar fields
        return hash((self.name, self.sm_count, self.boost_clock_hz, tuple(sorted(self.tensor_flops.items())),
                     self.hbm_capacity_bytes, self.hbm_bandwidth_Bps, self.nvlink_links,
                     self.nvlink_bandwidth_per_link_Bps, self.pcie_bandwidth_Bps))

    @property
    def supported_dtypes(self) -> tuple[str, ...]:
        """Dtypes :meth:`peak_flops` accepts: ``fp32`` plus the tensor dtypes this GPU has."""
        return ("fp32",) + tuple(d for d in TENSOR_DTYPES if d in self.tensor_flops)

    def peak_flops(self, dtype: str) -> float:
        """Peak dense FLOP/s for ``dtype`` (``fp32`` is the non-tensor peak).

        Accepts ``fp32, tf32, fp16, bf16, fp8, fp4`` and torch-style spellings (``bfloat16``...).
        Raises ValueError naming the GPU and its supported dtypes when it lacks ``dtype``.
        """
        key = str(dtype).strip().lower()
        key = _DTYPE_ALIASES.get(key, key)
        if key == "fp32":
            return self.fp32_flops
        try:
            return self.tensor_flops[key]
        except KeyError:
            raise ValueError(f"GPU {self.name!r} has no {dtype!r} peak; supported dtypes: "
                             f"{', '.join(self.supported_dtypes)}") from None

    @property
    def nvlink_bandwidth_Bps(self) -> float:
        """Total NVLink line rate per direction (bytes/s): links x per-link (A100: 12 x 25e9 = 300e9)."""
        return self.nvlink_links * self.nvlink_bandwidth_per_link_Bps

    @property
    def nccl_nvlink_bandwidth_Bps(self) -> float:
        """NCCL's app-level NVLink bandwidth per GPU per direction (bytes/s): A100 12 x 20e9 = 240e9,
        H100 18 x 20.6e9 = 370.8e9 (nccl topo.h)."""
        return self.nvlink_links * self.nccl_nvlink_bandwidth_per_link_Bps

    @property
    def nccl_pcie_bandwidth_Bps(self) -> float:
        """NCCL's modelled PCIe x16 bandwidth for this GPU's generation (bytes/s): Gen4 24e9, Gen5 48e9
        (nccl topo.cc ``width * speed / 80``); 3/4 of the raw rate for generations not tabulated."""
        return nccl_pcie_link_bandwidth_Bps(self.pcie_generation, default=0.75 * self.pcie_bandwidth_Bps)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict of the SI fields (inverse: :meth:`from_dict`)."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        d["compute_capability"] = list(self.compute_capability)
        d["tensor_flops"] = dict(self.tensor_flops)
        d["sources"] = dict(self.sources)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> GPUSpec:
        """Build from SI field names (as :meth:`to_dict` writes); unknown keys raise ValueError."""
        return _from_si_dict(cls, d)


@dataclass(frozen=True, kw_only=True, slots=True)
class NICSpec:
    """A network adapter port (one port per NIC). SI units; bandwidth per direction.

    Figures and sources: ``hwmodel/data/network.toml``.
    """

    name: str
    """Canonical name, e.g. ``"ConnectX-6-HDR"``."""
    bandwidth_Bps: float
    """Port line rate per direction (bytes/s): HDR 25e9, NDR 50e9, XDR 100e9 (nccl net_ib/init.cc)."""
    latency_s: float
    """End-to-end NIC-to-NIC base latency without switch hops (s), ~1 us (perftest issue 131)."""
    pcie_generation: int
    """PCIe generation of the NIC's host link."""
    sources: dict[str, str] = field(default_factory=dict)
    """Field name -> source of the figure."""

    def __post_init__(self) -> None:
        owner = f"NICSpec {self.name!r}"
        if not isinstance(self.name, str) or not self.name.strip():
            raise ValueError(f"NICSpec: field 'name' must be a non-empty string, got {self.name!r}")
        check_number(owner, "bandwidth_Bps", self.bandwidth_Bps)
        check_number(owner, "latency_s", self.latency_s, positive=False)
        check_number(owner, "pcie_generation", self.pcie_generation, integer=True)
        object.__setattr__(self, "pcie_generation", int(self.pcie_generation))
        object.__setattr__(self, "sources", dict(self.sources))

    def __hash__(self) -> int:
        return hash((self.name, self.bandwidth_Bps, self.latency_s, self.pcie_generation))

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict of the SI fields (inverse: :meth:`from_dict`)."""
        return {f.name: (dict(v) if isinstance(v := getattr(self, f.name), dict) else v)
                for f in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> NICSpec:
        """Build from SI field names; unknown keys raise ValueError."""
        return _from_si_dict(cls, d)


@dataclass(frozen=True, kw_only=True, slots=True)
class SwitchSpec:
    """A switch chip: InfiniBand (``ib``), PCIe (``pcie``) or NVSwitch (``nvswitch``). SI units.

    Figures and sources: ``hwmodel/data/network.toml``.
    """

    name: str
    """Canonical name, e.g. ``"QM9700"``."""
    kind: str
    """One of :data:`SWITCH_KINDS`."""
    radix: int
    """Ports."""
    hop_latency_s: float
    """Port-to-port forwarding latency (s)."""
    port_bandwidth_Bps: float
    """Per-port bandwidth per direction (bytes/s)."""
    sources: dict[str, str] = field(default_factory=dict)
    """Field name -> source of the figure."""

    def __post_init__(self) -> None:
        owner = f"SwitchSpec {self.name!r}"
        if not isinstance(self.name, str) or not self.name.strip():
            raise ValueError(f"SwitchSpec: field 'name' must be a non-empty string, got {self.name!r}")
        if self.kind not in SWITCH_KINDS:
            raise ValueError(f"{owner}: field 'kind' must be one of {', '.join(SWITCH_KINDS)}, "
                             f"got {self.kind!r}")
        check_number(owner, "radix", self.radix, integer=True)
        check_number(owner, "hop_latency_s", self.hop_latency_s, positive=False)
        check_number(owner, "port_bandwidth_Bps", self.port_bandwidth_Bps)
        object.__setattr__(self, "radix", int(self.radix))
        object.__setattr__(self, "sources", dict(self.sources))

    def __hash__(self) -> int:
        return hash((self.name, self.kind, self.radix, self.hop_latency_s, self.port_bandwidth_Bps))

    @property
    def switching_capacity_Bps(self) -> float:
        """Aggregate capacity per direction (bytes/s): radix x port bandwidth."""
        return self.radix * self.port_bandwidth_Bps

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict of the SI fields (inverse: :meth:`from_dict`)."""
        return {f.name: (dict(v) if isinstance(v := getattr(self, f.name), dict) else v)
                for f in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SwitchSpec:
        """Build from SI field names; unknown keys raise ValueError."""
        return _from_si_dict(cls, d)


Spec = GPUSpec | NICSpec | SwitchSpec
"""Any of the spec dataclasses."""


def _from_si_dict(cls: type, d: Mapping[str, Any]) -> Any:
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(d) - set(names))
    if unknown:
        raise ValueError(f"{cls.__name__}: unknown keys {unknown}; allowed keys: {', '.join(names)}")
    missing = [n for n in names if n not in d and n != "sources"]
    if missing:
        raise ValueError(f"{cls.__name__}: missing keys {missing}")
    return cls(**dict(d))


# ----------------------------------------------------------------------------------------------------
# File keys (human units) -> SI fields: the tables and checks are in hwmodel.spec_units.

def _keys_for(cls: type) -> tuple[dict[str, Conv], dict[str, float]]:
    if cls is GPUSpec:
        return GPU_KEYS, GPU_TABLE_SCALE
    if cls is NICSpec:
        return NIC_KEYS, {}
    if cls is SwitchSpec:
        return SWITCH_KEYS, {}
    raise TypeError(f"not a spec class: {cls!r}")


def _convert(cls: type, table: Mapping[str, Any], where: str) -> tuple[dict[str, Any], dict[str, str]]:
    """File keys (human units, or ``cls``'s SI field names) -> (SI fields, sources keyed by SI field
    name); ValueError naming the key as :func:`hwmodel.spec_units.convert`."""
    keys, table_scale = _keys_for(cls)
    si_names = [f.name for f in dataclasses.fields(cls) if f.name != "sources"]
    return convert(keys, table_scale, si_names, table, where)


def _build(cls: type, table: Mapping[str, Any], where: str, *, default_source: str | None = None) -> Any:
    fields, sources = _convert(cls, table, where)
    missing = [f.name for f in dataclasses.fields(cls) if f.name not in fields and f.name != "sources"
               and f.default is dataclasses.MISSING]
    if missing:
        keys, _ = _keys_for(cls)
        hint = {fname: k for k, (fname, _) in keys.items()}
        named = [hint.get(m, m) for m in missing]
        what = "; ".join(f"{k}: {GPU_KEY_MEANING[k]}" for k in named if cls is GPUSpec and k in GPU_KEY_MEANING)
        raise ValueError(f"{where}: missing keys {named}" + (f" ({what}); or give base = \"<a known GPU>\" "
                                                              f"and only the keys that differ" if what else ""))
    if default_source is not None:
        for fname in fields:
            sources.setdefault(fname, default_source)
    return cls(**fields, sources=sources)


def with_overrides(spec: Spec, *, source: str = "user override", **overrides: Any) -> Spec:
    """A copy of ``spec`` with some fields replaced (``dataclasses.replace`` with checks).

    Keys are the SI field names (``nvlink_links=24``, ``hbm_bandwidth_Bps=4e12``) or the data files'
    human-unit keys (``hbm_bandwidth_GBps=4000``). ``tensor_flops`` / ``tensor_TFLOPS`` are *merged*
    into the existing table. Overridden fields get ``source`` in :attr:`sources` unless a ``sources``
    mapping is given. Unknown keys raise ValueError listing the allowed keys; bad values raise
    ValueError naming the field.
    """
    cls = type(spec)
    where = f"overrides of {cls.__name__} {spec.name!r}"
    fields, sources = _convert(cls, overrides, where)
    if "tensor_flops" in fields:
        fields["tensor_flops"] = {**spec.tensor_flops, **fields["tensor_flops"]}  # type: ignore[union-attr]
    new_sources = dict(spec.sources)
    for fname in fields:
        new_sources[fname] = sources.get(fname, source)
    new_sources.update(sources)
    return dataclasses.replace(spec, **fields, sources=new_sources)


# ----------------------------------------------------------------------------------------------------
# Registries


def _norm(name: str) -> str:
    s = str(name).strip().lower()
    s = re.sub(r"^nvidia[\s_-]*", "", s)
    return re.sub(r"[^a-z0-9.]", "", s)


class _Registry:
    """Canonical name -> spec, plus normalised names and aliases -> canonical name."""

    def __init__(self, field: str):
        self.field = field
        self.specs: dict[str, Any] = {}
        self.aliases: dict[str, str] = {}
        self.alias_names: dict[str, list[str]] = {}
        """Canonical name -> its aliases as written (``trainsim list``)."""

    def add(self, spec: Any, aliases: Iterable[str] = (), *, replace: bool = False) -> None:
        old_name = self.aliases.get(_norm(spec.name))
        if old_name is not None and not replace and self.specs[old_name] != spec:
            raise ValueError(f"{self.field} {spec.name!r} is already registered with different figures; "
                             f"pass replace=True or choose another name")
        for alias in (spec.name, *aliases):
            key = _norm(alias)
            owner = self.aliases.get(key)
            if owner is not None and owner != spec.name and not replace:
                raise ValueError(f"{self.field} alias {alias!r} already names {owner!r}")
            self.aliases[key] = spec.name
        self.specs[spec.name] = spec
        self.alias_names[spec.name] = list(aliases)

    def get(self, name: Any) -> Any:
        if isinstance(name, (GPUSpec, NICSpec, SwitchSpec)):
            return name
        canonical = self.aliases.get(_norm(name)) if isinstance(name, str) else None
        if canonical is None:
            raise UnknownNameError(self.field, name, self.specs)
        return self.specs[canonical]


_GPUS = _Registry("gpu")
_NICS = _Registry("nic")
_SWITCHES = _Registry("switch")
_PCIE: dict[int, tuple[float, float]] = {}
"""PCIe generation -> (raw x16 bytes/s per direction, NCCL's modelled x16 bytes/s)."""
_LOADED = False


def _read_data(filename: str) -> dict[str, Any]:
    text = resources.files(__package__ or "hwmodel").joinpath("data").joinpath(filename).read_text(encoding="utf-8")
    return tomllib.loads(text)


def _ensure_loaded() -> None:
    global _LOADED
    if _LOADED:
        return
    for name, table in _read_data("gpus.toml").items():
        table = dict(table)
        aliases = table.pop("aliases", ())
        _GPUS.add(_build(GPUSpec, {"name": name, **table}, f"gpus.toml [{name}]"), aliases)
    net = _read_data("network.toml")
    for section, cls, reg in (("nic", NICSpec, _NICS), ("switch", SwitchSpec, _SWITCHES)):
        for name, table in net.get(section, {}).items():
            table = dict(table)
            aliases = table.pop("aliases", ())
            reg.add(_build(cls, {"name": name, **table}, f"network.toml [{section}.{name}]"), aliases)
    for gen, table in net.get("pcie", {}).items():
        if gen != "sources":
            _PCIE[int(gen)] = (table["x16_bandwidth_GBps"] * 1e9, table["nccl_x16_bandwidth_GBps"] * 1e9)
    _LOADED = True


def get_gpu(name: str | GPUSpec) -> GPUSpec:
    """The GPU called ``name`` (canonical name or alias, case-insensitive). A GPUSpec is returned as is.

    Defaults: ``A100`` -> A100-SXM4-80GB, ``H100`` -> H100-SXM5, ``H200`` -> H200-SXM,
    ``B200`` -> B200-HGX, ``V100`` -> V100-SXM2. Raises :class:`UnknownNameError`.
    """
    _ensure_loaded()
    return _GPUS.get(name)


def shipped_gpus() -> list[str]:
    """Canonical names of the GPUs in ``hwmodel/data/gpus.toml``, not those :func:`register_gpu` added."""
    return list(_read_data("gpus.toml"))


def get_nic(name: str | NICSpec) -> NICSpec:
    """The NIC called ``name`` (e.g. ``ConnectX-7-NDR``, ``ndr``, ``cx6``). Raises UnknownNameError."""
    _ensure_loaded()
    return _NICS.get(name)


def get_switch(name: str | SwitchSpec) -> SwitchSpec:
    """The switch called ``name`` (e.g. ``QM9700``, ``quantum-2``, ``NVSwitch-gen3``,
    ``PCIe-Gen4-switch``). Raises UnknownNameError."""
    _ensure_loaded()
    return _SWITCHES.get(name)


def get_pcie_switch(generation: int) -> SwitchSpec:
    """The PCIe switch of a generation (3-6)."""
    _ensure_loaded()
    return _SWITCHES.get(f"PCIe-Gen{int(generation)}-switch")


def known_gpus() -> list[str]:
    """Canonical names of the known GPUs (built in and registered), in definition order."""
    _ensure_loaded()
    return list(_GPUS.specs)


def known_nics() -> list[str]:
    """Canonical names of the known NICs."""
    _ensure_loaded()
    return list(_NICS.specs)


def aliases_of(field: str, name: str) -> list[str]:
    """The aliases registered with the ``field`` (``gpu``, ``nic``, ``switch``) called ``name``, as written."""
    _ensure_loaded()
    registries = {"gpu": _GPUS, "nic": _NICS, "switch": _SWITCHES}
    if field not in registries:
        raise ValueError(f"field must be one of {', '.join(registries)}, got {field!r}")
    reg = registries[field]
    return list(reg.alias_names.get(reg.get(name).name, ()))


def known_switches(kind: str | None = None) -> list[str]:
    """Canonical names of the known switches, optionally only one ``kind`` (ib, pcie, nvswitch)."""
    _ensure_loaded()
    if kind is not None and kind not in SWITCH_KINDS:
        raise ValueError(f"kind must be one of {', '.join(SWITCH_KINDS)}, got {kind!r}")
    return [n for n, s in _SWITCHES.specs.items() if kind is None or s.kind == kind]


def register_gpu(spec: GPUSpec, *, aliases: Iterable[str] = (), replace: bool = False) -> GPUSpec:
    """Make ``spec`` available to :func:`get_gpu` under its name (and ``aliases``).

    Registering the same figures again is a no-op; a different spec under a taken name raises
    ValueError unless ``replace``.
    """
    if not isinstance(spec, GPUSpec):
        raise TypeError(f"register_gpu expects a GPUSpec, got {type(spec).__name__}")
    _ensure_loaded()
    _GPUS.add(spec, aliases, replace=replace)
    return spec


def register_nic(spec: NICSpec, *, aliases: Iterable[str] = (), replace: bool = False) -> NICSpec:
    """Make ``spec`` available to :func:`get_nic` (see :func:`register_gpu`)."""
    if not isinstance(spec, NICSpec):
        raise TypeError(f"register_nic expects a NICSpec, got {type(spec).__name__}")
    _ensure_loaded()
    _NICS.add(spec, aliases, replace=replace)
    return spec


def pcie_link_bandwidth_Bps(generation: int, lanes: int = 16) -> float:
    """Raw PCIe bandwidth per direction (bytes/s) of a link: Gen3/4/5/6 x16 = 16/32/64/128e9."""
    _ensure_loaded()
    if int(generation) not in _PCIE:
        raise ValueError(f"unknown PCIe generation {generation!r}; known: {sorted(_PCIE)}")
    return _PCIE[int(generation)][0] * lanes / 16


def nccl_pcie_link_bandwidth_Bps(generation: int, lanes: int = 16, *, default: float | None = None) -> float:
    """NCCL's modelled PCIe bandwidth (bytes/s): ``width * speed / 80`` GB/s in nccl topo.cc,
    i.e. Gen3/4/5/6 x16 = 12/24/48/96e9. Unknown generations return ``default`` or raise ValueError."""
    _ensure_loaded()
    if int(generation) not in _PCIE:
        if default is not None:
            return default
        raise ValueError(f"unknown PCIe generation {generation!r}; known: {sorted(_PCIE)}")
    return _PCIE[int(generation)][1] * lanes / 16


def load_gpu_file(path: str | Path, *, register: bool = False) -> GPUSpec:
    """Read a what-if GPU from a TOML file (keys as in ``gpus.toml``, or SI field names).

    Either the file defines every field, or it says ``base = "A100-SXM4-80GB"`` and overrides some
    (then ``name`` is required, so results are not labelled with the base's name). ``tensor_TFLOPS``
    overrides merge into the base's table. A ``[sources]`` table may give sources; overridden fields
    without one get ``"what-if file <file name>"``. The keys may also sit in a ``[gpu]`` table.
    ``aliases = [...]`` are registered with the GPU when ``register`` is true.
    """
    path = Path(path)
    with path.open("rb") as fh:
        data = tomllib.load(fh)
    if set(data) == {"gpu"} and isinstance(data["gpu"], Mapping):
        data = data["gpu"]
    data = dict(data)
    where = f"GPU file {path.name}"
    aliases = data.pop("aliases", ())
    base = data.pop("base", None)
    note = f"what-if file {path.name}"
    if base is None:
        spec = _build(GPUSpec, data, where, default_source=note)
    else:
        if "name" not in data:
            raise ValueError(f"{where}: key 'name' is required with 'base' (e.g. name = \"{base}-whatif\")")
        spec = with_overrides(get_gpu(base), source=note, **data)
    if register:
        register_gpu(spec, aliases=aliases)
    return spec
