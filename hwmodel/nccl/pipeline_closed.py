"""NCCL's chunk pipeline in closed form: the flow fidelity's collective time (``fidelity = "flow"``).

:mod:`hwmodel.nccl.chunked` evaluates the max-plus recurrence of a :class:`~hwmodel.nccl.chunked.Pipeline`
item by item (the ``chunked`` fidelity, the reference). This module gives the same time from a handful
of terms, so the default fidelity keeps NCCL's pipeline (fill, per-step latency overlapped with the
transfer, FIFO credits, the last loop's smaller chunks) at O(1) cost. Notation (one channel, every
channel alike): ``H`` hops (ring steps per chunk, or chain hops), ``D`` FIFO slots, ``lat`` the per-step
latency, ``r`` the channel rate; an item of ``b`` bytes takes ``s = b / r`` on its link (plus, for NVLS
items below a full chunk, the per-step cost of :func:`hwmodel.nccl.chunked.item_time_s`; every formula
below takes each item's or slice's ``s`` from it).

**Ring** (symmetric, one link's sequence is every link's). A chunk crosses ``H`` ring steps; step
``h + 1`` of a slice can start once step ``h`` of the same slice has arrived (``+ lat``) and the link
has sent what precedes it.

* Simple (store-and-forward), a chunk sent as two slices of ``s0 >= s1`` (``s0`` the first, at least
  ``sliceSize/32``): the step start times ``T_h`` and ``U_h`` (second slice) obey
  ``T_h = max(U_{h-1} + s1, T_{h-1} + s0 + lat)``, ``U_h = max(T_h + s0, U_{h-1} + s1 + lat)``, a
  max-plus system whose cycle mean (its period per step) is ``P = max(s0 + s1, s0 + lat)`` for
  ``s0 >= s1`` (the third cycle, ``(2 s0 + s1 + lat) / 2``, never exceeds it). One slice: ``P = s + lat``.
  The next loop's first step waits for the link and for the FIFO credit of the slice ``D - m`` items
  earlier; with two slices in ``D = 4`` slots that is the same slice one step earlier, so the loops
  continue at the period ``P`` (the gap after the last step is ``Q = P``); with one slice it is three
  items back and only the link binds (``Q = s``).
* LL / LL128 (cut-through: a line is forwarded as soon as it arrives): a step follows the previous one
  after ``max(s, lat)`` (its start waits ``lat`` after the previous step's start, its end ``lat`` after
  the previous step's end); the next loop's first step needs its data locally, so only the link binds
  (``Q = s``).

A loop of chunk ``s`` therefore takes ``(H - 1) P + Q``, the last loop ``(H - 1) P' + s' + lat`` (its
last slice sent, then one latency to arrive), so

    ``T_ring = (K - 1) [(H - 1) P + Q] + (H - 1) P' + s' + lat``

for ``K`` loops, the primes the last loop's (smaller) chunk. When that chunk is again two slices
(``s0' >= s1'``), its second slice's first step also waits for the credit of the previous loop's second
slice (``U'_0 = max(T'_0 + s0', T'_0 - Q + s + lat)``), and the longest path of the two-slice system from
``(T'_0, U'_0)`` gives ``T'_{H-1} = max(T'_0 + (H - 1) P', U'_0 + s1' + (H - 2) P')``, ``U'_{H-1} =
max(T'_{H-1} + s0', U'_0 + (H - 1)(s1' + lat))`` and the end ``U'_{H-1} + s1' + lat``. A ring of one step
(two ranks' all-gather or reduce-scatter) is a one-hop pipeline of its slices (below).

**Chain** (Tree up/down, NVLS, NVLSTree, PAT, ring broadcast / reduce): ``K`` items through ``H`` hops,
each hop its own link. An item's start on the first hop waits for the link (``s`` per item) and for the
FIFO credit of the item ``D`` earlier, returned ``lat`` after the next hop forwarded it: the cycle
``S_0(i) -> E_0(i) -> S_1(i) -> E_1(i) -> S_0(i + D)`` takes ``c = 2 (s + lat)`` (Simple: the next hop
starts after the whole item arrived) or ``c = s + 2 lat`` (LL/LL128: it starts ``lat`` after the sender
started), so the longest path of ``S_0(i) = max(S_0(i-1) + s, S_0(i-D) + c)`` is
``S_0(i) = max(i s, q c + j s)`` with ``i = q D + j`` (the first ``D`` items back to back, then ``D``
per cycle, or the link's ``s`` per item, whichever is slower). The last item (``s'``) needs ``H - 1``
more hops of ``s' + lat`` (Simple) or ``lat`` (cut-through) after its first transfer, plus ``lat`` to
arrive; it cannot overtake the item before it; and at some hop ``h`` it may wait for the credit of
item ``K - 1 - D`` there (which runs ``h + 1`` hops behind its first-hop start):

    ``T_chain = max(S_0(K-1) + F(s'), S_0(K-2) + F(s) + s', S_0(K-1-D) + G)``,
    ``F(x) = (H - 1)(x + lat) + x + lat`` (Simple) or ``(H - 1) lat + x + lat`` (cut-through),
    ``G = s + lat + max_h [(h + 1)(s + lat) + (H - h)(s' + lat)]`` over ``h < H - 1`` (Simple; the
    maximum is at ``h = 0`` or ``h = H - 2``) or ``s + s' + (H + 2) lat`` (cut-through).

A one-hop pipeline's receiver consumes on arrival, so its credit comes back ``2 lat`` after the
item's end: ``S(i) = max(E(i-1), E(i-D) + 2 lat)``, the full items by the same longest path with
``c = s + 2 lat``, the last one or two (smaller) items one by one.

Both add ``base_latency_s`` (NCCL's ``baseLatencies``, paid once). Assumed, as NCCL's chunking gives:
every item but the last loop's has the same size, and a full Simple ring chunk splits into equal
slices (a 2 MiB chunk; only a last chunk below ``2 x sliceSize/32`` has a larger first slice).
``tests/hwmodel/nccl/test_pipeline_closed.py`` checks the closed form against the recurrence on random
pipelines and the flow fidelity against the chunked one on nccl-tests sweeps.

Units: bytes, seconds, bytes/s.
"""

