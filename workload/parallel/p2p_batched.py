"""Pipeline exchanges as Megatron-LM ran them before p2p overlap: batched, then synchronised.

``[parallel] overlap_p2p_comm = false`` (Megatron-LM's ``--no-overlap-p2p-communication``; Megatron-Core
``overlap_p2p_comm = False`` with its defaults ``batch_p2p_comm = True``, ``batch_p2p_sync = True``).
Megatron-LM up to 2023 had no other mode: ``megatron/p2p_communication.py:_communicate`` (commit
285068c8, January 2023, the baseline of MegaScale's Table 2) posts a step's sends and receives as one
``torch.distributed.batch_isend_irecv``, waits on every request, then calls ``torch.cuda.synchronize()``.
So, unlike the overlapped sends of the default builder loop:

* the pass after an exchange starts only once every transfer of it has finished, sends included (a
  send finishes when its peer has posted the matching receive, in the peer's own exchange);
* in 1F1B's steady state a forward's output leaves only with the next exchange: interleaved, after the
  backward that follows it (``send_forward_backward_recv_forward_backward``); non-interleaved, before
  it (``send_forward_recv_backward``), the input gradient after it (``send_backward_recv_forward``).

:func:`megatron_exchanges` is the stage's sequence of passes and exchanges, ported line by line from
``forward_backward_pipelining_with_interleaving`` / ``..._without_interleaving`` of that commit (their
``recv_prev`` / ``recv_next`` flags), so sends and receives pair up between neighbours exactly as there;
:func:`emit` adds it to a rank's program. An exchange with nothing to move is dropped (its synchronise
drains the GPU's queue; the host's relaunch after it, microseconds, is not modelled).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from hwmodel.ir import SendRecv
from workload.parallel.schedules import Step, schedule

if TYPE_CHECKING:  # annotation only
    from workload.parallel.builder import RankBuilder


@dataclass(frozen=True, slots=True)
class Exchange:
    """One ``_communicate`` call: which of the four transfers it posts."""

    send_next: bool = False
    """The forward output to the next stage (tag ``fwd``)."""
    send_prev: bool = False
    """The input gradient to the previous stage (tag ``bwd``)."""
    recv_prev: bool = False
    """A forward input from the previous stage."""
    recv_next: bool = False
    """An output gradient from the next stage."""

    def __bool__(self) -> bool:
        return self.send_next or self.send_prev or self.recv_prev or self.recv_next


Item = tuple[str, int] | Exchange
"""``("F", k)`` / ``("B", k)``: the k-th forward / backward of the stage's schedule (virtual micro-batch
ids, :mod:`workload.parallel.schedules`), or an :class:`Exchange`."""


def megatron_exchanges(schedule: str, p: int, stage: int, m: int, v: int = 1) -> list[Item]:
    """The passes and exchanges of ``stage`` of ``p`` for ``m`` micro-batches, as Megatron-LM orders them
    (``1f1b``, or ``interleaved_1f1b`` with ``v`` chunks). Empty exchanges are left out.

    Raises:
        ValueError: another schedule (Megatron has no batched exchanges for GPipe here), or ``m`` not a
            multiple of ``p`` for the interleaved schedule.
    """
    if schedule == "1f1b":
        items = _one_f_one_b(p, stage, m)
    elif schedule == "interleaved_1f1b":
        if m % p:
            raise ValueError(f"interleaved 1F1B needs micro-batches ({m}) to be a multiple of pipeline stages ({p})")
        items = _interleaved(p, stage, m, v)
    else:
        raise ValueError(f"overlap_p2p_comm = false: Megatron's batched exchanges exist for pipeline_schedule "
                         f"1f1b and interleaved_1f1b, not {schedule!r}")
    return [it for it in items if not isinstance(it, Exchange) or it]


def _one_f_one_b(p: int, s: int, m: int) -> list[Item]:
    """``forward_backward_pipelining_without_interleaving``: ``recv_forward`` / ``send_forward`` around each
    warm-up forward, ``send_forward_recv_backward`` and ``send_backward_recv_forward`` in the steady
    state, ``recv_backward`` / ``send_backward`` around each cool-down backward."""
    first, last = s == 0, s == p - 1
    warmup = min(p - s - 1, m)
    remaining = m - warmup
    out: list[Item] = []
    for i in range(warmup):
        out += [Exchange(recv_prev=not first), ("F", i), Exchange(send_next=not last)]
    if remaining:
        out.append(Exchange(recv_prev=not first))
    for i in range(remaining):
        out += [("F", warmup + i), Exchange(send_next=not last, recv_next=not last), ("B", i)]
        out.append(Exchange(send_prev=not first, recv_prev=not first and i < remaining - 1))
    for i in range(remaining, m):
        out += [Exchange(recv_next=not last), ("B", i), Exchange(send_prev=not first)]
    return out


def _interleaved(p: int, s: int, m: int, v: int) -> list[Item]:
    """``forward_backward_pipelining_with_interleaving`` with its ``recv_prev`` / ``recv_next`` rules (the
    first stage receives its later chunks' inputs from the last stage, which sends them in the same
    step, and vice versa for gradients)."""
    first, last = s == 0, s == p - 1
    total = m * v
    all_warmup = m == p
    warmup = total if all_warmup else min((p - s - 1) * 2 + (v - 1) * p, total)
    remaining = total - warmup

    def chunk(k: int, forward: bool) -> int:
        c = (k % (p * v)) // p
        return c if forward else v - 1 - c

    def sends(k_fwd: int | None, k_bwd: int | None) -> dict[str, bool]:
        return {"send_next": k_fwd is not None and not (last and chunk(k_fwd, True) == v - 1),
                "send_prev": k_bwd is not None and not (first and chunk(k_bwd, False) == 0)}

    out: list[Item] = [Exchange(recv_prev=not first)]  # recv_forward for chunk 0
    for k in range(warmup):
        recv_prev = not (first and chunk(k + 1, True) == 0) and k != total - 1
        recv_next = k == warmup - 1 and not all_warmup and not last
        out += [("F", k), Exchange(**sends(k, None), recv_prev=recv_prev, recv_next=recv_next)]
    for k in range(remaining):
        fk = k + warmup
        recv_prev = not (first and chunk(fk - (p - 1), True) == v - 1) and k != remaining - 1
        recv_next = not (last and chunk(k - (p - 1), False) == 0)
        out += [("F", fk), ("B", k), Exchange(**sends(fk, k), recv_prev=recv_prev, recv_next=recv_next)]
    if all_warmup:
        out.append(Exchange(recv_next=not last))  # recv_backward before the cool-down
    for k in range(remaining, total):
        recv_next = not (last and chunk(k + 1, False) == v - 1) and k != total - 1
        out += [("B", k), Exchange(**sends(None, k), recv_next=recv_next)]
    return out


def emit(b: RankBuilder, p: int, v: int, m: int) -> None:
    """Add stage ``b``'s passes (``b.forward`` / ``b.backward``) and Megatron's exchanges to its program:
    each exchange's transfers are posted after the last compute task, and the next pass waits for all of
    them (the batch's ``req.wait()`` and ``torch.cuda.synchronize()``)."""
    s = b.c["pp"]
    steps = schedule(b.cfg.schedule, p, m, s, v)
    fwd = [st for st in steps if st.kind == "F"]
    bwd = [st for st in steps if st.kind == "B"]
    last_b = {st.chunk: i for i, st in enumerate(bwd)}  # a chunk's last backward completes its gradients
    pending: list[int] = []
    for it in megatron_exchanges(b.cfg.schedule, p, s, m, v):
        if isinstance(it, Exchange):
            pending = _post(b, it)
            continue
        kind, k = it
        st: Step = fwd[k] if kind == "F" else bwd[k]
        vs = st.chunk * p + s
        first_v, last_v = vs == 0, vs == p * v - 1
        if kind == "F":
            b.forward(st.microbatch, st.chunk, first_v, last_v, pending)
        else:
            b.backward(st.microbatch, st.chunk, first_v, last_v, pending, last_mb=k == last_b[st.chunk])
        pending = []


def _post(b: RankBuilder, x: Exchange) -> list[int]:
    """The exchange's transfers, after the last compute task; returns what the next pass waits for (a
    received slice's TP all-gather, without sequence parallelism, is on the compute stream already)."""
    after = (b.last_compute,)
    out = []
    if x.send_prev:
        out.append(b.add(SendRecv("send", b.prev_rank, b.act_bytes, name="pp_grad", tag="bwd"), "pp_bwd_send", after))
    if x.recv_prev:
        rid = b.add(SendRecv("recv", b.prev_rank, b.act_bytes, name="pp_act", tag="fwd"), "pp_fwd_recv", after)
        out += b.gather_received([rid])
    if x.send_next:
        out.append(b.add(SendRecv("send", b.next_rank, b.act_bytes, name="pp_act", tag="fwd"), "pp_fwd_send", after))
    if x.recv_next:
        rid = b.add(SendRecv("recv", b.next_rank, b.act_bytes, name="pp_grad", tag="bwd"), "pp_bwd_recv", after)
        out += b.gather_received([rid])
    return out
