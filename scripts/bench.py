"""Speed of stepsim as a user meets it: whole processes, start-up and exit included.

Two tables. The cases: the commands design.md and the README quote, each run ``--repeat``
times (median, fastest and slowest shown) against its target. The scaling table: how a run's
time grows with GPUs (generated NVSwitch boxes and PCIe switch trees, scripts/boxes.py, 8 to
1,024 GPUs, FSDP of a 7B model), with layers (8 to 256: a micro-step is bounded at 5,000 ops,
about 300 layers) and with DDP buckets (55 to about 2,100: every gradient tensor of a 300-layer
model in its own bucket), each with the exponent k of the fitted growth time ~ n^k over its
larger half (where the simulation, not start-up, is most of the time).

    python scripts/bench.py                 # both tables (a few minutes on 2 cores)
    python scripts/bench.py --cases         # the cases only
    python scripts/bench.py --scaling       # the scaling table only
    python scripts/bench.py --repeat 5      # runs per point (default 5 for cases, 3 scaling)
    python scripts/bench.py --baseline DIR  # each case also run from another checkout, the
                                            # two alternating (the same machine, same load)
    python scripts/bench.py --markdown      # write both tables to docs/speed.md

The package is byte-compiled first, as pip compiles an installed wheel. Not a timed test: the
figures depend on the machine and on what else runs on it; the targets are design.md's (an
8-GPU 7B answer under 0.5 s, 1,024 GPUs under 10 s, `advise` on one 8-GPU box under 30 s).
"""

from __future__ import annotations

import argparse
import compileall
import contextlib
import datetime
import importlib.util
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("boxes", ROOT / "scripts" / "boxes.py")
assert _spec is not None and _spec.loader is not None
boxes = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(boxes)

COLLECTIVE = ["collective", "-t", "8x5090-dual-socket", "--op", "allreduce", "-b", "8", "-e",
              "8G", "-f", "2", "--json"]
SWEEP = ["sweep", "-t", "8x5090-dual-socket", "-w", "gpt2-medium", "--bucket-mb",
         "1,5,25,100,400", "--gpus", "1,2,4,8"]
GPU_COUNTS = (8, 16, 32, 64, 128, 256, 512, 1024)
LAYERS = (8, 16, 32, 64, 128, 256)
BUCKET_MB = (64.0, 16.0, 4.0, 1.0, 0.05)  # on a 300-layer model: about 55 to 2,100 buckets


def program() -> list[str]:
    """The installed `stepsim` beside this interpreter, else `python -m simulator`."""
    script = Path(sys.executable).with_name("stepsim")
    return [str(script)] if script.exists() else [sys.executable, "-m", "simulator"]


# not stepsim: the interpreter alone (its start-up, with whatever the site's .pth files load),
# and the interpreter importing the library every simulation needs: the floors under any run
INTERPRETER = [sys.executable, "-c", "pass"]
FOUNDATIONS = [sys.executable, "-c", "import simpy"]


def wall_times(argv: list[str], repeat: int, checkout: Path | None = None
               ) -> tuple[list[float], list[float], str]:
    """Wall seconds and CPU seconds (user + system, the process and its workers) of
    ``repeat`` whole `stepsim ARGV` processes (each must exit 0), and what the last printed;
    with ``checkout``, that checkout's `python -m simulator` instead of this one's. ``argv``
    that is a floor (INTERPRETER, FOUNDATIONS) runs as it is. On a busy machine the wall time
    waits for other work; the CPU time hardly does."""
    env = {**os.environ, "OPENBLAS_NUM_THREADS": os.environ.get("OPENBLAS_NUM_THREADS", "1")}
    if argv in (INTERPRETER, FOUNDATIONS):
        command = argv
    elif checkout is not None:
        command = [sys.executable, "-m", "simulator", *argv]
        env["PYTHONPATH"] = str(checkout)  # ahead of this checkout's editable install
    else:
        command = [*program(), *argv]
    walls, cpus, printed = [], [], ""
    for _ in range(repeat):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True,
                              cwd=checkout or ROOT, env=env)  # `-m` imports from the cwd first
        walls.append(time.perf_counter() - t0)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(command)} exited {done.returncode}: "
                             f"{done.stderr.strip()}")
        printed = done.stdout
    return walls, cpus, printed


