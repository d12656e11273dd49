"""A low-high range on every headline number, from how far the mechanisms a run rests on have
been off on real machines.

The residual table (validation/residuals.json, written by ``scripts/validate.py
--write-residuals``) holds, per mechanism (machine/scales.py), the factor by which measured
rates differ from simulated ones: over every box (an uncalibrated machine) and within each box.
For a run we take the mechanisms it uses (the GPU's compute; the transports its collectives'
rings cross), give each its spread, and simulate again at the slow end of every spread and at
the fast end (``RateScales`` through ``Machine.with_scales``). Each headline number's range is
the smallest and largest of the three runs, so it always holds the point value. One more run per
mechanism (each alone at its slow end) says which one dominates the width.

Spreads: a mechanism measured and fitted on this very box (its points fixed a constant) keeps
that box's own residuals; one the topology's ``calibration`` fitted (``stepsim calibrate``)
gets twice the fit's rms error either way (the residual of every row of the logs that mechanism
carries, fitted or predicted: what the fit explains), or where the fit states none, the
within-box scatter left on the boxes we have (each box's residuals about their own middle); any
other gets the spread over all boxes. A forced fit (the logs contradicted the machine) and a
mechanism with a value on its physical bound narrow nothing. Every spread includes 1 (the model
as it is) and at least ``NOISE_FLOOR`` either way. docs/ranges.md explains the method.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from simulator.machine.scales import MECHANISMS, RateScales

if TYPE_CHECKING:
    from simulator.api.runner import RunResult
    from simulator.api.spec import RunSpec
    from simulator.engine.program import Program
    from simulator.machine.topology import Machine

HEADLINE = ("step_time_s", "tokens_per_s", "tokens_per_s_per_gpu", "mfu", "exposed_comm_s")
# scaling_efficiency_range too, where the run has a one-GPU baseline: each end against one GPU
# simulated at the same scales (the compute spread cancels, the transports' does not)
COST_RANGED = ("usd_per_step", "usd_per_million_tokens", "time_to_train_s", "usd_to_train")
# Assumption: no mechanism is known better than the run-to-run spread of the measurements
# behind it, taken as 2% (a few percent between repeated nccl-tests or training-step timings
# is usual).
NOISE_FLOOR = 0.02

_PACKAGE = Path(__file__).resolve().parent.parent
_TABLE_PATHS = (_PACKAGE / "_presets" / "validation" / "residuals.json",  # wheel
                _PACKAGE.parent / "validation" / "residuals.json")  # source tree

WORDS = {"shm": "collectives through host memory (SHM)",
         "pcie_p2p": "PCIe peer-to-peer collectives",
         "nvlink": "NVLink collectives",
         "net_ib": "collectives between boxes over verbs (IB, RoCE)",
         "net_socket": "collectives between boxes over TCP sockets",
         "compute": "compute"}
OFFLOAD_WORDS = {
    "offload:deepspeed-params": "DeepSpeed ZeRO-3 parameter offload",
    "offload:deepspeed-optimizer": "DeepSpeed optimizer offload (ZeRO-Offload)",
    "offload:fsdp-params": "FSDP CPU offload",
}
LINES = {"geforce": "GeForce", "datacenter": "data-centre"}


@dataclass(frozen=True)
class Spread:
    """Factors on one mechanism's achieved rate: the slow and the fast end, and why."""

    low: float
    high: float
    basis: str


@lru_cache(maxsize=1)
def residual_table() -> dict[str, Any]:
    for path in _TABLE_PATHS:
        if path.is_file():
            with open(path, encoding="utf-8") as f:  # written by validate.py, not by users
                return dict(json.load(f)["mechanisms"])
    return {}


def offload_mechanism(strategy: str, offload: str) -> str | None:
    """The mechanism an offloaded run leans on: whose offload (FSDP's or DeepSpeed's, which
    fetch parameters differently) and what it moves. None without offload."""
    if offload == "none":
        return None
    owner = "fsdp" if strategy.endswith("fsdp") else "deepspeed"
    return f"offload:{owner}-{offload}"


def _table_key(mechanism: str, machine: Machine) -> str:
    return f"compute:{machine.gpu.line}" if mechanism == "compute" else mechanism


def _with_one(low: float, high: float) -> tuple[float, float]:
    """A spread that holds the model as it is, and at least the measurements' own noise."""
    return min(1.0 - NOISE_FLOOR, low), max(1.0 + NOISE_FLOOR, high)


def calibrated_spread(entry: dict[str, Any]) -> tuple[float, float]:
    """What calibrating a box leaves: each box's residuals about its own middle, all boxes."""
    low, high = 1.0 - NOISE_FLOOR, 1.0 + NOISE_FLOOR
    for box in entry["boxes"].values():
        if box["points"] < 2:
            continue
        middle = math.sqrt(box["low"] * box["high"])
        low, high = min(low, box["low"] / middle), max(high, box["high"] / middle)
    return low, high


