"""The bound `stepsim advise` prunes by after memory: the most tokens/s a configuration could
reach, from its compute alone (branch and bound: a configuration whose bound is below a run
already simulated cannot beat that run, so it is not simulated).

It assumes what the engine does: every rank runs its ops one after another at
``compute.op_time`` or slower (communication kernels slow compute, never speed it), a data-
parallel rank runs the whole ops of its micro-batch, a pipeline stage its share of them, a TP
rank its shard (strategies/tensor.py ``shard_ops``).
"""

from __future__ import annotations

import math
from dataclasses import replace

from simulator import api
from simulator.api import RunSpec
from simulator.memo import Memo
from simulator.strategies.steps import op_seconds
from simulator.strategies.tensor import shard_ops

# the strategies whose GPUs each run the whole ops of their micro-batch (or, in a pipeline,
# their stage's share of them), or with tensor parallelism each TP rank its shard of them
_WHOLE_OPS = ("ddp", "zero1", "zero2", "zero3", "fsdp")
_SHARDED_OPS = ("tp", "tp+ddp", "tp+fsdp")
# one micro-batch's bound per job and TP shard; an advice asks for 74 of them on one 8-GPU
# box, 293 on three, so 512 keep every one of a search while a long-lived process stays bounded
_BOUNDS: Memo[float] = Memo(limit=512)


def tokens_per_s_bound(spec: RunSpec) -> float:
    """The most tokens/s the box could reach under ``spec``: every GPU doing nothing but its
    share of each micro-batch's forward and backward (recompute included; a TP rank its shard,
    strategies/tensor.py), on the fastest of its cards: no communication, no optimizer step,
    no pipeline bubble, no host copies. The simulated run can only be slower
    (tests/test_advise.py checks it on every candidate); math.inf for a strategy it does not
    know."""
    if spec.strategy not in _WHOLE_OPS + _SHARDED_OPS:
        return math.inf
    key = work_key(spec)
    return _BOUNDS.get(key, lambda: _bound(key))


def work_key(spec: RunSpec) -> RunSpec:
    """The spec of one micro-batch's work: the same under every data-parallel flavour,
    accumulation and pipeline, only the job and the TP shard set it (specs with one key
    share a bound)."""
    n_gpus = api.load_machine(spec.topology, spec.gpus, nnodes=spec.nnodes).n_gpus
    tp = api.tp_degree(spec.strategy, spec.tp, n_gpus, spec.pp)
    return replace(spec, strategy="ddp", tp=tp, pp=1, schedule="1f1b", virtual_stages=1,
                   grad_accum=None, offload="none", pin_memory=None, bucket_mb=None,
                   zero_overlap_comm=None, reshard_after_forward=True)


def _bound(key: RunSpec) -> float:
    n_gpus, tp = api.load_machine(key.topology, key.gpus, nnodes=key.nnodes).n_gpus, key.tp or 1
    job = api.job_of(key)
    machine = api.load_machine(key.topology, key.gpus, nnodes=key.nnodes).for_job(
        job.name, job.software, precision=job.precision)
    fwd, bwd = job.forward_ops(), job.backward_ops()
    if tp > 1:  # sharded as the TP build shards them, so both share the shards' times
        fwd, bwd = (shard_ops(fwd, tp, key.sequence_parallel),
                    shard_ops(bwd, tp, key.sequence_parallel))
    work = min(sum(op_seconds(op, card) for op in fwd + bwd) for card in machine.cards())
    return n_gpus / tp * job.tokens_per_micro_batch / work
