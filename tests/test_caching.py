"""Work done once per process: a job's ops and parameter index, a topology file's machine, the
one-GPU baseline a sweep's points share, an op's time on a card."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest

from simulator import api
from simulator.api import runner
from simulator.catalog import gpus as gpu_catalog
from simulator.engine.program import Compute, Program
from simulator.inputs import config
from simulator.job import compute, ops
from simulator.job.workload import Job
from simulator.machine import build
from simulator.machine.scales import RateScales
from simulator.strategies import steps


@pytest.fixture(autouse=True)
def fresh_caches() -> None:
    api.clear_caches()


def test_a_jobs_ops_are_built_once_and_handed_out_as_new_lists(
        monkeypatch: pytest.MonkeyPatch) -> None:
    job = Job.from_config(config.load_workload("gpt2-medium"))
    calls: list[str] = []
    build = ops.build
    monkeypatch.setattr(ops, "build", lambda j, phase, **kw: calls.append(phase)
                        or build(j, phase, **kw))
    first, second = job.backward_ops(), job.backward_ops()
    assert calls == ["backward"]
    assert first == second and first is not second
    first.clear()
    assert job.backward_ops() == second


@pytest.mark.parametrize("workload", ["llama2-7b-lora", "resnet50"])
def test_block_params_are_each_blocks_tensors_in_order(workload: str) -> None:
    job = Job.from_config(config.load_workload(workload))
    for block in job.blocks:
        assert job.block_params(block) == [i for i, p in enumerate(job.params)
                                           if p.block == block]


def test_a_topology_file_is_read_once_for_every_variant(monkeypatch: pytest.MonkeyPatch) -> None:
    reads: list[str] = []
    load = config.load_topology
    monkeypatch.setattr(build, "load_topology", lambda name: reads.append(name) or load(name))
    spec = api.RunSpec("8x5090-switch", "gpt2-medium", "ddp", gpus=4)
    api.simulate(spec, ranges=True)  # ranges re-run it at scaled rates, against one GPU too
    api.simulate(replace(spec, gpus=None))
    assert reads == ["8x5090-switch"]


def test_a_sweep_simulates_one_gpu_once() -> None:
    base = api.RunSpec("8x5090-dual-socket", "gpt2-medium", "ddp")
    for bucket in (1, 25, 400):
        for gpus in (2, 4, 8):
            api.simulate(replace(base, bucket_mb=bucket, gpus=gpus, overlap=gpus != 4))
    info = runner._single_gpu.cache_info()
    assert (info.misses, info.hits) == (1, 8)


def test_one_gpu_ignores_the_transports_rate_scales() -> None:
    """A range's ends on a box whose collectives cross SHM differ in the SHM scale too; the
    one-GPU step they are measured against does not (nothing is communicated): one run."""
    base = api.RunSpec("8x5090-dual-socket", "gpt2-medium", "ddp")
    plain = api.single_gpu_tokens_per_s(replace(base, scales=RateScales(compute=0.8)))
    shm = api.single_gpu_tokens_per_s(replace(base, scales=RateScales(compute=0.8, shm=0.3)))
    assert shm == plain
    info = runner._single_gpu.cache_info()
    assert (info.misses, info.hits) == (1, 1)
    assert api.single_gpu_tokens_per_s(base) != plain  # the compute scale does count


@pytest.mark.parametrize("change", [{"rate_scale": 0.5}, {"power_limit_w": 300.0},
                                    {"achieved_fraction": 0.8}])
def test_an_ops_time_is_remembered_per_card_and_each_input_of_it(change: dict[str, float]
                                                                  ) -> None:
    job = api.load_job("gpt2-medium", None, None, None)
    plain = gpu_catalog.GPUS["rtx5090"]
    other = replace(plain, **change)

    def durations(gpu: gpu_catalog.GPU) -> list[float]:
        program = Program(1)
        steps.add_ops(program, job.forward_ops(), steps.compute_only(gpu))
        return [t.work.duration for t in program.tasks if isinstance(t.work, Compute)]

    first, changed, again = durations(plain), durations(other), durations(plain)
    assert first == again == [compute.op_time(op, plain) for op in job.forward_ops()]
    assert changed == [compute.op_time(op, other) for op in job.forward_ops()]
    assert changed != first and all(c >= f for c, f in zip(changed, first, strict=True))


@pytest.mark.parametrize("spec", [
    api.RunSpec("8x5090-dual-socket", "llama2-7b", "fsdp"),
    api.RunSpec("8x5090-switch", "llama2-7b-lora", "ddp", bucket_mb=5),
    api.RunSpec("8xh100-nvswitch", "llama2-13b", "tp+fsdp", tp=4),
    api.RunSpec("8x5090-switch", "gpt2-medium", "ddp", pp=2, grad_accum=4),
    api.RunSpec("2x5090", "llama2-7b", "zero3", offload="optimizer"),
], ids=["fsdp", "ddp", "tp+fsdp", "pipeline", "offload"])
def test_the_memory_verdict_does_not_depend_on_the_rates(spec: api.RunSpec) -> None:
    """Why a range's re-runs may reuse the point's memory verdict."""
    scales = RateScales(compute=0.6, shm=0.3, pcie_p2p=1.7, nvlink=0.8)
    api.clear_caches()
    scaled = api.simulate(replace(spec, scales=scales), baseline=False).report["memory"]
    api.clear_caches()
    assert api.simulate(spec, baseline=False).report["memory"] == scaled


def test_a_sweeps_one_gpu_points_over_bucket_sizes_are_one_run(monkeypatch: pytest.MonkeyPatch
                                                                ) -> None:
    from simulator import engine

    api.clear_caches()
    runs: list[int] = []
    simulate = engine.simulate
    monkeypatch.setattr(engine, "simulate", lambda programs, *a, **k: runs.append(1)
                        or simulate(programs, *a, **k))
    base = api.RunSpec("8x5090-dual-socket", "gpt2-medium", "ddp", gpus=1)
    reports = [api.simulate(replace(base, bucket_mb=1), ranges=True)]
    first = len(runs)
    reports += [api.simulate(replace(base, bucket_mb=b), ranges=True) for b in (25, 400)]
    assert first > 1 and len(runs) == first  # ranged once, then remembered
    assert [r.spec.bucket_mb for r in reports] == [1, 25, 400]
    assert reports[0].report == reports[2].report
    assert reports[0].report is not reports[2].report  # each caller its own copy
    api.clear_caches()
    alone = api.simulate(replace(base, bucket_mb=400), ranges=True).report
    assert alone == reports[0].report


def _counting() -> Callable[[], list[int]]:
    """A maker whose n-th call gives [n]: which results a memo made afresh."""
    made: list[int] = []

    def make() -> list[int]:
        made.append(1)
        return [len(made)]
    return make


def test_an_identity_memo_keeps_a_result_for_the_very_objects_it_was_made_from() -> None:
    from simulator.memo import IdentityMemo, forget_all

    memo: IdentityMemo[list[int]] = IdentityMemo(limit=2)
    make = _counting()

    a, twin = [1, 2], [1, 2]  # equal, but other objects
    assert memo.get((a,), "x", make) is memo.get((a,), "x", make)
    assert memo.get((twin,), "x", make) == [2]  # a new result: identity, not equality
    assert memo.get((a,), "y", make) == [3]  # the third entry starts the memo afresh
    assert memo.get((a,), "x", make) == [4]
    forget_all()
    assert memo.get((a,), "x", make) == [5]


def test_a_value_memo_keeps_a_result_per_equal_key_and_is_bounded() -> None:
    from simulator.memo import Memo

    memo: Memo[list[int]] = Memo(limit=2)
    make = _counting()

    assert memo.get(("a", 1), make) is memo.get(("a", 1), make)  # equal keys share a result
    assert memo.get(("b", 1), make) == [2] and len(memo) == 2
    assert memo.get(("c", 1), make) == [3] and len(memo) == 1  # past the limit: afresh
    api.clear_caches()
    assert len(memo) == 0 and memo.get(("c", 1), make) == [4]


def _per_token_uncached(job: Job, mode: str) -> tuple[float, float]:
    from simulator.job import checkpointing

    checkpointing._SAVED.clear()
    checkpointing._OP_SAVED.clear()
    return checkpointing.per_token(job, tp=2, sequence_parallel=True, mode=mode)


@pytest.mark.parametrize("workload", ["llama2-7b", "llama2-7b-lora", "gpt2-medium"])
def test_per_token_activations_are_built_once_per_job_shape_for_every_micro_batch(
        workload: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A memory search tries many micro-batches of one job: its per-token figures (the op
    builder's saved tensors) are worked out once, and are what a fresh build gives."""
    from simulator.job import checkpointing, transformer_ops

    builds: list[int] = []
    builder = transformer_ops.builder
    monkeypatch.setattr(transformer_ops, "builder",
                        lambda job: builds.append(job.micro_batch) or builder(job))
    jobs = [api.load_job(workload, b, None, None, "op") for b in (1, 3, 8)]
    figures = [checkpointing.per_token(j, tp=2, sequence_parallel=True) for j in jobs]
    assert builds == [1, 1]  # the saved tensors, and op mode's saved GEMM outputs
    assert figures == [_per_token_uncached(j, "op") for j in jobs]
    other = api.load_job(workload, 3, None, None, "full")  # another job shape: built anew
    before = len(builds)
    checkpointing.per_token(other)
    assert len(builds) == before + 1  # full mode keeps the block input: no op-mode GEMMs
    api.clear_caches()
    assert len(checkpointing._SAVED) == len(checkpointing._OP_SAVED) == 0