def spread(mechanism: str, machine: Machine,
           calibrated: Mapping[str, float | None] | None = None,
           key: str | None = None) -> Spread:
    """The range of ``mechanism``'s achieved rate on ``machine``; ``key``: its row of the
    residual table where the run names it (an offload: whose, and what it moves)."""
    key = key or _table_key(mechanism, machine)
    entry = residual_table().get(key)
    if entry is None:
        return Spread(1.0, 1.0, f"no validation points for {key} yet")
    own = [b for b in entry["boxes"].values() if b["fit"] and b["topology"] == machine.name]
    if own:
        low, high = _with_one(own[0]["low"], own[0]["high"])
        return Spread(low, high, f"fitted on this box's own measurements: "
                                 f"{own[0]['points']} points within {low:.2f}-{high:.2f}x")
    if calibrated and mechanism in calibrated:
        rms = calibrated[mechanism]
        if rms is not None:  # the fit on this box says how well it holds: two rms either way
            low, high = _with_one(1 - 2 * rms, 1 + 2 * rms)
            return Spread(low, high, f"calibrated on this box's own logs: fit rms "
                                     f"{rms:.1%}, taken twice either way")
        low, high = calibrated_spread(entry)
        return Spread(low, high, f"calibrated: boxes measured alike scatter {low:.2f}-"
                                 f"{high:.2f}x about their fit")
    low, high = _with_one(entry["low"], entry["high"])
    return Spread(low, high, f"uncalibrated: {evidence_text(entry)}")


def machines_measured(entry: dict[str, Any]) -> int:
    """The distinct machines (topology files) a mechanism's validation points were taken on."""
    return len({b["topology"] for b in entry["boxes"].values()})


def evidence_text(entry: dict[str, Any]) -> str:
    """'9 points on 5 boxes measure 0.83-1.09x the model': what the range and the grade say."""
    points, boxes = entry["points"], machines_measured(entry)
    return (f"{points} point{'s' if points != 1 else ''} on {boxes} "
            f"box{'es' if boxes != 1 else ''} measure{'s' if points == 1 else ''} "
            f"{entry['low']:.2f}-{entry['high']:.2f}x the model")


def hops(result: RunResult) -> set[tuple[int, int]]:
    """Every (sender, receiver) pair the run's communication crosses: each hop of its
    collectives' rings, and each pair of its point-to-point sends (a pipeline's
    activations)."""
    from simulator.engine.program import Comm, SendRecv

    comm = result.comm
    out: set[tuple[int, int]] = set()
    groups: set[tuple[int, ...]] = set()
    for program in result.programs:
        for t in program.tasks:
            if isinstance(t.work, Comm):
                groups.update(g for g in t.work.groups if len(g) > 1)
            elif isinstance(t.work, SendRecv):
                out.update(pair for send in t.work.sends for pair in send.pairs)
    for group in groups:
        order = comm.ring(group).order
        out.update((a, order[(i + 1) % len(order)]) for i, a in enumerate(order))
    return out


def mechanisms_used(result: RunResult) -> list[str]:
    """Compute, and every transport the run's communication crosses (its collectives' rings,
    its point-to-point sends), in MECHANISMS order."""
    comm = result.comm
    used = {"compute"} | {m for a, b in hops(result) if (m := comm.mechanism(a, b))}
    return [m for m in MECHANISMS if m in used]


# Which mechanism each parameter `stepsim calibrate` fits belongs to (nccl/wire.py names):
# a fit of any of them calibrates that mechanism on the box.
CALIBRATES = {
    "shm_pcie_efficiency": "shm", "shm_ll_sync_us": "shm", "shm_simple_sync_us": "shm",
    "host_memory_gb_per_s": "shm", "p2p_pcie_simple_efficiency": "pcie_p2p",
    "p2p_ll_sync_us": "pcie_p2p", "p2p_simple_sync_us": "pcie_p2p",
    "simple_channel_cap_gbps": "pcie_p2p", "ll_channel_cap_gbps": "pcie_p2p",
    "nvlink_simple_efficiency": "nvlink",
    "net_efficiency": "net_ib", "net_ib_sync_us": "net_ib", "socket_stream_gbps": "net_socket",
}


def calibrated_mechanisms(machine: Machine, workload: str | None = None
                          ) -> dict[str, float | None]:
    """Mechanisms the topology's ``calibration`` fitted, each with the fit's rms error (None:
    not stated). Compute counts when a measured step of this workload on this GPU is there."""
    calibration = machine.config.calibration
    if calibration is None:
        return {}
    out: dict[str, float | None] = {}
    # a forced fit described another machine, a value on its bound what the model could not
    # explain: neither narrows the mechanism's range
    bound = {CALIBRATES.get(f.parameter) for f in calibration.fitted if f.at_bound}
    for fit in calibration.fitted if not calibration.forced else []:
        mechanism = CALIBRATES.get(fit.parameter)
        if mechanism is None or mechanism in bound:
            continue
        rms = fit.rms_error
        previous = out.get(mechanism)
        out[mechanism] = rms if previous is None else max(previous, rms or 0.0)
    if any(c.workload == workload and c.gpu == machine.gpu.name for c in calibration.compute):
        out["compute"] = None
    return out