from __future__ import annotations

from collections.abc import Callable

from hwmodel.nccl.chunked import Pipeline, PipelineTime, item_time_s

__all__ = ["closed_form_time"]


def closed_form_time(p: Pipeline) -> PipelineTime:
    """The time of pipeline ``p`` in closed form (see the module docstring); the same fields as
    :func:`hwmodel.nccl.chunked.pipeline_time`."""
    t = _ring_time(p) if p.ring else _chain_time(p)
    hop_bytes = sum(p.loop_bytes) * (p.hops if p.ring else 1)
    return PipelineTime(p.base_latency_s + t, p.base_latency_s, hop_bytes, p.channel_rate_Bps)


def _ring_step(p: Pipeline, b: float, m: int) -> tuple[float, float, float]:
    """(period per ring step, gap before the next loop, first slice's time) for a chunk of ``b`` bytes
    in ``m`` slices."""
    times = _slice_times(p, b, m)
    s = sum(times)
    lat = p.step_latency_s
    if not p.store_and_forward:
        return max(s, lat), s, s
    if m == 1:
        return s + lat, s, s
    s0 = times[0]
    period = max(s, s0 + lat)
    return period, period, s0


def _slices(p: Pipeline, b: float, m: int) -> list[float]:
    """Bytes of each slice of a ring chunk of ``b`` bytes in ``m`` slices (as ``chunked._ring_run``)."""
    if m == 1:
        return [b]
    first = min(b, max(b / m, p.min_slice_bytes))
    return [first] + [(b - first) / (m - 1)] * (m - 1)


def _slice_times(p: Pipeline, b: float, m: int) -> list[float]:
    """Seconds each slice of a ring chunk of ``b`` bytes in ``m`` slices takes on its link, per-step sync
    included (:func:`hwmodel.nccl.chunked.item_time_s`)."""
    return [item_time_s(p, x) for x in _slices(p, b, m)]


