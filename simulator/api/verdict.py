"""The memory verdict of a spec without simulating it: memory.py's reports (one per pipeline
stage), the fullest of them, the JSON `run` and `memory` print, and `stepsim memory`'s searches
(the largest micro-batch or model that fits). A verdict does not depend on the rates, so the
re-runs of a range reuse the point's. ``api.py`` re-exports all of it.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, replace
from typing import Any

from simulator import strategies
from simulator.api.spec import (
    RunSpec,
    _tp_degree,
    check_offload,
    check_optimizer,
    configured,
    job_of,
    memory_scheme,
    options_of,
    with_adapters,
)
from simulator.inputs.config import load_workload
from simulator.job.optimizer import PAGED
from simulator.job.workload import Job
from simulator.machine import host
from simulator.machine.build import blame, load_machine
from simulator.machine.scales import NEUTRAL
from simulator.machine.topology import Machine
from simulator.memory import estimate as memory_model
from simulator.nccl.communicator import load_communicator
from simulator.strategies.options import check_pipeline, check_strategy


def strategy_options(spec: RunSpec, job: Job, machine: Machine) -> strategies.Options:
    """``options_of(spec)`` with what the memory verdict decides for the step: whether a paged
    optimizer's states overflow the card and page over the host link (memory.py)."""
    options = options_of(spec)
    if job.optimizer in PAGED:
        report = memory_model.estimate(job, machine.smallest_card(), memory_scheme(spec.strategy),
                                       **_memory_options(spec, machine))
        options = replace(options, page_optimizer_states=report.paged_to_host_bytes > 0)
    return options


def _memory_options(spec: RunSpec, machine: Machine) -> dict[str, Any]:
    """memory.estimate's keywords for a spec: the same recipe the simulation runs."""
    # HSDP shards over one box's GPUs and replicates across boxes (strategies/hsdp.py)
    world = machine.gpus_per_box if spec.strategy == "hsdp" else machine.n_gpus
    return dict(world=world, tp=_tp_degree(spec, machine),
                sequence_parallel=spec.sequence_parallel,
                gradient_as_bucket_view=spec.gradient_as_bucket_view,
                reshard_after_forward=spec.reshard_after_forward,
                zero_overlap_comm=bool(spec.zero_overlap_comm),
                nccl_channels=_channels(spec),
                offload=spec.offload, host_capacity_bytes=host.memory_bytes(machine),
                reduce_bucket_size=spec.reduce_bucket_size)


def _channels(spec: RunSpec) -> int:
    """The channels NCCL runs over the spec's GPUs (its buffers scale with them)."""
    return load_communicator(spec.topology, spec.gpus, spec.scales, spec.nccl,
                             spec.nnodes).channels()


def memory_reports(job: Job, machine: Machine, spec: RunSpec,
                   pipeline: dict[str, Any] | None = None) -> list[memory_model.MemoryReport]:
    """memory.py's reports: one per pipeline stage (``pipeline``: the strategy's meta), else
    one. Every rank of a stage holds the same share, so a mixed box's report is its smallest
    card's."""
    name = memory_scheme(spec.strategy)
    if job.ep > 1:  # the same refusals as the run's (strategies/expert.py)
        from simulator.strategies import expert

        expert.check(spec.strategy, job, machine.n_gpus, tp=_tp_degree(spec, machine),
                     pp=spec.pp)
    options = _memory_options(spec, machine)
    if pipeline is None:
        return [memory_model.estimate(job, machine.smallest_card(), name, **options)]
    p = pipeline["stages"]
    stages = []
    for r, gpus in enumerate(pipeline["stage_gpus"]):
        blocks = frozenset(b for c, chunk in enumerate(pipeline["blocks"]) if c % p == r
                           for b in chunk)
        layers, heads = pipeline["in_flight"][r]
        card = min((machine.gpu_of(g) for g in gpus), key=lambda c: c.memory_bytes)
        share = memory_model.StageShare(p, blocks, layers, heads)
        stages.append(memory_model.estimate(job, card, name, **options, stage=share))
    return stages