def tiny_llama(layers: int) -> str:
    """A Llama-shaped workload small enough that layers, not FLOPs, set its cost."""
    return (f"name: tiny-llama-{layers}\n"
            "description: A 512-wide Llama-shaped model for benchmarks.\n"
            f"model: {{family: llama, layers: {layers}, hidden: 512, heads: 8, kv_heads: 8, "
            "ffn_hidden: 1376, vocab: 32000, tie_embeddings: false}\n"
            "training: {seq_len: 1024, micro_batch: 1, grad_accum: 1, finetune: full}\n")


def write(folder: Path, name: str, text: str) -> str:
    path = folder / name
    path.write_text(text, encoding="utf-8")
    return str(path)


def cases(folder: Path) -> list[tuple[str, list[str], float | None]]:
    """(label, argv, target seconds or None) of every case, from the issue's acceptance list."""
    nvs256 = write(folder, "nvswitch256.yaml", boxes.nvswitch(256))
    nvs1024 = write(folder, "nvswitch1024.yaml", boxes.nvswitch(1024))
    tree1024 = write(folder, "tree1024.yaml", boxes.pcie_tree(1024))
    tree64 = write(folder, "tree64.yaml", boxes.pcie_tree(64))
    # the llama2-7b runs as they were measured before the preset checkpointed fully: without
    # checkpointing, simulated though the DDP and 1,024-GPU ones do not fit
    as_before = ["--checkpointing", "none", "--simulate-anyway"]
    return [
        ("stepsim --version", ["--version"], None),
        ("stepsim presets", ["presets"], None),
        ("collective 8 B..8 GiB, 31 sizes (8x5090-dual-socket)", COLLECTIVE, None),
        ("floor: python alone (no stepsim)", INTERPRETER, None),
        ("floor: python importing simpy (no stepsim)", FOUNDATIONS, None),
        ("run llama2-7b fsdp --json (8x5090-switch)",
         ["run", "-t", "8x5090-switch", "-w", "llama2-7b", "-s", "fsdp", "--json",
          *as_before], 0.5),
        ("run as above, --no-ranges (the step alone: one simulation, not five)",
         ["run", "-t", "8x5090-switch", "-w", "llama2-7b", "-s", "fsdp", "--no-ranges",
          "--json", *as_before], None),
        ("run llama2-7b ddp --bucket-mb 25 --json (8x5090-switch)",
         ["run", "-t", "8x5090-switch", "-w", "llama2-7b", "-s", "ddp", "--bucket-mb", "25",
          "--json", *as_before], None),
        ("run llama2-7b ddp, 8 pipeline stages x 8 replicas, 1F1B x 16 (64-GPU PCIe tree)",
         ["run", "-t", tree64, "-w", "llama2-7b", "-s", "ddp", "--pp", "8", "--grad-accum",
          "16", "--checkpointing", "full", "--no-ranges", "--json"], None),
        ("sweep gpt2-medium, 5 buckets x 4 GPU counts", SWEEP, None),
        ("sweep as above, --no-ranges", [*SWEEP, "--no-ranges"], None),
        ("run llama2-7b fsdp, 256-GPU NVSwitch box",
         ["run", "-t", nvs256, "-w", "llama2-7b", "-s", "fsdp", "--json", *as_before], None),
        ("run llama2-7b fsdp, 1,024-GPU NVSwitch box",
         ["run", "-t", nvs1024, "-w", "llama2-7b", "-s", "fsdp", "--json", *as_before], 10.0),
        ("run llama2-7b tp+fsdp --tp 8, 1,024-GPU NVSwitch box",
         ["run", "-t", nvs1024, "-w", "llama2-7b", "-s", "tp+fsdp", "--tp", "8", "--json",
          *as_before],
         10.0),
        ("run llama2-7b fsdp, 1,024-GPU PCIe switch tree",
         ["run", "-t", tree1024, "-w", "llama2-7b", "-s", "fsdp", "--json", *as_before], 10.0),
        ("advise llama2-7b (8x5090-dual-socket)",
         ["advise", "-t", "8x5090-dual-socket", "-w", "llama2-7b", "--json"], 30.0),
        # a mixture of experts: 128 experts x 48 layers of parameter tensors, EP degrees too
        ("advise qwen3-30b-a3b-lora (8x5090-dual-socket)",
         ["advise", "-t", "8x5090-dual-socket", "-w", "qwen3-30b-a3b-lora", "--json"], 30.0),
    ]


