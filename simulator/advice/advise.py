"""`stepsim advise`: the best way to run a job on each machine, and why.

For every machine: the choices of candidates.py, pruned by memory (in worker processes with
``jobs`` > 1, as everything here), then simulated through ``simulator.api`` in three waves:
each kind's most promising choice (kind: machine, strategy, TP degree, pipeline, offload),
the other choices that could still beat their kind's best, then every choice's variants
(candidates.variants) that could still change the answer: beat their machine's best run, or,
of another kind, the best of the other kinds (the runner-up). "Could" is bound.py's compute
bound, so what is left out provably loses. Ranked by the objective (tokens/s, USD per million
tokens, or time to train ``train_tokens``); the best and the runner-up are simulated again
with their ranges (ranges.py). The answer is one JSON object, ``{candidates, best,
nothing_fits, what_would_fit, explanation, confidence, without_thin_mechanisms}``; explain.py
words the explanation, caveats.py how sure the pick is (and the best candidate that avoids
its thinly validated mechanisms), fallback.py what would fit when nothing does. The
candidates run on any ``concurrent.futures`` executor given (Dask, Ray through an adapter),
else on ``jobs`` local processes.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Executor, ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any

from simulator import api
from simulator.advice import (
    bound,
    boxes,
    caveats,
    explain,
    fallback,
    half_precision,
    padding,
    spec_text,
)
from simulator.advice import candidates as cand
from simulator.api import RunSpec
from simulator.errors import InputError, quoted
from simulator.outputs.cost import Prices

OBJECTIVES = ("throughput", "cost", "time-to-train")
Progress = Callable[[int, int], None]  # (done, total)
Point = tuple[RunSpec, Prices, bool]  # the spec, its prices, whether to check memory first


@dataclass(frozen=True)
class PricedMachine:
    """One -t of the question: the topology, the prices that apply to it, how many of its
    GPUs to use (its first ``gpus``, of each box; None: all of them) and ``nnodes`` boxes of it
    (None: the topology's own count)."""

    topology: str
    prices: Prices
    gpus: int | None = None
    nnodes: int | None = None

    @property
    def key(self) -> tuple[str, int | None, int | None]:
        return self.topology, self.gpus, self.nnodes


def _simulate(point: Point) -> tuple[str, dict[str, Any] | None]:
    """("simulated", report), or ("does not fit", None) for a variant memory rules out
    without a simulation, or ("refused", None) for one the simulator cannot run."""
    spec, prices, check = point
    try:
        if check:
            mem = cand.memory_verdict(spec)
            if mem is None:
                return "refused", None
            if not cand.fits(mem):
                return "does not fit", None
        report = api.simulate(spec, baseline=False, prices=prices).report
    except InputError:
        return "refused", None
    report.pop("buckets", None)  # per-bucket detail: in `stepsim run`, not in a ranking
    report["options"] = spec_text.options(spec)
    report["label"] = spec_text.label(spec)
    return "simulated", report


@contextmanager
def _pool(workers: int, executor: Executor | None) -> Iterator[Executor | None]:
    """The caller's executor (left running), else a process pool of ``workers`` (none for 1)."""
    if executor is not None:
        yield executor
        return
    if workers <= 1:
        yield None
        return
    with ProcessPoolExecutor(max_workers=workers) as pool:
        yield pool


class _Counter:
    """Progress over every piece of work of the answer, whose total grows round by round."""

    def __init__(self, progress: Progress | None) -> None:
        self.progress, self.done, self.total = progress, 0, 0

    def items(self, results: Iterable[Any], n: int) -> Iterator[Any]:
        self.total += n
        for r in results:
            self.done += 1
            if self.progress:
                self.progress(self.done, self.total)
            yield r


def _map(pool: Executor | None, workers: int, fn: Callable[[Any], Any],
         items: list[Any], counter: _Counter) -> list[Any]:
    """``fn`` over ``items`` in order, in the pool's processes when there is one (neighbours
    go to one process, which then reuses the jobs and machines it built)."""
    if pool is None or len(items) < 2:
        return list(counter.items(map(fn, items), len(items)))
    chunk = max(1, len(items) // (4 * workers))
    return list(counter.items(pool.map(fn, items, chunksize=chunk), len(items)))


def _locality(spec: RunSpec) -> tuple[Any, ...]:
    """Specs that share a job (kernels, mode, micro-batch) sit side by side: a worker builds
    it once (the jobs, their ops and op times are cached per process)."""
    return (spec.kernels or "", spec.checkpointing or "", spec.micro_batch or 0,
            spec.grad_accum or 0, spec.strategy, spec.pp)


def _bounds(mapper: Callable[[Callable[[Any], Any], list[Any]], Iterable[Any]],
            specs: list[RunSpec]) -> dict[RunSpec, float]:
    """Each spec's compute bound, worked out in the workers with the specs that share one
    micro-batch's work side by side: one worker times that work once."""
    order = sorted(specs, key=lambda spec: repr(bound.work_key(spec)))
    return dict(zip(order, mapper(bound.tokens_per_s_bound, order), strict=True))


def _simulate_all(pool: Executor | None, workers: int, points: list[Point],
                  counter: _Counter, tally: explain.Tally) -> list[tuple[RunSpec, dict[str, Any]]]:
    """Simulate ``points``; the ranked (spec, report) pairs, with ``tally`` counting."""
    points = sorted(points, key=lambda p: _locality(p[0]))
    out = []
    for (spec, _, _), (status, report) in zip(
            points, _map(pool, workers, _simulate, points, counter), strict=True):
        if status == "does not fit":
            tally.pruned += 1
        elif status == "refused":
            tally.refused += 1
        elif report is not None:
            tally.simulated += 1
            if cand.fits(report["memory"]):  # the run's exact verdict (a pipeline's split)
                out.append((spec, report))
            else:
                tally.unfit += 1
    return out


def _ranked(pairs: list[tuple[RunSpec, dict[str, Any]]], objective: str
            ) -> list[tuple[RunSpec, dict[str, Any]]]:
    return sorted(pairs, key=lambda p: (objective_value(p[1], objective), p[1]["step_time_s"]))


def objective_value(report: dict[str, Any], objective: str) -> float:
    """Smaller is better."""
    if objective == "throughput":
        return -float(report["tokens_per_s"])
    key = "usd_per_million_tokens" if objective == "cost" else "time_to_train_s"
    value = report["cost"][key]
    return float("inf") if value is None else float(value)


def check_objective(objective: str, machines: Sequence[PricedMachine]) -> None:
    if objective not in OBJECTIVES:
        raise InputError(f"--objective: expected one of {', '.join(OBJECTIVES)}, "
                         f"got {quoted(objective)}")
    if objective == "time-to-train" and any(m.prices.train_tokens is None for m in machines):
        raise InputError("--objective time-to-train needs --train-tokens (e.g. 2B)")
    if objective == "cost":
        for m in machines:
            machine = api.load_machine(m.topology, nnodes=m.nnodes)
            if m.prices.usd_per_gpu_hour is None and machine.config.price_usd_per_hour is None:
                raise InputError(f"--objective cost needs a price for {machine.name}: give "
                                 "--price-per-gpu-hour (once, or once per -t)")


def advise(given: Sequence[PricedMachine | str], workload: str, *,
           objective: str = "throughput", jobs: int | None = None,
           progress: Progress | None = None, peft: str | None = None,
           load_in_4bit: bool = False, padded: bool = False,
           executor: Executor | None = None) -> dict[str, Any]:
    """The whole answer: ranked candidates, the best with its ranges, and the explanation.
    ``given``: the machines (PricedMachine), or topology names (their own prices).
    ``peft``, ``load_in_4bit``: the job's adapters from a PEFT adapter_config.json (QLoRA on a 4-bit
    base), as `run --peft` takes them; every candidate trains them. ``padded``: the batches
    carry a padding mask (``training.padded``, as `run --padded`). ``executor``: any
    ``concurrent.futures`` executor to run the candidates on (a process pool, Dask's
    ``client.get_executor()``, ...), left running; without one, ``jobs`` local processes
    (default one per core). The answer is the same wherever the candidates run."""
    machines = [m if isinstance(m, PricedMachine) else PricedMachine(m, Prices())
                for m in given]

    def base(m: PricedMachine) -> RunSpec:
        return RunSpec(m.topology, workload, gpus=m.gpus, peft=peft, load_in_4bit=load_in_4bit,
                       nnodes=m.nnodes, padded=True if padded else None)

    check_objective(objective, machines)
    started = time.perf_counter()
    workers = jobs if jobs is not None else os.cpu_count() or 1
    if executor is not None:  # its size is its own: chunks for a few workers
        workers = max(workers, 2)
    counter, tally = _Counter(progress), explain.Tally()
    choices: dict[tuple[str, int | None, int | None], cand.Choices] = {}
    ranked: list[tuple[RunSpec, dict[str, Any]]] = []
    leading: dict[Any, float] = {}  # tokens/s of the best ranked run of each kind and machine
    prices = {m.key: m.prices for m in machines}
    with _pool(workers, executor) as pool:
        def mapper(fn: Callable[[Any], Any], items: list[Any]) -> list[Any]:
            return _map(pool, workers, fn, items, counter)

        def wave(specs: list[RunSpec], check_memory: bool,
                 threshold: Callable[[RunSpec], float]) -> int:
            """Simulate the specs whose bound reaches their ``threshold`` (tokens/s): branch
            and bound, a spec whose compute alone is slower than a run already simulated
            cannot beat it; how many the bound left out."""
            todo = [(s, prices[cand.machine_key(s)], check_memory) for s in specs
                    if bounds[s] >= threshold(s)]
            for spec, report in _simulate_all(pool, workers, todo, counter, tally):
                ranked.append((spec, report))
                k = cand.kind(spec)
                leading[k] = max(leading.get(k, 0.0), report["tokens_per_s"])
            return len(specs) - len(todo)

        for m in machines:  # memory verdicts first: no simulation
            choices[m.key] = cand.enumerate_machine(base(m), mapper)
        first = [spec for c in choices.values() for spec in c.first]
        tally.choices = sum(len(c.verdicts) for c in choices.values())
        tally.first = len(first)
        # each kind's most promising choice first, then the other choices where they could
        # beat their kind's best (every kind's best is exact: the ranking shows what each
        # strategy gives), then the variants where they could change the answer: beat their
        # machine's best run or, of another kind than that run's, the best of the other
        # kinds (the runner-up)
        heads: dict[tuple[Any, ...], RunSpec] = {}
        bounds: dict[RunSpec, float] = {}  # computed in the workers (a job each)
        bounds.update(_bounds(mapper, first))
        for spec in sorted(first, key=bounds.__getitem__, reverse=True):
            heads.setdefault(cand.kind(spec), spec)
        wave(list(heads.values()), False, lambda spec: 0.0)

        def could_change_the_answer(spec: RunSpec) -> float:
            tops = sorted(((v, k) for k, v in leading.items()
                           if k[0] == cand.machine_key(spec)), reverse=True)
            (v1, k1), *rest = tops or [(0.0, None)]
            return v1 if cand.kind(spec) == k1 else (rest[0][0] if rest else 0.0)

        tally.bounded = wave([s for s in first if s not in set(heads.values())], False,
                             lambda spec: leading.get(cand.kind(spec), 0.0))
        tally.first_simulated = tally.simulated
        # the variants, checked for memory before simulating
        accum = api.job_of(base(machines[0])).grad_accum
        recipes: dict[cand.Recipe, list[RunSpec]] = {}
        for spec in first:
            recipes.setdefault(cand.recipe_of(spec)[0], []).append(spec)

        def variants(spec: RunSpec) -> list[RunSpec]:
            c = choices[cand.machine_key(spec)]
            # a recipe's other first-round specs fit smaller micro-batches: lighter modes
            lighter = [s for s in recipes[cand.recipe_of(spec)[0]] if s != spec]
            return [*cand.variants(spec, c.above[spec], accum, lighter),
                    *([c.eager[spec]] if spec in c.eager else [])]

        more = list(dict.fromkeys(v for spec in first for v in variants(spec)
                                  if v not in set(first)))
        tally.variants = len(more)
        bounds.update(_bounds(mapper, more))
        tally.bounded_variants = wave(more, True, could_change_the_answer)
        ranked = _ranked(ranked, objective)
        reports = [r for _, r in ranked]
        second = runner_up(reports) if reports else None
        sure = caveats.alternative(reports[0], reports) if reports else None
        finalists = reports[:1] + [r for r in (second, sure) if r is not None]
        finalists = list({id(r): r for r in finalists}.values())
        # the best, the runner-up and the best candidate that avoids the best's thinly
        # validated mechanisms again with their ranges, in the processes that hold their jobs
        ranged = _map(pool, workers, partial(_ranged, prices=prices), finalists, counter)
        by_id = {id(r): x for r, x in zip(finalists, ranged, strict=True)}
    elapsed = time.perf_counter() - started
    answer: dict[str, Any] = {"candidates": reports, "best": None, "nothing_fits": not reports,
                              "what_would_fit": [], "explanation": [], "confidence": None,
                              "without_thin_mechanisms": None}
    lines = answer["explanation"]
    names = ", ".join(explain.machine_name(m) for m in machines)
    verdicts = {t: c.verdicts for t, c in choices.items()}
    where = "the executor given" if executor is not None else workers
    lines += explain.search_lines(workload, names, tally, objective, where, elapsed, len(reports))
    if not reports:
        for m in machines:
            lines.extend(explain.not_fitting_lines(verdicts[m.key]))
        answer["what_would_fit"] = fallback.what_would_fit(machines[0].topology, workload,
                                                            peft, load_in_4bit)
        finetune = api.job_of(base(machines[0])).finetune
        lines.append(f"nothing fits: no {finetune} fine-tuning configuration of {workload} "
                     f"fits on {names}; what would:")
        lines.extend(f"  {w['change']}: {w['detail']}" for w in answer["what_would_fit"])
        return answer
    best = ranged[0]
    answer["best"] = best
    lines.append(explain.winner_line(best, objective))
    lines.append("why: " + explain.why(best))
    lines.extend(padding.flash_instead(best))
    lines.extend(half_precision.fp16_instead(best))
    for m in machines:
        lines.extend(explain.not_fitting_lines(verdicts[m.key],
                                               prefix=explain.prefix(machines, m)))
    if second is not None:
        lines.append(explain.runner_up_line(best, by_id[id(second)], objective))
    if len(machines) > 1:
        lines.extend(explain.machine_lines(reports, machines, objective))
    lines.extend(boxes.lines(reports, machines))  # several box counts: a second box?
    lines.append(best["range_basis"]["summary"])
    alt = by_id[id(sure)] if sure is not None else None
    answer["confidence"] = best["confidence"]
    answer["without_thin_mechanisms"] = alt
    lines.extend(caveats.lines(best, alt, caveats.shared(reports[0], reports)))
    return answer


def _ranged(report: dict[str, Any], prices: dict[tuple[str, int | None, int | None], Prices]
            ) -> dict[str, Any]:
    """The candidate again, with its ranges (and its DDP buckets)."""
    spec = spec_text.spec_of(report["options"])
    ranged = api.simulate(spec, baseline=False, prices=prices[cand.machine_key(spec)],
                          ranges=True).report
    ranged["options"] = report["options"]
    ranged["label"] = report["label"]
    ranged["command"] = spec_text.run_command(spec)
    return ranged


def runner_up(reports: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The best candidate of another strategy (or TP degree, or machine) than the winner's."""
    def kind(r: dict[str, Any]) -> tuple[Any, ...]:
        return cand.kind(spec_text.spec_of(r["options"]))
    return next((r for r in reports[1:] if kind(r) != kind(reports[0])), None)
