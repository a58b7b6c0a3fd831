"""ECMP spreading of one NIC pair's traffic over the sub-flows NCCL opens between them.

A fabric switch hashes each *flow* (RoCE: the UDP source port of a queue pair; InfiniBand: the
destination LID a QP is given) onto one of its equal-cost next hops, so one flow always crosses one
spine. NCCL does not send a NIC pair's traffic as one flow: every channel of a ring or tree is its own
network connection, and each connection opens ``NCCL_IB_QPS_PER_CONNECTION`` queue pairs (default 1,
``NCCL_PARAM(IbQpsPerConn, "IB_QPS_PER_CONNECTION", 1)`` in NCCL's ``src/transport/net_ib`` sources;
at most ``NCCL_IB_MAX_QPS`` = 128) over which it sends a connection's data evenly, either each message
split across the QPs (``NCCL_IB_SPLIT_DATA_ON_QPS=1``, older releases' default) or whole messages
round-robin over them (``IB_SPLIT_DATA_ON_QPS`` 0, today's default). So the traffic between two NICs is
``channels through the NIC x QPs per connection`` equal *sub-flows*, each hashed on its own: with few
sub-flows per pair, hashes collide on a spine (the static ECMP collisions MegaScale describes,
arXiv:2402.15627 sec. 3.3); with many, the load evens out.

A route here keeps the hops every sub-flow shares as plain edges and the hops where they differ as one
:class:`Spread`: ``((edge, share), ...)``, ``share`` the fraction of the pair's sub-flows on that edge
(sub-flows on it / sub-flows), so one hop of the route stands for all of them. Summing a flow's
fraction per path element and then :func:`expanding <expand_into>` each spread into its edges gives
the per-link weights the fluid solver takes: one activity, whatever the number of sub-flows, and the
links loaded are at most the spines (not the sub-flows).
"""

from __future__ import annotations

import zlib
from collections import Counter
from collections.abc import Sequence
from itertools import chain
from typing import Any

Edge = tuple[str, str]

MAX_QPS_PER_CONNECTION = 128
"""NCCL's ``NCCL_IB_MAX_QPS``: the most queue pairs one connection may open."""

ADAPTIVE = -1
"""The ``subflows`` value that stands for adaptive routing (``[simulation] nccl_ib_adaptive_routing``):
the switches choose each packet's (or flowlet's) next hop among the equal-cost ports by their load
(InfiniBand AR, configured by the subnet manager; Spectrum-X on RoCE), not by a hash of the flow, and
NCCL marks its transfers as allowed to arrive out of order (``NCCL_IB_ADAPTIVE_ROUTING``). Modelled as
the ideal it approaches under symmetric load: every NIC pair's traffic split evenly over every
equal-cost path (:meth:`hwmodel.routing.ClosRoutes.adaptive_between`), so no hash collides."""


def spreads(subflows: int) -> bool:
    """Whether a route of ``subflows`` sub-flows may hold a :class:`Spread`: several hashed sub-flows, or
    adaptive routing (:data:`ADAPTIVE`)."""
    return subflows > 1 or subflows == ADAPTIVE


class Spread(tuple):
    """The hops of a route where its sub-flows part: ``((edge, share), ...)`` in order of first use,
    ``share`` = sub-flows crossing ``edge`` / the pair's sub-flows (the shares of one tier's hops sum to
    1). Hashable, so a route's elements can be counted as keys; :func:`expand_into` turns it into edges."""

    __slots__ = ()


RouteElement = Edge | Spread


ROCE_SOURCE_PORTS = (0xC000, 0x4000)
"""First UDP source port and count a RoCE v2 NIC gives its QPs (49152 + a 14-bit hash, the IANA dynamic
range): the field the fabric's ECMP hash varies on between the QPs of two NICs."""


def _fmix32(h: int) -> int:
    """MurmurHash3's 32-bit finaliser: every output bit depends on every input bit (CRC32's low bits are a
    linear function of the key's bits, so keys that differ alike give equal low bits)."""
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & 0xFFFFFFFF
    return h ^ (h >> 16)


def subflow_hkey(src: str, dst: str, j: int) -> str:
    """The ECMP hash key of sub-flow ``j`` of the traffic from ``src`` to ``dst`` (channel ``j // qps``,
    QP ``j % qps``): the pair's key with the sub-flow's UDP source port, a pseudo-random 14-bit port per
    sub-flow (:data:`ROCE_SOURCE_PORTS`). The router hashes it by CRC32 at each ECMP choice as any key;
    the port's bits are well mixed, so the sub-flows of a pair pick their spines independently and
    uniformly (balls into bins), which CRC32 of keys differing only in ``j`` would not."""
    first, count = ROCE_SOURCE_PORTS
    port = first + _fmix32(zlib.crc32(f"{src}|{dst}|{j}".encode())) % count
    return f"{src}|{dst}|{port}"


