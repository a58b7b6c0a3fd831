"""NCCL collectives executed on the contended hardware model.

:class:`NcclEngine` turns a :class:`~hwmodel.ir.Collective` on a list of GPUs into traffic on the
cluster's fluid resources, decomposed the way NCCL 2.30 does it:

* each algorithm's edges and bytes per edge are its own (:mod:`hwmodel.nccl.algorithms`: ``ring``,
  ``tree``, ``nvls``, ``nvls_tree``, ``pat``, and ``p2p`` for send/recv and all_to_all, one send/recv
  pair per ordered pair of ranks, NCCL >= 2.28's expansion of ``ncclAlltoAll``); the engine asks the
  algorithm object of the plan for its flows, its work per rank and its progress rate.

Fidelities: ``flow`` makes ONE fluid activity per collective over every link it loads, with the
weight of each link = bytes on that link per byte of per-rank progress, so contention with other
traffic emerges from the max-min solver. Its latency and rate bound reproduce, on an idle machine,
NCCL's chunk pipeline (:mod:`hwmodel.nccl.chunked`: NCCL's chunks and slices, ``NCCL_STEPS`` FIFO,
per-step latency, per-channel bandwidth of the links and of one CTA) in closed form
(:mod:`hwmodel.nccl.pipeline_closed`): rate bound = channels x per-channel rate, latency = the
pipeline's time less work / bound (its fill and the latency it does not overlap). ``step`` runs every
algorithm step as a synchronised set of per-edge transfers (one fluid activity per edge, a barrier
after each step; the same latency split evenly over the steps): ring all-reduce 2(n-1) steps,
all-gather / reduce-scatter n-1, ring broadcast / reduce n pipeline steps. Tree, NVLS, NVLSTree and
PAT are pipelined algorithms without a barrier per step at this level, and all_to_all is one grouped
kernel, so they run as ONE synchronised step of per-edge transfers. Both fidelities agree where
nothing contends (tests/hwmodel/nccl/test_engine.py checks 2 %). ``chunked`` evaluates the same
pipeline's recurrence item by item (the reference; flow agrees within 2 % at every nccl-tests size,
tests/hwmodel/nccl/test_pipeline_closed.py). Send/recv and all-to-all pay the tuner's p2p latency and
run at the links' rate in every fidelity.

Bandwidth efficiency enters as link weight: a protocol that carries 8 data bytes per 16-byte line (LL)
puts 2 bytes on the wire per payload byte; NCCL's app-level link efficiency likewise (NVLink
:data:`NVLINK_EFFICIENCY_FIT` where fitted (Ampere), else NCCL's ``SMxx_NVLINK_BW`` over the line rate;
InfiniBand :data:`hwmodel.nccl.tuner.IB_APP_EFFICIENCY`), so a link's ``carried`` counter is payload x
protocol overhead / efficiency. NCCL kernels also move their bytes through HBM, as side loads on each
member's HBM (hardware_nccl.md §5(b): at least one read and one write per hop, plus a read for
reductions).

A user's calibration profile may hold a fitted busbw-vs-size correction per collective and communicator
shape (:func:`hwmodel.nccl.calibration.busbw_correction`); :meth:`NcclEngine.plan` applies it to plans the
tuner chose (see :attr:`Plan.busbw_correction`). Without one nothing changes.

The nccl-tests emulation (:func:`simulate_nccl_tests`) adds the host side of a single-threaded
``-g G`` run (:data:`HOST_LAUNCH_PER_GPU_S`, :data:`HOST_PER_CHANNEL_PER_GPU_S`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import simpy

from hwmodel import ecmp as _ecmp
from hwmodel.cluster import Cluster
from hwmodel.fluid import Resource
from hwmodel.ir import COLLECTIVE_OPS, Collective
from hwmodel.nccl import algorithms as _algorithms
from hwmodel.nccl import calibration as _calibration
from hwmodel.nccl import chunked as _chunked
from hwmodel.nccl import mirrors as _mirrors
from hwmodel.nccl import nccltests as _nt
from hwmodel.nccl import pipeline_closed as _pipeline_closed
from hwmodel.nccl import tuner as _tuner
from hwmodel.nccl.algorithms.base import Flow
from hwmodel.nccl.algorithms.p2p import p2p_fifo_steps
from hwmodel.nccl.channels import P2PPlan, p2p_plan
from hwmodel.nccl.comm import PROTOCOL_INDEX
from hwmodel.nccl.tuner_config import TunerConfig

if TYPE_CHECKING:
    from hwmodel.topology import Topology

FIDELITIES = ("flow", "step", "chunked")

_MergedGroup = tuple[float, float, "float | None", "dict[Resource, float]", "dict[Resource, float]", bool]
"""One activity of a merged start: (work, latency s, rate bound, link weights, HBM side loads, whether
it holds the first plan)."""

HBM_BYTES_PER_BYTE = {"all_reduce": 3.0, "reduce_scatter": 3.0, "reduce": 3.0,
                      "all_gather": 2.0, "broadcast": 2.0, "all_to_all": 2.0, "p2p": 2.0}
"""HBM bytes each member moves per payload byte it sends: write of the incoming data and read to
forward it, plus a read of the local input where the step reduces (hardware_nccl.md §5(b), DERIVED,
not measured)."""

NVLINK_EFFICIENCY_FIT: dict[str, float] = _calibration.nvlink_efficiency_fit()
"""NCCL's achieved NVLink bandwidth / line rate, per GPU generation, where a measurement exists
(``[nccl.nvlink_efficiency.<arch>]`` in ``hwmodel/data/calibration.toml``: Ampere 234.9 / 300 GB/s =
0.783, FITTED to the 16 GiB all-reduce row of ``tests/data/nccl_tests_a100_8gpu.csv``). Other
generations use NCCL's ``SMxx_NVLINK_BW`` / line rate (the GPU spec's figures)."""

HOST_LAUNCH_PER_GPU_S = _calibration.host_launch_per_gpu_s()
"""Host time to enqueue one NCCL collective on one GPU when one thread drives several GPUs (s): the
41.3 µs intercept of ``t = 41.3 µs + 2.5 µs x nChannels`` over 8 GPUs, FITTED to 8x A100 ``-g 8``
nccl-tests rows (``[nccl] host_launch_s`` in ``hwmodel/data/calibration.toml``)."""

HOST_PER_CHANNEL_PER_GPU_S = _calibration.host_per_channel_per_gpu_s()
"""Host time per channel per GPU to enqueue one collective (s): the 2.5 µs/channel slope of the same
fit over 8 GPUs (NCCL prepares one work element per channel, ``src/enqueue.cc``; ``[nccl]
host_per_channel_s``)."""


@dataclass(slots=True)
class Plan:
    """A collective resolved to an algorithm, a protocol and channels, ready to start.

    Times in seconds, rates in bytes/s (``rate_bound_Bps``: bytes per ring edge per second).
    """

    op: str
    size_bytes: int
    gpus: tuple[str, ...]
    algorithm: str
    protocol: str
    n_channels: int
    latency_s: float
    predicted_time_s: float
    rate_bound_Bps: float | None
    root: int = 0
    name: str = ""
    peer_channels: int = 0
    info: dict = field(default_factory=dict)
    busbw_correction: float = 1.0
    """The active profile's fitted busbw factor at this size (:func:`_calibration.busbw_correction`):
    latency and rate bound are divided and multiplied by it and link weights divided, so the
    collective's time alone is divided by it; 1.0 without a fitted curve."""


