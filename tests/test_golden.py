"""Golden outputs: a fixed set of commands prints what tests/golden/ holds, to round-off.

The commands, the comparison and the regeneration live in scripts/golden.py. A difference
here means a figure or a word of some output moved beyond float round-off. If that is the
point of the change (new physics, a corrected constant, a new report key), regenerate with
``python scripts/golden.py --update`` in the same commit and say why in its message. If the
change was meant to keep outputs as they were (speed, refactoring), the difference is a bug:
do not regenerate.
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
def test_output_is_the_stored_one_to_round_off(name: str) -> None:
    diff = golden.differences([name]).get(name)
    assert diff is None, (
        f"`stepsim {' '.join(golden.COMMANDS[name])}` no longer prints "
        f"tests/golden/{golden.path_of(name).name}:\n{diff}\n"
        "Intended change of figures? `python scripts/golden.py --update` in the same commit.")


def test_every_stored_output_belongs_to_a_command() -> None:
    stored = {p.name for p in golden.GOLDEN_DIR.iterdir()}
    assert stored == {golden.path_of(name).name for name in golden.COMMANDS}


STORED = ('{"step_time_s": 1.25, "fits": true, "gpus": 8, "link": "mem:cpu0", '
          '"buckets": [{"bytes": 26214400, "start_s": 0.1}]}')


@pytest.mark.parametrize("now", [
    STORED,
    STORED.replace("1.25", "1.2500000000001"),  # round-off
    STORED.replace("0.1}", "0.10000000000000002}"),
])
def test_json_numbers_may_move_by_round_off(now: str) -> None:
    assert golden.json_difference(STORED, now) is None


@pytest.mark.parametrize("now", [
    STORED.replace("1.25", "1.2500001"),  # a relative 1e-7
    STORED.replace("mem:cpu0", "mem:cpu1"),  # a string
    STORED.replace("true", "false"),
    STORED.replace('"gpus": 8', '"gpus": 8.0'),  # a type
    STORED.replace('"gpus": 8', '"gpus": 9'),
    STORED.replace('"fits": true, "gpus": 8', '"gpus": 8, "fits": true'),  # key order
    STORED.replace("0.1}", "0.1}, {}"),  # an item more
    STORED.replace(', "link": "mem:cpu0"', ""),  # a key less
])
def test_json_structure_strings_and_figures_beyond_round_off_differ(now: str) -> None:
    assert golden.json_difference(STORED, now) is not None


TEXT = ("llama2-7b on 8x5090-switch (8 x rtx5090), fsdp\n"
        "step time              1.91 s (1.52-7.6)\n"
        "tokens/s               17,200 (4,310-21,500)\n"
        "MFU                    47.2% and 1.5e-07 and 42.1k\n")


@pytest.mark.parametrize("now", [
    TEXT,
    TEXT.replace("1.91 s", "1.92 s"),  # a rounded figure's last digit flipped
    TEXT.replace("-7.6)", "-7.5)"),
    TEXT.replace("17,200", "17,201"),
    TEXT.replace("1.5e-07", "1.6e-07"),
])
def test_text_figures_may_flip_their_last_digit(now: str) -> None:
    assert golden.text_difference(TEXT, now) is None


@pytest.mark.parametrize("now", [
    TEXT.replace("1.91 s", "1.93 s"),  # two units of the last digit
    TEXT.replace("47.2%", "47.4%"),
    TEXT.replace("17,200", "17,300"),
    TEXT.replace("1.5e-07", "1.5e-06"),
    TEXT.replace("42.1k", "42.1M"),  # a unit
    TEXT.replace("fsdp", "ddp"),  # a word
    TEXT.replace("rtx5090", "rtx5091"),  # digits inside a word are text
    TEXT.replace("(1.52-7.6)", "(1.52 - 7.6)"),  # spacing
    TEXT + "one line more\n",
    TEXT.rstrip("\n"),
])
def test_text_words_and_figures_beyond_their_last_digit_differ(now: str) -> None:
    assert golden.text_difference(TEXT, now) is not None
