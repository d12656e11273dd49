"""Compute beside collectives, by transport and protocol (simulator/nccl/interference.py)."""

from __future__ import annotations

import pytest

from simulator.api import RunSpec, simulate
from simulator.catalog.gpus import achievable_memory_bandwidth
from simulator.nccl import interference
from simulator.nccl.communicator import load_communicator


def test_local_memory_bytes_per_byte_of_progress() -> None:
    # P2P: the peer's write into the receive buffer and its read (LL: 8 bytes per 4), plus a
    # reduction's input read and output write; SHM keeps its buffers in host memory
    assert interference.local_bytes("allreduce", "P2P", "Simple") == 4
    assert interference.local_bytes("allreduce", "P2P", "LL") == 6
    assert interference.local_bytes("allgather", "P2P", "Simple") == 3
    assert interference.local_bytes("allreduce", "SHM", "Simple") == 2
    assert interference.local_bytes("allgather", "SHM", "LL") == 1
    assert interference.local_bytes("allreduce", "P2P+SHM", "Simple") == 4


def test_a_plans_share_is_its_lone_rate_times_its_bytes_over_the_memory() -> None:
    comm = load_communicator("8xh100-nvswitch")
    plan = comm.plan("allreduce", 256 << 20)
    rate = interference.lone_rate(comm, plan.usage, plan.max_rate)
    memory = achievable_memory_bandwidth(comm.machine.gpu)
    assert plan.hbm_share == pytest.approx(rate * 4 / memory)
    shm = load_communicator("2x5090").plan("allreduce", 256 << 20)
    assert shm.transport == "SHM" and 0 < shm.hbm_share < plan.hbm_share / 5


def test_the_report_says_what_collectives_cost_compute() -> None:
    report = simulate(RunSpec("2x5090", "gpt2-medium", "ddp"), baseline=False).report
    info = report["interference"]
    assert info["transports"] == ["SHM"]
    assert 0 < info["share_of_compute"] < 0.05
    one = simulate(RunSpec("2x5090", "gpt2-medium", "ddp", gpus=1), baseline=False).report
    assert "interference" not in one
