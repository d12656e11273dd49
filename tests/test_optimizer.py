"""The optimizer step's kernels per implementation, and the states each keeps (optimizer.py)."""

from __future__ import annotations

import pytest

from simulator.catalog.gpus import gpu
from simulator.inputs.config import load_workload
from simulator.job import optimizer
from simulator.job.workload import Job
from simulator.memory import estimate as memory


def per_param(name: str, impl: str, p: int = 4, s: int = 4, clip: bool = False) -> float:
    kernels = optimizer.step_kernels(name, impl, 1e6, p, s, clip=clip, tensors=10)
    return sum(k.bytes for k in kernels) / 1e6


def test_foreach_adamw_makes_its_eight_passes() -> None:
    # torch/optim/adam.py _multi_tensor_adam: mul_ (p: 8), lerp_ (m, g -> m: 12), mul_ (v: 8),
    # addcmul_ (v, g, g -> v: 16), sqrt (v -> d: 8), div_ (8), add_ (8), addcdiv_ (p, m, d -> p: 16)
    assert per_param("adamw", "foreach") == 84
    kernels = optimizer.step_kernels("adamw", "foreach", 1e6, 4, 4, clip=False, tensors=10)
    assert len(kernels) == 8


def test_fused_adamw_reads_and_writes_each_tensor_once() -> None:
    assert per_param("adamw", "fused") == 28  # p, g, m, v in; p, m, v out
    assert per_param("adamw", "fused", p=2, s=2) == 14  # pure bf16
    assert per_param("adamw", "fused", clip=True) == 28 + 12  # clip: norm (4) + scale (8)


def test_composer_loop_launches_per_tensor() -> None:
    kernels = optimizer.step_kernels("adamw", "loop", 1e6, 4, 4, clip=False, tensors=10)
    assert len(kernels) == 9 * 10 and sum(k.bytes for k in kernels) == pytest.approx(92e6)


def test_eight_bit_adamw_and_sgd() -> None:
    # bitsandbytes: p and g in, 1-byte m and v (and a scale per 256) in and out, p out
    assert per_param("adamw-8bit", "fused", p=2) == pytest.approx(3 * 2 + 4 * (1 + 4 / 256))
    assert per_param("sgd", "foreach") == 8 + 12 + 12  # momentum *=, += g, p -= lr * m
    assert optimizer.states("adamw-8bit", "fused", 4).bytes_per_param == pytest.approx(2.03125)


def test_foreach_keeps_a_denominator_for_the_step_fused_does_not() -> None:
    assert optimizer.states("adamw", "foreach", 4).step_temporary_per_param == 4
    assert optimizer.states("adamw", "fused", 4).step_temporary_per_param == 0


def test_pure_bf16_states_are_eight_bytes_a_parameter() -> None:
    cfg = load_workload("llama3.2-1b").with_training(precision="pure-bf16")
    job = Job.from_config(cfg)
    r = memory.estimate(job, gpu("a100-sxm4-80gb"), "ddp", world=1)
    assert r.model_state_bytes == pytest.approx(8 * job.n_params, abs=4)
    eight_bit = Job.from_config(cfg.with_training(optimizer="adamw-8bit"))
    r8 = memory.estimate(eight_bit, gpu("a100-sxm4-80gb"), "ddp", world=1)
    assert r8.model_state_bytes == pytest.approx((4 + 2.03125) * job.n_params, rel=1e-6)
