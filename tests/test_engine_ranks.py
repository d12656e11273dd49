"""Ranks that differ: programs per group of ranks, joined collectives, point-to-point
transfers, copies on the fabric and replayed micro-steps, on closed-form steps.

As in test_engine.py, a stand-in for NCCL moves every collective's (and every send's) bytes as
one flow over the machine's links, so expected times are closed forms.
"""

from __future__ import annotations

import pytest

from simulator import engine
from simulator.engine import core as engine_core
from simulator.engine.program import (
    Comm,
    Compute,
    Flow,
    Move,
    Program,
    Repeat,
    SendRecv,
    Transfer,
)
from simulator.outputs.report import rank_split, step_report, time_split
from tests.test_engine import FakeNetwork


def machine(world: int = 2, bandwidth: float = 100.0, sms: int = 100) -> FakeNetwork:
    """``world`` GPUs, a link of ``bandwidth`` B/s from each to each; no channels, so compute
    runs at full speed beside communication."""
    links = {f"g{a}->g{b}": bandwidth for a in range(world) for b in range(world) if a != b}
    return FakeNetwork(links, sms, channels=0)


def rank(r: int, world: int = 2) -> Program:
    return Program(world=world, ranks=(r,))


def test_the_slowest_rank_sets_the_pace_of_a_collective() -> None:
    fast, slow = rank(0), rank(1)
    for p, seconds in ((fast, 1.0), (slow, 2.0)):
        c = p.add("compute", Compute("backward", "backward", seconds))
        p.add("nccl", Comm("bucket0", "allreduce", 50, ((0, 1),)), (c,))
    t = engine.simulate([fast, slow], machine())
    # the all-reduce moves 50 B over g0->g1 and g1->g0 at 100 B/s once rank 1 is ready at 2 s
    assert t.step_time == pytest.approx(2.5)
    ar0 = [s for s in t.spans_of(0) if s.kind == "allreduce"][0]
    ar1 = [s for s in t.spans_of(1) if s.kind == "allreduce"][0]
    assert (ar0.start, ar0.end) == (pytest.approx(2.0), pytest.approx(2.5))
    assert ar0.args["wait_s"] == pytest.approx(1.0)  # launched at 1 s, peers ready at 2 s
    assert (ar1.start, "wait_s" in ar1.args) == (pytest.approx(2.0), False)
    assert t.groups == ((0,), (1,))
    assert [s["gpus"] for s in rank_split(t)] == [[0], [1]]
    # the pacing GPU is the one that computes longest
    assert time_split(t)["compute_time_s"] == pytest.approx(2.0)


def test_a_program_stands_for_every_rank_of_its_group() -> None:
    a, b = Program(world=4, ranks=(0, 1)), Program(world=4, ranks=(2, 3))
    a.add("compute", Compute("forward", "forward", 1.0))
    b.add("compute", Compute("forward", "forward", 3.0))
    t = engine.simulate([a, b], machine(4))
    assert [s.gpu for s in t.spans] == [0, 2]  # one span per group: representatives only
    per_gpu = [(s.gpu, s.duration) for s in t.spans_per_gpu()]
    assert per_gpu == [(0, 1.0), (1, 1.0), (2, 3.0), (3, 3.0)]
    report = step_report(t, tokens_per_step=1, samples_per_step=1, model_flops_per_step=1,
                         peak_flops=1, memory={"peak_bytes": 0, "capacity_bytes": 1,
                                               "fits": True, "breakdown_bytes": {}})
    assert report["ranks"][1] == {"gpus": [2, 3], "compute_time_s": 3.0, "comm_time_s": 0.0,
                                  "exposed_comm_s": 0.0}


