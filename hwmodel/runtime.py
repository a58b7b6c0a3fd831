"""Executes per-rank programs on a cluster, with CUDA stream and NCCL semantics.

One long-lived SimPy process per (rank, stream) consumes that stream's tasks in order -- measured ~10x
faster than a process per kernel. A task starts when (1) the previous task on its stream is done,
(2) the tasks in its ``deps`` are done (CUDA events), and (3) the host has issued it. The host is not
simulated as a thread: task ``id`` of a rank (ids in program order) is issued at the fixed time
``(id + 1) * host_launch_overhead_s``, whatever the GPU does -- an unbounded launch queue that never
makes the host wait, so launch overhead shows only where the GPU would otherwise get ahead of it.

Collectives are matched across the ranks of their communicator by sequence number on that
communicator, as NCCL does. An NCCL kernel launches when its stream reaches it and holds its channels'
SMs while it waits for the other ranks -- so a rank that arrives early loses SMs for compute, as on real
GPUs. The collective starts when the last rank arrives. Sends are matched to receives FIFO per ordered
pair. A send whose receive is not posted yet does not wait for it when it fits in the free slots of the
connection's FIFO (NCCL's ``NCCL_STEPS`` per channel): its kernel writes the message there and ends; the
receive moves it when posted. A larger send holds its SMs until its receive arrives. A mismatch (same
communicator and sequence, different operation) raises :class:`CollectiveMismatchError` at once;
programs that wait forever, or sends never received, raise :class:`DeadlockError` naming the ranks and
tasks involved -- never a hang.
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from operator import eq, itemgetter
from typing import TYPE_CHECKING

import simpy

from hwmodel.cluster import Cluster
from hwmodel.events import (  # re-exported: the trace's record types belong to the runtime's API
    CollectiveInfo,
    EventInfo,
    KernelInfo,
    MacroInfo,
    MemcpyInfo,
    P2PInfo,
    TraceEvent,
)
from hwmodel.fluid import Activity, Resource
from hwmodel.ir import Collective, Compute, Memcpy, Program, SendRecv, Task
from hwmodel.nccl.algorithms.p2p import P2P_FIFO_STEPS
from hwmodel.nccl.calibration import copy_engine_nvlink_efficiency

if TYPE_CHECKING:
    from hwmodel.nccl.engine import NcclEngine, Plan

__all__ = [
    "DEFAULT_HOST_LAUNCH_OVERHEAD_S", "PROGRESS_EVERY_TASKS", "CollectiveInfo", "CollectiveMismatchError",
    "DeadlockError", "EventInfo", "KernelInfo", "MacroInfo", "MemcpyInfo", "P2PInfo", "RunResult", "Runtime",
    "TraceEvent",
]


class DeadlockError(RuntimeError):
    """The programs cannot finish: some ranks wait for work other ranks never issue."""


class CollectiveMismatchError(RuntimeError):
    """Ranks of one communicator issued different collectives at the same sequence number."""


DEFAULT_HOST_LAUNCH_OVERHEAD_S = 4e-6
"""CPU time to issue one kernel (``cudaLaunchKernel`` plus framework dispatch). No primary measurement
was found: the reference notes "a few µs" for the launch itself (hardware_nccl.md §5(c)); PyTorch
eager dispatch adds more. Uncertain; a scenario can change it."""


PROGRESS_EVERY_TASKS = 1024
""":meth:`Runtime.run` reports progress after every this many finished tasks (and at the end)."""


@dataclass(slots=True)
class RunResult:
    """What a run produced: the time each rank finished and the trace of executed tasks."""

    end_time_s: float
    rank_end_s: dict[int, float]
    events: list[TraceEvent]
    cluster: Cluster
    placement: dict[int, str]
    stats: dict[str, float] = field(default_factory=dict)


class _Rendezvous:
    __slots__ = ("op", "arrived", "started", "done", "plan", "start_time")

    def __init__(self, op: Collective, env: simpy.Environment, plan: Plan) -> None:
        self.op = op
        self.arrived: dict[int, float] = {}
        self.started = False
        self.done: simpy.Event = env.event()
        self.plan = plan
        self.start_time = 0.0


class Runtime:
    """Run ``programs`` (one per rank) on ``cluster``.

    Args:
        cluster: the machine.
        programs: one :class:`Program` per rank (a mapping rank -> program, or a list in rank order).
        placement: rank -> GPU node name; default: rank i on the topology's i-th GPU.
        host_launch_overhead_s: CPU time per issued task (see module doc).
        nccl: the collective engine; default :class:`hwmodel.nccl.engine.NcclEngine` on ``cluster``.
        mirror: symmetry mode. When only representative ranks have programs, ``mirror(ranks)`` returns
            the rank tuples that do the same thing at the same time on the ranks they stand for (the
            argument first; ``mirror((src, dst), directed=True)`` for transfers, keeping a reverse
            transfer a set-wise duplicate would drop). Their collectives and transfers are started on
            the fabric too, so shared links carry the whole cluster's traffic; mirrors that stay
            inside a node hosting no simulated rank are skipped (they share no resource with simulated
            work). Collectives then complete when their *simulated* members have arrived.
            ``placement`` must cover every rank.

    Raises:
        ValueError: a placement names an unknown GPU, two ranks share a GPU, or there are more ranks
            than GPUs.
    """

    def __init__(self, cluster: Cluster, programs: Mapping[int, Program] | Iterable[Program], *,
                 placement: Mapping[int, str] | None = None,
                 host_launch_overhead_s: float = DEFAULT_HOST_LAUNCH_OVERHEAD_S, nccl: NcclEngine | None = None,
                 mirror: Callable[..., Iterable[tuple[int, ...]]] | None = None) -> None:
        self.cluster = cluster
        self.env = cluster.env
        progs = dict(programs) if isinstance(programs, Mapping) else {p.rank: p for p in programs}
        self.programs: dict[int, Program] = dict(sorted(progs.items()))
        gpus = cluster.topology.gpus()
        if placement is None:
            if len(self.programs) > len(gpus):
                raise ValueError(f"{len(self.programs)} ranks but the cluster has only {len(gpus)} GPUs")
            placement = {r: gpus[i] for i, r in enumerate(self.programs)}
        self.placement = dict(placement)
        if mirror is None or list(self.placement.values()) != gpus[:len(self.placement)]:
            # (a mirrored run placing rank i on the i-th GPU, as the scenarios do, is known and distinct)
            self._check_placement(gpus, mirror is not None)
        if host_launch_overhead_s < 0:
            raise ValueError(f"host_launch_overhead_s must be >= 0, got {host_launch_overhead_s}")
        self.host_overhead = host_launch_overhead_s
        if nccl is None:
            from hwmodel.nccl.engine import NcclEngine
            nccl = NcclEngine(cluster)
        self.nccl = nccl
        if mirror is not None:  # (a mirror's HBM has no simulated kernel to slow: its side loads change nothing)
            nccl.side_load_gpus = {self.placement[r] for r in self.programs}
        self.events: list[TraceEvent] = []
        self._finished: dict[int, bytearray] = {r: bytearray(len(p.tasks)) for r, p in self.programs.items()}
        self._task_events: dict[tuple[int, int], simpy.Event] = {}
        self._waiting_on: dict[tuple[int, str], str | tuple] = {}  # (formatted only for a deadlock)
        self._coll_seq: dict[tuple[int, tuple[int, ...]], int] = defaultdict(int)
        self._rdv: dict[tuple[tuple[int, ...], int], _Rendezvous] = {}
        self._sends: dict[tuple[int, int, str], deque] = defaultdict(deque)
        self._recvs: dict[tuple[int, int, str], deque] = defaultdict(deque)
        self._fifo_steps: dict[tuple[int, int], int] = defaultdict(int)  # (src, dst) -> slots filled per channel
        self._procs: list[tuple[int, str, simpy.Process]] = []
        self._rank_end: dict[int, float] = dict.fromkeys(self.programs, 0.0)
        self._copy_engines: dict[str, simpy.Resource] = {}
        self.copies_requested_peak = 0
        """Most :class:`~hwmodel.ir.Memcpy` copies one GPU had requested at once (running on its copy
        engines or waiting for one): a GPU spec's ``copy_engines`` at or above it changes nothing."""
        self.mirror = mirror
        self._mirror_cache: dict[tuple[tuple[int, ...], bool], list[tuple[str, ...]]] = {}
        topo = cluster.topology
        self._sim_nodes = {topo.node_of(self.placement[r]) for r in self.programs}
        self.mirrored_activities = 0
        self._mirror_plans: dict[tuple, list[Plan]] = {}
        # a collective's plan and simulated member count, a transfer's plan: the same for every repeat
        self._plans: dict[tuple, Plan] = {}
        self._expected: dict[tuple[int, ...], int] = {}
        self._tasks_done = 0
        self._tasks_total = 0
        self._progress: Callable[[int, int], None] | None = None

    def _check_placement(self, gpus: list[str], mirrored: bool) -> None:
        """ValueError unless the placement of the simulated ranks (every rank when ``mirrored``) names
        known GPUs, each at most once."""
        checked = self.placement if mirrored else self.programs
        known = self.cluster.topology.gpu_indices()  # (one set operation: a mirrored run places every rank)
        if not known.keys() >= set(map(self.placement.get, checked)):
            r = next(r for r in checked if self.placement.get(r) not in known)
            raise ValueError(f"placement of rank {r}: unknown GPU {self.placement.get(r)!r} (e.g. {gpus[:3]} ...)")
        placed = list(self.placement.values()) if mirrored else [self.placement[r] for r in self.programs]
        if len(set(placed)) != len(placed):
            raise ValueError("placement maps two ranks to the same GPU")

    # -- public -------------------------------------------------------------------------------
    def run(self, *, progress: Callable[[int, int], None] | None = None) -> RunResult:
        """Simulate until every program has finished.

        Args:
            progress: called as ``progress(tasks_done, tasks_total)`` after every
                :data:`PROGRESS_EVERY_TASKS` finished tasks and once at the end (e.g. to drive a
                progress bar); it must not touch the simulation.

        Raises:
            DeadlockError: some streams can never proceed, or a send is never received.
            CollectiveMismatchError: ranks disagree on a collective.
        """
        for rank, prog in self.programs.items():
            by_stream: dict[str, list[Task]] = defaultdict(list)
            for t in prog.tasks:
                by_stream[t.stream].append(t)
            needed = {d for t in prog.tasks for d in t.deps}
            for d in needed:
                self._task_events[(rank, d)] = self.env.event()
            for stream, tasks in by_stream.items():
                proc = self.env.process(self._stream(rank, stream, tasks))
                self._procs.append((rank, stream, proc))
        self._progress = progress
        self._tasks_total = sum(len(p.tasks) for p in self.programs.values())
        self.env.run()
        if progress is not None:
            progress(self._tasks_done, self._tasks_total)
        stuck = [(r, s) for r, s, p in self._procs if p.is_alive]
        if stuck or any(self._sends.values()):  # (a send that fit in the FIFO ended without its receive)
            raise DeadlockError(self._deadlock_report(stuck))
        end = max(self._rank_end.values(), default=0.0)
        return RunResult(end, dict(self._rank_end), self.events, self.cluster, self.placement,
                         {"fluid_solves": self.cluster.fs.solves})

    # -- stream processes -----------------------------------------------------------------------
    def _stream(self, rank: int, stream: str, tasks: list[Task]):
        env = self.env
        finished = self._finished[rank]
        gpu = self.cluster.gpus[self.placement[rank]]
        where = (rank, stream)  # (the key of this stream's entry in _waiting_on)
        waiting_on, task_events, events = self._waiting_on, self._task_events, self.events
        for t in tasks:
            for d in t.deps:
                if not finished[d]:
                    waiting_on[where] = ("dep", t.id, d)
                    yield task_events[(rank, d)]
            issue = (t.id + 1) * self.host_overhead
            if issue > env.now:
                yield env.timeout(issue - env.now)
            start = env.now
            op = t.op
            if isinstance(op, Compute):
                waiting_on[where] = ("kernel", t.id, op)
                cost = gpu.cost(op)
                act = gpu.launch(op, cost)
                yield act.done
                info = _kernel_info(op, cost.solo_time_s)
                events.append(TraceEvent(rank, stream, t.id, op.name, op.kind, start, env.now,
                                         op.phase, op.layer, info))
            elif isinstance(op, Collective):
                yield from self._collective(rank, stream, t, op, start)
            elif isinstance(op, SendRecv):
                yield from self._p2p(rank, stream, t, op, start)
            elif isinstance(op, Memcpy):
                yield from self._memcpy(rank, stream, t, op, start)
            else:
                raise TypeError(f"rank {rank} task {t.id}: unknown operation {op!r}")
            finished[t.id] = 1
            ev = task_events.get((rank, t.id))
            if ev is not None:
                ev.succeed()
            if env.now > self._rank_end[rank]:
                self._rank_end[rank] = env.now
            self._tasks_done += 1
            if self._progress is not None and self._tasks_done % PROGRESS_EVERY_TASKS == 0:
                self._progress(self._tasks_done, self._tasks_total)
        self._waiting_on.pop((rank, stream), None)

    def _collective(self, rank: int, stream: str, t: Task, op: Collective, start: float):
        group = op.group
        if rank not in group:
            raise ValueError(f"rank {rank} task {t.id}: issues {op.op} on group {group} it is not part of")
        key_seq = (rank, group)
        seq = self._coll_seq[key_seq]
        self._coll_seq[key_seq] = seq + 1
        key = (group, seq)
        mkey = (group, op.op, op.size_bytes, op.dtype, op.root, op.algorithm, op.protocol)
        rdv = self._rdv.get(key)
        if rdv is None:
            plan = self._plans.get(mkey)
            if plan is None:  # (the engine's own cache is keyed alike: the same object)
                if len(set(group)) != len(group):
                    dup = sorted({r for r in group if group.count(r) > 1})
                    raise ValueError(f"collective {op.op} ({op.name or 'unnamed'}): duplicate ranks {dup} "
                                     f"in group {group}")
                plan = self._plans[mkey] = self.nccl.plan(op, tuple(self.placement[r] for r in group))
            rdv = _Rendezvous(op, self.env, plan)
            self._rdv[key] = rdv
        elif (rdv.op.op, rdv.op.size_bytes, rdv.op.dtype, rdv.op.root) != (op.op, op.size_bytes, op.dtype,
                                                                           op.root):
            first = next(iter(rdv.arrived), None)
            raise CollectiveMismatchError(
                f"collective #{seq} on group {group}: rank {first} issued {_desc(rdv.op)} but rank {rank} "
                f"issued {_desc(op)} (task {t.id}); real NCCL would hang here")
        rdv.arrived[rank] = self.env.now
        gpu = self.cluster.gpus[self.placement[rank]]
        channels = rdv.plan.n_channels
        gpu.hold_sms(channels)
        self._waiting_on[(rank, stream)] = ("collective", t.id, op, seq)
        expected = self._expected.get(group)
        if expected is None:
            expected = self._expected[group] = len(group) if self.mirror is None else \
                sum(1 for r in group if r in self.programs)
        if len(rdv.arrived) == expected:
            rdv.started = True
            rdv.start_time = self.env.now
            del self._rdv[key]
            mirrors = self._mirror_plans.get(mkey)
            if mirrors is None:
                mirrors = self._mirror_plans[mkey] = [self.nccl.plan(op, gpus) for gpus in self._mirrors(group)]
            self.mirrored_activities += len(mirrors)
            done = self.nccl.start_mirrored(rdv.plan, mirrors)
            def release_members(_ev: simpy.Event) -> None:  # every member's wait ends with the activity
                rdv.done.succeed()

            done.callbacks.append(release_members)
        yield rdv.done
        gpu.release_sms(channels)
        p = rdv.plan
        self.events.append(TraceEvent(rank, stream, t.id, op.name or op.op, f"nccl:{op.op}", start,
                                      self.env.now, "", "",
                                      CollectiveInfo(p.algorithm, p.protocol, p.n_channels, op.size_bytes,
                                                     getattr(p, "latency_s", 0.0), len(group)),
                                      rdv.start_time, op.dtype))

    def _p2p(self, rank: int, stream: str, t: Task, op: SendRecv, start: float):
        if op.peer not in self.programs:
            raise ValueError(f"rank {rank} task {t.id}: {op.direction} peer {op.peer} is not a rank")
        if op.direction == "send":
            pair, mine, theirs = (rank, op.peer, op.tag), self._sends, self._recvs
        else:
            pair, mine, theirs = (op.peer, rank, op.tag), self._recvs, self._sends
        self._waiting_on[(rank, stream)] = ("p2p", t.id, op)
        gpu = self.cluster.gpus[self.placement[rank]]
        plan = self._p2p_plan((pair[:2], op.size_bytes))
        if theirs[pair]:
            other_op, done = theirs[pair].popleft()
            if other_op.size_bytes != op.size_bytes:
                raise CollectiveMismatchError(
                    f"send/recv between ranks {pair[0]}->{pair[1]}: sizes differ "
                    f"({other_op.size_bytes} vs {op.size_bytes} bytes)")
            gpu.hold_sms(plan.n_channels)
            now = self.env.now
            pairs = self._mirrors(pair[:2], directed=True)  # (kept: the engine caches its merge by this list)
            self.mirrored_activities += len(pairs)
            self.nccl.start_mirrored_sends(plan, pairs).callbacks.append(lambda _ev: done.succeed(now))
        elif op.direction == "send" and self._fifo_room(pair, plan):
            yield from self._eager_send(rank, stream, t, op, start, pair, plan)
            return
        else:
            done = self.env.event()
            mine[pair].append((op, done))
            # Hold this side's SMs while waiting, with the channel count the transfer will use.
            gpu.hold_sms(plan.n_channels)
        xfer_start = yield done
        gpu.release_sms(plan.n_channels)
        self.events.append(TraceEvent(rank, stream, t.id, op.name or op.direction, op.direction, start,
                                      self.env.now, "", "", P2PInfo(op.peer, op.size_bytes), xfer_start))

    def _fifo_room(self, pair: tuple[int, int, str], plan: Plan) -> bool:
        """Whether a send of ``plan`` finds free slots for all of its steps in the connection's FIFO
        (``P2P_FIFO_STEPS`` per channel, shared by every message from ``pair[0]`` to ``pair[1]`` not yet
        received). A send that does not fit waits for its receive, as before NCCL's FIFO existed here:
        an approximation for a message that only waits for earlier ones to drain."""
        return self._fifo_steps[pair[:2]] + plan.info.get("fifo_steps", P2P_FIFO_STEPS + 1) <= P2P_FIFO_STEPS

    def _eager_send(self, rank: int, stream: str, t: Task, op: SendRecv, start: float,
                    pair: tuple[int, int, str], plan: Plan):
        """A send whose receive is not posted yet and that fits in the FIFO: the kernel holds its
        channels' SMs while it writes the message into the FIFO (one read and one write of the bytes
        through this GPU's HBM, after the transfer's latency) and completes; the message is queued for
        the receive, which moves it across the links when it is posted and frees its FIFO slots then."""
        gpu = self.cluster.gpus[self.placement[rank]]
        steps = plan.info["fifo_steps"]
        link = pair[:2]
        self._fifo_steps[link] += steps
        done = self.env.event()

        def free_slots(_ev: simpy.Event) -> None:
            self._fifo_steps[link] -= steps

        done.callbacks.append(free_slots)
        self._sends[pair].append((op, done))
        gpu.hold_sms(plan.n_channels)
        act = self.cluster.fs.start(op.size_bytes, {gpu.hbm: 2.0}, latency_s=plan.latency_s,
                                    name=op.name or "send")
        yield act.done
        gpu.release_sms(plan.n_channels)
        self.events.append(TraceEvent(rank, stream, t.id, op.name or op.direction, op.direction, start,
                                      self.env.now, "", "", P2PInfo(op.peer, op.size_bytes), start))

    def _p2p_plan(self, key: tuple[tuple[int, ...], int]) -> Plan:
        """The plan of a transfer ``((src, dst), size_bytes)`` (the engine's, kept: it does not change)."""
        plan = self._plans.get(key)
        if plan is None:
            (src, dst), size = key
            plan = self._plans[key] = self.nccl.plan_p2p(self.placement[src], self.placement[dst], size)
        return plan

    def _mirrors(self, ranks: tuple[int, ...], *, directed: bool = False) -> list[tuple[str, ...]]:
        """GPU tuples of the mirrors of ``ranks`` worth simulating (see ``mirror``); ``directed``: ``ranks``
        is a transfer ``(src, dst)``, whose reverse is another transfer (``mirror(ranks, directed=True)``)."""
        if self.mirror is None:
            return []
        hit = self._mirror_cache.get((ranks, directed))
        if hit is None:
            place, node_of, sim = self.placement.__getitem__, self.cluster.topology.gpu_nodes().__getitem__, \
                self._sim_nodes  # (placed GPUs only: checked in __init__)
            others = list(filter(ranks.__ne__, self.mirror(ranks, directed=True) if directed else self.mirror(ranks)))
            if len(ranks) == 2 and set(map(len, others)) <= {2}:  # (transfers: a thousand mirrors, by map)
                hit = _placed_pairs(others, place, node_of, sim)
                self._mirror_cache[(ranks, directed)] = hit
                return hit
            hit = []
            for other in others:
                gpus = tuple(map(place, other))
                nodes = set(map(node_of, gpus))
                if len(nodes) == 1 and not nodes & sim:
                    continue  # inside a node no simulated rank uses: disjoint from simulated work
                hit.append(gpus)
            self._mirror_cache[(ranks, directed)] = hit
        return hit

    def _memcpy(self, rank: int, stream: str, t: Task, op: Memcpy, start: float):
        gname = self.placement[rank]
        ce = self._copy_engines.get(gname)
        if ce is None:
            ce = self._copy_engines[gname] = simpy.Resource(self.env, self.cluster.gpus[gname].spec.copy_engines)
        self._waiting_on[(rank, stream)] = f"task {t.id} memcpy {op.direction}"
        with ce.request() as req:
            self.copies_requested_peak = max(self.copies_requested_peak, ce.count + len(ce.queue))
            yield req
            if op.direction in ("h2d", "d2h"):
                act = self.cluster.fs.start(op.size_bytes, {self.cluster.pcie_link(gname, op.direction): 1.0},
                                            name=op.name or f"memcpy_{op.direction}")
            elif op.direction == "peer":
                if op.peer is None or op.peer not in self.placement:
                    raise ValueError(f"rank {rank} task {t.id}: peer memcpy needs a valid peer rank")
                act = self._peer_copy(rank, op.peer, op.size_bytes)
            else:  # d2d on one GPU: read and write through HBM
                gpu = self.cluster.gpus[gname]
                act = self.cluster.fs.start(op.size_bytes, {gpu.hbm: 2.0}, name=op.name or "memcpy_d2d")
            yield act.done
        self.events.append(TraceEvent(rank, stream, t.id, op.name or f"memcpy_{op.direction}", "memcpy",
                                      start, self.env.now, "", "", MemcpyInfo(op.size_bytes)))

    def _peer_copy(self, rank: int, peer: int, size_bytes: float) -> Activity:
        """A copy-engine copy from ``rank``'s GPU to ``peer``'s, started with its mirrors (symmetry
        mode) as one activity, as :meth:`NcclEngine.start_together` merges collectives: the copy's own
        links, links several mirrors use, and links of its two GPUs that a mirror uses (the previous
        rank's copy into this one, in a TP-overlap ring)."""
        src, dst = self.placement[rank], self.placement[peer]
        # a copy engine moves less than the NVLink line rate (packet overhead): its NVLink bytes per
        # payload byte, from the measured peer-copy rate of the architecture (calibration.toml)
        nvlink_w = 1.0 / copy_engine_nvlink_efficiency(self.cluster.gpus[src].spec.architecture)

        def weight(r: Resource) -> float:
            return nvlink_w if isinstance(r.meta, tuple) and r.meta[-1] == "nvlink" else 1.0

        mirrors = self._mirrors((rank, peer), directed=True)
        links, lat = self.cluster.path(src, dst)
        weights = {r: weight(r) for r in links}
        # the copy engine reads the payload from the source's HBM and writes it into the destination's:
        # a side load on both (as NCCL's p2p, HBM_BYTES_PER_BYTE), with the mirrors' reads and writes
        # of the same two GPUs (in a ring each GPU is the source of one copy and the destination of another)
        gpus = self.cluster.gpus
        side = {gpus[src].hbm: 1.0, gpus[dst].hbm: 1.0}
        if not mirrors:
            return self.cluster.fs.start(size_bytes, weights, latency_s=lat, name=f"{src}->{dst}", side_loads=side)
        users: dict[Resource, int] = {}
        ends = {src, dst}
        for a, b in mirrors:
            for r in self.cluster.path(a, b)[0]:
                weights[r] = weights.get(r, 0.0) + weight(r)
                users[r] = users.get(r, 0) + 1
            for g in (a, b):
                if g in ends:
                    side[gpus[g].hbm] += 1.0
        own = set(links)
        keep = {r: w for r, w in weights.items() if r in own or users.get(r, 0) > 1
                or (isinstance(r.meta, tuple) and (r.meta[1] in ends or r.meta[2] in ends))}
        return self.cluster.fs.start(size_bytes, keep, latency_s=lat, name=f"{src}->{dst}", side_loads=side)

    def _deadlock_report(self, stuck: list[tuple[int, str]]) -> str:
        lines = [f"deadlock: {len(stuck)} stream(s) can never finish" if stuck else
                 "unmatched transfers: every stream finished, but sends were never received"]
        for rank, stream in stuck[:20]:
            lines.append(f"  rank {rank} stream {stream!r}: {_waiting_text(self._waiting_on.get((rank, stream), '?'))}")
        for (group, seq), rdv in list(self._rdv.items())[:10]:
            missing = [r for r in group if r not in rdv.arrived]
            lines.append(f"  {_desc(rdv.op)} #{seq} on group {group}: arrived ranks "
                         f"{sorted(rdv.arrived)}, never issued by ranks {missing}")
        for (a, b, tag), q in self._sends.items():
            if q:
                lines.append(f"  rank {a} sends to rank {b} (tag {tag!r}, {len(q)} pending) but rank {b} "
                             f"never receives")
        for (a, b, tag), q in self._recvs.items():
            if q:
                lines.append(f"  rank {b} receives from rank {a} (tag {tag!r}, {len(q)} pending) but rank "
                             f"{a} never sends")
        if len(stuck) > 20:
            lines.append(f"  ... and {len(stuck) - 20} more")
        return "\n".join(lines)


