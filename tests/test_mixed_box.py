"""A mixed box (node-level `gpu:`): each card times its own ops and holds its own memory, and
the slowest card paces every collective."""

from __future__ import annotations

import pytest

from simulator import engine, strategies
from simulator.inputs.config import load_topology, load_workload
from simulator.job.workload import Job
from simulator.machine.topology import Machine
from simulator.nccl.communicator import Communicator
from simulator.outputs.report import time_split

JOB = Job.from_config(load_workload("gpt2-medium").with_training(
    activation_checkpointing="full"), micro_batch=8)  # compute-heavy enough to see the cards


def box(cards: tuple[str, ...] | None = None) -> Machine:
    """The 2x5090-2x4090 preset, or the same box with the given card at every rank."""
    cfg = load_topology("2x5090-2x4090")
    if cards is not None:
        nodes = [n.copy(gpu=None) if n.kind == "gpu" else n
                 for n in cfg.nodes]
        cfg = cfg.copy(nodes=nodes, gpu=cfg.gpu.copy(base=cards[0]))
    return Machine.from_config(cfg)


def step(machine: Machine, strategy: str = "ddp") -> tuple[float, object]:
    timeline = engine.simulate(strategies.build(strategy, JOB, machine), Communicator(machine))
    return timeline.step_time, timeline


def test_node_gpu_sets_each_rank_s_card() -> None:
    m = box()
    assert [m.gpu_of(r).name for r in range(4)] == ["rtx5090", "rtx5090", "rtx4090", "rtx4090"]
    assert {card.name: ranks for card, ranks in m.cards().items()} == {
        "rtx5090": (0, 1), "rtx4090": (2, 3)}
    assert m.smallest_card().name == "rtx4090"
    programs = strategies.build("ddp", JOB, m)
    assert [p.ranks for p in programs] == [(0, 1), (2, 3)]


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_the_4090s_pace_the_step_of_a_mixed_box(strategy: str) -> None:
    mixed, timeline = step(box(), strategy)
    slow, _ = step(box(("rtx4090",)), strategy)
    fast, _ = step(box(("rtx5090",)), strategy)
    assert fast < 0.8 * mixed  # the 5090s alone are far faster
    # the 4090s set the pace; the mixed box keeps the 5090s' Gen5 links, so it is a little
    # faster than four 4090s, never slower
    assert 0.9 * slow <= mixed <= slow * (1 + 1e-9)
    split5090, split4090 = time_split(timeline, 0), time_split(timeline, 2)
    assert split5090["compute_time_s"] < 0.8 * split4090["compute_time_s"]
    # the 5090s' collectives wait for the 4090s (their NCCL kernels launched earlier)
    waits = [s.args.get("wait_s", 0.0) for s in timeline.spans_of(0) if s.is_comm]
    assert max(waits) > 0
    assert all("wait_s" not in s.args for s in timeline.spans_of(2) if s.is_comm)


def test_a_mixed_box_is_bought_and_powered_card_by_card() -> None:
    """Purchase: two 5090s and two 4090s at their own prices; power: each card at its own
    board limit (575 W and 450 W), so the box draws less than four 5090s would."""
    from simulator import api
    from simulator.catalog.gpus import GPUS

    mixed = api.simulate(api.RunSpec("2x5090-2x4090", "gpt2-medium", "ddp")).report
    price = 2 * GPUS["rtx5090"].price_usd + 2 * GPUS["rtx4090"].price_usd
    assert mixed["cost_basis"]["purchase_usd"] == pytest.approx(price)
    assert mixed["gpus_price_usd"] == pytest.approx(price)
    top = (2 * 575 + 2 * 450) / 0.92 + 1000  # every card at its limit, with a generous host
    assert mixed["energy"]["avg_power_w"] < top
