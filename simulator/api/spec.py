"""A spec and what it names: ``RunSpec`` (every choice of one simulated step), the job it runs
with its overrides and the config files users bring (DeepSpeed, PEFT), the strategy's options,
and the checks a spec must pass before anything is built.

Jobs are cached per process (``load_job``), and a DeepSpeed config is read once: a sweep,
comparison or search builds each job once. ``api.py`` re-exports all of it.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from functools import lru_cache
from typing import Any

from simulator import strategies
from simulator.catalog import software
from simulator.errors import InputError
from simulator.inputs.config import load_workload
from simulator.inputs.schema import MAX_STEP_TOKENS, OPTIMIZER_IN_BWD_ACCUM, WorkloadConfig
from simulator.job.optimizer import PAGED
from simulator.job.workload import Job
from simulator.machine.build import blame
from simulator.machine.scales import NEUTRAL, RateScales
from simulator.machine.topology import Machine
from simulator.memory import host as host_memory
from simulator.nccl.env import NO_ENV, NcclEnv
from simulator.strategies.options import TP_STRATEGIES


@dataclass(frozen=True)
class RunSpec:
    """Everything that names one simulated step (hashable: sweeps cache on it)."""

    topology: str
    workload: str
    strategy: str = "ddp"
    gpus: int | None = None
    bucket_mb: float | None = None
    tp: int | None = None
    ep: int = 1  # expert parallelism: a mixture of experts' experts over this many ranks
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
    attention: str | None = None  # training.attention
    padded: bool | None = None  # training.padded: padded batches with their attention mask
    amp: str | None = None  # training.amp: apex amp opt_level o1 | o2
    ddp: str | None = None  # training.ddp: torch | apex (DistributedDataParallel)
    # training.software as --software gives it: "2023" or "torch=2.1,cuda=12.1,transformers=4.38"
    software: str | None = None
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
    # DeepSpeed's stage3_prefetch_bucket_size in elements (None: Hugging Face's "auto")
    prefetch_bucket_size: int | None = None
    # offload to host memory (strategies/offload.py): none | optimizer | params, pinned buffers
    offload: str = "none"
    pin_memory: bool | None = None  # None: the framework's default (DeepSpeed no, FSDP2 yes)
    # pipeline parallelism (strategies/pipeline.py): stages, schedule, model chunks per stage
    pp: int = 1
    schedule: str = "1f1b"
    virtual_stages: int = 1
    # achieved-rate factors of the mechanisms (simulator/machine/scales.py): ranges re-run at them
    scales: RateScales = NEUTRAL
    # NCCL_* environment variables in force (nccl/env.py); commands read os.environ
    nccl: NcclEnv = NO_ENV
    # config files users have (docs/inputs.md): a PEFT adapter_config.json sets the LoRA
    # (QLoRA with load_in_4bit); a DeepSpeed config sets the fields this spec leaves at their
    # defaults, except those named in ``explicit`` (flags given on the command line win)
    peft: str | None = None
    load_in_4bit: bool = False
    deepspeed: str | None = None
    explicit: frozenset[str] = frozenset()
    # several boxes (machine/cluster.py): how many (None: the topology's nnodes); `gpus` then
    # counts each box's; a tensor-parallel group may span them only when allowed
    nnodes: int | None = None
    allow_tp_across_nodes: bool = False


@lru_cache(maxsize=32)
def load_job(workload: str, micro_batch: int | None, seq_len: int | None,
             grad_accum: int | None, checkpointing: str | None = None,
             training: tuple[tuple[str, Any], ...] = (), peft: str | None = None,
             load_in_4bit: bool = False, ep: int = 1) -> Job:
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
                               grad_accum=grad_accum, ep=ep)


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
                    "prefetch_bucket_size",
                    "offload", "pin_memory"):
            found.pop(key, None)
    defaults = {f.name: f.default for f in fields(RunSpec)}
    changes = {k: v for k, v in found.items()
               if k not in spec.explicit and getattr(spec, k) == defaults[k]}
    return replace(spec, **changes) if changes else spec


def _deepspeed_settings(path: str) -> tuple[tuple[str, Any], ...]:
    """A DeepSpeed config's RunSpec fields, read once per process; its warnings shown at each
    use (each line printed once: file_warnings.show)."""
    from simulator.inputs.file_warnings import show

    fields, warnings = _read_deepspeed(path)
    show(warnings)
    return fields


@lru_cache(maxsize=16)
def _read_deepspeed(path: str) -> tuple[tuple[tuple[str, Any], ...], tuple[str, ...]]:
    from simulator.inputs import deepspeed_config

    fields, warnings = deepspeed_config.read_settings(path)
    return tuple(fields.items()), warnings


TRAINING_OVERRIDES = ("framework", "kernels", "cross_entropy", "precision", "optimizer",
                      "optimizer_in_bwd", "attention", "padded", "software", "amp", "ddp")


def _training_value(key: str, value: Any) -> Any:
    """A RunSpec field as the training key it overrides (``--software`` is text)."""
    if key == "software":
        from simulator.catalog.software import parse_flag

        flag = parse_flag(value)
        if isinstance(flag, dict):
            from simulator.inputs.schema import SoftwareConfig

            return SoftwareConfig(torch=flag["torch"], cuda=flag.get("cuda"),
                                  transformers=flag.get("transformers"))
        return flag
    return value


def job_of(spec: RunSpec) -> Job:
    """The job a spec names, with its batch, sequence and training-recipe overrides."""
    flags = {k: getattr(spec, k) for k in (*TRAINING_OVERRIDES, "checkpointing")
             if getattr(spec, k) is not None}  # before a DeepSpeed config adds its own
    spec = configured(spec)
    training = tuple((k, _training_value(k, getattr(spec, k))) for k in TRAINING_OVERRIDES
                     if getattr(spec, k) is not None)
    try:
        job = load_job(spec.workload, spec.micro_batch, spec.seq_len, spec.grad_accum,
                       spec.checkpointing, training, spec.peft, spec.load_in_4bit, spec.ep)
    except InputError as exc:
        raise _as_flag_error(exc, flags) from None
    if job.recipe.optimizer_in_bwd and job.grad_accum > 1:
        raise InputError(f"{OPTIMIZER_IN_BWD_ACCUM} (grad_accum {job.grad_accum})")
    tokens = job.micro_batch * job.grad_accum * job.seq_len
    if tokens > MAX_STEP_TOKENS:
        raise InputError(f"micro-batch {job.micro_batch:,} x grad-accum {job.grad_accum:,} x "
                         f"seq-len {job.seq_len:,} = {tokens:,} tokens per GPU per step; at "
                         f"most {MAX_STEP_TOKENS:,} (docs/inputs.md: Limits)",
                         file=_deepspeed_source(spec, ("micro_batch", "grad_accum")))
    return job


def _as_flag_error(exc: InputError, flags: dict[str, Any]) -> InputError:
    """An error about a training key a flag set names that flag, not the workload's line."""
    key = (exc.key or "").removeprefix("training.")
    key = "checkpointing" if key == "activation_checkpointing" else key
    if key not in flags:
        return exc
    value = flags[key]
    flag = f"--{key.replace('_', '-')}" + ("" if isinstance(value, bool) else f" {value}")
    return InputError(f"{flag}: {exc.message}")


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
        unstaged = ("strategy" not in dict(_deepspeed_settings(path))
                    and "strategy" not in spec.explicit)
        raise InputError(f"zero_optimization: its offload ({spec.offload}) with -s "
                         f"{spec.strategy}" + (" (the file gives no stage)" if unstaged else "")
                         + f": {exc.message}", file=path) from None


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
    for what, used in (("amp o2 (apex: a 16-bit model beside fp32 master weights)",
                        job.recipe.amp_o2),
                       ("ddp apex (apex.parallel.DistributedDataParallel)",
                        job.recipe.ddp == "apex")):
        if used and spec.strategy not in ("ddp", "tp", "tp+ddp"):
            raise InputError(f"{what} with -s {spec.strategy}: modelled under -s ddp, tp and "
                             "tp+ddp only")
    if job.optimizer in PAGED and (spec.strategy != "ddp" or spec.pp > 1
                                             or spec.offload != "none"):
        raise InputError(f"optimizer {job.optimizer} with -s {spec.strategy}"
                         + (f" --pp {spec.pp}" if spec.pp > 1 else "")
                         + ": paged optimizer states are modelled under -s ddp only")