def fullest(reports: list[memory_model.MemoryReport]) -> memory_model.MemoryReport:
    """The report whose GPUs are fullest (a pipeline's verdict is its fullest stage's)."""
    return max(reports, key=lambda m: m.peak_bytes / m.capacity_bytes)


def _stages_json(reports: list[memory_model.MemoryReport],
                 pipeline: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"stage": r, "gpus": gpus, "peak_bytes": m.peak_bytes,
             "capacity_bytes": m.capacity_bytes, "fits": m.fits, "peak_phase": m.peak_phase,
             "activations_bytes": m.category_bytes("activations")}
            for r, (gpus, m) in enumerate(zip(pipeline["stage_gpus"], reports, strict=True))]


def _memory(job: Job, machine: Machine, spec: RunSpec,
            pipeline: dict[str, Any] | None = None) -> dict[str, Any]:
    """The memory verdict as JSON; a pipeline's adds ``stage`` (the fullest) and ``stages``."""
    reports = memory_reports(job, machine, spec, pipeline)
    worst = fullest(reports)
    out = worst.to_json()
    if pipeline is not None:
        out["stage"] = reports.index(worst)
        out["stages"] = _stages_json(reports, pipeline)
    return out


# memory verdicts by spec at neutral rates: they do not depend on the rates, so a range's
# re-runs at scaled rates (api/ranges.py) reuse the point's instead of estimating it again
_MEMORY_VERDICTS: dict[RunSpec, dict[str, Any]] = {}


def _memory_verdict(spec: RunSpec, job: Job, machine: Machine,
                    pipeline: dict[str, Any] | None) -> dict[str, Any]:
    key = replace(spec, scales=NEUTRAL)
    if key not in _MEMORY_VERDICTS:
        if len(_MEMORY_VERDICTS) >= 256:  # a long search: keep the memory bounded
            _MEMORY_VERDICTS.clear()
        _MEMORY_VERDICTS[key] = _memory(job, machine, spec, pipeline)
    return copy.deepcopy(_MEMORY_VERDICTS[key])


def pipeline_of(job: Job, machine: Machine, spec: RunSpec) -> dict[str, Any] | None:
    """A pipelined spec's shape (its meta) without building its programs; None without one."""
    if spec.pp <= 1:
        return None
    return strategies.pipeline_shape(spec.strategy, job, machine, options_of(spec)).meta


def pipeline_split(spec: RunSpec) -> dict[str, Any] | None:
    """A pipeline's stages (their GPUs, blocks, in-flight activations), from its shape alone
    (no program is built, nothing simulated). None without a pipeline."""
    spec = configured(spec)
    if spec.pp == 1:
        return None
    check_pipeline(spec.strategy, pp=spec.pp, schedule=spec.schedule,
                   virtual_stages=spec.virtual_stages)
    machine = load_machine(spec.topology, spec.gpus, spec.scales, spec.nnodes)
    return pipeline_of(job_of(spec), machine, spec)


def memory_of(spec: RunSpec, split: dict[str, Any] | None = None) -> dict[str, Any]:
    """The memory verdict of a spec without simulating it (what advise prunes by). A
    pipeline's rests on its stage split: ``split`` (from ``pipeline_split``), else built."""
    spec = configured(spec)
    machine = load_machine(spec.topology, spec.gpus, spec.scales, spec.nnodes)
    if spec.pp > 1 and split is None:
        split = pipeline_split(spec)
    job = job_of(spec)
    check_optimizer(spec, job, machine)  # a recipe the optimizer cannot run is no candidate
    with blame(spec.workload, "workloads", machine, spec.topology):  # a route the box lacks
        return _memory(job, machine, spec, split)


@dataclass(frozen=True)
class MemoryResult:
    """A spec's memory verdict on one GPU, and what was searched around it."""

    report: memory_model.MemoryReport  # the lines, the peak and its moment, the verdict
    summary: dict[str, Any]  # the `stepsim memory --json` object
    hints: tuple[str, ...] = ()  # what would fit instead, in words