def test_spans_of_a_gpu_are_its_groups_in_task_order_relabelled() -> None:
    a, b = Program(world=4, ranks=(0, 1)), Program(world=4, ranks=(2, 3))
    for name, seconds in (("f0", 1.0), ("f1", 2.0)):
        a.add("compute", Compute(name, "forward", seconds))
        b.add("compute", Compute(name, "forward", 2 * seconds))
    t = engine.simulate([a, b], machine(4))
    for gpu in range(4):
        rep = t.representative(gpu)
        expected = [(gpu, s.name, s.start, s.end) for s in t.spans if s.gpu == rep]
        assert [(s.gpu, s.name, s.start, s.end) for s in t.spans_of(gpu)] == expected
    assert [s.name for s in t.spans_of(3)] == ["f0", "f1"]


def test_programs_must_cover_every_rank_once_and_join_every_collective() -> None:
    with pytest.raises(ValueError, match="every rank exactly once"):
        engine.simulate([rank(0)], machine())
    a, b = rank(0), rank(1)
    a.add("nccl", Comm("bucket0", "allreduce", 50, ((0, 1),)))
    b.add("compute", Compute("backward", "backward", 1.0))
    with pytest.raises(ValueError, match=r"ranks \[1\] have no program"):
        engine.simulate([a, b], machine())


def test_a_send_moves_once_the_receiver_has_posted_its_receive() -> None:
    sender, receiver = rank(0), rank(1)
    f = sender.add("compute", Compute("forward", "forward", 1.0))
    act = Transfer("act0", ((0, 1),), 200)
    sender.add("p2p", SendRecv("send act0", sends=(act,)), (f,))
    busy = receiver.add("compute", Compute("other", "forward", 1.5))
    r = receiver.add("p2p", SendRecv("recv act0", recvs=(act,)), (busy,))
    receiver.add("compute", Compute("forward", "forward", 1.0), (r,))
    t = engine.simulate([sender, receiver], machine())
    send = [s for s in t.spans_of(0) if s.kind == "p2p"][0]
    recv = [s for s in t.spans_of(1) if s.kind == "p2p"][0]
    assert send.start == pytest.approx(1.5)  # posted at 1 s, moves once the receiver posts
    assert send.args["wait_s"] == pytest.approx(0.5)
    assert send.end == recv.end == pytest.approx(1.5 + 2.0)  # 200 B at 100 B/s from 1.5 s
    assert t.step_time == pytest.approx(4.5)
    assert t.link_bytes == {"g0->g1": pytest.approx(200.0)}


def test_a_batch_sends_and_receives_at_once_without_deadlock() -> None:
    # both stages post one batch holding a send to the other and a receive from it
    a, b = rank(0), rank(1)
    ab, ba = Transfer("ab", ((0, 1),), 100), Transfer("ba", ((1, 0),), 300)
    a.add("p2p", SendRecv("a", sends=(ab,), recvs=(ba,)))
    b.add("p2p", SendRecv("b", sends=(ba,), recvs=(ab,)))
    t = engine.simulate([a, b], machine())
    assert t.step_time == pytest.approx(3.0)  # opposite directions: each at the full 100 B/s


def test_a_transfer_listed_once_is_refused_and_a_cycle_of_waits_deadlocks() -> None:
    a, b = rank(0), rank(1)
    a.add("p2p", SendRecv("a", sends=(Transfer("lonely", ((0, 1),), 1),)))
    b.add("compute", Compute("x", "forward", 1.0))
    with pytest.raises(ValueError, match="listed 1 time"):
        engine.simulate([a, b], machine())
    a, b = rank(0), rank(1)
    ab, ba = Transfer("ab", ((0, 1),), 1), Transfer("ba", ((1, 0),), 1)
    a.add("p2p", SendRecv("recv first", recvs=(ba,)))
    a.add("p2p", SendRecv("then send", sends=(ab,)))
    b.add("p2p", SendRecv("recv first", recvs=(ab,)))
    b.add("p2p", SendRecv("then send", sends=(ba,)))
    with pytest.raises(RuntimeError, match="deadlocks"):
        engine.simulate([a, b], machine())


