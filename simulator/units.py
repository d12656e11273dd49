"""Units: one internal unit per quantity (seconds, bytes, bytes/s) and the parsers users expect.

Sizes read as nccl-tests reads them: K, M, G are powers of two (`8`, `64K`, `25M`, `8G`).
Bandwidth in files and JSON is GB/s = 1e9 bytes/s, as NCCL and nccl-tests print it.
Counts of things (tokens to train on) read with decimal suffixes, as model cards and papers
write them: ``500M``, ``1B``, ``2T``.
"""

import math
import re

from simulator.errors import InputError, cut, quoted

KiB = 1024
MiB = 1024**2
GiB = 1024**3
GB = 1e9  # bandwidth unit: 1 GB/s = 1e9 bytes/s (NCCL, nccl-tests)
US = 1e-6  # one microsecond in seconds

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?\s*$", re.IGNORECASE)
_SCALE = {"": 1, "K": KiB, "M": MiB, "G": GiB, "T": 1024**4}


def parse_size(text: str | int) -> int:
    """Parse a byte size the way nccl-tests does: ``parse_size("64K") == 65536``."""
    if isinstance(text, int):
        return text
    m = _SIZE.match(str(text))
    if not m:
        raise InputError(f"expected a size like 8, 64K, 25M or 8G, got {quoted(text)}")
    value = float(m.group(1)) * _SCALE[m.group(2).upper()]
    if not math.isfinite(value):  # more digits than a float holds: no size, and no traceback
        raise InputError(f"{quoted(text)} is too large a size")
    return int(value)


_COUNT = re.compile(r"^\s*(\d+(?:\.\d*)?(?:e\d+)?)\s*([KMBGT]?)\s*$", re.IGNORECASE)
# decimal, as "trained on 2T tokens" means (Llama 2 paper: 2.0T = 2e12); G is accepted for B
_COUNT_SCALE = {"": 1, "K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12}


def parse_count(text: str | int | float, flag: str = "count") -> int:
    """A decimal count with an optional suffix: ``parse_count("1B") == 10**9``, ``2T``, ``500M``."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value = float(text)
    else:
        m = _COUNT.match(str(text))
        if not m:
            raise InputError(f"{flag}: expected a count like 500M, 1B or 2T, got {quoted(text)}")
        value = float(m.group(1)) * _COUNT_SCALE[m.group(2).upper()]
    if value < 1:
        raise InputError(f"{flag}: must be at least 1, got {quoted(text)}")
    return round(value)


def format_size(nbytes: float) -> str:
    """Short human size in powers of two: ``format_size(25 * MiB) == '25M'``."""
    for unit, scale in (("G", GiB), ("M", MiB), ("K", KiB)):
        if nbytes >= scale:
            value = nbytes / scale
            return f"{value:.0f}{unit}" if value == int(value) else f"{value:.1f}{unit}"
    return f"{nbytes:.0f}"


def positive_int(text: str | None, flag: str, *, maximum: int | None = None) -> int | None:
    """A command-line count that must be >= 1 (and <= ``maximum``); None passes through."""
    if text is None:
        return None
    try:
        value = int(text)
    except ValueError:
        raise InputError(f"{flag}: expected a whole number, got {quoted(text)}") from None
    if value < 1:
        raise InputError(f"{flag}: must be at least 1, got {value}")
    if maximum is not None and value > maximum:
        raise InputError(f"{flag}: at most {maximum:,}, got {value:,} (docs/inputs.md: Limits)")
    return value


def positive_float(text: str | None, flag: str, *, minimum: float = 0.0,
                   maximum: float = math.inf) -> float | None:
    """A finite command-line quantity > 0 (and within the bounds); None passes through."""
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        raise InputError(f"{flag}: expected a number, got {quoted(text)}") from None
    if not math.isfinite(value):
        raise InputError(f"{flag}: expected a finite number, got {cut(text.strip())}")
    if value <= 0:
        raise InputError(f"{flag}: must be positive, got {value:g}")
    if not minimum <= value <= maximum:
        raise InputError(f"{flag}: must be between {minimum:g} and {maximum:g}, got {value:g}")
    return value


def fraction(text: str | None, flag: str) -> float | None:
    """A command-line share in [0, 1]; None passes through."""
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        raise InputError(f"{flag}: expected a number in [0, 1], got {quoted(text)}") from None
    if not 0.0 <= value <= 1.0:  # also refuses nan
        raise InputError(f"{flag}: must be in [0, 1], got {cut(text.strip())}")
    return value
