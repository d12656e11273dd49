"""Pipeline schedules: the order in which each stage runs its forwards, backwards and sends.

``stage_steps(schedule, p, m, v)`` gives, for every pipeline rank, the list of `Work` (a forward
or backward of one micro-batch on one model chunk) and `Call` (one batch of point-to-point
sends and receives) in issue order, as the frameworks run them:

- ``1f1b``: Megatron-LM ``forward_backward_pipelining_without_interleaving``
  (megatron/core/pipeline_parallel/schedules.py): rank r runs ``min(p - r - 1, m)`` warm-up
  forwards, then alternates one forward and one backward, then drains; each p2p call blocks
  the compute stream (``send_forward_recv_backward`` and friends wait on their requests).
- ``interleaved``: Megatron's ``forward_backward_pipelining_with_interleaving`` with v model
  chunks per rank: warm-up ``(p - r - 1) * 2 + (v - 1) * p`` virtual micro-batches (all of
  them when m == p), model chunk of virtual micro-batch k ``(k % (p v)) // p`` (reversed for
  backward), one combined ``send_forward_backward_recv_forward_backward`` per steady step.
- ``gpipe``: torch.distributed.pipelining ``ScheduleGPipe``: every forward (receive waited,
  send left in flight), the sends waited, then every backward in micro-batch order.

Messages are named by what they carry: ``("act", i, s)`` is micro-batch i's output of virtual
stage s (chunk c of rank r is virtual stage ``c * p + r``), sent to stage s + 1;
``("grad", i, s)`` is the input gradient of virtual stage s, sent to s - 1. A receive takes the
next message its peer sends in that direction (NCCL matches point-to-point calls in order).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from simulator.errors import InputError, quoted

SCHEDULES = ("gpipe", "1f1b", "interleaved")
Message = tuple[str, int, int]  # ("act" | "grad", micro-batch, producing virtual stage)


@dataclass(frozen=True)
class Work:
    kind: str  # "F" | "B"
    micro: int
    chunk: int


@dataclass(frozen=True)
class Call:
    """One batch of p2p operations; ``recvs`` count how many messages come from each peer."""

    sends: tuple[Message, ...] = ()
    recv_act: bool = False  # the next activation from the previous virtual stage
    recv_grad: bool = False  # the next gradient from the following virtual stage
    waited: bool = True  # the compute stream waits for it (false: an isend left in flight)


Step = Work | Call


def bubble_closed_form(p: int, m: int, v: int = 1) -> float:
    """Idle share of the pipeline phase with equal stages and free communication: GPipe and
    1F1B (p-1)/(m+p-1); interleaved divides the bubble time by v (Narayanan et al. 2021,
    arXiv:2104.04473, section 2.2)."""
    bubble = (p - 1) / v
    return bubble / (m + bubble)


def check(schedule: str, p: int, m: int, v: int) -> None:
    if schedule not in SCHEDULES:
        raise InputError(f"--schedule {quoted(schedule)}: choose from {', '.join(SCHEDULES)}")
    if v < 1 or (v > 1 and schedule != "interleaved"):
        raise InputError(f"--virtual-stages {v}: only the interleaved schedule runs several "
                         "model chunks per stage")
    if schedule == "interleaved" and v < 2:
        raise InputError("--schedule interleaved needs --virtual-stages of at least 2 "
                         "(Megatron's --num-layers-per-virtual-pipeline-stage)")
    if schedule == "interleaved" and m % p:
        raise InputError(f"--schedule interleaved: {m} micro-batches (--grad-accum) must be a "
                         f"multiple of the {p} stages, as Megatron-LM requires")


def _sends(work: Work, rank: int, p: int, v: int) -> tuple[Message, ...]:
    s = work.chunk * p + rank
    if work.kind == "F":
        return () if s == p * v - 1 else (("act", work.micro, s),)
    return () if s == 0 else (("grad", work.micro, s),)


def _one_f_one_b(rank: int, p: int, m: int) -> list[Step]:
    first, last = rank == 0, rank == p - 1
    warmup = min(p - rank - 1, m)
    out: list[Step] = []

    def f(i: int) -> Work:
        return Work("F", i, 0)

    for i in range(warmup):
        if not first:
            out.append(Call(recv_act=True))  # recv_forward
        out += [f(i)]
        if not last:
            out.append(Call(sends=_sends(f(i), rank, p, 1)))  # send_forward
    remaining = m - warmup
    if remaining and not first:
        out.append(Call(recv_act=True))
    for k in range(remaining):
        i, j = warmup + k, k
        out.append(f(i))
        if not last:  # send_forward_recv_backward
            out.append(Call(sends=_sends(f(i), rank, p, 1), recv_grad=True))
        out.append(Work("B", j, 0))
        if not first:  # send_backward(_recv_forward)
            out.append(Call(sends=_sends(Work("B", j, 0), rank, p, 1),
                            recv_act=k < remaining - 1))
    for j in range(remaining, m):
        if not last:
            out.append(Call(recv_grad=True))  # recv_backward
        out.append(Work("B", j, 0))
        if not first:
            out.append(Call(sends=_sends(Work("B", j, 0), rank, p, 1)))  # send_backward
    return out


def _interleaved(rank: int, p: int, m: int, v: int) -> list[Step]:
    total = m * v
    first, last = rank == 0, rank == p - 1
    if m == p:  # Megatron: all forwards first when there are as many micro-batches as stages
        warmup, all_warmup = total, True
    else:
        warmup, all_warmup = min((p - rank - 1) * 2 + (v - 1) * p, total), False

    def chunk(k: int, forward: bool) -> int:
        c = (k % (p * v)) // p
        return c if forward else v - 1 - c

    def micro(k: int) -> int:
        return (k // (p * v)) * p + k % p

    def fwd(k: int) -> Work:
        return Work("F", micro(k), chunk(k, True))

    def bwd(k: int) -> Work:
        return Work("B", micro(k), chunk(k, False))

    out: list[Step] = []
    if not first:
        out.append(Call(recv_act=True))  # the first chunk's input
    for k in range(warmup):
        out.append(fwd(k))
        recv_act = not (first and chunk(k + 1, True) == 0) and k != total - 1
        if k == warmup - 1 and not all_warmup:
            out.append(Call(sends=_sends(fwd(k), rank, p, v), recv_act=recv_act,
                            recv_grad=not last))
        else:
            out.append(Call(sends=_sends(fwd(k), rank, p, v), recv_act=recv_act))
    remaining = total - warmup
    for k in range(remaining):
        fk, bk = k + warmup, k
        out += [fwd(fk), bwd(bk)]
        recv_act = not (first and chunk(fk - (p - 1), True) == v - 1)
        recv_grad = not (last and chunk(bk - (p - 1), False) == 0)
        if k == remaining - 1:
            recv_act = False
        out.append(Call(sends=_sends(fwd(fk), rank, p, v) + _sends(bwd(bk), rank, p, v),
                        recv_act=recv_act, recv_grad=recv_grad))
    if all_warmup and not last:
        out.append(Call(recv_grad=True))
    for k in range(remaining, total):
        out.append(bwd(k))
        recv_grad = not (last and chunk(k + 1, False) == v - 1) and k != total - 1
        out.append(Call(sends=_sends(bwd(k), rank, p, v), recv_grad=recv_grad))
    return out


def _gpipe(rank: int, p: int, m: int) -> list[Step]:
    first, last = rank == 0, rank == p - 1
    out: list[Step] = []
    for i in range(m):
        if not first:
            out.append(Call(recv_act=True))
        out.append(Work("F", i, 0))
        if not last:
            out.append(Call(sends=_sends(Work("F", i, 0), rank, p, 1), waited=False))
    for i in range(m):
        if not last:
            out.append(Call(recv_grad=True))
        out.append(Work("B", i, 0))
        if not first:
            out.append(Call(sends=_sends(Work("B", i, 0), rank, p, 1), waited=False))
    return out


def stage_steps(schedule: str, p: int, m: int, v: int = 1) -> list[list[Step]]:
    """Every rank's steps; see the module docstring."""
    check(schedule, p, m, v)
    if schedule == "1f1b":
        return [_one_f_one_b(r, p, m) for r in range(p)]
    if schedule == "interleaved":
        return [_interleaved(r, p, m, v) for r in range(p)]
    return [_gpipe(r, p, m) for r in range(p)]


def received(steps: list[list[Step]], p: int) -> list[list[list[Message]]]:
    """For each rank and each of its calls, the messages it receives, matched in order with
    what its peers send (activations from rank r - 1, gradients from rank r + 1, mod p)."""
    queues: dict[tuple[str, int], deque[Message]] = {}
    for rank, rank_steps in enumerate(steps):
        for step in rank_steps:
            if isinstance(step, Call):
                for message in step.sends:
                    dst = (rank + 1) % p if message[0] == "act" else (rank - 1) % p
                    queues.setdefault((message[0], dst), deque()).append(message)
    out: list[list[list[Message]]] = []
    for rank, rank_steps in enumerate(steps):
        calls: list[list[Message]] = []
        for step in rank_steps:
            if isinstance(step, Call):
                got = [queues[(kind, rank)].popleft()
                       for kind, wanted in (("act", step.recv_act), ("grad", step.recv_grad))
                       if wanted]
                calls.append(got)
        out.append(calls)
    leftover = [key for key, q in queues.items() if q]
    if leftover:
        raise AssertionError(f"schedule sends messages nobody receives: {leftover}")
    return out
