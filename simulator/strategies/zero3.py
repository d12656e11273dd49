"""DeepSpeed ZeRO-3 as its parameter coordinator runs it: one training step as a program.

From deepspeed/runtime/zero at v0.18.2 (commit e993fea, 2025-11-04): partitioned_param_
coordinator.py, partition_parameters.py and stage3.py.

- Fetch per submodule (``fetch_sub_module``, L285): before a module runs, its own parameters
  are gathered (all-gathered from their partitions) and waited for; parameters under
  ``stage3_param_persistence_threshold`` elements stay whole on every rank (norms, biases).
  We take each op of a block as one fetch (q, k and v together; gate and up together).
- Prefetch (L353-412): only with a complete trace (from the second step on; the first step
  records it and prefetches nothing), after the current module's fetch, the next parameters
  of the trace are gathered until ``stage3_prefetch_bucket_size`` elements are in flight:
  Hugging Face's ``"auto"`` is 0.9 x hidden^2 (transformers integrations/deepspeed.py), under
  one MLP matrix, so about one module ahead. The trace is a queue each entry leaves once a
  step (``__param_queue.popleft``, L362 and L389): an entry whose parameters are there or on
  their way when it is reached is dropped, so if they are freed before that use, the use
  fetches them itself.
- An offloaded partition reaches the GPU by ``param.ds_tensor.to(device)`` inside
  ``all_gather_coalesced`` (partition_parameters.py L1332): a copy without non_blocking, on
  the all-gather stream, so the CPU thread waits for that stream to reach and finish it
  before it launches the current module's kernels. On one rank no all-gather runs and the
  copy is non-blocking (``_no_gather_coalesced``).
- Release (``__params_to_release``, L529): after a module, its parameters are freed unless
  they recur within ``stage3_max_reuse_distance`` elements of the trace (1e9 by default and
  in the usual configs): under activation checkpointing a block's parameters fetched for its
  recompute stay for its backward; those of its forward do not.
- Gradients: hooks fill buckets of ``reduce_bucket_size`` elements (Hugging Face "auto":
  hidden^2), reduce-scattered in the gradients' 16-bit dtype on the reduction stream
  (overlap_comm). With ``offload_optimizer`` each rank's gradient partitions accumulate in a
  pinned host buffer of the gradient-accumulation dtype (stage3.py partition_grads,
  L1507-1556): the first micro-step copies them down (2 B) and back up to carry on, later
  ones copy the buffer up, add on the GPU ("adding directly to cpu is very slow") and copy
  it down (2 B each way); the last casts them to fp32 and copies them into the optimizer's
  fp32 gradients (4 B).
- The step (stage3.py step(), L2138): per sub-group, ``unscale_and_clip_grads`` multiplies
  the host fp32 gradients in place (a torch op on CPU tensors), DeepSpeedCPUAdam steps them,
  and ``_reassign_or_swap_out_partitioned_parameters`` copies the fp32 partition into the
  16-bit one: on the host when the parameters are offloaded, up to the GPU otherwise. Torch's
  CPU ops and CPU-Adam's OpenMP loop run on the threads OMP_NUM_THREADS allows (one per
  process under torchrun: ``training.launcher``).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import islice
from typing import TYPE_CHECKING

from simulator.engine.program import Comm, Program
from simulator.job.workload import Job
from simulator.strategies.fsdp import as_compute_wait
from simulator.strategies.offload import Offloader
from simulator.strategies.steps import as_compute, compute_only, repeat_unit
from simulator.strategies.zero import reduce_buckets

if TYPE_CHECKING:
    from simulator.job.ops import Op
    from simulator.machine.topology import Machine
    from simulator.strategies.options import StrategyOptions

PREFETCH_PER_HIDDEN2 = 0.9  # transformers integrations/deepspeed.py: "auto" = 0.9 * hidden^2
PERSISTENCE_PER_HIDDEN = 10  # "auto" stage3_param_persistence_threshold = 10 * hidden
MAX_REUSE_DISTANCE = 1_000_000_000  # DeepSpeedZeroConfig default stage3_max_reuse_distance


@dataclass
class _Unit:
    """The parameters one op fetches: indices, elements, and bytes per rank at rest."""

    params: tuple[int, ...]
    numel: int


def fetch_units(job: Job, threshold: int) -> dict[str, _Unit]:
    """Op label -> the partitioned parameters it uses (persistent ones left out)."""
    from simulator.job.ops import op_params

    out: dict[str, _Unit] = {}
    for name, idx in op_params(job).items():
        kept = tuple(i for i in idx if job.params[i].numel > threshold)
        if kept:
            out[name] = _Unit(kept, sum(job.params[i].numel for i in kept))
    return out


def _later_uses(uses: list[_Unit | None], used_at: list[int], t: int) -> Iterator[_Unit]:
    """The units the trace uses after op ``t``, in order (``used_at``: the ops that use one)."""
    for position in islice(used_at, bisect_right(used_at, t), None):
        unit = uses[position]
        assert unit is not None
        yield unit


def _released(uses: list[_Unit | None], used_at: list[int], t: int, limit: int) -> bool:
    """Whether the unit used at ``t`` is freed after it: no later use within ``limit``
    elements of the trace (the ones in between counted as they run)."""
    unit = uses[t]
    seen = 0
    for later in _later_uses(uses, used_at, t):
        if later is unit:
            return False
        seen += later.numel
        if seen >= limit:
            return True
    return True


def build(job: Job, machine: Machine, options: StrategyOptions) -> Program:
    """One ZeRO-3 step over every GPU (one data-parallel group)."""
    gpu = machine.gpu
    world = machine.n_gpus
    group = (tuple(range(world)),)
    prog = Program(world=world, meta={"strategy": "zero3", "dp": world})
    assert job.arch is not None
    hidden = job.arch.hidden
    param_bytes = 4 if job.precision == "fp32" else 2
    bucket = options.prefetch_bucket_size or int(PREFETCH_PER_HIDDEN2 * hidden * hidden)
    units = fetch_units(job, PERSISTENCE_PER_HIDDEN * hidden)
    offload = options.offload != "none"
    off = (Offloader(machine, options.ranks, what=options.offload, pinned=options.pin_memory,
                     framework="deepspeed", torchrun=job.torchrun) if offload else None)
    fetched_from_host = off is not None and off.what == "params"
    emit = compute_only(gpu)
    accum = options.grad_accum or job.grad_accum
    fwd, bwd = job.forward_ops(), job.backward_ops()
    ops: list[Op] = fwd + bwd
    uses = [units.get(op.name) for op in ops]
    used_at = [t for t, unit in enumerate(uses) if unit is not None]
    counts = {"allgather": 0, "reducescatter": 0}
    n_fetches = 0

    def fetch(unit: _Unit, prefix: str, sync: bool, start: int | None
              ) -> tuple[int | None, int]:
        """(the H2D copy the CPU waits for, or None; the task the unit is ready after). No
        copy starts before ``start``: the CPU issues a micro-step's fetches from its forward,
        after the previous micro-step's backward."""
        nonlocal n_fetches
        n_fetches += 1
        name = f"{prefix}fetch{n_fetches}"
        h2d = None
        last: tuple[int, ...] = ()
        if fetched_from_host:
            assert off is not None
            h2d = off.copy(prog, "allgather" if world > 1 else "h2d", f"{name}.h2d",
                           unit.numel / world * param_bytes, False,
                           () if start is None else (start,))
            last = (h2d,)
        if world == 1:
            return None, h2d if h2d is not None else -1
        counts["allgather"] += 1
        if not last and start is not None:  # the CPU waits for the previous backward's
            last = (start,)  # reductions (stage3.py independent_gradient_partition_epilogue)
        ag = prog.add("allgather", Comm(f"{name}.allgather", "allgather",
                                        unit.numel * param_bytes, group), last)
        return (h2d if sync else None), ag

    def micro_step(prefix: str, boundary: bool, first: bool, after: int | None) -> int:
        """One micro-step's fetches, compute and reductions; returns its last task."""
        available: set[int] = set()
        inflight: dict[int, int] = {}
        # DeepSpeed's fetch queue (partitioned_param_coordinator.py fetch_sub_module): the
        # trace's parameter uses, each looked at once per step; an entry whose unit is already
        # there or on its way is popped without a fetch
        queue = 0  # the next entry of used_at the prefetcher has not popped
        last = after
        order = [i for op in bwd for i in op.grads]
        trainable = {i for i, p in enumerate(job.params) if p.trainable}
        buckets = reduce_buckets(job, [i for i in order if i in trainable],
                                 options.reduce_bucket_size or hidden * hidden)
        closes = {b[-1]: k for k, b in enumerate(buckets)}
        reductions: list[int] = []
        for t, op in enumerate(ops):
            unit = uses[t]
            deps = [last] if last is not None else []
            if unit is not None and id(unit) not in available:
                if id(unit) in inflight:
                    ready = inflight.pop(id(unit))
                else:
                    _, ready = fetch(unit, prefix, sync=False, start=after)
                if ready >= 0:
                    deps.append(ready)
                available.add(id(unit))
            queue = max(queue, bisect_right(used_at, t))  # the current op's own entries
            numel = 0  # prefetch the next parameters of the trace, up to the bucket
            while queue < len(used_at) and numel < bucket:
                later = uses[used_at[queue]]
                queue += 1
                assert later is not None
                if id(later) in available or id(later) in inflight:
                    continue
                sync, ready = fetch(later, prefix, sync=True, start=after)
                inflight[id(later)] = ready
                numel += later.numel
                if sync is not None:
                    deps.append(sync)  # the CPU waits for the copy before launching
            last = emit(prog, op, tuple(deps), prefix)
            if unit is not None and _released(uses, used_at, t, MAX_REUSE_DISTANCE):
                available.discard(id(unit))
            for i in op.grads:
                k = closes.get(i)
                if k is not None:
                    reductions.append(reduce(k, buckets[k], last, prefix, boundary, first))
        if reductions:
            last = prog.add("compute", as_compute_wait(prefix), (last, reductions[-1])) \
                if last is not None else reductions[-1]
        assert last is not None
        return last

    def reduce(k: int, params: list[int], after: int, prefix: str, boundary: bool,
               first: bool) -> int:
        numel = sum(job.params[i].numel for i in params)
        task = after
        if world > 1:
            counts["reducescatter"] += 1
            task = prog.add("reducescatter", Comm(f"{prefix}reducescatter.bucket{k}",
                                                  "reducescatter", numel * param_bytes, group),
                            (task,))
        if off is None:
            return task
        share = numel / world
        stream = "reducescatter" if world > 1 else "d2h"
        if first:  # copy_ into the host buffer, then .to(device) to carry on
            task = off.copy(prog, stream, f"{prefix}d2h.grad{k}", share * param_bytes, True,
                            (task,))
            task = off.copy(prog, stream, f"{prefix}h2d.grad{k}", share * param_bytes, False,
                            (task,))
        else:  # the host buffer up, the add on the GPU, and back down
            task = off.copy(prog, stream, f"{prefix}h2d.grad{k}", share * param_bytes, False,
                            (task,))
            task = off.copy(prog, stream, f"{prefix}d2h.grad{k}", share * param_bytes, True,
                            (task,))
        if boundary:  # into the optimizer's fp32 gradients
            task = off.copy(prog, stream, f"{prefix}d2h.fp32_grad{k}", share * 4, True, (task,))
        return task

    last: int | None = None
    marks: list[dict[str, float]] = []  # bytes copied so far, after each simulated micro-step

    def copied() -> dict[str, float]:
        return dict(off.copied) if off is not None else {"d2h": 0.0, "h2d": 0.0}

    if accum > 1:
        last = micro_step("micro0.", False, True, None)
        marks.append(copied())
        if accum > 2:  # later micro-steps are alike: one simulated, the rest replayed
            second = len(prog.tasks)
            last = micro_step("micro1.", False, False, last)
            marks.append(copied())
            last = repeat_unit(prog, second, accum - 3, "micro{}.")
    prefix = f"micro{accum - 1}." if accum > 1 else ""
    last = micro_step(prefix, True, accum == 1, last)
    total = job.n_trainable / world
    if off is not None:  # stage3.py step(): per sub-group, on the host tensors
        last = off.cpu_pass(prog, "unscale_and_clip_grads", total, 2 * 4, (last,))  # mul_
        last = off.cpu_step(prog, total, (last,))
        if fetched_from_host:  # the fp16 partitions live on the host: a copy_ there
            last = off.cpu_pass(prog, "fp32_to_16bit_partitions", total, 4 + param_bytes,
                                (last,))
        else:  # offload_optimizer alone: the updated partition goes up
            last = off.copy(prog, "compute", "h2d.params", total * param_bytes, False, (last,))
        moved = copied()
        if len(marks) == 2:  # the replayed micro-steps move what micro1 did
            moved = {k: moved[k] + (marks[1][k] - marks[0][k]) * (accum - 3) for k in moved}
        prog.meta["offload"] = {
            "what": off.what, "framework": "deepspeed", "pin_memory": off.pinned,
            "cpu_optimizer": off.optimizer.name,
            **{f"{k}_bytes_per_gpu": v for k, v in moved.items()}}
    else:
        for op in job.optimizer_ops():
            last = prog.add("compute", as_compute(op, gpu, scale=1.0 / world), (last,))
    prog.meta["units"] = len(units)
    prog.meta["prefetch_bucket_elements"] = bucket
    prog.meta["collectives"] = {op: n for op, n in counts.items()}
    return prog


