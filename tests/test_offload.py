"""Offload to host memory: the bytes each framework moves, the CPU optimizer's time, copies
sharing links with SHM collectives, memory moving from device to host, and the flags."""

from __future__ import annotations

import pytest
import simpy

from simulator import api, engine, strategies
from simulator.cli import main
from simulator.engine.fabric import Fabric
from simulator.engine.program import Comm, Move, Program
from simulator.machine import host
from simulator.memory import estimate as memory
from simulator.nccl import collectives
from simulator.nccl.communicator import Communicator
from simulator.strategies import StrategyOptions

SWITCH = api.load_machine("8x5090-switch")
JOB = api.load_job("llama3.2-1b", None, None, None, "full")


def offload_meta(strategy: str, what: str, machine=SWITCH) -> dict:  # noqa: ANN001
    [program] = strategies.build(strategy, JOB, machine, StrategyOptions(offload=what))
    return program.meta["offload"]


def test_zero_offload_moves_what_the_cpu_optimizer_needs() -> None:
    share = JOB.n_trainable / 8  # one rank's partition
    meta = offload_meta("zero2", "optimizer")
    assert meta["d2h_bytes_per_gpu"] == pytest.approx(4 * share)  # fp32 gradient partition
    assert meta["h2d_bytes_per_gpu"] == pytest.approx(2 * share)  # updated 16-bit partition
    # ZeRO-3 (stage3.py partition_grads): the 16-bit partition down into the host buffer and
    # back up (.to(device)), the fp32 copy at the boundary; the updated partition up
    z3 = offload_meta("zero3", "optimizer")
    assert z3["d2h_bytes_per_gpu"] == pytest.approx((2 + 4) * share)
    assert z3["h2d_bytes_per_gpu"] == pytest.approx((2 + 2) * share)


def test_zero3_frees_a_module_unless_it_recurs_within_the_reuse_distance() -> None:
    from simulator.strategies.zero3 import _released, _Unit

    a, b = _Unit((0,), 100), _Unit((1,), 1000)
    uses = [a, None, b, a]
    used_at = [0, 2, 3]  # the ops that use a unit
    assert not _released(uses, used_at, 0, 1001)  # a recurs after 1,000 elements: kept
    assert _released(uses, used_at, 0, 1000)  # the distance reached first: freed
    assert _released(uses, used_at, 3, 10**9)  # no later use this step: freed


def test_parameter_offload_fetches_every_unit_forward_and_backward() -> None:
    from simulator.strategies.zero3 import PERSISTENCE_PER_HIDDEN, fetch_units

    units = fetch_units(JOB, PERSISTENCE_PER_HIDDEN * JOB.hidden)
    every = sum(u.numel for u in units.values())
    assert every < JOB.n_params  # norms stay whole on every rank (the persistence threshold)
    ds = offload_meta("zero3", "params")  # 16-bit partitions on the host
    grads_up = 2 * JOB.n_trainable / 8  # the gradient buffer back up once (one micro-step)
    fetched = (ds["h2d_bytes_per_gpu"] - grads_up) / (2 / 8)
    # forward fetches every module; under full recompute a block comes again for its
    # recompute (kept for its backward) unless it recurs within 1e9 elements of the trace
    assert every < fetched <= 2 * every
    assert ds["d2h_bytes_per_gpu"] == pytest.approx((2 + 4) * JOB.n_trainable / 8)
    root = sum(JOB.params[i].numel for b in (-1, JOB.n_blocks) for i in JOB.block_params(b))
    fsdp = offload_meta("fsdp", "params")  # FSDP2 keeps the fp32 master shard on the host
    assert fsdp["h2d_bytes_per_gpu"] == pytest.approx(4 * (2 * JOB.n_params - root) / 8)
    assert fsdp["d2h_bytes_per_gpu"] == pytest.approx(4 * JOB.n_trainable / 8)


def test_one_gpu_copies_cross_only_its_own_link_and_host_memory() -> None:
    one = api.load_machine("1x4090")
    [program] = strategies.build("fsdp", JOB, one, StrategyOptions(offload="params"))
    t = engine.simulate(program, Communicator(one))
    meta = program.meta["offload"]
    assert t.link_bytes["gpu0->cpu0"] == pytest.approx(meta["d2h_bytes_per_gpu"])
    assert t.link_bytes["cpu0->gpu0"] == pytest.approx(meta["h2d_bytes_per_gpu"])
    assert not [s for s in t.spans if s.kind == "optimizer"]  # the GPU runs no optimizer


def run_together(machine, *works: Comm | Move) -> float:  # noqa: ANN001
    p = Program(world=machine.n_gpus)
    for k, work in enumerate(works):
        p.add(f"s{k}", work)
    return engine.simulate(p, Communicator(machine)).step_time


