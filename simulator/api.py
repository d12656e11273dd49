"""The Python entry point to stepsim: specs in, results out. Every command calls it.

- ``simulate(RunSpec(...)) -> RunResult``: one training step (the `stepsim run` pipeline:
  machine and job from their YAML or preset names, the strategy's programs, the engine, the
  report).
- ``memory(RunSpec(...)) -> MemoryResult``: the same spec's memory verdict without
  simulating (`stepsim memory`), optionally with the largest micro-batch or model that fits.
- ``collective(CollectiveSpec(...)) -> list[collectives.Result]``: one NCCL collective over
  a range of sizes on a fresh fabric, as nccl-tests times it (`stepsim collective`).
- ``load_machine(topology, gpus)`` and ``presets(kind)``: a machine and the bundled inputs.

Specs are frozen dataclasses (hashable, picklable), so they cross process boundaries: a
sweep can fan out over ``concurrent.futures``, Dask or Ray and call ``simulate`` in each
worker (``RunResult.report`` is plain JSON-able data; docs/api.md shows a Dask sweep).
Machines and jobs are cached per process, so sweeps and comparisons build each once.

>>> from simulator import api
>>> r = api.simulate(api.RunSpec("8x5090-switch", "llama2-7b-lora", "ddp"))  # doctest: +SKIP
>>> round(r.report["step_time_s"], 3)  # doctest: +SKIP
1.347
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, fields, replace
from functools import lru_cache
from typing import Any

from simulator import engine, strategies
from simulator.advice import cost, energy
from simulator.engine.program import Program
from simulator.engine.timeline import Timeline
from simulator.errors import InputError
from simulator.inputs.config import load_topology, load_workload, preset_names
from simulator.inputs.schema import (
    MAX_STEP_TOKENS,
    OPTIMIZER_IN_BWD_ACCUM,
    TopologyConfig,
    WorkloadConfig,
)
from simulator.job import host_memory, memory_search
from simulator.job import memory as memory_model
from simulator.job.optimizer import PAGED
from simulator.job.workload import Job
from simulator.machine import collectives, hardware, host
from simulator.machine.build import blame, forget_machines, load_machine
from simulator.machine.collective_run import CollectiveSpec as CollectiveSpec  # re-exported
from simulator.machine.collective_run import collective as collective
from simulator.machine.nccl_env import NO_ENV, NcclEnv, transport_effects
from simulator.machine.topology import Machine
from simulator.outputs import report
from simulator.scales import NEUTRAL, RateScales
from simulator.strategies import steps
from simulator.strategies.buckets import DEFAULT_BUCKET_CAP_MB
from simulator.strategies.recipe import (
    DDP_STRATEGIES,
    TP_STRATEGIES,
    check_pipeline,
    check_recipe,
    check_strategy,
)


@dataclass(frozen=True)
class RunSpec:
    """Everything that names one simulated step (hashable: sweeps cache on it)."""

    topology: str
    workload: str
    strategy: str = "ddp"
    gpus: int | None = None
    bucket_mb: float | None = None
    tp: int | None = None
    micro_batch: int | None = None
    grad_accum: int | None = None
    seq_len: int | None = None
    overlap: bool = True
    compute_slowdown: float | None = None
    # the recipe flags (recipe_flags.py); None: the workload's training key (or its
    # framework's default, simulator/job/recipe.py)
    framework: str | None = None
    kernels: str | None = None
    cross_entropy: str | None = None
    precision: str | None = None
    optimizer: str | None = None
    optimizer_in_bwd: bool | None = None  # training.optimizer_in_bwd (torchtune's key)
    checkpointing: str | None = None  # training.activation_checkpointing
    grad_compression: str = "none"  # DDP comm hook
    gradient_as_bucket_view: bool = False
    legacy_reducer: bool = False  # PyTorch <= 1.4 DDP reducer (strategies/ddp.py)
    sequence_parallel: bool = False
    reshard_after_forward: bool = True
    zero_overlap_comm: bool | None = None
    # DeepSpeed's ZeRO-1/2 bucket sizes, in elements (None: its default 5e8, strategies/zero.py)
    reduce_bucket_size: int | None = None
    allgather_bucket_size: int | None = None
    # offload to host memory (strategies/offload.py): none | optimizer | params, pinned buffers
    offload: str = "none"
    pin_memory: bool | None = None  # None: the framework's default (DeepSpeed no, FSDP2 yes)
    # pipeline parallelism (strategies/pipeline.py): stages, schedule, model chunks per stage
    pp: int = 1
    schedule: str = "1f1b"
    virtual_stages: int = 1
    # achieved-rate factors of the mechanisms (simulator/scales.py): ranges re-run at them
    scales: RateScales = NEUTRAL
    # NCCL_* environment variables in force (machine/nccl_env.py); commands read os.environ
    nccl: NcclEnv = NO_ENV
    # config files users have (docs/inputs.md): a PEFT adapter_config.json sets the LoRA
    # (QLoRA with load_in_4bit); a DeepSpeed config sets the fields this spec leaves at their
    # defaults, except those named in ``explicit`` (flags given on the command line win)
    peft: str | None = None
    load_in_4bit: bool = False
    deepspeed: str | None = None
    explicit: frozenset[str] = frozenset()


@dataclass
class RunResult:
    spec: RunSpec
    machine: Machine
    job: Job
    programs: list[Program]  # one per group of identical ranks
    timeline: Timeline
    memory: dict[str, Any]
    report: dict[str, Any]


@lru_cache(maxsize=32)
def load_job(workload: str, micro_batch: int | None, seq_len: int | None,
             grad_accum: int | None, checkpointing: str | None = None,
             training: tuple[tuple[str, Any], ...] = (), peft: str | None = None,
             load_in_4bit: bool = False) -> Job:
    """The job of a workload with command-line overrides: ``training`` holds (key, value)
    pairs of training keys (framework, kernels, ...), applied as if the workload gave them;
    ``peft`` an adapter_config.json whose LoRA replaces the workload's, on a 4-bit base
    with ``load_in_4bit`` (QLoRA)."""
    cfg = with_adapters(load_workload(workload), peft, load_in_4bit)
    changes = dict(training)
    if checkpointing is not None:  # as `--checkpointing` overrides it
        changes["activation_checkpointing"] = checkpointing
    if changes:
        cfg = cfg.with_training(**changes)
    with blame(workload, "workloads"):
        return Job.from_config(cfg, micro_batch=micro_batch, seq_len=seq_len,
                               grad_accum=grad_accum)


def with_adapters(cfg: WorkloadConfig, peft: str | None, load_in_4bit: bool) -> WorkloadConfig:
    """The workload with the LoRA of a PEFT adapter_config.json, QLoRA with
    ``load_in_4bit`` (bitsandbytes' name: a 4-bit base trains adapters only)."""
    if peft is not None:
        from simulator.inputs import peft_config

        return peft_config.apply(cfg, peft, four_bit=load_in_4bit)
    if load_in_4bit:
        if cfg.training.finetune == "full":
            raise InputError("--load-in-4bit trains LoRA adapters on a 4-bit base: give "
                             "--peft adapter_config.json or a LoRA workload")
        return cfg.with_training(finetune="qlora")
    return cfg


def configured(spec: RunSpec) -> RunSpec:
    """The spec with its DeepSpeed config applied: each setting of the file goes where the
    spec leaves the default and names no explicit flag. When the spec's strategy is explicit
    and another than the file's stage, the file's ZeRO settings (overlap_comm, offload,
    pin_memory) do not apply; its batch and precision still do."""
    if spec.deepspeed is None:
        return spec
    found = dict(_deepspeed_settings(spec.deepspeed))
    if "strategy" in spec.explicit and found.get("strategy", spec.strategy) != spec.strategy:
        for key in ("zero_overlap_comm", "reduce_bucket_size", "allgather_bucket_size",
                    "offload", "pin_memory"):
            found.pop(key, None)
    defaults = {f.name: f.default for f in fields(RunSpec)}
    changes = {k: v for k, v in found.items()
               if k not in spec.explicit and getattr(spec, k) == defaults[k]}
    return replace(spec, **changes) if changes else spec


@lru_cache(maxsize=16)
def _deepspeed_settings(path: str) -> tuple[tuple[str, Any], ...]:
    """A DeepSpeed config's RunSpec fields, read once per process (its warnings too)."""
    from simulator.inputs import deepspeed_config

    return tuple(deepspeed_config.settings(path).items())


TRAINING_OVERRIDES = ("framework", "kernels", "cross_entropy", "precision", "optimizer",
                      "optimizer_in_bwd")


def job_of(spec: RunSpec) -> Job:
    """The job a spec names, with its batch, sequence and training-recipe overrides."""
    spec = configured(spec)
    training = tuple((k, getattr(spec, k)) for k in TRAINING_OVERRIDES
                     if getattr(spec, k) is not None)
    job = load_job(spec.workload, spec.micro_batch, spec.seq_len, spec.grad_accum,
                   spec.checkpointing, training, spec.peft, spec.load_in_4bit)
    if job.recipe.optimizer_in_bwd and job.grad_accum > 1:
        raise InputError(f"{OPTIMIZER_IN_BWD_ACCUM} (grad_accum {job.grad_accum})")
    tokens = job.micro_batch * job.grad_accum * job.seq_len
    if tokens > MAX_STEP_TOKENS:
        raise InputError(f"micro-batch {job.micro_batch:,} x grad-accum {job.grad_accum:,} x "
                         f"seq-len {job.seq_len:,} = {tokens:,} tokens per GPU per step; at "
                         f"most {MAX_STEP_TOKENS:,} (docs/inputs.md: Limits)",
                         file=_deepspeed_source(spec, ("micro_batch", "grad_accum")))
    return job


def _deepspeed_source(spec: RunSpec, settings: tuple[str, ...]) -> str | None:
    """The DeepSpeed config that gave any of the spec's ``settings``, if one did (an error
    about them then names that file, not a flag)."""
    if spec.deepspeed is None:
        return None
    found = dict(_deepspeed_settings(spec.deepspeed))
    given = any(k in found and k not in spec.explicit for k in settings)
    return spec.deepspeed if given else None


def check_offload(spec: RunSpec) -> None:
    """host_memory.check of the spec's strategy and offload; an offload its DeepSpeed config
    set is blamed on that file."""
    try:
        host_memory.check(spec.strategy, spec.offload)
    except InputError as exc:
        path = _deepspeed_source(spec, ("offload",))
        if path is None:
            raise
        raise InputError(f"zero_optimization: its offload ({spec.offload}) with -s "
                         f"{spec.strategy}: {exc.message}", file=path) from None


# Ops in one simulated micro-step (identical micro-steps are replayed, not simulated again).
# A run simulates its step about six times (the one-GPU baseline, the range's ends), at about
# 0.2 ms per op on one core of the reference machine: 5,000 ops (about 300 transformer layers,
# twice the deepest published model's 128) keep a run under 10 s. `memory` has no such bound.
MAX_SIMULATED_OPS = 5_000


def check_optimizer(spec: RunSpec, job: Job, machine: Machine) -> None:
    """Refuse the optimizer recipes modelled on one path only: the step in backward on one
    GPU (torchtune's full_finetune_single_device; its FSDP form in full_finetune_distributed
    steps the sharded gradients after their reduce-scatter, which is not modelled), and the
    paged optimizers under plain DDP or one GPU (their managed states are per rank)."""
    if job.recipe.optimizer_in_bwd and machine.n_gpus > 1:
        raise InputError(f"optimizer_in_bwd on {machine.n_gpus} GPUs: the step in backward is "
                         "modelled on one GPU only (torchtune full_finetune_single_device)")
    if job.optimizer in PAGED and (spec.strategy != "ddp" or spec.pp > 1
                                             or spec.offload != "none"):
        raise InputError(f"optimizer {job.optimizer} with -s {spec.strategy}"
                         + (f" --pp {spec.pp}" if spec.pp > 1 else "")
                         + ": paged optimizer states are modelled under -s ddp only")


def check_size(job: Job) -> None:
    """Refuse a step whose program would be too large to simulate in seconds."""
    per_micro = len(job.forward_ops()) + len(job.backward_ops())
    if per_micro > MAX_SIMULATED_OPS:
        raise InputError(
            f"a micro-step of {job.n_layers:,} layers has {per_micro:,} ops to simulate; at "
            f"most {MAX_SIMULATED_OPS:,} (fewer layers; `stepsim memory` has no such limit)")


def tp_degree(strategy: str, tp: int | None, n_gpus: int, pp: int = 1) -> int:
    """The TP degree a strategy runs: --tp if given, else all GPUs of a pipeline stage for tp
    and 2 for tp+ddp and tp+fsdp (tensor.py's defaults); 1 for the rest. `run` and `memory`
    both use this."""
    if strategy not in TP_STRATEGIES:
        return 1
    if tp is not None:
        return tp
    per_stage = n_gpus // max(1, pp)
    return per_stage if strategy == "tp" else min(2, per_stage)


def memory_scheme(strategy: str) -> str:
    """memory.py's name for a strategy: the data-parallel scheme beside the TP degree (TP alone
    and TP x DDP are DDP over the world / tp replicas, TP x FSDP is FSDP over them)."""
    return {"tp": "ddp", "tp+ddp": "ddp", "tp+fsdp": "fsdp"}.get(strategy, strategy)


def _tp_degree(spec: RunSpec, machine: Machine) -> int:
    return tp_degree(spec.strategy, spec.tp, machine.n_gpus, spec.pp)


def options_of(spec: RunSpec) -> strategies.Options:
    return strategies.Options(
        bucket_mb=spec.bucket_mb, tp=spec.tp, overlap=spec.overlap,
        grad_compression=spec.grad_compression,  # type: ignore[arg-type]  # checked on parse
        gradient_as_bucket_view=spec.gradient_as_bucket_view,
        legacy_reducer=spec.legacy_reducer,
        sequence_parallel=spec.sequence_parallel,
        reshard_after_forward=spec.reshard_after_forward,
        zero_overlap_comm=spec.zero_overlap_comm, pp=spec.pp, schedule=spec.schedule,
        virtual_stages=spec.virtual_stages, offload=spec.offload, pin_memory=spec.pin_memory,
        reduce_bucket_size=spec.reduce_bucket_size,
        allgather_bucket_size=spec.allgather_bucket_size)


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
    return dict(world=machine.n_gpus, tp=_tp_degree(spec, machine),
                sequence_parallel=spec.sequence_parallel,
                gradient_as_bucket_view=spec.gradient_as_bucket_view,
                reshard_after_forward=spec.reshard_after_forward,
                zero_overlap_comm=bool(spec.zero_overlap_comm),
                nccl_channels=collectives.machine_channels(machine),
                offload=spec.offload, host_capacity_bytes=host.memory_bytes(machine),
                reduce_bucket_size=spec.reduce_bucket_size)


def memory_reports(job: Job, machine: Machine, spec: RunSpec,
                   pipeline: dict[str, Any] | None = None) -> list[memory_model.MemoryReport]:
    """memory.py's reports: one per pipeline stage (``pipeline``: the strategy's meta), else
    one. Every rank of a stage holds the same share, so a mixed box's report is its smallest
    card's."""
    name = memory_scheme(spec.strategy)
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
# re-runs at scaled rates (advice/ranges.py) reuse the point's instead of estimating it again
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


def _mean_card_price(machine: Machine) -> float | None:
    """The machine's mean card price (a mixed box has several), None if one is unknown."""
    prices = [machine.gpu_of(r).price_usd for r in range(machine.n_gpus)]
    return None if None in prices else sum(p for p in prices if p) / len(prices)


def _card_price(machine: Machine) -> float | None:
    """One card's price for the purchase: the card's own, or the mean on a mixed box."""
    names = {machine.gpu_of(r).name for r in range(machine.n_gpus)}
    return machine.gpu.price_usd if len(names) == 1 else _mean_card_price(machine)


def _card_price_source(machine: Machine) -> str | None:
    """Where the card prices come from: one source, or each card's on a mixed box."""
    names = dict.fromkeys(machine.gpu_of(r).name for r in range(machine.n_gpus))
    if len(names) == 1:
        return hardware.PRICE_SOURCES.get(next(iter(names)))
    return "the mean of " + "; ".join(f"{name}: {hardware.PRICE_SOURCES.get(name, 'unknown')}"
                                      for name in names)


def pipeline_split(spec: RunSpec) -> dict[str, Any] | None:
    """A pipeline's stages (their GPUs, blocks, in-flight activations), from its shape alone
    (no program is built, nothing simulated). None without a pipeline."""
    spec = configured(spec)
    if spec.pp == 1:
        return None
    check_pipeline(spec.strategy, pp=spec.pp, schedule=spec.schedule,
                   virtual_stages=spec.virtual_stages)
    machine = load_machine(spec.topology, spec.gpus, spec.scales, spec.nccl)
    return pipeline_of(job_of(spec), machine, spec)


def memory_of(spec: RunSpec, split: dict[str, Any] | None = None) -> dict[str, Any]:
    """The memory verdict of a spec without simulating it (what advise prunes by). A
    pipeline's rests on its stage split: ``split`` (from ``pipeline_split``), else built."""
    spec = configured(spec)
    machine = load_machine(spec.topology, spec.gpus, spec.scales, spec.nccl)
    if spec.pp > 1 and split is None:
        split = pipeline_split(spec)
    job = job_of(spec)
    check_optimizer(spec, job, machine)  # a recipe the optimizer cannot run is no candidate
    return _memory(job, machine, spec, split)


def calibration_summary(machine: Machine, workload: str) -> dict[str, Any]:
    """The topology's calibration as a run uses it: what was fitted, and whether this job's
    compute rests on a measured step."""
    calibration = machine.calibration
    assert calibration is not None
    compute = [c for c in calibration.compute if c.workload == workload]
    others = sorted({c.workload for c in calibration.compute} - {workload})
    return {"source": calibration.source,
            "fitted": {f.parameter: f.value for f in calibration.fitted},
            "compute_achieved_fraction": {c.gpu: c.achieved_fraction for c in compute} or None,
            "compute_calibrated_for_other_workloads": others}


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
    spec = configured(spec)
    check_strategy(spec.strategy)
    check_pipeline(spec.strategy, pp=spec.pp, schedule=spec.schedule,
                   virtual_stages=spec.virtual_stages)
    check_offload(spec)
    machine = load_machine(spec.topology, spec.gpus, spec.scales, spec.nccl)
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
                               "recipe": job.recipe.to_json()}
    if pipeline is not None:
        summary["stage"] = reports.index(found)
        summary["stages"] = _stages_json(reports, pipeline)
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


