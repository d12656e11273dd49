"""One simulated step, the whole `stepsim run` pipeline: the spec's job and machine, the
strategy's programs, the engine on NCCL's communicator over the machine, the report (with its
cost and energy), the one-GPU baseline it scales against, and the ranges on request."""

from __future__ import annotations

import copy
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

from simulator import engine, memo, strategies
from simulator.api import spec as specs
from simulator.api import verdict
from simulator.api.confidence import grade_run
from simulator.api.spec import (
    RunSpec,
    _tp_degree,
    check_attention,
    check_offload,
    check_optimizer,
    check_size,
    configured,
    job_of,
)
from simulator.api.verdict import _memory, _memory_verdict, strategy_options
from simulator.catalog import gpus as gpu_catalog
from simulator.catalog import software
from simulator.engine.program import Program
from simulator.engine.timeline import Timeline
from simulator.errors import InputError
from simulator.inputs.config import is_hf_config, load_topology, load_workload, preset_names
from simulator.inputs.schema import TopologyConfig, WorkloadConfig
from simulator.job.ops import flops_counted
from simulator.job.workload import Job
from simulator.machine.build import blame, forget_machines, load_machine
from simulator.machine.scales import RateScales
from simulator.machine.topology import Machine
from simulator.nccl.communicator import (
    Communicator,
    forget_communicators,
    load_communicator,
    transport_effects,
)
from simulator.outputs import cost, energy, report
from simulator.strategies import steps
from simulator.strategies.options import DDP_STRATEGIES, check_pipeline, check_recipe


@dataclass
class RunResult:
    """One simulated step: what was asked, what it ran on, and everything it produced."""

    spec: RunSpec
    machine: Machine
    comm: Communicator  # NCCL over the machine: transports, rings, every collective's plan
    job: Job
    programs: list[Program]  # one per group of identical ranks
    timeline: Timeline
    memory: dict[str, Any]
    report: dict[str, Any]


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
        return gpu_catalog.PRICE_SOURCES.get(next(iter(names)))
    return "the mean of " + "; ".join(f"{name}: {gpu_catalog.PRICE_SOURCES.get(name, 'unknown')}"
                                      for name in names)


def _machine_usd_per_hour(machine: Machine) -> float | None:
    """The whole machine's rent per hour: the file's box price per box, plus the network's."""
    per_box = machine.config.price_usd_per_hour
    if per_box is None or machine.nnodes == 1:
        return per_box
    network = machine.config.network
    extra = network.price_usd_per_hour if network and network.price_usd_per_hour else 0.0
    return per_box * machine.nnodes + extra


def _network_price(machine: Machine) -> tuple[float, str] | None:
    """What buying the network between the boxes adds to the purchase (None: one box, or the
    topology gives no `network.price_usd`)."""
    network = machine.config.network
    if machine.nnodes == 1 or network is None or network.price_usd is None:
        return None
    return network.price_usd, "topology network.price_usd"


def calibration_summary(machine: Machine, workload: str) -> dict[str, Any]:
    """The topology's calibration as a run uses it: what was fitted, and whether this job's
    compute rests on a measured step."""
    calibration = machine.calibration
    assert calibration is not None
    compute = [c for c in calibration.compute if c.workload == workload]
    others = sorted({c.workload for c in calibration.compute} - {workload})
    return {"source": calibration.source,
            "fitted": {f.parameter: f.value for f in calibration.fitted},
            # the logs contradicted the machine and were fitted anyway (--force)
            "forced": calibration.forced or None,
            "at_bound": {f.parameter: f.at_bound for f in calibration.fitted if f.at_bound},
            "compute_achieved_fraction": {c.gpu: c.achieved_fraction for c in compute} or None,
            "compute_calibrated_for_other_workloads": others}


def presets(kind: str) -> list[tuple[str, TopologyConfig | WorkloadConfig]]:
    """The bundled topologies or workloads (``kind``), by name, as loaded and validated."""
    load = load_topology if kind == "topologies" else load_workload
    return [(name, load(name)) for name in preset_names(kind)]


