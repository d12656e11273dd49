"""`stepsim advise`: the best way to run a job on each machine, and why.

For every machine: the candidates of candidates.py, pruned by memory, simulated (in worker
processes with ``jobs`` > 1, through ``simulator.api``), ranked by the objective (tokens/s,
USD per million tokens, or time to train ``train_tokens``). The best and the runner-up are
simulated again with their ranges (ranges.py). The answer is one JSON object,
``{candidates, best, nothing_fits, what_would_fit, explanation}``; the explanation lines are
the text form: the winner and its bottleneck, what does not fit and why, the runner-up and
what it costs, and what would fit when nothing does (fallback.py).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from simulator import api
from simulator.advice import candidates as cand
from simulator.advice import fallback
from simulator.advice.cost import Prices
from simulator.api import RunSpec
from simulator.errors import InputError
from simulator.units import GiB

OBJECTIVES = ("throughput", "cost", "time-to-train")
LEADERS = 4  # recipes whose smaller micro-batches the second round tries
Progress = Callable[[int, int], None]  # (done, total)


@dataclass(frozen=True)
class Machine:
    """One -t of the question: the topology and the prices that apply to it."""

    topology: str
    prices: Prices


def _simulate(point: tuple[RunSpec, Prices]) -> dict[str, Any]:
    spec, prices = point
    report = api.simulate(spec, baseline=False, prices=prices).report
    report.pop("buckets", None)  # per-bucket detail: in `stepsim run`, not in a ranking
    report["options"] = cand.options(spec)
    report["label"] = cand.label(spec)
    return report


@contextmanager
def _pool(workers: int) -> Iterator[ProcessPoolExecutor | None]:
    if workers <= 1:
        yield None
        return
    with ProcessPoolExecutor(max_workers=workers) as pool:
        yield pool


def _round(pool: ProcessPoolExecutor | None, workers: int,
           points: list[tuple[RunSpec, Prices]], progress: Progress | None, objective: str
           ) -> list[dict[str, Any]]:
    """Simulate ``points`` (in the pool's processes when there is one), best first."""
    if pool is None or len(points) < 2:
        results: Iterator[dict[str, Any]] = map(_simulate, points)
    else:
        results = pool.map(_simulate, points, chunksize=max(1, len(points) // (4 * workers)))
    reports = []
    for i, report in enumerate(results):
        if cand.fits(report["memory"]):  # the run's exact verdict (a pipeline's own split)
            reports.append(report)
        if progress:
            progress(i + 1, len(points))
    return sorted(reports, key=lambda r: (objective_value(r, objective), r["step_time_s"]))


def objective_value(report: dict[str, Any], objective: str) -> float:
    """Smaller is better."""
    if objective == "throughput":
        return -float(report["tokens_per_s"])
    key = "usd_per_million_tokens" if objective == "cost" else "time_to_train_s"
    value = report["cost"][key]
    return float("inf") if value is None else float(value)


def check_objective(objective: str, machines: Sequence[Machine]) -> None:
    if objective not in OBJECTIVES:
        raise InputError(f"--objective: expected one of {', '.join(OBJECTIVES)}, "
                         f"got {objective!r}")
    if objective == "time-to-train" and any(m.prices.train_tokens is None for m in machines):
        raise InputError("--objective time-to-train needs --train-tokens (e.g. 2B)")
    if objective == "cost":
        for m in machines:
            machine = api.load_machine(m.topology)
            if m.prices.usd_per_gpu_hour is None and machine.config.price_usd_per_hour is None:
                raise InputError(f"--objective cost needs a price for {machine.name}: give "
                                 "--price-per-gpu-hour (once, or once per -t)")


def advise(machines: Sequence[Machine], workload: str, *, objective: str = "throughput",
           jobs: int | None = None, progress: Progress | None = None) -> dict[str, Any]:
    """The whole answer: ranked candidates, the best with its ranges, and the explanation."""
    check_objective(objective, machines)
    started = time.perf_counter()
    points: list[tuple[RunSpec, Prices]] = []
    choices: dict[str, cand.Choices] = {}
    for m in machines:
        choices[m.topology] = cand.enumerate_machine(RunSpec(m.topology, workload))
        points += [(spec, m.prices) for spec in choices[m.topology].first]
    workers = jobs if jobs is not None else (os.cpu_count() or 1) if len(points) > 8 else 1
    verdicts = {t: c.verdicts for t, c in choices.items()}
    with _pool(workers) as pool:
        reports = _round(pool, workers, points, progress, objective)
        # round two: the smaller micro-batches of the leading recipes
        leaders = list(dict.fromkeys((r["options"]["topology"], cand.recipe_of(spec_of(r)))
                                     for r in reports))[:LEADERS]
        prices = {m.topology: m.prices for m in machines}
        more = [(spec, prices[t]) for t, key in leaders for spec in choices[t].smaller[key]]
        reports = sorted(reports + _round(pool, workers, more, progress, objective),
                         key=lambda r: (objective_value(r, objective), r["step_time_s"]))
    elapsed = time.perf_counter() - started
    answer: dict[str, Any] = {"candidates": reports, "best": None, "nothing_fits": not reports,
                              "what_would_fit": [], "explanation": []}
    lines = answer["explanation"]
    names = ", ".join(api.load_machine(m.topology).name for m in machines)
    considered = sum(len(v) for v in verdicts.values())
    fitting = sum(len(c.first) + sum(len(s) for s in c.smaller.values())
                  for c in choices.values())
    lines.append(f"{workload} on {names}: {considered} strategy, recipe and checkpointing "
                 f"choices; {fitting} configurations fit in memory (every micro-batch); "
                 f"{len(reports)} simulated in {elapsed:.1f} s ({workers} "
                 f"process{'es' if workers > 1 else ''}: each choice at its largest "
                 f"micro-batch, then the {LEADERS} leaders' smaller ones and bucket sizes), "
                 f"ranked by "
                 f"{objective}")
    if not reports:
        for m in machines:
            lines.extend(not_fitting_lines(verdicts[m.topology]))
        answer["what_would_fit"] = fallback.what_would_fit(machines[0].topology, workload)
        finetune = api.job_of(RunSpec(machines[0].topology, workload)).finetune
        lines.append(f"nothing fits: no {finetune} fine-tuning configuration of {workload} "
                     f"fits on {names}; what would:")
        lines.extend(f"  {w['change']}: {w['detail']}" for w in answer["what_would_fit"])
        return answer
    prices = {m.topology: m.prices for m in machines}
    second = runner_up(reports)
    finalists = [reports[0]] + ([second] if second is not None else [])
    with _pool(min(workers, len(finalists))) as pool:  # the two ranged runs side by side
        ranged = list(pool.map(_ranged, finalists, [prices] * len(finalists)) if pool
                      else map(_ranged, finalists, [prices] * len(finalists)))
    best = ranged[0]
    answer["best"] = best
    lines.append(winner_line(best, objective))
    lines.append("why: " + why(best))
    for m in machines:
        lines.extend(not_fitting_lines(verdicts[m.topology], prefix=_prefix(machines, m)))
    if len(ranged) > 1:
        lines.append(runner_up_line(best, ranged[1], objective))
    if len(machines) > 1:
        lines.extend(machine_lines(reports, machines, objective))
    lines.append(best["range_basis"]["summary"])
    return answer


def _prefix(machines: Sequence[Machine], m: Machine) -> str:
    return f"on {api.load_machine(m.topology).name}, " if len(machines) > 1 else ""


def _ranged(report: dict[str, Any], prices: dict[str, Prices]) -> dict[str, Any]:
    """The candidate again, with its ranges (and its DDP buckets)."""
    spec = spec_of(report)
    ranged = api.simulate(spec, baseline=False, prices=prices[spec.topology],
                          ranges=True).report
    ranged["options"] = report["options"]
    ranged["label"] = report["label"]
    ranged["command"] = cand.run_command(spec)
    return ranged


def spec_of(report: dict[str, Any]) -> RunSpec:
    o = report["options"]
    return RunSpec(o["topology"], o["workload"], o["strategy"], gpus=o["gpus"], tp=o["tp"],
                   pp=o["pp"], grad_accum=o["grad_accum"], offload=o["offload"],
                   micro_batch=o["micro_batch"], bucket_mb=o["bucket_cap_mb"],
                   checkpointing=o["activation_checkpointing"],
                   sequence_parallel=o["sequence_parallel"],
                   reshard_after_forward=o["reshard_after_forward"])


def _tokens(report: dict[str, Any]) -> str:
    low, high = report.get("tokens_per_s_range") or (None, None)
    text = f"{report['tokens_per_s']:,.0f} tokens/s"
    return text + (f" ({low:,.0f}-{high:,.0f})" if low is not None else "")


def _price(report: dict[str, Any]) -> str:
    cost, basis = report["cost"], report.get("cost_basis", {})
    if cost["usd_per_million_tokens"] is None:
        return "no price given (--price-per-gpu-hour)"
    low, high = cost.get("usd_per_million_tokens_range") or (None, None)
    text = f"${cost['usd_per_million_tokens']:.3g} per million tokens"
    if low is not None:
        text += f" (${low:.3g}-{high:.3g})"
    text += f" at ${cost['usd_per_hour']:,.2f}/h ({basis.get('usd_per_hour_source')})"
    if cost["time_to_train_s"] is not None:
        days = cost["time_to_train_s"] / 86400
        text += (f"; {cost['train_tokens']:,} tokens take {days:.3g} days"
                 + (f" and ${cost['usd_to_train']:,.0f}" if cost["usd_to_train"] else ""))
    return text


def winner_line(best: dict[str, Any], objective: str) -> str:
    return (f"best ({objective}): {best['label']} on {best['topology']}: {_tokens(best)}, "
            f"{_price(best)}; run it alone: {best['command']}")


def why(report: dict[str, Any]) -> str:
    """The winner's bottleneck in a sentence."""
    step = report["step_time_s"]
    exposed = report["exposed_comm_s"] / step if step > 0 else 0.0
    mem = report["memory"]
    fits = (f"needs {mem['peak_bytes'] / GiB:.1f} of {mem['capacity_bytes'] / GiB:.1f} GiB per "
            "GPU")
    bn = report["bottleneck"]
    if exposed < 0.10:
        return (f"compute-bound: communication hides behind compute (exposed {exposed:.0%} of "
                f"the step), MFU {report['mfu']:.0%}; {fits}")
    where = bn.get("description") or bn.get("link") or "the network"
    return (f"communication-bound: {exposed:.0%} of the step waits on {where} "
            f"({bn['utilization_during_comm']:.0%} busy while communicating); {fits}")


def not_fitting_lines(verdicts: list[cand.Verdict], prefix: str = "") -> list[str]:
    """One line per strategy none of whose variants fits, with its smallest need."""
    by_family: dict[str, list[cand.Verdict]] = {}
    for v in verdicts:
        by_family.setdefault(v.recipe.family, []).append(v)
    lines = []
    for family, group in by_family.items():
        if any(v.largest > 0 for v in group):
            continue
        # the least it needs; among equals the most checkpointing (the strongest claim)
        least = min(reversed(group), key=lambda v: v.memory["peak_bytes"])
        mem = least.memory
        parts = mem["breakdown_bytes"]
        states = " + ".join(f"{k} {parts[k] / GiB:.1f}" for k in ("weights", "gradients",
                                                                  "optimizer") if parts.get(k))
        tp = f" (TP {least.recipe.tp})" if least.recipe.tp else ""
        if mem["fits"]:  # the GPU holds it: host RAM is what runs out
            lines.append(f"{prefix}{family}{tp} does not fit: the GPUs would hold it "
                         f"({mem['peak_bytes'] / GiB:.1f} of {mem['capacity_bytes'] / GiB:.1f}"
                         f" GiB), but host RAM would need {mem['host_peak_bytes'] / GiB:,.0f} "
                         f"GiB of {mem['host_capacity_bytes'] / GiB:,.0f}")
            continue
        lines.append(f"{prefix}{family}{tp} does not fit: even with checkpointing "
                     f"{least.checkpointing} at micro-batch 1 it needs "
                     f"{mem['peak_bytes'] / GiB:.1f} GiB of {mem['capacity_bytes'] / GiB:.1f} "
                     f"per GPU ({states} GiB of model states){_reason(family, least)}")
    return lines


def _reason(family: str, verdict: cand.Verdict) -> str:
    if family == "ddp":
        return ": DDP keeps the whole model, its gradients and optimizer states on every GPU"
    if family in ("zero1", "zero2"):
        return ": the weights (and for ZeRO-1 the gradients) stay whole on every GPU"
    if family in ("tp", "tp+ddp"):
        return ": tensor parallelism splits the weights only over the TP group"
    return ""


def runner_up(reports: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The best candidate of another strategy (or TP degree, or machine) than the winner's."""
    def kind(r: dict[str, Any]) -> tuple[Any, ...]:
        o = r["options"]
        return o["topology"], o["strategy"], o["tp"], o["pp"], o["offload"]
    return next((r for r in reports[1:] if kind(r) != kind(reports[0])), None)


def _objective_range(report: dict[str, Any], objective: str) -> list[float] | None:
    if objective == "throughput":
        return report.get("tokens_per_s_range")
    key = "usd_per_million_tokens" if objective == "cost" else "time_to_train_s"
    return report["cost"].get(f"{key}_range")


def runner_up_line(best: dict[str, Any], second: dict[str, Any], objective: str) -> str:
    slower = 1 - second["tokens_per_s"] / best["tokens_per_s"] if best["tokens_per_s"] else 0
    line = (f"runner-up: {second['label']} on {second['topology']}: {_tokens(second)} "
            f"({abs(slower):.0%} {'fewer' if slower >= 0 else 'more'} tokens/s), "
            f"{_price(second)}")
    a, b = _objective_range(best, objective), _objective_range(second, objective)
    if a and b and a[0] <= b[1] and b[0] <= a[1]:
        line += "; their ranges overlap, so the order of these two is not certain"
    return line


def machine_reason(first: dict[str, Any], second: dict[str, Any], objective: str) -> str:
    """Why the first machine beats the second: throughput against hourly price."""
    speed = first["tokens_per_s"] / second["tokens_per_s"]
    a, b = first["cost"]["usd_per_hour"], second["cost"]["usd_per_hour"]
    text = (f"{first['topology']} wins on {objective}: {speed:.0%} of the tokens/s of "
            f"{second['topology']}")
    if a is not None and b is not None:
        text += f" at {a / b:.0%} of its hourly price"
    return text


def machine_lines(reports: list[dict[str, Any]], machines: Sequence[Machine], objective: str
                  ) -> list[str]:
    """Each machine's own best, in the objective's order."""
    firsts: dict[str, dict[str, Any]] = {}
    for r in reports:
        firsts.setdefault(r["options"]["topology"], r)
    lines = ["machines, best first:"]
    for rank, r in enumerate(firsts.values(), 1):
        usd = r["cost"]["usd_per_million_tokens"]
        lines.append(f"  {rank}. {r['topology']}: {r['label']}: {r['tokens_per_s']:,.0f} "
                     f"tokens/s" + ("" if usd is None else f", ${usd:.3g} per million tokens"))
    ordered = list(firsts.values())
    if len(ordered) > 1:
        lines.append(machine_reason(ordered[0], ordered[1], objective))
    missing = [api.load_machine(m.topology).name for m in machines if m.topology not in firsts]
    if missing:
        lines.append(f"  nothing fits on {', '.join(missing)}")
    return lines
