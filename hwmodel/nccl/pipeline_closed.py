"""NCCL's chunk pipeline in closed form: the flow fidelity's collective time (``fidelity = "flow"``).

:mod:`hwmodel.nccl.chunked` evaluates the max-plus recurrence of a :class:`~hwmodel.nccl.chunked.Pipeline`
item by item (the ``chunked`` fidelity, the reference). This module gives the same time from a handful
of terms, so the default fidelity keeps NCCL's pipeline (fill, per-step latency overlapped with the
transfer, FIFO credits, the last loop's smaller chunks) at O(1) cost. Notation (one channel, every
channel alike): ``H`` hops (ring steps per chunk, or chain hops), ``D`` FIFO slots, ``lat`` the per-step
latency, ``r`` the channel rate; an item of ``b`` bytes takes ``s = b / r`` on its link.

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

for ``K`` loops, the primes the last loop's (smaller) chunk.

**Chain** (Tree up/down, NVLS, NVLSTree, PAT, ring broadcast / reduce): ``K`` items through ``H`` hops,
each hop its own link. An item's start on the first hop waits for the link (``s`` per item) and for the
FIFO credit of the item ``D`` earlier, returned ``lat`` after the next hop forwarded it: the cycle
``S_0(i) -> E_0(i) -> S_1(i) -> E_1(i) -> S_0(i + D)`` takes ``2 (s + lat)`` (Simple: the next hop starts
after the whole item arrived) or ``s + 2 lat`` (LL/LL128: it starts ``lat`` after the sender started;
also for a one-hop chain, whose receiver consumes on arrival), so items leave at the period
``P = max(s, c / D)`` with ``c`` that cycle, and the first ``D`` go back to back:
``S_0(i) = max(i s, q c + j s)`` with ``i = q D + j``. The last item then needs ``H - 1`` hops of
``s' + lat`` (Simple) or ``lat`` (cut-through) after its first transfer ``s'``, plus ``lat`` to arrive,
and it cannot overtake the item before it at the last hop:

    ``T_chain = max(S_0(K-1) + F(s'), S_0(K-2) + F(s) + s')``,  ``F(x) = (H - 1)(x + lat) + x + lat``
    (Simple) or ``(H - 1) lat + x + lat`` (cut-through).

Both add ``base_latency_s`` (NCCL's ``baseLatencies``, paid once). What the closed forms leave out: the
transients between a full loop and the smaller last one, and FIFO credits of a cut-through ring with
fewer hops than slots (they bind only when ``lat`` is several times ``s`` over many loops, which
NCCL's protocol choice avoids). ``tests/hwmodel/nccl/test_pipeline_closed.py`` bounds the difference
from the recurrence on every pipeline of the nccl-tests sweeps of the test cases.

Units: bytes, seconds, bytes/s.
"""

from __future__ import annotations

from hwmodel.nccl.chunked import Pipeline, PipelineTime

__all__ = ["closed_form_time"]


def closed_form_time(p: Pipeline) -> PipelineTime:
    """The time of pipeline ``p`` in closed form (see the module docstring); the same fields as
    :func:`hwmodel.nccl.chunked.pipeline_time`."""
    t = _ring_time(p) if p.ring else _chain_time(p)
    hop_bytes = sum(p.loop_bytes) * (p.hops if p.ring else 1)
    return PipelineTime(p.base_latency_s + t, p.base_latency_s, hop_bytes, p.channel_rate_Bps)


def _ring_step(p: Pipeline, b: float, m: int) -> tuple[float, float]:
    """(period per ring step, gap before the next loop) for a chunk of ``b`` bytes in ``m`` slices."""
    s = b / p.channel_rate_Bps
    lat = p.step_latency_s
    if not p.store_and_forward:
        return max(s, lat), s
    if m == 1:
        return s + lat, s
    s0 = min(b, max(b / m, p.min_slice_bytes)) / p.channel_rate_Bps
    period = max(s, s0 + lat)
    return period, period


def _ring_time(p: Pipeline) -> float:
    h = p.hops
    loops = len(p.loop_bytes)
    last_b, last_m = p.loop_bytes[-1], p.slices_per_item[-1]
    last_period, _ = _ring_step(p, last_b, last_m)
    t = (h - 1) * last_period + last_b / p.channel_rate_Bps + p.step_latency_s
    if loops > 1:
        period, gap = _ring_step(p, p.loop_bytes[0], p.slices_per_item[0])
        t += (loops - 1) * ((h - 1) * period + gap)
    return t


def _chain_time(p: Pipeline) -> float:
    lat = p.step_latency_s
    rate = p.channel_rate_Bps
    d = p.fifo_slots
    hops = p.hops
    saf = p.store_and_forward

    def fill(x: float) -> float:  # first transfer to arrival at the last hop
        return (hops - 1) * ((x + lat) if saf else lat) + x + lat

    k = len(p.loop_bytes)
    s_last = p.loop_bytes[-1] / rate
    if k == 1:
        return fill(s_last)
    s = p.loop_bytes[0] / rate
    cycle = 2 * (s + lat) if saf and hops > 1 else s + 2 * lat

    def start(i: int) -> float:  # first hop's start of item i (all items before it full)
        q, j = divmod(i, d)
        return max(i * s, q * cycle + j * s)

    return max(start(k - 1) + fill(s_last), start(k - 2) + fill(s) + s_last)
