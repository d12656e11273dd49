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
filled on its own, and a group the change does not touch keeps its rates. A group's fill
depends only on its flows' routes and caps, so it is remembered: the same groups meet again
layer after layer. Routes (a usage's links and weights) are made once per distinct usage and
carry their links as an integer bit mask, so finding whether flows share a link is one AND.
One SimPy timeout waits for the next completion (a generation counter makes older timeouts
no-ops). Each event records every link's rate (the usage history); only the links of the
flows that changed are summed again. No packets, no queues: a link is a capacity.

Plain Python floats: a step's groups are mostly a few flows on a few dozen links (and
identical groups are one flow), where array code costs more in dispatch, and in importing
numpy, than it saves; only the large groups of machines with hundreds of GPUs are filled
with numpy's arrays (engine/fill_arrays.py). Every sum is taken in the order numpy's
reductions take it (``np.sum(axis=0)`` of the group's matrix adds its rows one after the
other, and a single column pairwise, ``_pairwise_sum``), so both fills, and this module before
it left numpy, give the same floats.

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
_FEW_LINKS = 64  # up to this many links, a usage sample's busy links are not remembered
_MAX_KEPT_RATES = 1 << 21  # link rates kept by _Readout, over all its vectors
_MAX_FILLS = 1 << 14  # remembered group fills (a step meets far fewer distinct groups)
_PAIRWISE_BLOCK = 128  # numpy's PW_BLOCKSIZE (loops_utils.h): blocks summed 8 lanes at a time
# A group of this many flows on this many (flow, link) pairs is filled with numpy's arrays
# (engine/fill_arrays.py): there the vectorised matrix costs a half to a quarter of Python's
# loops (timed on the fills of 1,024-GPU PCIe-tree runs: TP x FSDP, and 8 pipeline stages).
# Only machines of hundreds of GPUs meet such groups, and they meet many, which pays numpy's
# import; a few flows on long rings stay in Python.
_ARRAY_FILL_FLOWS = 16
_ARRAY_FILL_PAIRS = 1024


# a group's fill: its flows' rates in order, its links in link order, what each carries
_Filled = tuple[list[float], tuple[int, ...], list[float]]


@dataclass(eq=False)  # a route is itself: flows and fills recognise it by identity
class _Route:
    """A usage turned into what the filling needs, once per distinct usage."""

    links: tuple[int, ...]  # link indices, in the usage's order
    weights: tuple[float, ...]  # bytes on each link per byte of progress
    mask: int  # bit i set where the route uses link i: two routes share a link iff AND != 0
    widest: float  # the rate its thinnest link lets it reach alone (inf without links)
    arrays: object = None  # its links and weights as fill_arrays.py keeps them, once it has


@dataclass(eq=False, slots=True)  # a flow is itself: equal only to itself
class _Flow:
    """One flow in progress on its route: bytes left, rate cap, and the links it loads."""

    route: _Route
    links: tuple[int, ...]  # the route's, kept here for the per-event loops
    weights: tuple[float, ...]
    mask: int
    remaining: float
    max_rate: float
    event: simpy.Event
    tag: Hashable | None
    rate: float = 0.0


@dataclass(eq=False)  # a sample is a moment: equal only to itself
class UsageSample:
    """From ``time`` until the next sample, link i carries ``rates[i]`` bytes/s (a list
    no one changes once it is recorded: later samples that change a rate copy it)."""

    time: float
    rates: list[float] = field(repr=False)
    readout: _Readout | None = field(default=None, repr=False, compare=False)  # its fabric's

    def busy(self, link_ids: list[str]) -> dict[str, float]:
        """The links carrying something, by id, with their rates (in link order)."""
        if self.readout is not None and self.readout.link_ids is link_ids:
            return self.readout.busy(self.rates)
        return _busy(link_ids, self.rates)


def _busy(link_ids: list[str], rates: Sequence[float]) -> dict[str, float]:
    """The nonzero rates by link id, in link order."""
    return {k: r for k, r in zip(link_ids, rates, strict=True) if r > 0}


