"""Text that reads well: tables as wide as the terminal, plain when piped; quiet progress."""

from __future__ import annotations

import io
import re
import time

import pytest

from simulator.cli import main
from simulator.commands import terminal

THREE = ["compare", "-t", "8x5090-switch", "-t", "8x5090-dual-socket", "-t", "8xh100-nvswitch",
         "-w", "llama2-7b-lora"]


def _figures(text: str) -> list[str]:
    """The words of the figure rows of a compare table (ranges, prices, verdicts)."""
    rows = [line for line in text.splitlines()
            if line.lstrip("│┃ ").startswith(("step time", "tokens/s", "price", "MFU"))]
    return [w for line in rows for w in line.split() if any(c.isdigit() for c in w)]


def test_piped_tables_never_wrap(monkeypatch: pytest.MonkeyPatch,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    """Piped, a row is one line however narrow COLUMNS says the terminal is: every machine's
    figure on the same line, whole."""
    monkeypatch.setenv("COLUMNS", "60")
    assert main([*THREE, "--no-ranges"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert all(line == line.rstrip() for line in lines)  # no padding to a width
    step = next(line for line in lines if line.startswith("step time"))
    assert step.count(" s") + step.count(" ms") == 3  # every machine's figure on one line
    price = next(line for line in lines if line.startswith("price"))
    assert price.count("per million tokens") == 3


@pytest.mark.parametrize("columns", [80, 120, 200])
def test_on_a_terminal_no_number_is_broken(columns: int, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """On a terminal of any width a cell wraps between words only: every figure of the piped
    table is found whole in the boxed one, and the table is as wide as the terminal where the
    words allow it."""
    assert main(THREE) == 0
    piped = _figures(capsys.readouterr().out)
    out = _Terminal()
    monkeypatch.setenv("COLUMNS", str(columns))
    monkeypatch.setattr("sys.stdout", out)
    assert main(THREE) == 0
    drawn = re.sub(r"\x1b\[[0-9;]*m", "", out.getvalue())  # colours apart
    assert "┃" in drawn or "│" in drawn  # boxed: a terminal
    words = {w for line in drawn.splitlines() for w in line.replace("│", " ").split()}
    assert piped and all(w in words for w in piped)
    if columns >= 120:
        assert max(len(line) for line in drawn.splitlines()) <= columns


def test_piped_tables_are_plain_text(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "-t", "2x5090", "-w", "gpt2-medium", "--no-ranges"]) == 0
    out = capsys.readouterr().out
    assert not any(c in out for c in "│┃━─┏┡└┌")  # no box drawing
    assert "\x1b[" not in out  # no colour codes
    assert any(line.startswith("step time ") for line in out.splitlines())


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_on_a_terminal_tables_have_boxes(monkeypatch: pytest.MonkeyPatch) -> None:
    out = _Terminal()
    monkeypatch.setattr("sys.stdout", out)
    table = terminal.table(title="t")
    table.add_column("a")
    table.add_row("1")
    terminal.console(out).print(table)
    assert "┃" in out.getvalue() or "│" in out.getvalue()


def test_progress_is_silent_off_a_terminal_and_for_short_work(
        monkeypatch: pytest.MonkeyPatch) -> None:
    err = _Terminal()
    monkeypatch.setattr("sys.stderr", err)
    with terminal.progress("short") as update:  # a terminal, but done in well under 2 s
        update(1, 2)
    assert err.getvalue() == ""
    monkeypatch.setattr("sys.stderr", io.StringIO())  # piped: never, however long
    monkeypatch.setattr(terminal, "PROGRESS_AFTER_S", 0.0)
    with terminal.progress("long") as update:
        time.sleep(0.2)
        update(1, 2)


def test_progress_appears_on_stderr_once_work_runs_long(monkeypatch: pytest.MonkeyPatch) -> None:
    err = _Terminal()
    monkeypatch.setattr("sys.stderr", err)
    monkeypatch.setattr(terminal, "PROGRESS_AFTER_S", 0.05)  # stands for the two seconds
    monkeypatch.delenv("CI", raising=False)
    with terminal.progress("simulating 40 points") as update:
        time.sleep(0.3)
        update(20, 40)
        time.sleep(0.2)
    assert "simulating 40 points" in err.getvalue()


def test_a_long_run_shows_progress(monkeypatch: pytest.MonkeyPatch,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    err = _Terminal()
    monkeypatch.setattr("sys.stderr", err)
    monkeypatch.setattr(terminal, "PROGRESS_AFTER_S", 0.0)  # stands for the two seconds
    monkeypatch.delenv("CI", raising=False)
    assert main(["run", "-t", "8x5090-switch", "-w", "gpt2-medium", "-s", "ddp", "--json"]) == 0
    assert "simulating the step and its range" in err.getvalue()
    assert capsys.readouterr().out.startswith("{")  # the answer itself is untouched
