"""One flow alone on idle links, in closed form: exactly what ``Fabric`` computes for it (the
same arithmetic in the same order, so the same floats), without SimPy or numpy.

Alone, a flow's max-min fair rate is its narrowest link (capacity / weight) or its own cap;
it starts after its latency and ends when its bytes have moved. This is how `stepsim
collective` times each size (nccl-tests runs one collective at a time), so timing a
collective loads neither the event loop nor numpy. tests/test_lone_flow.py holds it equal to
the fabric.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

_EPS = 1e-9  # the fabric's tolerance for "flow finished" (engine/fabric.py)


def lone_flow(capacities: Mapping[str, float],
              usage: Mapping[str, float] | Sequence[tuple[str, float]], nbytes: float,
              max_rate: float = math.inf, latency: float = 0.0
              ) -> tuple[float, dict[str, float]]:
    """(when the last byte arrives, the bytes it put on each link it used) for a flow alone
    on links of ``capacities``; the arguments are ``Fabric.transfer``'s."""
    if nbytes < 0 or latency < 0 or max_rate <= 0:
        raise ValueError("nbytes and latency must be >= 0, max_rate > 0")
    pairs = list(usage.items()) if isinstance(usage, Mapping) else list(usage)
    unknown = [k for k, _ in pairs if k not in capacities]
    if unknown:
        raise KeyError(f"unknown link(s) {unknown}")
    used = [(k, float(w)) for k, w in pairs if w > 0]
    now = latency if latency > 0 else 0.0
    remaining = float(nbytes)
    carried: dict[str, float] = {}
    if remaining <= 0 or (not used and math.isinf(max_rate)) or remaining <= _EPS:
        return now, carried
    if used:
        widest = min(float(capacities[k]) / w for k, w in used)
        rate = max(min(widest, float(max_rate) - 0.0), 0.0)
    else:
        rate = float(max_rate)
    while True:  # once, unless rounding leaves more than the tolerance to move
        end = now + max(remaining / rate, 0.0)
        if end == now:
            return now, carried
        moved = rate * (end - now)
        remaining -= moved
        for k, w in used:
            carried[k] = carried.get(k, 0.0) + w * moved
        now = end
        if remaining <= _EPS * max(1.0, rate):
            return now, carried


def busiest(capacities: Mapping[str, float], carried: Mapping[str, float], seconds: float
            ) -> tuple[str, float]:
    """The link with the highest mean utilisation over [0, seconds], as
    ``Fabric.bottleneck`` picks it (the first in ``capacities`` order on a tie)."""
    if seconds <= 0:
        return next(iter(capacities)), 0.0
    util = {k: carried.get(k, 0.0) / (c * (seconds - 0.0)) for k, c in capacities.items()}
    link = max(util, key=util.__getitem__)
    return link, util[link]
