"""DDP programs: bucket order, gradient readiness, bytes, no_sync and the no-overlap variant."""

from __future__ import annotations

from functools import cache

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator import engine
from simulator.engine.program import Comm, Compute, Program, Repeat
from simulator.inputs.config import load_topology, load_workload
from simulator.inputs.schema import WorkloadConfig
from simulator.job.workload import Job
from simulator.machine.topology import Machine
from simulator.nccl.communicator import Communicator
from simulator.strategies import StrategyOptions
from simulator.strategies import build as build_programs
from simulator.strategies.buckets import MIB, bucket_plan, legacy_bucket_plan, size_limits
from simulator.strategies.ddp import plan_buckets


def build(*args: object, **kwargs: object) -> Program:
    """The one program of a symmetric strategy (every rank alike)."""
    [program] = build_programs(*args, **kwargs)  # type: ignore[arg-type]
    return program


@cache
def machine(name: str = "2x3090ti-nvlink") -> Machine:
    return Machine.from_config(load_topology(name))


def tiny(**training: object) -> Job:
    cfg = WorkloadConfig.from_data({
        "name": "tiny-llama",
        "model": {"family": "llama", "layers": 4, "hidden": 512, "heads": 8,
                  "ffn_hidden": 1408, "vocab": 16000},
        "training": {"seq_len": 256, "micro_batch": 2, "precision": "bf16",
                     "optimizer": "adamw", **training},
    })
    return Job.from_config(cfg)


def comms(program: Program) -> list[tuple[int, Comm]]:
    return [(t.id, t.work) for t in program.tasks if isinstance(t.work, Comm)]


def grad_bytes(job: Job) -> int:
    return 4 * sum(p.numel for p in job.params if p.trainable)


@pytest.mark.parametrize("bucket_mb", [None, 1, 5, 25, 400])
def test_bytes_all_reduced_equal_gradient_bytes(bucket_mb: float | None) -> None:
    job = tiny()
    program = build("ddp", job, machine(), StrategyOptions(bucket_mb=bucket_mb))
    assert sum(c.nbytes for _, c in comms(program)) == grad_bytes(job)
    bf16 = build("ddp", job, machine(), StrategyOptions(bucket_mb=bucket_mb,
                                                        grad_compression="bf16"))
    assert sum(c.nbytes for _, c in comms(bf16)) == grad_bytes(job) // 2


def test_lora_reduces_only_trainable_gradients() -> None:
    job = Job.from_config(load_workload("llama2-7b-lora"))
    program = build("ddp", job, machine(), StrategyOptions())
    assert sum(c.nbytes for _, c in comms(program)) == grad_bytes(job)
    assert grad_bytes(job) < 4 * job.n_params / 100


def test_buckets_launch_in_order_and_never_before_their_gradients() -> None:
    job = tiny()
    program = build("ddp", job, machine(), StrategyOptions(bucket_mb=1))
    timeline = engine.simulate(program, Communicator(machine()))
    buckets = program.meta["buckets"]
    assert len(buckets) >= 5
    by_task = {s.args["task"]: s for s in timeline.spans}
    starts = [by_task[b["task"]].start for b in buckets]
    assert starts == sorted(starts)
    assert [c.args["bucket"] for _, c in comms(program)] == list(range(len(buckets)))
    # when each parameter's gradient is complete: the end of the backward op listing it
    ready = {}
    for t in program.tasks:
        if isinstance(t.work, Compute) and t.work.kind == "backward":
            op = next(o for o in job.backward_ops() if o.name == t.work.name)
            for i in op.grads:
                ready[i] = by_task[t.id].end
    for b in buckets:
        assert by_task[b["task"]].start >= max(ready[i] for i in b["params"]) - 1e-12
    # overlap: the first bucket is reduced while backward still runs
    backward_end = max(s.end for s in timeline.spans if s.kind == "backward")
    assert starts[0] < backward_end


def test_steady_state_buckets_follow_ready_order_with_a_small_first_bucket() -> None:
    job = tiny()
    default = plan_buckets(job, job.backward_ops(), StrategyOptions())
    explicit = plan_buckets(job, job.backward_ops(), StrategyOptions(bucket_mb=25))
    names = [job.params[i].name for i in range(len(job.params)) if job.params[i].trainable]
    assert names[default[0].indices[0]] == "lm_head.weight"  # its gradient is ready first
    # lm_head alone is 31 MiB: it closes the 1 MiB first bucket and the 25 MiB one alike
    assert default[0].indices == explicit[0].indices == (len(names) - 1,)
    # after it, the default's limits are 25 MiB: identical plans for this model
    assert [b.indices for b in default] == [b.indices for b in explicit]
    assert size_limits(None) == [MIB, 25 * MIB] and size_limits(25) == [25 * MIB, 25 * MIB]


def test_legacy_reducer_keeps_the_construction_plan_small_bucket_last() -> None:
    # v1.4 distributed.py: [1 MiB, cap] over registration order, reversed; never rebuilt
    tensors = [("a", 100_000, 4, "fp32"), ("b", 100_000, 4, "fp32"), ("c", 3 << 20, 4, "fp32"),
               ("d", 3 << 20, 4, "fp32")]
    for cap in (1, 25):
        plan = legacy_bucket_plan(tensors, cap)
        assert plan[-1].indices == (0, 1, 2)  # 0.8 MB + the tensor that crosses 1 MiB
        assert plan[-1].size_limit == MIB
    assert [b.indices for b in legacy_bucket_plan(tensors, 1)] == [(3,), (0, 1, 2)]


