"""How sure advise's pick is: the confidence of the mechanisms it rests on (api/confidence.py),
which of them are thinly validated, and the best candidate that does not rest on them.

A thin mechanism is one graded low or none. The pick's thin mechanisms split in two: those
every ranked candidate on its machine shares (no choice of strategy avoids them: SHM
collectives on a box without P2P), which only measuring the box can narrow, and those a choice
brings (an offload mode whose validation runs were far off), which another choice avoids.
For those, the answer names the best candidate whose thin mechanisms are a strict subset of
the pick's: it avoids at least one and brings none of its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from simulator.advice import explain

# what narrows each mechanism's spread, for the box the user has or will measure
NARROW = {
    "compute": "a measured one-GPU step of this job narrows it (stepsim calibrate "
               "--step-time)",
    "shm": "an nccl-tests log of this box narrows it (stepsim calibrate)",
    "pcie_p2p": "an nccl-tests log of this box narrows it (stepsim calibrate)",
    "nvlink": "an nccl-tests log of this box narrows it (stepsim calibrate)",
}
MEASURE = "measure a step of it before relying on the figure"


def thin(report: dict[str, Any]) -> frozenset[str]:
    return frozenset((report.get("confidence") or {}).get("thin", ()))


def _machine(report: dict[str, Any]) -> tuple[Any, Any]:
    return report["options"]["topology"], report["options"]["gpus"]


def shared(best: dict[str, Any], reports: Sequence[dict[str, Any]]) -> frozenset[str]:
    """The pick's thin mechanisms that every ranked candidate on its machine rests on."""
    same = [thin(r) for r in reports if _machine(r) == _machine(best)]
    return frozenset.intersection(*same) if same else frozenset()


def alternative(best: dict[str, Any], reports: Sequence[dict[str, Any]]
                ) -> dict[str, Any] | None:
    """The best-ranked candidate whose thin mechanisms are a strict subset of the pick's."""
    mine = thin(best)
    if not mine:
        return None
    return next((r for r in reports if thin(r) < mine), None)


def _mechanism(best: dict[str, Any], m: str) -> str:
    info = best["confidence"]["mechanisms"][m]
    return f"{info['words']} ({info['grade']}: {info['basis']})"


def lines(best: dict[str, Any], alt: dict[str, Any] | None,
          common: frozenset[str]) -> list[str]:
    """The pick's confidence line, then what it rests on thinly and what avoids it."""
    out = [best["confidence"]["summary"]]
    own = [m for m in best["confidence"]["thin"] if m not in common]
    if own:
        text = ("thinly validated: the pick rests on "
                + "; ".join(_mechanism(best, m) for m in own))
        if alt is None:
            text += (f"; no ranked candidate avoids it without resting on another thin one: "
                     f"{MEASURE}")
        else:
            fewer = 1 - alt["tokens_per_s"] / best["tokens_per_s"] if best["tokens_per_s"] else 0
            text += (f". The best pick that does not: {alt['label']} on "
                     f"{explain.machine_of(alt)}: {alt['tokens_per_s']:,.0f} tokens/s "
                     f"({fewer:.0%} fewer), confidence {alt['confidence']['grade']}"
                     + (f"; run it alone: {alt['command']}" if alt.get("command") else ""))
        out.append(text)
    for m in best["confidence"]["thin"]:
        if m in common:
            out.append(f"every candidate on {explain.machine_of(best)} rests on "
                       f"{_mechanism(best, m)}: {NARROW.get(m, MEASURE)}")
    return out
