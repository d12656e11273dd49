"""HSDP: FSDP inside each box, its gradient shards all-reduced across the boxes (PyTorch's
``HYBRID_SHARD``; FSDP2's ``fully_shard`` over a 2-D DeviceMesh (replicate, shard)).

Every box holds a full replica of the model sharded over its own GPUs: the per-unit all-gathers
and reduce-scatters of fsdp.py run over a box's GPUs (its fast links), and after each unit's
reduce-scatter its output, the rank's gradient shard, is all-reduced over the ranks of the same
local rank in every box: 1/g of the gradient per GPU crosses the network, once, where FSDP over
all GPUs would all-gather the parameters twice and reduce-scatter the gradients across it
(torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py foreach_reduce: the all-reduce on
``all_reduce_stream`` after ``reduce_scatter_stream``; FSDP1 ``_post_backward_hook`` the same
over ``_inter_node_pg``). Memory: FSDP's over one box (api/verdict.py). On one box it is FSDP.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from simulator.strategies import fsdp

if TYPE_CHECKING:
    from simulator.engine.program import Program
    from simulator.job.workload import Job
    from simulator.machine.topology import Machine
    from simulator.strategies.options import StrategyOptions


def mesh(machine: Machine) -> tuple[tuple[tuple[int, ...], ...], tuple[tuple[int, ...], ...]]:
    """(shard groups: each box's GPUs; replicate groups: one local rank across the boxes)."""
    g = machine.gpus_per_box
    shards = tuple(tuple(range(b * g, (b + 1) * g)) for b in range(machine.nnodes))
    replicas = tuple(tuple(b * g + k for b in range(machine.nnodes)) for k in range(g))
    return shards, replicas


def build(job: Job, machine: Machine, options: StrategyOptions) -> Program:
    shards, replicas = mesh(machine)
    prog = fsdp.build(job, machine, options, groups=shards, replicas=replicas)
    prog.meta["strategy"] = "hsdp"
    prog.meta["dp"] = machine.n_gpus  # every GPU takes its own micro-batch
    prog.meta["shard"] = len(shards[0])
    prog.meta["replicas"] = len(replicas[0])
    return prog
