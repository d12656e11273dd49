"""The configurations `stepsim advise` weighs on one machine, and which of them fit.

Every dimension is a choice a user of the frameworks makes, under the frameworks' own names:

- the strategy: DDP, ZeRO-1, ZeRO-2, ZeRO-3, FSDP with and without reshard_after_forward;
  each ZeRO stage and FSDP with what it can offload to host RAM; tensor parallelism over every
  GPU, TP x DP and TP x FSDP at every TP degree that divides the GPUs, each with and without
  sequence parallelism; pipelines at every stage count that divides the GPUs, DDP or FSDP
  inside each stage, under 1F1B and interleaved 1F1B. Any strategy the project adds to
  ``strategies.STRATEGIES`` with no recipe of its own is tried with its defaults;
- activation checkpointing, every mode of ``CHECKPOINTING_MODES`` (none, selective, op, full);
- the kernel regime, eager or ``torch.compile``, where the workload's framework has the switch
  and the workload does not fix ``kernels`` itself;
- the micro-batch: the largest that fits, then (``variants``) every smaller one and each
  lighter checkpointing mode's largest, each at the gradient accumulation that keeps the
  sequences per optimizer step, so that a smaller micro-batch competes at the same batch, not
  at a smaller one (it wins when less recompute or fewer host copies per sequence pay for
  smaller GEMMs); DDP's bucket_cap_mb; DeepSpeed's overlap_comm and pin_memory where they
  apply.

Pruned by memory first (``api.memory_of``, no simulation). Dominated candidates are not
generated: more checkpointing at a micro-batch a lighter mode already fits only adds
recompute, offloading at a micro-batch the same strategy fits without it only adds host
copies, GPipe holds every micro-batch's activations for 1F1B's bubble, so it is not tried, and
eager kernels are tried first only where torch.compile fits a smaller micro-batch.
advise.py simulates the choices at their largest micro-batch, then their variants, each
where bound.py says it could still change the answer.
spec_text.py writes a chosen spec out (its options, label and `stepsim run` command).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Any

from simulator import api
from simulator.api import RunSpec
from simulator.errors import InputError
from simulator.inputs.schema import CHECKPOINTING_MODES
from simulator.strategies import STRATEGIES

# bucket_cap_mb besides PyTorch's default 25 (None): 1 and 5 start the all-reduce earlier in
# backward, 100 pays the per-call latency fewer times (torch/nn/parallel/distributed.py)
DDP_BUCKETS_MB = (1.0, 5.0, 100.0)
MAX_MICRO_BATCH = 1024
# every micro-batch size is tried up to this many tokens (a GEMM's rows); above it only powers
# of two and the largest: the compute model's GEMM rates are those of 8192-row GEMMs
# (job/compute.py REFERENCE_GEMM), so past it neighbouring sizes differ only by wave
# quantisation
EVERY_SIZE_UP_TO_TOKENS = 8192
# the frameworks whose eager default has a torch.compile switch (job/recipe.py: hf
# TrainingArguments.torch_compile, torchtune and torchtitan ``compile``, llm-foundry Composer's
# ``compile_config``); megatron runs Transformer Engine's fused kernels, no choice to make
COMPILE_SWITCH = ("hf", "torchtune", "torchtitan", "llm-foundry")
MAX_PIPELINE_MICRO_BATCHES = 16  # a pipeline simulates each micro-batch: about 1 s at 16


@dataclass(frozen=True)
class Recipe:
    """A strategy and its recipe flags, before checkpointing and micro-batch are chosen."""

    strategy: str
    tp: int | None = None
    sequence_parallel: bool = False
    reshard_after_forward: bool = True
    pp: int = 1  # pipeline stages (strategies/pipeline.py); the strategy runs in each stage
    grad_accum: int | None = None  # a pipeline's micro-batches per step
    offload: str = "none"  # to host RAM (memory/host.py): optimizer | params
    kernels: str | None = None  # None: the workload's; "compiled": torch.compile
    schedule: str = "1f1b"
    virtual_stages: int = 1  # model chunks per stage (the interleaved schedule)
    ep: int = 1  # expert parallelism (strategies/expert.py), a mixture of experts only

    @property
    def family(self) -> str:
        """How the text groups what does not fit: DDP, ZeRO-1, FSDP, TP x FSDP, ..."""
        name = self.strategy if self.pp == 1 else f"pipeline x {self.strategy}"
        name = name if self.ep == 1 else f"{name} with EP {self.ep}"
        return name if self.offload == "none" else f"{name} with {self.offload} offload"


@dataclass
class Verdict:
    """A recipe at one checkpointing mode: the micro-batches that fit, or why none does."""

    recipe: Recipe
    checkpointing: str
    largest: int  # largest micro-batch that fits (0: none)
    memory: dict[str, Any]  # the verdict at the largest that fits, or at micro-batch 1


def kernel_regimes(base: RunSpec) -> tuple[str | None, ...]:
    """The workload's own kernels, and torch.compile where its framework can switch it on."""
    if base.kernels is not None:
        return (None,)
    recipe = api.job_of(base).recipe
    if "kernels" not in recipe.from_bundle or recipe.framework not in COMPILE_SWITCH:
        return (None,)  # the workload names its kernels, or Megatron's fused ones run
    return (None, "compiled") if recipe.kernels == "eager" else (None,)


