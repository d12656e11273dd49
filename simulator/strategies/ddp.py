"""PyTorch DistributedDataParallel: one training step as a program of compute and all-reduces.

What the program says (domain-model section 3; torch/csrc/distributed/c10d/reducer.cpp):

- Buckets are the steady-state plan (``buckets.bucket_plan``) over the trainable parameters
  (DDP only registers tensors that require grad) in the order backward completes them.
- A bucket's all-reduce is launched when its last gradient is ready and every earlier bucket
  has been launched (``mark_bucket_ready`` launches strictly in bucket order); ProcessGroupNCCL
  makes the NCCL stream wait for the compute stream at launch, so the all-reduce depends on the
  backward op that readied its last gradient. One NCCL stream: buckets run one at a time.
- Without ``gradient_as_bucket_view`` the autograd hook copies each gradient into its bucket
  (``mark_variable_ready_dense``: ``bucket_view.copy_(grad)``), and ``finalize_backward``
  copies the averaged bucket back into ``.grad``; both are HBM passes on the compute stream.
  Gradients are pre-divided by the world size (``div_``) either way.
- ``legacy_reducer``: PyTorch up to v1.4 (its ``reducer.cpp``, ``distributed.py``): buckets fixed
  at construction (``buckets.legacy_bucket_plan``: the small first bucket is reduced last), the
  hook copies without dividing (``bucket_view.copy_(grad)``) and the bucket is divided in a
  kernel of its own once its last gradient is in (``replica.contents.div_(world size)``).
- Gradient dtype: fp32 under AMP (the weights are fp32, so is ``.grad``: 4 bytes, as
  simulator/memory/estimate.py counts them); ``bf16_compress_hook`` halves the bytes on the wire.
- Gradient accumulation with ``no_sync()``: the first A-1 micro-steps run forward and backward
  only; the last one reduces. The optimizer step follows the last all-reduce.
- apex's DistributedDataParallel (``training.ddp: apex``, apex/parallel/distributed.py with
  its defaults): gradients join buckets in the order they arrive until a bucket holds
  ``message_size`` (1e7) elements; each full bucket is flattened (``torch.cat``), all-reduced,
  averaged (``mul_``) and copied back into the gradients (``unflatten``, ``copy_``), all on
  its own stream; no per-gradient hook copies on the compute stream, no copy back at the end.
  Gradients are all-reduced in their own dtype (fp16 under amp O2).
- ``no_overlap`` is Megatron-LM's "local" DDP (NGC 22.07, ``megatron/model/distributed.py``,
  ``allreduce_gradients``): gradients accumulate in one contiguous fp32 buffer per dtype,
  which is divided and all-reduced in one call after the whole backward (with an explicit
  ``bucket_mb``, buckets of that size, still after backward).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from simulator.engine.program import Comm, Program
from simulator.job.modules import ParamTensor
from simulator.job.workload import Job
from simulator.memo import IdentityMemo
from simulator.strategies import paging
from simulator.strategies.buckets import (
    MIB,
    Bucket,
    GradTensor,
    assign_by_size,
    bucket_plan,
    legacy_bucket_plan,
)
from simulator.strategies.steps import (
    Emit,
    add_ops,
    compute_only,
    memory_pass,
    ready_order,
    repeat_unit,
    trainable_indices,
)

if TYPE_CHECKING:
    from simulator.job.ops import Op
    from simulator.machine.topology import Machine
    from simulator.strategies.options import StrategyOptions

GRAD_BYTES = 4  # fp32 .grad under AMP and fp32 training (PyTorch AMP keeps fp32 weights)
COMPRESSED_BYTES = 2  # ddp_comm_hooks/default_hooks.bf16_compress_hook
# apex/parallel/distributed.py DistributedDataParallel: message_size=10000000 (elements) is
# "the minimum number of elements in a communication bucket"
APEX_MESSAGE_SIZE = 10_000_000


def local_numel(param: ParamTensor, tp: int) -> int:
    """Elements one rank holds: Megatron splits every matrix over the TP group, not vectors."""
    return param.numel // tp if len(param.shape) >= 2 else param.numel


def grad_tensors(job: Job, tp: int = 1) -> list[GradTensor]:
    """The tensors DDP registers: trainable parameters in registration order, fp32 grads."""
    g = job.grad_bytes  # fp32 under AMP and fp32 training, bf16 under pure bf16
    return [GradTensor(job.params[i].name, local_numel(job.params[i], tp), g,
                       "fp32" if g == 4 else "bf16")
            for i in trainable_indices(job)]


# A sweep's GPU counts and a range's re-runs plan the same buckets for the same job and cap;
# each entry keeps its job and the job's backward ops alive: few are kept.
_PLANS: IdentityMemo[list[Bucket]] = IdentityMemo(32)


def plan_buckets(job: Job, backward: list[Op], options: StrategyOptions,
                 tp: int = 1) -> list[Bucket]:
    """Steady-state buckets (DDP numbering: index into the trainable parameters)."""
    settings = (options.bucket_mb, options.legacy_reducer, options.overlapped, tp,
                job.recipe.ddp)
    return list(_PLANS.get((job, *backward), settings,
                           lambda: _plan(job, backward, options, tp)))


def _plan(job: Job, backward: list[Op], options: StrategyOptions, tp: int) -> list[Bucket]:
    tensors = grad_tensors(job, tp)
    if options.legacy_reducer and options.overlapped:
        return legacy_bucket_plan(tensors, options.bucket_mb)
    ddp_index = {p: k for k, p in enumerate(trainable_indices(job))}
    order = [ddp_index[i] for i in ready_order(backward) if i in ddp_index]
    claimed = set(order)
    missing = [k for k in range(len(tensors)) if k not in claimed]
    order += missing[::-1]  # gradients no backward op claims: last, reverse registration
    if job.recipe.ddp == "apex":  # buckets fill in arrival order until message_size elements
        cap_mb = APEX_MESSAGE_SIZE * job.grad_bytes / MIB
        return bucket_plan(tensors, cap_mb, order)
    if options.overlapped or options.bucket_mb is not None:
        return bucket_plan(tensors, options.bucket_mb, order)
    # Megatron local DDP: one contiguous buffer per dtype, reduced in one call
    return assign_by_size(tensors, order, [2**62], sort_by_min_index=False)


def build(job: Job, machine: Machine, options: StrategyOptions, *,
          group: tuple[int, ...] | None = None, program: Program | None = None,
          forward: list[Op] | None = None, backward: list[Op] | None = None,
          tp: int = 1, emit: Emit | None = None) -> Program:
    """One DDP step over ``group`` (default: every GPU of the machine).

    ``program``/``forward``/``backward``/``tp`` let tensor parallelism reuse this with its
    own sharded ops and data-parallel groups (``options.dp_groups`` lists them all).
    """
    gpu = machine.gpu
    world = machine.n_gpus
    groups = options.dp_groups or ((tuple(range(world)) if group is None else group),)
    dp = len(groups[0])
    prog = program or Program(world=world)
    prog.meta.setdefault("strategy", "ddp")
    prog.meta.setdefault("dp", dp)
    fwd = forward if forward is not None else job.forward_ops(autocast=True)
    bwd = backward if backward is not None else job.backward_ops(autocast=True)
    emit = emit or compute_only(gpu)
    accum = options.grad_accum or job.grad_accum
    last: int | None = prog.tasks[-1].id if prog.tasks else None
    if accum > 1:  # no_sync(): no reduction until the last micro-step; the others are alike
        first = len(prog.tasks)
        add_ops(prog, fwd + bwd, emit, after=() if last is None else (last,), prefix="micro0.")
        last = repeat_unit(prog, first, accum - 2)
        # AccumulateGrad adds each later micro-step's gradients into .grad (read both, write):
        # the accum - 1 additions of every trainable tensor, run here at once
        n = sum(local_numel(job.params[i], tp) for i in trainable_indices(job))
        last = prog.add("compute", memory_pass("accumulate_grad", 3 * job.grad_bytes * n * (
            accum - 1), gpu, kernels=len(trainable_indices(job))), (last,))
    prefix = f"micro{accum - 1}." if accum > 1 else ""
    fwd_ids = add_ops(prog, fwd, emit, after=() if last is None else (last,), prefix=prefix)
    if dp == 1:  # a single replica: plain backward and optimizer, no DDP wrapper
        prog.meta["buckets"] = []
        if job.recipe.optimizer_in_bwd:  # torchtune: each tensor stepped in backward
            paging.backward_with_steps(prog, job, machine, options, bwd, emit, fwd_ids[-1],
                                       prefix)
            return prog
        ids = add_ops(prog, bwd, emit, after=(fwd_ids[-1],), prefix=prefix)
        _optimizer(prog, job, machine, options, tp, (ids[-1],))
        return prog
    buckets = plan_buckets(job, bwd, options, tp)
    trainable = trainable_indices(job)
    ddp_index = {p: k for k, p in enumerate(trainable)}
    bucket_of = {trainable[k]: b for b, bucket in enumerate(buckets) for k in bucket.indices}
    pending = [set(b.indices) for b in buckets]
    ready_task: list[int | None] = [None] * len(buckets)
    megatron = not options.overlapped
    apex = job.recipe.ddp == "apex"
    bwd_ids: list[int] = []
    for op in bwd:
        bwd_ids.append(emit(prog, op, ((bwd_ids or fwd_ids)[-1],), prefix))
        grads = [i for i in op.grads if i in bucket_of]
        if grads and not megatron and not apex:
            # autograd hook per tensor (reducer.cpp mark_variable_ready_dense): without
            # gradient_as_bucket_view, copy_grad_to_bucket divides while copying
            # (at::mul_out(bucket_view, grad, 1 / div_factor)); with it, grad is the bucket
            # view and is divided in place (div_): one read and one write of fp32 either way
            nbytes = 2 * job.grad_bytes * sum(local_numel(job.params[i], tp) for i in grads)
            bwd_ids.append(prog.add("compute", memory_pass(
                f"{prefix}{op.name}.ddp_hook", nbytes, gpu, op.block, kernels=len(grads)),
                (bwd_ids[-1],)))
        for i in grads:
            b = bucket_of[i]
            pending[b].discard(ddp_index[i])
            if pending[b]:
                continue
            if options.legacy_reducer and not megatron:  # v1.4: contents.div_(world size)
                bwd_ids.append(prog.add("compute", memory_pass(
                    f"{prefix}ddp.bucket{b}.div", 2 * buckets[b].bytes, gpu, op.block),
                    (bwd_ids[-1],)))
            ready_task[b] = bwd_ids[-1]
    end_of_backward = bwd_ids[-1]
    if megatron:  # buffer /= world size, then the all-reduce
        nbytes = 8 * sum(b.numel for b in buckets)
        end_of_backward = prog.add("compute", memory_pass(f"{prefix}grad_buffer.div", nbytes,
                                                          gpu), (end_of_backward,))
    wire = COMPRESSED_BYTES if options.grad_compression == "bf16" else job.grad_bytes
    comm_ids: list[int] = []
    meta: list[dict[str, object]] = []
    for b, bucket in enumerate(buckets):
        dep = end_of_backward if megatron else ready_task[b]
        assert dep is not None, "every bucket's gradients come from some backward op"
        nbytes = bucket.numel * wire
        name = f"allreduce.bucket{b}"
        if apex:  # allreduce_bucket on its stream: flatten (torch.cat) the bucket's gradients
            dep = prog.add("nccl", memory_pass(f"{prefix}apex.flatten.bucket{b}",
                                               2 * bucket.bytes, gpu), (dep,))
        tid = prog.add("nccl", Comm(name, "allreduce", nbytes, groups,
                                    {"bucket": b, "tensors": bucket.tensors}), (dep,))
        if apex:  # then average (mul_ by 1 / world) and copy back into each .grad
            tid = prog.add("nccl", memory_pass(f"{prefix}apex.average_unflatten.bucket{b}",
                                               4 * bucket.bytes, gpu, kernels=2), (tid,))
        comm_ids.append(tid)
        meta.append({"bytes": nbytes, "tensors": bucket.tensors, "task": tid, "name": name,
                     "gradient_bytes": bucket.bytes,
                     "params": [trainable[k] for k in bucket.indices]})
    after = [bwd_ids[-1], *comm_ids[-1:]]
    if not megatron and not apex and not options.gradient_as_bucket_view:
        # finalize_backward: each bucket's averaged gradients copied back into .grad, per
        # tensor (reducer.cpp finalize_bucket_dense, copy_bucket_to_grad)
        nbytes = 2 * job.grad_bytes * sum(b.numel for b in buckets)
        tensors = sum(len(b.indices) for b in buckets)
        after = [prog.add("compute", memory_pass("ddp.copy_back", nbytes, gpu,
                                                 kernels=tensors), tuple(after))]
    _optimizer(prog, job, machine, options, tp, tuple(after))
    prog.meta["buckets"] = meta
    return prog


def _optimizer(prog: Program, job: Job, machine: Machine, options: StrategyOptions, tp: int,
               after: tuple[int, ...]) -> None:
    """The optimizer over this rank's parameters (1/tp of each block's under TP), each
    block's paged states brought in first when they overflow the card (paging.py)."""
    for op in job.optimizer_ops():
        after = (paging.step(prog, job, machine, options, op, job.block_params(op.block),
                             after, scale=1.0 / tp),)