def combine(routes: Sequence[Sequence[Edge]]) -> tuple[RouteElement, ...]:
    """One route for ``routes``, the paths of a pair's ``k = len(routes)`` sub-flows (the same ends):
    the edges all of them cross, in the first path's order, and one :class:`Spread` of the others, at
    the place of the first path's first edge that not all share. ``routes[0]`` itself when all agree."""
    k = len(routes)
    if k == 1:
        return tuple(routes[0])
    counts = Counter(chain.from_iterable(routes))
    if all(c == k for c in counts.values()):
        return tuple(routes[0])
    out: list[RouteElement] = []
    at = -1
    for e in routes[0]:
        if counts[e] == k:
            out.append(e)
        elif at < 0:
            at = len(out)
    out.insert(at, Spread((e, c / k) for e, c in counts.items() if c != k))
    return tuple(out)


def expand_into(weights: dict, into: dict, scale: float = 1.0) -> None:
    """Add ``weights`` (path element -> weight) into ``into`` (edge -> weight) times ``scale``, each
    :class:`Spread` split over its edges by their shares."""
    for e, w in weights.items():
        if type(e) is Spread:
            for edge, share in e:
                into[edge] = into.get(edge, 0.0) + w * share * scale
        else:
            into[e] = into.get(e, 0.0) + w * scale


def subflows_per_pair(channels: int, rails: int, qps_per_connection: int) -> int:
    """Sub-flows between two NICs of a ring or tree: the channels through each NIC (``channels`` spread
    over the ``rails`` NICs the rings use, rounded up: a NIC carries whole channels) times the QPs of a
    connection. At least 1."""
    per_nic = -(-max(1, channels) // max(1, rails))
    return per_nic * max(1, qps_per_connection)


def plan_subflows(engine: Any, plan: Any) -> int:
    """Sub-flows of each NIC pair's traffic of ``plan`` on ``engine`` (an
    :class:`~hwmodel.nccl.engine.NcclEngine`): :func:`subflows_per_pair` of its channels, the rails its
    rings use (``engine.rails`` of its GPUs per node) and the engine's ``ib_qps_per_connection``; 1 for
    a send (one peer connection, the per-flow hash) and for a communicator inside one node. With the
    engine's ``ib_adaptive_routing``: :data:`ADAPTIVE` for every plan that crosses nodes, sends too."""
    adaptive = getattr(engine, "ib_adaptive_routing", False)
    if plan.algorithm == "none" or (plan.algorithm == "p2p" and not adaptive):
        return 1
    rails = engine._rails_of.get(plan.gpus)
    if rails is None:
        nodes = len(engine.nodes_of(plan.gpus))
        rails = engine._rails_of[plan.gpus] = 0 if nodes < 2 else engine.rails(len(plan.gpus) // nodes)
    if not rails:
        return 1
    return ADAPTIVE if adaptive else subflows_per_pair(plan.n_channels, rails, engine.ib_qps_per_connection)


def check_adaptive_routing(value: object, topology: Any, fidelity: str) -> bool:
    """``[simulation] nccl_ib_adaptive_routing``, checked against the cluster it routes.

    Raises:
        ValueError: not a boolean; true with a fidelity other than ``flow`` (the step and chunked
            pipelines lay each hop on one link), or on a fabric whose routes are searched, not built
            (a user's topology file: its equal-cost paths are not enumerated).
    """
    if not isinstance(value, bool):
        raise ValueError(f"[simulation] nccl_ib_adaptive_routing = {value!r}: allowed true or false "
                         "(NCCL_IB_ADAPTIVE_ROUTING: the fabric spreads each flow over every equal-cost path)")
    if value and fidelity != "flow":
        raise ValueError(f"[simulation] nccl_ib_adaptive_routing = true needs fidelity = \"flow\" (got {fidelity!r}): "
                         "the step and chunked pipelines route each hop over one link")
    if value and topology.constructed_fabric() is None and topology.nodes_of_kind("ib_switch"):
        raise ValueError("[simulation] nccl_ib_adaptive_routing = true needs a fabric built from [system] keys "
                         "(rail_optimized, fat_tree, single_switch): this cluster's routes are searched")
    return value


def check_qps_per_connection(value: object) -> int:
    """``[simulation] nccl_ib_qps_per_connection``, checked.

    Raises:
        ValueError: not an integer in 1 .. :data:`MAX_QPS_PER_CONNECTION`.
    """
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_QPS_PER_CONNECTION:
        raise ValueError(f"[simulation] nccl_ib_qps_per_connection = {value!r}: QPs per NCCL connection "
                         f"(NCCL_IB_QPS_PER_CONNECTION); allowed: an integer 1..{MAX_QPS_PER_CONNECTION}")
    return value