def _channel_note(comm: Communicator, plain: Communicator) -> list[str]:
    """NCCL_MIN/MAX_NCHANNELS and NCCL_ALGO/PROTO, as a training step feels them."""
    out = []
    if comm.n_gpus > 1:
        now, was = comm.channels(), plain.channels()
        if now != was:
            out.append(f"{now} channels where NCCL would run {was}")
    for name in ("NCCL_ALGO", "NCCL_PROTO"):
        value = dict(comm.env.settings).get(name)
        if value is not None:
            out.append(f"{name}={value}: every collective of the step chooses among what it "
                       "leaves")
    return out


def degrees(spec: RunSpec, job: Job, machine: Machine, dp: int) -> dict[str, Any]:
    """What was simulated, as numbers: the parallel degrees, the batch, the bucket size."""
    ddp = spec.strategy in DDP_STRATEGIES and dp > 1  # torch DDP buckets the gradients
    bucket_mb = None
    if ddp:  # the bucketing module, only for a job that buckets
        from simulator.strategies.buckets import DEFAULT_BUCKET_CAP_MB

        bucket_mb = spec.bucket_mb or DEFAULT_BUCKET_CAP_MB
    return {"parallelism": {"world": machine.n_gpus, "tp": _tp_degree(spec, machine), "dp": dp,
                            "pp": spec.pp, **({"ep": spec.ep} if spec.ep > 1 else {}),
                            **({"nnodes": machine.nnodes} if machine.nnodes > 1 else {})},
            "micro_batch": job.micro_batch, "seq_len": job.seq_len,
            "grad_accum": job.grad_accum,
            "bucket_mb": bucket_mb}


def recipe(spec: RunSpec, job: Job | None = None) -> dict[str, Any]:
    """The recipe flags as the report lists them (framework option names); with ``job``, the
    checkpointing the job actually runs (the workload's unless overridden)."""
    checkpointing = job.checkpointing if job is not None else spec.checkpointing
    training = job.recipe_json() if job is not None else {}
    return {**training, "activation_checkpointing": checkpointing,
            "comm_hook": spec.grad_compression,
            "gradient_as_bucket_view": spec.gradient_as_bucket_view,
            "sequence_parallel": spec.sequence_parallel,
            "reshard_after_forward": spec.reshard_after_forward,
            "overlap_comm": bool(spec.zero_overlap_comm), "offload": spec.offload,
            "pin_memory": spec.pin_memory,
            **{key: getattr(spec, key) for key in ("reduce_bucket_size", "allgather_bucket_size",
                                                   "prefetch_bucket_size")
               if getattr(spec, key) is not None}}  # DeepSpeed's, when its config gave them


def single_gpu_tokens_per_s(spec: RunSpec) -> float | None:
    """Tokens/s of one GPU of the same machine with the same per-GPU batch (None: won't fit).

    Simulated once per distinct one-GPU step, however many points of a sweep, comparison or
    advice share it: of the spec only what one GPU runs is kept (the machine, the job, its
    batch and recipe, the compute rate scale); the parallelism flags (strategy, GPUs, TP,
    pipeline, buckets, overlap, comm hook, FSDP/ZeRO options) and the transports' rate scales
    are dropped, as on one GPU nothing is communicated.
    """
    spec = configured(spec)  # its batch and precision; nothing else of it runs on one GPU
    return _single_gpu(replace(spec, strategy="ddp", gpus=1, tp=None, ep=1, bucket_mb=None,
                               scales=RateScales(compute=spec.scales.compute),
                               overlap=True, grad_compression="none",
                               gradient_as_bucket_view=False, sequence_parallel=False,
                               reshard_after_forward=True, zero_overlap_comm=None, pp=1,
                               schedule="1f1b", virtual_stages=1,
                               offload="none", pin_memory=None, deepspeed=None,
                               explicit=frozenset(), reduce_bucket_size=None,
                               allgather_bucket_size=None, prefetch_bucket_size=None,
                               nnodes=1, allow_tp_across_nodes=False))


