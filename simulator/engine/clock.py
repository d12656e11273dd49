"""The SimPy clock the event loop (core.py) runs on: it refuses a wait it cannot represent."""

from __future__ import annotations

import math
from typing import Any

import simpy

from simulator.errors import InputError


class StalledClock(InputError):
    """A wait the simulated clock cannot represent: the step would never end."""


class Clock(simpy.Environment):
    """SimPy's environment, refusing a wait that would not move the clock forward.

    Once ``now + wait == now`` (a step so long that a wait is below the clock's float
    resolution) or the wait is not finite (a rate of zero or close to it), SimPy would spin
    on the same instant for ever; this turns it into one clear error instead. Only a
    timeout waits (every other SimPy event is scheduled at the current instant), so the
    check sits there rather than on every event.
    """

    def timeout(self, delay: float = 0, value: Any = None) -> simpy.Timeout:
        if delay != 0 and not delay < 0:  # a negative delay is Timeout's own error
            at = self._now + delay
            if not (math.isfinite(at) and at > self._now):
                raise StalledClock(_stall_message(self._now, delay))
        return simpy.Timeout(self, delay, value)


def _stall_message(now: float, delay: float) -> str:
    if not math.isfinite(delay) or not math.isfinite(now + delay):
        return (f"a transfer or kernel would never end (a wait of {delay:g} s at t = {now:g} s):"
                " a bandwidth or compute rate is too small for the work")
    return (f"the step is too long to simulate: at t = {now:.3g} s the clock cannot advance by "
            f"{delay:.3g} s (float resolution); the job asks for too much work per step "
            "(micro-batch, sequence length, model size) or a rate is too small")
