"""NCCL 2.30.7's analytical tuning model (``src/graph/tuning.cc``, commit ``5067397c``) in pure Python.

NCCL predicts, for every (collective, algorithm, protocol),

    time_us = latency_us * latCount + nBytes / (1000 * algBw_GBps)

and runs the cheapest enabled pair (``topoGetAlgoInfo``, ``src/enqueue.cc``). This module runs
``ncclTopoTuneModel`` (latencies and bandwidths) and ``ncclTopoGetAlgoTime`` (the size-dependent
corrections) over the algorithm registry (:mod:`hwmodel.nccl.algorithms`: Tree, Ring, NVLS, NVLSTree,
PAT, in NCCL's order) and the LL, LL128 and Simple protocols. The generic part of the model (table
indices, ``llMaxBw``, the intra/inter-node step latencies) is computed here once; each algorithm object
supplies its own terms and availability. CollNet (needs a SHARP plugin, and with it multi-node NVLS) is
not modelled.

How the simulator uses it (:mod:`hwmodel.nccl.engine`): :func:`choose` picks the pair and channels;
:func:`latency_s` and the algorithm bandwidth per channel then feed NCCL's chunk pipeline
(:mod:`hwmodel.nccl.chunked`, in closed form :mod:`hwmodel.nccl.pipeline_closed`) as per-step latency
and one channel's rate cap, and the pipeline's time sets the collective activity's latency and *rate
bound*. The collective therefore runs at NCCL's modelled bandwidth per channel unless a link it loads is
shared and binds first (max-min fair share below the bound). :data:`PROTOCOL_EFFICIENCY` (payload share of the wire) and
the app-level link efficiencies set how many bytes each link carries. :func:`predict_time_s` and
:func:`choose` give NCCL's own estimate and decision.

Units: public functions take bytes and return seconds and bytes/s. NCCL's tables keep their units
(µs, GB/s = 1e9 B/s) in names ending ``_US`` / ``_GBPS``.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from hwmodel.nccl import algorithms as _algorithms
from hwmodel.nccl import calibration as _calibration
from hwmodel.nccl.algorithms.base import Algorithm, ModelInputs
from hwmodel.nccl.algorithms.nvls import NVLS_EFFICIENCY
from hwmodel.nccl.algorithms.nvls_tree import PER_CH_MAX_NVLS_TREE_BW_GBPS
from hwmodel.nccl.algorithms.ring import (
    FP8_RING_PENALTY,
    NET_OVERHEAD_US,
    PER_CH_MAX_RING_LL128_BW_GBPS,
    RING_PLATEAU_FACTOR,
    ring_steps,
)
from hwmodel.nccl.algorithms.tree import PER_CH_MAX_TREE_BW_GBPS, PER_CH_MAX_TREE_LL128_BW_GBPS, TREE_CORRECTION_FACTOR
from hwmodel.nccl.channels import (
    ALGORITHM_ALIASES,
    GB,
    CommTopology,
    arch_from_compute_capability,
    nccl_channels,
    p2p_plan,
)
from hwmodel.nccl.comm import PROTOCOL_INDEX, PROTOCOLS
from hwmodel.nccl.tuner_config import TunerConfig, TunerRule

__all__ = [
    "ALGORITHMS",
    "BASE_LATENCY_US",
    "COLLECTIVES",
    "Choice",
    "FP8_RING_PENALTY",
    "HW_LATENCY_US",
    "IB_APP_EFFICIENCY",
    "LL_MAX_BW_GBPS",
    "NCCL_VERSION",
    "NET_OVERHEAD_US",
    "NVLINK_APP_EFFICIENCY",
    "NVLS_EFFICIENCY",
    "PER_CH_MAX_NVLS_TREE_BW_GBPS",
    "PER_CH_MAX_RING_LL128_BW_GBPS",
    "PER_CH_MAX_TREE_BW_GBPS",
    "PER_CH_MAX_TREE_LL128_BW_GBPS",
    "PROTOCOLS",
    "PROTOCOL_EFFICIENCY",
    "RING_PLATEAU_FACTOR",
    "TREE_CORRECTION_FACTOR",
    "CommTopology",
    "NET_APP_EFFICIENCY",
    "algo_bandwidth_Bps",
    "arch_of",
    "nccl_channels",
    "normalise_algorithm",
    "normalise_protocol",
    "p2p_channels_and_latency",
    "ring_steps",
    "bus_bandwidth_Bps",
    "choose",
    "default_overrides",
    "enabled_pairs",
    "get_default_overrides",
    "is_enabled",
    "latency_s",
    "net_overhead_s",
    "overrides",
    "predict_time_s",
    "set_default_overrides",
    "set_default_tuner_config",
    "get_default_tuner_config",
    "tuner_config",
]

NCCL_VERSION = "2.30.7"
"""NCCL release whose tuning model this module reproduces (``makefiles/version.mk`` at ``5067397c``)."""

ALGORITHMS: tuple[str, ...] = tuple(_algorithms.ALGORITHMS)
"""Modelled algorithms, in NCCL's ``NCCL_ALGO_*`` order (the registry's order; ties go to the earlier
one, as in ``topoGetAlgoInfo``'s strict ``<``). ``nvls_tree`` is NCCL's ``NVLSTree`` (``NCCL_ALGO``
token; ``nvlstree`` is accepted too)."""

COLLECTIVES: tuple[str, ...] = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce")
"""Collectives the tuning model covers (``hwmodel.ir`` names). ``all_to_all`` and send/recv are p2p:
see :func:`hwmodel.nccl.channels.p2p_plan`."""

BASE_LATENCY_US: dict[str, tuple[float, float, float]] = {
    name: a.base_latency_us for name, a in _algorithms.ALGORITHMS.items()}
"""``baseLatencies`` in µs (tuning.cc 2.30.7), per algorithm (each module holds its row)."""

HW_LATENCY_US: dict[str, dict[str, tuple[float, float, float]]] = {
    hw: {name: a.hw_latency_us[hw] for name, a in _algorithms.ALGORITHMS.items()} for hw in ("nvlink", "pci", "net")}
"""``hwLatencies[NVLINK|PCI|NET]`` in µs per step (tuning.cc 2.30.7), per algorithm."""

LL_MAX_BW_GBPS: tuple[tuple[float, float, float], ...] = (
    (39.0, 39.0, 20.4),
    (87.7, 22.5, 19.0),
    (141.0, 45.0, 35.0),
    (2 * 141.0, 2 * 45.0, 2 * 35.0),
)
"""``llMaxBws`` GB/s (tuning.cc 2.30.7). Row: GPU generation (Volta..Blackwell) for one node, CPU
vendor for several (0 Intel, 1 AMD); column: nNodes 1 / 2 / >2."""

MAX_DEV_WORK_BATCH_COLLS = 8
"""``NCCL_MAX_DEV_WORK_BATCH_COLLS = NCCL_MAX_DEV_WORK_BATCH_BYTES (1024) / sizeof(ncclDevWorkColl)
(128)`` (device.h 2.30.7, size derived from the struct layout): non-Ring latencies are paid once per
8 aggregated operations."""

# ------------------------------------------------------------------------------------------------
# Efficiencies for the fluid simulator
# ------------------------------------------------------------------------------------------------

PROTOCOL_EFFICIENCY: dict[str, float] = {"ll": 0.5, "ll128": 120.0 / 128.0, "simple": 1.0}
"""Payload fraction of the bytes a protocol puts on the wire.

