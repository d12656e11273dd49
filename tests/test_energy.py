"""Energy of a step: compute at the power limit, communication at its SM share, idle, host."""

from __future__ import annotations

import pytest

from simulator import api
from simulator.engine.timeline import Span, Timeline
from simulator.outputs import energy


def step() -> Timeline:
    """Compute 0-8 ms, a collective 6-10 ms (2 ms exposed, 4 channels), idle 10-12 ms; 2 GPUs."""
    spans = [Span(0, "compute", "backward", "backward", 0.0, 0.008, {}),
             Span(0, "nccl", "bucket", "allreduce", 0.006, 0.010, {"channels": 4})]
    return Timeline(spans=spans, world=2, step_time=0.012, link_bytes={}, link_capacity={})


def test_one_gpu_in_closed_form() -> None:
    limit, sms = 500.0, 100
    idle = energy.IDLE_SHARE * limit
    expected = 0.008 * limit + 0.002 * (idle + 0.04 * (limit - idle)) + 0.002 * idle
    assert energy.gpu_joules(step(), 0, limit, sms) == pytest.approx(expected)


def test_step_energy_adds_the_host_and_the_power_supply_loss() -> None:
    machine = api.load_machine("2x5090")  # one socket, RTX 5090 at 575 W
    out = energy.step_energy(step(), machine, tokens_per_step=8192)
    gpus = 2 * energy.gpu_joules(step(), 0, 575.0, machine.gpu.sms)
    host = energy.HOST_W_PER_SOCKET * 0.012
    assert out["joules_per_step"] == pytest.approx((gpus + host) / energy.PSU_EFFICIENCY)
    assert out["avg_power_w"] == pytest.approx(out["joules_per_step"] / 0.012)
    assert out["kwh_per_million_tokens"] == pytest.approx(
        out["joules_per_step"] / 3.6e6 / 8192 * 1e6)


def test_a_busy_gpu_never_draws_more_than_its_limit() -> None:
    timeline = step()
    per_gpu = energy.gpu_joules(timeline, 0, 575.0, 170)
    assert per_gpu <= 575.0 * timeline.step_time
    assert per_gpu >= energy.IDLE_SHARE * 575.0 * timeline.step_time


def test_every_catalog_gpu_has_a_board_power_with_its_source() -> None:
    from simulator.catalog.gpus import GPUS

    assert all(g.tdp_w > 0 and " W" in g.source for g in GPUS.values())


def test_ranks_that_differ_are_counted_from_their_own_spans() -> None:
    """Two pipeline stages busy at different times: each GPU draws for its own 8 ms, not for
    the union of both stages' work."""
    spans = [Span(0, "compute", "fwd", "forward", 0.000, 0.008, {}),
             Span(1, "compute", "fwd", "forward", 0.004, 0.012, {})]
    timeline = Timeline(spans=spans, world=2, step_time=0.012, link_bytes={}, link_capacity={},
                        groups=((0,), (1,)))
    machine = api.load_machine("2x5090")
    out = energy.step_energy(timeline, machine, tokens_per_step=1)
    one = energy.gpu_joules(timeline, 0, 575.0, machine.gpu.sms)
    assert energy.gpu_joules(timeline, 1, 575.0, machine.gpu.sms) == pytest.approx(one)
    host = energy.HOST_W_PER_SOCKET * 0.012
    assert out["joules_per_step"] == pytest.approx((2 * one + host) / energy.PSU_EFFICIENCY)


def test_run_reports_energy_for_a_real_step() -> None:
    r = api.simulate(api.RunSpec("4x5090", "gpt2-medium", "ddp")).report
    e = r["energy"]
    assert set(e) == set(energy.ENERGY_KEYS)
    # four 575 W cards, mostly computing: between all-idle and all-at-the-limit, plus the host
    assert 4 * 0.2 * 575 < e["avg_power_w"] < (4 * 575 + energy.HOST_W_PER_SOCKET * 2) / 0.92
