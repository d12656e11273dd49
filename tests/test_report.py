"""Step metrics: the `run --json` contract's keys and their definitions, on closed-form steps."""

from __future__ import annotations

import pytest

from simulator.engine.timeline import LinkSample, Span, Timeline
from simulator.outputs import report

MEMORY = {"peak_bytes": 10, "capacity_bytes": 20, "fits": True,
          "breakdown_bytes": {"weights": 1, "gradients": 2, "optimizer": 3, "activations": 4,
                              "other": 0}}


def step(buckets: bool = True) -> Timeline:
    """Backward 0-8 ms, two all-reduces 2-5 and 7-10 ms, optimizer 10-11 ms on 4 GPUs."""
    spans = [
        Span(0, "compute", "backward", "backward", 0.0, 0.008, {}),
        Span(0, "nccl", "bucket 0", "allreduce", 0.002, 0.005, {"task": 1, "bytes": 100}),
        Span(0, "nccl", "bucket 1", "allreduce", 0.007, 0.010, {"task": 2, "bytes": 50}),
        Span(0, "compute", "optimizer", "optimizer", 0.010, 0.011, {}),
    ]
    meta = {"strategy": "ddp"}
    if buckets:
        meta["buckets"] = [{"bytes": 100, "tensors": 3, "task": 1},
                           {"bytes": 50, "tensors": 2, "task": 2}]
    return Timeline(spans=spans, world=4, step_time=0.011,
                    link_bytes={"x->y": 0.0055e9, "y->x": 1.0},
                    link_capacity={"x->y": 1e9, "y->x": 1e9, "z->w": 1e9},
                    link_usage=[LinkSample(0.0, {})], meta=meta)


def make(timeline: Timeline, **kw: object) -> dict:
    args: dict = dict(tokens_per_step=4 * 1000, samples_per_step=4, model_flops_per_step=4.4e12,
                      peak_flops=1e15, memory=MEMORY, baseline_tokens_per_s=100_000.0)
    args.update(kw)
    return report.step_report(timeline, **args)


def test_every_contract_key_is_present_with_the_nested_shapes() -> None:
    r = make(step())
    assert set(report.CONTRACT_KEYS) <= set(r)
    assert set(r["memory"]) == set(report.MEMORY_KEYS)
    assert set(r["memory"]["breakdown_bytes"]) == set(report.BREAKDOWN_KEYS)
    assert {"link", "utilization"} <= set(r["bottleneck"])
    assert all(set(b) == {"bytes", "tensors", "start_s", "end_s"} for b in r["buckets"])


def test_time_split_counts_overlap_once_and_exposed_comm_only_without_compute() -> None:
    r = make(step())
    assert r["step_time_s"] == pytest.approx(0.011)
    assert r["compute_time_s"] == pytest.approx(0.009)
    assert r["comm_time_s"] == pytest.approx(0.006)
    assert r["exposed_comm_s"] == pytest.approx(0.002)  # 8-10 ms: comm, no compute


def test_throughput_mfu_and_scaling_efficiency() -> None:
    r = make(step())
    assert r["tokens_per_s"] == pytest.approx(4000 / 0.011)
    assert r["tokens_per_s_per_gpu"] == pytest.approx(1000 / 0.011)
    assert r["samples_per_s"] == pytest.approx(4 / 0.011)
    assert r["mfu"] == pytest.approx(4.4e12 / (0.011 * 4 * 1e15))
    assert r["scaling_efficiency"] == pytest.approx(1000 / 0.011 / 100_000)
    assert make(step(), baseline_tokens_per_s=None)["scaling_efficiency"] is None


def test_bottleneck_is_the_busiest_link_over_the_step() -> None:
    bn = make(step())["bottleneck"]
    assert bn["link"] == "x->y"
    assert bn["utilization"] == pytest.approx(0.5)  # 5.5 MB / (1 GB/s * 11 ms)
    assert bn["utilization_during_comm"] == pytest.approx(0.0055 / 0.006)


def test_buckets_in_launch_order_with_their_spans() -> None:
    r = make(step())
    assert [(b["bytes"], b["tensors"], b["start_s"], b["end_s"]) for b in r["buckets"]] == [
        (100, 3, 0.002, 0.005), (50, 2, 0.007, 0.010)]
    assert "buckets" not in make(step(buckets=False))


def test_cost_and_energy_blocks_pass_through_where_given() -> None:
    assert "cost" not in make(step()) and "energy" not in make(step())
    r = make(step(), cost={"usd_per_hour": 1.0}, cost_basis={"utilization": 1.0},
             energy={"joules_per_step": 5.0})
    assert r["cost"] == {"usd_per_hour": 1.0} and r["energy"] == {"joules_per_step": 5.0}
    assert r["cost_basis"] == {"utilization": 1.0}
