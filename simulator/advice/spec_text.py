"""A candidate spec written out for the answer: the options the JSON lists under framework
names (and the spec back from them), its label in the text, and the `stepsim run` command that
simulates it alone.

Assumes ``RunSpec``'s defaults: a flag is written only where the spec differs from them.
"""

from __future__ import annotations

from typing import Any

from simulator.api import RunSpec


def options(spec: RunSpec) -> dict[str, Any]:
    """A candidate's choices, as the JSON lists them (framework option names)."""
    return {"topology": spec.topology, "workload": spec.workload, "strategy": spec.strategy,
            "tp": spec.tp, "pp": spec.pp, "schedule": spec.schedule if spec.pp > 1 else None,
            "virtual_stages": spec.virtual_stages, "grad_accum": spec.grad_accum,
            "offload": spec.offload, "pin_memory": spec.pin_memory,
            "micro_batch": spec.micro_batch, "activation_checkpointing": spec.checkpointing,
            "kernels": spec.kernels, "bucket_cap_mb": spec.bucket_mb,
            "overlap_comm": spec.zero_overlap_comm,
            "sequence_parallel": spec.sequence_parallel,
            "reshard_after_forward": spec.reshard_after_forward, "gpus": spec.gpus,
            "peft": spec.peft, "load_in_4bit": spec.load_in_4bit, "nnodes": spec.nnodes,
            **({"ep": spec.ep} if spec.ep > 1 else {}),
            **({"padded": True} if spec.padded else {})}


def spec_of(o: dict[str, Any]) -> RunSpec:
    """The spec ``options`` lists."""
    return RunSpec(o["topology"], o["workload"], o["strategy"], gpus=o["gpus"], tp=o["tp"],
                   pp=o["pp"], schedule=o["schedule"] or "1f1b",
                   virtual_stages=o["virtual_stages"], grad_accum=o["grad_accum"],
                   offload=o["offload"], pin_memory=o["pin_memory"],
                   micro_batch=o["micro_batch"], bucket_mb=o["bucket_cap_mb"],
                   checkpointing=o["activation_checkpointing"], kernels=o["kernels"],
                   zero_overlap_comm=o["overlap_comm"],
                   sequence_parallel=o["sequence_parallel"],
                   reshard_after_forward=o["reshard_after_forward"],
                   peft=o.get("peft"), load_in_4bit=bool(o.get("load_in_4bit")),
                   nnodes=o.get("nnodes"), ep=int(o.get("ep", 1)),
                   padded=True if o.get("padded") else None)


def run_command(spec: RunSpec) -> str:
    """The `stepsim run` command that simulates this candidate alone."""
    words = ["stepsim", "run", "-t", spec.topology, "-w", spec.workload, "-s", spec.strategy]
    if spec.gpus is not None:
        words += ["--gpus", str(spec.gpus)]
    if spec.nnodes is not None:
        words += ["--nnodes", str(spec.nnodes)]
    if spec.tp is not None:
        words += ["--tp", str(spec.tp)]
    if spec.ep > 1:
        words += ["--ep", str(spec.ep)]
    if spec.pp > 1:
        words += ["--pp", str(spec.pp), "--schedule", spec.schedule]
    if spec.virtual_stages > 1:
        words += ["--virtual-stages", str(spec.virtual_stages)]
    if spec.grad_accum is not None:
        words += ["--grad-accum", str(spec.grad_accum)]
    if spec.micro_batch is not None:
        words += ["--micro-batch", str(spec.micro_batch)]
    if spec.checkpointing is not None:
        words += ["--checkpointing", spec.checkpointing]
    if spec.kernels is not None:
        words += ["--kernels", spec.kernels]
    if spec.bucket_mb is not None:
        words += ["--bucket-mb", f"{spec.bucket_mb:g}"]
    if spec.offload != "none":
        words += ["--offload", spec.offload]
    if spec.pin_memory:
        words.append("--pin-memory")
    if spec.zero_overlap_comm:
        words.append("--overlap-comm")
    if spec.sequence_parallel:
        words.append("--sequence-parallel")
    if spec.peft is not None:
        words += ["--peft", spec.peft]
    if spec.load_in_4bit:
        words.append("--load-in-4bit")
    if spec.padded:
        words.append("--padded")
    if not spec.reshard_after_forward:
        words.append("--no-reshard-after-forward")
    return " ".join(words)


def label(spec: RunSpec) -> str:
    """``fsdp, checkpointing full, micro-batch 4`` and the like."""
    parts = [spec.strategy + (f" (TP {spec.tp})" if spec.tp else "")
             + (f" (EP {spec.ep})" if spec.ep > 1 else "")]
    if spec.pp > 1:
        schedule = ("interleaved 1F1B, " + f"{spec.virtual_stages} chunks a stage, "
                    if spec.schedule == "interleaved" else spec.schedule.upper() + ", ")
        parts = [f"pipeline of {spec.pp} stages ({schedule}{spec.grad_accum} micro-batches) x "
                 + parts[0]]
    if spec.offload != "none":
        parts.append(f"{spec.offload} offloaded to host RAM"
                     + (" (pinned)" if spec.pin_memory else ""))
    if spec.zero_overlap_comm:
        parts.append("overlap_comm")
    if spec.sequence_parallel:
        parts.append("sequence parallel")
    if not spec.reshard_after_forward:
        parts.append("no reshard after forward")
    if spec.kernels == "compiled":
        parts.append("torch.compile")
    if spec.checkpointing and spec.checkpointing != "none":
        parts.append(f"checkpointing {spec.checkpointing}")
    parts.append(f"micro-batch {spec.micro_batch}")
    if spec.grad_accum is not None and spec.grad_accum > 1 and spec.pp == 1:
        parts.append(f"grad accumulation {spec.grad_accum}")
    if spec.bucket_mb is not None:
        parts.append(f"buckets {spec.bucket_mb:g} MiB")
    return ", ".join(parts)