def recipes(n_gpus: int, regimes: Iterable[str | None] = (None,), experts: int = 0,
            boxes: int = 1) -> list[Recipe]:
    """Every strategy and recipe for a machine of ``n_gpus`` in ``boxes`` boxes, under each
    kernel regime: tensor parallelism inside one box (strategies refuse it across), HSDP only
    across boxes (on one it is FSDP); with ``experts`` (a mixture of experts), FSDP and ZeRO-3
    beside every expert-parallel degree that divides both the GPUs and the experts."""
    out = [Recipe("ddp"), Recipe("zero1"), Recipe("zero2"), Recipe("zero3"),
           Recipe("fsdp"), Recipe("fsdp", reshard_after_forward=False)]
    for ep in range(2, n_gpus + 1):
        if experts and n_gpus % ep == 0 and experts % ep == 0:
            out += [Recipe("fsdp", ep=ep), Recipe("zero3", ep=ep)]
    # offload to host RAM, as DeepSpeed (offload_optimizer, offload_param) and FSDP2
    # (CPUOffloadPolicy: parameters, gradients and optimizer states together) allow it
    out += [Recipe("zero1", offload="optimizer"), Recipe("zero2", offload="optimizer"),
            Recipe("zero3", offload="optimizer"), Recipe("zero3", offload="params"),
            Recipe("fsdp", offload="params")]
    per_box = n_gpus // boxes
    if n_gpus > 1:
        for sp in (False, True):
            if boxes == 1:
                out.append(Recipe("tp", tp=n_gpus, sequence_parallel=sp))
            for degree in range(2, min(n_gpus, per_box + 1)):
                if n_gpus % degree == 0:
                    out.append(Recipe("tp+ddp", tp=degree, sequence_parallel=sp))
                    out.append(Recipe("tp+fsdp", tp=degree, sequence_parallel=sp))
    for pp in range(2, n_gpus + 1):  # pipelines, each stage data-parallel inside
        if n_gpus % pp:
            continue
        inner = ("ddp", "fsdp") if n_gpus // pp > 1 else ("ddp",)
        m = pipeline_micro_batches(pp)
        out += [Recipe(s, pp=pp, grad_accum=m) for s in inner]
        # interleaved 1F1B, two model chunks per stage: the bubble halves (Narayanan et al.
        # 2021, section 2.2) for twice the stage-to-stage sends; Megatron needs m % pp == 0
        if m % pp == 0:
            out += [Recipe(s, pp=pp, grad_accum=m, schedule="interleaved", virtual_stages=2)
                    for s in inner]
    known = {r.strategy for r in out} | ({"hsdp"} if boxes == 1 else set())
    out += [Recipe(name) for name in STRATEGIES if name not in known]
    return [replace(r, kernels=k) for k in regimes for r in out]


def pipeline_micro_batches(pp: int) -> int:
    """Micro-batches per step for a ``pp``-stage 1F1B pipeline: four per stage keep the bubble,
    (p - 1) / (m + p - 1), near 16% (Narayanan et al. 2021, arXiv:2104.04473: m >> p), at
    most ``MAX_PIPELINE_MICRO_BATCHES``."""
    return min(4 * pp, MAX_PIPELINE_MICRO_BATCHES)


def _spec(base: RunSpec, recipe: Recipe, checkpointing: str, micro_batch: int) -> RunSpec:
    return replace(base, strategy=recipe.strategy, tp=recipe.tp,
                   sequence_parallel=recipe.sequence_parallel,
                   reshard_after_forward=recipe.reshard_after_forward,
                   checkpointing=checkpointing, micro_batch=micro_batch, pp=recipe.pp,
                   grad_accum=recipe.grad_accum if recipe.pp > 1 else base.grad_accum,
                   offload=recipe.offload, kernels=recipe.kernels or base.kernels,
                   schedule=recipe.schedule, virtual_stages=recipe.virtual_stages, ep=recipe.ep)


_SPLITS: dict[RunSpec, dict[str, Any] | None] = {}


def fits(memory: dict[str, Any]) -> bool:
    """On the GPU, and for an offloading recipe in host RAM too."""
    return bool(memory["fits"]) and memory.get("host_fits") is not False


