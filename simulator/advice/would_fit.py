"""What would make one job fit, for `run`, `compare` and `sweep` when it does not.

Each change is a flag the user can add to the same command, checked with the memory model (no
simulation, milliseconds each): full activation checkpointing, the largest micro-batch that
fits, a sharded strategy (FSDP, ZeRO-3), offloading to host RAM. The first few that fit are
given, lightest change first; when none does, fallback.py's alternatives (adapters, more GPUs,
a card with more memory). Whether a change is fast is for `stepsim advise` to say.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from simulator import api
from simulator.api import RunSpec
from simulator.errors import InputError
from simulator.units import GiB

MAX_CHANGES = 3
SHARDED = ("fsdp", "zero3")


def _verdict(mem: dict[str, Any]) -> str:
    text = (f"needs {mem['peak_bytes'] / GiB:.1f} of {mem['capacity_bytes'] / GiB:.1f} GiB per "
            "GPU")
    if mem.get("host_peak_bytes"):
        text += (f", {mem['host_peak_bytes'] / GiB:,.0f} of the host's "
                 f"{mem['host_capacity_bytes'] / GiB:,.0f} GiB")
    return text


def _try(spec: RunSpec) -> dict[str, Any] | None:
    try:
        mem = api.memory_of(spec)
    except InputError:
        return None
    return mem if api.fits(mem) else None


def _strategy_flags(spec: RunSpec, strategy: str) -> list[str]:
    return [] if strategy == spec.strategy else ["-s", strategy]


def changes(spec: RunSpec) -> list[dict[str, Any]]:
    """Up to MAX_CHANGES changes that make ``spec`` fit: ``{"flags", "change", "detail"}``,
    the lightest first."""
    spec = api.configured(spec)
    job = api.job_of(spec)
    out: list[dict[str, Any]] = []

    def add(candidate: RunSpec, flags: list[str], change: str) -> None:
        if len(out) >= MAX_CHANGES or any(o["flags"] == " ".join(flags) for o in out):
            return
        mem = _try(candidate)
        if mem is not None:
            out.append({"flags": " ".join(flags), "change": change, "detail": _verdict(mem)})

    full = "full" if job.checkpointing != "full" and job.arch is not None else None
    if full:
        add(replace(spec, checkpointing="full"), ["--checkpointing", "full"],
            "full activation checkpointing")
    largest = _largest(spec)
    if largest and largest < job.micro_batch:
        add(replace(spec, micro_batch=largest), ["--micro-batch", str(largest)],
            f"micro-batch {largest}, the largest that fits")
    checkpoint = ["--checkpointing", "full"] if full else []
    for strategy in SHARDED:
        if spec.strategy == strategy or spec.tp or spec.pp > 1:
            continue
        sharded = replace(spec, strategy=strategy, checkpointing="full" if full else
                          spec.checkpointing, bucket_mb=None)
        add(sharded, [*_strategy_flags(spec, strategy), *checkpoint],
            f"{strategy} (parameters, gradients and optimizer states sharded)"
            + (" with full checkpointing" if full else ""))
    for strategy in SHARDED:
        if spec.tp or spec.pp > 1:
            break
        offloaded = replace(spec, strategy=strategy, offload="params",
                            checkpointing="full" if full else spec.checkpointing, bucket_mb=None)
        add(offloaded, [*_strategy_flags(spec, strategy), "--offload", "params", *checkpoint],
            f"{strategy} with parameters and optimizer states in host RAM"
            + (" and full checkpointing" if full else ""))
    if not out:
        from simulator.advice import fallback

        for w in fallback.what_would_fit(spec.topology, spec.workload, spec.peft,
                                         spec.load_in_4bit)[:MAX_CHANGES]:
            out.append({"flags": None, "change": w["change"], "detail": w["detail"]})
    return out


def _largest(spec: RunSpec) -> int:
    try:
        return api.largest_micro_batch(spec)
    except InputError:
        return 0
