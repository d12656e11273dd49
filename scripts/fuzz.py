"""Seeded mutations of the bundled topologies and workloads, and of the JSON configs users
bring (Hugging Face config.json, PEFT adapter_config.json, DeepSpeed ds_config.json: the
fixtures in tests/fixtures/), through the commands.

Each mutation changes one thing in a file (a value made hostile, a key removed or made up, a
list emptied or grown, the text cut, garbled, re-encoded or given YAML's stranger features),
writes it to a temporary file and runs `stepsim` on it. The contract: exit 0, or exit 2 with
one line on stderr naming the file; never a traceback, never more than 10 s of CPU time (nor
a minute of waiting).

    python scripts/fuzz.py --seed 11 --topologies 1000 --workloads 1000 --configs 600 [--jobs 2]

prints progress every ``--every`` cases (count, elapsed time, findings so far; a finding as
soon as it is found), then the outcome counts. ``--topologies 0`` (or ``--workloads 0``,
``--configs 0``) leaves that kind out: each kind's cases depend only on the seed, so two runs
make the same cases. The configs are split evenly over the three formats.
tests/test_fuzz.py runs a few hundred of the same mutations.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import json
import random
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's simulator, not an installed copy
# The contract is about work, not a shared machine's clock: a command that spins spends CPU,
# so 10 s of CPU time is a hang; one that blocks (a FIFO, a lock) spends none, so a wall
# clock six times longer catches that without tripping on a loaded machine.
TIMEOUT_S = 10
WALL_TIMEOUT_S = 60

HOSTILE: list[Any] = [0, -1, 1e9, 1e300, -1e-300, 5e-324, float("inf"), float("nan"), "x", "",
                      True, None, [], {}, 2**70, "1:30", "on", "y" * 5000, -0.0, [1, 2], "010"]
TEXT_HAZARDS = ["!foo ", "&a ", "*a", "<<: ", "? ", "\t", "\x00", "%YAML 1.1\n", "---\n",
                "{", "]", ": :", "'", '"']


FIXTURES = ROOT / "tests" / "fixtures"
CONFIGS = ("hf", "peft", "deepspeed")  # JSON files users bring: tests/fixtures/<kind>/


@dataclass(frozen=True)
class Case:
    kind: str  # topologies | workloads | hf | peft | deepspeed
    preset: str
    seed: int


def presets(kind: str) -> list[str]:
    if kind == "hf":  # one folder per model, holding its config.json
        return sorted(p.parent.name for p in (FIXTURES / "hf").glob("*/config.json"))
    if kind in CONFIGS:
        return sorted(p.stem for p in (FIXTURES / kind).glob("*.json"))
    return sorted(p.stem for p in (ROOT / kind).glob("*.yaml"))


def source(case: Case) -> Path:
    """The file a case mutates."""
    if case.kind == "hf":
        return FIXTURES / "hf" / case.preset / "config.json"
    if case.kind in CONFIGS:
        return FIXTURES / case.kind / f"{case.preset}.json"
    return ROOT / case.kind / f"{case.preset}.yaml"


def _leaves(data: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    if isinstance(data, dict):
        for k, v in data.items():
            yield path + (k,)
            yield from _leaves(v, path + (k,))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            yield path + (i,)
            yield from _leaves(v, path + (i,))


def _set(data: Any, path: tuple[Any, ...], value: Any) -> None:
    for part in path[:-1]:
        data = data[part]
    data[path[-1]] = value


def _get(data: Any, path: tuple[Any, ...]) -> Any:
    for part in path:
        data = data[part]
    return data


def mutate(text: str, rng: random.Random, fmt: str = "yaml") -> bytes:
    """One mutation of a file's text (``fmt``: yaml or json), as the bytes to write."""
    choice = rng.randrange(10)
    if choice >= 7:  # text-level: cut, garble, hazards, encodings
        if choice == 7:
            return text[: rng.randrange(len(text))].encode()
        if choice == 8:
            at = rng.randrange(len(text))
            return (text[:at] + rng.choice(TEXT_HAZARDS) + text[at:]).encode()
        data = bytearray(text.encode())
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        return bytes(data)
    data = json.loads(text) if fmt == "json" else yaml.safe_load(text)
    paths = list(_leaves(data))
    path = rng.choice(paths)
    if choice <= 3:  # a hostile value
        _set(data, path, copy.deepcopy(rng.choice(HOSTILE + [_get(data, rng.choice(paths))])))
    elif choice == 4:  # a key removed
        parent = _get(data, path[:-1])
        if isinstance(parent, dict):
            parent.pop(path[-1], None)
        elif isinstance(parent, list) and parent:
            parent.pop(path[-1])
    elif choice == 5:  # a key made up (misspelt)
        parent = _get(data, path[:-1])
        if isinstance(parent, dict):
            parent[f"{path[-1]}x"] = 1
    else:  # a list emptied or grown, a number scaled
        value = _get(data, path)
        if isinstance(value, list):
            _set(data, path, [] if rng.random() < 0.5 else value * rng.choice([2, 10, 100]))
        elif isinstance(value, int | float) and not isinstance(value, bool):
            _set(data, path, value * rng.choice([-1, 0.001, 7, 1000, 10**6]))
    if fmt == "json":  # NaN and Infinity as Python's json writes (and reads) them
        return json.dumps(data, indent=1, ensure_ascii=False).encode()
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True).encode()


