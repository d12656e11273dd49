"""FSDP2 (``fully_shard``) with its defaults: one training step as a program.

Per unit (one transformer block; the root unit holds what is left: embeddings, final norm,
head), from torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py (domain-model 4.2):

- Forward: the unit's all-gather runs on the ``allgather`` stream before its forward; the next
  unit's all-gather is issued while the current one computes (implicit prefetch, one ahead:
  the all-gather output is freed after the next group's copy-in, so at most two are live).
- ``reshard_after_forward`` (default True for non-root units, False for the root): the unit is
  freed after forward and all-gathered again in backward, one unit ahead (``pre_backward``
  unshards itself and prefetches the previous unit in post-forward order).
- After a unit's backward, its gradients are reduce-scattered on the ``reducescatter``
  stream; before issuing it, the compute stream waits for the previous unit's reduce-scatter
  (``post_backward`` waits on ``reduce_scatter_state.event``): at most one in flight. The
  root's reduce-scatter runs in the final backward callback.
- The optimizer steps the local 1/N shard.

Bytes: all-gathers in ``param_dtype`` (2 bytes under bf16/fp16, 4 under fp32), reduce-scatters
in ``reduce_dtype`` fp32 (4 bytes), consistent with memory/estimate.py's FSDP recipe; frozen
parameters (LoRA) are gathered but not reduced. Gradient accumulation repeats the whole
micro-step (FSDP2 reduces every backward unless told not to), so one micro-step is simulated
and replayed.
"""

from __future__ import annotations

from itertools import groupby
from typing import TYPE_CHECKING

from simulator.engine.program import Comm, Compute, Program
from simulator.job.modules import NF4_BITS_PER_PARAM
from simulator.job.workload import Job
from simulator.memo import IdentityMemo
from simulator.strategies.offload import Offloader
from simulator.strategies.steps import (
    Emit,
    add_ops,
    as_compute,
    compute_only,
    memory_pass,
    repeat_unit,
)

if TYPE_CHECKING:
    from simulator.job.ops import Op
    from simulator.machine.topology import Machine
    from simulator.strategies.options import StrategyOptions

# reduce_dtype fp32 with bf16 params: torchtitan ships mixed_precision_reduce "float32" and
# llm-foundry (Composer DEFAULT) reduces in fp32; memory.py assumes the same recipe
REDUCE_BYTES = 4


def units(job: Job) -> list[int]:
    """FSDP units in forward order: the transformer blocks (generic workloads: each layer)."""
    return list(range(job.n_blocks))


def root_blocks(job: Job) -> list[int]:
    unit_blocks = set(units(job))
    return [b for b in job.blocks if b not in unit_blocks]


# a unit's sizes by (job, its blocks): a step asks for each unit's several times over (gather,
# copy-out, reduce; forward and backward), and a range's re-runs build the same job again
_STORED: IdentityMemo[float] = IdentityMemo(4096)
_SIZES: IdentityMemo[tuple[int, int]] = IdentityMemo(4096)


def _stored_bytes(job: Job, blocks: list[int], trainable_bytes: float) -> float:
    """Bytes the blocks' parameters occupy where a shard is kept: ``trainable_bytes`` per
    trainable element, NF4's 4.13 bits per quantized one (QLoRA's storage, what FSDP moves),
    the compute dtype for frozen ones."""
    def make() -> float:
        total = 0.0
        for i in (i for b in blocks for i in job.block_params(b)):
            p = job.params[i]
            each = (trainable_bytes if p.trainable else
                    NF4_BITS_PER_PARAM / 8 if p.quantized else job.activation_bytes)
            total += p.numel * each
        return total
    return _STORED.get((job,), (tuple(blocks), trainable_bytes), make)


def _sizes(job: Job, blocks: list[int]) -> tuple[int, int]:
    """(all parameters, trainable parameters) of the given blocks, in elements."""
    def make() -> tuple[int, int]:
        idx = [i for b in blocks for i in job.block_params(b)]
        return (sum(job.params[i].numel for i in idx),
                sum(job.params[i].numel for i in idx if job.params[i].trainable))
    return _SIZES.get((job,), tuple(blocks), make)


