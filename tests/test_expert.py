"""Expert parallelism (strategies/expert.py): groups, the all-to-alls around the experts,
expert sharding over the expert-data-parallel group, memory per rank, and advise."""

import json
from pathlib import Path

import pytest

from simulator import api
from simulator.advice import candidates
from simulator.cli import main
from simulator.engine.program import Comm
from simulator.errors import InputError
from simulator.strategies import expert

HF = Path(__file__).parent / "fixtures" / "hf"
QWEN_MOE = f"hf:{HF / 'qwen1.5-moe-a2.7b'}"
MIXTRAL = f"hf:{HF / 'mixtral-8x7b'}"
ADAPTER = str(Path(__file__).parent / "fixtures" / "peft" / "mixtral-qlora" /
              "adapter_config.json")


def test_groups_as_megatron_lays_them_out() -> None:
    assert expert.ep_groups(8, 4) == ((0, 1, 2, 3), (4, 5, 6, 7))
    assert expert.expert_dp_groups(8, 4) == ((0, 4), (1, 5), (2, 6), (3, 7))
    assert expert.expert_dp_groups(8, 8) == tuple((i,) for i in range(8))


def spec(**kw: object) -> api.RunSpec:
    base = dict(topology="4x5090", workload=QWEN_MOE, strategy="fsdp", micro_batch=1,
                seq_len=512, ep=4)
    base.update(kw)
    return api.RunSpec(**base)  # type: ignore[arg-type]


def program(s: api.RunSpec):  # noqa: ANN201
    from simulator import strategies

    job = api.job_of(s)
    machine = api.load_machine(s.topology, s.gpus)
    return job, strategies.build(s.strategy, job, machine, api.options_of(s))[0]


def comms(prog, op: str) -> list[Comm]:  # noqa: ANN001
    return [t.work for t in prog.tasks if isinstance(t.work, Comm) and t.work.op == op]


def test_two_alltoalls_each_way_per_moe_block_and_again_when_recomputed() -> None:
    job, prog = program(spec())
    blocks = sum(job.arch.is_moe(b) for b in range(job.arch.layers))
    a2a = comms(prog, "alltoall")
    assert len(a2a) == 4 * blocks  # dispatch and combine, forward and backward
    T, k, h = 512, 4, 2048
    assert {c.nbytes for c in a2a} == {T * k * h * 2}  # a rank's routed rows, bf16
    assert {c.groups for c in a2a} == {((0, 1, 2, 3),)}
    _, full = program(spec(checkpointing="full"))
    assert len(comms(full, "alltoall")) == 6 * blocks


def test_experts_held_whole_are_not_gathered_and_shared_ones_are() -> None:
    _, whole = program(spec(ep=4))  # one EP group: each rank owns its experts
    assert not [c for c in comms(whole, "allgather") if c.name.endswith(".experts")]
    _, half = program(spec(ep=2))
    gathered = [c for c in comms(half, "allgather") if c.name.endswith(".experts")]
    assert gathered and {c.groups for c in gathered} == {((0, 2), (1, 3))}


def test_imbalance_moves_more_rows_to_the_busiest_rank() -> None:
    job = api.job_of(spec(ep=4))
    balanced = expert.alltoall_bytes(job)
    from simulator.inputs import hf_config
    from simulator.job.workload import Job

    skewed = Job.from_config(hf_config.load(QWEN_MOE).with_training(expert_imbalance=4.0),
                             micro_batch=1, seq_len=512, ep=4)
    # 15 experts a rank, one with 4x the mean: (14 + 4) / 15 of the mean rows
    assert expert.alltoall_bytes(skewed) == pytest.approx(balanced * 18 / 15, rel=1e-6)
    fwd = {op.name: op for op in skewed.ops("forward")}["layers.0.experts"]
    base = {op.name: op for op in job.ops("forward")}["layers.0.experts"]
    assert fwd.flops > base.flops * 1.19


def test_memory_per_rank_and_refusals() -> None:
    plain = api.memory(spec(ep=1, strategy="zero3")).report
    ep = api.memory(spec(ep=4, strategy="zero3")).report
    # ZeRO-3 shards every state either way; EP keeps the experts of one rank unsharded
    assert ep.model_state_bytes == pytest.approx(plain.model_state_bytes, rel=0.01)
    assert any("all-to-all send and receive" in line.label for line in ep.lines)
    with pytest.raises(InputError, match="expert parallelism is modelled beside fsdp or zero3"):
        api.memory(spec(strategy="ddp"))
    with pytest.raises(InputError, match="must divide the 60 experts"):
        api.job_of(spec(ep=8, topology="8x5090-switch-p2p"))
    with pytest.raises(InputError, match="needs a mixture of experts"):
        api.job_of(spec(workload="llama3.2-1b"))


def test_active_parameters_are_the_model_s_under_any_ep() -> None:
    assert api.job_of(spec(ep=4)).n_active == api.job_of(spec(ep=1)).n_active
    assert api.job_of(spec(ep=4)).n_model_params == api.job_of(spec(ep=1)).n_params


def test_memory_says_the_whole_model_and_each_rank_s_share(
        capsys: pytest.CaptureFixture[str]) -> None:
    """Under --ep a rank holds 1/ep of the routed experts; the line names both counts."""
    whole = api.job_of(spec(ep=1)).n_params
    local = api.job_of(spec(ep=4)).n_params
    main(["memory", "-t", "4x5090", "-w", QWEN_MOE, "-s", "zero3", "--ep", "4"])
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("parameters"))
    assert line.startswith(f"parameters {whole:,}, {local:,} on each rank (15 of 60 experts")


def test_run_shows_the_alltoalls_and_bad_ep_is_one_line(capsys: pytest.CaptureFixture[str]
                                                       ) -> None:
    assert main(["run", "-t", "8x5090-dual-socket", "-w", MIXTRAL, "--load-in-4bit", "--peft",
                 ADAPTER, "-s", "fsdp", "--ep", "8", "--micro-batch", "1", "--seq-len", "256",
                 "--json"]) == 0
    capsys.readouterr()
    assert main(["run", "-t", "4x5090", "-w", "llama3.2-1b", "-s", "fsdp", "--ep", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "mixture of experts" in err[0]


def test_advise_weighs_ep_for_a_mixture_of_experts_only() -> None:
    with_ep = candidates.recipes(4, experts=60)
    assert {r.ep for r in with_ep} == {1, 2, 4}
    assert {r.strategy for r in with_ep if r.ep > 1} == {"fsdp", "zero3"}
    assert {r.ep for r in candidates.recipes(4)} == {1}


def test_an_ep_run_names_its_degree_and_why_it_beats_one_gpu(
        capsys: pytest.CaptureFixture[str]) -> None:
    """The report carries the EP degree (JSON parallelism.ep, the title); a scaling efficiency
    above 100% says why: the HF expert loop on one GPU dequantizes and launches every expert,
    each of eight GPUs one. With grouped GEMMs (torchtitan) there is nothing to share."""
    args = ["run", "-t", "8x5090-dual-socket", "-w", "mixtral-8x7b-qlora", "-s", "fsdp",
            "--ep", "8", "--no-ranges"]
    assert main([*args, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["parallelism"]["ep"] == 8 and report["scaling_efficiency"] > 1
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "fsdp, experts over 8 GPUs (--ep 8)" in out.splitlines()[0]
    assert "above 100%: each GPU runs 1/8 of the experts" in out
    assert main([*args, "--framework", "torchtitan"]) == 0
    assert "above 100%" not in capsys.readouterr().out
