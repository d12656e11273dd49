"""The one error type users see: bad input, reported as one line, exit status 2; how an
error line quotes what the user wrote; and the "did you mean" its messages offer for a name
that is almost right.

A quoted value (a key, a name, a flag's argument, a cell of a log) longer than
``VALUE_CHARS`` is cut, with how much was left out: ``cut("k" * 100_000)`` is 80 k's and
``... (99,920 more characters)``. Every message goes through ``cut`` or ``quoted`` where it
echoes input, and :class:`InputError` itself keeps a line short whatever it is given: a key is
cut like a value, a file name at ``PATH_CHARS`` (longer than any path a system opens), and
the key and message together fit in ``LINE_CHARS``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

VALUE_CHARS = 80  # of a value an error line quotes
PATH_CHARS = 300  # of a file an error line names
LINE_CHARS = 500  # of an error line after its "file:line: " (a list of presets takes ~300)
_NOTE_CHARS = 40  # "... (N more characters)", for any N below 10**15


def cut(text: object, limit: int = VALUE_CHARS) -> str:
    """``text`` whole when at most ``limit`` characters, else its first ``limit`` and how many
    more there were: ``cut("abcdef", 2) == "ab... (4 more characters)"``."""
    text = str(text)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text) - limit:,} more characters)"


def quoted(value: object, limit: int = VALUE_CHARS) -> str:
    """``repr`` of what the user wrote, a long string cut as ``cut`` cuts (the count is of the
    string's own characters): ``quoted("abcdef", 2) == "'ab'... (4 more characters)"``."""
    if isinstance(value, str):
        if len(value) <= limit:
            return repr(value)
        return f"{value[:limit]!r}... ({len(value) - limit:,} more characters)"
    return cut(repr(value), limit)


def _fit(text: str, width: int) -> str:
    """``text`` cut so that, with its note, it takes at most ``width`` characters."""
    return text if len(text) <= width else cut(text, max(width - _NOTE_CHARS, 0))


class InputError(Exception):
    """Bad input from the user (file, key, flag). The CLI prints it as one line, exits 2."""

    def __init__(self, message: str, *, file: str | None = None, line: int | None = None,
                 key: str | None = None) -> None:
        self.file = None if file is None else cut(file, PATH_CHARS)
        self.line = line
        self.key = None if key is None else cut(key)
        room = LINE_CHARS - (len(self.key) + 2 if self.key else 0)
        self.message = _fit(" ".join(message.splitlines()), room)  # one line, and a short one
        super().__init__(str(self))

    def __str__(self) -> str:
        where = ""
        if self.file:
            where = self.file + (f":{self.line}" if self.line else "") + ": "
        key = f"{self.key}: " if self.key else ""
        return f"{where}{key}{self.message}"


def _plain(word: str) -> str:
    """A word as people vary its spelling: case, dashes, underscores, dots, spaces."""
    return "".join(c for c in word.lower() if c.isalnum() or c == "+")


def did_you_mean(given: str, choices: Iterable[str],
                 synonyms: Mapping[str, tuple[str, str]] | None = None) -> str:
    """``"; did you mean X?"`` for a known synonym of a choice (``synonyms``: another
    program's name -> (ours, whose name it is), compared without case or separators), a
    choice spelt with other separators (``llama-2-7b``), or a near miss; ``""`` when nothing
    is close."""
    import difflib

    choices = list(choices)
    plain = _plain(given)
    for other, (ours, whose) in (synonyms or {}).items():
        if _plain(other) == plain:
            return f"; did you mean {ours}? ({other} in {whose})"
    for choice in choices:
        if _plain(choice) == plain:
            return f"; did you mean {choice}?"
    longer = [c for c in choices if plain and _plain(c).startswith(plain)]  # 8x4090: a preset
    if longer:  # of that box, named by its layout
        return f"; did you mean {_one_of(longer[:4])}?"
    near = difflib.get_close_matches(given, choices, n=1, cutoff=0.75)
    return f"; did you mean {near[0]}?" if near else ""


def _one_of(names: list[str]) -> str:
    """``a``, ``a or b``, ``a, b or c``."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"
