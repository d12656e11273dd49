"""Pieces every strategy's program is made of: compute tasks for a job's ops, DP groups.

Inside: turning ``Job`` ops into ``Compute`` work (durations from simulator/job/compute.py),
adding a phase's ops to the compute stream, the gradient-ready order of backward, and the
memory-bound copies data-parallel wrappers add. Assumes the job's ops are one GPU's share
(strategies that split a layer, like tensor parallelism, pass their own op list).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TypeVar

from simulator.catalog.gpus import GPU
from simulator.engine.program import Compute, ComputeKind, Program, Repeat
from simulator.job import compute
from simulator.job.kernels import Kernel
from simulator.job.ops import Op
from simulator.job.workload import Job

_KIND: dict[str, ComputeKind] = {"forward": "forward", "backward": "backward",
                                 "recompute": "recompute", "optimizer": "optimizer"}


def as_compute(op: Op, gpu: GPU, *, scale: float = 1.0, prefix: str = "") -> Compute:
    """One op as compute work; ``scale`` shrinks it (e.g. an optimizer over a 1/N shard)."""
    seconds, memory = _op_time(op, gpu, _works(gpu))
    return Compute(prefix + op.name, _KIND.get(op.phase, "other"), seconds * scale,
                   op.flops * scale, op.block, _share(memory, seconds))


def memory_pass(name: str, nbytes: float, gpu: GPU, block: int | None = None,
                kernels: int = 1) -> Compute:
    """Memory-bound work that moves ``nbytes`` through HBM (copies, scaling) in ``kernels``
    launches (one per tensor where a framework loops over tensors)."""
    launches = max(0, kernels - 1) * compute.LAUNCH_OVERHEAD / gpu.rate_scale
    return Compute(name, "other", compute.memory_time(nbytes, gpu) + launches, 0.0, block,
                   memory_share=1.0 if nbytes > 0 else 0.0)


def _share(memory: float, seconds: float) -> float:
    return min(1.0, memory / seconds) if seconds > 0 else 0.0


# Adds one op to a program after `deps` and returns the task the next op must wait for (the
# op itself, or a collective that follows it on the critical path, as in tensor parallelism).
Emit = Callable[[Program, Op, tuple[int, ...], str], int]


# card -> kernel tuple id -> (an op's kernels, kept alive so the id stays their own; their
# seconds). An op's time is its kernels' and the card holds every other input of it
# (rate_scale for ranges, the power limit, calibration's achieved_fraction; the kernel regime
# is in the kernels); a job builds its ops once (Job.ops) and every block but the first shares
# the first's kernel tuples (ops.build), so the programs of a sweep, comparison or range, and
# the blocks of a step, time each op once per card.
# Forgotten past _MAX_TIMED entries in all, so a long-lived process stays bounded.
Kernels = tuple[Kernel, ...]
_TIMED: dict[GPU, dict[int, tuple[Kernels, float, float]]] = {}
# card at neutral rates -> kernel tuple id -> (the kernels; their times before the achieved-
# rate factor): a card at other rates (a range's re-run, a calibrated fraction) divides them by
# its factor, kernel by kernel as compute.op_time does, so the seconds are the same floats
# (a negative work time marks a memory-bound kernel: its time is its memory traffic's)
Works = dict[int, tuple[Kernels, tuple[float, ...]]]
_WORK: dict[GPU, Works] = {}
_WORK_OF: dict[GPU, Works] = {}  # any card -> _WORK's
# card at neutral rates -> kernel id -> (the kernel; its work time, negative when memory
# bound): tuples that differ share kernels too (the first block's with the others', a TP
# shard splits each kernel once)
_KERNEL_WORK: dict[GPU, dict[int, tuple[Kernel, float]]] = {}
_KERNEL_WORK_OF: dict[GPU, dict[int, tuple[Kernel, float]]] = {}  # any card -> its own
_MAX_TIMED = 50_000
V = TypeVar("V")


def forget_op_times() -> None:
    """Drop every remembered op time (api.clear_caches)."""
    _TIMED.clear()
    _WORK.clear()
    _WORK_OF.clear()
    _KERNEL_WORK.clear()
    _KERNEL_WORK_OF.clear()


def _at_neutral(gpu: GPU, tables: dict[GPU, V], of: dict[GPU, V], empty: V) -> V:
    """``tables``' entry for ``gpu`` at neutral rates (every card at other rates shares it),
    looked up once per card through ``of``."""
    table = of.get(gpu)
    if table is None:
        neutral = replace(gpu, rate_scale=1.0, achieved_fraction=1.0)
        table = of[gpu] = tables.setdefault(neutral, empty)
    return table


def _works(gpu: GPU) -> Works:
    """The kernel work times of ``gpu`` at neutral rates (_WORK), looked up once per card."""
    return _at_neutral(gpu, _WORK, _WORK_OF, {})


def _kernel_works(gpu: GPU) -> dict[int, tuple[Kernel, float]]:
    """The kernel work times of ``gpu`` at neutral rates (_KERNEL_WORK)."""
    return _at_neutral(gpu, _KERNEL_WORK, _KERNEL_WORK_OF, {})


def _kernel_work(k: Kernel, gpu: GPU, kernels: dict[int, tuple[Kernel, float]]) -> float:
    hit = kernels.get(id(k))
    if hit is None or hit[0] is not k:
        work = compute.kernel_work_time(k, gpu)
        hit = kernels[id(k)] = (k, -work if compute.memory_bound(k, gpu, work) else work)
    return hit[1]


def _op_time(op: Op, gpu: GPU, works: Works) -> tuple[float, float]:
    """``compute.op_time``, from the kernels' work times ``works`` holds for the card, and
    the seconds of it its memory-bound kernels take."""
    ks = op.kernels
    hit = works.get(id(ks))
    if hit is None or hit[0] is not ks:
        kernels = _kernel_works(gpu)
        hit = works[id(ks)] = (ks, tuple(_kernel_work(k, gpu, kernels) for k in ks))
    factor = compute.achieved(gpu)
    return (sum(abs(w) / factor for w in hit[1]),
            sum(-w / factor for w in hit[1] if w < 0))


def op_seconds(op: Op, gpu: GPU) -> float:
    """``compute.op_time`` (the same float), from the kernel times kept per card."""
    return _op_time(op, gpu, _works(gpu))[0]


def compute_only(gpu: GPU) -> Emit:
    """The plain emitter: the op on the compute stream (each op timed once per card: micro-
    steps, pipeline micro-batches and other programs of the same job repeat the same ops)."""
    if sum(len(times) for times in _TIMED.values()) > _MAX_TIMED:
        forget_op_times()
    timed = _TIMED.setdefault(gpu, {})
    works = _works(gpu)

    def emit(program: Program, op: Op, deps: tuple[int, ...], prefix: str) -> int:
        hit = timed.get(id(op.kernels))
        if hit is None or hit[0] is not op.kernels:
            hit = timed[id(op.kernels)] = (op.kernels, *_op_time(op, gpu, works))
        work = Compute(prefix + op.name, _KIND.get(op.phase, "other"), hit[1], op.flops,
                       op.block, _share(hit[2], hit[1]))
        return program.add("compute", work, deps)
    return emit


def add_ops(program: Program, ops: Sequence[Op], emit: Emit, *, after: Sequence[int] = (),
            prefix: str = "") -> list[int]:
    """Append ops in order, each after the previous one; returns what each op ends with."""
    ids: list[int] = []
    for op in ops:
        deps = tuple(after) if not ids else (ids[-1],)
        ids.append(emit(program, op, deps, prefix))
    return ids


def trainable_indices(job: Job) -> list[int]:
    """Indices into ``job.params`` of the tensors a DP wrapper reduces (requires_grad)."""
    return [i for i, p in enumerate(job.params) if p.trainable]


def ready_order(backward: Sequence[Op]) -> list[int]:
    """``job.params`` indices in the order backward completes their gradients."""
    return [i for op in backward if op.phase == "backward" for i in op.grads]


def dp_groups(world: int, tp: int) -> tuple[tuple[int, ...], ...]:
    """Data-parallel groups when consecutive ranks form TP groups: ranks equal mod tp."""
    return tuple(tuple(range(r, world, tp)) for r in range(tp))


def tp_groups(world: int, tp: int) -> tuple[tuple[int, ...], ...]:
    """Tensor-parallel groups: blocks of ``tp`` consecutive ranks."""
    return tuple(tuple(range(s, s + tp)) for s in range(0, world, tp))


def repeat_unit(program: Program, first: int, times: int, label: str = "micro{}.") -> int:
    """Mark the tasks from ``first`` to the end as a unit run ``times`` more times (identical
    micro-steps); returns the task the next work waits for. ``times`` 0 adds nothing."""
    last = program.tasks[-1].id
    if times < 1:
        return last
    ends: dict[str, int] = {}
    for task in program.tasks[first:]:
        ends[task.stream] = task.id
    name = f"{label.format(1).rstrip('.')}..{label.format(times).rstrip('.')} (replayed)"
    return program.add("compute", Repeat(name, first, times, label), tuple(sorted(ends.values())))