def _scales(spreads: dict[str, Spread], end: str) -> RateScales:
    return RateScales(**{m: getattr(s, end) for m, s in spreads.items()})


def add_ranges(result: RunResult, *, rerun: Callable[[RunSpec], dict[str, Any]],
               step_time: Callable[[RunSpec, list[Program] | None], float],
               one_gpu: Callable[[RunSpec], float | None]) -> dict[str, Any]:
    """Put ``<key>_range`` beside every headline and cost key of ``result.report``; returns
    the report. Simulates the run again at the slow and fast ends of its mechanisms: ``rerun``
    a spec's whole report, ``step_time`` its step alone (with the point's programs where they
    hold), ``one_gpu`` its one-GPU baseline (runner.py hands in its own)."""
    report = result.report
    machine = result.machine
    calibrated = calibrated_mechanisms(machine, result.job.name)
    spreads = {m: spread(m, machine, calibrated) for m in mechanisms_used(result)}
    offload = offload_mechanism(result.spec.strategy, result.spec.offload)
    if offload is not None:  # its copies and CPU optimizer, re-run at its spread's ends
        spreads["offload"] = spread("offload", machine, calibrated, key=offload)
    wide = {m: s for m, s in spreads.items() if (s.low, s.high) != (1.0, 1.0)}

    def at(scales: RateScales) -> RunSpec:
        return replace(result.spec, scales=scales)

    def alone(scales: RateScales) -> float:  # the point's programs, where they hold: the
        # strategies build compute and offload flows from the scales, not the transports'
        same = (scales.compute, scales.offload) == (result.spec.scales.compute,
                                                    result.spec.scales.offload)
        return step_time(at(scales), result.programs if same else None)

    slow_scales, fast_scales = _scales(wide, "low"), _scales(wide, "high")
    slow, fast = ((rerun(at(slow_scales)), rerun(at(fast_scales))) if wide
                  else (report, report))  # nothing wide: both ends are the point
    # the width shares: each mechanism alone at its slow end
    shares_at = ({m: alone(RateScales(**{m: s.low})) for m, s in wide.items()}
                 if len(wide) > 1 else {})
    corners = (report, slow, fast)
    for key in HEADLINE:
        values = [r[key] for r in corners]
        report[f"{key}_range"] = [min(values), max(values)]
    if report.get("scaling_efficiency") is not None:  # against one GPU at the same scales
        values = [report["scaling_efficiency"]]
        for r, scales in ((slow, slow_scales), (fast, fast_scales)):
            one = one_gpu(at(scales))
            if one:
                values.append(r["tokens_per_s_per_gpu"] / one)
        report["scaling_efficiency_range"] = [min(values), max(values)]
    for key in COST_RANGED:
        values = [r["cost"][key] for r in corners]
        if all(v is not None for v in values):
            report["cost"][f"{key}_range"] = [min(values), max(values)]
    shares = _width_shares(report, slow, wide, shares_at)
    report["range_basis"] = {
        "mechanisms": {m: {"low": s.low, "high": s.high, "basis": s.basis,
                           **({"words": OFFLOAD_WORDS.get(offload, offload)}
                              if m == "offload" and offload else {})}
                       for m, s in spreads.items()},
        "width_share": shares,
        "dominant": max(shares, key=shares.__getitem__) if shares else None,
    }
    report["range_basis"]["summary"] = summary_line(report, machine)
    return report


def _width_shares(point: dict[str, Any], slow: dict[str, Any], wide: dict[str, Spread],
                  alone_step_times: dict[str, float]) -> dict[str, float]:
    """Each mechanism's share of the step-time width: itself alone at its slow end (the
    step times of those re-runs, where more than one mechanism is wide)."""
    width = slow["step_time_s"] - point["step_time_s"]
    if not wide or width <= 0:
        return {}
    if len(wide) == 1:
        return {next(iter(wide)): 1.0}
    alone = {m: t - point["step_time_s"] for m, t in alone_step_times.items()}
    total = sum(max(0.0, v) for v in alone.values()) or 1.0
    return {m: max(0.0, v) / total for m, v in alone.items()}


def summary_line(report: dict[str, Any], machine: Machine) -> str:
    """One line: what dominates the width of the step-time range, and how to narrow it."""
    basis = report["range_basis"]
    dominant = basis["dominant"]
    if dominant is None:
        return "range: no validation spread applies to this run's mechanisms"
    info = basis["mechanisms"][dominant]
    what = info.get("words") or WORDS[dominant] + (
        f" on {LINES.get(machine.gpu.line, machine.gpu.line)} GPUs"
        if dominant == "compute" else "")
    share = basis["width_share"][dominant]
    narrow = ("" if not info["basis"].startswith("uncalibrated") or dominant == "offload" else
              "; a measured one-GPU step of this job narrows it" if dominant == "compute" else
              "; an nccl-tests log of this box narrows it")
    return f"range: {what} sets {share:.0%} of its width ({info['basis']}){narrow}"
