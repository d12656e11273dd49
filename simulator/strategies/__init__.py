"""Parallelism strategies: job + machine + options -> per-rank `Program`s for the engine.

``build(name, job, machine, options)`` with name one of ``STRATEGIES``:
ddp (ddp.py), zero1 / zero2 (zero.py), fsdp and zero3 (fsdp.py), tp, tp+ddp, tp+fsdp (tensor.py);
with ``options.pp`` > 1 the strategy runs inside each stage of a pipeline (pipeline.py).
It returns one program per group of identical ranks: symmetric data parallelism is one.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal

from simulator.errors import InputError, quoted

if TYPE_CHECKING:
    from simulator.engine.program import Program
    from simulator.job.workload import Job
    from simulator.machine.topology import Machine
    from simulator.strategies.pipeline_layout import Shape

STRATEGIES = ("ddp", "zero1", "zero2", "zero3", "fsdp", "tp", "tp+ddp", "tp+fsdp")


@dataclass(frozen=True)
class StrategyOptions:
    """Run choices a strategy reads; defaults are the frameworks' own defaults."""

    bucket_mb: float | None = None  # DDP bucket_cap_mb; None = PyTorch's 25 with a 1 MiB first
    grad_compression: Literal["none", "bf16"] = "none"  # DDP comm hook (bf16_compress_hook)
    no_overlap: bool = False  # Megatron local DDP: all-reduce after the whole backward
    overlap: bool = True  # the same choice, stated positively (False == no_overlap)
    grad_accum: int | None = None  # micro-steps per optimizer step; None = the job's
    tp: int | None = None  # tensor-parallel degree (tp: all GPUs; tp+ddp/tp+fsdp: 2)
    sequence_parallel: bool = False  # Megatron sequence parallelism (Korthikanti et al.)
    reshard_after_forward: bool = True  # FSDP2 default for non-root units
    forward_prefetch: bool = True  # FSDP2 implicit forward prefetch (next unit's all-gather)
    backward_prefetch: bool = True  # FSDP2 default: one unit ahead in backward
    gradient_as_bucket_view: bool = False  # PyTorch DDP default
    legacy_reducer: bool = False  # PyTorch <= 1.4 DDP reducer (strategies/ddp.py)
    zero_overlap_comm: bool | None = None  # DeepSpeed overlap_comm; None = its default
    # DeepSpeed zero_optimization.reduce_bucket_size / allgather_bucket_size (elements, ZeRO-1
    # and -2); None = its default 5e8 (strategies/zero.py)
    reduce_bucket_size: int | None = None
    allgather_bucket_size: int | None = None
    offload: str = "none"  # optimizer | params to host memory (offload.py)
    pin_memory: bool | None = None  # pinned host buffers; None = the framework's default
    ranks: tuple[int, ...] = ()  # the ranks a program stands for (set per card on mixed boxes)
    pp: int = 1  # pipeline stages (pipeline.py); the strategy runs inside each stage
    schedule: str = "1f1b"  # gpipe | 1f1b | interleaved (schedules.py)
    virtual_stages: int = 1  # model chunks per stage (interleaved)
    dp_groups: tuple[tuple[int, ...], ...] = ()  # set by tensor.py for TP x DP
    # a paged optimizer's states overflow the card and cross the host link every step
    # (paging.py); set from the memory verdict (api.strategy_options)
    page_optimizer_states: bool = False

    @property
    def overlapped(self) -> bool:
        return self.overlap and not self.no_overlap


Options = StrategyOptions  # short alias used by the commands


def build(name: str, job: Job, machine: Machine, options: StrategyOptions | None = None
          ) -> list[Program]:
    """The programs of one training step of ``job`` on ``machine`` with strategy ``name``:
    one per group of identical ranks (per kind of card on a mixed box)."""
    opts = options or StrategyOptions()
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
                   ) -> Shape:
    """A pipeline's shape without its programs (what the memory verdict needs)."""
    from simulator.strategies import pipeline_layout

    _inner(name)
    return pipeline_layout.describe(job, machine, _pipeline_options(name, machine, options))


def _build_one(name: str, job: Job, machine: Machine, opts: StrategyOptions) -> Program:
    # each strategy's module is imported when it is asked for: a run builds only one
    if opts.grad_compression not in ("none", "bf16"):
        raise InputError(f"gradient compression {quoted(opts.grad_compression)}: choose none "
                         "or bf16")
    if name == "ddp":
        from simulator.strategies import ddp

        return ddp.build(job, machine, opts)
    if name in ("zero1", "zero2"):
        from simulator.strategies import zero

        return zero.build(job, machine, opts, stage=int(name[-1]))
    if name == "fsdp":
        from simulator.strategies import fsdp

        return fsdp.build(job, machine, opts)
    if name == "zero3":  # FSDP's per-unit gather/reduce pattern; DeepSpeed reduces gradients in
        # their own 16-bit dtype (communication_data_type unset), as memory.py's recipe assumes
        from simulator.strategies import fsdp

        prog = fsdp.build(job, machine, opts, reduce_bytes=4 if job.precision == "fp32" else 2,
                          framework="deepspeed")
        prog.meta["strategy"] = "zero3"
        return prog
    if name in ("tp", "tp+ddp", "tp+fsdp"):
        from simulator.strategies import tensor

        return tensor.build(job, machine, opts, data_parallel=name.partition("+")[2] or None)
    raise InputError(f"unknown strategy {quoted(name)}; choose from {', '.join(STRATEGIES)}")
