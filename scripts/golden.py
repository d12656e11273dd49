"""Golden outputs: what a fixed set of `stepsim` commands prints, kept in tests/golden/.

tests/test_golden.py runs every command below and compares its output with the stored file,
so a change meant only to make the simulator faster (or tidier) cannot move a figure
unnoticed. Figures may move by float round-off, nothing more: JSON outputs must have the same
structure and strings, and numbers within a relative 1e-9; text outputs the same text between
their numbers, and numbers within a relative 1e-9 or one unit of their last printed digit (a
figure printed rounded may flip its last digit on a round-off change).

    python scripts/golden.py            # say which outputs differ (a unified diff of each)
    python scripts/golden.py --update   # rewrite the stored outputs from this build

When to run ``--update``: only when a change is *meant* to move figures or wording (new
physics, a corrected constant, a new report key), in the same commit as that change, with the
reason in its message. Never to make a speed or refactoring change pass: there, a difference
is a bug.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import io
import json
import math
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's simulator, not an installed copy
GOLDEN_DIR = ROOT / "tests" / "golden"
COLUMNS = 120  # the terminal width the stored text tables are drawn at
REL_TOL = 1e-9  # round-off, not a change of physics
_DGX1 = str(ROOT / "validation" / "topologies" / "dgx1-v100.yaml")

_SWEEP = ["-t", "8x5090-dual-socket", "-w", "gpt2-medium", "--bucket-mb", "1,5,25,100,400",
          "--gpus", "1,2,4,8"]
_COLLECTIVE = ["-t", "8x5090-dual-socket", "--op", "allreduce", "-b", "8", "-e", "8G", "-f", "2"]

# name -> argv; every command of the CLI that prints figures, in text and in JSON
COMMANDS: dict[str, list[str]] = {
    "collective-allreduce-dual-socket": ["collective", *_COLLECTIVE],
    "collective-allreduce-dual-socket.json": ["collective", *_COLLECTIVE, "--json"],
    "collective-allgather-h100": ["collective", "-t", "8xh100-nvswitch", "--op", "allgather",
                                  "-b", "1K", "-e", "1G", "-f", "8"],
    "collective-reducescatter-switch.json": ["collective", "-t", "8x5090-switch", "--op",
                                             "reducescatter", "-b", "64K", "-e", "256M", "-f",
                                             "16", "--json"],
    "collective-broadcast-2080ti.json": ["collective", "-t", "2x2080ti-switch", "--op",
                                         "broadcast", "-b", "8", "-e", "64M", "-f", "64",
                                         "--json"],
    "collective-tree-a100": ["collective", "-t", "8xa100-nvswitch", "--op", "allreduce",
                             "--algo", "tree", "-b", "1K", "-e", "1G", "-f", "32"],
    "collective-dgx1.json": ["collective", "-t", _DGX1, "--op", "allreduce", "--bytes", "1G",
                             "--json"],
    "topo-dual-socket": ["topo", "-t", "8x5090-dual-socket"],
    "topo-dual-socket.json": ["topo", "-t", "8x5090-dual-socket", "--json"],
    "topo-h100.json": ["topo", "-t", "8xh100-nvswitch", "--json"],
    "topo-dgx1": ["topo", "-t", _DGX1],
    "topo-mixed.json": ["topo", "-t", "2x5090-2x4090", "--json"],
    "memory-fsdp-7b": ["memory", "-t", "8x5090-switch", "-w", "llama2-7b", "-s", "fsdp"],
    "memory-fsdp-7b.json": ["memory", "-t", "8x5090-switch", "-w", "llama2-7b", "-s", "fsdp",
                            "--json"],
    "memory-tp-70b.json": ["memory", "-t", "8xh100-nvswitch", "-w", "llama2-70b", "-s",
                           "tp+fsdp", "--tp", "8", "--json"],
    "memory-max-batch": ["memory", "-t", "8x4090-dual-socket", "-w", "llama3.2-1b", "-s",
                         "zero2", "--micro-batch", "max"],
    "run-ddp-7b-lora": ["run", "-t", "8x5090-switch", "-w", "llama2-7b-lora", "-s", "ddp"],
    "run-ddp-7b-lora.json": ["run", "-t", "8x5090-switch", "-w", "llama2-7b-lora", "-s", "ddp",
                             "--json"],
    "run-fsdp-7b.json": ["run", "-t", "8x5090-switch", "-w", "llama2-7b", "-s", "fsdp",
                         "--json"],
    "run-fsdp-7b-dual-socket": ["run", "-t", "8x5090-dual-socket", "-w", "llama2-7b", "-s",
                                "fsdp"],
    "run-tp-fsdp-h100.json": ["run", "-t", "8xh100-nvswitch", "-w", "llama2-13b", "-s",
                              "tp+fsdp", "--tp", "4", "--json"],
    "run-tp-ddp-sp-h200.json": ["run", "-t", "8xh200-nvswitch", "-w", "llama3-8b", "-s",
                                "tp+ddp", "--tp", "2", "--sequence-parallel", "--json"],
    "run-tp-a100": ["run", "-t", "8xa100-nvswitch", "-w", "mpt-7b", "-s", "tp"],
    "run-zero2-gpt2.json": ["run", "-t", "8x4090-dual-socket", "-w", "gpt2-medium", "-s",
                            "zero2", "--json"],
    "run-zero1-1b-accum.json": ["run", "-t", "8x5090-switch-p2p", "-w", "llama3.2-1b", "-s",
                                "zero1", "--grad-accum", "4", "--json"],
    "run-qlora-70b": ["run", "-t", "2x3090ti-nvlink", "-w", "llama2-70b-qlora", "-s", "fsdp"],
    "run-ddp-no-overlap-resnet.json": ["run", "-t", "4x5090", "-w", "resnet50", "-s", "ddp",
                                       "--no-overlap", "--json"],
    "run-ddp-bert-gpus4.json": ["run", "-t", "8xh100-nvswitch", "-w", "bert-large-squad", "-s",
                                "ddp", "--gpus", "4", "--json"],
    "run-mixed-box.json": ["run", "-t", "2x5090-2x4090", "-w", "llama3.2-1b", "-s", "ddp",
                           "--json"],
    "run-dgx1-ddp.json": ["run", "-t", _DGX1, "-w", "resnet50", "-s", "ddp", "--json"],
    "compare-machines": ["compare", "-t", "8x5090-switch", "-t", "8x5090-dual-socket", "-w",
                         "llama3.2-1b", "-s", "ddp"],
    "compare-gpus-per-machine": ["compare", "-t", "8x4090-dual-socket:4", "-t",
                                 "8xa100-nvswitch:1", "-w", "llama2-7b-lora"],
    "run-does-not-fit": ["run", "-t", "8x5090-switch", "-w", "llama2-7b", "-s", "fsdp",
                         "--checkpointing", "none"],
    "run-simulated-anyway": ["run", "-t", "4x5090", "-w", "llama2-13b", "-s", "fsdp",
                             "--simulate-anyway"],
    "compare-strategies.json": ["compare", "-t", "8x5090-switch", "-w", "llama2-7b", "-s",
                                "fsdp", "-s", "zero2", "-s", "zero3", "--json"],
    "sweep-buckets-gpus": ["sweep", *_SWEEP],
    "sweep-buckets-gpus.json": ["sweep", *_SWEEP, "--json"],
    "sweep-tp.json": ["sweep", "-t", "8xh100-nvswitch", "-w", "llama2-13b", "-s", "tp+fsdp",
                      "--tp", "1,2,4,8", "--json"],
    "presets": ["presets"],
}


def output_of(argv: list[str]) -> str:
    """What `stepsim ARGV` prints on stdout, run in this process (exit status 0 required)."""
    from simulator.cli import main

    out = io.StringIO()
    columns = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(COLUMNS)  # tables are as wide as the terminal: fix it
    try:
        with contextlib.redirect_stdout(out):
            code = main(argv)
    finally:
        if columns is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = columns
    if code != 0:
        raise RuntimeError(f"stepsim {' '.join(argv)} exited {code}")
    return out.getvalue().replace(str(ROOT), "<repo>")


def path_of(name: str) -> Path:
    return GOLDEN_DIR / (name if name.endswith(".json") else f"{name}.txt")


def differences(names: list[str] | None = None) -> dict[str, str]:
    """name -> what moved (the first difference, then a unified diff stored vs now) of every
    golden output that differs beyond round-off."""
    out = {}
    for name in names or list(COMMANDS):
        now = output_of(COMMANDS[name])
        path = path_of(name)
        stored = path.read_text(encoding="utf-8") if path.is_file() else ""
        moved = (json_difference if name.endswith(".json") else text_difference)(stored, now)
        if moved is not None:
            out[name] = moved + "\n" + "".join(difflib.unified_diff(
                stored.splitlines(keepends=True), now.splitlines(keepends=True),
                fromfile=f"{path.name} (stored)", tofile=f"{path.name} (this build)", n=1))
    return out


def close(stored: float, now: float, unit: float = 0.0) -> bool:
    """Equal within REL_TOL, or within ``unit`` (a printed figure's last digit)."""
    if math.isnan(stored) or math.isnan(now):
        return math.isnan(stored) and math.isnan(now)
    # (1 + 1e-6): the difference of two printed decimals is itself a binary float
    return (math.isclose(stored, now, rel_tol=REL_TOL, abs_tol=0.0)
            or abs(stored - now) <= unit * (1 + 1e-6))


def json_difference(stored: str, now: str) -> str | None:
    """Where two JSON documents differ beyond round-off (None: they do not)."""
    try:
        a, b = json.loads(stored), json.loads(now)
    except ValueError as exc:
        return f"not JSON: {exc}"
    return _json_difference(a, b, "$")


def _json_difference(a: object, b: object, where: str) -> str | None:
    moved = f"{where}: {a!r} became {b!r}"
    if type(a) is not type(b):
        return moved
    if isinstance(a, dict) and isinstance(b, dict):
        if list(a) != list(b):
            return f"{where}: keys {list(a)} became {list(b)}"
        found = (_json_difference(a[key], b[key], f"{where}.{key}") for key in a)
        return next((f for f in found if f), None)
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return f"{where}: {len(a)} items became {len(b)}"
        found = (_json_difference(x, y, f"{where}[{k}]")
                 for k, (x, y) in enumerate(zip(a, b, strict=True)))
        return next((f for f in found if f), None)
    if isinstance(a, int | float) and isinstance(b, int | float) and not isinstance(a, bool):
        return None if close(a, b) else moved
    return None if a == b else moved


# a printed figure: digits not inside a word (rtx5090, gpu0), with thousands separators, a
# fraction and an exponent; its sign and its unit are text
_NUMBER = re.compile(r"(?<![\w.])(\d{1,3}(?:,\d{3})+|\d+)(\.\d+)?(?:[eE]([-+]?\d+))?")


def _numbers_and_text(text: str) -> tuple[list[str], list[tuple[float, float]]]:
    """The text between numbers, and each number with its last printed digit's unit."""
    parts, numbers, at = [], [], 0
    for m in _NUMBER.finditer(text):
        decimals = len(m.group(2) or ".") - 1
        parts.append(text[at:m.start()])
        numbers.append((float(m.group(0).replace(",", "")),
                        10.0 ** (int(m.group(3) or 0) - decimals)))
        at = m.end()
    parts.append(text[at:])
    return parts, numbers


def text_difference(stored: str, now: str) -> str | None:
    """Where two texts differ beyond round-off (None: they do not), line by line."""
    a_lines, b_lines = stored.splitlines(keepends=True), now.splitlines(keepends=True)
    if len(a_lines) != len(b_lines):
        return f"{len(a_lines)} lines became {len(b_lines)}"
    for k, (a, b) in enumerate(zip(a_lines, b_lines, strict=True), start=1):
        a_text, a_numbers = _numbers_and_text(a)
        b_text, b_numbers = _numbers_and_text(b)
        if a_text != b_text or not all(
                close(x, y, max(ux, uy))
                for (x, ux), (y, uy) in zip(a_numbers, b_numbers, strict=True)):
            return f"line {k}: {a!r} became {b!r}"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--update", action="store_true",
                        help="rewrite the stored outputs (only for an intended change)")
    parser.add_argument("names", nargs="*", help="only these outputs (default: all)")
    args = parser.parse_args(argv)
    names = args.names or list(COMMANDS)
    unknown = [n for n in names if n not in COMMANDS]
    if unknown:
        parser.error(f"unknown golden output(s): {', '.join(unknown)}")
    if args.update:
        GOLDEN_DIR.mkdir(parents=True, exist_ok=True)
        for name in names:
            path_of(name).write_text(output_of(COMMANDS[name]), encoding="utf-8")
        print(f"wrote {len(names)} golden outputs to {GOLDEN_DIR.relative_to(ROOT)}/")
        return 0
    changed = differences(names)
    for diff in changed.values():
        sys.stdout.write(diff)
    print(f"{len(changed)} of {len(names)} golden outputs differ")
    return 1 if changed else 0


if __name__ == "__main__":
    sys.exit(main())
