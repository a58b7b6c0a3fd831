"""NCCL 2.30.7's analytical tuning model (``src/graph/tuning.cc``, commit ``5067397c``) in pure Python.

NCCL predicts, for every (collective, algorithm, protocol),

    time_us = latency_us * latCount + nBytes / (1000 * algBw_GBps)

and runs the cheapest enabled pair (``topoGetAlgoInfo``, ``src/enqueue.cc``). This module reproduces
``ncclTopoTuneModel`` (latencies and bandwidths) and ``ncclTopoGetAlgoTime`` (the size-dependent
corrections) for the Ring, Tree, NVLS and NVLSTree algorithms and the LL, LL128 and Simple protocols.
NVLS is NVLink SHARP inside one node; NVLSTree is NVLink SHARP inside each node and a double binary
tree between the nodes' NVLS heads (the multi-node all-reduce NCCL picks on Hopper/Blackwell NVSwitch
clusters for mid-size and large messages). CollNet (needs a SHARP plugin, and with it multi-node NVLS)
and PAT (1 rank per node) are not modelled.

Worked example, NVLSTree all-reduce on DGX H100 (NVLS graph 8 channels, bwIntra 40, bwInter 48 GB/s,
see :meth:`CommTopology.from_system`): per channel ``intraBw = 40 * 0.85 * 7/8 * 2 = 59.5``,
``interBw = 48 * 2 = 96`` on 2 nodes (48 on more), capped by ``perChMaxNVLSTreeBws`` 57.7 (2 nodes) /
45.5 (more); busBw = 8 x 57.7 = 461.6 GB/s (2 nodes) or 364 GB/s, algBw = busBw * n / (2(n-1)) = 246.2
GB/s on 16 ranks, 183.4 GB/s on 128; latency ``0 + 25 + 2 * log2(nNodes) * 20.9`` = 66.8 us (2 nodes),
108.6 us (4), 192.2 us (16).

The simulator uses :func:`latency_s` (the fixed cost) and :data:`PROTOCOL_EFFICIENCY` (payload share
of the wire) and lets bandwidth emerge from contended links; :func:`predict_time_s` and :func:`choose`
give NCCL's own estimate and decision.

Units: public functions take bytes and return seconds and bytes/s. NCCL's tables keep their units
(µs, GB/s = 1e9 B/s) in names ending ``_US`` / ``_GBPS``.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from hwmodel.nccl.channels import (
    ALGORITHM_ALIASES,
    GB,
    CommTopology,
    arch_from_compute_capability,
    nccl_channels,
    p2p_plan,
)
from hwmodel.nccl.tuner_config import MODELLED_ALGORITHMS, TunerConfig, TunerRule

__all__ = [
    "ALGORITHMS",
    "BASE_LATENCY_US",
    "COLLECTIVES",
    "Choice",
    "HW_LATENCY_US",
    "IB_APP_EFFICIENCY",
    "LL_MAX_BW_GBPS",
    "NCCL_VERSION",
    "NVLINK_APP_EFFICIENCY",
    "NVLS_EFFICIENCY",
    "PER_CH_MAX_NVLS_TREE_BW_GBPS",
    "PER_CH_MAX_RING_LL128_BW_GBPS",
    "PER_CH_MAX_TREE_BW_GBPS",
    "PER_CH_MAX_TREE_LL128_BW_GBPS",
    "PROTOCOLS",
    "PROTOCOL_EFFICIENCY",
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

ALGORITHMS: tuple[str, ...] = ("tree", "ring", "nvls", "nvls_tree")
"""Modelled algorithms, in NCCL's ``NCCL_ALGO_*`` order (Tree 0, Ring 1, NVLS 4, NVLSTree 5; ties go to
the earlier one, as in ``topoGetAlgoInfo``'s strict ``<``). ``nvls_tree`` is NCCL's ``NVLSTree``
(``NCCL_ALGO`` token; ``nvlstree`` is accepted too)."""

PROTOCOLS: tuple[str, ...] = ("ll", "ll128", "simple")
"""Protocols in NCCL's ``NCCL_PROTO_*`` order (LL, LL128, Simple)."""

COLLECTIVES: tuple[str, ...] = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce")
"""Collectives the tuning model covers (``hwmodel.ir`` names). ``all_to_all`` and send/recv are p2p:
see :func:`hwmodel.nccl.channels.p2p_plan`."""