def test_offload_copies_and_shm_collectives_share_the_switch_uplink() -> None:
    nbytes = 1 << 30
    allreduce = Comm("allreduce", "allreduce", nbytes, (tuple(range(8)),))
    # 3 GiB of gradients from each GPU: about as long alone as the 1 GiB SHM all-reduce
    copies = Move("grads down", "d2h", tuple(host.copy_flow(SWITCH, r, 3 * nbytes, to_host=True)
                                             for r in range(8)))
    alone = [run_together(SWITCH, allreduce), run_together(SWITCH, copies)]
    both = run_together(SWITCH, allreduce, copies)
    # every byte of both crosses sw0->cpu0: together they take about the sum, not the max
    # (on separate links they would take the max)
    assert both > 1.6 * max(alone)
    assert both == pytest.approx(sum(alone), rel=0.1)
    plan = collectives.plan(Communicator(SWITCH), "allreduce", nbytes)
    assert "sw0->cpu0" in dict(plan.usage) and "sw0->cpu0" in dict(copies.flows[0].usage)


def test_pageable_copies_are_a_sixth_of_pinned_ones() -> None:
    one = api.load_machine("1x4090")
    pinned = host.copy_flow(one, 0, 1e9, to_host=True)
    pageable = host.copy_flow(one, 0, 1e9, to_host=True, pinned=False)
    times = []
    for flow in (pinned, pageable):
        env = simpy.Environment()
        fabric = Fabric(env, Communicator(one).capacities())
        env.run(fabric.transfer(dict(flow.usage), flow.nbytes, flow.max_rate))
        times.append(env.now)
    assert times[1] == pytest.approx(host.PAGEABLE_SLOWDOWN * times[0], rel=1e-6)
    assert dict(pageable.usage)["mem:cpu0"] == 3.0  # the bounce buffer's memcpy, then the DMA


def cpu_step_time(machine, strategy: str, what: str) -> float:  # noqa: ANN001
    [program] = strategies.build(strategy, JOB, machine, StrategyOptions(offload=what))
    t = engine.simulate(program, Communicator(machine))
    return sum(s.duration for s in t.spans if s.kind == "cpu_optimizer")


def fast_memory(name: str) -> api.Machine:
    """A preset whose sockets' memory never binds: the CPU step is its threads' alone."""
    cfg = api.load_topology(name)
    nodes = [n.copy(memory_bandwidth_gb_per_s=1e6) if n.kind == "cpu"
             else n for n in cfg.nodes]
    return api.Machine.from_config(cfg.copy(nodes=nodes))


def with_recipe(framework: str):  # noqa: ANN201
    from dataclasses import replace

    from simulator.inputs.schema import TrainingConfig
    from simulator.job.recipe import resolve
    return replace(JOB, recipe=resolve(TrainingConfig(seq_len=JOB.seq_len, framework=framework)))


def test_the_cpu_optimizer_runs_at_its_threads_times_one_threads_rate() -> None:
    one = fast_memory("1x4090")  # 16 cores, one process: every core
    fused = host.TORCH_FUSED_ADAMW  # transformers' default optimizer, fp32 master shards
    expected = JOB.n_trainable / (16 * fused.thread_rate())
    assert cpu_step_time(one, "fsdp", "params") == pytest.approx(expected, rel=1e-6)
    # DeepSpeed on 8 GPUs of one 32-core socket: CPU-Adam's threads share it, 4 per rank
    switch = fast_memory("8x5090-switch")
    shard = JOB.n_trainable / 8
    expected = shard / (4 * host.CPU_ADAM.thread_rate())
    assert cpu_step_time(switch, "zero2", "optimizer") == pytest.approx(expected, rel=1e-6)


def test_torchrun_runs_the_cpu_optimizer_on_one_thread_per_rank() -> None:
    job = with_recipe("torchtune")  # tune run is torchrun; pure bf16 keeps bf16 states
    [program] = strategies.build("fsdp", job, fast_memory("8x5090-switch"),
                                 StrategyOptions(offload="params"))
    t = engine.simulate(program, Communicator(fast_memory("8x5090-switch")))
    step = sum(s.duration for s in t.spans if s.kind == "cpu_optimizer")
    expected = job.n_trainable / 8 / host.TORCH_FUSED_ADAMW.thread_rate(2)
    assert step == pytest.approx(expected, rel=1e-6)
    assert host.TORCH_FUSED_ADAMW.thread_rate(2) == pytest.approx(
        2 * host.TORCH_FUSED_ADAMW.thread_rate(4))


def test_the_for_loop_costs_a_thread_five_times_the_fused_kernel() -> None:
    ratio = host.TORCH_FUSED_ADAMW.thread_rate() / host.TORCH_ADAMW.thread_rate()
    assert ratio == pytest.approx(5.1)  # PR #123074's measured speed-up
    assert host.CPU_OPTIMIZERS["foreach"] is host.TORCH_ADAMW  # no foreach kernels on CPU


