"""Parallelism strategies: job + machine + options -> per-rank `Program`s for the engine.

``build(name, job, machine, options)`` with name one of ``STRATEGIES``:
ddp (ddp.py), zero1 / zero2 (zero.py), fsdp and zero3 (fsdp.py), hsdp (hsdp.py: FSDP inside each
box, replicas across boxes), tp, tp+ddp, tp+fsdp (tensor.py);
with ``options.pp`` > 1 the strategy runs inside each stage of a pipeline (pipeline.py).
It returns one program per group of identical ranks: symmetric data parallelism is one.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from simulator.errors import InputError, quoted
from simulator.strategies.options import STRATEGIES, Options, StrategyOptions

__all__ = ["STRATEGIES", "Options", "StrategyOptions", "build", "pipeline_shape"]

if TYPE_CHECKING:
    from simulator.engine.program import Program
    from simulator.job.workload import Job
    from simulator.machine.topology import Machine
    from simulator.strategies.pipeline_layout import PipelineShape

def build(name: str, job: Job, machine: Machine, options: StrategyOptions | None = None
          ) -> list[Program]:
    """The programs of one training step of ``job`` on ``machine`` with strategy ``name``:
    one per group of identical ranks (per kind of card on a mixed box)."""
    opts = options or StrategyOptions()
    if job.ep > 1:  # expert parallelism beside FSDP / ZeRO-3 (expert.py)
        from simulator.strategies import expert

        expert.check(name, job, machine.n_gpus, tp=opts.tp or 1, pp=opts.pp)
    if opts.pp > 1:
        from simulator.strategies import pipeline

        return pipeline.build(job, machine, _pipeline_options(name, machine, opts),
                              data_parallel=_inner(name))
    cards = machine.cards()
    if len(cards) == 1:
        return [_build_one(name, job, machine, opts)]
    programs = []
    for card, ranks in cards.items():  # the same program shape, timed on each card
        program = _build_one(name, job, machine.as_if_every_gpu(card), replace(opts, ranks=ranks))
        program.ranks = ranks
        programs.append(program)
    return programs


def _inner(name: str) -> str:
    """The data-parallel scheme inside each pipeline stage."""
    if name not in STRATEGIES:
        raise InputError(f"unknown strategy {quoted(name)}; choose from {', '.join(STRATEGIES)}")
    return {"tp": "ddp", "tp+ddp": "ddp", "tp+fsdp": "fsdp"}.get(name, name)


def _pipeline_options(name: str, machine: Machine, opts: StrategyOptions) -> StrategyOptions:
    """TP inside each stage: --tp, else all of a stage's GPUs for tp, 2 for tp+ddp/tp+fsdp."""
    tp = opts.tp or (1 if not name.startswith("tp") else
                     machine.n_gpus // opts.pp if name == "tp" else 2)
    return replace(opts, tp=tp)


def pipeline_shape(name: str, job: Job, machine: Machine, options: StrategyOptions
                   ) -> PipelineShape:
    """A pipeline's shape without its programs (what the memory verdict needs)."""
    from simulator.strategies import pipeline_layout

    _inner(name)
    return pipeline_layout.describe(job, machine, _pipeline_options(name, machine, options))


def _build_one(name: str, job: Job, machine: Machine, opts: StrategyOptions) -> Program:
    # each strategy's module is imported when it is asked for: a run builds only one
    if opts.grad_compression not in ("none", "bf16"):
        raise InputError(f"gradient compression {quoted(opts.grad_compression)}: choose none "
                         "or bf16")
    if job.ep > 1:
        from simulator.strategies import expert

        return expert.build(name, job, machine, opts)
    if name == "ddp":
        from simulator.strategies import ddp

        return ddp.build(job, machine, opts)
    if name in ("zero1", "zero2"):
        from simulator.strategies import zero

        return zero.build(job, machine, opts, stage=int(name[-1]))
    if name == "fsdp":
        from simulator.strategies import fsdp

        return fsdp.build(job, machine, opts)
    if name == "hsdp":  # FSDP inside each box, replicas across (hsdp.py)
        from simulator.strategies import hsdp

        return hsdp.build(job, machine, opts)
    if name == "zero3" and job.arch is not None:  # DeepSpeed's parameter coordinator
        from simulator.strategies import zero3

        return zero3.build(job, machine, opts)
    if name == "zero3":  # a layer list: FSDP's per-unit gather/reduce pattern; DeepSpeed
        # reduces gradients in their own 16-bit dtype (communication_data_type unset)
        from simulator.strategies import fsdp

        prog = fsdp.build(job, machine, opts, reduce_bytes=4 if job.precision == "fp32" else 2,
                          framework="deepspeed")
        prog.meta["strategy"] = "zero3"
        return prog
    if name in ("tp", "tp+ddp", "tp+fsdp"):
        from simulator.strategies import tensor

        return tensor.build(job, machine, opts, data_parallel=name.partition("+")[2] or None)
    raise InputError(f"unknown strategy {quoted(name)}; choose from {', '.join(STRATEGIES)}")