def test_legacy_reducer_divides_each_bucket_before_its_all_reduce() -> None:
    job = tiny()
    options = StrategyOptions(bucket_mb=1, legacy_reducer=True)
    program = build("ddp", job, machine(), options)
    divs = [t for t in program.tasks if isinstance(t.work, Compute)
            and t.work.name.endswith(".div")]
    buckets = program.meta["buckets"]
    assert len(divs) == len(buckets) >= 5
    by_id = {t.id: t for t in program.tasks}
    div_of = {t.work.name: t.id for t in divs}
    for b, bucket in enumerate(buckets):  # the all-reduce waits on its own bucket's division
        assert div_of[f"ddp.bucket{b}.div"] in by_id[bucket["task"]].deps
    current = build("ddp", job, machine(), StrategyOptions(bucket_mb=1))
    assert not [t for t in current.tasks if t.work.name.endswith(".div")]


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.tuples(st.integers(1, 3 * 2**20), st.sampled_from(["fp32", "bf16"])),
                      min_size=1, max_size=40),
       cap=st.sampled_from([None, 0.5, 1, 5]), seed=st.randoms(use_true_random=False))
def test_bucket_plan_rules(sizes: list[tuple[int, str]], cap: float | None, seed: object) -> None:
    params = [(f"p{i}", n, 4 if d == "fp32" else 2, d) for i, (n, d) in enumerate(sizes)]
    order = list(range(len(params)))
    seed.shuffle(order)  # type: ignore[attr-defined]
    plan = bucket_plan(params, cap, order)
    flat = [i for b in plan for i in b.indices]
    assert sorted(flat) == list(range(len(params)))  # every tensor exactly once
    first, limit = size_limits(cap)
    seen: dict[str, int] = {}
    for b in plan:
        assert {params[i][3] for i in b.indices} == {b.dtype}
        assert b.bytes == sum(params[i][1] * params[i][2] for i in b.indices)
        expected = first if seen.get(b.dtype, 0) == 0 else limit
        seen[b.dtype] = seen.get(b.dtype, 0) + 1
        last_of_dtype = b is [x for x in plan if x.dtype == b.dtype][-1]
        if not last_of_dtype:  # closed: reached the limit, and only with its last tensor
            assert b.bytes >= expected
            assert b.bytes - params[b.indices[-1]][1] * params[b.indices[-1]][2] < expected
        # a bucket keeps the ready order
        assert list(b.indices) == sorted(b.indices, key=order.index)


def test_no_sync_reduces_only_on_the_last_micro_step() -> None:
    job = tiny()
    one = build("ddp", job, machine(), StrategyOptions(bucket_mb=5))
    four = build("ddp", job, machine(), StrategyOptions(bucket_mb=5, grad_accum=4))
    assert len(comms(four)) == len(comms(one))
    computes = [t for t in four.tasks if isinstance(t.work, Compute)]
    # micro0 and micro3 are built; micro1 and micro2 replay micro0
    assert sum(t.work.kind == "forward" for t in computes) == 2 * len(job.forward_ops())
    [replay] = [t.work for t in four.tasks if isinstance(t.work, Repeat)]
    assert replay.times == 2 and four.tasks[replay.first].work.name.startswith("micro0.")
    spans = engine.simulate(four, Communicator(machine())).spans
    assert sum(s.kind == "forward" for s in spans) == 4 * len(job.forward_ops())
    assert {s.name.split(".")[0] for s in spans if s.kind == "forward"} == \
        {"micro0", "micro1", "micro2", "micro3"}
    last_forward = max(t.id for t in computes
                       if t.work.kind == "forward" and t.work.name.startswith("micro3."))
    assert all(tid > last_forward for tid, _ in comms(four))
    # every all-reduce waits on a last-micro-step task
    for task in four.tasks:
        if isinstance(task.work, Comm):
            assert all(four.tasks[d].work.name.startswith("micro3.") for d in task.deps)


def test_no_overlap_reduces_after_the_whole_backward_then_steps() -> None:
    job = Job.from_config(load_workload("gpt2-medium"))
    program = build("ddp", job, machine(), StrategyOptions(no_overlap=True))
    timeline = engine.simulate(program, Communicator(machine()))
    backward_end = max(s.end for s in timeline.spans if s.kind == "backward")
    reduces = [s for s in timeline.spans if s.kind == "allreduce"]
    assert len(reduces) == 1  # Megatron's contiguous fp32 gradient buffer
    assert reduces[0].args["bytes"] == grad_bytes(job)
    assert all(s.start >= backward_end for s in reduces)
    optimizer_start = min(s.start for s in timeline.spans if s.kind == "optimizer")
    assert optimizer_start >= max(s.end for s in reduces)


def test_overlap_is_never_slower_than_no_overlap() -> None:
    job = tiny()
    with_overlap = engine.simulate(build("ddp", job, machine(), StrategyOptions()),
                                   Communicator(machine()))
    without = engine.simulate(build("ddp", job, machine(), StrategyOptions(no_overlap=True)),
                              Communicator(machine()))
    assert with_overlap.step_time <= without.step_time * 1.02


def test_one_gpu_has_no_all_reduce() -> None:
    program = build("ddp", tiny(), machine().subset(1), StrategyOptions())
    assert comms(program) == [] and program.meta["buckets"] == []
