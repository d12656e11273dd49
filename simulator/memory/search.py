"""Searches over the memory model: the largest micro-batch, and the largest model of a family.

Both rely on memory growing monotonically with what is searched (the micro-batch; the width of
a model whose other dimensions follow it), so they bisect. ``scaled_workload`` keeps the base
model's shape ratios (Llama 2: 128-wide heads, L = h / 128, MLP width rounded to 256).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from simulator.catalog.gpus import GPU
from simulator.errors import InputError
from simulator.inputs.schema import WorkloadConfig
from simulator.job.workload import Job
from simulator.memory.estimate import MemoryReport, estimate

# A job's memory report, where one estimate is not the whole verdict (a pipeline's fullest
# stage, host RAM under offload); the searches default to one estimate.
ReportOf = Callable[[Job], MemoryReport]


def largest_micro_batch(job: Job, gpu: GPU, strategy: str, *, limit: int = 4096,
                        report_of: ReportOf | None = None, **options: object) -> int:
    """The largest micro-batch that fits, on the GPU and in host RAM (0 if not even one).
    Memory grows with the batch."""
    def fits(b: int) -> bool:
        if report_of is not None:
            report = report_of(replace(job, micro_batch=b))
        else:
            report = estimate(job, gpu, strategy, micro_batch=b, **options)  # type: ignore[arg-type]
        return report.fits and report.host_fits

    if not fits(1):
        return 0
    lo, hi = 1, 2
    while hi <= limit and fits(hi):
        lo, hi = hi, hi * 2
    hi = min(hi, limit + 1)
    while hi - lo > 1:  # invariant: lo fits, hi does not (or is past the limit)
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


@dataclass(frozen=True)
class ScaledModel:
    """One member of a scaled family and its memory report."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn_hidden: int
    report: MemoryReport

    @property
    def parameters(self) -> int:
        return self.report.parameters


def scaled_workload(base: WorkloadConfig, hidden: int) -> WorkloadConfig:
    """The base model at another width, keeping its shape ratios: head size, layers per hidden
    unit (Llama 2 7B and 13B both have L = h / 128), the KV-head share and the MLP ratio, the
    MLP width rounded up to a multiple of 256 (Llama's ``multiple_of``: 11008, 13824)."""
    m = base.model
    if m is None:
        raise InputError("the largest-model search needs a transformer `model`")
    head_dim = m.hidden // m.heads
    heads = max(1, hidden // head_dim)
    kv_share = (m.kv_heads or m.heads) / m.heads
    kv_heads = max(1, round(heads * kv_share))
    while heads % kv_heads:
        kv_heads -= 1
    ffn = math.ceil((m.ffn_hidden or 4 * m.hidden) * hidden / m.hidden / 256) * 256
    layers = max(1, round(m.layers * hidden / m.hidden))
    model = m.copy(hidden=heads * head_dim, heads=heads, kv_heads=kv_heads, ffn_hidden=ffn,
                   layers=layers)
    return base.copy(model=model, name=f"{base.name}-h{hidden}")


def largest_model(base: WorkloadConfig, gpu: GPU, strategy: str, *, max_hidden: int = 65536,
                  report_of: ReportOf | None = None, **options: object) -> ScaledModel | None:
    """The widest (so largest) member of the base model's family that fits, or None.

    Widths step by one head; parameters and memory grow with the width, so bisection applies.
    """
    m = base.model
    if m is None:
        raise InputError("the largest-model search needs a transformer `model`")
    step = m.hidden // m.heads

    def build(k: int) -> ScaledModel:
        cfg = scaled_workload(base, k * step)
        assert cfg.model is not None
        job = Job.from_config(cfg)
        if report_of is not None:
            micro = options.get("micro_batch")
            report = report_of(replace(job, micro_batch=micro)
                               if isinstance(micro, int) else job)
        else:
            report = estimate(job, gpu, strategy, **options)  # type: ignore[arg-type]
        mm = cfg.model
        return ScaledModel(mm.layers, mm.hidden, mm.heads, mm.kv_heads or mm.heads,
                           mm.ffn_hidden or 4 * mm.hidden, report)

    lo, hi = 0, max_hidden // step + 1  # invariant: lo fits (0 = nothing), hi does not
    best: ScaledModel | None = None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        candidate = build(mid)
        if candidate.report.fits and candidate.report.host_fits:
            lo, best = mid, candidate
        else:
            hi = mid
    return best