def _ring_time(p: Pipeline) -> float:
    h = p.hops
    lat = p.step_latency_s
    loops = len(p.loop_bytes)
    last_b, last_m = p.loop_bytes[-1], p.slices_per_item[-1]
    if h == 1:  # every slice is its chunk's first and last step
        tail = _slice_times(p, last_b, last_m)
        full = _slice_times(p, p.loop_bytes[0], p.slices_per_item[0])
        n = (loops - 1) * len(full) + len(tail)
        return _one_hop(tail, full[0], n, p.fifo_slots, lat)
    period, s0 = _ring_step(p, last_b, last_m)[::2]
    s_last = sum(_slice_times(p, last_b, last_m))
    if loops == 1:
        return (h - 1) * period + s_last + lat
    full_period, gap, _ = _ring_step(p, p.loop_bytes[0], p.slices_per_item[0])
    t0 = (loops - 1) * ((h - 1) * full_period + gap)  # the last loop's first slice starts
    if not (p.store_and_forward and last_m == 2 and h > 1):
        return t0 + (h - 1) * period + s_last + lat
    # Two slices after full loops of two: the second slice's first step waits for the credit of the
    # previous loop's second slice (sent by t0 - gap + full chunk, back lat later), then its own chain
    # of s1 + lat per step, or it follows the first slice (period per step).
    s1 = s_last - s0
    last_step = t0 - gap  # the previous loop's last step started
    u0 = max(t0 + s0, last_step + sum(_slice_times(p, p.loop_bytes[0], p.slices_per_item[0])) + lat)
    t_end = max(t0 + (h - 1) * period, u0 + s1 + (h - 2) * period)
    u_end = max(t_end + s0, u0 + (h - 1) * (s1 + lat))
    return u_end + s1 + lat


def _chain_time(p: Pipeline) -> float:
    lat = p.step_latency_s
    d = p.fifo_slots
    hops = p.hops
    saf = p.store_and_forward
    k = len(p.loop_bytes)
    s_last = item_time_s(p, p.loop_bytes[-1])  # (an item's time on its link, per-step sync included)
    if hops == 1:
        return _one_hop([item_time_s(p, b) for b in p.loop_bytes[-2:]], item_time_s(p, p.loop_bytes[0]), k, d, lat)

    def fill(x: float) -> float:  # first transfer to arrival at the last hop
        return (hops - 1) * ((x + lat) if saf else lat) + x + lat

    if k == 1:
        return fill(s_last)
    s = item_time_s(p, p.loop_bytes[0])
    cycle = 2 * (s + lat) if saf else s + 2 * lat
    start = _first_hop_starts(s, cycle, d)
    t = max(start(k - 1) + fill(s_last), start(k - 2) + fill(s) + s_last)
    if k - 1 >= d:  # the last item waits at some hop for the credit of the item D before it
        if saf:
            t = max(t, start(k - 1 - d) + s + lat + max((hops - 1) * (s + lat) + 2 * (s_last + lat),
                                                        (s + lat) + hops * (s_last + lat)))
        else:
            t = max(t, start(k - 1 - d) + s + s_last + (hops + 2) * lat)
    return t


def _first_hop_starts(s: float, cycle: float, d: int) -> Callable[[int], float]:
    """``i -> S_0(i)``: items of ``s`` back to back, at most ``d`` of them per credit ``cycle``: the
    longest path of ``S_0(i) = max(S_0(i-1) + s, S_0(i-d) + cycle)``, ``max(i s, q cycle + j s)`` for
    ``i = q d + j``."""
    def start(i: int) -> float:
        q, j = divmod(i, d)
        return max(i * s, q * cycle + j * s)
    return start


def _one_hop(tail_s: list[float], s: float, k: int, d: int, lat: float) -> float:
    """A one-hop pipeline (a chain of one hop, or a ring of one step: 2 ranks' all-gather and
    reduce-scatter) of ``k`` items of ``s`` seconds but the last ``len(tail_s)``: each item follows the
    previous on the link and the credit of the item ``d`` before it, returned ``lat`` after its arrival
    (``S(i) = max(E(i-1), E(i-d) + 2 lat)``, the receiver consumes on arrival); the full items by
    :func:`_first_hop_starts`, the tail one by one."""
    start = _first_hop_starts(s, s + 2 * lat, d)
    n_full = k - len(tail_s)
    ends: dict[int, float] = {}

    def end(i: int) -> float:
        return ends[i] if i >= n_full else start(i) + s

    for j, x in enumerate(tail_s):
        i = n_full + j
        t = end(i - 1) if i else 0.0
        if i >= d:
            t = max(t, end(i - d) + 2 * lat)
        ends[i] = t + x
    return ends[k - 1] + lat