def check_attention(spec: RunSpec, job: Job, machine: Machine) -> None:
    """Refuse flash-attn on a GPU of the machine it does not run on: the --attention flag's
    choice, or the workload's (its file and key)."""
    sinks = job.arch is not None and job.arch.attention_sinks
    for gpu in machine.cards():
        problem = software.attention_gpu_problem(job.recipe.attention, gpu.compute_capability,
                                                 gpu.name, sinks=sinks)
        if problem is None:
            continue
        if spec.attention is not None:
            raise InputError(f"--attention {spec.attention}: {problem}")
        with blame(spec.workload, "workloads"):
            raise InputError(problem, key="training.attention")


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
    and TP x DDP are DDP over the world / tp replicas, TP x FSDP is FSDP over them; HSDP is
    FSDP over the GPUs of one box)."""
    return {"tp": "ddp", "tp+ddp": "ddp", "tp+fsdp": "fsdp", "hsdp": "fsdp"}.get(strategy,
                                                                                  strategy)


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
        allgather_bucket_size=spec.allgather_bucket_size,
        prefetch_bucket_size=spec.prefetch_bucket_size,
        allow_tp_across_nodes=spec.allow_tp_across_nodes)


def forget_jobs() -> None:
    """Drop every job and DeepSpeed config read so far (api.clear_caches)."""
    load_job.cache_clear()
    _read_deepspeed.cache_clear()