def _placed_pairs(pairs: list[tuple[int, ...]], place: Callable[[int], str], node_of: Callable[[str], int],
                  sim: set[int]) -> list[tuple[str, ...]]:
    """:meth:`Runtime._mirrors` of rank pairs: each pair's GPUs, those inside a node no simulated rank
    uses left out."""
    srcs = list(map(place, map(itemgetter(0), pairs)))
    dsts = list(map(place, map(itemgetter(1), pairs)))
    out: list[tuple[str, ...]] = list(zip(srcs, dsts, strict=True))
    same = list(map(eq, map(node_of, srcs), map(node_of, dsts)))
    if any(same):
        out = [p for p, inside in zip(out, same, strict=True) if not inside or node_of(p[0]) in sim]
    return out

def _kernel_info(op: Compute, solo_time_s: float) -> KernelInfo:
    """A kernel's event details; a macro task's with the split of the pass it stands for."""
    if op.kind == "macro" and len(op.pass_profile_s) == 4:
        return MacroInfo(op.flops, solo_time_s, *op.pass_profile_s)
    return KernelInfo(op.flops, solo_time_s)


def _waiting_text(entry: str | tuple) -> str:
    """What a stream waits on, as the deadlock report says it (the runtime keeps it unformatted)."""
    if isinstance(entry, str):
        return entry
    what, tid, x = entry[:3]
    if what == "dep":
        return f"task {tid} waits for task {x}"
    if what == "kernel":
        return f"task {tid} kernel {x.name}"
    if what == "collective":
        return f"task {tid} {_desc(x)} #{entry[3]} on group {x.group}"
    return f"task {tid} {x.direction} {x.size_bytes} B {'to' if x.direction == 'send' else 'from'} rank {x.peer}"


def _desc(op: Collective) -> str:
    label = f" '{op.name}'" if op.name else ""
    return f"{op.op}{label} of {op.size_bytes} B ({op.dtype})"