def _expert_part(job: Job, blocks: list[int], trainable_bytes: float) -> tuple[float, int, int]:
    """(stored bytes, parameters, trainable parameters) of the blocks' experts."""
    stored = 0.0
    numel = trainable = 0
    for i in (i for b in blocks for i in job.block_params(b)):
        p = job.params[i]
        if ".experts." not in p.name:
            continue
        stored += p.numel * (trainable_bytes if p.trainable else NF4_BITS_PER_PARAM / 8
                             if p.quantized else job.activation_bytes)
        numel += p.numel
        trainable += p.numel if p.trainable else 0
    return stored, numel, trainable


def build(job: Job, machine: Machine, options: StrategyOptions, *,
          groups: tuple[tuple[int, ...], ...] | None = None, program: Program | None = None,
          forward: list[Op] | None = None, backward: list[Op] | None = None,
          shard_numel: float = 1.0, optimizer_scale: float = 1.0,
          emit: Emit | None = None, reduce_bytes: int = REDUCE_BYTES,
          framework: str = "fsdp",
          expert_groups: tuple[tuple[int, ...], ...] | None = None,
          replicas: tuple[tuple[int, ...], ...] | None = None) -> Program:
    """One FSDP2 step. ``groups`` are the sharding groups (default: all GPUs, one group);
    tensor parallelism passes its DP groups, sharded ops, and ``shard_numel`` = 1/t.
    ZeRO-3 has the same per-unit pattern and passes its own ``reduce_bytes`` and
    ``framework="deepspeed"`` (how it offloads: strategies/offload.py). Expert parallelism
    (strategies/expert.py) passes ``expert_groups``: the ranks holding the same experts, over
    which a block's experts are sharded, gathered and reduced (torchtitan shards the experts
    over the data-parallel mesh without the EP dimension); the rest over ``groups``.
    ``replicas`` (HSDP, hsdp.py): after each reduce-scatter, its shard is all-reduced over
    these groups on a stream of its own."""
    gpu = machine.gpu
    groups = groups or (tuple(range(machine.n_gpus)),)
    dp = len(groups[0])
    edp = len(expert_groups[0]) if expert_groups else dp
    prog = program or Program(world=machine.n_gpus)
    prog.meta.setdefault("strategy", "fsdp")
    prog.meta.setdefault("dp", dp)
    fwd = forward if forward is not None else job.forward_ops()
    bwd = backward if backward is not None else job.backward_ops()
    emit = emit or compute_only(gpu)
    param_bytes = 4 if job.precision == "fp32" else 2
    unit_list = units(job)
    unit_set = set(unit_list)
    root = root_blocks(job)

    deepspeed = framework == "deepspeed"
    shard_bytes = 4 if job.precision in ("bf16", "fp16") else param_bytes  # the fp32 master
    off = (Offloader(machine, options.ranks, what=options.offload, pinned=options.pin_memory,
                     framework=framework, optimizer_impl=job.recipe.optimizer_impl,
                     state_bytes=shard_bytes,
                     torchrun=job.torchrun)
           if options.offload != "none" else None)
    fetched = off is not None and off.what == "params"  # shards live in host memory
    # the host copy of a shard: ZeRO-3 keeps 16-bit partitions, FSDP2 the shard as it is
    # (the fp32 master under mixed precision, bf16 under pure bf16)
    host_param_bytes = 2 if deepspeed and job.precision != "fp32" else shard_bytes
    # the reduced gradient shard goes down as fp32 (DeepSpeed) or in the shard's dtype (FSDP2)
    host_grad_bytes = 4 if deepspeed else shard_bytes

    def gather(name: str, blocks: list[int], deps: tuple[int, ...]) -> int:
        """The unit's all-gather, after its copy-in on the same stream
        (_fsdp_collectives.py _get_param_all_gather_inputs: a foreach copy casts the local
        shards to param_dtype; all_gather_copy_in copies them into the all-gather input)."""
        numel = _sizes(job, blocks)[0] * shard_numel
        if fetched:  # the shard comes up from host memory first, on the same stream
            assert off is not None
            host_bytes = _stored_bytes(job, blocks, host_param_bytes) * shard_numel
            deps = (off.copy(prog, "allgather" if dp > 1 else "h2d",
                             name.replace("allgather", "h2d"), host_bytes / dp, False, deps),)
            if dp == 1:
                return deps[0]
        wire = _stored_bytes(job, blocks, param_bytes) * shard_numel  # NF4 travels packed
        e_wire, e_numel, _ = _expert_part(job, blocks, param_bytes) if expert_groups else (
            0.0, 0, 0)
        local = (numel - e_numel) / dp + e_numel / edp
        copy_in = local * ((shard_bytes + param_bytes) + 2 * param_bytes)
        done = prog.add("allgather", memory_pass(f"{name}.copy_in", copy_in, gpu), deps)
        unit = {"unit": name.rsplit(".", 1)[-1]}
        if wire - e_wire > 0:
            done = prog.add("allgather", Comm(name, "allgather", int(wire - e_wire), groups,
                                              unit), (done,))
        if e_wire and edp > 1 and expert_groups:  # the experts, among the ranks holding them
            done = prog.add("allgather", Comm(f"{name}.experts", "allgather", int(e_wire),
                                              expert_groups, unit), (done,))
        return done

    def copy_out(name: str, blocks: list[int], deps: tuple[int, ...]) -> int:
        """foreach_all_gather_copy_out on the compute stream: split_with_sizes_copy of the
        all-gather output into each parameter's unsharded tensor (a read and a write). One
        rank gathers nothing: the unit is only fetched, the last of ``deps``."""
        if dp == 1:
            return deps[-1]
        numel = _sizes(job, blocks)[0] * shard_numel
        return prog.add("compute", memory_pass(f"{name}.copy_out", 2 * param_bytes * numel,
                                               gpu), deps)

    def reduce(name: str, blocks: list[int], deps: tuple[int, ...]) -> int | None:
        numel = _sizes(job, blocks)[1] * shard_numel
        if numel == 0:
            return None
        experts = _expert_part(job, blocks, reduce_bytes)[2] if expert_groups else 0
        if dp > 1:
            # foreach_reduce's copy-in: the unsharded gradients chunk-concatenated (and cast
            # to reduce_dtype) into the reduce-scatter input (torch._chunk_cat)
            done = prog.add("reducescatter", memory_pass(f"{name}.copy_in", numel * (
                param_bytes + reduce_bytes), gpu), deps)
            unit = {"unit": name.rsplit(".", 1)[-1]}
            if numel - experts > 0:
                done = prog.add("reducescatter", Comm(
                    name, "reducescatter", int((numel - experts) * reduce_bytes), groups,
                    unit), (done,))
            if experts and edp > 1 and expert_groups:
                done = prog.add("reducescatter", Comm(
                    f"{name}.experts", "reducescatter", int(experts * reduce_bytes),
                    expert_groups, unit), (done,))
            deps = (done,)
        if replicas is not None and len(replicas[0]) > 1:
            # HSDP (_fsdp_collectives.py foreach_reduce, "if all_reduce_group is not None"):
            # all_reduce_stream waits for the reduce-scatter, then all-reduces its output, the
            # rank's shard, over the replicate group; the next unit's reduce-scatter does not
            # wait for it
            all_reduces.append(prog.add("allreduce", Comm(
                name.replace("reducescatter", "allreduce"), "allreduce",
                int(numel / dp * reduce_bytes), replicas,
                {"unit": name.rsplit(".", 1)[-1]}), deps))
        if off is None:
            return deps[0]
        return off.copy(prog, "reducescatter" if dp > 1 else "d2h",
                        name.replace("reducescatter", "d2h"),
                        ((numel - experts) / dp + experts / edp) * host_grad_bytes, True, deps)

    counts = {"allgather": 0, "reducescatter": 0}
    all_reduces: list[int] = []  # HSDP's all-reduce of each reduced shard across replicas
    accum = options.grad_accum or job.grad_accum
    last: int | None = prog.tasks[-1].id if prog.tasks else None
    first = len(prog.tasks)
    # every micro-step is alike: micro0 is simulated, then replayed accum - 1 times
    prefix = "micro0." if accum > 1 else ""
    sharded = dp > 1 or fetched  # units come and go (gathered, or fetched from the host)
    # ---- forward
    ag: dict[int, int] = {}
    root_ag = None
    if sharded and root:  # every group reshards after backward, the root too
        root_ag = gather(f"{prefix}allgather.root", root, () if last is None else (last,))
        root_ag = copy_out(f"{prefix}allgather.root", root, (root_ag,))
    fwd_end: dict[int, int] = {}
    order = [b for b, _ in groupby(fwd, key=lambda op: op.block)]
    for block, ops in groupby(fwd, key=lambda op: op.block):
        deps: list[int] = [] if last is None else [last]
        if sharded and block in unit_set:
            k = order.index(block)
            ahead = 2 if options.forward_prefetch else 1  # issue when unit k-1 starts
            before = order[k - ahead] if k - ahead >= 0 else None
            ag_deps = (fwd_end[before],) if before in fwd_end else tuple(deps)
            ag[block] = gather(f"{prefix}allgather.fwd.unit{block}", [block], ag_deps)
            counts["allgather"] += 1
            deps = [copy_out(f"{prefix}allgather.fwd.unit{block}", [block],
                             tuple(deps) + (ag[block],))]
        elif sharded and root_ag is not None:
            deps.append(root_ag)
        ids = add_ops(prog, list(ops), emit, after=deps, prefix=prefix)
        fwd_end[block] = last = ids[-1]
    # ---- backward
    bwd_end: dict[int, int] = {}
    border = [b for b, _ in groupby(bwd, key=lambda op: op.block)]
    rs_units: list[int] = []  # reduce-scatter task ids of units, in issue order
    for block, ops in groupby(bwd, key=lambda op: op.block):
        deps = [last] if last is not None else []
        if sharded and len(rs_units) >= 2:  # wait for the previous unit's reduce-scatter
            deps.append(rs_units[-2])
        if sharded and block in unit_set and options.reshard_after_forward:
            k = border.index(block)
            ahead = 2 if options.backward_prefetch else 1
            before = border[k - ahead] if k - ahead >= 0 else None
            ag_deps = (bwd_end[before],) if before in bwd_end else (fwd_end[order[-1]],)
            bag = gather(f"{prefix}allgather.bwd.unit{block}", [block], ag_deps)
            deps = [copy_out(f"{prefix}allgather.bwd.unit{block}", [block], (*deps, bag))]
            counts["allgather"] += 1
        op_end = -1
        for op in ops:
            op_end = emit(prog, op, tuple(deps), prefix)
            deps = [op_end]
        bwd_end[block] = last = op_end
        if sharded and block in unit_set:
            rs = reduce(f"{prefix}reducescatter.unit{block}", [block], (op_end,))
            if rs is not None:
                rs_units.append(rs)
                counts["reducescatter"] += 1
    if sharded and root:
        rs = reduce(f"{prefix}reducescatter.root", root, (last,) if last is not None else ())
        if rs is not None:
            rs_units.append(rs)
    if rs_units:
        last = prog.add("compute", as_compute_wait(prefix), (rs_units[-1], *all_reduces[-1:]))
    if accum > 1:
        last = repeat_unit(prog, first, accum - 1)
    scale = optimizer_scale / dp
    if off is not None:  # the optimizer runs on the host over this rank's shard
        shard = job.n_trainable * scale
        micro = dict(off.copied)  # every micro-step copies the same (replayed ones too)
        last = off.cpu_step(prog, shard, (last,) if last is not None else ())
        if not fetched:  # ZeRO-3 offload_optimizer: the updated partition goes back up
            last = off.copy(prog, "compute", "h2d.params", shard * param_bytes, False, (last,))
        prog.meta["offload"] = off.report(micro, accum)
    for op in job.optimizer_ops() if off is None else []:
        share = scale
        if expert_groups:  # a block's experts are sharded over the fewer ranks holding them
            total, trainable = _sizes(job, [op.block])[1], _expert_part(job, [op.block], 1)[2]
            if total:
                share = optimizer_scale * ((total - trainable) / dp + trainable / edp) / total
        last = prog.add("compute", as_compute(op, gpu, scale=share),
                        (last,) if last is not None else ())
    prog.meta["units"] = len(unit_list)
    if all_reduces:
        counts["allreduce"] = len(all_reduces)
    prog.meta["collectives"] = {op: n * accum for op, n in counts.items()}
    return prog


def as_compute_wait(prefix: str) -> Compute:
    """A zero-length marker: the compute stream waits for the last reduce-scatter."""
    return Compute(f"{prefix}wait_reduce_scatter", "other", 0.0)
