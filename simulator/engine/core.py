"""Run a `Program` on a machine in SimPy and record what each stream did (a `Timeline`).

What is inside: one SimPy process per stream, running that stream's tasks in issue order,
each task starting once its dependencies are done. Collectives go onto ONE shared
`fabric.Fabric` built from the machine's link capacities, so collectives that run at the same
time (all groups of a TP collective, an FSDP all-gather beside a reduce-scatter) share links.

Assumptions, stated:
- Ranks are symmetric: one program describes every GPU; spans are recorded once (gpu 0).
- A compute task is a fixed amount of work (its duration on an idle GPU). While NCCL kernels
  run on the GPU they hold one SM per channel (NCCL runs one thread block per channel,
  domain-model 2.2, `src/enqueue.cc`), so compute runs at rate ``1 - slowdown`` with
  ``slowdown = channels of the running collectives / gpu.sms`` (capped at 1). Pass
  ``compute_slowdown=x`` to use a fixed fraction ``x`` whenever any collective runs instead
  (0 turns interference off). The remaining work is re-timed whenever a collective starts or
  ends. Concurrent compute streams do not slow each other (strategies use one).
- No model physics here: durations come from the program, transfers from `collectives`.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import TYPE_CHECKING, Any

import simpy

from simulator.engine.fabric import Fabric
from simulator.engine.program import Comm, Compute, Program, Task
from simulator.engine.timeline import LinkSample, Span, Timeline
from simulator.machine import collectives

if TYPE_CHECKING:
    from simulator.machine.topology import Machine

_EPS = 1e-15  # seconds of remaining work treated as done (float round-off)


class _Sms:
    """The representative GPU's SMs: how fast compute runs given the NCCL kernels beside it."""

    def __init__(self, env: simpy.Environment, sms: int, fixed_slowdown: float | None) -> None:
        self.env = env
        self.sms = sms
        self.fixed = fixed_slowdown
        self.channels = 0  # NCCL channels (thread blocks, one SM each) running now
        self.running = 0  # collectives running now
        self.changed = env.event()  # fires (and is replaced) whenever the rate changes

    def rate(self) -> float:
        """Fraction of its idle speed that compute gets right now."""
        if self.running == 0:
            return 1.0
        slowdown = self.fixed if self.fixed is not None else self.channels / self.sms
        return max(0.0, 1.0 - min(1.0, slowdown))

    def comm(self, channels: int, delta: int) -> None:
        self.channels += channels * delta
        self.running += delta
        old, self.changed = self.changed, self.env.event()
        old.succeed()


class _Run:
    """One simulation: the environment, the fabric, and the spans recorded so far."""

    def __init__(self, program: Program, machine: Machine, slowdown: float | None) -> None:
        self.program = program
        self.machine = machine
        self.env = simpy.Environment()
        self.capacity = {lid: link.capacity for lid, link in machine.links.items()}
        self.fabric = Fabric(self.env, self.capacity)
        self.sms = _Sms(self.env, machine.gpu.sms, slowdown)
        self.done = {task.id: self.env.event() for task in program.tasks}
        self.spans: list[tuple[int, Span]] = []

    def stream(self, tasks: list[Task]) -> Generator[simpy.Event, Any, None]:
        for task in tasks:
            deps = [self.done[d] for d in task.deps if not self.done[d].processed]
            if deps:
                yield self.env.all_of(deps)
            start = self.env.now
            if isinstance(task.work, Compute):
                yield from self.compute(task.work)
                args: dict[str, Any] = {"flops": task.work.flops, "idle_s": task.work.duration}
                if task.work.block is not None:
                    args["block"] = task.work.block
                kind: str = task.work.kind
            else:
                args = yield from self.collective(task.work)
                kind = task.work.op
            args["task"] = task.id
            span = Span(0, task.stream, task.work.name, kind, start, self.env.now, args)
            self.spans.append((task.id, span))
            self.done[task.id].succeed()

    def compute(self, work: Compute) -> Generator[simpy.Event, Any, None]:
        remaining = work.duration
        while remaining > _EPS:
            rate, changed, began = self.sms.rate(), self.sms.changed, self.env.now
            if rate > 0:
                finish = self.env.timeout(remaining / rate)
                yield finish | changed
                if finish.processed:
                    return
            else:
                yield changed
            remaining -= (self.env.now - began) * rate

    def collective(self, work: Comm) -> Generator[simpy.Event, Any, dict[str, Any]]:
        # collectives.plan caches per machine: steps repeat the same sizes
        plans = [collectives.plan(self.machine, work.op, work.nbytes, g)
                 for g in work.groups if len(g) > 1]
        args: dict[str, Any] = {"bytes": work.nbytes, "ranks": len(work.groups[0]),
                                "groups": len(work.groups), **work.args}
        if not plans:  # a group of one rank moves nothing
            return args
        first = plans[0]
        args.update(algorithm=first.algorithm, protocol=first.protocol,
                    transport=first.transport, channels=first.n_channels)
        channels = max(p.n_channels for p in plans)
        self.sms.comm(channels, +1)
        yield self.env.all_of([collectives.start(self.env, self.fabric, p) for p in plans])
        self.sms.comm(channels, -1)
        return args

    def usage(self) -> list[LinkSample]:
        """The fabric's rate history as sparse samples."""
        ids = self.fabric.link_ids
        out: list[LinkSample] = []
        for sample in self.fabric.history:
            rates = {ids[i]: r for i, r in enumerate(sample.rates.tolist()) if r > 0}
            if out and out[-1].time == sample.time:
                out[-1] = LinkSample(sample.time, rates)
            else:
                out.append(LinkSample(sample.time, rates))
        return out


def simulate(program: Program, machine: Machine, *,
             compute_slowdown: float | None = None) -> Timeline:
    """Run `program` on `machine`; the same inputs always give the same timeline.

    ``compute_slowdown``: None (default) slows compute by NCCL channels / SMs while
    collectives run; a number in [0, 1] is a fixed slowdown while any collective runs.
    """
    if compute_slowdown is not None and not 0.0 <= compute_slowdown <= 1.0:
        raise ValueError(f"compute_slowdown must be in [0, 1], got {compute_slowdown}")
    run = _Run(program, machine, compute_slowdown)
    by_stream: dict[str, list[Task]] = {}
    for task in program.tasks:
        by_stream.setdefault(task.stream, []).append(task)
    for tasks in by_stream.values():
        run.env.process(run.stream(tasks))
    run.env.run()
    stuck = [t.id for t in program.tasks if not run.done[t.id].processed]
    if stuck:
        raise RuntimeError(f"program deadlocks: tasks {stuck[:5]} never became ready")
    spans = [span for _, span in sorted(run.spans, key=lambda item: item[0])]
    step_time = max((s.end for s in spans), default=0.0)
    return Timeline(spans=spans, world=program.world, step_time=step_time,
                    link_bytes={k: v for k, v in run.fabric.link_bytes.items() if v > 0},
                    link_capacity=run.capacity, link_usage=run.usage(),
                    meta=dict(program.meta))
