"""Run per-rank `Program`s on a machine in SimPy and record what each stream did (a `Timeline`).

What is inside: one SimPy process per stream of each program, running that stream's tasks in
issue order, each task starting once its dependencies are done. A program stands for a group
of identical ranks: it is simulated once and its spans stand for every rank of the group
(symmetric data parallelism stays one program, as fast as one GPU). All traffic goes onto ONE
shared `fabric.Fabric` built from the machine's link capacities, so whatever runs at the same
time (all groups of a TP collective, an all-gather beside a reduce-scatter, offload copies
beside SHM collectives) shares links.

Programs meet at communication, matched by key (`program.py`): a collective starts once every
program that takes part has launched it, so the slowest rank sets its pace (the others' NCCL
kernels wait, holding their SMs, as NCCL's do); a point-to-point transfer moves once its
sender's and its receiver's batch have both started. A `Repeat` replays a unit already
simulated: the same idle-to-idle work takes the same time, so a long gradient accumulation
costs one micro-step of simulation (its spans and link samples are copied, shifted, up to
``MAX_REPLAYED_SPANS``; beyond that the repeat is one span and the links get its mean rates).

Assumptions, stated:
- A compute task is a fixed amount of work (its duration on an idle GPU). While NCCL kernels
  run on the GPU they hold one SM per channel (NCCL runs one thread block per channel,
  domain-model 2.2, `src/enqueue.cc`), so compute runs at rate ``1 - slowdown`` with
  ``slowdown = channels of the running NCCL kernels / gpu.sms`` (capped at 1); and they take
  the share of the memory bandwidth their plans give (``Planned.hbm_share``), which slows
  the task's memory-bound share ``m`` by ``1 / (1 - taken)``: rate
  ``(1 - slowdown) / ((1 - m) + m / (1 - taken))``. Pass
  ``compute_slowdown=x`` to use a fixed fraction ``x`` whenever any collective runs instead
  (0 turns interference off). The remaining work is re-timed whenever a kernel starts or
  ends. Copies (`Move`) use copy engines or the CPU and take no SMs. Concurrent compute
  streams do not slow each other (strategies use one).
- No model physics here: durations come from the program, every transfer's flow and the SMs
  its kernel holds from the ``Network`` the caller hands in (network.py).
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import simpy

from simulator.engine.clock import Clock
from simulator.engine.fabric import Fabric, UsageSample
from simulator.engine.program import Comm, Compute, Flow, Move, Program, Repeat, SendRecv, Task
from simulator.engine.timeline import LinkSample, Span, Timeline

if TYPE_CHECKING:
    from simulator.engine.network import Network, Planned

_EPS = 1e-15  # remaining work treated as done, relative to the clock (float round-off)
MAX_REPLAYED_SPANS = 100_000  # a repeat copies at most this many spans; beyond, one span


# the most of a GPU's memory bandwidth collectives are taken to leave compute (their kernels'
# shares are each at their lone rate; together they cannot take all of it)
MAX_HBM_SHARE = 0.9


class _Sms:
    """One program's GPU SMs and memory bandwidth: how fast compute runs given the NCCL
    kernels beside it."""

    def __init__(self, env: simpy.Environment, sms: int, fixed_slowdown: float | None) -> None:
        self.env = env
        self.sms = sms
        self.fixed = fixed_slowdown
        self.channels = 0  # NCCL channels (thread blocks, one SM each) running now
        self.running = 0  # NCCL kernels running now
        self.hbm = 0.0  # their shares of the memory bandwidth (the network's plans say)
        # the streams computing now: each is woken (interrupted) to re-time its kernel when
        # the rate changes, so a kernel that runs at one rate throughout waits on one timeout
        self.computing: dict[simpy.Process, None] = {}

    def rate(self, memory_share: float = 0.0) -> float:
        """Fraction of its idle speed that compute gets right now: the SMs left beside the
        NCCL kernels, and for the ``memory_share`` of the work that is bandwidth-bound, the
        memory bandwidth they leave (time / (1 - share taken))."""
        if self.running == 0:
            return 1.0
        if self.fixed is not None:
            return max(0.0, 1.0 - min(1.0, self.fixed))
        sm = max(0.0, 1.0 - min(1.0, self.channels / self.sms))
        left = 1.0 - min(MAX_HBM_SHARE, self.hbm)
        return sm / ((1.0 - memory_share) + memory_share / left)

    def comm(self, channels: int, delta: int, hbm: float = 0.0) -> None:
        self.channels += channels * delta
        self.running += delta
        self.hbm = self.hbm + hbm * delta if self.running else 0.0  # no float residue left
        for stream in self.computing:  # each registration is woken once, so an interrupt
            stream.interrupt()  # never reaches a stream that has moved on to other work
        self.computing.clear()


@dataclass(eq=False)  # a meeting is itself: equal only to itself
class _Meet:
    """Tasks of several programs that are one communication (or one repeat)."""

    expected: int
    ready: simpy.Event
    arrived: int = 0
    work: Any = None  # the collective / transfer / repeat they share
    plans: list[Any] = field(default_factory=list)
    flows: simpy.Event | None = None  # fires when the communication is over
    started: float = 0.0
    snapshot: tuple[float, list[float], int] | None = None  # repeat: (t0, link bytes, samples)
    unit_tasks: int = 0  # repeat: tasks in the largest unit


def _comm_keys(program: Program) -> list[tuple[Task, Comm, str]]:
    """(task, collective, key) of each collective; the default key is its name and
    occurrence."""
    seen: dict[str, int] = {}
    out = []
    for task in program.tasks:
        if isinstance(task.work, Comm):
            name = task.work.name
            seen[name] = seen.get(name, 0) + 1
            out.append((task, task.work, task.work.key or f"{name}#{seen[name]}"))
    return out


class _Run:
    """One simulation: the environment, the fabric, the meetings, and the spans so far."""

    def __init__(self, programs: Sequence[Program], network: Network,
                 slowdown: float | None, history: bool = True) -> None:
        self.programs = programs
        self.network = network
        self.env = Clock()
        self.capacity = network.capacities()
        self.fabric = Fabric(self.env, self.capacity, record_history=history)
        self.sms = [_Sms(self.env, network.sms(p.members[0]), slowdown) for p in programs]
        self.joined: dict[tuple[int, ...], tuple[list[Planned], list[Flow]]] = {}
        # per task: the event of its completion
        self.done = [{t.id: self.env.event() for t in p.tasks} for p in programs]
        self.spans: list[list[tuple[tuple[int, int, int], Span]]] = [[] for _ in programs]
        self.extra_bytes = [0.0] * len(self.fabric.link_ids)
        self.extra_samples: list[UsageSample] = []
        self.meets: dict[tuple[str, str], _Meet] = {}
        self.comm_key: list[dict[int, str]] = []
        self.unit_first: list[dict[int, tuple[str, str]]] = []
        self._index()

    # --- matching tasks of different programs ------------------------------------------

    def _meet(self, kind: str, key: str, work: Any) -> _Meet:
        meet = self.meets.get((kind, key))
        if meet is None:
            meet = self.meets[(kind, key)] = _Meet(0, self.env.event(), work=work)
        meet.expected += 1
        return meet

    def _index(self) -> None:
        members: dict[tuple[str, str], set[int]] = {}
        for p in self.programs:
            keys = {}
            for task, comm, key in _comm_keys(p):
                meet = self._meet("comm", key, comm)
                if (meet.work.op, meet.work.nbytes, meet.work.groups) != \
                        (comm.op, comm.nbytes, comm.groups):
                    raise ValueError(f"collective {key!r} differs between programs")
                members.setdefault(("comm", key), set()).update(p.members)
                keys[task.id] = key
            self.comm_key.append(keys)
            firsts = {}
            for task in p.tasks:
                if isinstance(task.work, SendRecv):
                    for transfer in (*task.work.sends, *task.work.recvs):
                        self._meet("p2p", transfer.key, transfer)
                elif isinstance(task.work, Repeat):
                    key = task.work.key or task.work.name
                    meet = self._meet("repeat", key, task.work)
                    if meet.work.times != task.work.times:
                        raise ValueError(f"repeat {key!r} differs between programs")
                    firsts[task.work.first] = ("repeat", key)
                    meet.unit_tasks = max(meet.unit_tasks, task.id - task.work.first)
            self.unit_first.append(firsts)
        for (kind, key), meet in self.meets.items():
            if kind == "p2p" and meet.expected != 2:
                raise ValueError(f"transfer {key!r} is listed {meet.expected} time(s); a sender "
                                 "and a receiver must list it once each")
            if kind == "comm":
                ranks = {r for g in meet.work.groups if len(g) > 1 for r in g}
                missing = ranks - members[(kind, key)]
                if missing:
                    raise ValueError(f"collective {key!r}: ranks {sorted(missing)} have no "
                                     "program that joins it")

    # --- running ------------------------------------------------------------------------

    def stream(self, p: int, tasks: list[Task]) -> Generator[simpy.Event, Any, None]:
        gpu = self.programs[p].members[0]
        done, unit_first, spans, env = self.done[p], self.unit_first[p], self.spans[p], self.env
        sms = self.sms[p]
        me = env.active_process  # this stream's process: what an SM change interrupts
        assert me is not None
        for task in tasks:
            tid = task.id
            pending = [done[d] for d in task.deps if not done[d].triggered]
            if pending:
                yield env.all_of(pending)
            if tid in unit_first:
                self._unit_starts(self.meets[unit_first[tid]])
            start = env.now
            work = task.work
            if isinstance(work, Compute):  # inline: it is most tasks (a generator each costs)
                remaining = work.duration
                began = start
                while remaining > _EPS * max(1.0, began):  # what is left is below the clock's
                    # resolution: done (waiting for it would not move the clock)
                    rate = sms.rate(work.memory_share)
                    sms.computing[me] = None
                    try:
                        # at a rate of zero only a change of rate (an interrupt) wakes it
                        yield env.timeout(remaining / rate) if rate > 0 else env.event()
                        del sms.computing[me]
                        break
                    except simpy.Interrupt:
                        pass
                    now = env.now
                    remaining -= (now - began) * rate
                    began = now
                args: dict[str, Any] = (
                    {"flops": work.flops, "idle_s": work.duration, "task": tid}
                    if work.block is None else
                    {"flops": work.flops, "idle_s": work.duration, "block": work.block,
                     "task": tid})
                spans.append(((tid, 0, 0), Span(gpu, task.stream, work.name, work.kind, start,
                                                env.now, args)))
            elif isinstance(work, Repeat):
                yield from self.repeat(p, task)
            else:
                kind: str
                if isinstance(work, Comm):
                    args = yield from self.collective(p, tid, work)
                    kind = work.op
                elif isinstance(work, SendRecv):
                    args = yield from self.sendrecv(p, work)
                    kind = "p2p"
                else:
                    assert isinstance(work, Move)
                    args = yield from self.move(work)
                    kind = work.kind
                args["task"] = tid
                start += args.get("wait_s", 0.0)  # a span shows the data moving, not the wait
                spans.append(((tid, 0, 0), Span(gpu, task.stream, work.name, kind, start,
                                                env.now, args)))
            done[tid].succeed()

    def _join(self, meet: _Meet, start: Any) -> None:
        """Count one arrival; the last one starts the communication (``start()``)."""
        meet.arrived += 1
        if meet.arrived == meet.expected:
            meet.started = self.env.now
            meet.flows = start()
            meet.ready.succeed()

    def _wait(self, meet: _Meet) -> Generator[simpy.Event, Any, None]:
        """Until every party has arrived and the communication is over."""
        if meet.flows is None:
            yield meet.ready
        assert meet.flows is not None
        yield meet.flows

    def collective(self, p: int, task_id: int, work: Comm
                   ) -> Generator[simpy.Event, Any, dict[str, Any]]:
        meet = self.meets[("comm", self.comm_key[p][task_id])]
        if not meet.plans:
            meet.plans = [self.network.collective(work.op, work.nbytes, g)
                          for g in work.groups if len(g) > 1]
        plans = meet.plans
        args: dict[str, Any] = {"bytes": work.nbytes, "ranks": len(work.groups[0]),
                                "groups": len(work.groups), **work.args}
        if not plans:  # a group of one rank moves nothing
            return args
        first = plans[0]
        args.update(algorithm=first.algorithm, protocol=first.protocol,
                    transport=first.transport, channels=first.n_channels)
        channels = max(q.n_channels for q in plans)
        hbm = max(q.hbm_share for q in plans)
        launched = self.env.now
        self.sms[p].comm(channels, +1, hbm)
        self._join(meet, lambda: self._start_groups(plans))
        yield from self._wait(meet)
        self.sms[p].comm(channels, -1, hbm)
        if meet.started > launched:
            args["wait_s"] = meet.started - launched
        return args

    def sendrecv(self, p: int, work: SendRecv) -> Generator[simpy.Event, Any, dict[str, Any]]:
        transfers = (*work.sends, *work.recvs)
        meets = [self.meets[("p2p", t.key)] for t in transfers]
        for meet, t in zip(meets, transfers, strict=True):
            if not meet.plans:
                meet.plans = [self.network.sendrecv(src, dst, t.nbytes)
                              for src, dst in t.pairs if src != dst]
        channels = max((q.n_channels for m in meets for q in m.plans), default=0)
        hbm = max((q.hbm_share for m in meets for q in m.plans), default=0.0)
        launched = self.env.now
        self.sms[p].comm(channels, +1, hbm)
        for meet in meets:  # a batch posts all its transfers at once (ncclGroupStart/End)
            self._join(meet, lambda plans=meet.plans: self.env.all_of(
                [self._start(q.flow) for q in plans]))
        for meet in meets:
            yield from self._wait(meet)
        self.sms[p].comm(channels, -1, hbm)
        args = {"bytes": sum(t.nbytes for t in transfers), "sends": len(work.sends),
                "recvs": len(work.recvs), **work.args}
        began = min((m.started for m in meets), default=launched)
        if began > launched:
            args["wait_s"] = began - launched
        return args

    def _start(self, flow: Flow) -> simpy.Event:
        return self.fabric.transfer(flow.usage, flow.nbytes, flow.max_rate, flow.latency)

    def _start_groups(self, plans: list[Planned]) -> simpy.Event:
        """Put every group of one call on the fabric; the event fires when all are done.

        Groups alike in all but which links they use (the same bytes, latency and rate cap, the
        same occupancies on links of the same capacities) that share no link run as ONE flow
        over all their links: each link still carries exactly its own group's bytes, and the
        groups advance together, as they do when nothing else treats them differently. A
        1,024-GPU box with TP 8 has 128 TP groups: one flow instead of 128 for the fabric to
        share. Where other traffic loads one group's links more than another's, the slowest
        group sets the pace of all (the program stands for every group and waits for the last
        anyway). How the groups join is worked out once per run and set of plans.
        """
        if any(len(p.flows) != 1 for p in plans):  # a flow per pair (all-to-all): each its own
            return self.env.all_of([self._start(f) for p in plans for f in p.flows])
        if len(plans) == 1:  # one group (data parallelism over every GPU): nothing to join
            return self.env.all_of([self._start(plans[0].flow)])
        return self.env.all_of([self._start(flow) for flow in self._joined(plans)])

    def _joined(self, plans: list[Planned]) -> list[Flow]:
        """One flow per batch of alike groups that share no link, in the order of their first
        group; kept by the plans' identities (with the plans, so an identity is not reused)."""
        key = tuple(id(p) for p in plans)
        known = self.joined.get(key)
        if known is not None:
            return known[1]
        batches: list[tuple[set[str], list[Flow]]] = []
        alike: dict[tuple[Any, ...], list[int]] = {}  # shape -> its batches
        for plan in plans:
            flow = plan.flow
            shape = (flow.nbytes, flow.latency, flow.max_rate,
                     tuple(sorted((w, self.capacity[lid]) for lid, w in flow.usage)))
            links = {lid for lid, _ in flow.usage}
            k = next((k for k in alike.get(shape, ()) if not batches[k][0] & links), None)
            if k is None:
                alike.setdefault(shape, []).append(len(batches))
                batches.append((links, [flow]))
            else:
                batches[k][0].update(links)
                batches[k][1].append(flow)
        flows = [replace(group[0], usage=tuple(pair for f in group for pair in f.usage))
                 for _, group in batches]
        self.joined[key] = (plans, flows)
        return flows

    def move(self, work: Move) -> Generator[simpy.Event, Any, dict[str, Any]]:
        yield self.env.all_of([self._start(f) for f in work.flows])
        return {"bytes": sum(f.nbytes for f in work.flows), **work.args}

    # --- repeats -----------------------------------------------------------------------

    def _unit_starts(self, meet: _Meet) -> None:
        if meet.snapshot is None:
            bytes_now = list(self.fabric.link_bytes.values())
            meet.snapshot = (self.env.now, bytes_now, len(self.fabric.history))

    def repeat(self, p: int, task: Task) -> Generator[simpy.Event, Any, None]:
        work = task.work
        assert isinstance(work, Repeat)
        meet = self.meets[("repeat", work.key or work.name)]
        self._join(meet, lambda: self._replay(meet, work))
        yield from self._wait(meet)
        assert meet.snapshot is not None
        period = meet.started - meet.snapshot[0]
        gpu = self.programs[p].members[0]
        if self._expand(meet):
            unit = [s for key, s in self.spans[p] if work.first <= key[0] < task.id]
            old = work.label.format(0) if work.label else ""
            for k in range(1, work.times + 1):
                new = work.label.format(k) if work.label else ""
                for s in unit:
                    name = new + s.name[len(old):] if old and s.name.startswith(old) else s.name
                    copy = replace(s, name=name, start=s.start + k * period,
                                   end=s.end + k * period, args={**s.args, "repeat": k})
                    self.spans[p].append(((task.id, k, s.args["task"]), copy))
            return
        args = {"times": work.times, "period_s": period, "unit_tasks": [work.first, task.id - 1],
                "task": task.id}
        self.spans[p].append(((task.id, 0, 0), Span(gpu, task.stream, work.name, "repeat",
                                                     meet.started, self.env.now, args)))

    def _expand(self, meet: _Meet) -> bool:
        """Whether the replayed iterations are copied span by span (else one span)."""
        return meet.work.times * meet.unit_tasks <= MAX_REPLAYED_SPANS

    def _replay(self, meet: _Meet, work: Repeat) -> simpy.Event:
        """Account the unit's traffic ``times`` more, and wait as long as those iterations."""
        if self.fabric.active_flows:
            raise RuntimeError(f"repeat {work.name!r}: its unit still has transfers running "
                               "when it ends; a repeated unit must end idle")
        assert meet.snapshot is not None
        t0, bytes0, first_sample = meet.snapshot
        t1 = self.env.now
        period = t1 - t0
        bytes1 = list(self.fabric.link_bytes.values())
        self.extra_bytes = [extra + (b1 - b0) * work.times for extra, b1, b0
                            in zip(self.extra_bytes, bytes1, bytes0, strict=True)]
        history = self.fabric.history
        inside = [s for s in history[first_sample:] if s.time < t1]
        idle = [s for s in history if s.time <= t1][-1:]  # the links as the unit leaves them
        if self._expand(meet):
            for k in range(1, work.times + 1):
                shift = k * period
                self.extra_samples += [UsageSample(t0 + shift, s.rates) for s in idle]
                self.extra_samples += [UsageSample(s.time + shift, s.rates) for s in inside]
        elif period > 0:
            self.extra_samples.append(UsageSample(t1, [(b1 - b0) / period for b1, b0
                                                       in zip(bytes1, bytes0, strict=True)]))
        self.extra_samples += [UsageSample(t1 + work.times * period, s.rates) for s in idle]
        return self.env.timeout(work.times * period)

    # --- results -----------------------------------------------------------------------

    def usage(self) -> list[LinkSample]:
        """The fabric's rate history (and the replayed one) as sparse samples."""
        ids = self.fabric.link_ids
        merged = sorted([(s.time, 0, i, s) for i, s in enumerate(self.fabric.history)]
                        + [(s.time, 1, i, s) for i, s in enumerate(self.extra_samples)],
                        key=lambda item: item[:3])
        out: list[LinkSample] = []
        for time, _, _, sample in merged:
            rates = sample.busy(ids)
            if out and out[-1].time == time:
                out[-1] = LinkSample(time, rates)
            else:
                out.append(LinkSample(time, rates))
        return out

    def link_bytes(self) -> dict[str, float]:
        carried = (b + extra for b, extra in zip(self.fabric.link_bytes.values(),
                                                  self.extra_bytes, strict=True))
        return {k: v for k, v in zip(self.fabric.link_ids, carried, strict=True) if v > 0}


