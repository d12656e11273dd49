"""What a strategy hands the engine: per-rank programs of tasks on named streams.

A `Program` describes one group of identical ranks (``ranks``; empty = every rank of the
world): data-parallel replicas of one GPU model share one program, a pipeline has one per
stage, a mixed box one per kind of card. The engine simulates each program once and its spans
stand for every rank of its group.

Work a task can carry:
- `Compute`: a duration on an idle GPU, and the share of it spent in memory-bound kernels (the
  engine slows it while NCCL kernels run beside it);
- `Comm`: an NCCL collective over ``groups`` (every group that runs it at the same moment,
  e.g. the four TP pairs of an 8-GPU TP=2 job; an all-to-all's ``nbytes`` is what one rank
  sends to all its group, itself included). Programs whose ranks take part each list it
  under the same ``key``; it starts when all of them have reached it;
- `SendRecv`: one batch of NCCL point-to-point transfers (``batch_isend_irecv``); each
  `Transfer` is listed by the sending and by the receiving program under one key and moves
  once both batches have started;
- `Move`: bytes moved without NCCL kernels (copy engines, CPU threads): given flows on the
  machine's links, with their own rate caps;
- `Repeat`: the tasks from ``first`` up to the repeat, run ``times`` more times back to back
  (identical micro-steps): simulated once, replayed by the engine.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

ComputeKind = Literal["forward", "backward", "recompute", "optimizer", "other"]
CommOp = Literal["allreduce", "allgather", "reducescatter", "broadcast", "reduce", "alltoall"]
MoveKind = Literal["d2h", "h2d", "cpu_optimizer", "nvme"]


@dataclass(frozen=True)
class Compute:
    """GPU work of a known duration on an idle GPU (slowed while NCCL kernels run beside it)."""

    name: str
    kind: ComputeKind
    duration: float  # seconds on an idle GPU (no NCCL kernels beside it)
    flops: float = 0.0
    block: int | None = None
    # the share of ``duration`` its memory-bound kernels take (they slow when a collective
    # beside them takes HBM bandwidth; network.py Planned.hbm_share)
    memory_share: float = 0.0


@dataclass(frozen=True)
class Comm:
    """One NCCL collective, run by every group of ``groups`` at once."""

    name: str
    op: CommOp
    nbytes: int  # NCCL nBytes: buffer for all-reduce/broadcast, full array for AG/RS
    groups: tuple[tuple[int, ...], ...]  # every rank group running this collective at once
    args: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)
    key: str | None = None  # joins programs; None = the name and its occurrence in the program


@dataclass(frozen=True)
class Transfer:
    """One point-to-point message, sent by every ``(src, dst)`` pair at once."""

    key: str  # the same in the sender's and the receiver's SendRecv
    pairs: tuple[tuple[int, int], ...]
    nbytes: int  # per pair


@dataclass(frozen=True)
class SendRecv:
    """One batch of NCCL point-to-point transfers (``batch_isend_irecv``)."""

    name: str
    sends: tuple[Transfer, ...] = ()
    recvs: tuple[Transfer, ...] = ()
    args: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)


@dataclass(frozen=True)
class Flow:
    """``nbytes`` over links, ``usage`` bytes per byte on each, at most ``max_rate`` B/s."""

    usage: tuple[tuple[str, float], ...]
    nbytes: float
    max_rate: float = float("inf")
    latency: float = 0.0


@dataclass(frozen=True)
class Move:
    """Bytes moved without NCCL kernels (copy engines, CPU threads), as flows on links."""

    name: str
    kind: MoveKind
    flows: tuple[Flow, ...]
    args: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)


@dataclass(frozen=True)
class Repeat:
    """Run the unit (tasks ``first`` .. this one, exclusive) ``times`` more times.

    The unit must start and end with its program idle (nothing of it still running), so every
    iteration takes as long as the simulated one. Unit task names start with
    ``label.format(0)``; the replayed copies are named with ``label.format(k)``. Programs that
    repeat together (a mixed box's replicas) share the ``key`` (default: the name).
    """

    name: str
    first: int
    times: int
    label: str = ""
    key: str | None = None


Work = Compute | Comm | SendRecv | Move | Repeat


@dataclass(frozen=True)
class Task:
    """One piece of work on a named stream, started once the tasks it depends on are done."""

    id: int
    stream: str  # "compute", "nccl", "allgather", "reducescatter", "tp", "p2p", ...
    work: Work
    deps: tuple[int, ...] = ()


@dataclass
class Program:
    """The tasks of one group of identical ranks, in the order they are issued."""

    world: int  # GPUs in the job
    tasks: list[Task] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)  # strategy facts for the report (buckets)
    ranks: tuple[int, ...] = ()  # the identical ranks this program stands for; () = all

    def add(self, stream: str, work: Work, deps: tuple[int, ...] = ()) -> int:
        """Append a task; it runs after `deps` and after the previous task on its stream."""
        task = Task(len(self.tasks), stream, work, tuple(deps))
        self.tasks.append(task)
        return task.id

    @property
    def members(self) -> tuple[int, ...]:
        """The ranks this program stands for, the representative first."""
        return self.ranks or tuple(range(self.world))
