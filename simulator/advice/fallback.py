"""When no configuration of a job fits a machine: what would.

Each alternative is checked with the memory model (memory/estimate.py), not guessed: the same model
with LoRA or QLoRA adapters (rank 16 on every linear layer of a block, as the QLoRA paper
recommends), the same job sharded over more GPUs of the same card (FSDP, full
checkpointing), and the same machine with a card that has more memory. Offloading to host RAM
is among advise's own candidates, so it is not repeated here. Memory only: the speed of an
alternative is for `stepsim advise` on it.
"""

from __future__ import annotations

from typing import Any

from simulator import api
from simulator.catalog import gpus as gpu_catalog
from simulator.errors import InputError
from simulator.inputs.config import load_workload
from simulator.inputs.schema import LoraConfig
from simulator.job.workload import Job
from simulator.memory import estimate as memory
from simulator.units import GiB

# QLoRA (Dettmers et al. 2023, arXiv:2305.14314): adapters on all linear layers of a block
ADAPTERS = LoraConfig(rank=16, alpha=32, targets=["q_proj", "k_proj", "v_proj", "o_proj",
                                                  "gate_proj", "up_proj", "down_proj"])
SHARDED = ("fsdp", "zero3")
MORE_GPUS = (2, 4, 8, 16, 32, 64)  # times the machine's GPUs


def _estimate(job: Job, gpu: gpu_catalog.GPU, strategy: str, world: int, channels: int
              ) -> memory.MemoryReport | None:
    try:
        return memory.estimate(job, gpu, strategy, world=world, nccl_channels=channels)
    except InputError:
        return None


def _need(report: memory.MemoryReport) -> str:
    return f"needs {report.peak_bytes / GiB:.1f} of {report.capacity_bytes / GiB:.1f} GiB per GPU"


def _adapters(cfg: Any, finetune: str, gpu: gpu_catalog.GPU, world: int, channels: int
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


def what_would_fit(topology: str, workload: str, peft: str | None = None,
                   load_in_4bit: bool = False) -> list[dict[str, Any]]:
    """The alternatives that fit, each with what it changes and what it needs (the workload
    with the adapters of ``peft``, as `run --peft` reads them)."""
    comm = api.load_communicator(topology)
    gpu, world = comm.machine.gpu, comm.n_gpus
    channels = comm.channels()
    cfg = api.with_adapters(load_workload(workload), peft, load_in_4bit)
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
                                  f"{_need(report)}"
                                  + (f"; --nnodes {factor} simulates them joined by the "
                                     "topology's network" if factor > 1 else "")})
            break
    out += _more_host_memory(topology, workload)
    out += _bigger_cards(job, gpu, world, channels)
    return out


def _more_host_memory(topology: str, workload: str) -> list[dict[str, Any]]:
    """An offloading recipe the GPUs would hold, on a host with the RAM it needs."""
    from simulator.api import RunSpec

    best: dict[str, Any] | None = None
    for strategy, offload in (("fsdp", "params"), ("zero3", "params"), ("zero3", "optimizer")):
        spec = RunSpec(topology, workload, strategy, offload=offload, checkpointing="full",
                       micro_batch=1)
        try:
            mem = api.memory_of(spec)
        except InputError:
            continue
        if mem["fits"] and mem.get("host_fits") is False and (
                best is None or mem["host_peak_bytes"] < best["host_peak_bytes"]):
            best = dict(mem, strategy=strategy, offload=offload)
    if best is None:
        return []
    need = best["host_peak_bytes"] / GiB
    return [{"change": f"{best['strategy']} with {best['offload']} offloaded to a host with "
                       f"{need:,.0f} GiB of RAM", "fits": True, "strategy": best["strategy"],
             "gpus": best["world"], "peak_bytes": best["peak_bytes"],
             "detail": f"with full checkpointing the GPUs hold {best['peak_bytes'] / GiB:.1f} "
                       f"of {best['capacity_bytes'] / GiB:.1f} GiB; host RAM needs {need:,.0f} "
                       f"GiB (this machine: {best['host_capacity_bytes'] / GiB:,.0f})"}]


def _bigger_cards(job: Job, gpu: gpu_catalog.GPU, world: int, channels: int
                  ) -> list[dict[str, Any]]:
    """The smallest cards of the catalog, with more memory, on which the job fits sharded."""
    bigger = sorted((g for g in gpu_catalog.GPUS.values() if g.memory_bytes > gpu.memory_bytes),
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