def test_memory_reports_across_micro_batches_match_fresh_ones() -> None:
    """Per-shape figures (state lines, parameter counts, per-token activations) give every
    micro-batch's report exactly as a first estimate does."""
    from simulator.memory import estimate as memory

    gpu = gpu_catalog.GPUS["rtx5090"]
    jobs = [api.load_job("llama2-7b", b, None, 4, "selective") for b in (1, 2, 5)]
    warm = [memory.estimate(j, gpu, "zero2", world=8, tp=2) for j in jobs]
    cold = []
    for j in jobs:
        api.clear_caches()
        cold.append(memory.estimate(j, gpu, "zero2", world=8, tp=2))
    assert warm == cold
    assert [r.micro_batch for r in warm] == [1, 2, 5]
    assert len({r.peak_bytes for r in warm}) == 3


def test_the_advise_bound_is_remembered_bounded_and_forgotten_by_clear_caches() -> None:
    from simulator.advice import bound
    from simulator.memo import Memo

    spec = api.RunSpec("8x5090-switch", "gpt2-medium", "zero2", micro_batch=2)
    first = bound.tokens_per_s_bound(spec)
    assert len(bound._BOUNDS) == 1
    # every data-parallel flavour, accumulation and bucket size shares one micro-batch's work
    assert bound.tokens_per_s_bound(replace(spec, strategy="fsdp", grad_accum=4,
                                            bucket_mb=5)) == first
    assert len(bound._BOUNDS) == 1
    api.clear_caches()
    assert len(bound._BOUNDS) == 0
    assert bound.tokens_per_s_bound(spec) == first  # the same figure, worked out again
    assert isinstance(bound._BOUNDS, Memo)  # bounded (its limit) and registered


