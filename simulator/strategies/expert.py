"""Expert parallelism (``--ep K``): a mixture of experts' experts spread over K ranks, beside
FSDP or ZeRO-3 for the rest of the model.

Layout, as Megatron-Core and torchtitan build it: the ranks are split into EP groups of K
consecutive ranks (``expert_model_parallel_size``; torchtitan's ``ep`` mesh dimension), each
rank holding experts / K of every MoE block's experts; the ranks holding the same experts (one
per EP group, strided by K) form the expert-data-parallel group, over which those experts are
sharded, gathered and their gradients reduced (Megatron ``expert_data_parallel_group``,
torchtitan's ``dp_shard_mod_ep``). The rest of the model is sharded over every rank.

Per MoE block and micro-batch, around the experts (Megatron's
``MoEAlltoAllTokenDispatcher``: ``token_permutation`` / ``token_unpermutation``; torchtitan
``ExpertParallel._token_dispatch`` / ``_token_combine``):
- forward: after ``dispatch`` (the local permutation) an all-to-all sends each token's k rows
  to the ranks holding their experts; after ``experts`` a second sends the results back;
- backward: the combine's gradient goes out by all-to-all before the experts' backward, and
  the experts' input gradients come back by all-to-all before the dispatch's;
- a recomputed block (activation checkpointing) runs its forward all-to-alls again.

Each all-to-all carries a rank's routed rows, tokens x k x hidden in the activation dtype; with
``expert_imbalance`` > 1 every pair carries the busiest rank's share (job/moe.py rank_load),
the step waiting for the rank that receives most. The all-to-all is on the critical path (the
next op needs its rows), on a stream of its own ("ep") so the timeline shows it. Tensor
parallelism inside the experts, pipelines and DDP / ZeRO-1/2 with EP are not modelled.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from simulator.engine.program import Comm, Program
from simulator.errors import InputError
from simulator.job import moe
from simulator.strategies import fsdp
from simulator.strategies.steps import Emit, compute_only

if TYPE_CHECKING:
    from simulator.job.ops import Op
    from simulator.job.workload import Job
    from simulator.machine.topology import Machine
    from simulator.strategies.options import StrategyOptions

STRATEGIES = ("fsdp", "zero3")  # the data parallelism EP runs beside


def ep_groups(world: int, ep: int) -> tuple[tuple[int, ...], ...]:
    """Consecutive ranks exchange tokens (Megatron's rank order: EP innermost)."""
    return tuple(tuple(range(g, g + ep)) for g in range(0, world, ep))


def expert_dp_groups(world: int, ep: int) -> tuple[tuple[int, ...], ...]:
    """The ranks holding the same experts: one of each EP group."""
    return tuple(tuple(range(i, world, ep)) for i in range(ep))


def check(name: str, job: Job, world: int, *, tp: int = 1, pp: int = 1) -> None:
    ep = job.ep
    if ep <= 1:
        return
    if name not in STRATEGIES:
        raise InputError(f"--ep {ep} with -s {name}: expert parallelism is modelled beside "
                         f"{' or '.join(STRATEGIES)} (the experts sharded over their "
                         "expert-data-parallel group, the rest over every rank)")
    if world % ep:
        raise InputError(f"--ep {ep} must divide the {world} GPUs")
    if tp > 1 or pp > 1:
        raise InputError(f"--ep {ep} with --{'tp' if tp > 1 else 'pp'}: expert parallelism "
                         "is modelled with data parallelism only")


def alltoall_bytes(job: Job) -> int:
    """What one rank sends in one all-to-all: its routed rows (the busiest rank's share)."""
    a = job.arch
    assert a is not None and a.moe is not None
    load = moe.rank_load(a.moe, job.ep, job.training.expert_imbalance)
    return int(job.tokens_per_micro_batch * a.moe.top_k * a.hidden * job.activation_bytes
               * load)


def emitter(inner: Emit, job: Job, groups: tuple[tuple[int, ...], ...]) -> Emit:
    """``inner``, with the all-to-alls after the MoE ops that hand rows to another rank."""
    nbytes = alltoall_bytes(job)
    sends = {"forward": ("dispatch", "experts"), "recompute": ("dispatch", "experts"),
             "backward": ("combine", "experts")}

    def emit(prog: Program, op: Op, deps: tuple[int, ...], prefix: str) -> int:
        done = inner(prog, op, deps, prefix)
        kind = op.name.rsplit(".", 1)[-1]
        if kind not in sends.get(op.phase, ()):
            return done
        toward = "to the experts" if (kind == "dispatch") == (op.phase != "backward") \
            else "back from the experts"
        return prog.add("ep", Comm(f"{prefix}{op.name}.{op.phase}.alltoall", "alltoall",
                                   nbytes, groups, {"rows": toward, "block": op.block}),
                        (done,))
    return emit


def build(name: str, job: Job, machine: Machine, options: StrategyOptions) -> Program:
    """One step with the experts over ``job.ep`` ranks and ``name`` (fsdp, zero3) beside."""
    world = machine.n_gpus
    check(name, job, world, tp=options.tp or 1, pp=options.pp)
    emit = emitter(compute_only(machine.gpu), job, ep_groups(world, job.ep))
    edp = expert_dp_groups(world, job.ep)
    if name == "zero3":
        prog = fsdp.build(job, machine, options, emit=emit, expert_groups=edp,
                          reduce_bytes=4 if job.precision == "fp32" else 2,
                          framework="deepspeed")
        prog.meta["strategy"] = "zero3"
    else:
        prog = fsdp.build(job, machine, options, emit=emit, expert_groups=edp)
    prog.meta["ep"] = job.ep
    return prog