def simulate(programs: Program | Sequence[Program], network: Network, *,
             compute_slowdown: float | None = None) -> Timeline:
    """Run the programs of every rank group on ``network`` (network.py); the same inputs give
    the same timeline.

    ``compute_slowdown``: None (default) slows compute by NCCL channels / SMs while
    collectives run; a number in [0, 1] is a fixed slowdown while any collective runs.
    """
    run = _ran(programs, network, compute_slowdown, history=True)
    progs = run.programs
    spans = [span for per in run.spans for _, span in sorted(per, key=lambda item: item[0])]
    step_time = max((s.end for s in spans), default=0.0)
    groups = () if len(progs) == 1 else tuple(p.members for p in progs)
    return Timeline(spans=spans, world=progs[0].world, step_time=step_time,
                    link_bytes=run.link_bytes(), link_capacity=run.capacity,
                    link_usage=run.usage(), meta=dict(progs[0].meta), groups=groups)


def step_time(programs: Program | Sequence[Program], network: Network, *,
              compute_slowdown: float | None = None) -> float:
    """``simulate(...).step_time`` alone: the same run, without the links' rate history and
    the timeline it would assemble (what a re-run that reads only the step's length needs)."""
    run = _ran(programs, network, compute_slowdown, history=False)
    return max((span.end for per in run.spans for _, span in per), default=0.0)


def _ran(programs: Program | Sequence[Program], network: Network,
         compute_slowdown: float | None, history: bool) -> _Run:
    """The programs run to their end (``history``: the fabric records its links' rates)."""
    if compute_slowdown is not None and not 0.0 <= compute_slowdown <= 1.0:
        raise ValueError(f"compute_slowdown must be in [0, 1], got {compute_slowdown}")
    progs = [programs] if isinstance(programs, Program) else list(programs)
    covered = [r for p in progs for r in p.members]
    if sorted(covered) != list(range(progs[0].world)):
        raise ValueError("the programs must stand for every rank exactly once")
    run = _Run(progs, network, compute_slowdown, history)
    for p, program in enumerate(progs):
        by_stream: dict[str, list[Task]] = {}
        for task in program.tasks:
            by_stream.setdefault(task.stream, []).append(task)
        for tasks in by_stream.values():
            run.env.process(run.stream(p, tasks))
    run.env.run()
    for p, program in enumerate(progs):
        stuck = [t.id for t in program.tasks if not run.done[p][t.id].triggered]
        if stuck:
            raise RuntimeError(f"program deadlocks: tasks {stuck[:5]} of the program for GPU "
                               f"{program.members[0]} never became ready")
    return run
