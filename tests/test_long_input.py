"""Input far too long to echo: an error line quotes its first 80 characters and counts the
rest, whatever quoted it (a key, a value, a preset name, a size, a cell of a log, argparse),
and no error line runs past the cap. One line, exit status 2, never a traceback."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from simulator.cli import main
from simulator.errors import LINE_CHARS, InputError, cut, quoted
from simulator.inputs import nccl_tests_log

ROOT = Path(__file__).resolve().parent.parent
BIG = "k" * 100_000
MORE = "... (99,920 more characters)"  # what is left of BIG after its first 80
TOPOLOGY = (ROOT / "topologies" / "2x5090.yaml").read_text()
LLAMA = {"model_type": "llama", "hidden_size": 512, "intermediate_size": 1024,
         "num_hidden_layers": 2, "num_attention_heads": 8, "vocab_size": 1000}


def _after_prefix(line: str) -> str:
    """An error line without `stepsim CMD: error: ` and its `file:line: ` (a warning has only
    the latter)."""
    line = line.split(": error: ", 1)[-1]
    where = re.match(r"[^:]+:\d+: ", line)
    return line[where.end():] if where else line


def _one_line(argv: list[str], *, status: int = 2) -> str:
    """The one line `stepsim ARGV` writes on stderr, as the program (a traceback would show)."""
    done = subprocess.run([sys.executable, "-m", "simulator", *argv], capture_output=True,
                          text=True, cwd=ROOT, timeout=120)
    lines = done.stderr.splitlines()
    assert done.returncode == status and len(lines) == 1, done.stderr[:500]
    assert "Traceback" not in done.stderr and len(_after_prefix(lines[0])) <= LINE_CHARS
    return lines[0]


def test_a_long_value_is_cut_to_80_characters_and_the_rest_counted() -> None:
    assert cut(BIG) == "k" * 80 + MORE
    assert quoted(BIG) == repr("k" * 80) + MORE
    assert cut("short") == "short" and quoted("short") == "'short'"
    assert quoted(list(range(100_000))).endswith("more characters)")
    assert cut("k" * 81) == "k" * 80 + "... (1 more characters)"  # the count, not a guess


def test_an_error_line_never_passes_the_cap() -> None:
    exc = InputError("x " * 100_000, file=BIG, line=3, key=BIG)
    assert str(exc).count("\n") == 0 and exc.key == cut(BIG)
    assert len(f"{exc.key}: {exc.message}") <= LINE_CHARS
    assert exc.message.endswith(f"... ({200_000 - (LINE_CHARS - len(exc.key) - 2 - 40):,} "
                                "more characters)")
    assert len(str(exc)) < 1000  # a file name is cut too (at more than any real path)


def test_an_unknown_100_kb_key_in_a_topology(tmp_path: Path) -> None:
    path = tmp_path / "box.yaml"
    path.write_text(f"? {BIG}\n: 1\n" + TOPOLOGY)  # an explicit key: YAML's plain keys stop at 1K
    line = _one_line(["run", "-t", str(path), "-w", "gpt2-medium"])
    assert line == f"stepsim run: error: {path}:2: {'k' * 80}{MORE}: unknown key (misspelt?)"


def test_a_100_kb_key_in_a_hugging_face_config(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**LLAMA, BIG: 1}))  # unknown: one warning, and the run goes on
    line = _one_line(["memory", "-t", "2x5090", "-w", f"hf:{path}"], status=0)
    assert line == f"{path}:1: {'k' * 80}{MORE}: warning: unknown key, ignored"
    text = json.dumps(LLAMA)[:-1] + f',\n "{BIG}": 1,\n "{BIG}": 2}}'  # given twice: an error
    path.write_text(text)
    line = _one_line(["memory", "-t", "2x5090", "-w", f"hf:{path}"])
    assert line.endswith(f"{'k' * 80}{MORE}: the key is given twice")
    path.write_text(json.dumps({**LLAMA, "model_type": BIG}))  # a bad value
    assert f"model_type: {quoted(BIG)} is not one stepsim lays out" in \
        _one_line(["memory", "-t", "2x5090", "-w", f"hf:{path}"])


def test_a_100_kb_preset_name() -> None:
    line = _one_line(["run", "-t", BIG, "-w", "gpt2-medium"])
    assert line.startswith(f"stepsim run: error: unknown topology {quoted(BIG)}; presets: 1x")
    line = _one_line(["run", "-t", "2x5090", "-w", BIG])
    assert line.startswith(f"stepsim run: error: unknown workload {quoted(BIG)}; presets: ")


def test_a_100_kb_size() -> None:
    line = _one_line(["collective", "-t", "2x5090", "--op", "allreduce", "-b", BIG])
    assert line == f"stepsim collective: error: expected a size like 8, 64K, 25M or 8G, " \
                   f"got {quoted(BIG)}"
    digits = "1" + "0" * 99_999  # a size, but more than a float holds
    line = _one_line(["collective", "-t", "2x5090", "--op", "allreduce", "-b", digits])
    assert line == f"stepsim collective: error: {quoted(digits)} is too large a size"


@pytest.mark.parametrize("argv, words", [
    (["schema", BIG], "kind: invalid choice: "),  # argparse's own message
    ([BIG], "COMMAND: invalid choice: "),
    (["run", "-t", "2x5090", "-w", "gpt2-medium", "--kernels", BIG], "--kernels: expected one"),
    (["run", "-t", "2x5090", "-w", "gpt2-medium", "--micro-batch", BIG], "expected a whole"),
    (["run", "-t", "2x5090", "-w", "gpt2-medium", "--bucket-mb", BIG], "expected a number"),
    (["collective", "-t", "2x5090", "--op", BIG], "--op: unknown collective "),
])
def test_every_flag_quotes_a_long_value_cut(argv: list[str], words: str,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    line = capsys.readouterr().err
    assert line.count("\n") == 1 and words in line and quoted(BIG) in line
    assert len(_after_prefix(line.rstrip("\n"))) <= LINE_CHARS


def test_an_unknown_long_flag_is_cut(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "-t", "2x5090", "-w", "gpt2-medium", f"--{BIG}"]) == 2
    assert f"unrecognized argument: --{'k' * 78}... (99,922 more characters)" in \
        capsys.readouterr().err


def test_the_json_error_holds_the_cut_text(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "box.yaml"
    path.write_text(f"? {BIG}\n: 1\n" + TOPOLOGY)
    assert main(["run", "-t", str(path), "-w", "gpt2-medium", "--json"]) == 2
    error = json.loads(capsys.readouterr().out)["error"]
    assert error == {"file": str(path), "line": 2, "key": "k" * 80 + MORE,
                     "message": "unknown key (misspelt?)"}


def test_a_long_cell_of_an_nccl_tests_log() -> None:
    """A row with a long cell is left out, and the one warning line names it cut."""
    text = (ROOT / "tests" / "fixtures" / "real-inputs" / "B4.nccl-tests.log").read_text()
    log = nccl_tests_log.parse(text.replace("280.1", BIG, 1), "b4.log")
    warning = log.warning()
    assert warning is not None and f"line 26: {quoted(BIG)} is not a number" in warning
    assert len(warning) < 300


def test_a_long_output_path_is_cut(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "-t", "2x5090", "-w", "gpt2-medium", "--trace", BIG + ".json"]) == 2
    line = capsys.readouterr().err
    assert line.startswith(f"stepsim run: error: cannot write {cut(BIG + '.json', 300)}: ")
    assert line.count("\n") == 1 and len(line) < 450
