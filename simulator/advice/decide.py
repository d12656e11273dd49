"""Which of several runs wins (a comparison, a sweep), and the mechanism that decides it.

The winner is the run with the most tokens/s among those that fit (a run that does not fit,
or was simulated anyway, cannot win). Why is one sentence: each run's step per token is split
into compute, exposed communication and the rest (idle: a pipeline's bubble, waits for slower
ranks), and the part that differs most between the winner and the run it is held against
decides: its compute (the card, its MFU), the link its communication waits on, or idle time.
When the two runs' tokens/s ranges overlap the order is not certain, and the line says so.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def _simulated(report: dict[str, Any]) -> bool:
    return (report.get("simulated", True) and not report.get("simulated_anyway")
            and report["memory"]["fits"] and report["memory"].get("host_fits", True) is not False)


def _per_token(report: dict[str, Any]) -> dict[str, float]:
    tokens = report["tokens_per_step"] or 1
    step, compute, exposed = (report["step_time_s"], report["compute_time_s"],
                              report["exposed_comm_s"])
    return {"compute": compute / tokens, "communication": exposed / tokens,
            "idle": max(0.0, step - compute - exposed) / tokens}


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:.3g} us"


def _card(report: dict[str, Any]) -> str:
    return f"{report['gpus']} x {report['gpu']}"


def why(winner: dict[str, Any], other: dict[str, Any], labels: tuple[str, str]) -> str:
    """The one sentence: what makes ``winner`` faster per token than ``other``."""
    w, o = _per_token(winner), _per_token(other)
    gaps = {part: o[part] - w[part] for part in w}
    part = max(gaps, key=gaps.__getitem__)
    if gaps[part] <= 0:
        return f"{labels[0]} and {labels[1]} take the same time per token"
    if part == "compute":
        return (f"compute decides: {labels[0]} spends {_us(w['compute'])} of compute per token "
                f"on {_card(winner)} (MFU {winner['mfu']:.0%}) against {_us(o['compute'])} for "
                f"{labels[1]} on {_card(other)} (MFU {other['mfu']:.0%})")
    if part == "communication":
        step = other["step_time_s"]
        share = other["exposed_comm_s"] / step if step else 0.0
        bn = other.get("bottleneck") or {}
        link = bn.get("description") or bn.get("link") or "its links"
        return (f"communication decides: {labels[1]} waits {share:.0%} of its step on "
                f"communication ({_us(o['communication'])} per token against "
                f"{_us(w['communication'])} for {labels[0]}), bound by {link}")
    step = other["step_time_s"]
    share = (step - other["compute_time_s"] - other["exposed_comm_s"]) / step if step else 0.0
    return (f"idle time decides: {labels[1]}'s GPUs idle {share:.0%} of its step (a pipeline's "
            f"bubble, or ranks waiting for slower ones): {_us(o['idle'])} per token against "
            f"{_us(w['idle'])}")


def _overlap(a: dict[str, Any], b: dict[str, Any]) -> bool:
    ra, rb = a.get("tokens_per_s_range"), b.get("tokens_per_s_range")
    return bool(ra and rb and ra[0] <= rb[1] and rb[0] <= ra[1])


def winner_lines(reports: Sequence[dict[str, Any]], labels: Sequence[str], *,
                 against: str = "runner-up") -> list[str]:
    """``winner: ...`` and ``why: ...``; ``against``: hold the winner against the
    ``runner-up`` (a comparison of machines) or the ``slowest`` run (a sweep: what the swept
    option costs at its worst)."""
    ranked = sorted((i for i, r in enumerate(reports) if _simulated(r)),
                    key=lambda i: -reports[i]["tokens_per_s"])
    if not ranked:
        return ["winner: none: no run fits in memory"]
    best = reports[ranked[0]]
    line = f"winner: {labels[ranked[0]]}: {best['tokens_per_s']:,.0f} tokens/s"
    usd = best["cost"]["usd_per_million_tokens"]
    if usd is not None:
        line += f", ${usd:.3g} per million tokens"
    if len(ranked) == 1:
        return [line + " (the only run that fits)"]
    second = reports[ranked[1]]
    ratio = best["tokens_per_s"] / second["tokens_per_s"] if second["tokens_per_s"] else 0.0
    line += f", {ratio:.2f}x {labels[ranked[1]]}"
    if _overlap(best, second):
        line += " (their ranges overlap: the order of these two is not certain)"
    priced = [i for i in ranked if reports[i]["cost"]["usd_per_million_tokens"] is not None]
    cheapest = min(priced, key=lambda i: reports[i]["cost"]["usd_per_million_tokens"],
                   default=None)
    if cheapest is not None and cheapest != ranked[0]:
        line += (f"; cheapest per token: {labels[cheapest]} at "
                 f"${reports[cheapest]['cost']['usd_per_million_tokens']:.3g} per million")
    other = ranked[1] if against == "runner-up" else ranked[-1]
    return [line, "why: " + why(best, reports[other], (labels[ranked[0]], labels[other]))]
