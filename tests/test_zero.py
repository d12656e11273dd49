"""ZeRO-1/2 programs: gradient reduce-scatters in DeepSpeed's buckets, optimizer on the
local partition, all-gather of the updated 16-bit parameters."""

from __future__ import annotations

from functools import cache

import pytest

from simulator import engine
from simulator.engine.program import Comm, Program
from simulator.inputs.config import load_topology, load_workload
from simulator.job.workload import Job
from simulator.machine.topology import Machine
from simulator.nccl.communicator import Communicator
from simulator.strategies import StrategyOptions
from simulator.strategies import build as build_programs
from simulator.strategies.zero import REDUCE_BUCKET_ELEMENTS


def build(*args: object, **kwargs: object) -> Program:
    """The one program of a symmetric strategy (every rank alike)."""
    [program] = build_programs(*args, **kwargs)  # type: ignore[arg-type]
    return program


@cache
def machine() -> Machine:
    return Machine.from_config(load_topology("8x5090-dual-socket"))


@cache
def job(name: str = "llama3.2-1b") -> Job:
    return Job.from_config(load_workload(name), seq_len=512)


def comms(program: Program, op: str) -> list[Comm]:
    return [t.work for t in program.tasks if isinstance(t.work, Comm) and t.work.op == op]


@pytest.mark.parametrize("stage", ["zero1", "zero2"])
def test_bytes_reduced_and_gathered(stage: str) -> None:
    j = job()
    program = build(stage, j, machine(), StrategyOptions())
    assert sum(c.nbytes for c in comms(program, "reducescatter")) == 2 * j.n_trainable
    assert sum(c.nbytes for c in comms(program, "allgather")) == 2 * j.n_trainable
    buckets = comms(program, "reducescatter")
    assert len(buckets) == -(-j.n_trainable // REDUCE_BUCKET_ELEMENTS)  # 5e8-element buckets


def test_zero2_reduces_during_backward_zero1_after() -> None:
    j = job()
    for stage, during in (("zero1", False), ("zero2", True)):
        timeline = engine.simulate(build(stage, j, machine(), StrategyOptions()),
                                   Communicator(machine()))
        backward_end = max(s.end for s in timeline.spans if s.kind == "backward")
        first = min(s.start for s in timeline.spans if s.kind == "reducescatter")
        assert (first < backward_end) == during
        gather = min(s.start for s in timeline.spans if s.kind == "allgather")
        assert gather >= max(s.end for s in timeline.spans if s.kind == "optimizer") - 1e-12


def test_overlap_comm_is_not_slower() -> None:
    j = job()
    plain = engine.simulate(build("zero2", j, machine(), StrategyOptions()),
                            Communicator(machine()))
    overlapped = engine.simulate(build("zero2", j, machine(),
                                       StrategyOptions(zero_overlap_comm=True)),
                                 Communicator(machine()))
    assert overlapped.step_time <= plain.step_time + 1e-9
