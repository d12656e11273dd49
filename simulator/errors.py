"""The one error type users see: bad input, reported as one line, exit status 2; and the
"did you mean" its messages offer for a name that is almost right."""

from __future__ import annotations

from collections.abc import Iterable, Mapping


class InputError(Exception):
    """Bad input from the user (file, key, flag). The CLI prints it as one line, exits 2."""

    def __init__(self, message: str, *, file: str | None = None, line: int | None = None,
                 key: str | None = None) -> None:
        self.message = " ".join(message.splitlines())  # one line, whatever it quotes
        self.file = file
        self.line = line
        self.key = key
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
    near = difflib.get_close_matches(given, choices, n=1, cutoff=0.75)
    return f"; did you mean {near[0]}?" if near else ""
