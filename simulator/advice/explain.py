"""The words of `stepsim advise`'s answer: what the search weighed, simulated and left out,
the winner and its bottleneck, what does not fit and why, the runner-up and what it costs,
and each machine's best (advise.py decides; this module only says it)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from simulator import api
from simulator.advice import candidates as cand
from simulator.units import GiB

if TYPE_CHECKING:
    from simulator.advice.advise import PricedMachine


@dataclass
class Tally:
    """What the search did, for the explanation (every count is of distinct configurations)."""

    choices: int = 0  # strategy, recipe, kernel and checkpointing choices weighed
    first: int = 0  # choices that fit, at their largest micro-batch
    bounded: int = 0  # of them, left out by the bound
    variants: int = 0  # their variants
    bounded_variants: int = 0  # of them, left out by the bound
    pruned: int = 0  # variants memory ruled out before a simulation
    refused: int = 0  # variants the simulator cannot run (a recipe flag that does not apply)
    simulated: int = 0  # configurations simulated end to end
    first_simulated: int = 0  # of them in the first round
    unfit: int = 0  # simulated, but over memory in the run's exact verdict


def search_lines(workload: str, names: str, tally: Tally, objective: str, workers: int | str,
                 elapsed: float, ranked: int) -> list[str]:
    """What was weighed, simulated and left out, and why: the first lines of the answer."""
    t = tally
    where = (workers if isinstance(workers, str) else
             f"{workers} process{'es' if workers > 1 else ''}")
    head = (f"{workload} on {names}: {t.choices} strategy, recipe, kernel and checkpointing "
            f"choices; {t.first} fit in memory at their largest micro-batch; {t.simulated} "
            f"configurations simulated in {elapsed:.1f} s ({where}), {ranked} ranked by "
            f"{objective}")
    if not t.first:
        return [head]
    search = (f"searched: each choice that fits, at its largest micro-batch (eager kernels "
              "only where torch.compile fits less), then its variants at the same batch "
              "(every smaller micro-batch with gradient accumulation, each lighter "
              "checkpointing mode at its own largest micro-batch, DDP bucket sizes, DeepSpeed "
              f"overlap_comm and pinned offload, eager kernels: {t.variants}); not simulated: "
              f"{t.bounded + t.bounded_variants} whose compute alone, with every communication "
              "hidden, is slower than a run already simulated they would have to beat "
              f"({t.bounded} choices, {t.bounded_variants} variants), and {t.pruned} variants "
              "that do not fit in memory")
    if t.refused:
        search += f", {t.refused} that do not run"
    if t.unfit:
        search += (f"; {t.unfit} simulated did not fit in their run's exact memory verdict (a "
                   "pipeline's own stage split) and are not ranked")
    return [head, search]


def machine_name(m: PricedMachine) -> str:
    """The machine as the answer names it: its name, and ``:K`` where only K GPUs are used."""
    name = api.load_machine(m.topology, nnodes=m.nnodes).name
    return f"{name}:{m.gpus}" if m.gpus else name


def machine_of(report: dict[str, Any]) -> str:
    gpus = (report.get("options") or {}).get("gpus")
    return f"{report['topology']}:{gpus}" if gpus else str(report["topology"])


def prefix(machines: Sequence[PricedMachine], m: PricedMachine) -> str:
    return f"on {machine_name(m)}, " if len(machines) > 1 else ""


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
    return (f"best ({objective}): {best['label']} on {machine_of(best)}: {_tokens(best)}, "
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


def _objective_range(report: dict[str, Any], objective: str) -> list[float] | None:
    if objective == "throughput":
        return report.get("tokens_per_s_range")
    key = "usd_per_million_tokens" if objective == "cost" else "time_to_train_s"
    return report["cost"].get(f"{key}_range")


def runner_up_line(best: dict[str, Any], second: dict[str, Any], objective: str) -> str:
    slower = 1 - second["tokens_per_s"] / best["tokens_per_s"] if best["tokens_per_s"] else 0
    line = (f"runner-up: {second['label']} on {machine_of(second)}: {_tokens(second)} "
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
    text = (f"{machine_of(first)} wins on {objective}: {speed:.0%} of the tokens/s of "
            f"{machine_of(second)}")
    if a is not None and b is not None:
        text += f" at {a / b:.0%} of its hourly price"
    return text


def machine_lines(reports: list[dict[str, Any]], machines: Sequence[PricedMachine], objective: str
                  ) -> list[str]:
    """Each machine's own best, in the objective's order."""
    firsts: dict[tuple[str, int | None, int | None], dict[str, Any]] = {}
    for r in reports:  # a machine is a topology, its GPUs and its box count
        o = r["options"]
        firsts.setdefault((o["topology"], o["gpus"], o.get("nnodes")), r)
    lines = ["machines, best first:"]
    for rank, r in enumerate(firsts.values(), 1):
        usd = r["cost"]["usd_per_million_tokens"]
        lines.append(f"  {rank}. {machine_of(r)}: {r['label']}: {r['tokens_per_s']:,.0f} "
                     f"tokens/s" + ("" if usd is None else f", ${usd:.3g} per million tokens"))
    ordered = list(firsts.values())
    if len(ordered) > 1:
        lines.append(machine_reason(ordered[0], ordered[1], objective))
    missing = [machine_name(m) for m in machines if m.key not in firsts]
    if missing:
        lines.append(f"  nothing fits on {', '.join(missing)}")
    return lines