def memory(spec: RunSpec, *, largest_micro_batch: bool = False,
           largest_model: bool = False) -> MemoryResult:
    """The memory ``simulate(spec)`` would report, without simulating; optionally the largest
    micro-batch, or model of the same family, that fits on the GPU and in host RAM
    (``spec.micro_batch`` None with ``largest_micro_batch``: searched from 1). A pipeline's
    verdict is its fullest stage's, every stage under ``stages``."""
    from simulator.memory import search as memory_search  # only `stepsim memory` searches

    spec = configured(spec)
    check_strategy(spec.strategy)
    check_pipeline(spec.strategy, pp=spec.pp, schedule=spec.schedule,
                   virtual_stages=spec.virtual_stages)
    check_offload(spec)
    machine = load_machine(spec.topology, spec.gpus, spec.scales, spec.nnodes)
    job = job_of(spec)
    check_optimizer(spec, job, machine)
    card = machine.smallest_card()  # every rank holds the same share: the smallest card binds
    scheme = memory_scheme(spec.strategy)

    def report_of(candidate: Job) -> memory_model.MemoryReport:
        return fullest(memory_reports(candidate, machine, spec,
                                      pipeline_of(candidate, machine, spec)))

    pipeline = pipeline_of(job, machine, spec)
    reports = memory_reports(job, machine, spec, pipeline)
    found = fullest(reports)
    summary: dict[str, Any] = {"topology": machine.name, "workload": job.name, "gpu": card.name,
                               **found.to_json(), "strategy": spec.strategy,
                               "recipe": job.recipe_json()}
    if pipeline is not None:
        summary["stage"] = reports.index(found)
        summary["stages"] = _stages_json(reports, pipeline)
    if job.arch is not None and job.arch.moe is not None:  # a mixture of experts
        summary["experts"] = {"routed": job.arch.moe.experts,
                              "per_token": job.arch.moe.top_k,
                              "active_parameters": job.n_active, "ep": job.ep,
                              "model_parameters": job.n_model_params}
    hints: list[str] = []
    full = replace(spec, checkpointing="full")
    can_checkpoint = job.checkpointing != "full" and job.arch is not None
    if largest_micro_batch:
        best = memory_search.largest_micro_batch(job, card, scheme, report_of=report_of)
        summary["largest_micro_batch"] = best
        if best == 0 and can_checkpoint:
            best_full = memory_search.largest_micro_batch(job_of(full), card, scheme,
                                                          report_of=report_of)
            summary["largest_micro_batch_full_checkpointing"] = best_full
            hints.append(f"with full activation checkpointing: largest micro-batch {best_full}")
    elif not found.fits and can_checkpoint and found.model_state_bytes < found.capacity_bytes:
        hints.append(f"with full activation checkpointing: {report_of(job_of(full)).verdict()}")
    if largest_model:
        cfg = with_adapters(load_workload(spec.workload), spec.peft, spec.load_in_4bit)
        if spec.checkpointing is not None:
            cfg = cfg.with_training(activation_checkpointing=spec.checkpointing)
        if spec.seq_len is not None:
            cfg = cfg.with_training(seq_len=spec.seq_len)
        big = memory_search.largest_model(cfg, card, scheme, report_of=report_of,
                                          micro_batch=spec.micro_batch)
        summary["largest_model"] = None if big is None else {
            "parameters": big.parameters, "layers": big.layers, "hidden": big.hidden,
            "heads": big.heads, "kv_heads": big.kv_heads, "ffn_hidden": big.ffn_hidden,
            "peak_bytes": big.report.peak_bytes}
    return MemoryResult(found, summary, tuple(hints))


def forget_verdicts() -> None:
    """Drop the remembered memory verdicts (api.clear_caches)."""
    _MEMORY_VERDICTS.clear()
