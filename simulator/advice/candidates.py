"""The configurations `stepsim advise` weighs on one machine, and which of them fit.

Enumerated, with the frameworks' own option names: DDP (bucket_cap_mb 25, 5, 100), ZeRO-1,
ZeRO-2, ZeRO-3, FSDP with and without reshard_after_forward, each ZeRO stage and FSDP with
what it can offload to host RAM, tensor parallelism over every
GPU and TP x DP / TP x FSDP at every TP degree that divides the GPUs, each with and without
sequence parallelism; 1F1B pipelines at every stage count that divides the GPUs, DDP or FSDP
inside each stage; activation checkpointing none, selective, full; micro-batches in powers of
two up to the largest that fits, and that largest one. Any strategy the project adds to
``strategies.STRATEGIES`` with no recipe of its own is tried with its defaults.

Pruned by memory first (``api.memory_of``, no simulation). Dominated candidates are not
generated: more checkpointing at a micro-batch a lighter mode already fits only adds
recompute, and offloading at a micro-batch the same strategy fits without it only adds host
copies.
Advise simulates in two rounds: every recipe and mode at its largest micro-batch, then for the
leading few their smaller micro-batches (and DDP's other bucket sizes).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from simulator import api
from simulator.api import RunSpec
from simulator.errors import InputError
from simulator.inputs.schema import CHECKPOINTING_MODES
from simulator.strategies import STRATEGIES

DDP_BUCKETS_MB = (None, 5.0, 100.0)  # None: PyTorch's bucket_cap_mb default (25)
MAX_MICRO_BATCH = 1024


@dataclass(frozen=True)
class Recipe:
    """A strategy and its recipe flags, before checkpointing and micro-batch are chosen."""

    strategy: str
    tp: int | None = None
    sequence_parallel: bool = False
    reshard_after_forward: bool = True
    pp: int = 1  # pipeline stages (strategies/pipeline.py); the strategy runs in each stage
    grad_accum: int | None = None  # a pipeline's micro-batches per step
    offload: str = "none"  # to host RAM (job/host_memory.py): optimizer | params

    @property
    def family(self) -> str:
        """How the text groups what does not fit: DDP, ZeRO-1, FSDP, TP x FSDP, ..."""
        name = self.strategy if self.pp == 1 else f"pipeline x {self.strategy}"
        return name if self.offload == "none" else f"{name} with {self.offload} offload"


@dataclass
class Verdict:
    """A recipe at one checkpointing mode: the micro-batches that fit, or why none does."""

    recipe: Recipe
    checkpointing: str
    largest: int  # largest micro-batch that fits (0: none)
    memory: dict[str, Any]  # the verdict at the largest that fits, or at micro-batch 1


def recipes(n_gpus: int) -> list[Recipe]:
    """Every strategy and recipe for a machine of ``n_gpus``."""
    out = [Recipe("ddp"), Recipe("zero1"), Recipe("zero2"), Recipe("zero3"),
           Recipe("fsdp"), Recipe("fsdp", reshard_after_forward=False)]
    # offload to host RAM, as DeepSpeed (offload_optimizer, offload_param) and FSDP2
    # (CPUOffloadPolicy: parameters, gradients and optimizer states together) allow it
    out += [Recipe("zero1", offload="optimizer"), Recipe("zero2", offload="optimizer"),
            Recipe("zero3", offload="optimizer"), Recipe("zero3", offload="params"),
            Recipe("fsdp", offload="params")]
    if n_gpus > 1:
        for sp in (False, True):
            out.append(Recipe("tp", tp=n_gpus, sequence_parallel=sp))
            for degree in range(2, n_gpus):
                if n_gpus % degree == 0:
                    out.append(Recipe("tp+ddp", tp=degree, sequence_parallel=sp))
                    out.append(Recipe("tp+fsdp", tp=degree, sequence_parallel=sp))
    for pp in range(2, n_gpus + 1):  # 1F1B pipelines, each stage data-parallel inside
        if n_gpus % pp:
            continue
        inner = ("ddp", "fsdp") if n_gpus // pp > 1 else ("ddp",)
        out += [Recipe(s, pp=pp, grad_accum=pipeline_micro_batches(pp)) for s in inner]
    known = {r.strategy for r in out}
    out += [Recipe(name) for name in STRATEGIES if name not in known]
    return out


def pipeline_micro_batches(pp: int) -> int:
    """Micro-batches per step for a ``pp``-stage 1F1B pipeline: four per stage keep the bubble,
    (p - 1) / (m + p - 1), near 16% (Narayanan et al. 2021, arXiv:2104.04473: m >> p), at
    most 16 so that a candidate simulates in about a second."""
    return min(4 * pp, 16)


def _spec(base: RunSpec, recipe: Recipe, checkpointing: str, micro_batch: int) -> RunSpec:
    return replace(base, strategy=recipe.strategy, tp=recipe.tp,
                   sequence_parallel=recipe.sequence_parallel,
                   reshard_after_forward=recipe.reshard_after_forward,
                   checkpointing=checkpointing, micro_batch=micro_batch, pp=recipe.pp,
                   grad_accum=recipe.grad_accum if recipe.pp > 1 else base.grad_accum,
                   offload=recipe.offload)


_SPLITS: dict[RunSpec, dict[str, Any] | None] = {}


def fits(memory: dict[str, Any]) -> bool:
    """On the GPU, and for an offloading recipe in host RAM too."""
    return bool(memory["fits"]) and memory.get("host_fits") is not False


def _fits(spec: RunSpec) -> dict[str, Any] | None:
    """The memory verdict, or None when the recipe cannot run this job at all. A pipeline's
    stage split is taken once per recipe, at micro-batch 1 without checkpointing, for every
    micro-batch and mode of the search (it balances op time, which both scale about evenly
    over the layers); the simulated run checks the exact split, and advise ranks only runs
    that fit."""
    try:
        split = None
        if spec.pp > 1:
            key = replace(spec, micro_batch=1, checkpointing="none")
            if key not in _SPLITS:
                _SPLITS[key] = api.pipeline_split(key)
            split = _SPLITS[key]
        return api.memory_of(spec, split)
    except InputError:  # e.g. a TP degree that does not divide the heads
        return None


def largest_micro_batch(base: RunSpec, recipe: Recipe, checkpointing: str
                        ) -> Verdict | None:
    """Bisect the micro-batch (memory grows with it). None: the recipe does not apply."""
    first = _fits(_spec(base, recipe, checkpointing, 1))
    if first is None:
        return None
    if not fits(first):
        return Verdict(recipe, checkpointing, 0, first)
    lo, hi, best = 1, 2, first
    while hi <= MAX_MICRO_BATCH:
        mem = _fits(_spec(base, recipe, checkpointing, hi))
        if mem is None or not fits(mem):
            break
        lo, hi, best = hi, hi * 2, mem
    hi = min(hi, MAX_MICRO_BATCH + 1)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        mem = _fits(_spec(base, recipe, checkpointing, mid))
        if mem is not None and fits(mem):
            lo, best = mid, mem
        else:
            hi = mid
    return Verdict(recipe, checkpointing, lo, best)


def micro_batches(largest: int, above: int = 0) -> list[int]:
    """Powers of two up to ``largest`` and ``largest`` itself, all above ``above``."""
    sizes = {largest}
    b = 1
    while b < largest:
        sizes.add(b)
        b *= 2
    return sorted(s for s in sizes if s > above)


@dataclass
class Choices:
    """What advise simulates on one machine, in two rounds."""

    first: list[RunSpec]  # each recipe and checkpointing mode at its largest micro-batch
    smaller: dict[tuple[Recipe, str], list[RunSpec]]  # the smaller micro-batches of each
    verdicts: list[Verdict]  # every recipe's memory verdict, fitting or not


def enumerate_machine(base: RunSpec) -> Choices:
    """The specs worth simulating on ``base.topology`` and every recipe's memory verdict."""
    n_gpus = api.load_machine(base.topology, base.gpus).n_gpus
    choices = Choices([], {}, [])
    held: dict[tuple[str, str], int] = {}  # (strategy, mode) -> largest b without offload
    for recipe in recipes(n_gpus):
        fitted = 0  # the largest micro-batch a lighter checkpointing mode already fits
        for mode in CHECKPOINTING_MODES:  # none, selective, full: ever more recompute
            verdict = largest_micro_batch(base, recipe, mode)
            if verdict is None:
                break
            choices.verdicts.append(verdict)
            plain = recipe.offload == "none" and recipe.pp == 1 and recipe.tp is None
            if plain and recipe.reshard_after_forward:
                held[(recipe.strategy, mode)] = verdict.largest
            if recipe.offload != "none":  # host copies only slow a batch the GPU holds alone
                fitted = max(fitted, held.get((recipe.strategy, mode), 0))
            if verdict.largest <= fitted:
                continue
            largest = _spec(base, recipe, mode, verdict.largest)
            buckets = DDP_BUCKETS_MB[1:] if recipe.strategy == "ddp" and recipe.pp == 1 else ()
            choices.first.append(largest)
            choices.smaller[(recipe, mode)] = [  # round two: other buckets, smaller batches
                *(replace(largest, bucket_mb=mb) for mb in buckets),
                *(_spec(base, recipe, mode, b)
                  for b in micro_batches(verdict.largest, above=fitted)[:-1])]
            fitted = verdict.largest
    return choices