_P = {p: i for i, p in enumerate(PROTOCOLS)}

# ------------------------------------------------------------------------------------------------
# Constants from ncclTunerConstantsDefaults (tuning.cc l.139-216, NCCL 2.30.7). Columns: LL, LL128, Simple.
# ------------------------------------------------------------------------------------------------

BASE_LATENCY_US: dict[str, tuple[float, float, float]] = {
    "tree": (6.8, 14.0, 8.4),
    "ring": (6.6, 14.0, 8.4),
    "nvls": (0.0, 0.0, 0.0),
    "nvls_tree": (0.0, 0.0, 0.0),
}
"""``baseLatencies`` in µs (tuning.cc 2.30.7): launch + synchronisation per collective."""

HW_LATENCY_US: dict[str, dict[str, tuple[float, float, float]]] = {
    "nvlink": {"tree": (0.6, 1.25, 4.0), "ring": (0.6, 1.9, 3.4), "nvls": (0.0, 0.0, 25.0),
               "nvls_tree": (0.0, 0.0, 25.0)},
    "pci": {"tree": (1.0, 1.9, 4.0), "ring": (1.0, 2.5, 5.7), "nvls": (0.0, 0.0, 0.0),
            "nvls_tree": (0.0, 0.0, 0.0)},
    "net": {"tree": (5.0, 8.5, 14.0), "ring": (2.7, 4.0, 14.0), "nvls": (0.0, 0.0, 18.0),
            "nvls_tree": (0.0, 0.0, 20.9)},
}
"""``hwLatencies[NVLINK|PCI|NET]`` in µs per step (tuning.cc 2.30.7)."""

LL_MAX_BW_GBPS: tuple[tuple[float, float, float], ...] = (
    (39.0, 39.0, 20.4),
    (87.7, 22.5, 19.0),
    (141.0, 45.0, 35.0),
    (2 * 141.0, 2 * 45.0, 2 * 35.0),
)
"""``llMaxBws`` GB/s (tuning.cc 2.30.7). Row: GPU generation (Volta..Blackwell) for one node, CPU
vendor for several (0 Intel, 1 AMD); column: nNodes 1 / 2 / >2."""

PER_CH_MAX_RING_LL128_BW_GBPS: tuple[float, ...] = (20.0, 20.0, 36.7, 40.0)
"""``perChMaxRingLL128Bws`` GB/s per channel, Volta..Blackwell (same for N1/N2/N4; tuning.cc 2.30.7)."""

PER_CH_MAX_TREE_LL128_BW_GBPS: tuple[tuple[float, float, float], ...] = (
    (20.0, 20.0, 20.0),
    (20.0, 20.0, 20.0),
    (36.7, 36.7, 29.0),
    (55.6, 31.67, 20.0),
)
"""``perChMaxTreeLL128Bws`` GB/s per channel [generation][N1/N2/N4] (tuning.cc 2.30.7)."""

PER_CH_MAX_TREE_BW_GBPS: tuple[tuple[float, float, float], ...] = (
    (26.5, 18.5, 10.0),
    (24.0, 23.6, 17.8),
    (38.7, 41.4, 36.0),
    (70.0, 42.8, 24.0),
)
"""``perChMaxTreeBws`` GB/s per channel [generation][N1/N2/N4] (tuning.cc 2.30.7)."""

PER_CH_MAX_NVLS_TREE_BW_GBPS: tuple[tuple[float, float, float], ...] = (
    (26.5, 18.5, 10.0),
    (24.0, 23.6, 17.8),
    (0.0, 57.7, 45.5),
    (0.0, 96.0, 80.0),
)
"""``perChMaxNVLSTreeBws`` GB/s per channel [generation][N1/N2/N4] (tuning.cc 2.30.7). NVLSTree needs
NVSwitch gen3 (Hopper+) and several nodes, so only the Hopper/Blackwell N2 and N4 entries are ever used."""

NVLS_EFFICIENCY: tuple[float, ...] = (0.0, 0.0, 0.85, 0.74)
"""``nvlsEfficiency`` Volta..Blackwell (tuning.cc 2.30.7)."""

NET_OVERHEAD_US: dict[str, float] = {"intel": 1.0, "amd": 2.0, "other": 1.0}
"""``getNetOverhead`` µs (tuning.cc 2.30.7, ``NCCL_NET_OVERHEAD`` unset): x86 Intel 1.0, x86 AMD 2.0,
else 1.0; x3 for Simple. Multi-node rings pay ``max(intraLat, netOverhead)`` per intra-node step."""