def test_a_jobs_blocks_time_each_shared_kernel_and_op_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every block but the first reuses the first's kernels (and a TP shard splits each once),
    so a card times each distinct kernel once, however many blocks run it."""
    from simulator.strategies.tensor import shard_ops

    job = api.load_job("llama2-7b", 2, None, None)
    gpu = gpu_catalog.GPUS["rtx5090"]
    timed: list[int] = []
    work = compute.kernel_work_time
    monkeypatch.setattr(compute, "kernel_work_time",
                        lambda k, g: timed.append(id(k)) or work(k, g))
    for ops_ in (job.forward_ops() + job.backward_ops(),
                 shard_ops(job.forward_ops() + job.backward_ops(), 2, False)):
        steps.forget_op_times()  # (a shard keeps the kernels of the ops it replicates)
        timed.clear()
        seconds = [steps.op_seconds(op, gpu) for op in ops_]
        kernels = {id(k) for op in ops_ for k in op.kernels}
        assert sorted(timed) == sorted(kernels)  # each distinct kernel once
        assert len(kernels) < sum(len(op.kernels) for op in ops_) / 10
        assert seconds == [compute.op_time(op, gpu) for op in ops_]  # the same floats
        # and each distinct kernel tuple (the ops of a block op, in every block) once
        tuples = {id(op.kernels) for op in ops_}
        assert len(tuples) < len(ops_) / 10 and len(steps._works(gpu)) == len(tuples)


def test_an_fsdp_units_sizes_are_worked_out_once_per_job(monkeypatch: pytest.MonkeyPatch) -> None:
    from simulator.strategies import fsdp

    job = Job.from_config(config.load_workload("llama2-7b"))
    blocks = fsdp.units(job)[:3]
    first = (fsdp._sizes(job, blocks), fsdp._stored_bytes(job, blocks, 2))
    calls: list[int] = []
    block_params = Job.block_params
    monkeypatch.setattr(Job, "block_params", lambda self, b: calls.append(b)
                        or block_params(self, b))
    assert (fsdp._sizes(job, blocks), fsdp._stored_bytes(job, blocks, 2)) == first
    assert calls == []  # remembered
    fsdp._stored_bytes(job, blocks, 4)  # another byte width is another entry
    assert calls == blocks
    api.clear_caches()
    calls.clear()
    assert fsdp._sizes(job, blocks) == first[0]
    assert calls == blocks  # forgotten, worked out again to the same sizes
