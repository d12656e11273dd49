"""Speed of the simulator: wall time and simulated seconds per wall second.

Each benchmark is a function returning (simulated seconds, label) and is listed in
BENCHMARKS; the table prints its first (cold: module imports, topology parsing, ring search)
and best warm wall time over --repeat runs, and simulated seconds per warm wall second.
Not a timed test: targets are in design.md ("Speed").

    python scripts/bench.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from simulator.cli import main as stepsim


def _json_of(argv: list[str]) -> Any:
    """Run `stepsim ARGV --json` in this process and return what it printed."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = stepsim(argv)
    if code != 0:
        raise SystemExit(f"stepsim {' '.join(argv)} exited {code}")
    return json.loads(out.getvalue())


def collective_sweep() -> tuple[float, str]:
    """31-size all-reduce sweep (8 B .. 8 GiB) on 8x5090-dual-socket, through the CLI."""
    argv = ["collective", "-t", "8x5090-dual-socket", "--op", "allreduce",
            "-b", "8", "-e", "8G", "-f", "2", "--json"]
    results = _json_of(argv)
    simulated = sum(r["time_us"] for r in results) * 1e-6
    return simulated, f"stepsim {' '.join(argv)}  ({len(results)} sizes)"


def _run_step(argv: list[str]) -> tuple[float, str]:
    """One `stepsim run --json` through the CLI; simulated seconds = the step time."""
    report = _json_of(argv)
    tasks = len(report.get("buckets") or [])
    extra = f"  ({tasks} buckets)" if tasks else ""
    return report["step_time_s"], f"stepsim {' '.join(argv)}{extra}"


def ddp_7b_step() -> tuple[float, str]:
    """8-GPU DDP step of a 7B model with 25 MiB buckets (design.md target: about 1 s)."""
    return _run_step(["run", "-t", "8x5090-switch", "-w", "llama2-7b", "-s", "ddp",
                      "--bucket-mb", "25", "--no-ranges", "--json"])


def fsdp_7b_step() -> tuple[float, str]:
    """8-GPU FSDP step of a 7B model (acceptance: at most 2 s of wall time)."""
    return _run_step(["run", "-t", "8x5090-switch", "-w", "llama2-7b", "-s", "fsdp",
                      "--no-ranges", "--json"])


def ranged_7b_step() -> tuple[float, str]:
    """The DDP step with its ranges: the same step again at the ends of its mechanisms."""
    return _run_step(["run", "-t", "8x5090-switch", "-w", "llama2-7b", "-s", "ddp",
                      "--bucket-mb", "25", "--json"])


@functools.cache
def _tree64() -> str:
    """scripts/boxes.py's 64-GPU PCIe tree of 5090s, written once to a temporary file."""
    from boxes import pcie_tree  # scripts/ is this script's directory

    path = Path(tempfile.gettempdir()) / "stepsim-bench-tree64.yaml"
    path.write_text(pcie_tree(64), encoding="utf-8")
    return str(path)


def pipeline_64_step() -> tuple[float, str]:
    """64 GPUs as 8 pipeline stages x 8 data-parallel replicas, 1F1B over 16 micro-batches:
    a program per stage, every micro-batch simulated (they interleave)."""
    return _run_step(["run", "-t", _tree64(), "-w", "llama2-7b", "-s", "ddp", "--pp", "8",
                      "--grad-accum", "16", "--checkpointing", "full", "--no-ranges",
                      "--json"])


BENCHMARKS: list[Callable[[], tuple[float, str]]] = [
    collective_sweep,
    ddp_7b_step,
    fsdp_7b_step,
    ranged_7b_step,
    pipeline_64_step,
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs per benchmark (best kept)")
    args = parser.parse_args(argv)
    print(f"{'cold s':>8} {'warm s':>8} {'sim s / wall s':>15}  benchmark")
    for bench in BENCHMARKS:
        walls = []
        for _ in range(max(2, args.repeat)):
            t0 = time.perf_counter()
            simulated, label = bench()
            walls.append(time.perf_counter() - t0)
        best = min(walls[1:])
        print(f"{walls[0]:>8.3f} {best:>8.3f} {simulated / best:>15.3g}  {label}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
