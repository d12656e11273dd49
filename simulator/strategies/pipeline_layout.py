"""A pipeline's shape, without its programs: which ranks and which layers each stage has,
every rank's schedule steps (schedules.py) and the activations each stage holds in flight.
The memory verdict reads it; pipeline.py builds the programs on it.

- Placement, Megatron-LM's default order (tp innermost, then dp, then pp;
  megatron/core/parallel_state.py): stage r is the contiguous block of ranks
  ``[r * tp * dp, (r + 1) * tp * dp)``, TP groups are consecutive ranks inside it, DP groups
  the ranks with the same TP position. Boxes list GPUs by switch and socket, so neighbouring
  stages sit on neighbouring GPUs and a stage boundary crosses at most one slow link.
- Stages: the embedding on the first virtual stage, the final norm, head and loss on the last
  (as Megatron and torchtitan place them), the transformer layers split into contiguous runs
  that balance the stages' op time (what Megatron's --account-for-embedding-in-pipeline-split
  and torchtitan's input/output weights approximate by counting those modules as layers).
  The split balances the time on the first GPU's card: a mixed box's stages are split as if
  every card were that one.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate
from typing import TYPE_CHECKING, Any

from simulator.errors import InputError
from simulator.job.ops import Op
from simulator.strategies import schedules
from simulator.strategies.steps import op_seconds

if TYPE_CHECKING:
    from simulator.catalog.gpus import GPU
    from simulator.job.workload import Job
    from simulator.machine.topology import Machine
    from simulator.strategies.options import StrategyOptions


@dataclass(frozen=True)
class Layout:
    pp: int
    dp: int
    tp: int
    stages: tuple[tuple[int, ...], ...]  # ranks of each pipeline rank, TP position fastest

    def tp_groups(self, r: int) -> tuple[tuple[int, ...], ...]:
        ranks = self.stages[r]
        return tuple(ranks[k:k + self.tp] for k in range(0, len(ranks), self.tp))

    def dp_groups(self, r: int) -> tuple[tuple[int, ...], ...]:
        ranks = self.stages[r]
        return tuple(ranks[k::self.tp] for k in range(self.tp))


def layout(world: int, pp: int, tp: int) -> Layout:
    if pp < 1 or tp < 1 or world % (pp * tp):
        raise InputError(f"--pp {pp} x --tp {tp} does not divide the {world} GPUs")
    per_stage = world // pp
    return Layout(pp, per_stage // tp, tp, tuple(tuple(range(r * per_stage, (r + 1) * per_stage))
                                                 for r in range(pp)))


def split_blocks(job: Job, gpu: GPU, chunks: int, ops: list[Op] | None = None
                 ) -> list[list[int]]:
    """Job blocks of each virtual stage: contiguous layers balancing fwd + bwd op time, the
    embedding (block -1) on the first, the final norm and head (block L) on the last."""
    layers = job.n_blocks
    if chunks > layers:
        raise InputError(f"{chunks} pipeline model chunks (--pp x --virtual-stages) but the "
                         f"model has {layers} layers")
    cost: dict[int, float] = {}
    for op in ops if ops is not None else job.forward_ops() + job.backward_ops():
        # compute.op_time's float, from the kernel times kept per card (steps.py)
        cost[op.block] = cost.get(op.block, 0.0) + op_seconds(op, gpu)
    prefix = [0.0, *accumulate(cost.get(b, 0.0) for b in range(layers))]
    head, embed = cost.get(layers, 0.0), cost.get(-1, 0.0)

    def span(i: int, j: int, k: int) -> float:  # layers i..j-1 as virtual stage k
        return (prefix[j] - prefix[i] + (embed if k == 0 else 0.0)
                + (head if k == chunks - 1 else 0.0))

    # best[k][j]: the least possible slowest stage putting layers 0..j-1 on stages 0..k
    inf = float("inf")
    best = [[inf] * (layers + 1) for _ in range(chunks)]
    cut = [[0] * (layers + 1) for _ in range(chunks)]
    for j in range(1, layers + 1):
        best[0][j] = span(0, j, 0)
    for k in range(1, chunks):
        for j in range(k + 1, layers + 1):
            for i in range(k, j):
                value = max(best[k - 1][i], span(i, j, k))
                if value < best[k][j] - 1e-15:
                    best[k][j], cut[k][j] = value, i
    bounds = [layers]
    for k in range(chunks - 1, 0, -1):
        bounds.append(cut[k][bounds[-1]])
    bounds = [0, *reversed(bounds)]
    out = [list(range(bounds[k], bounds[k + 1])) for k in range(chunks)]
    extra = [b for b in job.blocks if b < 0 or b >= layers]
    out[0] = [b for b in extra if b < 0] + out[0]
    out[-1] += [b for b in extra if b >= layers]
    return out


def in_flight(steps: list[schedules.Step], layers: list[int], head_chunk: int | None
              ) -> tuple[int, int]:
    """(layer-micro-batches, head micro-batches) whose activations are alive at once, at
    most, for one rank's steps: a forward keeps its chunk's, its backward frees them."""
    alive = [0] * len(layers)
    most = most_head = 0
    for step in steps:
        if isinstance(step, schedules.Work):
            alive[step.chunk] += 1 if step.kind == "F" else -1
            most = max(most, sum(n * size for n, size in zip(alive, layers, strict=True)))
            if head_chunk is not None:
                most_head = max(most_head, alive[head_chunk])
    return most, most_head


@dataclass(frozen=True)
class PipelineShape:
    """A pipeline without its programs: ``meta`` (stages and their GPUs, layers, the
    closed-form bubble, each stage's activations in flight), every rank's steps, the layout."""

    meta: dict[str, Any]
    steps: list[list[schedules.Step]]
    layout: Layout


def describe(job: Job, machine: Machine, options: StrategyOptions,
             ops: tuple[list[Op], list[Op]] | None = None) -> PipelineShape:
    """The pipeline's shape (what `memory` needs, and what `build` builds on)."""
    if job.arch is None:
        raise InputError("pipeline parallelism needs a transformer `model`: the message "
                         "between stages is its micro-batch x sequence x hidden activation")
    p, v = options.pp, options.virtual_stages
    m = options.grad_accum or job.grad_accum
    ops = ops or (job.forward_ops(), job.backward_ops())
    steps = schedules.stage_steps(options.schedule, p, m, v)
    lay = layout(machine.n_gpus, p, options.tp or 1)
    if lay.tp > 1 and (job.heads % lay.tp or job.kv_heads % lay.tp):
        raise InputError(f"tensor-parallel size {lay.tp} must divide the {job.heads} heads "
                         f"and {job.kv_heads} KV heads")
    chunks = split_blocks(job, machine.gpu_of(0), p * v, ops[0] + ops[1])
    heads = [c for c, blocks in enumerate(chunks) if job.n_blocks in blocks]
    return PipelineShape({
        "stages": p, "schedule": options.schedule, "micro_batches": m, "virtual_stages": v,
        "stage_gpus": [list(s) for s in lay.stages],
        "layers": [[b for b in blocks if 0 <= b < job.n_blocks] for blocks in chunks],
        "blocks": chunks,
        "closed_form_bubble": schedules.bubble_closed_form(p, m, v),
        "in_flight": [in_flight(steps[r], [len([b for b in chunks[c * p + r]
                                                 if 0 <= b < job.n_blocks]) for c in range(v)],
                                (heads[0] - r) // p if heads and heads[0] % p == r else None)
                      for r in range(p)],
    }, steps, lay)
