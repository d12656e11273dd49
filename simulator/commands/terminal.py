"""How text reaches the user: tables as wide as the terminal, progress for long work.

Tables are drawn by rich at the terminal's width (rich reads ``COLUMNS``, then the size of
the terminal), with box lines on a terminal and as plain aligned columns when stdout is piped
or redirected, so `stepsim compare ... | cat`, `grep` and `awk` read words, not drawing
characters. A number is never broken across lines: piped, nothing wraps at all (a line is as
long as its content); on a terminal a cell wraps only between words, and a table whose words
cannot fit the terminal is drawn as wide as they need (``show``). Progress goes to stderr,
only when stderr is a terminal (never under CI) and only once the work has run for two
seconds: short commands stay silent.
rich is imported only when text is printed or a progress bar is due.

A reader that leaves (`stepsim ... | head`) is a ``BrokenPipeError`` out of a table's print,
as out of ``print``, for the CLI to end on quietly; rich's own answer (exit status 1) is not
used. A progress bar whose stream breaks just stops drawing.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import io
import os
import sys
import threading
from collections.abc import Callable, Iterator
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

PROGRESS_AFTER_S = 2.0  # work shorter than this shows no progress at all
# piped text is never wrapped: rich's width is set beyond any line a command prints (a
# table is only as wide as its content, plain lines are not padded)
PIPED_WIDTH = 100_000

Update = Callable[[int, int | None], None]  # (done, total or None when not yet known)


class _Trimmed(io.TextIOBase):
    """A text stream that drops the spaces rich pads each line with (plain output only)."""

    def __init__(self, out: IO[str]) -> None:
        self.out = out
        self.pending = ""

    def write(self, text: str) -> int:
        lines = (self.pending + text).split("\n")
        self.pending = lines.pop()
        if lines:
            self.out.write("".join(line.rstrip() + "\n" for line in lines))
        return len(text)

    def flush(self) -> None:
        if self.pending:
            self.out.write(self.pending.rstrip())
            self.pending = ""
        self.out.flush()


@functools.cache
def _console_class(*, drawing: bool) -> type[Console]:
    """rich's Console, but a broken pipe is raised (tables), or ends the drawing (``drawing``:
    a progress bar). rich's own ``on_broken_pipe`` points stdout at /dev/null and raises
    SystemExit(1), which would be exit status 1 for a reader that only left."""
    from rich.console import Console

    class Quiet(Console):
        def on_broken_pipe(self) -> None:
            self.quiet = True  # nothing more is drawn
            if not drawing:
                raise BrokenPipeError(errno.EPIPE, os.strerror(errno.EPIPE))

    return Quiet


def console(file: IO[str] | None = None) -> Console:
    """A console for stdout (or ``file``) at the terminal's width; piped, no colour and no
    trailing spaces."""
    out = file or sys.stdout
    if out.isatty():
        return _console_class(drawing=False)(file=out, highlight=False)
    # rich decides colour from the stream it is given: a wrapper is no terminal
    return _console_class(drawing=False)(file=_Trimmed(out),  # type: ignore[arg-type]
                                         highlight=False, width=PIPED_WIDTH, soft_wrap=True)


def table(*, title: str | None = None, show_header: bool = True, **options: Any) -> Table:
    """A rich table: boxed on a terminal, plain aligned columns when stdout is not one."""
    from rich import box
    from rich.table import Table

    plain = not sys.stdout.isatty()
    return Table(title=title, show_header=show_header, title_justify="left",
                 box=None if plain else box.HEAVY_HEAD, pad_edge=not plain, **options)


def _words(cell: Any) -> list[str]:
    return str(cell.plain if hasattr(cell, "plain") else cell).split()


def _drawn(console: Console, table: Table, width: int) -> str:
    from rich.console import Console

    probe = Console(file=io.StringIO(), width=width, color_system=None, highlight=False)
    with probe.capture() as captured:
        probe.print(table)
    return captured.get()


def show(table: Table, console: Console) -> None:
    """Print ``table`` so that no number (no word) is broken across lines. Piped, nothing
    wraps (``console``'s width is beyond any line). On a terminal a cell may wrap between
    words; where the terminal is too narrow for that, the table is drawn as much wider as
    keeps every word whole (the check is on the drawn text itself)."""
    from rich.measure import Measurement

    widest = Measurement.get(console, console.options.update(width=PIPED_WIDTH), table).maximum
    width = console.width
    if widest > width:
        words = {w for column in table.columns for cell in (column.header, *column.cells)
                 for w in _words(cell)}
        while width < widest:
            lines = _drawn(console, table, width).splitlines()
            if all(any(w in line for line in lines) for w in words):
                break
            width = min(widest, width + 4)
    if width == console.width:
        console.print(table)
        return
    old = console.width
    console.width = width
    try:
        console.print(table)
    finally:
        console.width = old


# `stepsim serve` runs commands as processes and reads their progress: with this variable set
# to "lines", progress is a line ``stepsim-progress DONE TOTAL`` on stderr at each update
PROGRESS_LINES = "STEPSIM_PROGRESS"


@contextlib.contextmanager
def progress(description: str) -> Iterator[Update]:
    """``update(done, total)`` for a piece of work; a bar on stderr appears once it has run
    two seconds (updates or not: a timer starts it), if stderr is a terminal and CI is not
    set, and is erased when the work ends. Under ``STEPSIM_PROGRESS=lines``, a line per
    update instead, for the program reading stderr."""
    if os.environ.get(PROGRESS_LINES) == "lines":
        def line(done: int, total: int | None) -> None:
            print(f"stepsim-progress {done} {total or 0}", file=sys.stderr, flush=True)

        yield line
        return
    if not sys.stderr.isatty() or os.environ.get("CI"):
        yield lambda done, total: None
        return
    lock = threading.Lock()
    state: dict[str, Any] = {"done": 0, "total": None, "bar": None, "task": None, "over": False}

    def begin() -> None:
        # rich only once the bar is due: work that ends sooner never imports it
        from rich.progress import Progress

        with lock:
            if state["over"]:  # the work ended while rich was being imported
                return
            bar = state["bar"] = Progress(console=_console_class(drawing=True)(stderr=True),
                                          transient=True)
            bar.start()
            state["task"] = bar.add_task(description, total=state["total"],
                                         completed=state["done"])

    def update(done: int, total: int | None) -> None:
        with lock:
            state.update(done=done, total=total)
            if state["task"] is not None:
                state["bar"].update(state["task"], completed=done, total=total)

    timer = threading.Timer(PROGRESS_AFTER_S, begin)
    timer.daemon = True
    timer.start()
    try:
        yield update
    finally:
        timer.cancel()
        with lock:
            state["over"] = True
            if state["task"] is not None:
                state["bar"].stop()
