"""A large group's fill with numpy arrays: ``Fabric._fill``'s progressive filling, float for
float, vectorised over the group's flows and links.

A group of hundreds of flows on thousands of links (a 1,024-GPU PCIe tree's traffic through
host memory) costs Python's loops several times what the matrix costs numpy, so the fabric
hands such groups here, and numpy is imported only when one meets. The sums are numpy's own
reductions, whose order the fabric's own fill follows: both give the same rates to the
bit (tests/test_fabric.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from simulator.engine.fabric import _EPS  # its tolerance for "link full" (loaded by then)


class _Route(Protocol):
    links: tuple[int, ...]
    weights: tuple[float, ...]
    arrays: Any  # this module's copy of the two, made when the route first meets it


class _Flow(Protocol):
    @property
    def route(self) -> _Route: ...
    @property
    def max_rate(self) -> float: ...


_capacity: tuple[Sequence[float], np.ndarray] | None = None  # the last fabric's, as an array


def _capacity_array(capacity: Sequence[float]) -> np.ndarray:
    global _capacity
    if _capacity is None or _capacity[0] is not capacity:
        _capacity = (capacity, np.array(capacity, dtype=float))
    return _capacity[1]


def _arrays(route: _Route) -> tuple[np.ndarray, np.ndarray]:
    if route.arrays is None:  # a route meets fill after fill: its arrays are made once
        route.arrays = (np.array(route.links, dtype=np.intp),
                        np.array(route.weights, dtype=float))
    return route.arrays  # type: ignore[no-any-return]


def fill(flows: Sequence[_Flow], capacity: Sequence[float]
         ) -> tuple[list[float], tuple[int, ...], list[float]]:
    """The group's rates in its order, its links in link order and what each carries."""
    routes = [_arrays(f.route) for f in flows]
    links = np.concatenate([route_links for route_links, _ in routes])
    all_capacity = _capacity_array(capacity)
    used = np.zeros(len(all_capacity), dtype=bool)
    used[links] = True
    cols = np.flatnonzero(used)  # the group's links, in link order
    weights = np.zeros((len(flows), len(cols)))
    rows = np.repeat(np.arange(len(flows)), [len(route_links) for route_links, _ in routes])
    weights[rows, np.cumsum(used)[links] - 1] = np.concatenate([w for _, w in routes])
    uses = weights > 0
    max_rate = np.array([f.max_rate for f in flows])
    capped = max_rate * (1 - _EPS)  # a flow this close to its cap is frozen
    rate = np.zeros(len(flows))
    group_capacity = all_capacity[cols]
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
