"""DeepSpeed ZeRO stages 1 and 2: one training step as a program.

From microsoft/DeepSpeed ``deepspeed/runtime/zero/stage_1_and_2.py`` and ``config.py``
(domain-model 4.3):

- Gradients are 16-bit (bf16/fp16 training keeps 16-bit weights and gradients, fp32 master
  weights in the optimizer; simulator/memory/estimate.py's ZeRO recipe).
- Stage 2 partitions gradients, so gradient hooks reduce them during backward: ready
  gradients fill an IPG bucket; when the next gradient would push it past
  ``reduce_bucket_size`` (5e8 elements) the bucket is reduced (``reduce_ipg_grads``), and the
  remainder after backward. Stage 1 without ``overlap_comm`` installs no hooks and reduces
  everything after backward (``reduce_gradients``), in the same buckets.
- The reduction is a reduce-scatter of each bucket over the data-parallel group (DeepSpeed
  issues per-owner reduces of the slices, the same bytes on the wire).
- ``overlap_comm`` (default None -> False for stages 1 and 2) puts reductions on a separate
  ``reduction_stream``; without it they run on the compute stream (backward waits).
- The optimizer steps the local 1/N partition; the updated 16-bit partitions are then
  all-gathered in ``allgather_bucket_size`` (5e8 elements) chunks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from simulator.engine.program import Comm, Program
from simulator.job.workload import Job
from simulator.strategies.offload import Offloader
from simulator.strategies.steps import (
    add_ops,
    as_compute,
    compute_only,
    ready_order,
    repeat_unit,
    trainable_indices,
)

if TYPE_CHECKING:
    from simulator.machine.topology import Machine
    from simulator.strategies.options import StrategyOptions

REDUCE_BUCKET_ELEMENTS = 500_000_000  # config.py reduce_bucket_size default (elements)
ALLGATHER_BUCKET_ELEMENTS = 500_000_000  # config.py allgather_bucket_size default (elements)


def reduce_buckets(job: Job, order: list[int], cap: int = REDUCE_BUCKET_ELEMENTS
                   ) -> list[list[int]]:
    """IPG buckets: ``job.params`` indices in ready order, split before exceeding ``cap``
    elements (``reduce_bucket_size``)."""
    buckets: list[list[int]] = [[]]
    size = 0
    for i in order:
        numel = job.params[i].numel
        if buckets[-1] and size + numel > cap:
            buckets.append([])
            size = 0
        buckets[-1].append(i)
        size += numel
    return [b for b in buckets if b]


def build(job: Job, machine: Machine, options: StrategyOptions, *, stage: int) -> Program:
    """One ZeRO-``stage`` step over every GPU of the machine."""
    if stage not in (1, 2):
        raise ValueError(f"ZeRO stage {stage} is not modelled here (1 or 2)")
    gpu = machine.gpu
    world = machine.n_gpus
    group = (tuple(range(world)),)
    grad_bytes = 4 if job.precision == "fp32" else 2
    prog = Program(world=world, meta={"strategy": f"zero{stage}", "dp": world})
    fwd, bwd = job.forward_ops(), job.backward_ops()
    overlap = bool(options.zero_overlap_comm)  # DeepSpeed default: False for stages 1 and 2
    hooks = stage == 2 or overlap  # gradient hooks reduce during backward
    emit = compute_only(gpu)
    accum = options.grad_accum or job.grad_accum
    last: int | None = None
    if accum > 1:  # DeepSpeed reduces only at the gradient-accumulation boundary
        first = len(prog.tasks)
        add_ops(prog, fwd + bwd, emit, after=(), prefix="micro0.")
        last = repeat_unit(prog, first, accum - 2)
    prefix = f"micro{accum - 1}." if accum > 1 else ""
    trainable = set(trainable_indices(job))
    order = [i for i in ready_order(bwd) if i in trainable]
    buckets = reduce_buckets(job, order, options.reduce_bucket_size or REDUCE_BUCKET_ELEMENTS)
    closes_after = {b[-1]: k for k, b in enumerate(buckets)}
    ids = add_ops(prog, fwd, emit, after=() if last is None else (last,), prefix=prefix)
    last = ids[-1]
    reductions: list[int] = []
    waiting: int | None = None  # a reduction on the compute stream that backward waits for
    off = (Offloader(machine, options.ranks, what="optimizer", framework="deepspeed",
                     pinned=options.pin_memory, torchrun=job.torchrun)
           if options.offload == "optimizer" else None)

    def reduce(k: int, after: int) -> int:
        numel = sum(job.params[i].numel for i in buckets[k])
        task = after
        if world > 1:
            task = prog.add("nccl", Comm(f"reducescatter.bucket{k}", "reducescatter",
                                         numel * grad_bytes, group,
                                         {"bucket": k, "tensors": len(buckets[k])}), (after,))
        if off is not None:  # the reduced partition goes down as fp32, on the same stream
            task = off.copy(prog, "nccl" if world > 1 else "d2h", f"d2h.bucket{k}",
                            numel / world * 4, True, (task,))
        return task

    reducing = world > 1 or off is not None
    for op in bwd:
        last = emit(prog, op, (last,) if waiting is None else (last, waiting), prefix)
        waiting = None
        for i in op.grads:
            k = closes_after.get(i)
            if hooks and reducing and k is not None and k < len(buckets) - 1:
                reductions.append(reduce(k, last))
                waiting = None if overlap else reductions[-1]
    if reducing and buckets:
        start = 0 if not hooks else len(buckets) - 1
        for k in range(start, len(buckets)):
            reductions.append(reduce(k, last if k == start else reductions[-1]))
    after = [last, *reductions[-1:]]
    scale = 1.0 / world
    total = sum(job.params[i].numel for i in trainable)
    if off is not None:  # CPU-Adam on the host, then the updated 16-bit partition back up
        copied = dict(off.copied)
        after = [off.cpu_step(prog, total * scale, tuple(after))]
        after = [off.copy(prog, "nccl" if world > 1 else "h2d", "h2d.params",
                          total * scale * grad_bytes, False, tuple(after))]
        prog.meta["offload"] = off.report({k: 0.0 for k in copied}, 1)
    for op in job.optimizer_ops() if off is None else []:
        after = [prog.add("compute", as_compute(op, gpu, scale=scale), tuple(after))]
    if world > 1:  # updated 16-bit partitions, gathered back to every rank
        per = options.allgather_bucket_size or ALLGATHER_BUCKET_ELEMENTS
        chunks = max(1, -(-total // per))
        for c in range(chunks):
            numel = min(per, total - c * per)
            after = [prog.add("nccl", Comm(f"allgather.params{c}", "allgather",
                                           numel * grad_bytes, group), tuple(after))]
    prog.meta["buckets"] = [{"bytes": sum(job.params[i].numel for i in b) * grad_bytes,
                             "tensors": len(b), "name": f"reducescatter.bucket{k}"}
                            for k, b in enumerate(buckets)]
    return prog