def memory_verdict(spec: RunSpec) -> dict[str, Any] | None:
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
    """The largest micro-batch that fits (memory grows with it), searched from a guess: the
    peak is about affine in the micro-batch (activations and logits grow with it, states do
    not), so micro-batches 1 and 2 predict where it crosses the capacity, and checking the
    guess and its neighbour usually settles it; a bisection between what is known to fit and
    what is known not to does the rest. None: the recipe does not apply."""
    def verdict(b: int) -> dict[str, Any] | None:
        mem = memory_verdict(_spec(base, recipe, checkpointing, b))
        return mem if mem is not None and fits(mem) else None

    first = memory_verdict(_spec(base, recipe, checkpointing, 1))
    if first is None:
        return None
    if not fits(first):
        return Verdict(recipe, checkpointing, 0, first)
    lo, best, hi = 1, first, MAX_MICRO_BATCH + 1  # lo fits; hi does not (or is past the cap)
    second = verdict(2)
    if second is None:
        return Verdict(recipe, checkpointing, 1, first)
    lo, best = 2, second
    slope = second["peak_bytes"] - first["peak_bytes"]
    if slope > 0:
        guess = 1 + int((first["capacity_bytes"] - first["peak_bytes"]) // slope)
        for b in sorted({min(max(guess, 3), MAX_MICRO_BATCH), min(guess + 1, hi)}):
            if lo < b < hi:
                mem = verdict(b)
                if mem is None:
                    hi = b
                    break
                lo, best = b, mem
    while hi - lo > 1:  # double until it no longer fits, then bisect
        mid = min(2 * lo, (lo + hi) // 2) if hi > MAX_MICRO_BATCH else (lo + hi) // 2
        mem = verdict(mid)
        if mem is not None:
            lo, best = mid, mem
        else:
            hi = mid
    return Verdict(recipe, checkpointing, lo, best)


def micro_batches(largest: int, above: int = 0, seq_len: int = 1) -> list[int]:
    """Every size while a micro-batch has at most ``EVERY_SIZE_UP_TO_TOKENS``, then powers of
    two, and ``largest``; all above ``above`` and at most ``largest``."""
    every = max(1, EVERY_SIZE_UP_TO_TOKENS // max(1, seq_len))
    sizes = {largest, *range(1, min(largest, every) + 1)}
    b = 1
    while b < largest:
        sizes.add(b)
        b *= 2
    return sorted(s for s in sizes if above < s <= largest)


@dataclass
class Choices:
    """What advise simulates on one machine: the first round, and what each choice of it
    varies into for the second (``variants``)."""

    first: list[RunSpec]  # each recipe, mode and regime at its largest micro-batch
    above: dict[RunSpec, int]  # the micro-batch a lighter mode already fits, per first spec
    eager: dict[RunSpec, RunSpec]  # a compiled first spec's eager twin, which it dominates
    verdicts: list[Verdict]  # every recipe's memory verdict, fitting or not


Mapper = Callable[[Callable[[tuple[RunSpec, Recipe, str]], Verdict | None],
                   list[tuple[RunSpec, Recipe, str]]], Iterable[Verdict | None]]


def verdict_of(task: tuple[RunSpec, Recipe, str]) -> Verdict | None:
    """``largest_micro_batch`` of one (base, recipe, mode): what worker processes run."""
    return largest_micro_batch(*task)


def enumerate_machine(base: RunSpec, mapper: Mapper | None = None) -> Choices:
    """The specs worth simulating first on ``base.topology``, and every recipe's memory
    verdict. ``mapper`` (``map`` by default; a process pool's ``map``) takes the verdicts,
    which are independent of each other; the pruning that compares them runs here."""
    machine = api.load_machine(base.topology, base.gpus, nnodes=base.nnodes)
    arch = api.job_of(replace(base, ep=1)).arch
    experts = arch.moe.experts if arch is not None and arch.moe is not None else 0
    tasks = [(base, recipe, mode) for recipe in recipes(machine.n_gpus, kernel_regimes(base),
                                                        experts, machine.nnodes)
             for mode in CHECKPOINTING_MODES]  # none, selective, op, full: more recompute
    # those of one regime and mode side by side: a worker builds their jobs once
    order = sorted(tasks, key=lambda t: (t[1].kernels or "", t[2]))
    found = dict(zip(((r, m) for _, r, m in order), (mapper or map)(verdict_of, order),
                     strict=True))
    choices = Choices([], {}, {}, [])
    held: dict[tuple[str, str, str | None], int] = {}  # largest b without offload
    for recipe in dict.fromkeys(t[1] for t in tasks):
        fitted = 0  # the largest micro-batch a lighter checkpointing mode already fits
        for mode in CHECKPOINTING_MODES:
            verdict = found[(recipe, mode)]
            if verdict is None:  # the recipe cannot run this job
                break
            choices.verdicts.append(verdict)
            plain = recipe.offload == "none" and recipe.pp == 1 and recipe.tp is None \
                and recipe.ep == 1
            key = (recipe.strategy, mode, recipe.kernels)
            if plain and recipe.reshard_after_forward:
                held[key] = verdict.largest
            if recipe.offload != "none":  # host copies only slow a batch the GPU holds alone
                fitted = max(fitted, held.get(key, 0))
            if verdict.largest <= fitted:
                continue
            largest = _spec(base, recipe, mode, verdict.largest)
            fitted, above = verdict.largest, fitted
            # torch.compile's kernels are never slower than eager's (tests/test_kernels.py)
            # and its communication is the same: eager is dominated where compiled fits as
            # large a micro-batch, and is simulated only as a leader's eager twin
            twin = found.get((replace(recipe, kernels="compiled"), mode))
            if recipe.kernels is None and twin is not None and twin.largest >= fitted:
                compiled = _spec(base, replace(recipe, kernels="compiled"), mode, twin.largest)
                choices.eager[compiled] = largest
                continue
            choices.first.append(largest)
            choices.above[largest] = above
    return choices


def _at_batch(spec: RunSpec, b: int, sequences: int) -> RunSpec | None:
    """``spec`` at micro-batch ``b``, accumulating to at least ``sequences`` per GPU and step
    (a pipeline: more micro-batches, a multiple of its stages); None past the pipeline cap."""
    more = math.ceil(sequences / b)
    if spec.pp > 1:
        more = math.ceil(more / spec.pp) * spec.pp
        if more > MAX_PIPELINE_MICRO_BATCHES:
            return None  # the batch cannot be kept: a smaller batch only loses
    return replace(spec, micro_batch=b, grad_accum=more)


def variants(spec: RunSpec, above: int, base_accum: int, lighter: Iterable[RunSpec] = ()
             ) -> Iterator[RunSpec]:
    """What a recipe's best first-round spec varies into (each still to be checked for
    memory), all at its sequences per step, so that a smaller micro-batch competes at the same
    batch: its smaller micro-batches above ``above`` (gradient accumulation: ``base_accum`` the
    job's); each lighter checkpointing mode of the recipe (``lighter``: their first-round
    specs) at its own largest micro-batch, where less recompute may beat a larger micro-batch;
    DDP's other bucket sizes where a DDP group reduces; DeepSpeed's overlap_comm (stages 1
    and 2 default it off) and pinned offload buffers (it defaults pin_memory off; FSDP2 pins
    already)."""
    largest = spec.micro_batch or 1
    sequences = largest * (spec.grad_accum or base_accum)
    for b in micro_batches(largest, above, spec.seq_len or api.job_of(spec).seq_len)[:-1]:
        if (v := _at_batch(spec, b, sequences)) is not None:
            yield v
    for light in lighter:
        if (light.micro_batch or 1) < largest and (
                v := _at_batch(light, light.micro_batch or 1, sequences)) is not None:
            yield v
    n_gpus = api.load_machine(spec.topology, spec.gpus, nnodes=spec.nnodes).n_gpus
    dp = n_gpus // (api.tp_degree(spec.strategy, spec.tp, n_gpus, spec.pp) * spec.pp)
    if spec.strategy in ("ddp", "tp+ddp") and dp > 1:  # also each pipeline stage's DDP
        yield from (replace(spec, bucket_mb=mb) for mb in DDP_BUCKETS_MB)
    if spec.strategy in ("zero1", "zero2"):
        yield replace(spec, zero_overlap_comm=True)
    if spec.offload != "none" and spec.strategy.startswith("zero"):
        yield replace(spec, pin_memory=True)


def recipe_of(spec: RunSpec) -> tuple[Recipe, str]:
    """A spec's recipe and checkpointing mode (what ``largest_micro_batch`` takes)."""
    return (Recipe(spec.strategy, spec.tp, spec.sequence_parallel, spec.reshard_after_forward,
                   spec.pp, spec.grad_accum if spec.pp > 1 else None, spec.offload,
                   spec.kernels, spec.schedule, spec.virtual_stages, spec.ep),
            spec.checkpointing or "none")


def machine_key(spec: RunSpec) -> tuple[str, int | None, int | None]:
    """The machine a spec runs on: its topology, GPUs of each box and box count
    (advise.PricedMachine.key)."""
    return spec.topology, spec.gpus, spec.nnodes


def kind(spec: RunSpec) -> tuple[Any, ...]:
    """What the answer tells apart: the machine, strategy, TP degree, pipeline and offload
    (the runner-up is the best of another kind, each machine has its own best)."""
    return machine_key(spec), spec.strategy, spec.tp, spec.pp, spec.offload, spec.ep
