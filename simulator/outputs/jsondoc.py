"""The JSON every command prints: its shape's version first, then the command's own keys.

``SCHEMA_VERSION`` changes when a key is renamed, removed or changes meaning (added keys do
not change it), so scripts can check what they read. ``dumps`` puts it in every object a
command prints: the object itself, or each object of a list (``collective`` over a size
range, ``sweep``, ``compare``), so the lists stay lists.
"""

from __future__ import annotations

import json
from typing import Any

SCHEMA_VERSION = 1


def versioned(doc: Any) -> Any:
    """``doc`` with ``schema_version`` first in it (or in each of its objects, for a list)."""
    if isinstance(doc, dict):
        return {"schema_version": SCHEMA_VERSION, **doc}
    if isinstance(doc, list):
        return [versioned(d) if isinstance(d, dict) else d for d in doc]
    return doc


def dumps(doc: Any, *, indent: int | None = 2) -> str:
    return json.dumps(versioned(doc), indent=indent, default=str)
