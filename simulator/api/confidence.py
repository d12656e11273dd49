"""How far to trust a run: a grade for each mechanism it leans on, from the validation points
of that mechanism (how many, and how far the model was off on them).

The evidence is the residual table the ranges read (validation/residuals.json, written by
``scripts/validate.py --write-residuals``): per mechanism, the factor by which measured rates
differed from simulated ones, over every box and within each. A run leans on the GPU's
compute, on each transport its collectives' rings cross (ranges.mechanisms_used), on the
network between boxes where a ring crosses one, and on offloading to host RAM where it
offloads (DeepSpeed's and FSDP's offload are graded apart: their validation runs disagree).

Grades, from the points that apply to this machine (a mechanism fitted on this very box: its
own points; calibrated with ``stepsim calibrate``: the fit's rms error, or for a fit to one
measured step, the scatter boxes keep about their own fit, graded as two points (or as every
box's points, where they grade higher); else every box's):

- ``high``: at least 3 points, none more than 10% off;
- ``medium``: at least 2 points, none more than 25% off;
- ``low``: fewer points, or one further off (the run may be off by as much);
- ``none``: no validation point of the mechanism at all.

"Off" is the larger of ``1/low - 1`` and ``high - 1``: a rate measured at half the model's is
100% off. A run's grade is its worst mechanism's: the answer is as sure as its least-checked
part. ``thin`` lists the mechanisms graded low or none.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from simulator.api.ranges import (
    LINES,
    OFFLOAD_WORDS,
    WORDS,
    calibrated_mechanisms,
    calibrated_spread,
    evidence_text,
    hops,
    machines_measured,
    mechanisms_used,
    offload_mechanism,
    residual_table,
)

if TYPE_CHECKING:
    from simulator.api.runner import RunResult
    from simulator.machine.topology import Machine

GRADES = ("high", "medium", "low", "none")  # best first
THIN = ("low", "none")
HIGH_OFF, MEDIUM_OFF = 0.10, 0.25  # how far off the worst point may be for high, medium
HIGH_POINTS, MEDIUM_POINTS = 3, 2

NETWORK = "network"


def words(mechanism: str, machine: Machine | None = None) -> str:
    if mechanism == "compute" and machine is not None:
        return f"compute on {LINES.get(machine.gpu.line, machine.gpu.line)} GPUs"
    if mechanism == NETWORK:
        return "collectives over the network between boxes"
    return WORDS.get(mechanism) or OFFLOAD_WORDS.get(mechanism, mechanism)


@dataclass(frozen=True)
class Evidence:
    """The validation points behind one mechanism on one machine."""

    points: int  # 0: none; a calibration's log counts as enough points
    boxes: int
    low: float | None  # measured / simulated rate, the slowest and fastest point
    high: float | None
    basis: str

    @property
    def off(self) -> float | None:
        if self.low is None or self.high is None:
            return None
        return max(1 / self.low - 1, self.high - 1)

    @property
    def grade(self) -> str:
        off = self.off
        if self.points == 0 or off is None:
            return "none"
        if self.points >= HIGH_POINTS and off <= HIGH_OFF:
            return "high"
        if self.points >= MEDIUM_POINTS and off <= MEDIUM_OFF:
            return "medium"
        return "low"


def _table_key(mechanism: str, machine: Machine) -> str:
    return f"compute:{machine.gpu.line}" if mechanism == "compute" else mechanism


def evidence(mechanism: str, machine: Machine,
             calibrated: dict[str, float | None] | None = None) -> Evidence:
    """What the validation set says about ``mechanism`` on ``machine``."""
    entry = residual_table().get(_table_key(mechanism, machine))
    if entry is None:
        return Evidence(0, 0, None, None, "no validation points")
    own = [b for b in entry["boxes"].values() if b["fit"] and b["topology"] == machine.name]
    if own:
        box = own[0]
        return Evidence(box["points"], 1, box["low"], box["high"],
                        f"fitted on this box: {box['points']} points within "
                        f"{box['low']:.2f}-{box['high']:.2f}x")
    if calibrated and mechanism in calibrated and calibrated[mechanism] is not None:
        rms = float(calibrated[mechanism] or 0.0)
        # a fitted log has many sizes: the fit's error, taken twice either way, decides
        return Evidence(HIGH_POINTS, 1, 1 - 2 * rms, 1 + 2 * rms,
                        f"calibrated on this box's logs: fit rms {rms:.1%}")
    every_box = Evidence(entry["points"], machines_measured(entry), entry["low"],
                         entry["high"], evidence_text(entry))
    if calibrated and mechanism in calibrated:  # one measured step: no fit error to show
        low, high = calibrated_spread(entry)
        step = Evidence(MEDIUM_POINTS, 1, low, high,
                        f"calibrated on a measured step of this box: boxes measured alike "
                        f"scatter {low:.2f}-{high:.2f}x about their fit")
        # a calibration never grades a mechanism below what every box says of it
        return min(step, every_box, key=lambda e: GRADES.index(e.grade))
    return every_box


def _crosses_network(result: RunResult) -> bool:
    comm = result.comm
    return any(comm.transport(a, b) == "NET" for a, b in hops(result))


def leaned_on(result: RunResult) -> list[str]:
    """The mechanisms a run rests on: compute, the transports its rings cross, the network,
    its offload."""
    out = mechanisms_used(result)
    if _crosses_network(result):
        out.append(NETWORK)
    offload = offload_mechanism(result.spec.strategy, result.spec.offload)
    if offload is not None:
        out.append(offload)
    return out


def worst(grades: list[str]) -> str:
    return max(grades, key=GRADES.index) if grades else "none"


def grade_run(result: RunResult) -> dict[str, Any]:
    """The report's ``confidence`` block: each mechanism's grade and evidence, the run's
    grade (its worst mechanism's), the thin ones, and a line of text."""
    machine = result.machine
    calibrated = calibrated_mechanisms(machine, result.job.name)
    mechanisms: dict[str, Any] = {}
    for m in leaned_on(result):
        e = evidence(m, machine, calibrated)
        mechanisms[m] = {"grade": e.grade, "words": words(m, machine), "points": e.points,
                         "boxes": e.boxes, "low": e.low, "high": e.high, "basis": e.basis}
    block: dict[str, Any] = {
        "grade": worst([m["grade"] for m in mechanisms.values()]),
        "mechanisms": mechanisms,
        "thin": [m for m, info in mechanisms.items() if info["grade"] in THIN],
    }
    block["summary"] = summary_line(block)
    return block


def summary_line(block: dict[str, Any]) -> str:
    """``confidence: low: <the weakest first> ...``: each mechanism with its grade and why."""
    ordered = sorted(block["mechanisms"].values(), key=lambda m: -GRADES.index(m["grade"]))
    parts = [f"{m['words']} {m['grade']} ({m['basis']})" for m in ordered]
    return f"confidence: {block['grade']}: " + "; ".join(parts)


def short(block: dict[str, Any] | None) -> str:
    """The grade and the mechanisms that set it, for a table cell: ``low (collectives through
    host memory (SHM))``."""
    if not block:
        return "-"
    setting = [m["words"] for m in block["mechanisms"].values() if m["grade"] == block["grade"]]
    if block["grade"] == "high" or not setting:
        return block["grade"]
    return f"{block['grade']} ({', '.join(setting)})"
