"""Golden outputs: a fixed set of commands prints exactly what tests/golden/ holds.

The commands and the regeneration live in scripts/golden.py. A difference here means a
figure or a word of some output moved. If that is the point of the change (new physics, a
corrected constant, a new report key), regenerate with ``python scripts/golden.py --update``
in the same commit and say why in its message. If the change was meant to keep outputs as
they were (speed, refactoring), the difference is a bug: do not regenerate.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location(
    "golden", Path(__file__).resolve().parent.parent / "scripts" / "golden.py")
assert _spec is not None and _spec.loader is not None
golden = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(golden)


@pytest.mark.parametrize("name", list(golden.COMMANDS))
def test_output_is_byte_identical_to_the_stored_one(name: str) -> None:
    diff = golden.differences([name]).get(name)
    assert diff is None, (
        f"`stepsim {' '.join(golden.COMMANDS[name])}` no longer prints "
        f"tests/golden/{golden.path_of(name).name}:\n{diff}\n"
        "Intended change of figures? `python scripts/golden.py --update` in the same commit.")


def test_every_stored_output_belongs_to_a_command() -> None:
    stored = {p.name for p in golden.GOLDEN_DIR.iterdir()}
    assert stored == {golden.path_of(name).name for name in golden.COMMANDS}
