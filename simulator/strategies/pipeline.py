"""Pipeline parallelism: the model's layers in stages on groups of GPUs, micro-batches through
a schedule (schedules.py), activations and their gradients sent between neighbouring stages,
and data parallelism (DDP, ZeRO-1, FSDP) and tensor parallelism inside every stage.

- Placement and stages (which ranks and which layers each stage has, every rank's schedule
  steps) are the pipeline's shape, in pipeline_layout.py; this module builds its programs.
- Messages: micro-batch x sequence x hidden activations (divided by tp under sequence
  parallelism), one per TP position, each from a rank to the same position of the next
  stage (Megatron's p2p_communication sends each TP rank's copy).
- Data parallelism over each stage's replicas: gradients are reduced after the last
  micro-batch's backward of each model chunk (no_sync before it): DDP buckets as PyTorch
  builds them, all-reduced as they fill; ZeRO-1 (Megatron's distributed optimizer, DeepSpeed's
  pipeline engine) reduce-scatters after backward and all-gathers the updated parameters;
  FSDP keeps each unit unsharded through the step (torchtitan sets reshard_after_forward=False
  under pipeline parallelism) and reduce-scatters after the unit's last backward.
  DeepSpeed refuses ZeRO-2 and ZeRO-3 with pipeline parallelism; so does this module.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from simulator.engine.program import Comm, Compute, Program, SendRecv, Transfer
from simulator.errors import InputError
from simulator.job.ops import Op
from simulator.strategies import buckets as ddp_buckets
from simulator.strategies import schedules, tensor
from simulator.strategies.options import check_tp_groups
from simulator.strategies.pipeline_layout import Layout, describe
from simulator.strategies.steps import as_compute, compute_only, memory_pass
from simulator.strategies.zero import REDUCE_BUCKET_ELEMENTS

if TYPE_CHECKING:
    from simulator.job.workload import Job
    from simulator.machine.topology import Machine
    from simulator.strategies.options import StrategyOptions

DATA_PARALLEL = ("ddp", "zero1", "fsdp")
# A schedule interleaves its micro-batches, so each one is simulated (they cannot be replayed
# like no_sync micro-steps). Measured on the 2-core reference machine (Llama 2 70B, 8 stages,
# 77 micro-batches: 99,176 op executions): 3.0 s with --no-ranges, 10.9 s with the range
# re-runs; so 100,000 op executions keep a run near 10 s (that 70B model on 8 stages fits up
# to 77 micro-batches, about ten per stage).
MAX_OP_EXECUTIONS = 100_000


class _Stage:
    """The program of one stage (one kind of card): its chunks' ops and its messages."""

    def __init__(self, job: Job, machine: Machine, options: StrategyOptions, lay: Layout,
                 r: int, ranks: tuple[int, ...], chunks: list[list[int]], name: str,
                 ops: tuple[list[Op], list[Op]]) -> None:
        self.job, self.options, self.lay, self.r, self.name = job, options, lay, r, name
        self.ranks = ranks
        self.positions = [lay.stages[r].index(x) for x in ranks]
        self.gpu = machine.gpu_of(ranks[0])
        self.program = Program(world=machine.n_gpus, ranks=ranks)
        sp = options.sequence_parallel and lay.tp > 1
        self.counts: dict[str, int] = {}
        if lay.tp > 1:  # stages fill box by box (ranks do): a TP group stays in one if it can
            check_tp_groups(lay.tp_groups(r), machine.box_of, options.allow_tp_across_nodes,
                            machine.name)
        self.emit = (tensor.tp_emitter(job, machine.as_if_every_gpu(self.gpu), lay.tp_groups(r),
                                       sp, self.counts) if lay.tp > 1
                     else compute_only(self.gpu))
        mine = [chunks[c * lay.pp + r] for c in range(len(chunks) // lay.pp)]
        fwd, bwd = ops
        if lay.tp > 1:
            fwd, bwd = tensor.shard_ops(fwd, lay.tp, sp), tensor.shard_ops(bwd, lay.tp, sp)
        self.blocks = mine
        chunk_blocks = [set(b) for b in mine]
        self.fwd = [[op for op in fwd if op.block in s] for s in chunk_blocks]
        self.bwd = [[op for op in bwd if op.block in s] for s in chunk_blocks]
        act = job.micro_batch * job.seq_len * job.hidden * job.activation_bytes
        self.message_bytes = act // lay.tp if sp else act

    def transfers(self, messages: list[schedules.Message]) -> tuple[Transfer, ...]:
        """One transfer per TP position this program stands for (pairs keep positions)."""
        out = []
        p = self.lay.pp
        for kind, micro, s in messages:
            src_stage = s % p
            dst_stage = (src_stage + (1 if kind == "act" else -1)) % p
            for j in self.positions:
                src, dst = self.lay.stages[src_stage][j], self.lay.stages[dst_stage][j]
                out.append(Transfer(f"{kind}.{micro}.{s}.{j}", ((src, dst),),
                                    self.message_bytes))
        return tuple(out)

    def comm(self, stream: str, work: Comm, deps: tuple[int, ...]) -> int:
        keyed = Comm(work.name, work.op, work.nbytes, work.groups, work.args,
                     key=f"stage{self.r}.{work.name}")
        return self.program.add(stream, keyed, deps)


def build(job: Job, machine: Machine, options: StrategyOptions, *, data_parallel: str
          ) -> list[Program]:
    """Every stage's program; ``data_parallel`` is ddp, zero1 or fsdp over each stage."""
    if data_parallel not in DATA_PARALLEL:
        raise InputError(f"-s {data_parallel} with --pp: DeepSpeed refuses ZeRO-2 and ZeRO-3 "
                         "with pipeline parallelism; use ddp, zero1, fsdp (or tp+ddp, tp+fsdp)")
    m = options.grad_accum or job.grad_accum
    ops = (job.forward_ops(), job.backward_ops())
    executions = m * (len(ops[0]) + len(ops[1]))
    if executions > MAX_OP_EXECUTIONS:
        raise InputError(f"--grad-accum {m:,} with --pp: a pipeline schedule interleaves its "
                         f"micro-batches, so each is simulated: {executions:,} op executions, "
                         f"at most {MAX_OP_EXECUTIONS:,} (fewer micro-batches)")
    shape = describe(job, machine, options, ops)
    steps, lay, chunks = shape.steps, shape.layout, shape.meta["blocks"]
    received = schedules.received(steps, lay.pp)
    programs = []
    for r in range(lay.pp):
        by_card: dict[object, list[int]] = {}
        for rank in lay.stages[r]:
            by_card.setdefault(machine.gpu_of(rank), []).append(rank)
        for ranks in by_card.values():
            stage = _Stage(job, machine, options, lay, r, tuple(ranks), chunks, data_parallel,
                           ops)
            _schedule(stage, steps[r], received[r])
            programs.append(stage.program)
    meta = programs[0].meta
    meta.update(strategy=("tp+" if lay.tp > 1 else "") + f"{data_parallel}+pp", dp=lay.dp,
                tp=lay.tp, pp=lay.pp, pipeline=shape.meta)
    return programs


def _schedule(stage: _Stage, steps: list[schedules.Step],
              received: list[list[schedules.Message]]) -> None:
    """The stage's compute and p2p tasks in schedule order, then its gradient sync."""
    prog = stage.program
    last_backward = {w.chunk: k for k, w in enumerate(steps)
                     if isinstance(w, schedules.Work) and w.kind == "B"}
    first_forward: dict[int, int] = {}
    for k, w in enumerate(steps):
        if isinstance(w, schedules.Work) and w.kind == "F":
            first_forward.setdefault(w.chunk, k)
    gathers: dict[int, int] = {}  # FSDP: unit block -> its all-gather task
    compute_end: int | None = None
    waits: list[int] = []  # p2p tasks the next compute waits for
    in_flight: list[int] = []  # unwaited sends (GPipe isend), waited before the backwards
    reduces: list[int] = []
    calls = iter(received)
    for k, step in enumerate(steps):
        if isinstance(step, schedules.Call):
            got = next(calls)
            deps = tuple(d for d in (compute_end,) if d is not None)
            # blocking calls (Megatron) on one stream; torch's unwaited isends on their own
            task = prog.add("p2p" if step.waited else "p2p.send",
                            SendRecv(_call_name(step.sends, got),
                                     stage.transfers(list(step.sends)), stage.transfers(got)),
                            deps)
            (waits if step.waited else in_flight).append(task)
            continue
        prefix = f"micro{step.micro}." + (f"chunk{step.chunk}." if stage.options.virtual_stages
                                           > 1 else "")
        after = [*waits, *([compute_end] if compute_end is not None else [])]
        if step.kind == "B" and in_flight and not any(
                isinstance(s, schedules.Work) and s.kind == "B" for s in steps[:k]):
            after += in_flight[-1:]  # GPipe: forward sends done before the backwards
        waits = []
        if step.kind == "F":
            if k == first_forward.get(step.chunk) and stage.name == "fsdp" and stage.lay.dp > 1:
                gathers.update(_gather_chunk(stage, step.chunk, tuple(after)))
            ops = stage.fwd[step.chunk]
            compute_end = _ops(stage, ops, after, prefix, gathers)
        elif k == last_backward[step.chunk] and stage.lay.dp > 1:
            compute_end, more = _last_backward(stage, step.chunk, after, prefix)
            reduces += more
        else:
            compute_end = _ops(stage, stage.bwd[step.chunk], after, prefix, gathers)
    end = [*waits, *in_flight[-1:], *([compute_end] if compute_end is not None else [])]
    _optimizer(stage, tuple(end), reduces)


def _call_name(sends: tuple[schedules.Message, ...], got: list[schedules.Message]) -> str:
    words = [f"send {k} mb{i}" for k, i, _ in sends] + [f"recv {k} mb{i}" for k, i, _ in got]
    return ", ".join(words) or "p2p"


def _ops(stage: _Stage, ops: list[Op], after: list[int], prefix: str,
         gathers: dict[int, int]) -> int:
    last = -1
    deps = list(after)
    for op in ops:
        if op.block in gathers:
            deps.append(gathers[op.block])
        last = stage.emit(stage.program, op, tuple(deps), prefix)
        deps = [last]
    return last


def _gather_chunk(stage: _Stage, c: int, deps: tuple[int, ...]) -> dict[int, int]:
    """FSDP: every unit of chunk c all-gathered before its first forward, kept unsharded."""
    out = {}
    param_bytes = 4 if stage.job.precision == "fp32" else 2
    for block in stage.blocks[c]:
        numel = sum(stage.job.params[i].numel for i in stage.job.block_params(block))
        out[block] = stage.comm("allgather", Comm(
            f"allgather.unit{block}", "allgather", int(numel / stage.lay.tp * param_bytes),
            stage.lay.dp_groups(stage.r), {"unit": block}), deps)
    return out


def _last_backward(stage: _Stage, c: int, after: list[int], prefix: str
                   ) -> tuple[int, list[int]]:
    """The chunk's last backward, reducing its gradients as they are ready (DDP: bucket
    all-reduces; FSDP: a reduce-scatter per unit); ZeRO-1 reduces after (in _optimizer)."""
    job, prog, groups = stage.job, stage.program, stage.lay.dp_groups(stage.r)
    ops = stage.bwd[c]
    if stage.name == "zero1":
        return _ops(stage, ops, after, prefix, {}), []
    reduces: list[int] = []
    blocks = set(stage.blocks[c])
    trainable = [i for i, q in enumerate(job.params) if q.trainable and q.block in blocks]
    if stage.name == "fsdp":
        last = -1
        deps = list(after)
        final = {op.block: k for k, op in enumerate(ops)}  # a unit's gradients are done
        for k, op in enumerate(ops):
            last = stage.emit(prog, op, tuple(deps), prefix)
            deps = [last]
            for b in ([op.block] if final[op.block] == k else []):
                numel = sum(job.params[i].numel for i in job.block_params(b)
                            if job.params[i].trainable)
                if numel:
                    reduces.append(stage.comm("reducescatter", Comm(
                        f"reducescatter.unit{b}", "reducescatter", int(numel / stage.lay.tp * 4),
                        groups, {"unit": b}), (last,)))
        return last, reduces
    tensors = [ddp_buckets.GradTensor(job.params[i].name, _local(job, i, stage.lay.tp), 4,
                                      "fp32") for i in trainable]
    index = {i: k for k, i in enumerate(trainable)}
    order = [index[i] for op in ops if op.phase == "backward" for i in op.grads if i in index]
    claimed = set(order)
    order += [k for k in reversed(range(len(tensors))) if k not in claimed]
    plan = ddp_buckets.bucket_plan(tensors, stage.options.bucket_mb, order)
    bucket_of = {trainable[k]: b for b, bucket in enumerate(plan) for k in bucket.indices}
    pending = [set(b.indices) for b in plan]
    last = -1
    deps = list(after)
    for op in ops:
        last = stage.emit(prog, op, tuple(deps), prefix)
        grads = [i for i in op.grads if i in bucket_of]
        if grads:  # DDP's autograd hook: copy into the bucket and pre-divide (ddp.py)
            nbytes = 16 * sum(_local(job, i, stage.lay.tp) for i in grads)
            last = prog.add("compute", memory_pass(f"{prefix}{op.name}.ddp_hook", nbytes,
                                                   stage.gpu, op.block), (last,))
        deps = [last]
        for i in grads:
            b = bucket_of[i]
            pending[b].discard(index[i])
            if not pending[b]:
                reduces.append(stage.comm("nccl", Comm(
                    f"allreduce.chunk{c}.bucket{b}", "allreduce", plan[b].numel * 4, groups,
                    {"bucket": b, "tensors": plan[b].tensors}), (last,)))
    return last, reduces


def _local(job: Job, i: int, tp: int) -> int:
    param = job.params[i]
    return param.numel // tp if len(param.shape) >= 2 else param.numel


def _optimizer(stage: _Stage, after: tuple[int, ...], reduces: list[int]) -> None:
    """ZeRO-1's reduce-scatter, the optimizer over this rank's share, ZeRO-1's all-gather."""
    job, lay, prog = stage.job, stage.lay, stage.program
    groups = lay.dp_groups(stage.r)
    blocks = {b for chunk in stage.blocks for b in chunk}
    last = prog.add("compute", Compute("wait_gradients", "other", 0.0),
                    tuple(after) + tuple(reduces))
    numel = sum(_local(job, i, lay.tp) for i, q in enumerate(job.params)
                if q.trainable and q.block in blocks)
    grad_bytes = 4 if job.precision == "fp32" else 2
    if stage.name == "zero1" and lay.dp > 1:
        cap = stage.options.reduce_bucket_size or REDUCE_BUCKET_ELEMENTS
        for k in range(max(1, -(-numel // cap))):
            size = min(cap, numel - k * cap)
            last = stage.comm("nccl", Comm(f"reducescatter.bucket{k}", "reducescatter",
                                           size * grad_bytes, groups), (last,))
    shard = 1.0 if stage.name == "ddp" else 1.0 / lay.dp
    for op in job.optimizer_ops():
        if op.block in blocks:
            last = prog.add("compute", as_compute(op, stage.gpu, scale=shard / lay.tp), (last,))
    if stage.name == "zero1" and lay.dp > 1:
        stage.comm("nccl", Comm("allgather.params", "allgather", numel * grad_bytes, groups),
                   (last,))
