"""JSON config files users already have (Hugging Face, PEFT, DeepSpeed), read with line marks.

What is inside: ``read(path, what)`` parses a JSON file and records the 1-based line of every
key path, so a bad value is reported as the YAML inputs are (``file:line: key: message``,
:class:`InputError`, exit 2). ``JsonDoc`` reads typed values by key path and warns, one line
each on stderr, about keys the reader does not know (they are ignored, not fatal).

What it assumes: a file of at most ``MAX_BYTES`` holding one JSON object; ``NaN`` and
``Infinity`` (which Python's json accepts) and duplicate keys are refused. A file read again
(a job built with other flags) warns nothing new: each warning line is printed once a process.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from simulator.errors import LINE_CHARS, PATH_CHARS, InputError, cut
from simulator.inputs.file_warnings import show
from simulator.inputs.loader import MAX_BYTES, decode

Loc = tuple[str | int, ...]  # key path: ("zero_optimization", "offload_param", "device")

# JSON's tokens: a string, a punctuation mark, or a bare word or number (the text is valid)
_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[{}\[\]:,]|[^\s{}\[\]:,"]+')


def read(path: str | Path, what: str) -> JsonDoc:
    """The JSON object in ``path`` (``what``: the kind of file, for messages)."""
    file = str(path)
    p = Path(path)
    try:
        if not p.exists():
            raise InputError(f"no such file ({what} expected)", file=file)
        if not p.is_file():
            raise InputError(f"not a regular file ({what} expected)", file=file)
        data = p.read_bytes()
    except OSError as exc:  # unreadable, or a name too long to be a path
        raise InputError(f"cannot read the file: {exc.strerror or exc}", file=file) from None
    if len(data) > MAX_BYTES:
        raise InputError(f"the file is {len(data):,} bytes; at most {MAX_BYTES:,} are read",
                         file=file)
    text = decode(data, file)
    try:
        value = json.loads(text, parse_constant=_no_constant, parse_float=_finite,
                           object_pairs_hook=_no_duplicates)
    except json.JSONDecodeError as exc:
        raise InputError(f"invalid JSON: {exc.msg} (column {exc.colno})", file=file,
                         line=exc.lineno) from None
    except _Refused as exc:
        line = _line_of(text, exc.word)
        keys = [loc for loc, at in key_lines(text).items() if at == line and loc]
        raise InputError(str(exc), file=file, line=line,
                         key=_key(keys[-1]) if keys else None) from None
    except ValueError as exc:  # an integer past Python's digit limit
        raise InputError(f"invalid JSON: {exc}", file=file) from None
    except RecursionError:
        raise InputError("invalid JSON: nested too deeply", file=file) from None
    if not isinstance(value, dict):
        raise InputError(f"expected a JSON object ({what}), got {type(value).__name__}",
                         file=file, line=1)
    return JsonDoc(file, value, key_lines(text))


class _Refused(ValueError):
    def __init__(self, message: str, word: str) -> None:
        super().__init__(message)
        self.word = word


def _no_constant(word: str) -> Any:
    raise _Refused(f"{word} is not a number JSON allows", word)


def _finite(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise _Refused(f"{cut(text)} is too large a number", text)
    return value


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _Refused(f"{cut(key)}: the key is given twice", f'"{key}"')
        out[key] = value
    return out


def _line_of(text: str, word: str) -> int | None:
    at = text.find(word)
    return text.count("\n", 0, at) + 1 if at >= 0 else None


def key_lines(text: str) -> dict[Loc, int]:
    """The line of each key path of valid JSON text (list items by index), and () -> 1."""
    lines: dict[Loc, int] = {(): 1}
    stack: list[list[Any]] = []  # per open container: [path, next index or pending key, kind]
    line = 1
    pos = 0
    for match in _TOKEN.finditer(text):
        line += text.count("\n", pos, match.start())
        pos = match.start()
        token = match.group()
        top = stack[-1] if stack else None
        if token in "{[":
            path = _value_path(top)
            lines.setdefault(path, line)
            stack.append([path, None if token == "{" else 0, token])
        elif token in "}]":
            stack.pop()
        elif token == ",":
            if top is not None and top[2] == "[":
                top[1] += 1
            elif top is not None:
                top[1] = None
        elif token == ":":
            continue
        elif top is not None and top[2] == "{" and top[1] is None:
            key = json.loads(token)  # a key: the value that follows belongs to it
            top[1] = key
            lines[(*top[0], key)] = line
        else:
            lines.setdefault(_value_path(top), line)
    return lines


def _value_path(top: list[Any] | None) -> Loc:
    return () if top is None else (*top[0], top[1])  # top[1]: the pending key or the index


@dataclass
class JsonDoc:
    """One parsed JSON file: its data, the line of each key path, and typed accessors."""

    file: str
    data: dict[str, Any]
    lines: dict[Loc, int]
    warned: list[str] = field(default_factory=list)

    def line(self, loc: Loc) -> int | None:
        """The line of ``loc``, or of its nearest enclosing key; None for a missing top key."""
        while loc and loc not in self.lines:
            loc = loc[:-1]
        return self.lines.get(loc) if loc else None

    def error(self, loc: Loc, message: str) -> InputError:
        return InputError(message, file=self.file, line=self.line(loc), key=_key(loc))

    def get(self, loc: Loc, kinds: tuple[type, ...], default: Any = None, *,
            required: bool = False, auto: bool = False) -> Any:
        """The value at ``loc`` if it is one of ``kinds``; ``default`` when absent (or null, or
        ``"auto"`` with ``auto``: the Hugging Face Trainer fills those in, so the simulator
        keeps its own default). A required key that is missing, or a value of another type,
        is the one-line error."""
        node: Any = self.data
        for part in loc:
            if not isinstance(node, dict) or part not in node:
                if required:
                    raise self.error(loc, "required key is missing")
                return default
            node = node[part]
        if node is None or (auto and node == "auto"):
            if required:  # null (or "auto") where a value must be given
                raise self.error(loc, f"required, got {json.dumps(node)}")
            return default
        if isinstance(node, bool) and bool not in kinds:  # True is an int to Python, not here
            raise self.error(loc, f"expected {_names(kinds)}, got {json.dumps(node)}")
        if float in kinds and isinstance(node, int) and not isinstance(node, bool):
            node = float(node)
        if int in kinds and isinstance(node, float) and node.is_integer() and \
                float not in kinds:
            node = int(node)  # 1e9 and 5e8 are written as floats in DeepSpeed configs
        if not isinstance(node, kinds):
            shown = json.dumps(node)
            raise self.error(loc, f"expected {_names(kinds)}, got "
                             f"{cut(shown)}")
        return node

    def positive_int(self, loc: Loc, default: int | None = None, *, required: bool = False,
                     auto: bool = False, at_most: int | None = None) -> int | None:
        value = self.get(loc, (int,), default, required=required, auto=auto)
        if value is not None and value < 1:
            raise self.error(loc, f"must be at least 1, got {value}")
        if value is not None and at_most is not None and value > at_most:
            raise self.error(loc, f"at most {at_most:,} (docs/inputs.md: Limits)")
        return value  # type: ignore[no-any-return]

    def warn_unknown(self, loc: Loc, known: Iterable[str]) -> None:
        """One warning line on stderr per key of the object at ``loc`` that is not ``known``."""
        node = self.get(loc, (dict,), {}) if loc else self.data
        allowed = set(known)
        for key in node:
            if key not in allowed:
                self.warn((*loc, key), "unknown key, ignored")

    def warn(self, loc: Loc, message: str) -> None:
        """Note a warning line; ``show_warnings`` prints them once the file has been read."""
        where = self.file + (f":{self.line(loc)}" if self.line(loc) else "")
        self.warned.append(f"{cut(where, PATH_CHARS)}: {cut(_key(loc))}: warning: "
                           f"{cut(message, LINE_CHARS)}")

    def show_warnings(self) -> None:
        """Print the warnings, each once a process: called when the file read without error,
        so a file with an error says that one line and nothing else (inside ``held_warnings``
        they wait for the command to end without one)."""
        show(self.warned)




def _key(loc: Loc) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else ("." if out else "") + part
    return out or "(top level)"


def _names(kinds: tuple[type, ...]) -> str:
    words = {bool: "true or false", int: "an integer", float: "a number", str: "text",
             list: "a list", dict: "an object"}
    return " or ".join(words.get(k, k.__name__) for k in kinds)