def older(argv: list[str], checkout: Path) -> list[str]:
    """A case as ``checkout`` runs it: one from before --simulate-anyway simulated a run that
    does not fit without being asked, and refuses the flag; a later one needs it as we do."""
    if "--simulate-anyway" in (checkout / "simulator" / "commands" / "run.py").read_text():
        return argv
    return [a for a in argv if a != "--simulate-anyway"]


def case_rows(folder: Path, repeat: int, baseline: Path | None) -> list[list[str]]:
    """One row of figures per case: median (min-max) wall and median CPU seconds, the
    baseline's median wall where asked (the two alternating, run by run), the target."""
    rows = []
    for label, argv, target in cases(folder):
        ours: tuple[list[float], list[float]] = ([], [])
        theirs: list[float] = []
        for _ in range(repeat):
            # with a baseline both run as `python -m simulator`, alike but for the checkout
            walls, cpus, _ = wall_times(argv, 1, ROOT if baseline is not None else None)
            ours[0].extend(walls)
            ours[1].extend(cpus)
            if baseline is not None and argv not in (INTERPRETER, FOUNDATIONS):
                # a case the older checkout cannot run (a later preset) has no baseline
                with contextlib.suppress(SystemExit):
                    theirs.extend(wall_times(older(argv, baseline), 1, baseline)[0])
        times, cpus = ours
        median = statistics.median(times)
        mark = "" if target is None else f"< {target:g}" + ("" if median < target else " (!)")
        row = [label, f"{median:.3f} ({min(times):.3f}-{max(times):.3f})",
               f"{statistics.median(cpus):.3f}"]
        if baseline is not None:
            row.append(f"{statistics.median(theirs):.3f}" if theirs else "")
        rows.append([*row, mark])
        print(" | ".join(row + [mark]), flush=True)
    return rows