def presets(kind: str) -> list[tuple[str, TopologyConfig | WorkloadConfig]]:
    """The bundled topologies or workloads (``kind``), by name, as loaded and validated."""
    load = load_topology if kind == "topologies" else load_workload
    return [(name, load(name)) for name in preset_names(kind)]


def _channel_note(machine: Machine, plain: Machine) -> list[str]:
    """NCCL_MIN/MAX_NCHANNELS and NCCL_ALGO/PROTO, as a training step feels them."""
    out = []
    if machine.n_gpus > 1:
        now, was = collectives.machine_channels(machine), collectives.machine_channels(plain)
        if now != was:
            out.append(f"{now} channels where NCCL would run {was}")
    for name in ("NCCL_ALGO", "NCCL_PROTO"):
        value = dict(machine.nccl.settings).get(name)
        if value is not None:
            out.append(f"{name}={value}: every collective of the step chooses among what it "
                       "leaves")
    return out


def degrees(spec: RunSpec, job: Job, machine: Machine, dp: int) -> dict[str, Any]:
    """What was simulated, as numbers: the parallel degrees, the batch, the bucket size."""
    ddp = spec.strategy in DDP_STRATEGIES and dp > 1  # torch DDP buckets the gradients
    return {"parallelism": {"world": machine.n_gpus, "tp": _tp_degree(spec, machine), "dp": dp,
                            "pp": spec.pp},
            "micro_batch": job.micro_batch, "seq_len": job.seq_len,
            "grad_accum": job.grad_accum,
            "bucket_mb": (spec.bucket_mb or DEFAULT_BUCKET_CAP_MB) if ddp else None}


