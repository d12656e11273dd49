"""The calibrated topology: the user's topology file with a ``calibration`` block.

The original text is kept as it is (comments and all) and its ``calibration`` block, if any,
replaced: a new collective fit replaces the fitted and left-at-default lists, a transport fitted
to a measured step replaces that parameter alone, a new measured step replaces the entry of
the same workload and GPU. The result is loaded back through the
schema before it is written, so a calibrated file always loads.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from simulator.inputs.config import load_topology, resolve
from simulator.inputs.schema import (
    CalibrationConfig,
    ComputeCalibration,
    FittedValue,
    UnfittedValue,
    dump,
)
from simulator.outputs.files import write_atomically

HEADER = ("# calibration: written by `stepsim calibrate` (values fitted to this machine's own "
          "measurements;\n# docs/inputs.md lists the parameters)")


def merged(old: CalibrationConfig | None, *, source: str | None = None,
           fitted: list[FittedValue] | None = None, left: list[UnfittedValue] | None = None,
           compute: ComputeCalibration | None = None, transport: FittedValue | None = None,
           forced: str = "") -> CalibrationConfig:
    """``old`` with a new collective fit (and whether it was forced), a transport fitted to a
    measured step and/or a new measured step's compute."""
    base = old or CalibrationConfig()
    entries = list(base.compute)
    if compute is not None:
        entries = [c for c in entries if (c.workload, c.gpu) != (compute.workload, compute.gpu)]
        entries.append(compute)
    sources = [s for s in (base.source if fitted is None else "", source or "") if s]
    fits = base.fitted if fitted is None else fitted
    lefts = base.left_at_default if left is None else left
    if transport is not None:  # that parameter alone; the logs' other fits stand
        fits = [f for f in fits if f.parameter != transport.parameter] + [transport]
        lefts = [u for u in lefts if u.parameter != transport.parameter]
    return CalibrationConfig(
        source="; ".join(dict.fromkeys(sources)),
        forced=base.forced if fitted is None else forced,
        fitted=fits, left_at_default=lefts, compute=entries)


def render(topology_text: str, calibration: CalibrationConfig) -> str:
    """The topology text with its calibration block (replaced, or added at the end)."""
    text = _without_calibration(topology_text).rstrip("\n")
    data: dict[str, Any] = dump(calibration, exclude_defaults=True)
    block = yaml.safe_dump({"calibration": data}, sort_keys=False, width=100)
    return f"{text}\n{HEADER}\n{block}"


def _without_calibration(text: str) -> str:
    lines = text.splitlines(keepends=True)
    out, skipping = [], False
    for line in lines:
        if re.match(r"calibration\s*:", line) or line.startswith(HEADER.splitlines()[0]):
            skipping = True
            continue
        if skipping and (line.startswith((" ", "\t", "-", "#")) or not line.strip()):
            if line.startswith("#") and not line.startswith("# calibration"):
                skipping = False
                out.append(line)
            continue
        skipping = False
        out.append(line)
    return "".join(out)


def write(topology: str, calibration: CalibrationConfig, output: str) -> None:
    """Write the calibrated topology to ``output``, all or nothing, loaded back first."""
    text = render(resolve(topology, "topologies").read_text(encoding="utf-8"), calibration)

    def checked(tmp: Path) -> None:
        tmp.write_text(text, encoding="utf-8")
        load_topology(str(tmp))  # the schema's own check: a calibrated file always loads

    write_atomically(output, checked)