def growth(points: list[tuple[float, float]]) -> float:
    """k of time ~ n^k, least squares in log-log over the larger half of the points."""
    upper = points[len(points) // 2:] if len(points) > 3 else points
    xs = [math.log(n) for n, _ in upper]
    ys = [math.log(t) for _, t in upper]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / \
        sum((x - mx) ** 2 for x in xs)


def scaling_rows(folder: Path) -> list[tuple[str, str, list[tuple[int | None, list[str]]]]]:
    """(what grows, unit, [(n, argv)]) of each scaling series (n None: the run's bucket count)."""
    Series = list[tuple[int | None, list[str]]]
    rows: list[tuple[str, str, Series]] = []
    for family, make in (("NVSwitch box", boxes.nvswitch), ("PCIe switch tree", boxes.pcie_tree)):
        series: Series = []
        for n in GPU_COUNTS:
            box = write(folder, f"{make.__name__}{n}.yaml", make(n))
            series.append((n, ["run", "-t", box, "-w", "llama2-7b", "-s", "fsdp", "--json"]))
        rows.append((f"GPUs, {family}, llama2-7b fsdp", "GPUs", series))
    layers: Series = [(n, ["run", "-t", "8x5090-switch", "-w",
                           write(folder, f"tiny{n}.yaml", tiny_llama(n)), "-s", "ddp", "--json"])
                      for n in LAYERS]
    rows.append(("layers, 512-wide Llama, ddp on 8x5090-switch", "layers", layers))
    deep = write(folder, "tiny300.yaml", tiny_llama(300))
    buckets: Series = [
        (None, ["run", "-t", "8x5090-switch", "-w", deep, "-s", "ddp", "--bucket-mb", f"{mb:g}",
                "--json"]) for mb in BUCKET_MB]
    rows.append(("DDP buckets, 300-layer 512-wide Llama on 8x5090-switch", "buckets", buckets))
    return rows


def growth_rows(folder: Path, repeat: int) -> list[list[str]]:
    """(what grows, its points, k) of each scaling series, as printed."""
    rows = []
    for title, unit, series in scaling_rows(folder):
        points = []
        for n, argv in series:
            times, _, printed = wall_times(argv, repeat)
            count = n if n is not None else len(json.loads(printed)["buckets"])
            points.append((float(count), statistics.median(times)))
        cells = ", ".join(f"{int(n):,}: {t:.2f} s" for n, t in points)
        rows.append([title, f"{unit} {cells}", f"{growth(points):.2f}"])
        print(" | ".join(rows[-1]), flush=True)
    return rows


SPEED = ROOT / "docs" / "speed.md"


def _commit(checkout: Path) -> str:
    """A checkout's commit as docs/speed.md names it (its folder where git cannot say)."""
    done = subprocess.run(["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True)
    return f"commit {done.stdout.strip()}" if done.returncode == 0 else str(checkout)


def markdown(case_table: list[list[str]], growth_table: list[list[str]], repeat: tuple[int, int],
             baseline: str | None) -> str:
    """docs/speed.md: where and how it was measured, the cases, how a run grows."""
    head = ["case", "wall median (min-max), s", "CPU, s"]
    if baseline is not None:
        head.append(f"wall median, s: {baseline}")
    head.append("target")
    lines = ["# Speed", "",
             f"Written by `python scripts/bench.py --markdown` on {datetime.date.today()}: "
             f"{os.cpu_count()} cores, Python {sys.version.split()[0]}; whole `stepsim` "
             "processes (start-up and exit included), the package byte-compiled first, presets "
             f"read back from the cache folder; {repeat[0]} runs a case"
             + (f", each alternating with the same case run from {baseline}" if baseline
                else "")
             + ". Repeated runs on a shared machine vary by 10-30%; the targets are design.md's.",
             "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(row) + " |" for row in case_table]
    lines += ["", f"How a run grows (wall medians of {repeat[1]}; k fits time ~ n^k over the "
              "larger half):", "", "| what grows | points | k |", "|---|---|---|"]
    lines += ["| " + " | ".join(row) + " |" for row in growth_table]
    return "\n".join(lines) + "\n"


def byte_compile() -> None:
    """Compile the package's modules as pip does when it installs the wheel, so that an
    editable checkout (or PYTHONDONTWRITEBYTECODE) is timed as an installed package runs."""
    spec = importlib.util.find_spec("simulator")
    assert spec is not None and spec.submodule_search_locations
    for folder in spec.submodule_search_locations:
        compileall.compile_dir(folder, quiet=1)
        print(f"byte-compiled {folder}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", action="store_true", help="only the cases table")
    parser.add_argument("--scaling", action="store_true", help="only the scaling table")
    parser.add_argument("--repeat", type=int, default=None,
                        help="runs per point (default 5 for cases, 3 for scaling)")
    parser.add_argument("--baseline", type=Path, metavar="DIR",
                        help="also run each case from this checkout, alternating")
    parser.add_argument("--markdown", action="store_true",
                        help=f"write the tables to docs/{SPEED.name}")
    args = parser.parse_args(argv)
    both = not (args.cases or args.scaling)
    byte_compile()
    repeat = (args.repeat or 5, args.repeat or 3)
    case_table: list[list[str]] = []
    growth_table: list[list[str]] = []
    with tempfile.TemporaryDirectory(prefix="stepsim-bench-") as tmp:
        folder = Path(tmp)
        if args.cases or both:
            case_table = case_rows(folder, repeat[0], args.baseline)
        if args.scaling or both:
            growth_table = growth_rows(folder, repeat[1])
    if args.markdown:
        label = None if args.baseline is None else _commit(args.baseline)
        SPEED.write_text(markdown(case_table, growth_table, repeat, label), encoding="utf-8")
        print(f"wrote {SPEED.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