def recipe(spec: RunSpec, job: Job | None = None) -> dict[str, Any]:
    """The recipe flags as the report lists them (framework option names); with ``job``, the
    checkpointing the job actually runs (the workload's unless overridden)."""
    checkpointing = job.checkpointing if job is not None else spec.checkpointing
    training = job.recipe.to_json() if job is not None else {}
    return {**training, "activation_checkpointing": checkpointing,
            "comm_hook": spec.grad_compression,
            "gradient_as_bucket_view": spec.gradient_as_bucket_view,
            "sequence_parallel": spec.sequence_parallel,
            "reshard_after_forward": spec.reshard_after_forward,
            "overlap_comm": bool(spec.zero_overlap_comm), "offload": spec.offload,
            "pin_memory": spec.pin_memory,
            **{key: getattr(spec, key) for key in ("reduce_bucket_size", "allgather_bucket_size")
               if getattr(spec, key) is not None}}  # DeepSpeed's, when its config gave them


def single_gpu_tokens_per_s(spec: RunSpec) -> float | None:
    """Tokens/s of one GPU of the same machine with the same per-GPU batch (None: won't fit).

    Simulated once per distinct one-GPU step, however many points of a sweep, comparison or
    advice share it: of the spec only what one GPU runs is kept (the machine, the job, its
    batch and recipe, the rate scales); the parallelism flags (strategy, GPUs, TP, pipeline,
    buckets, overlap, comm hook, FSDP/ZeRO options) are dropped, as on one GPU nothing is
    communicated.
    """
    spec = configured(spec)  # its batch and precision; nothing else of it runs on one GPU
    return _single_gpu(replace(spec, strategy="ddp", gpus=1, tp=None, bucket_mb=None,
                               overlap=True, grad_compression="none",
                               gradient_as_bucket_view=False, sequence_parallel=False,
                               reshard_after_forward=True, zero_overlap_comm=None, pp=1,
                               schedule="1f1b", virtual_stages=1,
                               offload="none", pin_memory=None, deepspeed=None,
                               explicit=frozenset(), reduce_bucket_size=None,
                               allgather_bucket_size=None))


