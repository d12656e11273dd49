"""Reports as flat CSV for scripts and spreadsheets: a header, then one row per point.

A report's nested keys become dotted column names (``memory.fits``,
``bottleneck.link``); a ``*_range`` pair becomes two columns, ``*_low`` and ``*_high``
(``step_time_s_range`` gives ``step_time_s_low``, ``step_time_s_high``); a list of numbers
or words is one cell joined by ``;``; a list of objects (DDP's buckets) is its length,
``buckets.count``. Cells keep full precision; booleans are ``true``/``false`` and a missing
value is empty, as in the JSON. The columns are the union over the rows, in first-seen order,
so points whose reports differ (a TP point has no buckets) share one header.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

Cell = str | int | float


def _cell(value: Any) -> Cell:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return value
    return str(value)


def _is_pair(value: Any) -> bool:
    return (isinstance(value, list | tuple) and len(value) == 2
            and all(isinstance(v, int | float) and not isinstance(v, bool) for v in value))


def flatten(doc: Mapping[str, Any], prefix: str = "") -> dict[str, Cell]:
    """``doc`` as one flat row (see the module docstring for the naming)."""
    row: dict[str, Cell] = {}
    for key, value in doc.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            row.update(flatten(value, f"{name}."))
        elif name.endswith("_range") and (_is_pair(value) or value is None):
            low, high = value if value is not None else (None, None)
            base = name.removesuffix("_range")
            row[f"{base}_low"], row[f"{base}_high"] = _cell(low), _cell(high)
        elif isinstance(value, list | tuple):
            if any(isinstance(v, Mapping) for v in value):
                row[f"{name}.count"] = len(value)
            else:
                row[name] = ";".join(str(_cell(v)) for v in value)
        else:
            row[name] = _cell(value)
    return row


def dumps(docs: Iterable[Mapping[str, Any]], *, first: Sequence[str] = ()) -> str:
    """The CSV text of ``docs``, one row each; ``first`` names columns to put leftmost."""
    rows = [flatten(d) for d in docs]
    columns = list(dict.fromkeys([*first, *(c for r in rows for c in r)]))
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=columns, restval="", lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()
