"""A seeded fuzz of the inputs: mutated presets and JSON configs end in exit 0 or one line
naming the file.

The mutations are scripts/fuzz.py's (the acceptance run makes 2,000 of them); here a few
hundred, through the same commands (`run` on every sixth), so the suite stays fast.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parent.parent / "scripts" / "fuzz.py"
_SPEC = importlib.util.spec_from_file_location("stepsim_fuzz", _PATH)
assert _SPEC is not None and _SPEC.loader is not None
fuzz = importlib.util.module_from_spec(_SPEC)
sys.modules["stepsim_fuzz"] = fuzz  # dataclasses look their module up while building
_SPEC.loader.exec_module(fuzz)

SEED = 20261201


@pytest.mark.parametrize(("kind", "count"), [("topologies", 150), ("workloads", 150),
                                           ("hf", 60), ("peft", 60), ("deepspeed", 60)])
def test_mutated_inputs_end_cleanly(kind: str, count: int) -> None:
    findings = []
    for i, case in enumerate(fuzz.cases(kind, count, SEED)):  # `run` on every sixth: speed
        findings += [o for o in fuzz.check(case, run=i % 6 == 0) if fuzz.is_finding(o)]
    assert not findings, findings[:5]


def test_the_fuzz_reports_what_breaks_the_contract(monkeypatch: pytest.MonkeyPatch) -> None:
    import simulator.cli

    case = fuzz.cases("workloads", 1, SEED)[0]

    def raising(argv: list[str]) -> int:
        raise ZeroDivisionError

    def chatty(argv: list[str]) -> int:
        print("two\nlines", file=sys.stderr)
        return 2

    monkeypatch.setattr(simulator.cli, "main", raising)
    assert all(o.startswith("TRACEBACK") for o in fuzz.check(case, run=False))
    monkeypatch.setattr(simulator.cli, "main", chatty)
    assert all(o.startswith("BAD") for o in fuzz.check(case, run=False))


def test_a_command_that_spins_is_a_hang_by_its_cpu_time(monkeypatch: pytest.MonkeyPatch) -> None:
    import simulator.cli

    def spinning(argv: list[str]) -> int:
        while True:
            pass

    monkeypatch.setattr(fuzz, "TIMEOUT_S", 0.2)  # seconds of CPU time
    monkeypatch.setattr(simulator.cli, "main", spinning)
    outcomes = fuzz.check(fuzz.cases("workloads", 1, SEED)[0], run=False)
    assert outcomes and all(o.startswith("HANG") for o in outcomes)
