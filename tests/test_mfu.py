"""MFU as people count it and HFU with the recompute (simulator/job/ops.py)."""

from __future__ import annotations

import pytest

from simulator.api import RunSpec, simulate
from simulator.inputs.config import load_workload
from simulator.job import ops
from simulator.job.workload import Job


def _job(name: str, **training: object) -> Job:
    cfg = load_workload(name)
    return Job.from_config(cfg.with_training(**training) if training else cfg)


def test_no_checkpointing_hardware_flops_are_model_flops() -> None:
    job = _job("llama2-7b", activation_checkpointing="none")
    assert job.hardware_flops_per_step() == job.model_flops_per_step()


def test_full_checkpointing_recomputes_a_third_of_the_blocks_model_flops() -> None:
    """Full recompute runs each block's forward again: 2 FLOPs per block weight per token and
    4*b*s^2*h of attention per layer, against 6 and 12 in the model count (Korthikanti et al.
    2022, section 6)."""
    job = _job("llama2-7b", activation_checkpointing="full")
    a, tokens = job.arch, job.tokens_per_micro_batch
    assert a is not None
    block_weights = sum(m.in_features * m.out_features for m in job.modules
                        if m.kind == "linear" and 0 <= m.block < a.layers)
    attention = 4.0 * job.micro_batch * job.seq_len ** 2 * a.hidden * a.layers
    expected = 2.0 * block_weights * tokens + attention
    assert ops.recompute_flops_per_micro_batch(job) == pytest.approx(expected, rel=1e-9)


def test_selective_recomputes_the_attention_alone() -> None:
    job = _job("llama2-7b", activation_checkpointing="selective")
    a = job.arch
    assert a is not None
    assert ops.recompute_flops_per_micro_batch(job) == pytest.approx(
        4.0 * job.micro_batch * job.seq_len ** 2 * a.hidden * a.layers)


def test_lora_counts_four_per_frozen_weight_and_says_so() -> None:
    job = _job("llama2-7b-lora")
    counted = ops.flops_counted(job)
    assert counted["short"].startswith("lora: 4N frozen + 6N adapters")
    full = _job("llama2-7b")
    assert ops.flops_counted(full)["short"] == "6N + attention"
    assert job.model_flops_per_step() < full.model_flops_per_step()


def test_the_report_names_both_figures() -> None:
    report = simulate(RunSpec("1x4090", "llama2-7b-qlora", "ddp"), baseline=False).report
    assert report["hfu"] > report["mfu"] > 0  # the recipe recomputes every block
    assert "frozen" in report["flops_counted"]["words"]