@lru_cache(maxsize=64)
def _single_gpu(one: RunSpec) -> float | None:
    job = job_of(one)
    comm = load_communicator(one.topology, 1, one.scales, one.nccl, nnodes=1)
    one_gpu = comm.machine.for_job(job.name, job.software, precision=job.precision)
    if not _memory(job, one_gpu, one)["fits"]:
        return None
    programs = strategies.build("ddp", job, one_gpu, strategy_options(one, job, one_gpu))
    timeline = engine.simulate(programs, comm, compute_slowdown=one.compute_slowdown)
    tokens = job.tokens_per_micro_batch * job.grad_accum
    return tokens / timeline.step_time if timeline.step_time > 0 else None


def config_files(spec: RunSpec, job: Job) -> dict[str, Any] | None:
    """The Hugging Face, PEFT and DeepSpeed files a spec read, with the parameter count they
    give (to hold against the model card); None when it read none."""
    out: dict[str, Any] = {}
    if is_hf_config(spec.workload):
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
    forget_communicators()
    verdict.forget_verdicts()
    _ONE_GPU_RUNS.clear()
    specs.forget_jobs()
    _single_gpu.cache_clear()
    steps.forget_op_times()
    memo.forget_all()


def simulate(spec: RunSpec, *, baseline: bool = True, prices: cost.Prices | None = None,
             ranges: bool = False) -> RunResult:
    """Build the program, simulate it, and measure it: the whole `run` pipeline.

    ``prices``: the user's prices for the report's ``cost`` block (default: the topology's).
    ``ranges``: add ``<key>_range`` beside the headline keys (api/ranges.py: a few more
    simulations at the ends of the mechanisms' validation spreads).
    """
    spec = configured(spec)
    if load_machine(spec.topology, spec.gpus, nnodes=spec.nnodes).n_gpus == 1 and \
            spec.bucket_mb is not None:
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


def _job_and_machine(spec: RunSpec) -> tuple[Job, Machine, Communicator]:
    """The spec's job, its machine as that job runs on it (scaled, the compute fraction
    measured for the job), and NCCL over it under the spec's variables."""
    job = job_of(spec)
    comm = load_communicator(spec.topology, spec.gpus, spec.scales, spec.nccl, spec.nnodes)
    return job, comm.machine.for_job(job.name, job.software, precision=job.precision), comm


def _programs(spec: RunSpec, job: Job, machine: Machine) -> list[Program]:
    return strategies.build(spec.strategy, job, machine, strategy_options(spec, job, machine))


def check(spec: RunSpec, job: Job, machine: Machine) -> None:
    """Every check a spec passes before it is simulated (InputError, one line, otherwise):
    the same whether it is then simulated or only judged by its memory (answer.py)."""
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
    check_attention(spec, job, machine)
    with blame(spec.workload, "workloads"):  # its layers make the step too large
        check_size(job)


