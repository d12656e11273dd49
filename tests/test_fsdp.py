"""FSDP2 programs: one all-gather per unit each way, one reduce-scatter per unit, prefetch
one unit ahead, at most one reduce-scatter in flight, optimizer on the local shard."""

from __future__ import annotations

from functools import cache

from simulator import engine
from simulator.engine.program import Comm, Program
from simulator.inputs.config import load_topology
from simulator.inputs.schema import WorkloadConfig
from simulator.job.workload import Job
from simulator.machine.topology import Machine
from simulator.nccl.communicator import Communicator
from simulator.strategies import StrategyOptions
from simulator.strategies import build as build_programs

LAYERS = 6


def build(*args: object, **kwargs: object) -> Program:
    """The one program of a symmetric strategy (every rank alike)."""
    [program] = build_programs(*args, **kwargs)  # type: ignore[arg-type]
    return program


@cache
def machine() -> Machine:
    return Machine.from_config(load_topology("8xa100-nvswitch"))


def job() -> Job:
    return Job.from_config(WorkloadConfig.from_data({
        "name": "tiny", "model": {"family": "llama", "layers": LAYERS, "hidden": 1024,
                                  "heads": 8, "ffn_hidden": 2816, "vocab": 32000},
        "training": {"seq_len": 512, "micro_batch": 2, "precision": "bf16",
                     "optimizer": "adamw"}}))


def collectives(program: Program, op: str) -> list[Comm]:
    return [t.work for t in program.tasks if isinstance(t.work, Comm) and t.work.op == op]


def test_counts_equal_units() -> None:
    program = build("fsdp", job(), machine(), StrategyOptions())
    gathers = collectives(program, "allgather")
    assert len([g for g in gathers if ".unit" in g.name]) == 2 * LAYERS  # forward + backward
    assert len([g for g in gathers if g.name.endswith("root")]) == 1  # root kept for backward
    assert len(collectives(program, "reducescatter")) == LAYERS + 1
    assert program.meta["units"] == LAYERS


def test_without_reshard_after_forward_no_backward_all_gather() -> None:
    program = build("fsdp", job(), machine(), StrategyOptions(reshard_after_forward=False))
    assert len(collectives(program, "allgather")) == LAYERS + 1


def test_bytes_gathered_and_reduced() -> None:
    j = job()
    program = build("fsdp", j, machine(), StrategyOptions())
    gathered = sum(c.nbytes for c in collectives(program, "allgather") if ".fwd." in c.name
                   or c.name.endswith("root"))
    assert abs(gathered - 2 * j.n_params) <= len(j.blocks)  # bf16 params, once in forward
    reduced = sum(c.nbytes for c in collectives(program, "reducescatter"))
    assert abs(reduced - 4 * j.n_trainable) <= len(j.blocks)  # fp32 reduce_dtype


def test_prefetch_one_ahead_and_one_reduce_scatter_in_flight() -> None:
    program = build("fsdp", job(), machine(), StrategyOptions())
    timeline = engine.simulate(program, Communicator(machine()))
    spans = {s.name: s for s in timeline.spans}
    fwd_start = {b: min(s.start for s in timeline.spans
                        if s.kind == "forward" and s.args.get("block") == b)
                 for b in range(LAYERS)}
    fwd_end = {b: max(s.end for s in timeline.spans
                      if s.kind == "forward" and s.args.get("block") == b)
               for b in range(LAYERS)}
    for b in range(LAYERS):
        ag = spans[f"allgather.fwd.unit{b}"]
        assert ag.end <= fwd_start[b] + 1e-12  # gathered before the unit computes
        if b >= 2:  # not before the unit two back has finished: one ahead, no further
            assert ag.start >= fwd_end[b - 2] - 1e-12
    # prefetch overlaps: the next unit's all-gather runs while this unit computes
    assert spans["allgather.fwd.unit2"].start < fwd_end[1]
    bwd_start = {b: min(s.start for s in timeline.spans
                        if s.kind == "backward" and s.args.get("block") == b)
                 for b in range(LAYERS)}
    for b in range(LAYERS - 2):  # unit b+1's backward waits for unit b+2's reduce-scatter
        assert spans[f"reducescatter.unit{b + 2}"].end <= bwd_start[b] + 1e-12


def test_no_prefetch_is_not_faster() -> None:
    with_prefetch = engine.simulate(build("fsdp", job(), machine(), StrategyOptions()),
                                    Communicator(machine()))
    without = engine.simulate(build("fsdp", job(), machine(), StrategyOptions(
        forward_prefetch=False, backward_prefetch=False)), Communicator(machine()))
    assert with_prefetch.step_time <= without.step_time


def test_optimizer_steps_the_local_shard() -> None:
    j = job()
    program = build("fsdp", j, machine(), StrategyOptions())
    single = build("ddp", j, machine().subset(1), StrategyOptions())
    opt = sum(t.work.duration for t in program.tasks
              if not isinstance(t.work, Comm) and t.work.kind == "optimizer")
    full = sum(t.work.duration for t in single.tasks
               if not isinstance(t.work, Comm) and t.work.kind == "optimizer")
    assert abs(opt - full / 8) < 1e-12


def test_zero3_gathers_per_module_and_reduces_in_16_bit() -> None:
    """DeepSpeed gathers each module's parameters as it runs (more, smaller all-gathers than
    FSDP's per block) and reduce-scatters bf16 gradients in bf16 (FSDP's recipe: fp32)."""
    fsdp, zero3 = build("fsdp", job(), machine()), build("zero3", job(), machine())
    assert len(collectives(zero3, "allgather")) > len(collectives(fsdp, "allgather"))
    assert max(c.nbytes for c in collectives(zero3, "allgather")) < \
        max(c.nbytes for c in collectives(fsdp, "allgather"))
    assert sum(c.nbytes for c in collectives(zero3, "reducescatter")) == \
        sum(c.nbytes for c in collectives(fsdp, "reducescatter")) // 2
    assert zero3.meta["strategy"] == "zero3"


def test_zero3_fetches_wait_for_the_previous_micro_step() -> None:
    """DeepSpeed's backward ends waiting for its reduce-scatters (stage3.py
    independent_gradient_partition_epilogue), so no all-gather of the next micro-step starts
    before; a replayed micro-step then ends with nothing in flight, whatever the rates."""
    from simulator import api
    from simulator.machine.scales import RateScales

    program = build("zero3", job(), machine(), StrategyOptions(grad_accum=4))
    later = [t for t in program.tasks if isinstance(t.work, Comm) and t.work.op == "allgather"
             and not t.work.name.startswith("micro0.")]
    assert later and all(t.deps for t in later)
    slow_shm = api.RunSpec("8x5090-dual-socket", "llama3.2-1b", "zero3", grad_accum=4,
                           scales=RateScales(shm=0.24))
    assert api.simulate(slow_shm, ranges=False).report["step_time_s"] > 0