@lru_cache(maxsize=64)
def _single_gpu(one: RunSpec) -> float | None:
    job = job_of(one)
    one_gpu = load_machine(one.topology, 1, one.scales, one.nccl).for_job(job.name)
    if not _memory(job, one_gpu, one)["fits"]:
        return None
    programs = strategies.build("ddp", job, one_gpu, strategy_options(one, job, one_gpu))
    timeline = engine.simulate(programs, one_gpu, compute_slowdown=one.compute_slowdown)
    tokens = job.tokens_per_micro_batch * job.grad_accum
    return tokens / timeline.step_time if timeline.step_time > 0 else None


def config_files(spec: RunSpec, job: Job) -> dict[str, Any] | None:
    """The Hugging Face, PEFT and DeepSpeed files a spec read, with the parameter count they
    give (to hold against the model card); None when it read none."""
    out: dict[str, Any] = {}
    if spec.workload.startswith("hf:"):
        from simulator.inputs import hf_config

        out["hf"] = str(hf_config.config_path(spec.workload))
    if spec.peft is not None:
        out["peft"] = spec.peft
    if spec.deepspeed is not None:
        out["deepspeed"] = spec.deepspeed
    if not out:
        return None
    return {**out, "parameters": job.n_params, "trainable_parameters": job.n_trainable}


