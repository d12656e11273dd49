"""Several flows started together on idle links, run to their end on a ``Fabric``: when the
last byte arrives and what each link carried. How ``stepsim collective`` times a call made of
many flows (an all-to-all's every pair, a gather's every sender), as ``lone_flow`` times one.

The flows share links max-min fairly and the shares change as flows end (a pair that shares
nothing ends first, and the others then take what it leaves): the fabric's own arithmetic, so
a training step and ``stepsim collective`` give one call the same time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import simpy

from simulator.engine.fabric import Fabric
from simulator.engine.program import Flow


def flows_alone(capacities: Mapping[str, float], flows: Sequence[Flow]
                ) -> tuple[float, dict[str, float]]:
    """(when the last flow ends, bytes carried per link) for ``flows`` started at time 0."""
    env = simpy.Environment()
    fabric = Fabric(env, capacities, record_history=False)
    events = [fabric.transfer(f.usage, f.nbytes, f.max_rate, f.latency) for f in flows]
    env.run(env.all_of(events))
    carried = {k: v for k, v in fabric.link_bytes.items() if v > 0}
    return float(env.now), carried