def test_copies_share_links_with_collectives_and_take_no_sms() -> None:
    p = Program(world=2)
    p.add("nccl", Comm("bucket0", "allreduce", 100, ((0, 1),)))
    p.add("offload", Move("grads to host", "d2h", (Flow((("g0->g1", 1.0),), 100.0),)))
    p.add("compute", Compute("backward", "backward", 1.0))
    t = engine.simulate(p, machine(sms=100))
    copy = [s for s in t.spans if s.kind == "d2h"][0]
    # the copy and the all-reduce halve g0->g1 until the copy ends at 2 s
    assert copy.end == pytest.approx(2.0)
    assert t.link_bytes["g0->g1"] == pytest.approx(200.0)
    assert copy.args["bytes"] == 100.0


def micro_steps(times: int, *, replay: bool, world: int = 2) -> Program:
    """Micro-steps of a forward, a backward and a gradient all-reduce, then an optimizer."""
    p = Program(world=world)
    last: tuple[int, ...] = ()
    built = 1 if replay else times + 1
    first = 0
    for k in range(built):
        first = len(p.tasks)
        f = p.add("compute", Compute(f"micro{k}.forward", "forward", 0.5), last)
        b = p.add("compute", Compute(f"micro{k}.backward", "backward", 1.0), (f,))
        c = p.add("nccl", Comm(f"micro{k}.allreduce", "allreduce", 50, ((0, 1),)), (f,))
        last = (b, c)
    if replay:
        last = (p.add("compute", Repeat("micro1-", first, times, "micro{}."), last),)
    p.add("compute", Compute("optimizer", "optimizer", 0.25), last)
    return p


@pytest.mark.parametrize("copy_limit", [10**6, 0])
def test_a_replayed_micro_step_gives_the_step_of_the_expanded_program(
        copy_limit: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine_core, "MAX_REPLAYED_SPANS", copy_limit)
    full = engine.simulate(micro_steps(6, replay=False), machine())
    replayed = engine.simulate(micro_steps(6, replay=True), machine())
    assert replayed.step_time == pytest.approx(full.step_time, rel=1e-12)
    assert replayed.link_bytes == pytest.approx(full.link_bytes, rel=1e-12)
    for key, value in time_split(full).items():
        assert time_split(replayed)[key] == pytest.approx(value, rel=1e-12)
    carried = {k: replayed.bytes_between(k, 0, replayed.step_time) for k in full.link_bytes}
    assert carried == pytest.approx(full.link_bytes, rel=1e-9)
    if copy_limit:  # spans copied: the same names and times as the expanded program's
        assert [s.name for s in replayed.spans] == [s.name for s in full.spans]
        assert [(s.start, s.end) for s in replayed.spans] == [
            (pytest.approx(s.start), pytest.approx(s.end)) for s in full.spans]
    else:  # one span stands for the replayed iterations
        [rep] = [s for s in replayed.spans if s.kind == "repeat"]
        assert rep.args["times"] == 6 and rep.duration == pytest.approx(6 * rep.args["period_s"])


def test_a_long_accumulation_costs_one_micro_step_of_simulation() -> None:
    replayed = engine.simulate(micro_steps(100_000, replay=True), machine())
    one = engine.simulate(micro_steps(0, replay=False), machine())
    period = one.step_time - 0.25
    assert replayed.step_time == pytest.approx(100_001 * period + 0.25, rel=1e-9)
    assert len(replayed.spans) < 10


def test_a_replayed_unit_must_end_with_its_transfers_done() -> None:
    p = Program(world=2)
    f = p.add("compute", Compute("micro0.forward", "forward", 0.1))
    p.add("nccl", Comm("micro0.allreduce", "allreduce", 1000, ((0, 1),)))
    p.add("compute", Repeat("again", 0, 3), (f,))  # waits for the forward only
    with pytest.raises(RuntimeError, match="must end idle"):
        engine.simulate(p, machine())
