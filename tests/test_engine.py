"""The engine: closed-form timings, compute slowed by NCCL kernels, determinism, invariants.

A stand-in for NCCL (FakeNetwork) moves a collective's bytes as one flow over named links with
a given channel count, so every expected time below is a closed form.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator import engine
from simulator.engine.program import Comm, Compute, Flow, Program
from simulator.outputs.report import time_split


@dataclass(frozen=True)
class FakePlan:
    flow: Flow
    n_channels: int
    algorithm: str = "ring"
    protocol: str = "Simple"
    transport: str = "P2P"
    hbm_share: float = 0.0
    pairs: tuple[Flow, ...] = ()  # an all-to-all's flows, one per pair

    @property
    def flows(self) -> tuple[Flow, ...]:
        return self.pairs or (self.flow,)


class FakeNetwork:
    """The engine's Network (engine/network.py) in closed form: every collective moves its
    bytes once over every link, as one flow, with ``channels`` channels; a send moves its
    bytes over the link from its sender to its receiver on two."""

    def __init__(self, links: dict[str, float], sms: int = 100, channels: int = 10,
                 hbm: float = 0.0) -> None:
        self.links, self._sms, self.channels, self.hbm = links, sms, channels, hbm

    def capacities(self) -> dict[str, float]:
        return dict(self.links)

    def sms(self, rank: int) -> int:
        return self._sms

    def collective(self, op: str, nbytes: int, ranks: tuple[int, ...]) -> FakePlan:
        return FakePlan(Flow(tuple((k, 1.0) for k in self.links), nbytes), self.channels,
                        hbm_share=self.hbm)

    def sendrecv(self, src: int, dst: int, nbytes: int) -> FakePlan:
        return FakePlan(Flow(((f"g{src}->g{dst}", 1.0),), nbytes), 2)


def machine(bandwidth: float = 100.0, sms: int = 100) -> FakeNetwork:
    """Two GPUs joined by one link of ``bandwidth`` B/s."""
    return FakeNetwork({"g0->g1": bandwidth}, sms)


def comm(name: str, nbytes: int) -> Comm:
    return Comm(name, "allreduce", nbytes, ((0, 1),))


def test_single_compute_task_takes_its_duration() -> None:
    p = Program(world=2)
    p.add("compute", Compute("fwd", "forward", 1.5))
    t = engine.simulate(p, machine())
    assert t.step_time == pytest.approx(1.5)
    assert [(s.name, s.start, s.end) for s in t.spans] == [("fwd", 0.0, pytest.approx(1.5))]


def test_compute_beside_a_collective_runs_at_one_minus_channels_over_sms() -> None:
    # 50 B at 100 B/s: the collective runs 0.5 s with 10 channels of 100 SMs -> rate 0.9.
    p = Program(world=2)
    p.add("compute", Compute("bwd", "backward", 1.0))
    p.add("nccl", comm("bucket0", 50))
    t = engine.simulate(p, machine())
    bwd, ar = t.spans
    assert ar.end == pytest.approx(0.5)
    assert bwd.end == pytest.approx(0.5 + (1.0 - 0.5 * 0.9))


@pytest.mark.parametrize(("memory_share", "rate"), [(0.0, 0.9), (1.0, 0.45),
                                                    (0.5, 0.9 / 1.5)])
def test_the_memory_bound_share_slows_with_the_bandwidth_a_collective_takes(
        memory_share: float, rate: float) -> None:
    """10 of 100 SMs held; half the memory bandwidth taken: memory-bound work at half speed
    on the SMs left, compute-bound work at the SMs' 0.9."""
    p = Program(world=2)
    p.add("nccl", comm("ar", 1000))  # 10 s on a 100 B/s link
    p.add("compute", Compute("work", "backward", 1.0, memory_share=memory_share))
    t = engine.simulate(p, FakeNetwork({"g0->g1": 100.0}, 100, 10, hbm=0.5))
    (work,) = [s for s in t.spans if s.name == "work"]
    assert work.end - work.start == pytest.approx(1.0 / rate)


@pytest.mark.parametrize("slowdown, expected", [(0.0, 1.0), (0.5, 1.25), (1.0, 1.5)])
def test_fixed_slowdown_overrides_the_channel_rule(slowdown: float, expected: float) -> None:
    p = Program(world=2)
    p.add("compute", Compute("bwd", "backward", 1.0))
    p.add("nccl", comm("bucket0", 50))
    t = engine.simulate(p, machine(), compute_slowdown=slowdown)
    assert t.spans[0].end == pytest.approx(expected)


def test_back_to_back_collectives_re_time_a_kernel_at_each_change() -> None:
    # two 0.5 s collectives one after the other: the rate falls to 0.9 at 0, changes twice at
    # 0.5 (one ends, the next starts) and returns to 1 at 1.0; 1.0 s of work ends at 1.1
    p = Program(world=2)
    p.add("compute", Compute("bwd", "backward", 1.0))
    first = p.add("nccl", comm("bucket0", 50))
    p.add("nccl", comm("bucket1", 50), (first,))
    p.add("compute", Compute("opt", "optimizer", 0.25))
    t = engine.simulate(p, machine())
    span = {s.name: s for s in t.spans}
    assert (span["bucket0"].end, span["bucket1"].start, span["bucket1"].end) == \
        pytest.approx((0.5, 0.5, 1.0))
    assert span["bwd"].end == pytest.approx(1.0 + (1.0 - 1.0 * 0.9))
    # the next kernel starts and runs at full rate: no wake-up meant for the first reaches it
    assert (span["opt"].start, span["opt"].end) == pytest.approx((1.1, 1.35))


