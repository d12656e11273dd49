"""Flow-level network in SimPy: directed links shared max-min fairly by concurrent flows.

A *flow* moves ``nbytes`` at a rate ``r`` (bytes/s of progress) and puts ``weight * r`` on
every link of its ``usage`` (bytes on that link per byte of progress: 2 for a ring that
crosses a link twice, more where a protocol sends flags with the data). Rates are
weighted max-min fair (progressive filling, Bertsekas & Gallager, *Data Networks*, 6.5.2):
all unfrozen flows grow at the same pace until a link fills or a flow reaches its own
``max_rate``; those flows freeze and the rest keep growing. Rates are recomputed only when
flows start (those of one instant together) or end, and only for the flows connected to them
through shared links: max-min fairness splits over the connected groups of flows (a flow's
rate depends only on flows it is linked to, directly or through others), so each group is
filled on its own, and a group the change does not touch keeps its rates. One SimPy timeout
waits for the next completion (a generation counter makes older timeouts no-ops). Each event
records every link's rate (the usage history). No packets, no queues: a link is a capacity.

Assumes capacities in bytes/s, times in seconds; the fabric knows nothing about NCCL.

>>> import simpy
>>> env = simpy.Environment()
>>> fabric = Fabric(env, {"a->b": 10.0})
>>> done = fabric.transfer({"a->b": 1.0}, nbytes=20.0)
>>> env.run(done); env.now
2.0
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field

import simpy

_EPS = 1e-9  # relative tolerance for "link full" and "flow finished"


@dataclass(eq=False, slots=True)  # a flow is itself: equal only to itself
class _Flow:
    """One flow in progress: the links it loads, bytes left, rate cap and rate."""

    links: tuple[int, ...]  # link indices
    weights: tuple[float, ...]  # bytes on each link per byte of progress
    remaining: float
    max_rate: float
    event: simpy.Event
    tag: Hashable | None
    rate: float = 0.0


@dataclass(eq=False)  # a sample is a moment: equal only to itself
class UsageSample:
    """From ``time`` until the next sample, link i carries ``rates[i]`` bytes/s."""

    time: float
    rates: list[float] = field(repr=False)

    def busy(self, link_ids: list[str]) -> dict[str, float]:
        """The links carrying something, by id, with their rates (in link order)."""
        return {k: r for k, r in zip(link_ids, self.rates, strict=True) if r > 0}


class Fabric:
    """Directed links of fixed capacity shared by flows; see the module docstring."""

    def __init__(self, env: simpy.Environment, capacities: Mapping[str, float],
                 *, record_history: bool = True) -> None:
        self.env = env
        self.link_ids: list[str] = list(capacities)
        self._index = {link: i for i, link in enumerate(self.link_ids)}
        self.capacity = [float(capacities[k]) for k in self.link_ids]
        if any(not c > 0 for c in self.capacity):
            raise ValueError("every link capacity must be positive")
        self._bytes = [0.0] * len(self.link_ids)
        self._flows: list[_Flow] = []  # active, in the order they started moving
        self._last_update = env.now
        self._generation = 0
        self._seeds: list[_Flow] = []  # flows whose groups are to be filled again
        self._flush_due = False
        self.record_history = record_history
        self._history: list[UsageSample] = []
        self.flows_started = 0

    # --- public -------------------------------------------------------------------------

    def transfer(self, usage: Mapping[str, float] | Sequence[tuple[str, float]],
                 nbytes: float, max_rate: float = math.inf, latency: float = 0.0,
                 tag: Hashable | None = None) -> simpy.Event:
        """Move ``nbytes`` over the links of ``usage`` (a mapping, or ``(link, weight)``
        pairs with each link once) after ``latency`` seconds.

        Returns an event that fires when the last byte has arrived.
        """
        if nbytes < 0 or latency < 0 or max_rate <= 0:
            raise ValueError("nbytes and latency must be >= 0, max_rate > 0")
        pairs = list(usage.items()) if isinstance(usage, Mapping) else list(usage)
        unknown = [k for k, _ in pairs if k not in self._index]
        if unknown:
            raise KeyError(f"unknown link(s) {unknown}")
        used = [(self._index[k], float(w)) for k, w in pairs if w > 0]
        flow = _Flow(tuple(i for i, _ in used), tuple(w for _, w in used), float(nbytes),
                     float(max_rate), self.env.event(), tag)
        self.flows_started += 1
        if latency > 0:
            self.env.timeout(latency).callbacks.append(lambda _ev: self._add(flow))
        else:
            self._add(flow)
        return flow.event

    def capacity_of(self, link: str) -> float:
        """A link's capacity, B/s."""
        return self.capacity[self._index[link]]

    @property
    def history(self) -> list[UsageSample]:
        """Every link's rate from each event on (with ``record_history``), the flows that
        started this instant filled first: read now, it is what the fabric carries now."""
        self._flush()
        return self._history

    @property
    def active_flows(self) -> int:
        """Flows moving bytes right now."""
        return len(self._flows)

    @property
    def link_bytes(self) -> dict[str, float]:
        """Bytes each link has carried so far (up to the last rate change)."""
        self._advance()
        return dict(zip(self.link_ids, self._bytes, strict=True))

    def utilization(self, start: float = 0.0, end: float | None = None) -> dict[str, float]:
        """Mean share of capacity used by each link over ``[start, end]`` (default: until now).

        Needs the usage history (``record_history=True``) unless the window starts at 0 and
        ends now, where the byte counters are enough.
        """
        end = self.env.now if end is None else end
        if end <= start:
            return dict.fromkeys(self.link_ids, 0.0)
        carried = self._bytes_between(start, end)
        return {k: c / (cap * (end - start))
                for k, c, cap in zip(self.link_ids, carried, self.capacity, strict=True)}

    def bottleneck(self, start: float = 0.0, end: float | None = None) -> tuple[str, float]:
        """The link with the highest mean utilisation over the window, and that utilisation."""
        util = self.utilization(start, end)
        link = max(self.link_ids, key=lambda k: util[k])
        return link, util[link]

    # --- internals ----------------------------------------------------------------------

    def _bytes_between(self, start: float, end: float) -> list[float]:
        self._advance()
        if start <= 0.0 and math.isclose(end, self.env.now):
            return self._bytes.copy()
        if not self.record_history:
            raise ValueError("utilisation over a window needs record_history=True")
        total = [0.0] * len(self.link_ids)
        samples = self.history
        for k, sample in enumerate(samples):
            t0 = max(sample.time, start)
            t1 = min(samples[k + 1].time if k + 1 < len(samples) else self.env.now, end)
            if t1 > t0:
                total = [t + r * (t1 - t0) for t, r in zip(total, sample.rates, strict=True)]
        return total

    def _sample(self) -> None:
        """Record every link's rate from now on (a later sample at this instant replaces it)."""
        rates = [0.0] * len(self.link_ids)
        for f in self._flows:
            for i, w in zip(f.links, f.weights, strict=True):
                rates[i] += w * f.rate
        sample = UsageSample(self.env.now, rates)
        if self._history and self._history[-1].time == self.env.now:
            self._history[-1] = sample
        else:
            self._history.append(sample)

    def _advance(self) -> None:
        """Account progress and link bytes since the last rate change."""
        dt = self.env.now - self._last_update
        if dt > 0:
            for f in self._flows:
                moved = f.rate * dt
                f.remaining -= moved
                for i, w in zip(f.links, f.weights, strict=True):
                    self._bytes[i] += w * moved
        self._last_update = self.env.now

    def _add(self, flow: _Flow) -> None:
        """A flow starts moving. Flows that start at one instant are filled together, once,
        after the events already due at that instant (``_flush``, a wait of zero): a
        collective's flows start together, and filling their growing group once per flow cost
        the square of their number. No time passes before the fill, so no byte moves at the
        old rates; flows that end meanwhile end now, as they would have."""
        self._advance()
        if flow.remaining <= 0 or (not flow.links and math.isinf(flow.max_rate)):
            flow.event.succeed()
            return
        self._flows.append(flow)
        self._seeds.append(flow)
        self._finish()
        self._generation += 1  # the wait set before this flow started no longer holds
        if not self._flush_due:
            self._flush_due = True
            self.env.timeout(0).callbacks.append(lambda _ev: self._flush())

    def _finish(self) -> None:
        """End the flows that are done; the flows they shared a link with (and everything
        linked to those) are to be filled again."""
        done = [f for f in self._flows if f.remaining <= _EPS * max(1.0, f.rate)]
        if not done:
            return
        self._flows = [f for f in self._flows if f.remaining > _EPS * max(1.0, f.rate)]
        freed: set[int] = set()  # the finished flows' links
        for f in done:
            f.event.succeed()
            freed.update(f.links)
        self._seeds += [f for f in self._flows if not freed.isdisjoint(f.links)]

    def _flush(self) -> None:
        """Fill the flows that started this instant (once: a later call finds none)."""
        if self._flush_due:
            self._flush_due = False
            self._reschedule()

    def _reschedule(self) -> None:
        """Finish flows that are done, recompute the fair rates of the flows linked to what
        changed (started or ended), wait for the next completion."""
        self._finish()
        for group in self._groups(self._seeds):
            self._fill(group)
        self._seeds = []
        if self.record_history:
            self._sample()
        self._generation += 1
        if not self._flows:
            return
        wait = min(f.remaining / f.rate for f in self._flows)
        generation = self._generation
        self.env.timeout(max(wait, 0.0)).callbacks.append(
            lambda _ev: self._on_timer(generation))

    def _on_timer(self, generation: int) -> None:
        if generation != self._generation:
            return  # a flow started or ended since: a newer timer is pending
        self._advance()
        self._reschedule()

    def _groups(self, seeds: list[_Flow]) -> list[list[_Flow]]:
        """The connected groups of active flows (sharing links, directly or through others)
        that hold a seed, each in the order the flows started moving."""
        groups = []
        outside = self._flows  # the flows no group holds yet, in the order they started
        for seed in seeds:
            if seed not in outside:  # finished, or in a group already
                continue
            members = {seed}  # flows are hashed by identity
            links = set(seed.links)  # the group's links so far
            grew = True
            while grew:
                grew = False
                for f in outside:
                    if f not in members and not links.isdisjoint(f.links):
                        members.add(f)
                        links.update(f.links)
                        grew = True
            groups.append([f for f in outside if f in members])
            outside = [f for f in outside if f not in members]
        return groups

    def _fill(self, flows: list[_Flow]) -> None:
        """Weighted max-min fair rates of one connected group of flows, by progressive
        filling: every growing flow gains the same step until a link is full or a flow
        reaches its cap; the flows on a full link, and those at their caps, stop growing."""
        links = sorted({i for f in flows for i in f.links})
        residual = {i: self.capacity[i] for i in links}
        for f in flows:
            f.rate = 0.0
        growing = flows
        while growing:
            load = dict.fromkeys(links, 0.0)  # bytes/s on each link per unit of step
            for f in growing:
                for i, w in zip(f.links, f.weights, strict=True):
                    load[i] += w
            loaded = [i for i in links if load[i] > 0]
            step = min([residual[i] / load[i] for i in loaded]
                       + [f.max_rate - f.rate for f in growing])
            if math.isinf(step):
                raise ValueError("a flow with no links needs a finite max_rate")
            step = max(step, 0.0)
            for f in growing:
                f.rate += step
            for i in loaded:
                residual[i] -= load[i] * step
            full = {i for i in loaded if residual[i] <= _EPS * self.capacity[i]}
            growing = [f for f in growing
                       if f.rate < f.max_rate * (1 - _EPS) and full.isdisjoint(f.links)]