def _simulate(spec: RunSpec, baseline: bool, prices: cost.Prices | None,
              ranges: bool) -> RunResult:
    job, machine, comm = _job_and_machine(spec)
    check(spec, job, machine)
    # a job the strategy cannot split, too long a step; or a route the machine lacks
    with blame(spec.workload, "workloads", machine, spec.topology):
        programs = _programs(spec, job, machine)
        timeline = engine.simulate(programs, comm, compute_slowdown=spec.compute_slowdown)
    meta = programs[0].meta
    mem = _memory_verdict(spec, job, machine, meta.get("pipeline"))
    dp = int(meta.get("dp", machine.n_gpus))  # replicas that each take a batch
    tokens = job.tokens_per_micro_batch * job.grad_accum * dp
    machine_gpus = load_machine(spec.topology, nnodes=spec.nnodes).n_gpus
    power = energy.step_energy(timeline, machine, tokens,
                               host_share=machine.n_gpus / machine_gpus)
    step = timeline.step_time
    costs, basis = cost.run_cost(
        step_time_s=step, tokens_per_s=tokens / step if step > 0 else 0.0,
        gpus=machine.n_gpus, machine_gpus=machine_gpus, prices=prices or cost.Prices(),
        machine_usd_per_hour=_machine_usd_per_hour(machine),
        card_price_usd=_card_price(machine),
        card_price_source=_card_price_source(machine),
        avg_power_w=power["avg_power_w"], network=_network_price(machine))
    metrics = report.step_report(
        timeline,
        tokens_per_step=tokens,
        samples_per_step=job.micro_batch * job.grad_accum * dp,
        model_flops_per_step=job.model_flops_per_step() * dp,
        hardware_flops_per_step=job.hardware_flops_per_step() * dp,
        flops_counted=flops_counted(job),
        peak_flops=sum(machine.gpu_of(r).matmul_flops for r in range(machine.n_gpus))
        / machine.n_gpus,  # MFU against the box's mean card on a mixed box
        memory=mem,
        baseline_tokens_per_s=single_gpu_tokens_per_s(spec) if baseline else None,
        gpu_price_usd=_mean_card_price(machine),
        cost=costs, cost_basis=basis, energy=power,
        extra={"topology": machine.name, "workload": job.name, "strategy": spec.strategy,
               "gpu": machine.gpu.name, "tokens_per_step": tokens,
               "overlap": spec.overlap, "recipe": recipe(spec, job),
               "software": software.rows_used(
                   job.software, machine.gpu.arch,
                   software.kernel_on_gpu(job.attention_kernel, job.recipe.attention,
                                          machine.gpu.compute_capability)
                   if job.has_attention else None,
                   own_gemm=machine.gpu.own_matmul,
                   half_dtype_share=machine.gpu.half_dtype_share,
                   hf_mask=job.hf_mask_every_call and not job.training.padded),
               **degrees(spec, job, machine, dp)},
    )
    files = config_files(spec, job)
    if files is not None:  # what came from the user's own config files
        metrics["config_files"] = files
    link = metrics["bottleneck"]["link"]
    metrics["bottleneck"]["description"] = machine.describe(link) if link else None
    if machine.nnodes > 1:  # several boxes: how NCCL crosses between them
        net = comm.net
        nic = net.nearest(0)
        metrics["network"] = {"nnodes": machine.nnodes, "gpus_per_box": machine.gpus_per_box,
                              "plugin": net.name, "nic": nic,
                              "gpudirect_rdma": net.gdr(0, nic, read=False).used,
                              "transport": net.describe()}
    if machine.calibration is not None:  # a calibrated machine says so, and what it holds
        metrics["calibration"] = calibration_summary(machine, job.name)
    if spec.nccl.active:  # what NCCL's variables did to this machine
        plain = load_communicator(spec.topology, spec.gpus, spec.scales, nnodes=spec.nnodes)
        metrics["nccl_env"] = {"variables": dict(spec.nccl.settings),
                               "ignored": list(spec.nccl.ignored),
                               "effects": transport_effects(comm, plain)
                               + _channel_note(comm, plain)}
    cards = machine.cards()
    if len(cards) > 1:  # a mixed box: which card each rank group runs
        metrics["cards"] = {card.name: list(ranks) for card, ranks in cards.items()}
        for entry in metrics.get("ranks", []):
            entry["gpu"] = machine.gpu_of(entry["gpus"][0]).name
    result = RunResult(spec, machine, comm, job, programs, timeline, mem, metrics)
    metrics["confidence"] = grade_run(result)
    if ranges:
        from simulator.api.ranges import add_ranges

        add_ranges(result, rerun=lambda s: simulate(s, baseline=False, prices=prices).report,
                   step_time=step_time, one_gpu=single_gpu_tokens_per_s)
    return result


def step_time(spec: RunSpec, programs: list[Program] | None = None) -> float:
    """The step time alone of a spec ``simulate`` has run (its checks passed): no report, no
    link history. ``programs``: the ones ``simulate`` built for the same job and machine
    where the caller has them; a re-run that changes only the transports' rates runs the same
    programs (the strategies read no transport, tests/test_ranges.py)."""
    spec = configured(spec)
    job, machine, comm = _job_and_machine(spec)
    with blame(spec.workload, "workloads", machine, spec.topology):
        if programs is None:
            programs = _programs(spec, job, machine)
        return engine.step_time(programs, comm, compute_slowdown=spec.compute_slowdown)


def run(spec: RunSpec, **options: Any) -> dict[str, Any]:
    """``simulate(spec, **options).report``: the JSON-able answer alone, what a worker process
    sends back (a module-level function, so executors pickle it by name)."""
    return simulate(spec, **options).report