class NcclEngine:
    """Runs collectives and point-to-point transfers on a :class:`Cluster`.

    Args:
        cluster: the machine.
        fidelity: ``flow`` (default), ``step`` or ``chunked`` (see the module docstring).
        algorithm, protocol: global overrides, as ``NCCL_ALGO`` / ``NCCL_PROTO``.
        nvlink_efficiency: achieved / line rate of NVLink for NCCL traffic; default
            :data:`NVLINK_EFFICIENCY_FIT` for the GPU generation, else NCCL's ``SMxx_NVLINK_BW`` ratio.
        tuner_config: tuner-plugin rules (:mod:`hwmodel.nccl.tuner_config`) that override NCCL's
            model per collective and size; default: the module-wide rules
            (:func:`hwmodel.nccl.tuner.set_default_tuner_config`), usually none.
        ib_qps_per_connection, ib_adaptive_routing: NCCL's IB knobs, as :mod:`hwmodel.ecmp` models them.
        p2p_read_cost: charge the A100's P2P-read slice cost (:data:`hwmodel.nccl.chunked.P2P_READ_SLICE_SYNC_S`)
            in the pipeline of both fidelities; off by default (docs/DESIGN.md, "Ring Simple on A100: the
            P2P-read slice", says why).

    Raises:
        ValueError: unknown fidelity, algorithm or protocol (the allowed values listed); ecmp.check_adaptive_routing's.
    """

    def __init__(self, cluster: Cluster, *, fidelity: str = "flow", algorithm: str | None = None,
                 protocol: str | None = None, nvlink_efficiency: float | None = None,
                 tuner_config: TunerConfig | None = None, p2p_read_cost: bool = False,
                 ib_qps_per_connection: int = 1, ib_adaptive_routing: bool = False) -> None:
        if fidelity not in FIDELITIES:
            raise ValueError(f"fidelity: unknown value {fidelity!r}; allowed: {', '.join(FIDELITIES)}")
        self.cluster = cluster
        self.env: simpy.Environment = cluster.env
        self.fidelity = fidelity
        self.algorithm = _tuner.normalise_algorithm(algorithm) if algorithm else None
        self.protocol = _tuner.normalise_protocol(protocol) if protocol else None
        self.tuner_config = tuner_config
        """Tuner-plugin rules of this engine (``None``: the module-wide ones, if any)."""
        self.p2p_read_cost = p2p_read_cost
        self.ib_qps_per_connection = _ecmp.check_qps_per_connection(ib_qps_per_connection)  # (ecmp.plan_subflows)
        self.ib_adaptive_routing = _ecmp.check_adaptive_routing(ib_adaptive_routing, cluster.topology, fidelity)
        self._rails_of: dict[tuple[str, ...], int] = {}  # (communicator -> rails; 0: inside one node)
        topo = cluster.topology
        spec = topo.gpu_spec
        if nvlink_efficiency is None:
            arch = _tuner.arch_of(spec.compute_capability)
            nvlink_efficiency = _calibration.nvlink_efficiency_fit().get(arch)
        if nvlink_efficiency is None and spec.nvlink_bandwidth_per_link_Bps > 0:
            nvlink_efficiency = spec.nccl_nvlink_bandwidth_per_link_Bps / spec.nvlink_bandwidth_per_link_Bps
        if nvlink_efficiency is not None and not 0 < nvlink_efficiency <= 1:
            raise ValueError(f"nvlink_efficiency must be in (0, 1], got {nvlink_efficiency!r}")
        self.nvlink_efficiency = nvlink_efficiency or 1.0
        """Achieved / line rate of NVLink for NCCL traffic."""
        self._node_of = topo.gpu_nodes()  # (shared, read-only)
        self._comm_topo_cache: dict[tuple[int, int, int], _tuner.CommTopology] = {}
        self._p2p_cache: dict[tuple[bool, int], tuple[P2PPlan, int]] = {}
        self._merged_cache: dict[tuple, tuple[dict[Resource, float], dict[Resource, float]]] = {}
        self._mirrored_cache: dict[tuple, tuple[list, list[_MergedGroup]]] = {}
        self._plan_cache: dict[tuple, Plan] = {}
        self._shape_rate_cache: dict[tuple, float] = {}
        self._weights_cache: dict[tuple, tuple[dict[Resource, float], dict[Resource, float]]] = {}
        self._flows_cache: dict[tuple, list[Flow]] = {}
        self._eff_cache: dict[Resource, float] = {}
        self._edge_weights_cache: dict[tuple, dict[_mirrors.Edge, float]] = {}
        self._eff_of_kind: dict[str, float] = {}
        self.side_load_gpus: set[str] | None = None  # (whose HBM collectives load: a mirrored Runtime's ranks')

    # -- planning ------------------------------------------------------------------------------
    def comm_topology(self, gpus: tuple[str, ...]) -> _tuner.CommTopology:
        """NCCL's view of a communicator on these GPUs (see :class:`tuner.CommTopology`)."""
        nodes: dict[int, int] = {}  # node index -> GPUs of the group on it
        for g in gpus:
            n = self._node_of[g]
            nodes[n] = nodes.get(n, 0) + 1
        key = (len(nodes), max(nodes.values()), len(gpus))  # all NCCL's model depends on
        ct = self._comm_topo_cache.get(key)
        if ct is None:
            topo = self.cluster.topology
            spec = topo.gpu_spec
            nic = topo.nic_spec
            ct = _tuner.CommTopology.from_system(
                gpu_arch=_tuner.arch_of(spec.compute_capability),
                n_nodes=len(nodes),
                ppn=max(nodes.values()),
                nvlink_bw_per_gpu_GBps=spec.nccl_nvlink_bandwidth_Bps / 1e9,
                nic_bw_GBps=nic.bandwidth_Bps / 1e9 if nic is not None else 25.0,
                nics_per_node=topo.nics_per_node,
                cpu_vendor=_cpu_vendor(topo),
                nvswitch_gen=_nvswitch_generation(topo),
                n_ranks=len(gpus),
                p2p_read=tuple(spec.compute_capability) == (8, 0),
            )
            self._comm_topo_cache[key] = ct
        return ct

    def plan(self, coll: Collective, gpus: tuple[str, ...]) -> Plan:
        """Pick algorithm, protocol and channels for ``coll`` on ``gpus`` (NCCL's tuner).

        Raises:
            ValueError: unknown collective, duplicate GPUs, or a forced algorithm the collective or
                system does not support.
        """
        if coll.op not in COLLECTIVE_OPS:
            raise ValueError(f"collective op: unknown {coll.op!r}; allowed: {', '.join(COLLECTIVE_OPS)}")
        if len(set(gpus)) != len(gpus):
            dup = sorted({g for g in gpus if gpus.count(g) > 1})
            raise ValueError(f"collective {coll.op} ({coll.name or 'unnamed'}): duplicate GPUs {dup} "
                             f"in group {gpus}")
        if coll.size_bytes < 0:
            raise ValueError(f"collective {coll.op}: size_bytes must be >= 0, got {coll.size_bytes}")
        algo = coll.algorithm or self.algorithm
        proto = coll.protocol or self.protocol
        tuner = self.tuner_config if self.tuner_config is not None else _tuner.get_default_tuner_config()
        key = (coll.op, coll.size_bytes, gpus, algo, proto, coll.root, id(tuner))
        hit = self._plan_cache.get(key)
        if hit is not None:
            return hit
        n = len(gpus)
        if n == 1:
            p = Plan(coll.op, coll.size_bytes, gpus, "none", "simple", 0, 0.0, 0.0, None, coll.root,
                     coll.name)
        elif coll.op == "all_to_all":
            p = self._plan_all_to_all(coll, gpus)
        else:
            ct = self.comm_topology(gpus)
            ch = _tuner.choose(coll.op, coll.size_bytes, ct, algo=algo, proto=proto, tuner=tuner)
            bw = _tuner.algo_bandwidth_Bps(coll.op, ch.algorithm, ch.protocol, ct)
            # The tuner's bandwidth assumes every channel; small messages run on fewer.
            full = _tuner.nccl_channels(ch.algorithm, ch.protocol, 1 << 40, ct)[0]
            scale = ch.n_channels / full if full else 1.0
            rate = _algorithms.get(ch.algorithm).progress_rate_Bps(coll.op, bw, n)
            bound = rate * scale if bw else None
            p = Plan(coll.op, coll.size_bytes, gpus, ch.algorithm, ch.protocol, ch.n_channels,
                     ch.latency_s, ch.predicted_time_s, bound, coll.root, coll.name,
                     info={"decided_by": ch.decided_by})
            if bound:
                self._apply_pipeline(p, ct, rate / full if full else rate)
            if algo is None and proto is None and ch.decided_by == "model":
                _correct(p, _calibration.busbw_correction(ct.gpu_arch, coll.op, n, ct.n_nodes, coll.size_bytes))
        self._plan_cache[key] = p
        return p

    def chunked_time(self, plan: Plan, ct: _tuner.CommTopology, channel_cap_Bps: float) -> _chunked.PipelineTime:
        """NCCL's chunk pipeline for ``plan`` on an idle machine (:mod:`hwmodel.nccl.chunked`), by the
        exact recurrence (see :meth:`pipeline`)."""
        return _chunked.pipeline_time(self.pipeline(plan, ct, channel_cap_Bps))

    def pipeline(self, plan: Plan, ct: _tuner.CommTopology, channel_cap_Bps: float,
                 link_rate_Bps: float | None = None) -> _chunked.Pipeline:
        """NCCL's chunk pipeline of ``plan`` (:func:`hwmodel.nccl.chunked.pipeline_for`).

        One channel moves ``min(link rate / channels, channel_cap_Bps)`` (bytes of per-edge progress per
        second): the links' unloaded rate (capacity over this plan's weight per link, protocol and link
        efficiency included; ``link_rate_Bps`` where the caller knows it) shared by the active channels,
        capped by the tuner's per-channel bandwidth.
        """
        if link_rate_Bps is None:
            link_rate_Bps = self._idle_link_rate_Bps(plan)
        nch = max(1, plan.n_channels)
        rate = min(link_rate_Bps / nch, channel_cap_Bps)
        a = _algorithms.get(plan.algorithm)
        base = a.base_latency_us[PROTOCOL_INDEX[plan.protocol]] * 1e-6
        total = _tuner.latency_s(plan.op, plan.algorithm, plan.protocol, ct)
        n = len(plan.gpus)
        per_byte = a.work_bytes(plan.op, 1.0, n)
        return _chunked.pipeline_for(plan.op, plan.algorithm, plan.protocol, plan.size_bytes, nch, ct,
                                     channel_rate_Bps=rate, base_latency_s=base, step_latency_total_s=total - base,
                                     progress_per_byte=per_byte, p2p_read_cost=self.p2p_read_cost)

    def _idle_link_rate_Bps(self, plan: Plan) -> float:
        """Per-rank progress per second ``plan``'s most loaded link allows on an idle machine."""
        self.flows(plan)  # (its routes, cached: the weights below and its start reuse them)
        weights = self._flow(plan)[1]
        return min((r.capacity / w for r, w in weights.items() if w > 0), default=math.inf)

    def _apply_pipeline(self, plan: Plan, ct: _tuner.CommTopology, channel_cap_Bps: float) -> None:
        """Give ``plan`` the latency and rate bound that reproduce NCCL's chunk pipeline's time when
        nothing contends: rate bound = channels x per-channel rate (never above the links' rate), the
        rest of the pipeline's time paid as latency. ``chunked`` evaluates the pipeline's recurrence
        (:func:`hwmodel.nccl.chunked.pipeline_time`); ``flow`` and ``step`` its closed form
        (:func:`hwmodel.nccl.pipeline_closed.closed_form_time`), with the idle link rate of the first
        group of this shape (see :meth:`_shape_link_rate_Bps`)."""
        if self.fidelity == "chunked":
            t = self.chunked_time(plan, ct, channel_cap_Bps)
            plan.info["chunked_time_s"] = t.time_s
        else:
            pipe = self.pipeline(plan, ct, channel_cap_Bps, self._shape_link_rate_Bps(plan, ct))
            t = _pipeline_closed.closed_form_time(pipe)
            plan.info["pipeline_time_s"] = t.time_s
        bound = t.channel_rate_Bps * max(1, plan.n_channels)
        plan.rate_bound_Bps = bound
        plan.latency_s = max(0.0, t.time_s - self._work(plan) / bound)

    def _shape_link_rate_Bps(self, plan: Plan, ct: _tuner.CommTopology) -> float:
        """:meth:`_idle_link_rate_Bps` of the first plan of ``plan``'s operation, algorithm and protocol
        on a communicator of ``ct``'s shape (nodes, GPUs per node, ranks), reused for the others: a
        simulated rank's mirrors are the same group shifted, and laying out every mirror's links here
        would undo what merging them saves (:mod:`hwmodel.nccl.mirrors`). Where two groups of one shape
        sit on links of different speeds, the second's ramp uses the first's rate; its bandwidth is
        still bound by its own links, which its activity loads."""
        # (ct: one object per shape, kept in a cache)
        key = (plan.op, plan.algorithm, plan.protocol, id(ct), _ecmp.plan_subflows(self, plan))
        rate = self._shape_rate_cache.get(key)
        if rate is None:
            rate = self._shape_rate_cache[key] = self._idle_link_rate_Bps(plan)
        return rate

    def plan_p2p(self, src: str, dst: str, size_bytes: int) -> Plan:
        """A send/recv of ``size_bytes`` from GPU ``src`` to GPU ``dst``; ``info["fifo_steps"]``: the
        FIFO steps per channel the send fills (:func:`~hwmodel.nccl.algorithms.p2p.p2p_fifo_steps`)."""
        same_node = self._node_of[src] == self._node_of[dst]
        key = (same_node, size_bytes)
        hit = self._p2p_cache.get(key)
        if hit is None:  # (a pipeline send's mirrors ask it once each: the plan and FIFO steps kept per key)
            ct = self.comm_topology((src, dst))
            peer = ("nvlink" if ct.intra_link == "nvlink" else "pci") if same_node else "net"
            pp = p2p_plan(size_bytes, ct, peer)
            hit = self._p2p_cache[key] = (pp, p2p_fifo_steps(size_bytes, pp, multi_node=not same_node))
        pp, steps = hit
        return Plan("p2p", size_bytes, (src, dst), "p2p", pp.protocol, pp.n_channels, pp.latency_s, 0.0, None,
                    info={"fifo_steps": steps})

    def _plan_all_to_all(self, coll: Collective, gpus: tuple[str, ...]) -> Plan:
        ct = self.comm_topology(gpus)
        per_peer = coll.size_bytes // max(len(gpus), 1)
        multi = len({self._node_of[g] for g in gpus}) > 1
        nch, lat = _tuner.p2p_channels_and_latency(per_peer, ct, same_node=not multi)
        return Plan("all_to_all", coll.size_bytes, gpus, "p2p", "simple", nch, lat, 0.0, None, 0, coll.name)

    # -- execution -----------------------------------------------------------------------------
    def start(self, plan: Plan) -> simpy.Event:
        """Start a planned collective now (every member has arrived). Returns its completion event."""
        if plan.algorithm == "none" or plan.size_bytes == 0 and plan.latency_s == 0:
            ev = self.env.event()
            ev.succeed()
            return ev
        if self.fidelity == "step" and plan.op != "p2p":
            return self.env.process(self._run_steps(plan))
        work, weights, side = self._flow(plan)
        act = self.cluster.fs.start(work, weights, latency_s=plan.latency_s, rate_bound=plan.rate_bound_Bps,
                                    side_loads=side, name=plan.name or plan.op)
        if plan.latency_s > 0:  # (its link classes may split before it joins)
            self.cluster.link_classes.track(act)
        return act.done

    def start_together(self, plans: list[Plan]) -> simpy.Event:
        """Start ``plans`` -- one collective and its symmetric mirrors, begun at the same instant --
        as ONE fluid activity over the union of their links (weights added per link); returns the
        completion event. All members then progress at the rate of the most loaded link among them,
        which is exact when the mirrors load their links alike (the symmetric case this is for) and
        cuts the number of activities by the number of mirrors. Plans that differ in work, latency or
        rate bound, and step fidelity, are started separately."""
        if len(plans) == 1 or self.fidelity == "step":
            done = self.start(plans[0])
            for p in plans[1:]:
                self.start(p)
            return done
        return self._start_groups(plans[0], self._merged_groups(plans))

    def start_mirrored(self, plan: Plan, mirrors: list[Plan]) -> simpy.Event:
        """:meth:`start_together` of ``[plan, *mirrors]``, for a caller that keeps the list ``mirrors``
        unchanged while the engine lives (a runtime's mirror cache): the merge is then cached by the
        list's identity, so a repeated collective costs O(merged groups), not O(mirrors)."""
        if not mirrors or self.fidelity == "step":
            return self.start_together([plan, *mirrors])
        key = (id(mirrors), plan.op, plan.algorithm, plan.protocol, plan.gpus, plan.root, plan.size_bytes,
               plan.latency_s, plan.rate_bound_Bps)
        hit = self._mirrored_cache.get(key)
        if hit is None:  # (the list is kept with the entry, so its id is not reused)
            hit = self._mirrored_cache[key] = (mirrors, self._merged_groups([plan, *mirrors]))
        return self._start_groups(plan, hit[1])

    def start_mirrored_sends(self, plan: Plan, pairs: list[tuple[str, ...]]) -> simpy.Event:
        """:meth:`start_mirrored` of the send ``plan`` and its mirrors ``plan_p2p(src, dst,
        plan.size_bytes)`` for each ``(src, dst)`` of ``pairs``, a list the caller keeps unchanged while
        the engine lives (cached by its identity, as :meth:`start_mirrored` caches its list). The mirrors'
        plans are made for the one merge and dropped after it: a pipeline send on 16,384 GPUs has 1,023
        mirrors, whose kept plans were most of the objects the collector's full passes walked."""
        if not pairs or self.fidelity == "step":
            return self.start_together([plan, *(self.plan_p2p(a, b, plan.size_bytes) for a, b in pairs)])
        key = (id(pairs), plan.op, plan.algorithm, plan.protocol, plan.gpus, plan.root, plan.size_bytes,
               plan.latency_s, plan.rate_bound_Bps)
        hit = self._mirrored_cache.get(key)
        if hit is None:  # (the list is kept with the entry, so its id is not reused)
            groups = _mirrors.merged_sends(self, plan, pairs)  # (one plan per kind of mirror, where it can)
            if groups is None:
                groups = self._merged_groups([plan, *(self.plan_p2p(a, b, plan.size_bytes) for a, b in pairs)])
            hit = self._mirrored_cache[key] = (pairs, groups)
        return self._start_groups(plan, hit[1])

    def _start_groups(self, first: Plan, groups: list[_MergedGroup]) -> simpy.Event:
        first_done: simpy.Event | None = None
        for work, lat, bound, weights, side, has_first in groups:
            act = self.cluster.fs.start(work, weights, latency_s=lat, rate_bound=bound, side_loads=side,
                                        name=first.name or first.op)
            if lat > 0:  # (a merge's link classes may split before it joins)
                self.cluster.link_classes.track(act)
            if has_first:
                first_done = act.done
        return first_done if first_done is not None else self.start(first)

    def _merged_groups(self, plans: list[Plan]) -> list[_MergedGroup]:
        """``plans`` grouped by (work, latency, rate bound), each group's link weights merged
        (:func:`hwmodel.nccl.mirrors.merged_weights`; cached by the members' plans)."""
        first = plans[0]
        groups: dict[tuple, list[Plan]] = {}
        works: dict[tuple, float] = {}  # (a mirrored send's thousand mirrors: one work figure)
        for p in plans:
            if p.algorithm == "none":
                continue
            wk = (p.algorithm, p.op, p.size_bytes, len(p.gpus))
            work = works.get(wk)
            if work is None:
                work = works[wk] = self._work(p)
            groups.setdefault((work, p.latency_s, p.rate_bound_Bps), []).append(p)
        out: list[_MergedGroup] = []
        for (work, lat, bound), members in groups.items():
            k = _ecmp.plan_subflows(self, members[0])
            key = (k, *((p.op, p.algorithm, p.protocol, p.gpus, p.root, p.busbw_correction) for p in members))
            hit = self._merged_cache.get(key)
            if hit is None:
                # HBM side loads only for the first plan: mirrors run on GPUs whose kernels are not
                # simulated, so their HBM traffic would load nothing anyone waits for.
                side = dict(self._flow(members[0])[2]) if members[0] is first else {}
                ends = set(members[0].gpus) if members[0] is first else set()
                self._flow(members[0])  # (its links' classes first: the merge adds to them)
                weights = _mirrors.merged_weights(self, members, self.edge_weights(members[0]), ends, k)
                hit = self._merged_cache[key] = (weights, side)
            out.append((work, lat, bound, hit[0], hit[1], first in members))
        return out

    def run(self, coll: Collective, gpus: Sequence[str]) -> simpy.Event:
        """Plan and start ``coll`` on ``gpus`` now (standalone use, e.g. nccl-tests)."""
        return self.start(self.plan(coll, tuple(gpus)))

    def flows(self, plan: Plan) -> list[Flow]:
        """The edges ``plan`` loads (cached): see the module docstring for each algorithm."""
        key = (plan.op, plan.algorithm, plan.gpus, plan.root)
        hit = self._flows_cache.get(key)
        if hit is None:
            hit = self._flows_cache[key] = self._edge_flows(plan)
        return hit

    # -- flow fidelity: one activity per collective --------------------------------------------
    def _work(self, plan: Plan) -> float:
        """Bytes each edge of weight 1 carries over the whole collective (progress units)."""
        return _algorithms.get(plan.algorithm).work_bytes(plan.op, float(plan.size_bytes), len(plan.gpus))

    def _flow(self, plan: Plan) -> tuple[float, dict[Resource, float], dict[Resource, float]]:
        """Work (payload bytes per member per edge) and link/HBM weights of a planned collective."""
        key = (plan.op, plan.algorithm, plan.protocol, plan.gpus, plan.root, plan.busbw_correction,
               _ecmp.plan_subflows(self, plan))
        hit = self._weights_cache.get(key)
        if hit is None:
            hit = self._weights_cache[key] = self._weights(plan)
        return self._work(plan), hit[0], hit[1]

    def _proto_weight(self, plan: Plan) -> float:
        return 1.0 / (_tuner.PROTOCOL_EFFICIENCY[plan.protocol] * plan.busbw_correction)

    proto_weight = _proto_weight
    """Wire bytes per payload byte of ``plan``'s protocol (1 / NCCL's protocol efficiency)."""

    def edge_weights(self, plan: Plan) -> dict[_mirrors.Edge, float]:
        """Topology edge -> bytes on it per byte of per-rank progress of ``plan`` (cached), the figures
        :meth:`_link_weights` gives per link resource (:func:`hwmodel.nccl.mirrors.edge_weights`)."""
        k = _ecmp.plan_subflows(self, plan)
        key = (plan.op, plan.algorithm, plan.protocol, plan.gpus, plan.root, plan.busbw_correction, k)
        hit = self._edge_weights_cache.get(key)
        if hit is None:
            ctx = _mirrors.EdgeContext(self, k)
            hit = self._edge_weights_cache[key] = _mirrors.edge_weights(self, ctx, plan, self._eff_of_kind)
        return hit

    def _weights(self, plan: Plan) -> tuple[dict[Resource, float], dict[Resource, float]]:
        # per edge, then per link class (hwmodel.link_classes): links no other traffic tells apart
        # are one resource
        weights = self.cluster.link_classes.resolve(self.edge_weights(plan))
        hbm = HBM_BYTES_PER_BYTE.get(plan.op, 2.0)
        sims, gpus = self.side_load_gpus, self.cluster.gpus
        return weights, {gpus[g].hbm: hbm for g in plan.gpus if sims is None or g in sims}

    def _link_weights(self, plan: Plan, flows: list[Flow] | None = None) -> dict[Resource, float]:
        """Link -> bytes on it per byte of per-rank progress of ``plan`` (its flows uncached if not given)."""
        proto_w = self._proto_weight(plan)
        per_byte: dict[Resource, float] = {}  # edge fractions summed per link first, then scaled
        for f in self._edge_flows(plan) if flows is None else flows:
            frac = f.frac
            for r in f.path:
                per_byte[r] = per_byte.get(r, 0.0) + frac
        return {r: w * proto_w / self._link_efficiency(r) for r, w in per_byte.items()}

    def _link_efficiency(self, r: Resource) -> float:
        eff = self._eff_cache.get(r)
        if eff is None:
            eff = self._eff_cache[r] = self._link_efficiency_uncached(r)
        return eff

    def _link_efficiency_uncached(self, r: Resource) -> float:
        return self.link_efficiency_of_kind(r.meta[3] if isinstance(r.meta, tuple) and len(r.meta) > 3 else "")

    def link_efficiency_of_kind(self, kind: str) -> float:
        """NCCL's achieved / line rate on a link of topology edge kind ``kind`` (NVLink: the engine's
        ``nvlink_efficiency``; InfiniBand/Ethernet: the calibrated app efficiency; others 1)."""
        if kind == "nvlink":
            return self.nvlink_efficiency
        if kind in ("ib", "net", "ethernet"):
            return _calibration.ib_app_efficiency()
        return 1.0

    # -- what an algorithm asks to lay out its flows (algorithms.base.FlowContext) -------------
    @property
    def topology(self) -> Topology:
        """The cluster's topology."""
        return self.cluster.topology

    def path(self, a: str, b: str) -> tuple[Resource, ...]:
        """The routed links from ``a`` to ``b``."""
        return tuple(self.cluster.path(a, b)[0])

    def rails(self, ppn: int) -> int:
        """Rails (one ring or tree per NIC) a communicator with ``ppn`` GPUs per node uses."""
        return max(1, min(ppn, self.cluster.topology.nics_per_node or 1))

    def nodes_of(self, gpus: tuple[str, ...]) -> dict[int, list[str]]:
        """``gpus`` grouped by node, nodes and GPUs in communicator order."""
        by_node: dict[int, list[str]] = {}
        for g in gpus:
            by_node.setdefault(self._node_of[g], []).append(g)
        return by_node

    def _edge_flows(self, plan: Plan) -> list[Flow]:
        return _algorithms.get(plan.algorithm).flows(self, plan.op, plan.gpus, plan.root)

    # -- step fidelity ---------------------------------------------------------------------------
    def n_steps(self, plan: Plan) -> int:
        """Synchronised steps of ``plan`` in step fidelity (see the module docstring)."""
        return _algorithms.get(plan.algorithm).step_count(plan.op, len(plan.gpus))

    def _run_steps(self, plan: Plan):
        """Every algorithm step as a synchronised set of per-edge transfers (a barrier per step).

        Each step moves ``work / steps`` on every edge (times its fraction), each edge its own fluid
        activity bounded by the plan's per-edge rate, and pays ``latency / steps`` first. The edge's
        HBM traffic is a side load, half on the sender and half on the receiver.
        """
        env = self.env
        fs = self.cluster.fs
        steps = self.n_steps(plan)
        hop_lat = plan.latency_s / steps
        per_step = self._work(plan) / steps
        proto_w = self._proto_weight(plan)
        hbm = HBM_BYTES_PER_BYTE.get(plan.op, 2.0) / 2
        gpus = self.cluster.gpus
        edges = []
        for f in self.flows(plan):
            w: dict[Resource, float] = {}
            for r in f.path:
                w[r] = w.get(r, 0.0) + proto_w / self._link_efficiency(r)
            side = {gpus[f.src].hbm: hbm}
            side[gpus[f.dst].hbm] = side.get(gpus[f.dst].hbm, 0.0) + hbm
            bound = plan.rate_bound_Bps * f.frac if plan.rate_bound_Bps else None
            edges.append((per_step * f.frac, w, side, bound))
        name = f"{plan.name or plan.op}/step"
        for _ in range(steps):
            acts = [fs.start(work, w, latency_s=hop_lat, rate_bound=bound, side_loads=side, name=name)
                    for work, w, side, bound in edges]
            yield simpy.AllOf(env, [a.done for a in acts])
        return env.now