RING_PLATEAU_FACTOR: dict[str, float] = {"volta": 1.9, "ampere": 1.4, "hopper": 1.4, "blackwell": 1.4}
"""``ncclTopoGetAlgoTime`` (tuning.cc 2.30.7) "Plateau effect of ring": multi-node Ring Simple
all-reduce latency x1.4 (x1.9 before sm80) when ``nBytes/(nChannels*nRanks) >= 64``."""

TREE_CORRECTION_FACTOR: tuple[tuple[float, ...], ...] = (
    (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0, 1.0),
    (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0, 1.0),
    (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9, .9),
)
"""``treeCorrectionFactor[proto][log2(nBytes/64)]`` (tuning.cc 2.30.7): Tree all-reduce bandwidth is
multiplied by it for ``0 <= floor(log2(nBytes >> 6)) < 23`` ("Trees are not perfectly sticking to the
model for medium sizes"). Rows LL, LL128, Simple; columns 64 B, 128 B, ... (powers of two).
``ncclTopoGetAlgoTime`` applies the same table (Simple row, up to index 23) to NVLSTree all-reduce, but
only on Blackwell (``minCompCap >= 100``) with x86 hosts (``cpuArch == NCCL_TOPO_CPU_ARCH_X86``)."""

MAX_DEV_WORK_BATCH_COLLS = 8
"""``NCCL_MAX_DEV_WORK_BATCH_COLLS = NCCL_MAX_DEV_WORK_BATCH_BYTES (1024) / sizeof(ncclDevWorkColl)
(128)`` (device.h 2.30.7, size derived from the struct layout): non-Ring latencies are paid once per
8 aggregated operations."""

FP8_RING_PENALTY = 1024.0
"""``updateCollCostTable`` (enqueue.cc 2.30.7): FP8 Ring time x1024 when nRanks > 8 (precision)."""

_FP8_DTYPES = frozenset({"fp8", "f8e4m3", "f8e5m2", "float8_e4m3fn", "float8_e5m2", "e4m3", "e5m2"})

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

IB_APP_EFFICIENCY = 0.94
"""Achieved / line rate for one InfiniBand NIC through NCCL: ~23.5 of 25 GB/s on HDR ("top speed of
190 GB/s" on 8 NICs, nccl #689) and 46-48 of 50 GB/s on NDR (nccl-tests #290); hardware_nccl.md §2.3."""

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
    ``None`` to clear. Allowed algorithms: ring, tree, nvls, nvls_tree (also spelt ``nvlstree``, NCCL's
    ``NVLSTree``); protocols: simple, ll, ll128.

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


ALGORITHMS_USER: tuple[str, ...] = ("ring", "tree", "nvls", "nvls_tree")
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


def _log2i(n: int) -> int:
    return n.bit_length() - 1 if n > 0 else -1


def _nsteps(coll: str, n: int) -> int:
    if coll == "all_reduce":
        return 2 * (n - 1)
    if coll in ("all_gather", "reduce_scatter"):
        return n - 1
    return n


def is_enabled(coll: str, algo: str, proto: str, topo: CommTopology) -> bool:
    """Whether NCCL 2.30.7 would consider (algo, proto) for ``coll`` on ``topo`` (ignoring overrides).

    tuning.cc rules: Broadcast/Reduce are Ring only; AllGather/ReduceScatter Ring or NVLS (single node:
    NVLS AG/RS multi-node needs CollNet); Tree only for AllReduce (other Tree entries get no latency or
    bandwidth refinement and are never picked by NCCL in practice; trainsim disables them); NVLS only with
    Simple, only where available (Hopper+, NVSwitch, one node -- "Disable Collnet+Direct, Collnet+Chain
    or Collnet+NVLS if collnet is not supported" removes it on several nodes --, >= 2 channels);
    NVLSTree only for AllReduce (the AG/RS loop skips it), only with Simple, only with an NVLS graph of
    >= 2 channels and several nodes ("Disable NVLS Tree on a single node"); LL128 only where
    ``topo.ll128_enabled``.
    """
    coll, algo, proto = _norm(coll, algo, proto)
    _check(coll, algo, proto)
    if topo.n_ranks <= 1:
        return algo == "ring" and proto == "simple"
    if coll in ("broadcast", "reduce") and algo != "ring":
        return False
    if coll in ("all_gather", "reduce_scatter") and algo not in ("ring", "nvls"):
        return False
    if algo == "nvls" and (proto != "simple" or not topo.nvls_available):
        return False
    if algo == "nvls_tree" and (coll != "all_reduce" or proto != "simple" or not topo.nvls_tree_available):
        return False
    return not (proto == "ll128" and not topo.ll128_enabled)


