"""When no configuration of a job fits a machine: what would.

Each alternative is checked with the memory model (job/memory.py), not guessed: the same model
with LoRA or QLoRA adapters (rank 16 on every linear layer of a block, as the QLoRA paper
recommends), the same job sharded over more GPUs of the same card (FSDP, full
checkpointing), the optimizer states moved to host memory (ZeRO-Offload / FSDP CPU offload),
and the same machine with a card that has more memory. Memory only: the speed of an
alternative is for `stepsim advise` on it.
"""

from __future__ import annotations

from typing import Any

from simulator import api
from simulator.errors import InputError
from simulator.inputs.config import load_workload
from simulator.inputs.schema import LoraConfig
from simulator.job import memory
from simulator.job.workload import Job
from simulator.machine import collectives, hardware
from simulator.strategies import STRATEGIES
from simulator.units import GiB

# QLoRA (Dettmers et al. 2023, arXiv:2305.14314): adapters on all linear layers of a block
ADAPTERS = LoraConfig(rank=16, alpha=32, targets=["q_proj", "k_proj", "v_proj", "o_proj",
                                                  "gate_proj", "up_proj", "down_proj"])
SHARDED = ("fsdp", "zero3")
MORE_GPUS = (2, 4, 8, 16, 32, 64)  # times the machine's GPUs


def _estimate(job: Job, gpu: hardware.GPU, strategy: str, world: int, channels: int
              ) -> memory.MemoryReport | None:
    try:
        return memory.estimate(job, gpu, strategy, world=world, nccl_channels=channels)
    except InputError:
        return None


def _need(report: memory.MemoryReport) -> str:
    return f"needs {report.peak_bytes / GiB:.1f} of {report.capacity_bytes / GiB:.1f} GiB per GPU"


def _adapters(cfg: Any, finetune: str, gpu: hardware.GPU, world: int, channels: int
              ) -> dict[str, Any] | None:
    """The job with LoRA or QLoRA adapters on the same machine: the first strategy that fits."""
    if cfg.model is None or cfg.model.family not in ("llama", "mpt", "gpt2"):
        return None
    targets = ADAPTERS if cfg.model.family == "llama" else None
    try:
        variant = cfg.with_training(finetune=finetune, lora=targets,
                                    activation_checkpointing="full")
        job = Job.from_config(variant, micro_batch=1)
    except InputError:
        return None
    for strategy in ("ddp", "fsdp"):
        report = _estimate(job, gpu, strategy, world, channels)
        if report is not None and report.fits:
            what = "LoRA" if finetune == "lora" else "QLoRA (4-bit NF4 base)"
            return {"change": f"{what}, rank 16 on every linear layer",
                    "fits": True, "strategy": strategy, "gpus": world,
                    "peak_bytes": report.peak_bytes,
                    "detail": f"{strategy} with full checkpointing {_need(report)} "
                              f"({report.trainable_parameters:,} trainable parameters)"}
    return None


def what_would_fit(topology: str, workload: str) -> list[dict[str, Any]]:
    """The alternatives that fit, each with what it changes and what it needs."""
    machine = api.load_machine(topology)
    gpu, world = machine.gpu, machine.n_gpus
    channels = collectives.machine_channels(machine)
    cfg = load_workload(workload)
    full = cfg.with_training(activation_checkpointing="full")
    job = Job.from_config(full, micro_batch=1)
    out: list[dict[str, Any]] = []
    if cfg.training.finetune == "full":
        for finetune in ("lora", "qlora"):
            found = _adapters(cfg, finetune, gpu, world, channels)
            if found:
                out.append(found)
    for factor in MORE_GPUS:
        report = _estimate(job, gpu, "fsdp", world * factor, channels)
        if report is not None and report.fits:
            boxes = f"{factor} such machines" if factor > 1 else "this machine"
            out.append({"change": f"{world * factor} x {gpu.name} ({boxes})", "fits": True,
                        "strategy": "fsdp", "gpus": world * factor,
                        "peak_bytes": report.peak_bytes,
                        "detail": f"FSDP over all of them with full checkpointing "
                                  f"{_need(report)}; stepsim models one node, so their speed "
                                  "over the network is not simulated"})
            break
    out += _offload(job, gpu, world, channels)
    out += _bigger_cards(job, gpu, world, channels)
    return out


def _offload(job: Job, gpu: hardware.GPU, world: int, channels: int) -> list[dict[str, Any]]:
    """Optimizer states in host memory, from the sharded strategy's own breakdown."""
    offloading = [s for s in STRATEGIES if "offload" in s]
    for strategy in offloading:  # a strategy of its own, where the project has one
        report = _estimate(job, gpu, strategy, world, channels)
        if report is not None and report.fits:
            return [{"change": f"{strategy} (optimizer states in host memory)", "fits": True,
                     "strategy": strategy, "gpus": world, "peak_bytes": report.peak_bytes,
                     "detail": f"{strategy} with full checkpointing {_need(report)}"}]
    if offloading:
        return []
    report = _estimate(job, gpu, "fsdp", world, channels)
    if report is None:
        return []
    optimizer = report.category_bytes("optimizer")
    peak = report.peak_bytes - optimizer  # the step's peak holds the optimizer states
    if peak > report.capacity_bytes:
        return []
    return [{"change": "optimizer states in host memory (ZeRO-Offload, FSDP CPU offload)",
             "fits": True, "strategy": "fsdp", "gpus": world, "peak_bytes": int(peak),
             "detail": f"FSDP with full checkpointing and the Adam states on the CPU would "
                       f"need about {peak / GiB:.1f} of {report.capacity_bytes / GiB:.1f} GiB "
                       f"per GPU and {optimizer * world / GiB:.0f} GiB of host memory "
                       "(memory model only: offload's speed is not simulated)"}]


def _bigger_cards(job: Job, gpu: hardware.GPU, world: int, channels: int
                  ) -> list[dict[str, Any]]:
    """The smallest cards of the catalog, with more memory, on which the job fits sharded."""
    bigger = sorted((g for g in hardware.GPUS.values() if g.memory_bytes > gpu.memory_bytes),
                    key=lambda g: (g.memory_bytes, g.price_usd or 0))
    out: list[dict[str, Any]] = []
    for card in bigger:
        report = _estimate(job, card, "fsdp", world, channels)
        if report is not None and report.fits:
            out.append({"change": f"a box of {world} x {card.name} "
                                  f"({card.memory_bytes / GiB:.0f} GiB)", "fits": True,
                        "strategy": "fsdp", "gpus": world, "peak_bytes": report.peak_bytes,
                        "detail": f"FSDP with full checkpointing {_need(report)}"})
        if len(out) == 2:
            break
    return out
