"""The rate-scale hook: one factor per mechanism, read by the collective and compute models."""

from __future__ import annotations

import pytest

from simulator import api
from simulator.job import compute
from simulator.machine.scales import RateScales
from simulator.nccl.communicator import Communicator
from simulator.nccl.perf import time_alone


def test_neutral_scales_change_nothing() -> None:
    machine = api.load_machine("8x5090-switch")
    same = machine.with_scales(RateScales())
    a = time_alone(Communicator(machine), "allreduce", 1 << 28)
    b = time_alone(Communicator(same), "allreduce", 1 << 28)
    assert a.time_us == pytest.approx(b.time_us)


@pytest.mark.parametrize(("topology", "mechanism"), [("8x5090-switch", "shm"),
                                                     ("8x5090-switch-p2p", "pcie_p2p"),
                                                     ("8xh100-nvswitch", "nvlink")])
def test_a_transport_factor_scales_its_plateau_bandwidth(topology: str, mechanism: str) -> None:
    machine = api.load_machine(topology)
    assert Communicator(machine).mechanism(0, 1) == mechanism
    base = time_alone(Communicator(machine), "allreduce", 1 << 32).busbw_gbps
    half = time_alone(Communicator(machine.with_scales(RateScales(**{mechanism: 0.5}))),
                                "allreduce", 1 << 32).busbw_gbps
    assert half == pytest.approx(base / 2, rel=0.02)  # bandwidth-bound: latency is tiny here
    other = "nvlink" if mechanism != "nvlink" else "shm"
    untouched = time_alone(Communicator(machine.with_scales(RateScales(**{other: 0.5}))),
                                     "allreduce", 1 << 32).busbw_gbps
    assert untouched == pytest.approx(base)


def test_the_compute_factor_scales_every_kernel() -> None:
    machine = api.load_machine("1x5090")
    job = api.load_job("gpt2-medium", None, None, None)
    op = job.forward_ops()[3]
    slow = machine.with_scales(RateScales(compute=0.5))
    assert compute.op_time(op, slow.gpu) == pytest.approx(2 * compute.op_time(op, machine.gpu))
    assert compute.memory_time(1e9, slow.gpu) == pytest.approx(
        2 * compute.memory_time(1e9, machine.gpu))


def test_a_scaled_machine_keeps_its_scales_when_cut_to_fewer_gpus() -> None:
    scaled = api.load_machine("8x5090-switch").with_scales(RateScales(shm=0.5))
    assert scaled.subset(4).scales == scaled.scales
    assert scaled.subset(4).gpu.rate_scale == 1.0


def test_scales_must_be_positive() -> None:
    with pytest.raises(ValueError):
        RateScales(compute=0.0)