def simulate_nccl_tests(topology: Topology, collective: str, sizes: Iterable[int | str], *,
                        gpus_per_thread: int = 1, gpus: Sequence[str] | None = None, dtype: str = "float",
                        algorithm: str | None = None, protocol: str | None = None,
                        fidelity: str = "flow", tuner_config: TunerConfig | None = None, p2p_read_cost: bool = False,
                        ib_qps_per_connection: int = 1, ib_adaptive_routing: bool = False) -> list[_nt.NcclTestsRow]:
    """Emulate an nccl-tests sweep on the hardware model: one row per size, as nccl-tests prints it.

    Each size runs once on an otherwise idle cluster (``fidelity`` flow, step or chunked). The reported time is
    nccl-tests' time per iteration of back-to-back asynchronous launches, ``max(GPU time, host time)``:
    when one thread drives ``gpus_per_thread`` > 1 GPUs (``-g``), the host enqueues every collective on
    every GPU itself, costing ``G x (HOST_LAUNCH_PER_GPU_S + HOST_PER_CHANNEL_PER_GPU_S x nChannels)``
    per iteration, which bounds small sizes (see the constants; fitted to 8x A100 ``-g 8``). With one
    GPU per thread the host cost is hidden behind the GPU (NCCL's base latency already contains the
    launch) and not added. A single-rank communicator reports one kernel launch.

    Args:
        topology: the machine.
        gpus: the communicator's GPUs in rank order (default: every GPU of ``topology``).
        collective: nccl-tests binary or collective name (``all_reduce_perf``, ``allreduce``,
            ``all_reduce``, ``sendrecv`` ...).
        sizes: requested sizes (``-b`` .. ``-e``), bytes or nccl-tests size strings.
        gpus_per_thread: nccl-tests ``-g``.
        dtype: nccl-tests ``-d`` type name (float, half, bfloat16, ...).
        algorithm, protocol: force NCCL's choice (``NCCL_ALGO`` / ``NCCL_PROTO``).
        tuner_config: tuner-plugin rules (``NCCL_TUNER_CONFIG_FILE``), applied after ``algorithm`` /
            ``protocol`` restrict the enabled pairs.
        p2p_read_cost, ib_qps_per_connection, ib_adaptive_routing: see :class:`NcclEngine` (NCCL_IB_*).

    Returns:
        :class:`hwmodel.nccl.nccltests.NcclTestsRow` per size (SI units).

    Raises:
        ValueError: unknown collective or dtype, bad size, unknown or duplicate GPUs, or an algorithm the
            collective does not support.
    """
    coll = _nt.canonical_collective(collective)
    dt = _nt.nccltests_dtype(dtype)
    if gpus_per_thread < 1:
        raise ValueError(f"gpus_per_thread must be >= 1, got {gpus_per_thread}")
    gpus = tuple(topology.gpus() if gpus is None else gpus)
    n = len(gpus)
    if n < 1:
        raise ValueError("simulate_nccl_tests needs at least one GPU")
    cluster = Cluster(topology, record=False)
    eng = NcclEngine(cluster, fidelity=fidelity, algorithm=algorithm, protocol=protocol,
                     tuner_config=tuner_config, p2p_read_cost=p2p_read_cost,
                     ib_qps_per_connection=ib_qps_per_connection, ib_adaptive_routing=ib_adaptive_routing)
    env = cluster.env
    host_launch = _calibration.host_launch_per_gpu_s()
    host_per_channel = _calibration.host_per_channel_per_gpu_s()
    rows = []
    for size in sizes:
        b = _nt.parse_size(size)
        s_bytes = _nt.nccltests_size_bytes(coll, b, dt, n)
        t0 = env.now
        if coll == "sendrecv":
            plans = [eng.plan_p2p(gpus[i], gpus[(i + 1) % n], s_bytes) for i in range(n)] if n > 1 else []
            done: simpy.Event = simpy.AllOf(env, [eng.start(p) for p in plans])
            algo = "p2p"
            proto = plans[0].protocol if plans else "simple"
            nch = plans[0].n_channels if plans else 0
        else:
            plan = eng.plan(Collective(coll, s_bytes, tuple(range(n)), dtype=dt), gpus)
            done = eng.start(plan)
            algo, proto, nch = plan.algorithm, plan.protocol, plan.n_channels
        env.run(until=done)
        t = env.now - t0
        if gpus_per_thread > 1:
            t = max(t, gpus_per_thread * (host_launch + host_per_channel * nch))
        if n == 1:
            t = max(t, host_launch)
        rows.append(_nt.make_row(coll, b, t, n, dt, algorithm=algo, protocol=proto))
    return rows


