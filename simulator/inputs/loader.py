"""YAML text -> plain Python data and the line of every key, within limits.

What is inside: ``load_yaml(data, file)`` parses with libyaml's C parser when PyYAML was built
with it (``yaml.CSafeLoader``), else PyYAML's pure-Python one (``yaml.SafeLoader``): the same
events either way. One pass over the parser's events builds the data with an explicit stack
(no recursion), so deep nesting cannot overflow Python's stack.

What it assumes and refuses (each as one :class:`InputError` line with file and line):
- Scalars are read by the YAML 1.2 core schema (plus ``_`` digit separators and ``1e9`` as a
  number): only ``true``/``false`` are booleans, ``010`` is ten, ``1:30`` and ``on``/``yes``
  stay text, so a field that wants a number refuses them instead of reading YAML 1.1's x1 link
  or base-60 integer.
- Only the standard tags (``!!str``, ``!!int``, ``!!float``, ``!!bool``, ``!!null``,
  ``!!map``, ``!!seq``); merge keys (``<<``), complex keys and duplicate keys are refused.
- Limits: ``MAX_BYTES`` of text, ``MAX_NODES`` values after expanding aliases (an alias bomb
  is refused before it is built), ``MAX_ALIASES`` alias uses, ``MAX_DEPTH`` levels of
  nesting; an alias to its own enclosing node (recursive data) is refused.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

import yaml

from simulator.errors import InputError, cut, quoted

MAX_BYTES = 16 * 2**20  # a generated 1,024-GPU topology is about 2 MB
MAX_NODES = 1_000_000  # values after alias expansion (scalars, lists, mappings)
MAX_ALIASES = 10_000
MAX_DEPTH = 32  # the schemas nest four levels

Loc = tuple[Any, ...]  # key path: ("links", 3, "lanes")

_Parser = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when PyYAML has it

_STD = "tag:yaml.org,2002:"
_INT = re.compile(r"[-+]?[0-9][0-9_]*|0o[0-7_]+|0x[0-9a-fA-F_]+")
_FLOAT = re.compile(r"[-+]?(?:\.[0-9][0-9_]*|[0-9][0-9_]*(?:\.[0-9_]*)?)(?:[eE][-+]?[0-9]+)?")
_INF = re.compile(r"[-+]?\.(?:inf|Inf|INF)")
_NAN = re.compile(r"\.(?:nan|NaN|NAN)")
_NULL = ("", "~", "null", "Null", "NULL")
_BOOL = {"true": True, "True": True, "TRUE": True, "false": False, "False": False,
         "FALSE": False}


def decode(data: bytes, file: str) -> str:
    """UTF-8 text (a leading BOM allowed); other bytes are refused with their line."""
    if len(data) > MAX_BYTES:
        raise InputError(f"the file is {len(data):,} bytes; at most {MAX_BYTES:,} are read",
                         file=file)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise InputError(f"not UTF-8 text (byte 0x{data[exc.start]:02x}); save the file as "
                         "UTF-8", file=file, line=line) from None


def load_yaml(text: str, file: str, *, parser_class: Any = None
              ) -> tuple[Any, dict[Loc, int]]:
    """The one document of ``text`` as plain data, and the 1-based line of each key path.

    ``parser_class``: PyYAML's loader class to take events from (default: libyaml's when
    available); tests pass ``yaml.SafeLoader`` to check both give the same.
    """
    parser = None
    try:
        parser = (parser_class or _Parser)(text)  # the pure-Python reader checks text here
        return _Builder(file).build(parser)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        problem = exc.problem or exc.context or "invalid YAML"
        raise InputError(f"invalid YAML: {cut(problem)}", file=file,
                         line=mark.line + 1 if mark else None) from None
    except yaml.YAMLError as exc:  # ReaderError: a character YAML does not allow
        position = getattr(exc, "position", 0)
        reason = getattr(exc, "reason", None) or "unreadable text"
        raise InputError(f"invalid YAML: {reason}", file=file,
                         line=text[:position].count("\n") + 1) from None
    finally:
        if parser is not None:
            parser.dispose()


@dataclass
class _Open:
    """A list or mapping being built, and where it sits."""

    value: list[Any] | dict[Any, Any]
    loc: Loc
    anchor: str | None
    line: int
    key: Any = None  # mappings: the key whose value comes next
    has_key: bool = False
    key_lines: dict[Any, int] = field(default_factory=dict)


@dataclass
class _Anchored:
    value: Any
    size: int  # values inside, aliases expanded


class _Builder:
    """Builds data from parser events with an explicit stack (see the module docstring)."""

    def __init__(self, file: str) -> None:
        self.file = file
        self.lines: dict[Loc, int] = {}
        self.anchors: dict[str, _Anchored] = {}
        self.open_anchors: set[str] = set()
        self.stack: list[_Open] = []
        self.nodes = 0
        self.aliases = 0
        self.sizes: list[int] = []  # nodes counted when each open collection started

    def fail(self, message: str, line: int) -> InputError:
        return InputError(message, file=self.file, line=line)

    def build(self, parser: Any) -> tuple[Any, dict[Loc, int]]:
        root: list[Any] = []
        documents = 0
        while True:
            event = parser.get_event()
            line = event.start_mark.line + 1 if event.start_mark else 0
            if isinstance(event, yaml.StreamEndEvent):
                break
            if isinstance(event, yaml.DocumentStartEvent):
                documents += 1
                if documents > 1:
                    raise self.fail("more than one YAML document (a second `---`); give one",
                                    line)
            elif isinstance(event, yaml.ScalarEvent):
                self.add(self.scalar(event, line), event.anchor, line, 1)
            elif isinstance(event, yaml.AliasEvent):
                self.alias(str(event.anchor), line)
            elif isinstance(event, yaml.MappingStartEvent | yaml.SequenceStartEvent):
                self.start(event, line)
            elif isinstance(event, yaml.MappingEndEvent | yaml.SequenceEndEvent):
                self.end()
            if not self.stack and (isinstance(event, yaml.ScalarEvent | yaml.AliasEvent
                                              | yaml.MappingEndEvent | yaml.SequenceEndEvent)):
                root.append(self.last)
        return (root[0] if root else None), self.lines

    # --- collections --------------------------------------------------------------------

    def start(self, event: Any, line: int) -> None:
        mapping = isinstance(event, yaml.MappingStartEvent)
        tag = event.tag
        if tag not in (None, "!", _STD + ("map" if mapping else "seq")):
            raise self.fail(f"unsupported YAML tag {quoted(tag)}; stepsim reads plain YAML", line)
        if self.stack and self.stack[-1].has_key is False and isinstance(
                self.stack[-1].value, dict):
            raise self.fail("a key must be plain text, not a list or mapping", line)
        if len(self.stack) >= MAX_DEPTH:
            raise self.fail(f"nested more than {MAX_DEPTH} levels deep", line)
        self.count(1, line)
        loc = self.child_loc()
        self.lines[loc] = line
        if event.anchor is not None:
            self.open_anchors.add(event.anchor)
        self.stack.append(_Open({} if mapping else [], loc, event.anchor, line))
        self.sizes.append(self.nodes)

    def end(self) -> None:
        done = self.stack.pop()
        start = self.sizes.pop()
        if isinstance(done.value, dict) and done.has_key:
            raise self.fail("a key without a value", done.line)
        if done.anchor is not None:
            self.open_anchors.discard(done.anchor)
            self.anchors[done.anchor] = _Anchored(done.value, self.nodes - start + 1)
        self.put(done.value, done.line)

    def child_loc(self) -> Loc:
        if not self.stack:
            return ()
        top = self.stack[-1]
        if isinstance(top.value, dict):
            return top.loc + (top.key,)
        return top.loc + (len(top.value),)

    # --- values -------------------------------------------------------------------------

    def add(self, value: Any, anchor: str | None, line: int, size: int,
            alias: bool = False) -> None:
        """A scalar or an alias's value: either a mapping key or a value in place.

        Keys inside an alias's value are not given lines of their own: an error there names
        the line of the alias.
        """
        top = self.stack[-1] if self.stack else None
        if isinstance(top, _Open) and isinstance(top.value, dict) and not top.has_key:
            if alias:
                raise self.fail("a key must be plain text, not an alias", line)
            self.key(top, value, line)
            self.count(1, line)
            return
        self.count(size, line)
        loc = self.child_loc()
        self.lines[loc] = line
        if anchor is not None:
            self.anchors[anchor] = _Anchored(value, 1)
        self.put(value, line)

    def key(self, top: _Open, key: Any, line: int) -> None:
        assert isinstance(top.value, dict)
        if key == "<<":
            raise self.fail("merge keys (<<) are not supported; write the keys out", line)
        if key in top.key_lines:
            raise self.fail(f"{quoted(key)} is given twice (first on line {top.key_lines[key]})",
                            line)
        top.key, top.has_key = key, True
        top.key_lines[key] = line
        self.lines[top.loc + (key,)] = line

    def put(self, value: Any, line: int) -> None:
        """Place a finished value in the collection being built (or as the document)."""
        self.last = value
        if not self.stack:
            return
        top = self.stack[-1]
        if isinstance(top.value, dict):
            top.value[top.key] = value
            top.has_key = False
        else:
            top.value.append(value)

    def alias(self, name: str, line: int) -> None:
        self.aliases += 1
        if self.aliases > MAX_ALIASES:
            raise self.fail(f"more than {MAX_ALIASES:,} aliases", line)
        if name in self.open_anchors:
            raise self.fail(f"alias *{cut(name)} refers to a value that contains it (recursive "
                            "data)", line)
        anchored = self.anchors.get(name)
        if anchored is None:
            raise self.fail(f"alias *{cut(name)} names no anchor", line)
        self.add(anchored.value, None, line, anchored.size, alias=True)

    def count(self, n: int, line: int) -> None:
        self.nodes += n
        if self.nodes > MAX_NODES:
            raise self.fail(f"more than {MAX_NODES:,} values once aliases are expanded "
                            "(an alias bomb?)", line)

    def scalar(self, event: Any, line: int) -> Any:
        value: str = event.value
        tag = event.tag
        plain = event.implicit[0]
        if tag in (None, "!") and plain:
            return resolve_plain(value)
        if tag in (None, "!", _STD + "str"):
            return value
        kind = tag.removeprefix(_STD) if tag.startswith(_STD) else None
        if kind in ("int", "float", "bool", "null"):
            resolved = resolve_plain(value)
            wanted = {"int": int, "float": float, "bool": bool, "null": type(None)}[kind]
            if kind == "float" and isinstance(resolved, int) and not isinstance(resolved, bool):
                resolved = float(resolved)
            if type(resolved) is not wanted:
                raise self.fail(f"!!{kind} {quoted(value)} is not a valid {kind}", line)
            return resolved
        raise self.fail(f"unsupported YAML tag {quoted(tag)}; stepsim reads plain YAML", line)


def resolve_plain(value: str) -> Any:
    """A plain (unquoted) scalar by the YAML 1.2 core schema, with ``_`` separators allowed."""
    if value in _NULL:
        return None
    if value in _BOOL:
        return _BOOL[value]
    if not value or value[0] not in "-+.0123456789":
        return value
    if _INT.fullmatch(value):
        digits = value.replace("_", "")
        try:
            if digits.startswith("0x"):
                return int(digits[2:], 16)
            if digits.startswith("0o"):
                return int(digits[2:], 8)
            return int(digits)
        except ValueError:  # more digits than Python converts (sys.int_info)
            return value
    if _FLOAT.fullmatch(value):
        return float(value.replace("_", ""))
    if _INF.fullmatch(value):
        return -math.inf if value.startswith("-") else math.inf
    if _NAN.fullmatch(value):
        return math.nan
    return value
