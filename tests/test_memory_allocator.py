"""The caching allocator's idle blocks: the 16-bit logits the fp32 cross-entropy frees."""

from __future__ import annotations

from pathlib import Path

import pytest

from simulator.catalog.gpus import gpu
from simulator.inputs.config import load_workload
from simulator.job.workload import Job
from simulator.memory import allocator
from simulator.memory import estimate as memory

LORA = Path(__file__).resolve().parents[1] / "validation" / "workloads" / "fsdp-lora-llama2-7b.yaml"


def _report(**training: object) -> memory.MemoryReport:
    cfg = load_workload(str(LORA)).with_training(**training)
    return memory.estimate(Job.from_config(cfg), gpu("rtx4090"), "fsdp", world=2)


def test_idle_logits_are_the_16bit_logits_at_the_loss_backward() -> None:
    # fsdp_qlora's loop keeps the fp32 logits (transformers 4.38 upcasts in the model), so the
    # bf16 ones are freed and cached: 2 B x batch x context x vocab in the reserved counter at
    # the loss's backward, and in no other moment or counter
    r = _report(micro_batch=3, seq_len=1024)
    idle = 2 * 3 * 1024 * 32000
    def cached(moment: str) -> float:
        return r.counter_at("reserved", moment) - r.counter_at("allocated", moment) - sum(
            x.bytes for x in r.lines if x.pool == "cache" and memory.alive(x, moment))

    assert cached("loss_backward") == pytest.approx(idle, rel=1e-9)
    assert [cached(m) for m in ("backward", "backward_end", "step")] == pytest.approx([0] * 3,
                                                                         abs=1)
    # the allocator frees idle cached blocks before it reports out-of-memory: not in the verdict
    assert r.phase_total("loss_backward") == pytest.approx(
        r.counter_at("total", "loss_backward") - idle, rel=1e-9)


@pytest.mark.parametrize("training", [{"cross_entropy": "fused"}, {"cross_entropy": "chunked"},
                                      {"precision": "fp32"}])
def test_no_idle_logits_without_a_freed_16bit_copy(training: dict[str, object]) -> None:
    cfg = load_workload(str(LORA)).with_training(**training)
    assert allocator.idle_logit_bytes(Job.from_config(cfg)) == 0.0


def test_a_loop_that_keeps_the_16bit_output_keeps_the_block_allocated() -> None:
    # transformers >= 4.46 returns 16-bit logits: the kept output holds them, nothing is idle
    cfg = load_workload(str(LORA)).with_training(software={"torch": "2.5",
                                                           "transformers": "4.46"})
    job = Job.from_config(cfg)
    assert job.output_logit_bytes == 2
    assert allocator.idle_logit_bytes(job) == 0.0
    assert allocator.idle_logit_bytes(Job.from_config(cfg.with_training(keeps_output=False))) == 2
