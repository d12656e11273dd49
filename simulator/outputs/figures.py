"""How figures are written, in the commands' text and the HTML report: three significant
digits, the range beside each.

A simulated figure is good to a few percent at best (docs/accuracy.md), so text shows three
significant digits and, where the report has one, its range: ``1.35 s (1.20-1.52)``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence


def seconds(value: float | None) -> str:
    """``1.35 s``, ``178 ms``, ``12.3 ms``, ``450 us``."""
    if value is None:
        return "-"
    if value >= 1:
        return f"{value:.3g} s"
    if value >= 1e-3:
        return f"{value * 1e3:.3g} ms"
    return f"{value * 1e6:.3g} us"


def _unit(value: float) -> str:
    return "s" if value >= 1 else "ms" if value >= 1e-3 else "us"


def ranged(text: str, bounds: Sequence[float] | None, fmt: Callable[[float], str]) -> str:
    """``text (low-high)`` when a range is known."""
    if not bounds:
        return text
    return f"{text} ({fmt(bounds[0])}-{fmt(bounds[1])})"


def seconds_ranged(value: float, bounds: Sequence[float] | None) -> str:
    """``178 ms (160-210)``; an end in another unit keeps its own: ``542 ms (458 ms-1.75 s)``."""
    if not bounds:
        return seconds(value)
    if all(_unit(b) == _unit(value) for b in bounds):
        return ranged(seconds(value), bounds, lambda x: seconds(x).rsplit(" ", 1)[0])
    return f"{seconds(value)} ({seconds(bounds[0])}-{seconds(bounds[1])})"


def count(value: float) -> str:
    """Tokens and samples: three significant digits with thousands separators."""
    return f"{float(f'{value:.3g}'):,.0f}" if value >= 100 else f"{value:.3g}"


def short_count(value: float) -> str:
    """Tokens in a narrow column: three significant digits, k or M: ``51.8k``, ``1.2M``."""
    for size, unit in ((1e6, "M"), (1e3, "k")):
        if value >= size:
            return f"{value / size:.3g}{unit}"
    return f"{value:.3g}"


def duration(value: float) -> str:
    """A whole run in the unit people plan in: minutes, hours or days."""
    if value < 3600:
        return f"{value / 60:.3g} min"
    if value < 2 * 86400:
        return f"{value / 3600:.3g} h"
    return f"{value / 86400:.3g} days"