def _model(coll: str, algo: str, proto: str, topo: CommTopology) -> tuple[float, float, float]:  # noqa: C901
    """(latency µs, bus bandwidth GB/s before conversion, algorithm bandwidth GB/s) from
    ``ncclTopoTuneModel`` (tuning.cc 2.30.7). Assumes :func:`is_enabled`."""
    n = topo.n_ranks
    nn = topo.n_nodes
    ppn = n / nn
    p = _P[proto]
    ci = topo.arch_index
    index2 = nn - 1 if nn <= 2 else 2
    index1 = ci if nn == 1 else (1 if topo.cpu_vendor == "amd" else 0)
    ll_max_bw = LL_MAX_BW_GBPS[index1][index2]
    graph = {"ring": topo.ring, "tree": topo.tree, "nvls": topo.nvls, "nvls_tree": topo.nvls}[algo]
    assert graph is not None
    nsteps = _nsteps(coll, n)

    bw = graph.bw_intra_GBps if nn <= 2 else graph.bw_inter_GBps
    if algo in ("nvls", "nvls_tree"):
        intra_bw = graph.bw_intra_GBps * NVLS_EFFICIENCY[ci] * (graph.n_channels - 1) / graph.n_channels
        intra_bw *= 2.0 if coll == "all_reduce" else (ppn - 1) / ppn
        # "Handle 2 node case of NVLSTree": each NIC carries half as much on 2 nodes.
        inter_bw = graph.bw_inter_GBps * (2.0 if nn <= 2 and algo == "nvls_tree" else 1.0)
        bw = min(intra_bw, inter_bw)
        if algo == "nvls_tree":
            bw = min(bw, PER_CH_MAX_NVLS_TREE_BW_GBPS[ci][index2])
    bus_bw = graph.n_channels * bw

    if algo == "ring" and proto == "ll":
        bus_bw = min(ll_max_bw, bus_bw * 0.5)
    if algo == "ring" and proto == "ll128":
        bus_bw = min(bus_bw * 0.92, graph.n_channels * PER_CH_MAX_RING_LL128_BW_GBPS[ci])
    if algo == "tree" and coll == "all_reduce":
        bus_bw = min(bus_bw * 0.92, graph.n_channels * PER_CH_MAX_TREE_BW_GBPS[ci][index2])
    if algo == "tree" and proto == "ll":
        bus_bw = min(bus_bw / 3.8, ll_max_bw)
    if algo == "tree" and proto == "ll128":
        bus_bw = min(bus_bw * (7.0 / 9.0 if nn == 1 else 120.0 / 128.0),
                     graph.n_channels * PER_CH_MAX_TREE_LL128_BW_GBPS[ci][index2])
    if algo == "tree" and topo.tree_pattern == "tree":
        bus_bw *= 0.85

    alg_bw = bus_bw
    if not (algo != "ring" and coll in ("all_gather", "reduce_scatter")):
        alg_bw *= n / nsteps if algo in ("ring", "nvls", "nvls_tree") else 0.5

    # Latency.
    intra_hw = topo.intra_link
    hw = intra_hw if nn == 1 else "net"
    lat = BASE_LATENCY_US[algo][p]
    intra_lat = HW_LATENCY_US[intra_hw][algo][p]
    inter_lat = HW_LATENCY_US["net"]["tree" if ppn == 1 else algo][p]
    latency_inter_us = topo.latency_inter_s * 1e6
    inter_lat += latency_inter_us
    if proto == "simple":
        inter_lat += latency_inter_us  # GDR flush
    if algo == "ring":
        ring_lat = HW_LATENCY_US[hw]["ring"][p]
        if coll in ("broadcast", "reduce"):
            if topo.same_channels:
                lat += ring_lat
            else:
                if proto == "simple":
                    ring_lat = HW_LATENCY_US[hw]["tree"][p]
                lat += nsteps * ring_lat
        else:
            net_overhead = 0.0
            if nn > 1:
                net_overhead = NET_OVERHEAD_US[topo.cpu_vendor] * (3 if proto == "simple" else 1)
            intra_lat = max(intra_lat, net_overhead)
            n_inter = 0 if nn == 1 else (2 * (nn - 1) if coll == "all_reduce" else nn - 1)
            lat += (nsteps - n_inter) * intra_lat + n_inter * inter_lat
    elif algo == "tree":
        if coll == "all_reduce":
            lat += 2 * ((n // nn - 1) * intra_lat + _log2i(nn) * inter_lat)
    elif algo == "nvls":
        lat = intra_lat + (inter_lat if nn > 1 else 0.0)
    elif algo == "nvls_tree":
        lat += intra_lat + 2 * _log2i(nn) * inter_lat
    return lat, bus_bw, alg_bw


def _require(coll: str, algo: str, proto: str, topo: CommTopology) -> None:
    if not is_enabled(coll, algo, proto, topo):
        raise ValueError(f"{algo}/{proto} is not available for {coll} on this communicator "
                         f"({topo.gpu_arch}, {topo.n_nodes} node(s), {topo.n_ranks} ranks)")


def latency_s(coll: str, algo: str, proto: str, topo: CommTopology, n_bytes: int | None = None) -> float:
    """NCCL's fixed cost of one operation, seconds (``comm->latencies`` converted from µs).

    With ``n_bytes``, includes the size-dependent Ring Simple multi-node all-reduce "plateau" factor
    (x1.4, x1.9 before sm80) of ``ncclTopoGetAlgoTime``.

    Raises:
        ValueError: unknown names, or (algo, proto) not available for ``coll`` on ``topo``.
    """
    coll, algo, proto = _norm(coll, algo, proto)
    _require(coll, algo, proto, topo)
    if topo.n_ranks <= 1:
        return 0.0
    lat, _, _ = _model(coll, algo, proto, topo)
    if (n_bytes is not None and algo == "ring" and proto == "simple" and topo.n_nodes > 1
            and coll == "all_reduce" and n_bytes // (topo.n_channels * topo.n_ranks) >= 64):
        lat *= RING_PLATEAU_FACTOR[topo.gpu_arch]
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
    latency. With ``n_bytes``, includes the Tree all-reduce ``treeCorrectionFactor`` (sizes below
    ``2^29`` B) and, on Blackwell with an x86 host (``cpu_vendor`` intel or amd; ``other`` stands for
    non-x86 hosts such as Grace), the same factor for NVLSTree all-reduce below ``2^30`` B
    (``ncclTopoGetAlgoTime``, tuning.cc 2.30.7)."""
    coll, algo, proto = _norm(coll, algo, proto)
    _require(coll, algo, proto, topo)
    if topo.n_ranks <= 1:
        return math.inf
    bw = _model(coll, algo, proto, topo)[2]
    if n_bytes is not None and coll == "all_reduce":
        log_size = _log2i(int(n_bytes) >> 6)
        if algo == "tree" and 0 <= log_size < 23:
            bw *= TREE_CORRECTION_FACTOR[_P[proto]][log_size]
        if (algo == "nvls_tree" and 0 <= log_size < 24 and topo.gpu_arch == "blackwell"
                and topo.cpu_vendor in ("intel", "amd")):
            bw *= TREE_CORRECTION_FACTOR[_P[proto]][log_size]
    return bw * GB


def net_overhead_s(topo: CommTopology, proto: str) -> float:
    """``getNetOverhead`` (x3 for Simple) in seconds; 0 on a single node (tuning.cc 2.30.7)."""
    if topo.n_nodes <= 1:
        return 0.0
    return NET_OVERHEAD_US[topo.cpu_vendor] * (3 if proto == "simple" else 1) * 1e-6


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

    ``time = lat * latCount + nBytes / algBw`` with the Tree correction factor and the Ring plateau;
    ``latCount = n_pipe_ops`` for Ring, ``ceil(n_pipe_ops/8)`` otherwise (aggregated launches). An FP8
    ``dtype`` multiplies Ring by 1024 when nRanks > 8 (enqueue.cc ``updateCollCostTable``).
    ``n_bytes`` is nccl-tests' S (the total buffer for all-gather/reduce-scatter).

    Raises:
        ValueError: unknown names, or (algo, proto) not available for ``coll`` on ``topo``.
    """
    coll, algo, proto = _norm(coll, algo, proto)
    _require(coll, algo, proto, topo)
    if topo.n_ranks <= 1:
        return 0.0
    lat = latency_s(coll, algo, proto, topo, n_bytes)
    bw = algo_bandwidth_Bps(coll, algo, proto, topo, n_bytes)
    lat_count = n_pipe_ops if algo == "ring" else -(-n_pipe_ops // MAX_DEV_WORK_BATCH_COLLS)
    t = lat * lat_count + n_bytes / bw
    if dtype is not None and dtype.lower() in _FP8_DTYPES and algo == "ring" and topo.n_ranks > 8:
        t *= FP8_RING_PENALTY
    return t


@dataclass(frozen=True, slots=True)
class Choice:
    """NCCL's decision for one collective."""

    algorithm: str
    """ring, tree, nvls or nvls_tree."""
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
    """(algorithm, protocol) pairs :func:`choose` considers, in NCCL's iteration order, after applying
    ``algo``/``proto`` (per call) or the module defaults (:func:`set_default_overrides`)."""
    coll = str(coll).lower()
    if coll not in COLLECTIVES:
        _check(coll, "ring", "simple")
    algos = _resolve(algo, _DEFAULT_ALGO, ALGORITHMS_USER, "algorithm")
    protos = _resolve(proto, _DEFAULT_PROTO, PROTOCOLS_USER, "protocol")
    pairs = []
    for a in ALGORITHMS:
        if algos is not None and a not in algos:
            continue
        for p in PROTOCOLS:
            if protos is not None and p not in protos:
                continue
            if is_enabled(coll, a, p, topo):
                pairs.append((a, p))
    return pairs


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
        n_channels = min(rule.channels, topo.nvls_channels if a in ("nvls", "nvls_tree") else topo.n_channels)
    lat_count = n_pipe_ops if a == "ring" else -(-n_pipe_ops // MAX_DEV_WORK_BATCH_COLLS)
    return Choice(
        algorithm=a,
        protocol=p,
        n_channels=n_channels,
        n_threads=plan.n_threads,
        predicted_time_s=t,
        latency_s=latency_s(coll, a, p, topo, n_bytes) * lat_count,
        algo_bandwidth_Bps=algo_bandwidth_Bps(coll, a, p, topo, n_bytes),
        decided_by="model" if rule is None else f"tuner config {rule.where}",
    )


def _tuner_rule(config: TunerConfig | None, coll: str, n_bytes: int, topo: CommTopology,
                pairs: list[tuple[str, str]], n_pipe_ops: int) -> TunerRule | None:
    """The first matching rule whose (algorithm, protocol) is enabled and modelled, or ``None``."""
    if config is None:
        return None
    enabled = set(pairs)
    for r in config.candidates(coll, n_bytes, topo.n_nodes, topo.n_ranks, n_pipe_ops):
        if r.algorithm in MODELLED_ALGORITHMS and (r.algorithm, r.protocol) in enabled:
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
    """Lower-case and validate an algorithm name (ring, tree, nvls, nvls_tree; NCCL's ``NVLSTree`` /
    ``nvlstree`` map to ``nvls_tree``); ValueError lists the allowed ones."""
    n = str(name).strip().lower()
    return _normalise(ALGORITHM_ALIASES.get(n, n), ALGORITHMS_USER, "algorithm")


def normalise_protocol(name: str) -> str:
    """Lower-case and validate a protocol name (simple, ll, ll128); ValueError lists the allowed ones."""
    return _normalise(name, PROTOCOLS_USER, "protocol")


def ring_steps(coll: str, n_ranks: int) -> int:
    """Ring steps per chunk in NCCL's model (tuning.cc ``nsteps``): 2(n-1) all-reduce, n-1 all-gather /
    reduce-scatter, n otherwise (broadcast/reduce pipelines)."""
    return _nsteps(str(coll).lower(), n_ranks)


def p2p_channels_and_latency(n_bytes: int, topo: CommTopology, *, same_node: bool = True,
                             n_peers: int | None = None) -> tuple[int, float]:
    """(channels, latency seconds) of one send/recv: :func:`hwmodel.nccl.channels.p2p_plan` with the
    peer over NVLink (or PCIe on a PCIe-only node) when ``same_node``, else over the network."""
    peer = ("nvlink" if topo.intra_link == "nvlink" else "pci") if same_node else "net"
    plan = p2p_plan(n_bytes, topo, peer, n_peers)
    return plan.n_channels, plan.latency_s
