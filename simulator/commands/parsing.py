"""The one argument-parser style of every `stepsim` command.

``Parser`` is argparse with four changes: a bad or unknown flag is one line (``UsageError``,
exit 2, no usage block; a near miss is suggested), a prefix of a flag is not taken for the
flag (``allow_abbrev=False``: ``--bucket-m`` is an error, not ``--bucket-mb``), a
value-taking flag given twice is refused instead of the last one silently winning, and help
that cannot be written fails as any output does (argparse would drop the error). Number
flags are read by ``whole`` and ``number``, which word their errors like the rest.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from simulator.errors import VALUE_CHARS, InputError, cut, quoted

if TYPE_CHECKING:
    from _typeshed import SupportsWrite


class UsageError(InputError):
    """A command line argparse cannot read; ``prog`` names the (sub)command."""

    def __init__(self, prog: str, message: str) -> None:
        self.prog = prog
        super().__init__(message)


class _Once(argparse.Action):
    """Store a flag's value, refusing the flag a second time (argparse keeps the last)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        given: set[str] = namespace.__dict__.setdefault("_given", set())
        if self.dest in given:
            parser.error(f"{option_string} is given twice; give it once")
        given.add(self.dest)
        setattr(namespace, self.dest, values)


class Each(argparse.Action):
    """Append a repeatable flag's values, a comma list read as one value each
    (``-t a,b`` is ``-t a -t b``); a value naming an existing file (``hf:`` or not) stays
    whole."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        text = str(values)
        whole = "," not in text or Path(text.removeprefix("hf:")).exists()
        items = [text] if whole else [
            v.strip() for v in text.split(",")]
        if not all(items):
            parser.error(f"{option_string}: an empty item in {quoted(text)}")
        setattr(namespace, self.dest, [*(getattr(namespace, self.dest, None) or []), *items])


class Parser(argparse.ArgumentParser):
    """argparse.ArgumentParser in stepsim's style (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        optional = bool(args) and str(args[0]).startswith("-")
        if optional and kwargs.get("action", "store") == "store" and "nargs" not in kwargs:
            kwargs["action"] = _Once
        return super().add_argument(*args, **kwargs)

    def parse_known_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                         namespace: argparse.Namespace | None = None
                         ) -> tuple[argparse.Namespace, list[str]]:
        parsed, extra = super().parse_known_args(args, namespace)
        if extra:  # here, so a subcommand's stray flag is reported by that subcommand
            self.error(self._unknown(extra))
        return parsed, extra

    def print_help(self, file: SupportsWrite[str] | None = None) -> None:
        # argparse's own drops a failed write (a full disk would print nothing, status 0);
        # here it fails like every other output, for the CLI to tell (cli.py)
        (file or sys.stdout).write(self.format_help())

    def error(self, message: str) -> NoReturn:
        message = message.removeprefix("argument ")
        # argparse quotes a bad value whole ("invalid choice: '...'"): cut a long one
        message = _LONG_QUOTE.sub(lambda m: quoted(m.group(1)), message)
        raise UsageError(self.prog, f"{message} (`{self.prog} --help` lists the flags)")

    def _unknown(self, extra: list[str]) -> str:
        first = extra[0]
        flags = [s for a in self._actions for s in a.option_strings]
        from simulator.commands import synonyms  # a framework's name for one of our flags

        known = synonyms.meaning(first) if first.startswith("-") else None
        if known is not None:
            name, ours, whose = known
            flag = ours.split()[0]
            where = "" if flag in flags else f"; `stepsim {self.prog.split()[-1]}` has no {flag}"
            hint = f"; did you mean {ours}? ({name} in {whose}{where})"
        else:
            import difflib  # only to suggest a flag for a mistyped one

            near = difflib.get_close_matches(first.split("=", 1)[0], flags, n=1)
            hint = f"; did you mean {near[0]}?" if near else ""
        return (f"unrecognized argument{'s' if len(extra) > 1 else ''}: {cut(' '.join(extra))}"
                f"{hint}")


_LONG_QUOTE = re.compile(rf"'([^'\\]{{{VALUE_CHARS + 1},}})'")  # a repr longer than a value


def whole(minimum: int = 1, maximum: int | None = None) -> Callable[[str], int]:
    """An argparse ``type`` for a whole number within bounds."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {quoted(text)}") \
                from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        if maximum is not None and value > maximum:
            raise argparse.ArgumentTypeError(f"at most {maximum:,}, got {value:,}")
        return value
    return parse


def number(minimum: float = -math.inf, maximum: float = math.inf) -> Callable[[str], float]:
    """An argparse ``type`` for a finite number within bounds."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {quoted(text)}") from None
        if not math.isfinite(value) or not minimum <= value <= maximum:
            raise argparse.ArgumentTypeError(f"must be a number from {minimum:g} to "
                                             f"{maximum:g}, got {text}")
        return value
    return parse


NO_FIT_EXIT = 3  # distinct from bad input (2): a script can tell "too big" from "wrong"


def no_fit_status(args: argparse.Namespace, memory: dict[str, Any]) -> int:
    """0, or NO_FIT_EXIT under --fail-if-no-fit when GPU or host memory does not hold it."""
    fits = memory["fits"] and memory.get("host_fits", True) is not False
    return NO_FIT_EXIT if getattr(args, "fail_if_no_fit", False) and not fits else 0


def machine_gpus(text: str) -> tuple[str, int | None]:
    """``-t 8x4090-dual-socket:4``: a topology and how many of its GPUs to use (its first K;
    None: as --gpus says). A file whose own name ends in ``:K`` is taken as the file."""
    import os
    import re

    from simulator.inputs.schema import MAX_GPUS

    found = re.fullmatch(r"(.+):(\d+)", text.strip())
    if found is None or os.path.exists(text):
        return text, None
    count = int(found.group(2))
    if not 1 <= count <= MAX_GPUS:
        raise InputError(f"-t {text}: the GPU count after ':' must be from 1 to {MAX_GPUS:,}")
    return found.group(1), count
