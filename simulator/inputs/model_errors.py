"""A model's validation error as the one line users read: which of pydantic's errors to
report, and its message in words (a misspelt key, a missing one, a bound, a YAML 1.1 trap)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from simulator.errors import quoted

if TYPE_CHECKING:
    from pydantic import ValidationError


def first_error(exc: ValidationError) -> Any:
    """The error to report: a misspelt key first, as it usually explains a missing one."""
    errors = exc.errors()
    return next((e for e in errors if e["type"] == _UNKNOWN_KEY), errors[0])


def explain(err: Any) -> str:
    """A pydantic error (one of ``exc.errors()``) as the one-line message users read."""
    kind = err["type"]
    if kind == _UNKNOWN_KEY:
        return "unknown key (misspelt?)"
    if kind == "missing":
        return "required key is missing"
    if kind == "int_parsing_size":
        return f"{quoted(err.get('input'))} is too large a number (docs/inputs.md: Limits)"
    msg = str(err["msg"]).removeprefix("Value error, ")
    if kind == "dataclass_type":  # a scalar or a list where a mapping of keys belongs
        msg = f"Input should be a valid dictionary or instance of {err['ctx']['class_name']}"
    value = err.get("input")
    bound = _BOUNDS.get(kind)
    if bound is not None:
        limit = err["ctx"][bound[0]]
        msg = bound[1].format(f"{limit:,}" if isinstance(limit, int) else f"{limit:g}")
    if kind != "value_error" and not isinstance(value, dict | list):
        msg += f", got {quoted(value)}"
        if isinstance(value, str) and _YAML11.fullmatch(value) and kind.startswith(
                ("int", "float")):
            msg += " (YAML 1.1 read this as a boolean or a base-60 number; here it is text)"
    if bound is not None:
        msg += " (docs/inputs.md: Limits)"
    return msg


_UNKNOWN_KEY = "unexpected_keyword_argument"  # pydantic's error for a key a dataclass lacks
_BOUNDS = {"less_than_equal": ("le", "must be at most {}"),
           "greater_than_equal": ("ge", "must be at least {}"),
           "too_long": ("max_length", "at most {} entries")}
_YAML11 = re.compile(r"(?i:y|yes|n|no|on|off)|[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+(?:\.[0-9_]*)?")