def test_a_collective_after_compute_starts_when_compute_ends() -> None:
    p = Program(world=2)
    c = p.add("compute", Compute("bwd", "backward", 0.3))
    p.add("nccl", comm("bucket0", 20), deps=(c,))
    t = engine.simulate(p, machine())
    assert t.spans[1].start == pytest.approx(0.3)
    assert t.step_time == pytest.approx(0.3 + 0.2)
    assert time_split(t)["exposed_comm_s"] == pytest.approx(0.2)


def test_concurrent_collectives_share_the_link() -> None:
    p = Program(world=2)
    p.add("allgather", comm("ag", 50))
    p.add("reducescatter", comm("rs", 50))
    t = engine.simulate(p, machine())
    assert [s.end for s in t.spans] == [pytest.approx(1.0), pytest.approx(1.0)]
    assert t.link_bytes["g0->g1"] == pytest.approx(100.0)


def test_every_group_of_a_collective_runs_at_once() -> None:
    p = Program(world=4)
    p.add("tp", Comm("tp0", "allreduce", 50, ((0, 1), (2, 3))))
    t = engine.simulate(p, machine())
    assert t.spans[0].end == pytest.approx(1.0)  # two groups' flows on the one link
    assert t.spans[0].args["groups"] == 2


class PairsNetwork(FakeNetwork):
    """An all-to-all as a flow per pair: a pair that shares no link ends first."""

    def collective(self, op: str, nbytes: int, ranks: tuple[int, ...]) -> FakePlan:
        pairs = (Flow((("a", 1.0),), nbytes), Flow((("a", 1.0),), nbytes),
                 Flow((("b", 1.0),), nbytes))
        return FakePlan(pairs[0], 1, "p2p", pairs=pairs)


def test_a_call_of_several_flows_ends_with_its_last() -> None:
    p = Program(world=2)
    p.add("ep", Comm("a2a", "alltoall", 50, ((0, 1),)))
    t = engine.simulate(p, PairsNetwork({"a": 100.0, "b": 100.0}))
    # two pairs share link a (50 B/s each for 1 s), the third has b to itself (0.5 s)
    assert t.step_time == pytest.approx(1.0)
    assert t.link_bytes == pytest.approx({"a": 100.0, "b": 50.0})


def test_tasks_on_a_stream_run_in_issue_order() -> None:
    p = Program(world=2)
    p.add("compute", Compute("a", "forward", 0.1))
    p.add("compute", Compute("b", "forward", 0.2))
    t = engine.simulate(p, machine())
    assert [(s.start, s.end) for s in t.spans] == [(0.0, pytest.approx(0.1)),
                                                    (pytest.approx(0.1), pytest.approx(0.3))]


def ddp_like(n_layers: int = 30) -> Program:
    p = Program(world=2)
    for i in range(n_layers):
        b = p.add("compute", Compute(f"bwd{i}", "backward", 0.01 * (1 + i % 3)))
        if i % 4 == 3:
            p.add("nccl", comm(f"bucket{i // 4}", 1 + 3 * i), deps=(b,))
    return p


def test_same_inputs_give_the_same_timeline() -> None:
    a = engine.simulate(ddp_like(), machine())
    b = engine.simulate(ddp_like(), machine())
    assert [(s.name, s.start, s.end, s.args) for s in a.spans] == \
        [(s.name, s.start, s.end, s.args) for s in b.spans]
    assert a.link_usage == b.link_usage


@st.composite
def programs(draw: st.DrawFn, compute_streams: tuple[str, ...] = ("compute",)) -> Program:
    p = Program(world=2)
    n = draw(st.integers(1, 12))
    for i in range(n):
        deps = tuple(sorted(draw(st.sets(st.integers(0, i - 1), max_size=2)))) if i else ()
        if draw(st.booleans()):
            p.add(draw(st.sampled_from(compute_streams)),
                  Compute(f"c{i}", "backward", draw(st.floats(0.01, 1.0))), deps)
        else:
            stream = draw(st.sampled_from(["nccl", "allgather"]))
            p.add(stream, comm(f"x{i}", draw(st.integers(1, 200))), deps)
    return p


@settings(max_examples=60, deadline=None)
@given(programs())
def test_a_step_is_never_shorter_than_its_compute_nor_its_exposed_comm(p: Program) -> None:
    t = engine.simulate(p, machine())
    idle_compute = sum(task.work.duration for task in p.tasks if isinstance(task.work, Compute))
    split = time_split(t)
    assert t.step_time >= idle_compute * (1 - 1e-9)
    assert t.step_time >= split["exposed_comm_s"] * (1 - 1e-9)
    assert t.step_time >= split["compute_time_s"] * (1 - 1e-9)


@settings(max_examples=60, deadline=None)
@given(programs(), st.floats(1.0, 10.0))
def test_more_link_bandwidth_never_makes_a_step_slower(p: Program, factor: float) -> None:
    slow = engine.simulate(p, machine(100.0)).step_time
    fast = engine.simulate(p, machine(100.0 * factor)).step_time
    assert fast <= slow * (1 + 1e-9)


@settings(max_examples=40, deadline=None)
@given(programs())
def test_spans_on_one_stream_never_overlap(p: Program) -> None:
    t = engine.simulate(p, machine())
    for stream in t.streams():
        spans = [s for s in t.spans if s.stream == stream]
        for a, b in zip(spans, spans[1:], strict=False):
            assert b.start >= a.end - 1e-12