def clear_caches() -> None:
    """Forget every machine, job, op time and one-GPU baseline built so far (for tests that swap
    a module the cached results came from, or rewrite a config file)."""
    forget_machines()
    _MEMORY_VERDICTS.clear()
    _ONE_GPU_RUNS.clear()
    _deepspeed_settings.cache_clear()
    load_job.cache_clear()
    _single_gpu.cache_clear()
    steps.forget_op_times()


def simulate(spec: RunSpec, *, baseline: bool = True, prices: cost.Prices | None = None,
             ranges: bool = False) -> RunResult:
    """Build the program, simulate it, and measure it: the whole `run` pipeline.

    ``prices``: the user's prices for the report's ``cost`` block (default: the topology's).
    ``ranges``: add ``<key>_range`` beside the headline keys (advice/ranges.py: a few more
    simulations at the ends of the mechanisms' validation spreads).
    """
    spec = configured(spec)
    if (spec.gpus or load_machine(spec.topology).n_gpus) == 1 and spec.bucket_mb is not None:
        # buckets do nothing on one GPU: a sweep's one-GPU points over bucket sizes are one run
        key = (replace(spec, bucket_mb=None), baseline, prices, ranges)
        known = _ONE_GPU_RUNS.get(key)
        if known is None:
            if len(_ONE_GPU_RUNS) >= 16:
                _ONE_GPU_RUNS.clear()
            known = _ONE_GPU_RUNS[key] = _simulate(key[0], baseline, prices, ranges)
        return replace(known, spec=spec, report=copy.deepcopy(known.report))
    return _simulate(spec, baseline, prices, ranges)


