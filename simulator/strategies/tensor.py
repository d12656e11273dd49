"""Megatron-LM tensor parallelism, alone or under data parallelism (TP x DDP, TP x FSDP).

From Shoeybi et al. 2019 (arXiv:1909.08053) and Megatron-LM
``megatron/core/tensor_parallel/{layers,mappings}.py`` (domain-model 5.1):

- Attention and MLP are each ColumnParallelLinear -> local op -> RowParallelLinear. The row
  layer's output is all-reduced in forward (``g``), the column layer's input gradient in
  backward (``f``): two all-reduces of b*s*h activations per layer each way, on the critical
  path (the next op waits). Activation recomputation repeats the forward ones.
- VocabParallelEmbedding all-reduces its output in forward; the vocab-parallel lm_head
  all-reduces its input gradient in backward. (The three b*s-float all-reduces of the
  vocab-parallel cross-entropy are left out: kilobytes.)
- Sequence parallelism (Korthikanti et al. 2022): each ``g`` becomes a reduce-scatter in
  forward and an all-gather in backward, each ``f`` an all-gather in forward and a
  reduce-scatter in backward; same bytes. Norms then run on s/t tokens.
- Backward of a ColumnParallelLinear under sequence parallelism follows Megatron's
  ``LinearWithGradAccumulationAndAsyncCommunication.backward``: forward kept only the s/t
  input, so it first issues an asynchronous all-gather of that input (b*s*h) on the TP
  stream, runs the input-gradient GEMM meanwhile, waits for the gather, launches the
  input-gradient reduce-scatter asynchronously and runs the weight-gradient GEMM beside it;
  the next op waits for both. (Megatron relies on CUDA_DEVICE_MAX_CONNECTIONS=1 so the
  gather is scheduled before the GEMM; the TP stream's order stands for that.)
- Compute per GPU: every GEMM, the attention core and the vocab-parallel ops are split t ways
  (heads / columns / rows); norms and residual adds are replicated unless sequence-parallel.

Placement: TP groups take the fastest links (NVLink, then one PCIe switch, ...): each group
grows from its lowest free rank by NCCL path type (``machine.path_type``); data-parallel
groups take one rank of each TP group. A TP collective lists all groups, which run at once.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from simulator.engine.program import Comm, Program
from simulator.errors import InputError
from simulator.job.ops import Kernel, Op
from simulator.job.workload import Job
from simulator.memo import IdentityMemo
from simulator.strategies import ddp, fsdp
from simulator.strategies.options import check_tp_groups
from simulator.strategies.steps import Emit, as_compute

if TYPE_CHECKING:
    from simulator.machine.topology import Machine
    from simulator.strategies.options import StrategyOptions

REPLICATED = ("attn_norm", "mlp_norm", "final_norm")  # LayerNorm/RMSNorm: whole hidden
ROW_OUTPUT = ("attn_out", "mlp_out")  # RowParallelLinear: g after forward
COLUMN_INPUT = ("qkv", "mlp_in")  # ColumnParallelLinear: f, its input gradient in backward


def place_groups(machine: Machine, tp: int) -> tuple[tuple[tuple[int, ...], ...],
                                                     tuple[tuple[int, ...], ...]]:
    """(TP groups, DP groups): TP groups on the fastest paths, DP groups across them."""
    n = machine.n_gpus
    if tp < 1 or n % tp:
        raise InputError(f"tensor-parallel size {tp} does not divide {n} GPUs")
    free = list(range(n))
    rank_of = {node: r for r, node in enumerate(machine.gpu_nodes)}
    tp_groups: list[tuple[int, ...]] = []
    while free:
        head = free[0]
        closest: list[int] = []  # by path type, then rank: one sweep from the head (paths.py)
        for _, nodes in machine.paths.nearest(machine.gpu_nodes[head],
                                              [machine.gpu_nodes[j] for j in free[1:]]):
            closest += [rank_of[node] for node in nodes]
            if len(closest) >= tp - 1:
                break
        group = tuple(sorted([head, *closest[:tp - 1]]))
        tp_groups.append(group)
        chosen = set(group)
        free = [r for r in free if r not in chosen]
    dp_groups = tuple(tuple(g[k] for g in tp_groups) for k in range(tp))
    return tuple(tp_groups), dp_groups


def _split(k: Kernel, t: int) -> Kernel:
    """One rank's share of a kernel; a GEMM loses its split dimension (columns or rows)."""
    shape = k.shape
    if shape is not None:
        m, n, kk = shape
        shape = (m, max(1, n // t), kk) if n >= kk else (m, n, max(1, kk // t))
    return replace(k, flops=k.flops / t, bytes=k.bytes / t, shape=shape)


def _role(op: Op) -> str:
    return op.name.rsplit(".", 1)[-1]


# A range's re-runs and a sweep's points shard the same job's ops: made once, the shards are
# the same Op objects, so their kernel times stay cached (steps.py) across builds. A shard
# entry keeps two whole op lists of a job alive: few are kept.
_SHARDS: IdentityMemo[list[Op]] = IdentityMemo(32)
_GRAD_SPLITS: IdentityMemo[tuple[Op, Op] | None] = IdentityMemo(16_384)


def shard_ops(ops: list[Op], t: int, sequence_parallel: bool) -> list[Op]:
    """One TP rank's share of ``ops`` (the same Op objects for the same ops)."""
    def make() -> list[Op]:
        out = []
        shares: dict[int, Kernel] = {}  # the blocks share kernels: each is split once

        def share(k: Kernel) -> Kernel:
            if id(k) not in shares:
                shares[id(k)] = _split(k, t)
            return shares[id(k)]
        # an op's kernel tuple -> the shard of an op of it (the blocks share their tuples)
        shards: dict[tuple[int, bool], Op] = {}
        for op in ops:
            keep = _role(op) in REPLICATED and not sequence_parallel
            like = shards.get((id(op.kernels), keep))
            if like is None:
                kernels = list(op.kernels) if keep else [share(k) for k in op.kernels]
                like = shards[id(op.kernels), keep] = Op.of(op.name, op.block, op.phase, kernels)
            out.append(like.relabelled(op.name, op.block, op.phase, op.grads))
        return out
    return list(_SHARDS.get(tuple(ops), (t, sequence_parallel), make))


def _split_weight_grad(op: Op) -> tuple[Op, Op] | None:
    """(input-gradient part, weight-gradient GEMMs) of a backward op; None without dW."""
    def make() -> tuple[Op, Op] | None:
        dw = [k for k in op.kernels if k.weight_grad]
        if not dw:
            return None
        rest = [k for k in op.kernels if not k.weight_grad]
        return (Op.of(f"{op.name}.input_grad", op.block, op.phase, rest),
                Op.of(f"{op.name}.weight_grad", op.block, op.phase, dw, op.grads))
    return _GRAD_SPLITS.get((op,), None, make)


def tp_emitter(job: Job, machine: Machine, groups: tuple[tuple[int, ...], ...],
               sequence_parallel: bool, counts: dict[str, int]) -> Emit:
    """Adds each op on the compute stream with its Megatron collectives around it."""
    gpu = machine.gpu
    nbytes = job.micro_batch * job.seq_len * job.hidden * job.activation_bytes  # b*s*h

    def comm(prog: Program, op: str, name: str, deps: tuple[int, ...]) -> int:
        counts[op] = counts.get(op, 0) + 1
        return prog.add("tp", Comm(name, op, nbytes, groups), deps)  # type: ignore[arg-type]

    def column_backward(prog: Program, input_grad: Op, weight_grad: Op, name: str,
                        deps: tuple[int, ...], prefix: str) -> int:
        """Megatron's overlapped SP backward of a ColumnParallelLinear (module docstring)."""
        gather = comm(prog, "allgather", f"{name}.input_allgather", deps)
        dgrad = prog.add("compute", as_compute(input_grad, gpu, prefix=prefix), deps)
        # the TP stream runs the scatter after the gather, as Megatron waits for it first
        scatter = comm(prog, "reducescatter", f"{name}.reducescatter", (dgrad,))
        prog.add("compute", as_compute(weight_grad, gpu, prefix=prefix), (dgrad, gather))
        return scatter  # the next op follows the weight-gradient GEMM on the compute stream

    def emit(prog: Program, op: Op, deps: tuple[int, ...], prefix: str) -> int:
        role, forwardish = _role(op), op.phase in ("forward", "recompute")
        name = f"{prefix}{op.name}.{op.phase}"
        before = after = None  # the collective's kind, before or after the op
        if forwardish and role in COLUMN_INPUT and sequence_parallel:
            before = "allgather"  # f: gather the sequence-split input
        if forwardish and (role in ROW_OUTPUT or role == "embedding"):
            after = "reducescatter" if sequence_parallel else "allreduce"  # g
        if op.phase == "backward" and role in ROW_OUTPUT and sequence_parallel:
            before = "allgather"  # g backward: gather the output gradient
        if op.phase == "backward" and (role in COLUMN_INPUT or role == "lm_head"):
            after = "reducescatter" if sequence_parallel else "allreduce"  # f backward
        if op.phase == "backward" and role in COLUMN_INPUT and sequence_parallel:
            split = _split_weight_grad(op)
            if split is not None:
                return column_backward(prog, *split, name, deps, prefix)
        if before:
            deps = (comm(prog, before, f"{name}.{before}", deps),)
        last = prog.add("compute", as_compute(op, gpu, prefix=prefix), deps)
        if after:
            last = comm(prog, after, f"{name}.{after}", (last,))
        return last

    return emit


def build(job: Job, machine: Machine, options: StrategyOptions, *,
          data_parallel: str | None) -> Program:
    """TP alone (``tp``: all GPUs in one group unless --tp), or TP x DDP / TP x FSDP."""
    if job.arch is None:
        raise InputError("tensor parallelism needs a transformer `model`")
    world = machine.n_gpus
    tp = options.tp or (world if data_parallel is None else min(2, world))
    if tp > world or world % tp:
        raise InputError(f"tensor-parallel size {tp} must divide the {world} GPUs")
    if job.heads % tp or job.kv_heads % tp:
        raise InputError(f"tensor-parallel size {tp} must divide the {job.heads} heads and "
                         f"{job.kv_heads} KV heads")
    tp_groups, dp_groups = place_groups(machine, tp)
    check_tp_groups(tp_groups, machine.box_of, options.allow_tp_across_nodes, machine.name)
    sp = options.sequence_parallel and tp > 1
    counts: dict[str, int] = {}
    emit = tp_emitter(job, machine, tp_groups, sp, counts) if tp > 1 else None
    fwd = shard_ops(job.forward_ops(), tp, sp)
    bwd = shard_ops(job.backward_ops(), tp, sp)
    name = "tp" + (f"+{data_parallel}" if data_parallel else "")
    prog = Program(world=world, meta={"strategy": name, "tp": tp, "dp": len(dp_groups[0]),
                                      "tp_groups": [list(g) for g in tp_groups],
                                      "dp_groups": [list(g) for g in dp_groups]})
    if data_parallel == "fsdp" and len(dp_groups[0]) > 1:
        fsdp.build(job, machine, options, groups=dp_groups, program=prog, forward=fwd,
                   backward=bwd, shard_numel=1.0 / tp, optimizer_scale=1.0 / tp, emit=emit)
    else:  # DDP over the DP groups (one rank each: no DDP wrapper)
        ddp.build(job, machine, replace(options, dp_groups=dp_groups), program=prog,
                  forward=fwd, backward=bwd, tp=tp, emit=emit)
    prog.meta["tp_collectives"] = counts
    return prog
