"""Groups of one collective call that are alike and share no link run as one fabric flow, with
the times and link bytes that one flow per group gives."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import simpy

from simulator import api
from simulator.engine import core
from simulator.inputs.config import load_topology
from simulator.machine.topology import Machine
from simulator.nccl.collectives import Plan
from simulator.nccl.communicator import Communicator
from simulator.strategies.tensor import place_groups

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("boxes", ROOT / "scripts" / "boxes.py")
assert _spec is not None and _spec.loader is not None
boxes = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(boxes)


def one_flow_per_group(run: core._Run, plans: list[Plan]) -> simpy.Event:
    """The engine's start of a call's groups without joining them: one flow each."""
    return run.env.all_of([run._start(p.flow) for p in plans])


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("box") / "nvswitch32.yaml"
    path.write_text(boxes.nvswitch(32))
    return str(path)


def _run(merge: bool, comm: Communicator, calls: list[list[Plan]]):  # noqa: ANN202
    """Start each call's groups (a list of plans) at t=0, joined as the engine joins them or
    one flow each; (finish time of each, link bytes, flows started)."""
    run = core._Run([], comm, None)
    finish: dict[int, float] = {}

    def watch(i, event):  # noqa: ANN001, ANN202
        yield event
        finish[i] = run.env.now

    for i, plans in enumerate(calls):
        started = run._start_groups(plans) if merge else one_flow_per_group(run, plans)
        run.env.process(watch(i, started))
    run.env.run()
    return finish, run.fabric.link_bytes, run.fabric.flows_started


def test_alike_disjoint_groups_are_one_flow_with_the_same_times(box: str) -> None:
    comm = Communicator(Machine.from_config(load_topology(box)))
    tp, dp = place_groups(comm.machine, 8)
    calls = [[comm.plan("allreduce", 64 << 20, g) for g in tp],
             [comm.plan("allgather", 256 << 20, g) for g in dp]]
    merged = _run(True, comm, calls)
    separate = _run(False, comm, calls)
    assert merged[0] == separate[0]
    assert merged[1] == pytest.approx(separate[1], rel=1e-12)
    assert (merged[2], separate[2]) == (2, len(tp) + len(dp))


def test_groups_that_share_links_stay_apart() -> None:
    comm = Communicator(Machine.from_config(load_topology("8x5090-dual-socket")))  # SHM
    plans = [comm.plan("allreduce", 1 << 20, g) for g in ((0, 1), (2, 3))]
    assert _run(True, comm, [plans])[2] == 2


def test_a_tp_step_is_the_same_with_one_flow_per_group(
        box: str, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = api.RunSpec(box, "llama2-7b", "tp+fsdp", tp=4)
    merged = api.simulate(spec, baseline=False).timeline
    api.clear_caches()
    monkeypatch.setattr(core._Run, "_start_groups", one_flow_per_group)
    separate = api.simulate(spec, baseline=False).timeline
    assert [(s.name, s.start, s.end) for s in merged.spans] == \
        [(s.name, s.start, s.end) for s in separate.spans]
    assert merged.link_bytes == pytest.approx(separate.link_bytes, rel=1e-12)