def commands(case: Case, path: str, *, run: bool = True) -> list[list[str]]:
    """What each mutated file goes through: topologies through collective, topo and run;
    workloads and the JSON configs through memory and run (with a small partner so runs take a
    fraction of a s). ``run=False`` leaves the (slower) run out."""
    short = ["--seq-len", "256", "--no-ranges"]
    if case.kind in CONFIGS:
        job = {"hf": ["-w", f"hf:{path}"], "peft": ["-w", "llama3.2-1b", "--peft", path],
               "deepspeed": ["-w", "gpt2-medium", "--deepspeed", path]}[case.kind]
        return [["memory", "-t", "2x5090", *job]] + [["run", "-t", "2x5090", *job, *short]] * run
    if case.kind == "topologies":
        out = [["collective", "-t", path, "--op", "allreduce", "--bytes", "1M"],
               ["topo", "-t", path]]
        return out + [["run", "-t", path, "-w", "gpt2-medium", "--seq-len", "256",
                       "--no-ranges"]] * run
    return [["memory", "-t", "2x5090", "-w", path]] + [
        ["run", "-t", "2x5090", "-w", path, "--no-ranges"]] * run


class _Timeout(Exception):
    pass


def _alarm(_signum: int, _frame: Any) -> None:
    raise _Timeout


def check(case: Case, run: bool = True) -> list[str]:
    """The outcome of each command on the case's mutation: ``ok CMD``, ``error CMD`` (one
    good line), or a failure (traceback, hang, a message not naming the file, more than one
    line, too slow): see ``is_finding``."""
    from simulator.cli import main

    rng = random.Random(case.seed)
    original = source(case)
    data = mutate(original.read_text(), rng, "json" if case.kind in CONFIGS else "yaml")
    outcomes = []
    with tempfile.TemporaryDirectory() as folder:
        name = (f"{case.preset}-m{case.seed}{original.suffix}" if case.kind != "hf"
                else f"{case.preset}-m{case.seed}/config.json")  # hf: a model folder's file
        path = str(Path(folder) / name)
        Path(path).parent.mkdir(exist_ok=True)
        Path(path).write_bytes(data)
        for argv in commands(case, path, run=run):
            out, err = io.StringIO(), io.StringIO()
            signal.signal(signal.SIGPROF, _alarm)
            signal.signal(signal.SIGALRM, _alarm)
            signal.setitimer(signal.ITIMER_PROF, TIMEOUT_S)  # this process's CPU time
            signal.alarm(WALL_TIMEOUT_S)
            started = time.process_time()
            try:
                with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                    code = main(argv)
            except _Timeout:
                outcomes.append(f"HANG {argv[0]} {case}")
                continue
            except BaseException as exc:  # noqa: BLE001 - any escape is the finding
                outcomes.append(f"TRACEBACK {argv[0]} {case}: {type(exc).__name__}: {exc}")
                continue
            finally:
                signal.setitimer(signal.ITIMER_PROF, 0)
                signal.alarm(0)
            took = time.process_time() - started
            lines = err.getvalue().splitlines()
            if code == 0:
                outcomes.append(f"ok {argv[0]}")
            elif code == 2 and len(lines) == 1 and path in lines[0]:
                outcomes.append(f"error {argv[0]}")
            else:
                outcomes.append(f"BAD {argv[0]} {case} exit {code}: {err.getvalue()[:300]!r}")
            if took > TIMEOUT_S:
                outcomes.append(f"SLOW {argv[0]} {case}: {took:.1f} s of CPU")
    return outcomes


def is_finding(outcome: str) -> bool:
    return outcome.split()[0] not in ("ok", "error")


def cases(kind: str, count: int, seed: int) -> list[Case]:
    rng = random.Random(seed)
    names = presets(kind)
    return [Case(kind, rng.choice(names), rng.randrange(2**31)) for _ in range(count)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--topologies", type=int, default=1000)
    parser.add_argument("--workloads", type=int, default=1000)
    parser.add_argument("--configs", type=int, default=600,
                        help="JSON configs, split over hf, peft and deepspeed")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--every", type=int, default=50, help="progress every N cases")
    args = parser.parse_args(argv)
    todo = cases("topologies", args.topologies, args.seed) + cases(
        "workloads", args.workloads, args.seed + 1)
    for i, kind in enumerate(CONFIGS):  # an even split, the remainder to the first formats
        todo += cases(kind, args.configs // 3 + (i < args.configs % 3), args.seed + 2 + i)
    counts: Counter[str] = Counter()
    findings: list[str] = []
    started = time.perf_counter()
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        results = pool.map(check, todo, chunksize=4)
        for done, (case, outcomes) in enumerate(zip(todo, results, strict=True), 1):
            for outcome in outcomes:
                counts[f"{case.kind} {' '.join(outcome.split()[:2])}"] += 1
                if is_finding(outcome):
                    findings.append(outcome)
                    print(outcome, flush=True)
            if done % args.every == 0 or done == len(todo):
                print(f"  {done}/{len(todo)} cases, {time.perf_counter() - started:.0f} s, "
                      f"{len(findings)} findings", flush=True)
    print(f"seed {args.seed}: {args.topologies} topology, {args.workloads} workload and "
          f"{args.configs} config mutations in {time.perf_counter() - started:.0f} s")
    for key in sorted(counts):
        print(f"  {key:<32} {counts[key]}")
    print(f"{len(findings)} findings" + "".join(f"\n{f}" for f in findings))
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