* LL: a 16-byte ``ncclLLFifoLine`` carries 8 B of data and two 4-byte flags (nccl ``device.h``);
  sjeaugey (nccl #281): "LL maximum bandwidth 50% of the peak".
* LL128: 128-byte lines with 120 B of data and an 8-byte flag (``NCCL_LL128_LINESIZE 128``,
  ``NCCL_LL128_DATAELEMS 15`` of 16 uint64; tuning.cc's comment "0.92 /*120.0/128.0*/").
* Simple: payload only (flags live in a separate FIFO), 1.0.
"""

NVLINK_APP_EFFICIENCY: dict[str, float] = {
    "volta": 20.0 / 25.0,
    "ampere": 20.0 / 25.0,
    "hopper": 20.6 / 25.0,
    "blackwell": 40.1 / 50.0,
}
"""App-level NVLink bandwidth / per-link line rate, by GPU generation: ``SMxx_NVLINK_BW`` (nccl
``src/graph/topo.h`` 2.30.7: 20, 20, 20.6, 40.1 GB/s) over NVLink2/3/4 25 GB/s and NVLink5 50 GB/s per
link and direction. NCCL maintainer: "app-level bandwidth is 80% of peak" (nccl #1054); H100: "450GB/s
is the line rate ... NCCL can get an effective NVLink bandwidth of 370GB/s" (nccl-tests #212)."""

IB_APP_EFFICIENCY = _calibration.ib_app_efficiency()
"""Achieved / line rate for one InfiniBand NIC through NCCL, 0.94 (``[nccl] ib_app_efficiency`` in
``hwmodel/data/calibration.toml``, which cites the measurements it is read off)."""

# ------------------------------------------------------------------------------------------------
# Global overrides (NCCL_ALGO / NCCL_PROTO)
# ------------------------------------------------------------------------------------------------

_DEFAULT_ALGO: frozenset[str] | None = None
_DEFAULT_PROTO: frozenset[str] | None = None
_DEFAULT_TUNER: TunerConfig | None = None


_Names = str | Iterable[str] | None


def _parse_list(value: _Names, allowed: tuple[str, ...], what: str) -> frozenset[str] | None:
    """Parse an NCCL_ALGO/NCCL_PROTO-style value: a name, a comma list, or ``^``-prefixed exclusions."""
    if value is None:
        return None
    if isinstance(value, str):
        text = value.strip()
        exclude = text.startswith("^")
        items = [x.strip().lower() for x in text.lstrip("^").split(",") if x.strip()]
    else:
        exclude = False
        items = [str(x).strip().lower() for x in value]
    if not items:
        raise ValueError(f"empty NCCL {what} list; allowed: {', '.join(allowed)}")
    items = [ALGORITHM_ALIASES.get(x, x) for x in items] if what == "algorithm" else items
    for x in items:
        if x not in allowed:
            raise ValueError(f"unknown NCCL {what} {x!r}; allowed: {', '.join(allowed)}")
    return frozenset(allowed) - frozenset(items) if exclude else frozenset(items)


def set_default_overrides(algo: _Names = None, proto: _Names = None) -> None:
    """Set module-wide algorithm/protocol restrictions, like the ``NCCL_ALGO``/``NCCL_PROTO`` env vars.

    Values: a name (``"ring"``), a comma list (``"ring,tree"``), an exclusion (``"^ll128"``), or
    ``None`` to clear. Allowed algorithms: the registry's (tree, ring, nvls, nvls_tree -- also spelt
    ``nvlstree``, NCCL's ``NVLSTree`` -- and pat); protocols: simple, ll, ll128.

    Raises:
        ValueError: unknown name.
    """
    global _DEFAULT_ALGO, _DEFAULT_PROTO
    a = _parse_list(algo, ALGORITHMS_USER, "algorithm")
    p = _parse_list(proto, PROTOCOLS_USER, "protocol")
    _DEFAULT_ALGO, _DEFAULT_PROTO = a, p


def get_default_overrides() -> tuple[frozenset[str] | None, frozenset[str] | None]:
    """The current module-wide (algorithms, protocols) restrictions; ``None`` = all enabled."""
    return _DEFAULT_ALGO, _DEFAULT_PROTO


@contextlib.contextmanager
def overrides(algo: _Names = None, proto: _Names = None) -> Iterator[None]:
    """Context manager form of :func:`set_default_overrides`; restores the previous values on exit."""
    saved = (_DEFAULT_ALGO, _DEFAULT_PROTO)
    set_default_overrides(algo, proto)
    try:
        yield
    finally:
        _set_raw(*saved)


default_overrides = overrides
"""Alias of :func:`overrides`."""


def set_default_tuner_config(config: TunerConfig | None) -> None:
    """Install module-wide tuner-plugin rules (:mod:`hwmodel.nccl.tuner_config`), like setting
    ``NCCL_TUNER_PLUGIN`` + ``NCCL_TUNER_CONFIG_FILE`` for every communicator; ``None`` removes them."""
    global _DEFAULT_TUNER
    if config is not None and not isinstance(config, TunerConfig):
        raise TypeError(f"tuner config must be a TunerConfig or None, got {type(config).__name__}")
    _DEFAULT_TUNER = config


def get_default_tuner_config() -> TunerConfig | None:
    """The module-wide tuner-plugin rules, or ``None``."""
    return _DEFAULT_TUNER


@contextlib.contextmanager
def tuner_config(config: TunerConfig | None) -> Iterator[None]:
    """Context manager form of :func:`set_default_tuner_config`; restores the previous rules on exit."""
    saved = _DEFAULT_TUNER
    set_default_tuner_config(config)
    try:
        yield
    finally:
        set_default_tuner_config(saved)


def _set_raw(a: frozenset[str] | None, p: frozenset[str] | None) -> None:
    global _DEFAULT_ALGO, _DEFAULT_PROTO
    _DEFAULT_ALGO, _DEFAULT_PROTO = a, p


ALGORITHMS_USER: tuple[str, ...] = ALGORITHMS
PROTOCOLS_USER: tuple[str, ...] = ("simple", "ll", "ll128")

# ------------------------------------------------------------------------------------------------
# The model
# ------------------------------------------------------------------------------------------------


def _norm(coll: str, algo: str, proto: str) -> tuple[str, str, str]:
    a = str(algo).lower()
    return str(coll).lower(), ALGORITHM_ALIASES.get(a, a), str(proto).lower()


def _check(coll: str, algo: str, proto: str) -> None:
    if coll not in COLLECTIVES:
        hint = " (p2p: use hwmodel.nccl.channels.p2p_plan)" if coll in ("all_to_all", "send", "recv") else ""
        raise ValueError(
            f"collective {coll!r} is not tuned by NCCL's model{hint}; allowed: {', '.join(COLLECTIVES)}"
        )
    if algo not in ALGORITHMS:
        raise ValueError(f"unknown NCCL algorithm {algo!r}; allowed: {', '.join(ALGORITHMS_USER)}")
    if proto not in PROTOCOLS:
        raise ValueError(f"unknown NCCL protocol {proto!r}; allowed: {', '.join(PROTOCOLS_USER)}")


def is_enabled(coll: str, algo: str, proto: str, topo: CommTopology) -> bool:
    """Whether NCCL 2.30.7 would consider (algo, proto) for ``coll`` on ``topo`` (ignoring overrides).

    A single rank runs Ring/Simple only; otherwise the algorithm object decides
    (:meth:`~hwmodel.nccl.algorithms.base.Algorithm.available`: its collectives, protocols and
    topology condition, see each algorithm's module), and LL128 needs ``topo.ll128_enabled``.
    """
    coll, algo, proto = _norm(coll, algo, proto)
    _check(coll, algo, proto)
    if topo.n_ranks <= 1:
        return algo == "ring" and proto == "simple"
    if not _algorithms.ALGORITHMS[algo].available(coll, proto, topo):
        return False
    return not (proto == "ll128" and not topo.ll128_enabled)


def _inputs(coll: str, a: Algorithm, proto: str, topo: CommTopology) -> ModelInputs:
    """What ``ncclTopoTuneModel`` computes before algorithm ``a``'s own terms (tuning.cc 2.30.7)."""
    n = topo.n_ranks
    nn = topo.n_nodes
    ppn = n / nn
    p = PROTOCOL_INDEX[proto]
    ci = topo.arch_index
    index1 = ci if nn == 1 else (1 if topo.cpu_vendor == "amd" else 0)
    index2 = nn - 1 if nn <= 2 else 2
    graph = a.graph(topo)
    assert graph is not None
    # "With ppn=1 latencies are fully exposed, use the Tree network latency."
    net_row = _algorithms.ALGORITHMS["tree"].hw_latency_us["net"] if ppn == 1 else a.hw_latency_us["net"]
    latency_inter_us = topo.latency_inter_s * 1e6
    inter_lat = net_row[p] + latency_inter_us
    if proto == "simple":
        inter_lat += latency_inter_us  # GDR flush
    return ModelInputs(coll=coll, proto=proto, p=p, topo=topo, graph=graph, n=n, nn=nn, ppn=ppn, ci=ci,
                       index2=index2, ll_max_bw=LL_MAX_BW_GBPS[index1][index2], nsteps=ring_steps(coll, n),
                       base_lat=a.base_latency_us[p], intra_lat=a.hw_latency_us[topo.intra_link][p],
                       inter_lat=inter_lat)


def _model(coll: str, algo: str, proto: str, topo: CommTopology) -> tuple[float, float, float]:
    """(latency µs, bus bandwidth GB/s before conversion, algorithm bandwidth GB/s) from
    ``ncclTopoTuneModel`` (tuning.cc 2.30.7). Assumes :func:`is_enabled`."""
    a = _algorithms.ALGORITHMS[algo]
    return a.model(_inputs(coll, a, proto, topo))


def _require(coll: str, algo: str, proto: str, topo: CommTopology) -> None:
    if not is_enabled(coll, algo, proto, topo):
        raise ValueError(f"{algo}/{proto} is not available for {coll} on this communicator "
                         f"({topo.gpu_arch}, {topo.n_nodes} node(s), {topo.n_ranks} ranks)")


def latency_s(coll: str, algo: str, proto: str, topo: CommTopology, n_bytes: int | None = None) -> float:
    """NCCL's fixed cost of one operation, seconds (``comm->latencies`` converted from µs).

    With ``n_bytes``, includes the size-dependent latency factor of ``ncclTopoGetAlgoTime`` (the Ring
    Simple multi-node all-reduce "plateau", x1.4, x1.9 before sm80).

    Raises:
        ValueError: unknown names, or (algo, proto) not available for ``coll`` on ``topo``.
    """
    coll, algo, proto = _norm(coll, algo, proto)
    _require(coll, algo, proto, topo)
    if topo.n_ranks <= 1:
        return 0.0
    lat, _, _ = _model(coll, algo, proto, topo)
    if n_bytes is not None:
        lat *= _algorithms.ALGORITHMS[algo].latency_factor(coll, proto, topo, n_bytes)
    return lat * 1e-6


def bus_bandwidth_Bps(coll: str, algo: str, proto: str, topo: CommTopology) -> float:
    """NCCL's modelled bus bandwidth (``busBw`` before the bus-to-algorithm conversion), bytes/s."""
    coll, algo, proto = _norm(coll, algo, proto)
    _require(coll, algo, proto, topo)
    if topo.n_ranks <= 1:
        return math.inf
    return _model(coll, algo, proto, topo)[1] * GB


def algo_bandwidth_Bps(
    coll: str, algo: str, proto: str, topo: CommTopology, n_bytes: int | None = None
) -> float:
    """NCCL's modelled algorithm bandwidth (``comm->bandwidths``), bytes/s: ``nBytes / time`` without
    latency. With ``n_bytes``, includes the size-dependent factor of ``ncclTopoGetAlgoTime``: the Tree
    all-reduce ``treeCorrectionFactor`` (sizes below ``2^29`` B) and, on Blackwell with an x86 host
    (``cpu_vendor`` intel or amd; ``other`` stands for non-x86 hosts such as Grace), the same factor for
    NVLSTree all-reduce below ``2^30`` B (tuning.cc 2.30.7)."""
    coll, algo, proto = _norm(coll, algo, proto)
    _require(coll, algo, proto, topo)
    if topo.n_ranks <= 1:
        return math.inf
    bw = _model(coll, algo, proto, topo)[2]
    if n_bytes is not None:
        bw *= _algorithms.ALGORITHMS[algo].bandwidth_factor(coll, proto, topo, n_bytes)
    return bw * GB


def net_overhead_s(topo: CommTopology, proto: str) -> float:
    """``getNetOverhead`` (x3 for Simple) in seconds; 0 on a single node (tuning.cc 2.30.7)."""
    if topo.n_nodes <= 1:
        return 0.0
    return NET_OVERHEAD_US[topo.cpu_vendor] * (3 if proto == "simple" else 1) * 1e-6


def _lat_count(algo: str, n_pipe_ops: int) -> int:
    """``latCount``: every pipelined op for Ring, ``ceil(n/8)`` for aggregated algorithms."""
    if _algorithms.ALGORITHMS[algo].aggregated_latency:
        return -(-n_pipe_ops // MAX_DEV_WORK_BATCH_COLLS)
    return n_pipe_ops


def predict_time_s(
    coll: str,
    algo: str,
    proto: str,
    n_bytes: int,
    topo: CommTopology,
    *,
    n_pipe_ops: int = 1,
    dtype: str | None = None,
) -> float:
    """NCCL's predicted time for one collective (``ncclTopoGetAlgoTime``, tuning.cc 2.30.7), seconds.

    ``time = lat * latCount + nBytes / algBw`` with the size corrections (Tree correction factor, Ring
    plateau); ``latCount = n_pipe_ops`` for Ring, ``ceil(n_pipe_ops/8)`` otherwise (aggregated
    launches). An FP8 ``dtype`` multiplies Ring by 1024 when nRanks > 8 (enqueue.cc
    ``updateCollCostTable``). ``n_bytes`` is nccl-tests' S (the total buffer for all-gather/reduce-scatter).

    Raises:
        ValueError: unknown names, or (algo, proto) not available for ``coll`` on ``topo``.
    """
    coll, algo, proto = _norm(coll, algo, proto)
    _require(coll, algo, proto, topo)
    if topo.n_ranks <= 1:
        return 0.0
    lat = latency_s(coll, algo, proto, topo, n_bytes)
    bw = algo_bandwidth_Bps(coll, algo, proto, topo, n_bytes)
    t = lat * _lat_count(algo, n_pipe_ops) + n_bytes / bw
    if dtype is not None:
        penalty = _algorithms.ALGORITHMS[algo].dtype_penalty(dtype, topo)
        if penalty != 1.0:
            t *= penalty
    return t



@dataclass(frozen=True, slots=True)
class Choice:
    """NCCL's decision for one collective."""

    algorithm: str
    """A registry name: tree, ring, nvls, nvls_tree or pat."""
    protocol: str
    """simple, ll or ll128."""
    n_channels: int
    """CTAs launched (one SM each), from :func:`hwmodel.nccl.channels.nccl_channels`."""
    n_threads: int
    """Threads per CTA."""
    predicted_time_s: float
    """NCCL's model time, seconds."""
    latency_s: float
    """The latency part of it (plateau included, x latCount), seconds."""
    algo_bandwidth_Bps: float = math.inf
    """Modelled algorithm bandwidth (tree correction included), bytes/s."""
    decided_by: str = "model"
    """``model`` (NCCL's tuning model) or ``tuner config <file>:<line>`` (a tuner-plugin rule)."""


def _resolve(value: str | Iterable[str] | None, default: frozenset[str] | None, allowed: tuple[str, ...],
             what: str) -> frozenset[str] | None:
    parsed = _parse_list(value, allowed, what)
    return parsed if parsed is not None else default


def enabled_pairs(
    coll: str, topo: CommTopology, algo: str | Iterable[str] | None = None,
    proto: str | Iterable[str] | None = None,
) -> list[tuple[str, str]]:
    """(algorithm, protocol) pairs :func:`choose` considers, in NCCL's iteration order (the registry's),
    after applying ``algo``/``proto`` (per call) or the module defaults (:func:`set_default_overrides`)."""
    coll = str(coll).lower()
    if coll not in COLLECTIVES:
        _check(coll, "ring", "simple")
    algos = _resolve(algo, _DEFAULT_ALGO, ALGORITHMS_USER, "algorithm")
    protos = _resolve(proto, _DEFAULT_PROTO, PROTOCOLS_USER, "protocol")
    return [(a, p) for a in ALGORITHMS if algos is None or a in algos
            for p in PROTOCOLS if (protos is None or p in protos) and is_enabled(coll, a, p, topo)]


def choose(
    coll: str,
    n_bytes: int,
    topo: CommTopology,
    algo: str | Iterable[str] | None = None,
    proto: str | Iterable[str] | None = None,
    *,
    n_pipe_ops: int = 1,
    dtype: str | None = None,
    tuner: TunerConfig | None = None,
) -> Choice:
    """Pick the (algorithm, protocol) with the minimum predicted time, as ``topoGetAlgoInfo``.

    ``algo``/``proto`` restrict the choice like ``NCCL_ALGO``/``NCCL_PROTO`` (a name, a comma list or
    ``^`` exclusions); per-call values replace the module defaults set with
    :func:`set_default_overrides`, dimension by dimension. A single communicator rank costs 0 (NCCL
    sets Ring/Simple to 0 when nRanks == 1).

    ``tuner`` (else the module default, :func:`set_default_tuner_config`) is a tuner plugin's rule
    list: the first matching rule whose pair is still enabled after ``algo``/``proto`` decides, as
    ``pluginGetCollInfo`` zeroing that pair's cost (:mod:`hwmodel.nccl.tuner_config`); its
    ``channels`` (> 0) replaces the size-based channel count, clamped to the communicator's.

    Raises:
        ValueError: unknown names, or nothing enabled (NCCL: "No algorithm/protocol available").
    """
    coll = str(coll).lower()
    pairs = enabled_pairs(coll, topo, algo, proto)
    if not pairs:
        possible = enabled_pairs(coll, topo)
        allowed = ", ".join(f"{a}/{p}" for a, p in possible) or "none"
        raise ValueError(f"algorithm/protocol: none of algo={algo or 'any'}, proto={proto or 'any'} is "
                         f"available for {coll} on this system (NVLS needs NVSwitch gen3, i.e. Hopper or "
                         f"newer, and one node; NVLSTree the same NVSwitch, several nodes and all_reduce; "
                         f"PAT one GPU per node, all_gather/reduce_scatter and simple; "
                         f"Broadcast/Reduce are ring only); available: {allowed}")
    if topo.n_ranks <= 1:
        return Choice("ring", "simple", 1, nccl_channels("ring", "simple", n_bytes, topo).n_threads, 0.0, 0.0)
    rule = _tuner_rule(tuner if tuner is not None else _DEFAULT_TUNER, coll, n_bytes, topo, pairs, n_pipe_ops)
    if rule is not None:
        a, p = rule.algorithm, rule.protocol
        t = predict_time_s(coll, a, p, n_bytes, topo, n_pipe_ops=n_pipe_ops, dtype=dtype)
    else:
        best: tuple[float, str, str] | None = None
        for a, p in pairs:
            t = predict_time_s(coll, a, p, n_bytes, topo, n_pipe_ops=n_pipe_ops, dtype=dtype)
            if best is None or t < best[0]:
                best = (t, a, p)
        assert best is not None
        t, a, p = best
    plan = nccl_channels(a, p, n_bytes, topo)
    n_channels = plan.n_channels
    if rule is not None and rule.channels > 0:
        n_channels = min(rule.channels, _algorithms.ALGORITHMS[a].max_channels(topo))
    return Choice(
        algorithm=a,
        protocol=p,
        n_channels=n_channels,
        n_threads=plan.n_threads,
        predicted_time_s=t,
        latency_s=latency_s(coll, a, p, topo, n_bytes) * _lat_count(a, n_pipe_ops),
        algo_bandwidth_Bps=algo_bandwidth_Bps(coll, a, p, topo, n_bytes),
        decided_by="model" if rule is None else f"tuner config {rule.where}",
    )


def _tuner_rule(config: TunerConfig | None, coll: str, n_bytes: int, topo: CommTopology,
                pairs: list[tuple[str, str]], n_pipe_ops: int) -> TunerRule | None:
    """The first matching rule whose (algorithm, protocol) is enabled (hence modelled), or ``None``."""
    if config is None:
        return None
    enabled = set(pairs)
    for r in config.candidates(coll, n_bytes, topo.n_nodes, topo.n_ranks, n_pipe_ops):
        if (r.algorithm, r.protocol) in enabled:
            return r
    return None


# ------------------------------------------------------------------------------------------------
# Small helpers for the collective engine
# ------------------------------------------------------------------------------------------------

NET_APP_EFFICIENCY = IB_APP_EFFICIENCY
"""Alias of :data:`IB_APP_EFFICIENCY` (achieved / line rate of one NIC through NCCL)."""

arch_of = arch_from_compute_capability
"""Alias of :func:`hwmodel.nccl.channels.arch_from_compute_capability`."""


def _normalise(name: str, allowed: tuple[str, ...], what: str) -> str:
    n = str(name).strip().lower()
    if n not in allowed:
        raise ValueError(f"unknown NCCL {what} {name!r}; allowed: {', '.join(allowed)}")
    return n


def normalise_algorithm(name: str) -> str:
    """Lower-case and validate an algorithm name (a registry name: tree, ring, nvls, nvls_tree, pat;
    NCCL's ``NVLSTree`` / ``nvlstree`` map to ``nvls_tree``); ValueError lists the allowed ones."""
    n = str(name).strip().lower()
    return _normalise(ALGORITHM_ALIASES.get(n, n), ALGORITHMS_USER, "algorithm")


def normalise_protocol(name: str) -> str:
    """Lower-case and validate a protocol name (simple, ll, ll128); ValueError lists the allowed ones."""
    return _normalise(name, PROTOCOLS_USER, "protocol")


def p2p_channels_and_latency(n_bytes: int, topo: CommTopology, *, same_node: bool = True,
                             n_peers: int | None = None) -> tuple[int, float]:
    """(channels, latency seconds) of one send/recv: :func:`hwmodel.nccl.channels.p2p_plan` with the
    peer over NVLink (or PCIe on a PCIe-only node) when ``same_node``, else over the network."""
    peer = ("nvlink" if topo.intra_link == "nvlink" else "pci") if same_node else "net"
    plan = p2p_plan(n_bytes, topo, peer, n_peers)
    return plan.n_channels, plan.latency_s