CPU_VENDOR_BY_SYSTEM: dict[str, str] = {"dgx-a100": "amd", "dgx-a100-40gb": "amd", "dgx-h100": "intel",
                                         "hgx-h200": "intel", "dgx-b200": "intel"}
"""Host CPU vendor of the named systems (NCCL's ``llMaxBws`` row and ``getNetOverhead``): DGX A100 has
AMD EPYC 7742, DGX H100/H200/B200 Intel Xeon (NVIDIA DGX user guides). Other topologies: AMD, as the
topology carries no CPU vendor yet."""


def _correct(plan: Plan, factor: float) -> None:
    """Apply a fitted busbw correction to a tuner-chosen plan (nothing when ``factor`` is 1)."""
    if factor == 1.0:
        return
    plan.busbw_correction = factor
    plan.latency_s /= factor
    plan.predicted_time_s /= factor
    if plan.rate_bound_Bps is not None:
        plan.rate_bound_Bps *= factor


def _cpu_vendor(topo) -> str:
    vendor = getattr(topo, "cpu_vendor", None)
    return vendor or CPU_VENDOR_BY_SYSTEM.get(topo.name, "amd")


def _nvswitch_generation(topo) -> int:
    """NVSwitch generation from the first ``nvswitch`` device's spec name (``NVSwitch-gen3`` -> 3);
    0 without NVSwitch. NVLS needs generation 3 (Hopper's NVLink SHARP)."""
    for sw in topo.nodes_of_kind("nvswitch"):
        spec = str(topo.graph.nodes[sw].get("spec", ""))
        digits = "".join(ch for ch in spec.rsplit("gen", 1)[-1] if ch.isdigit())
        return int(digits) if "gen" in spec and digits else 0
    return 0
