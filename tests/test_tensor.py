"""Megatron tensor parallelism: collectives per layer, sharded compute, group placement."""

from __future__ import annotations

from dataclasses import replace
from functools import cache

from simulator import engine
from simulator.engine.program import Comm, Compute, Program
from simulator.inputs.config import load_topology
from simulator.inputs.schema import TopologyConfig, WorkloadConfig
from simulator.job.workload import Job
from simulator.machine.topology import Machine
from simulator.nccl.communicator import Communicator
from simulator.strategies import StrategyOptions
from simulator.strategies import build as build_programs
from simulator.strategies.tensor import place_groups

LAYERS = 4


def build(*args: object, **kwargs: object) -> Program:
    """The one program of a symmetric strategy (every rank alike)."""
    [program] = build_programs(*args, **kwargs)  # type: ignore[arg-type]
    return program


@cache
def machine(name: str = "8xa100-nvswitch") -> Machine:
    return Machine.from_config(load_topology(name))


def job(checkpointing: str = "none", hidden: int = 1024) -> Job:
    return Job.from_config(WorkloadConfig.from_data({
        "name": "tiny", "model": {"family": "llama", "layers": LAYERS, "hidden": hidden,
                                  "heads": 8, "ffn_hidden": hidden * 11 // 4, "vocab": 32000},
        "training": {"seq_len": 512, "micro_batch": 2, "precision": "bf16",
                     "optimizer": "adamw", "activation_checkpointing": checkpointing,
                     "framework": "megatron"}}))  # Megatron's TP runs its fused kernels


def tp_comms(program: Program) -> list[Comm]:
    return [t.work for t in program.tasks if t.stream == "tp" and isinstance(t.work, Comm)]


def test_four_all_reduces_per_layer_of_bsh_bytes() -> None:
    j = job()
    program = build("tp", j, machine(), StrategyOptions(tp=8))
    layer = [c for c in tp_comms(program) if c.name.startswith("layers.")]
    assert len(layer) == 4 * LAYERS and all(c.op == "allreduce" for c in layer)
    for b in range(LAYERS):
        mine = [c for c in layer if c.name.startswith(f"layers.{b}.")]
        assert sum(".forward." in c.name for c in mine) == 2
        assert sum(".backward." in c.name for c in mine) == 2
    # plus the vocab-parallel embedding (forward) and lm_head (backward)
    assert len(tp_comms(program)) == 4 * LAYERS + 2
    assert {c.nbytes for c in tp_comms(program)} == {2 * 2 * 512 * 1024}
    assert all(c.groups == (tuple(range(8)),) for c in tp_comms(program))


def test_recompute_repeats_the_forward_all_reduces() -> None:
    program = build("tp", job("full"), machine(), StrategyOptions(tp=8))
    assert len(tp_comms(program)) == 6 * LAYERS + 2


def test_sequence_parallel_all_gather_and_reduce_scatter() -> None:
    program = build("tp", job(), machine(), StrategyOptions(tp=8, sequence_parallel=True))
    ops = [c.op for c in tp_comms(program)]
    assert ops.count("allreduce") == 0
    assert ops.count("allgather") == 6 * LAYERS  # f, g, and the two weight-gradient re-gathers
    assert ops.count("reducescatter") == 4 * LAYERS + 2


def test_compute_per_gpu_shrinks_with_tp() -> None:
    def compute(program: Program) -> float:
        return sum(t.work.duration for t in program.tasks
                   if isinstance(t.work, Compute) and t.work.kind in ("forward", "backward"))
    big = job(hidden=4096)  # GEMMs large enough to be compute bound
    one = compute(build("ddp", big, machine().subset(1), StrategyOptions()))
    four = compute(build("tp", big, machine().subset(4), StrategyOptions(tp=4)))
    assert one / 4 < four < one / 3  # split GEMMs; replicated norms and launch overhead remain


def test_collectives_sit_on_the_critical_path() -> None:
    timeline = engine.simulate(build("tp", job(), machine(), StrategyOptions(tp=8)),
                               Communicator(machine()))
    compute = sum(s.duration for s in timeline.spans if s.stream == "compute")
    tp = sum(s.duration for s in timeline.spans if s.stream == "tp")
    assert timeline.step_time >= compute + tp - 1e-9


def nvlink_pairs_machine() -> Machine:
    """Four GPUs on one CPU; NVLink bridges join 0-2 and 1-3 (not consecutive ranks)."""
    return Machine.from_config(TopologyConfig.from_data({
        "name": "pairs", "gpu": "rtx3090ti",
        "nodes": [{"id": "cpu0", "kind": "cpu", "memory_bandwidth_gb_per_s": 40}]
        + [{"id": f"gpu{i}", "kind": "gpu"} for i in range(4)],
        "links": [{"a": "cpu0", "b": f"gpu{i}", "kind": "pcie", "gen": 4, "lanes": 16}
                  for i in range(4)]
        + [{"a": "gpu0", "b": "gpu2", "kind": "nvlink", "count": 4},
           {"a": "gpu1", "b": "gpu3", "kind": "nvlink", "count": 4}]}))


def test_tp_groups_take_the_fastest_links() -> None:
    tp_groups, dp_groups = place_groups(nvlink_pairs_machine(), 2)
    assert tp_groups == ((0, 2), (1, 3))
    assert dp_groups == ((0, 1), (2, 3))
    program = build("tp+ddp", job(), nvlink_pairs_machine(), StrategyOptions(tp=2))
    assert program.meta["dp"] == 2
    assert all(c.groups == ((0, 2), (1, 3)) for c in tp_comms(program))
    gradients = [t.work for t in program.tasks if t.stream == "nccl"]
    assert gradients and all(c.groups == ((0, 1), (2, 3)) for c in gradients)  # type: ignore[union-attr]


def test_tp_fsdp_shards_over_the_dp_groups() -> None:
    program = build("tp+fsdp", job(), machine(), StrategyOptions(tp=2))
    gathers = [t.work for t in program.tasks
               if t.stream == "allgather" and isinstance(t.work, Comm)]
    assert gathers and all(len(c.groups) == 2 and len(c.groups[0]) == 4  # type: ignore[union-attr]
                           for c in gathers)
    engine.simulate(program, Communicator(machine()))


def test_sequence_parallel_backward_regathers_each_column_input() -> None:
    """Megatron re-all-gathers the s/t input of QKV and MLP-in for their weight-gradient GEMM:
    one b*s*h all-gather per ColumnParallelLinear per layer, issued before the input-gradient
    GEMM, which the weight-gradient GEMM (not the input-gradient one) waits for."""
    program = build("tp", job(), machine(), StrategyOptions(tp=8, sequence_parallel=True))
    tasks = program.tasks
    for b in range(LAYERS):
        gathers = [t for t in tasks if isinstance(t.work, Comm)
                   and t.work.name.startswith(f"layers.{b}.") and "input_allgather" in t.work.name]
        assert sorted(t.work.name for t in gathers) == [
            f"layers.{b}.mlp_in.backward.input_allgather",
            f"layers.{b}.qkv.backward.input_allgather"]
        for g in gathers:
            assert isinstance(g.work, Comm)
            assert g.work.op == "allgather" and g.work.nbytes == 2 * 2 * 512 * 1024
            assert g.stream == "tp"
            role = g.work.name.split(".")[2]
            dgrad = next(t for t in tasks if isinstance(t.work, Compute)
                         and t.work.name == f"layers.{b}.{role}.input_grad")
            dw = next(t for t in tasks if isinstance(t.work, Compute)
                      and t.work.name == f"layers.{b}.{role}.weight_grad")
            scatter = next(t for t in tasks if isinstance(t.work, Comm)
                           and t.work.name == f"layers.{b}.{role}.backward.reducescatter")
            assert g.id < dgrad.id and g.id not in dgrad.deps  # issued first, not awaited
            assert g.id in dw.deps and dgrad.id in scatter.deps
            assert scatter.id not in dw.deps  # the scatter overlaps the weight-gradient GEMM
            assert dw.work.flops > 0 and dgrad.work.flops > 0


def _serialized(program: Program) -> Program:
    """The same tasks with each column layer's backward in sequence: gather, dX, scatter, dW."""
    by_name = {t.work.name: t for t in program.tasks}
    tasks = []
    for t in program.tasks:
        name = t.work.name
        if name.endswith(".input_grad"):
            gather = by_name[name.removesuffix(".input_grad") + ".backward.input_allgather"]
            t = replace(t, deps=(*t.deps, gather.id))
        if name.endswith(".weight_grad"):
            scatter = by_name[name.removesuffix(".weight_grad") + ".backward.reducescatter"]
            t = replace(t, deps=(*t.deps, scatter.id))
        tasks.append(t)
    return Program(world=program.world, tasks=tasks, meta=program.meta)


def test_overlapped_column_backward_is_not_slower_than_serialized() -> None:
    m = machine()  # NVSwitch: fast links
    program = build("tp", job(hidden=2048), m, StrategyOptions(tp=8, sequence_parallel=True))
    overlapped = engine.simulate(program, Communicator(m)).step_time
    serialized = engine.simulate(_serialized(program), Communicator(m)).step_time
    assert overlapped < serialized