_ONE_GPU_RUNS: dict[tuple[RunSpec, bool, cost.Prices | None, bool], RunResult] = {}


def _simulate(spec: RunSpec, baseline: bool, prices: cost.Prices | None,
              ranges: bool) -> RunResult:
    job = job_of(spec)
    machine = load_machine(spec.topology, spec.gpus, spec.scales, spec.nccl).for_job(job.name)
    check_recipe(spec.strategy, tp=_tp_degree(spec, machine), overlap=spec.overlap,
                       grad_compression=spec.grad_compression,
                       gradient_as_bucket_view=spec.gradient_as_bucket_view,
                       sequence_parallel=spec.sequence_parallel,
                       reshard_after_forward=spec.reshard_after_forward,
                       zero_overlap_comm=spec.zero_overlap_comm)
    check_pipeline(spec.strategy, pp=spec.pp, schedule=spec.schedule,
                   virtual_stages=spec.virtual_stages)
    check_offload(spec)
    if spec.offload != "none" and spec.pp > 1:
        raise InputError("--offload with --pp: offloading inside a pipeline is not modelled")
    check_optimizer(spec, job, machine)
    check_size(job)
    # a job the strategy cannot split, too long a step; or a route the machine lacks
    with blame(spec.workload, "workloads", machine, spec.topology):
        programs = strategies.build(spec.strategy, job, machine,
                                    strategy_options(spec, job, machine))
        timeline = engine.simulate(programs, machine, compute_slowdown=spec.compute_slowdown)
    meta = programs[0].meta
    mem = _memory_verdict(spec, job, machine, meta.get("pipeline"))
    dp = int(meta.get("dp", machine.n_gpus))  # replicas that each take a batch
    tokens = job.tokens_per_micro_batch * job.grad_accum * dp
    machine_gpus = load_machine(spec.topology).n_gpus
    power = energy.step_energy(timeline, machine, tokens,
                               host_share=machine.n_gpus / machine_gpus)
    step = timeline.step_time
    costs, basis = cost.run_cost(
        step_time_s=step, tokens_per_s=tokens / step if step > 0 else 0.0,
        gpus=machine.n_gpus, machine_gpus=machine_gpus, prices=prices or cost.Prices(),
        machine_usd_per_hour=machine.config.price_usd_per_hour,
        card_price_usd=_card_price(machine),
        card_price_source=_card_price_source(machine),
        avg_power_w=power["avg_power_w"])
    metrics = report.step_report(
        timeline,
        tokens_per_step=tokens,
        samples_per_step=job.micro_batch * job.grad_accum * dp,
        model_flops_per_step=job.model_flops_per_step() * dp,
        peak_flops=sum(machine.gpu_of(r).matmul_flops for r in range(machine.n_gpus))
        / machine.n_gpus,  # MFU against the box's mean card on a mixed box
        memory=mem,
        baseline_tokens_per_s=single_gpu_tokens_per_s(spec) if baseline else None,
        gpu_price_usd=_mean_card_price(machine),
        cost=costs, cost_basis=basis, energy=power,
        extra={"topology": machine.name, "workload": job.name, "strategy": spec.strategy,
               "gpu": machine.gpu.name, "tokens_per_step": tokens,
               "overlap": spec.overlap, "recipe": recipe(spec, job),
               **degrees(spec, job, machine, dp)},
    )
    files = config_files(spec, job)
    if files is not None:  # what came from the user's own config files
        metrics["config_files"] = files
    link = metrics["bottleneck"]["link"]
    metrics["bottleneck"]["description"] = machine.describe(link) if link else None
    if machine.calibration is not None:  # a calibrated machine says so, and what it holds
        metrics["calibration"] = calibration_summary(machine, job.name)
    if spec.nccl.active:  # what NCCL's variables did to this machine
        plain = load_machine(spec.topology, spec.gpus, spec.scales)
        metrics["nccl_env"] = {"variables": dict(spec.nccl.settings),
                               "ignored": list(spec.nccl.ignored),
                               "effects": transport_effects(machine, plain)
                               + _channel_note(machine, plain)}
    cards = machine.cards()
    if len(cards) > 1:  # a mixed box: which card each rank group runs
        metrics["cards"] = {card.name: list(ranks) for card, ranks in cards.items()}
        for entry in metrics.get("ranks", []):
            entry["gpu"] = machine.gpu_of(entry["gpus"][0]).name
    result = RunResult(spec, machine, job, programs, timeline, mem, metrics)
    if ranges:
        from simulator.advice.ranges import add_ranges

        add_ranges(result, prices)
    return result


def run(spec: RunSpec, **options: Any) -> dict[str, Any]:
    """``simulate(spec, **options).report``: the JSON-able answer alone, what a worker process
    sends back (a module-level function, so executors pickle it by name)."""
    return simulate(spec, **options).report