def recipe_of(spec: RunSpec) -> tuple[Recipe, str]:
    """The key of a spec's recipe and checkpointing mode in ``Choices.smaller``."""
    return (Recipe(spec.strategy, spec.tp, spec.sequence_parallel, spec.reshard_after_forward,
                   spec.pp, spec.grad_accum if spec.pp > 1 else None, spec.offload),
            spec.checkpointing or "none")


def options(spec: RunSpec) -> dict[str, Any]:
    """A candidate's choices, as the JSON lists them (framework option names)."""
    return {"topology": spec.topology, "workload": spec.workload, "strategy": spec.strategy,
            "tp": spec.tp, "pp": spec.pp, "grad_accum": spec.grad_accum,
            "offload": spec.offload,
            "micro_batch": spec.micro_batch, "activation_checkpointing": spec.checkpointing,
            "bucket_cap_mb": spec.bucket_mb, "sequence_parallel": spec.sequence_parallel,
            "reshard_after_forward": spec.reshard_after_forward, "gpus": spec.gpus}


def run_command(spec: RunSpec) -> str:
    """The `stepsim run` command that simulates this candidate alone."""
    words = ["stepsim", "run", "-t", spec.topology, "-w", spec.workload, "-s", spec.strategy]
    if spec.gpus is not None:
        words += ["--gpus", str(spec.gpus)]
    if spec.tp is not None:
        words += ["--tp", str(spec.tp)]
    if spec.pp > 1:
        words += ["--pp", str(spec.pp)]
    if spec.grad_accum is not None:
        words += ["--grad-accum", str(spec.grad_accum)]
    if spec.micro_batch is not None:
        words += ["--micro-batch", str(spec.micro_batch)]
    if spec.checkpointing is not None:
        words += ["--checkpointing", spec.checkpointing]
    if spec.bucket_mb is not None:
        words += ["--bucket-mb", f"{spec.bucket_mb:g}"]
    if spec.offload != "none":
        words += ["--offload", spec.offload]
    if spec.sequence_parallel:
        words.append("--sequence-parallel")
    if not spec.reshard_after_forward:
        words.append("--no-reshard-after-forward")
    return " ".join(words)


def label(spec: RunSpec) -> str:
    """``fsdp, checkpointing full, micro-batch 4`` and the like."""
    parts = [spec.strategy + (f" (TP {spec.tp})" if spec.tp else "")]
    if spec.pp > 1:
        parts = [f"pipeline of {spec.pp} stages (1F1B, {spec.grad_accum} micro-batches) x "
                 + parts[0]]
    if spec.offload != "none":
        parts.append(f"{spec.offload} offloaded to host RAM")
    if spec.sequence_parallel:
        parts.append("sequence parallel")
    if not spec.reshard_after_forward:
        parts.append("no reshard after forward")
    if spec.checkpointing and spec.checkpointing != "none":
        parts.append(f"checkpointing {spec.checkpointing}")
    parts.append(f"micro-batch {spec.micro_batch}")
    if spec.bucket_mb is not None:
        parts.append(f"buckets {spec.bucket_mb:g} MiB")
    return ", ".join(parts)