class _Readout:
    """Reads a fabric's samples by link id. A step puts the same few link loads on the
    fabric again and again (every layer's all-gather), so on a large machine the busy links
    of each distinct rate vector are kept, by its rates."""

    def __init__(self, link_ids: list[str]) -> None:
        self.link_ids = link_ids
        self._known: dict[tuple[float, ...], dict[str, float]] = {}
        self._limit = max(64, _MAX_KEPT_RATES // max(1, len(link_ids)))

    def busy(self, rates: list[float]) -> dict[str, float]:
        if len(rates) <= _FEW_LINKS:  # picking them again costs less than a key
            return _busy(self.link_ids, rates)
        key = tuple(rates)
        known = self._known.get(key)
        if known is None:
            if len(self._known) >= self._limit:
                self._known.clear()
            known = self._known[key] = _busy(self.link_ids, rates)
        return dict(known)  # the caller's own


def _pairwise_sum(values: list[float], start: int, n: int) -> float:
    """numpy's pairwise summation of ``values[start:start + n]`` (``pairwise_sum_DOUBLE``,
    numpy/_core/src/umath/loops_utils.h.src): short runs in order, blocks of up to 128 in
    eight interleaved partial sums, longer runs split in two at a multiple of eight."""
    if n < 8:
        total = 0.0
        for i in range(start, start + n):
            total += values[i]
        return total
    if n <= _PAIRWISE_BLOCK:
        lanes = values[start:start + 8]
        whole = n - n % 8  # the lanes take the whole blocks of eight, the rest is added after
        for block in range(start + 8, start + whole, 8):
            for j in range(8):
                lanes[j] += values[block + j]
        total = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + (
            (lanes[4] + lanes[5]) + (lanes[6] + lanes[7]))
        for i in range(start + whole, start + n):
            total += values[i]
        return total
    half = n // 2
    half -= half % 8
    return _pairwise_sum(values, start, half) + _pairwise_sum(values, start + half, n - half)


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
        # usage tuples already turned into routes, by identity: collectives start the same
        # cached plan many times per step; and every route by its content, so that alike
        # usages are one route and fills of alike groups are recognised
        self._compiled: dict[int, tuple[object, _Route]] = {}
        self._routes: dict[tuple[tuple[int, float], ...], _Route] = {}
        # fair rates of groups already filled, by their flows' (route, cap) in order: a fill
        # depends on nothing else, and the same groups meet again layer after layer
        self._fills: dict[tuple[tuple[_Route, float], ...], _Filled] = {}
        self._last_update = env.now
        self._generation = 0
        self._seeds: list[_Flow] = []  # flows whose groups are to be filled again
        self._done: list[_Flow] = []  # flows ended since the last sample
        self._flush_due = False
        self.record_history = record_history
        self._history: list[UsageSample] = []
        self._readout = _Readout(self.link_ids)
        self._rates = [0.0] * len(self.link_ids)  # every link's rate since the last change
        self._unchecked = False  # bytes left or rates changed since _finish last looked
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
        route = self._compile(usage)
        flow = _Flow(route, route.links, route.weights, route.mask, float(nbytes),
                     float(max_rate), self.env.event(), tag)
        self.flows_started += 1
        if latency > 0:
            self.env.timeout(latency).callbacks.append(lambda _ev: self._add(flow))
        else:
            self._add(flow)
        return flow.event

    def _compile(self, usage: Mapping[str, float] | Sequence[tuple[str, float]]) -> _Route:
        """The route of a usage: a tuple's is kept by identity, every route by content."""
        if isinstance(usage, tuple):
            known = self._compiled.get(id(usage))
            if known is not None and known[0] is usage:
                return known[1]
        pairs = list(usage.items()) if isinstance(usage, Mapping) else list(usage)
        unknown = [k for k, _ in pairs if k not in self._index]
        if unknown:
            raise KeyError(f"unknown link(s) {unknown}")
        used = tuple((self._index[k], float(w)) for k, w in pairs if w > 0)
        route = self._routes.get(used)
        if route is None:
            mask = 0
            for i, _ in used:
                mask |= 1 << i
            widest = min((self.capacity[i] / w for i, w in used), default=math.inf)
            route = self._routes[used] = _Route(tuple(i for i, _ in used),
                                                tuple(w for _, w in used), mask, widest)
        if isinstance(usage, tuple):
            self._compiled[id(usage)] = (usage, route)
        return route

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

    def _sample(self, done: list[_Flow], refilled: list[tuple[Sequence[int], Sequence[float]]]
                ) -> None:
        """Record every link's rate from now on. Only the links of finished flows and of
        refilled groups change: the others keep theirs, and a refilled group's links take
        the rates its fill summed (all the flows on a link are in one group)."""
        rates = self._rates
        if done or refilled:
            rates = rates.copy()
            for f in done:
                for i in f.links:
                    rates[i] = 0.0
            for links, link_rates in refilled:
                for i, r in zip(links, link_rates, strict=True):
                    rates[i] = r
            self._rates = rates
        sample = UsageSample(self.env.now, rates, self._readout)
        if self._history and self._history[-1].time == self.env.now:
            self._history[-1] = sample
        else:
            self._history.append(sample)

    def _advance(self) -> None:
        """Account progress and link bytes since the last rate change."""
        dt = self.env.now - self._last_update
        if dt > 0:
            carried = self._bytes
            for f in self._flows:
                moved = f.rate * dt
                f.remaining -= moved
                for i, w in zip(f.links, f.weights, strict=True):
                    carried[i] += w * moved
            self._unchecked = True
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
        if flow.remaining <= _EPS:  # so little that it is done as it starts (rate still 0)
            self._unchecked = True
        self._finish()
        self._generation += 1  # the wait set before this flow started no longer holds
        if not self._flush_due:
            self._flush_due = True
            self.env.timeout(0).callbacks.append(lambda _ev: self._flush())

    def _finish(self) -> None:
        """End the flows that are done; the flows they shared a link with (and everything
        linked to those) are to be filled again. Whether a flow is done changes only with
        its bytes left and its rate: unless one of them has changed since the last look, the
        look is skipped (the starts of one instant would each scan every flow)."""
        if not self._unchecked:
            return
        self._unchecked = False
        done = [f for f in self._flows if f.remaining <= _EPS * max(1.0, f.rate)]
        if not done:
            return
        self._flows = [f for f in self._flows if f.remaining > _EPS * max(1.0, f.rate)]
        freed = 0  # the finished flows' links, as a mask
        for f in done:
            f.event.succeed()
            freed |= f.mask
        self._seeds += [f for f in self._flows if f.mask & freed]
        self._done += done

    def _flush(self) -> None:
        """Fill the flows that started this instant (once: a later call finds none)."""
        if self._flush_due:
            self._flush_due = False
            self._reschedule()

    def _reschedule(self) -> None:
        """Finish flows that are done, recompute the fair rates of the flows linked to what
        changed (started or ended), wait for the next completion."""
        self._finish()
        seeds, done = self._seeds, self._done
        self._seeds, self._done = [], []
        # (a new flow that is done at once leaves its group empty)
        refilled = [self._assign_rates(group) for group in self._groups(seeds) if group]
        self._unchecked = True  # rates changed
        if self.record_history:
            self._sample(done, refilled)
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
        rest = self._flows  # the flows no group holds yet, in the order they started
        placed: set[_Flow] = set()  # flows are hashed by identity
        for seed in seeds:
            if seed in placed:
                continue
            links = seed.mask  # the group's links so far
            members = {seed}
            outside = [f for f in rest if f is not seed]
            grew = True
            while grew:
                grew = False
                unlinked = []
                for f in outside:
                    if f.mask & links:
                        members.add(f)
                        links |= f.mask
                        grew = True
                    else:
                        unlinked.append(f)
                outside = unlinked
            placed |= members
            groups.append([f for f in rest if f in members])
            rest = outside
        return groups

    def _assign_rates(self, flows: list[_Flow]) -> tuple[Sequence[int], Sequence[float]]:
        """Weighted max-min fair rates of one connected group of flows by progressive
        filling; returns the group's links and the rate each then carries."""
        if len(flows) == 1 and flows[0].links:  # filling ends at its first step
            f = flows[0]
            f.rate = max(min(f.route.widest, f.max_rate - 0.0), 0.0)
            return f.links, [w * f.rate for w in f.weights]
        key = tuple((f.route, f.max_rate) for f in flows)
        known = self._fills.get(key)
        if known is None:
            known = self._fill(flows)
            if len(self._fills) >= _MAX_FILLS:
                self._fills.clear()
            self._fills[key] = known
        rates, links, link_rates = known
        for f, r in zip(flows, rates, strict=True):
            f.rate = r
        return links, link_rates

    def _fill(self, flows: list[_Flow]) -> _Filled:
        """Progressive filling of the group: its rates in the group's order, its links in
        link order and what each carries (summed over the flows in order, as from zero)."""
        if (len(flows) >= _ARRAY_FILL_FLOWS
                and sum(len(f.links) for f in flows) >= _ARRAY_FILL_PAIRS):
            from simulator.engine.fill_arrays import fill
            return fill(flows, self.capacity)
        return self._fill_floats(flows)

    def _fill_floats(self, flows: list[_Flow]) -> _Filled:
        """``_fill`` in Python's floats. A link's load is summed over the flows on it alone,
        in the group's order: a flow off the link would add 0.0, which changes no sum, so this
        is the whole matrix's column sum (module docstring) at the cost of the links each flow
        really uses."""
        cols = tuple(sorted({i for f in flows for i in f.links}))  # the group's links
        column = {link: j for j, link in enumerate(cols)}
        users: list[list[tuple[int, float]]] = [[] for _ in cols]  # each link's (flow, weight)
        for k, f in enumerate(flows):
            for i, w in zip(f.links, f.weights, strict=True):
                users[column[i]].append((k, w))
        uses = [[column[i] for i in f.links] for f in flows]  # each flow's links
        max_rate = [f.max_rate for f in flows]
        capped = [r * (1 - _EPS) for r in max_rate]  # a flow this close to its cap is frozen
        rate = [0.0] * len(flows)
        capacity = [self.capacity[i] for i in cols]
        full_at = [_EPS * c for c in capacity]  # a link with this little left is full
        residual = capacity.copy()
        active = list(range(len(flows)))
        on = [u.copy() for u in users]  # each link's growing flows
        live = [j for j in range(len(cols)) if on[j]]  # links a growing flow still uses
        while active:
            if len(cols) == 1:  # one column: numpy summed it pairwise
                load = {0: 0.0 + _pairwise_sum([w for _, w in on[0]], 0, len(on[0]))}
            else:
                load = {}
                for j in live:
                    sum_ = 0.0
                    for _, w in on[j]:
                        sum_ += w
                    load[j] = sum_
            loaded = [j for j in live if load[j] > 0]  # per unit of common increment
            step = min((residual[j] / load[j] for j in loaded), default=math.inf)
            step = min(step, min(max_rate[k] - rate[k] for k in active))
            if math.isinf(step):
                raise ValueError("a flow with no links needs a finite max_rate")
            step = max(step, 0.0)
            for k in active:
                rate[k] += step
            for j in loaded:  # an unloaded link loses load * step = 0.0: nothing
                residual[j] = residual[j] - load[j] * step
            full = {j for j in loaded if residual[j] <= full_at[j]}
            frozen = {k for k in active
                      if rate[k] >= capped[k] or not full.isdisjoint(uses[k])}
            if frozen:
                active = [k for k in active if k not in frozen]
                for j in {j for k in frozen for j in uses[k]}:
                    on[j] = [(k, w) for k, w in on[j] if k not in frozen]
                live = [j for j in live if on[j]]
        carried = []
        for on_link in users:  # each link's flows in order, as from zero
            sum_ = 0.0
            for k, w in on_link:
                sum_ += w * rate[k]
            carried.append(sum_)
        return rate, cols, carried
