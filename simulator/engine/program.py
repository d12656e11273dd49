"""What a strategy hands the engine: tasks on named streams, with dependencies.

All data-parallel ranks run the same program, so one program describes every GPU. A
collective lists every group that runs it at the same moment (e.g. the four TP pairs of an
8-GPU TP=2 job), so the engine puts all of their traffic on the shared fabric at once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

ComputeKind = Literal["forward", "backward", "recompute", "optimizer", "other"]
CommOp = Literal["allreduce", "allgather", "reducescatter", "broadcast"]


@dataclass(frozen=True)
class Compute:
    name: str
    kind: ComputeKind
    duration: float  # seconds on an idle GPU (no NCCL kernels beside it)
    flops: float = 0.0
    block: int | None = None


@dataclass(frozen=True)
class Comm:
    name: str
    op: CommOp
    nbytes: int  # NCCL nBytes: buffer for all-reduce/broadcast, full array for AG/RS
    groups: tuple[tuple[int, ...], ...]  # every rank group running this collective at once
    args: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)


@dataclass(frozen=True)
class Task:
    id: int
    stream: str  # "compute", "nccl", "allgather", "reducescatter", "tp", ...
    work: Compute | Comm
    deps: tuple[int, ...] = ()


@dataclass
class Program:
    world: int  # GPUs in the job
    tasks: list[Task] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)  # strategy facts for the report (buckets)

    def add(self, stream: str, work: Compute | Comm, deps: tuple[int, ...] = ()) -> int:
        """Append a task; it runs after `deps` and after the previous task on its stream."""
        task = Task(len(self.tasks), stream, work, tuple(deps))
        self.tasks.append(task)
        return task.id
