"""Calls shared with a forked child: the same results, in order, wherever each ran."""

from __future__ import annotations

import os
from functools import partial

import pytest

from simulator import api
from simulator.advice import forked

PARENT = os.getpid()
can_fork = pytest.mark.skipif(not hasattr(os, "sched_getaffinity")
                              or len(os.sched_getaffinity(0)) < 2,
                              reason="forks only on Linux with two cores or more")


@pytest.fixture
def allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(forked, "_allowed_pid", os.getpid())
    if not forked.may_fork():  # a thread another test left running: forking is refused
        pytest.skip("this test process runs more than one thread")


def _where(k: int) -> tuple[int, bool]:
    return k, os.getpid() == PARENT


@can_fork
def test_every_other_call_runs_in_a_child_and_the_results_keep_their_order(allowed: None
                                                                            ) -> None:
    out = forked.run_all([partial(_where, k) for k in range(5)])
    assert [k for k, _ in out] == [0, 1, 2, 3, 4]
    assert [here for _, here in out] == [False, True, False, True, False]


def test_a_process_not_allowed_to_fork_runs_every_call_here(
        monkeypatch: pytest.MonkeyPatch) -> None:
    for pid in (None, os.getpid() + 1):  # a library caller; a process forked from the program
        monkeypatch.setattr(forked, "_allowed_pid", pid)
        assert forked.run_all([partial(_where, k) for k in range(3)]) == [
            (0, True), (1, True), (2, True)]


def _fails_in_a_child(k: int) -> int:
    if os.getpid() != PARENT:
        raise RuntimeError("only in the child")
    return k


@can_fork
def test_a_child_that_fails_has_its_share_run_here(allowed: None) -> None:
    assert forked.run_all([partial(_fails_in_a_child, k) for k in range(4)]) == [0, 1, 2, 3]


def _fails_here(k: int) -> int:
    if os.getpid() == PARENT and k == 1:
        raise ValueError("bad input")
    return k


@can_fork
def test_an_error_here_is_raised_and_leaves_no_child_behind(
        allowed: None, monkeypatch: pytest.MonkeyPatch) -> None:
    children: list[int] = []
    fork = os.fork

    def recorded() -> int:
        pid = fork()
        if pid:
            children.append(pid)
        return pid

    monkeypatch.setattr(os, "fork", recorded)
    with pytest.raises(ValueError, match="bad input"):
        forked.run_all([partial(_fails_here, k) for k in range(2)])
    assert len(children) == 1
    with pytest.raises(ChildProcessError):  # the child was reaped
        os.waitpid(children[0], os.WNOHANG)


@can_fork
@pytest.mark.parametrize(("topology", "workload", "strategy"), [
    ("8x5090-switch", "gpt2-medium", "ddp"), ("2x5090", "llama3.2-1b", "tp")])
def test_ranges_computed_on_two_cores_are_the_ones_computed_on_one(
        monkeypatch: pytest.MonkeyPatch, topology: str, workload: str, strategy: str) -> None:
    spec = api.RunSpec(topology, workload, strategy)  # type: ignore[arg-type]
    monkeypatch.setattr(forked, "_allowed_pid", None)
    one = api.simulate(spec, ranges=True).report
    api.clear_caches()
    monkeypatch.setattr(forked, "_allowed_pid", os.getpid())
    if not forked.may_fork():
        pytest.skip("this test process runs more than one thread")
    two = api.simulate(spec, ranges=True).report
    assert two == one and "scaling_efficiency_range" in one
    assert len(one["range_basis"]["width_share"]) == 2  # slow, fast, two alone, two one-GPU