def test_a_slow_host_memory_bounds_the_cpu_optimizer() -> None:
    cfg = api.load_topology("1x4090")
    nodes = [n.copy(memory_bandwidth_gb_per_s=1.0, cores=4096)
             if n.kind == "cpu" else n for n in cfg.nodes]
    slow = api.Machine.from_config(cfg.copy(nodes=nodes))
    expected = JOB.n_trainable * host.CPU_ADAM.bytes_per_param / 1e9  # 1 GB/s memory
    assert cpu_step_time(slow, "zero2", "optimizer") == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("strategy, world", [("fsdp", 8), ("fsdp", 1), ("zero3", 8)])
def test_offloaded_states_move_from_device_to_host(strategy: str, world: int) -> None:
    card = SWITCH.gpu
    states = ("weights", "gradients", "optimizer")
    on_gpu = memory.estimate(JOB, card, strategy, world=world)
    off = memory.estimate(JOB, card, strategy, world=world, offload="params",
                          host_capacity_bytes=1 << 50)
    device_before = sum(on_gpu.category_bytes(c) for c in states)
    host_after = sum(x.bytes for x in off.lines if x.host and x.category in states)
    assert sum(off.category_bytes(c) for c in states) == 0  # nothing stays on the GPU
    if strategy == "fsdp":  # the same tensors, on the other side: memory is conserved
        assert host_after == pytest.approx(device_before)
    else:  # DeepSpeed keeps an fp32 gradient partition where the GPU held a 16-bit one
        extra = 2 * JOB.n_trainable / world
        assert host_after == pytest.approx(device_before + extra)
    assert off.host_peak_bytes >= host_after * world and off.peak_bytes < on_gpu.peak_bytes


def test_host_verdict_when_the_host_is_too_small() -> None:
    off = memory.estimate(JOB, SWITCH.gpu, "zero3", world=8, offload="params",
                          host_capacity_bytes=1 << 30)
    assert not off.host_fits and "host does not fit" in off.verdict()
    doc = off.to_json()
    assert doc["host_peak_bytes"] == off.host_peak_bytes and doc["host_capacity_bytes"] == 1 << 30


@pytest.mark.parametrize("argv, message", [
    (["-s", "fsdp", "--offload", "optimizer"], "CPUOffloadPolicy moves parameters"),
    (["-s", "zero2", "--offload", "params"], "only under ZeRO-3"),
    (["-s", "ddp", "--offload", "optimizer"], "does not apply to -s ddp"),
    (["-s", "zero3", "--offload", "disk"], "choose from optimizer, params"),
    (["-s", "fsdp", "--offload", "params", "--pp", "2"], "inside a pipeline is not modelled"),
])
def test_offload_flags_that_cannot_run_are_one_line(argv: list[str], message: str,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["run", "-t", "8x5090-switch", "-w", "llama3.2-1b", *argv])
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_run_json_reports_host_memory_and_the_offload() -> None:
    r = api.simulate(api.RunSpec("1x4090", "llama2-7b", "zero3", checkpointing="full",
                                 offload="params"), baseline=False).report
    assert r["memory"]["fits"] and r["memory"]["host_capacity_bytes"] == 128 * 2**30
    assert r["memory"]["host_peak_bytes"] > 100 * 2**30
    off = r["offload"]
    assert off["cpu_optimizer_s"] > 0 and off["h2d_s"] > 0 and off["d2h_s"] > 0


def test_memory_json_has_the_host_figures_at_the_top(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    assert main(["memory", "-t", "1x4090", "-w", "llama2-7b", "-s", "zero3", "--offload",
                 "params", "--checkpointing", "full", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["fits"] and out["host_capacity_bytes"] == 128 * 2**30
    # DeepSpeed's host states: 18 B per parameter (fp32 master, m, v, fp32 gradient, bf16 copy)
    assert out["host_peak_bytes"] == pytest.approx(18 * out["parameters"], rel=0.01)
    assert out["host_fits"]
    assert main(["memory", "-t", "1x4090", "-w", "llama2-7b", "-s", "zero3", "--offload",
                 "params", "--checkpointing", "full"]) == 0
    text = capsys.readouterr().out
    assert text.splitlines()[0].startswith("fits:") and "host fits" in text
    assert "host total" in text
    # a 13B model needs 18 B x 13 B = 218 GiB: more than the desktop's 128 GiB
    assert main(["memory", "-t", "1x4090", "-w", "llama2-13b", "-s", "zero3", "--offload",
                 "params", "--checkpointing", "full"]) == 0
    assert "host does not fit" in capsys.readouterr().out
