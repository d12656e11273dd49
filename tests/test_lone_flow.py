"""The closed form of one flow alone equals the fabric's simulation of it, float for float."""

import math

import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.engine.fabric import Fabric
from simulator.engine.lone_flow import busiest, lone_flow

# link capacities in B/s as machines have them (1.2 MB/s to 70 GB/s): with bytes up to 16 GiB a
# transfer ends within hours, where float seconds still resolve its last byte (far slower
# rates make the fabric's clock stall, which the engine's clock refuses: engine/core.py)
CAPACITIES = {"a": 1.0e7, "b": 25.0e9, "c": 3.3e8, "d": 7.0e10, "e": 1.2e6}


def simulated(usage, nbytes, max_rate, latency):  # noqa: ANN001, ANN201
    env = simpy.Environment()
    fabric = Fabric(env, CAPACITIES, record_history=False)
    done = fabric.transfer(usage, nbytes, max_rate, latency)
    for _ in range(10_000):  # bounded: a clock that could not advance would spin for ever
        if done.processed:
            break
        env.step()
    assert done.processed, "the fabric's clock stalled"
    carried = {k: b for k, b in fabric.link_bytes.items() if b}
    return env.now, carried, fabric


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(sorted(CAPACITIES)),
                       st.floats(1e-3, 8.0) | st.sampled_from([0.0, 1.0, 2.0, 0.25]),
                       max_size=5),
       st.floats(0.0, 2.0**34) | st.integers(0, 2**34).map(float),
       st.sampled_from([math.inf, 1.6e6, 4.5e9, 2.5e7]),
       st.sampled_from([0.0, 1e-6, 2.5e-5, 3.0]))
def test_lone_flow_is_the_fabric_alone(usage, nbytes, max_rate, latency):
    if not usage and math.isinf(max_rate) and nbytes > 0:
        usage = {"a": 1.0}  # the fabric refuses nothing else for a flow with no links
    seconds, carried = lone_flow(CAPACITIES, usage, nbytes, max_rate, latency)
    now, fabric_carried, fabric = simulated(usage, nbytes, max_rate, latency)
    assert seconds == now
    assert {k: v for k, v in carried.items() if v} == fabric_carried
    if usage and nbytes > 0:
        assert busiest(CAPACITIES, carried, seconds) == fabric.bottleneck()


def test_a_flow_goes_at_its_narrowest_link():
    seconds, carried = lone_flow({"x": 10.0, "y": 4.0}, {"x": 1.0, "y": 2.0}, 40.0,
                                 latency=1.0)
    assert seconds == 1.0 + 40.0 / 2.0  # y carries 2 bytes per byte: 2 B/s of progress
    assert carried == {"x": 40.0, "y": 80.0}
