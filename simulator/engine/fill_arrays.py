"""A large group's fill with numpy arrays: ``Fabric._fill``'s progressive filling, float for
float, vectorised over the group's flows and links.

A group of hundreds of flows on thousands of links (a 1,024-GPU PCIe tree's traffic through
host memory) costs Python's loops several times what the matrix costs numpy, so the fabric
hands such groups here, and numpy is imported only when one meets. The sums are numpy's own
reductions, whose order ``fabric._column_sums`` follows: both fills give the same rates to the
bit (tests/test_fabric.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol

import numpy as np

_EPS = 1e-9  # the fabric's tolerance for "link full" (engine/fabric.py)


class _Flow(Protocol):
    links: tuple[int, ...]
    weights: tuple[float, ...]
    max_rate: float


def fill(flows: Sequence[_Flow], capacity: Sequence[float]
         ) -> tuple[list[float], tuple[int, ...], list[float]]:
    """The group's rates in its order, its links in link order and what each carries."""
    links = np.fromiter((i for f in flows for i in f.links), dtype=np.intp)
    cols = np.unique(links)  # the group's links, in link order
    weights = np.zeros((len(flows), len(cols)))
    rows = np.repeat(np.arange(len(flows)), [len(f.links) for f in flows])
    weights[rows, np.searchsorted(cols, links)] = np.fromiter(
        (w for f in flows for w in f.weights), dtype=float)
    uses = weights > 0
    max_rate = np.array([f.max_rate for f in flows])
    capped = max_rate * (1 - _EPS)  # a flow this close to its cap is frozen
    rate = np.zeros(len(flows))
    group_capacity = np.array([capacity[i] for i in cols.tolist()])
    full_at = _EPS * group_capacity  # a link with this little left is full
    residual = group_capacity.copy()
    active = np.ones(len(flows), dtype=bool)
    while active.any():
        load = weights[active].sum(axis=0)  # link load per unit of common increment
        loaded = load > 0
        step = math.inf
        if loaded.any():
            step = float((residual[loaded] / load[loaded]).min())
        step = min(step, float((max_rate[active] - rate[active]).min()))
        if math.isinf(step):
            raise ValueError("a flow with no links needs a finite max_rate")
        step = max(step, 0.0)
        rate[active] += step
        residual -= load * step
        full = loaded & (residual <= full_at)
        frozen = uses[:, full].any(axis=1) | (rate >= capped)
        active &= ~frozen
    carried = np.zeros(len(cols))
    for row in range(len(flows)):
        carried += weights[row] * rate[row]  # 0 where the flow is not: adds nothing
    return rate.tolist(), tuple(cols.tolist()), carried.tolist()
