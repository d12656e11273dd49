"""Warning lines about input files (a key a reader does not know, a value it takes as
something else): each printed once a process, or held until the command's outcome is known, so
that a command an error ends says that one line (``held_warnings``, which the CLI wraps every
command in). No heavy import: `stepsim presets` loads it and neither YAML nor pydantic."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

_SHOWN: set[str] = set()  # warning lines printed so far
_held: list[str] | None = None  # warnings waiting for the command's outcome


def show(warnings: Iterable[str]) -> None:
    """Print warning lines not printed yet, or hold them (``held_warnings``). A reader whose
    result is cached passes its lines again at each use: a command that ended in an error
    dropped them, and the next one that uses the file prints them."""
    for text in warnings:
        if _held is not None:
            if text not in _held:
                _held.append(text)
        elif text not in _SHOWN:
            _SHOWN.add(text)
            print(text, file=sys.stderr)


@contextmanager
def held_warnings() -> Iterator[None]:
    """Warnings of the files read inside wait for the end: printed if it ends normally, dropped
    if an error ends it (a config whose later check fails says that one line, as a file with an
    error does, even when a warning about it led there)."""
    global _held
    outer, _held = _held, []
    try:
        yield
        for text in _held:
            if text not in _SHOWN:
                _SHOWN.add(text)
                print(text, file=sys.stderr)
    finally:
        _held = outer
