"""Pipeline parallelism: Megatron's and torch's schedules, the closed-form bubbles, stage
placement and balance, activations in flight, and whole pipelines on a real box."""

from __future__ import annotations

import pytest

from simulator import api, engine
from simulator.cli import main
from simulator.engine.program import Compute, Flow, Program, SendRecv, Transfer
from simulator.engine.timeline import union_length
from simulator.nccl import collectives
from simulator.nccl.communicator import Communicator
from simulator.strategies import pipeline_layout, schedules
from simulator.strategies.schedules import Call, Work
from tests.test_engine import FakeNetwork, FakePlan

CASES = [("gpipe", 4, 8, 1), ("1f1b", 4, 8, 1), ("1f1b", 4, 2, 1), ("1f1b", 3, 7, 1),
         ("interleaved", 4, 8, 2), ("interleaved", 2, 6, 3), ("interleaved", 4, 4, 2)]


@pytest.mark.parametrize("schedule, p, m, v", CASES)
def test_every_stage_receives_its_inputs_before_it_uses_them(schedule: str, p: int, m: int,
                                                             v: int) -> None:
    steps = schedules.stage_steps(schedule, p, m, v)
    received = schedules.received(steps, p)
    for r in range(p):
        got: set[tuple[str, int, int]] = set()
        calls = iter(received[r])
        works = [s for s in steps[r] if isinstance(s, Work)]
        assert sorted((w.kind, w.micro, w.chunk) for w in works) == sorted(
            (k, i, c) for k in "FB" for i in range(m) for c in range(v))
        for step in steps[r]:
            if isinstance(step, Call):
                got.update(next(calls))
                continue
            s = step.chunk * p + r
            if step.kind == "F" and s > 0:
                assert ("act", step.micro, s - 1) in got, (r, step)
            if step.kind == "B" and s < p * v - 1:
                assert ("grad", step.micro, s + 1) in got, (r, step)


@pytest.mark.parametrize("p, m", [(4, 8), (4, 2), (8, 16)])
def test_1f1b_warms_up_with_megatrons_count(p: int, m: int) -> None:
    for r, steps in enumerate(schedules.stage_steps("1f1b", p, m)):
        works = [s for s in steps if isinstance(s, Work)]
        first_backward = next(k for k, w in enumerate(works) if w.kind == "B")
        warmup = min(p - r - 1, m)  # num_warmup_microbatches, then one steady forward
        assert first_backward == warmup + (1 if warmup < m else 0)


def test_interleaved_warms_up_with_megatrons_count() -> None:
    p, m, v = 4, 8, 2
    for r, steps in enumerate(schedules.stage_steps("interleaved", p, m, v)):
        works = [s for s in steps if isinstance(s, Work)]
        first_backward = next(k for k, w in enumerate(works) if w.kind == "B")
        assert first_backward == min((p - r - 1) * 2 + (v - 1) * p, m * v) + 1
        # virtual micro-batch k runs model chunk (k % (p v)) // p
        forwards = [w for w in works if w.kind == "F"]
        assert [w.chunk for w in forwards[:2 * p]] == [0] * p + [1] * p


class FreeTransfers(FakeNetwork):
    """No links: every send is free and takes no SMs."""

    def sendrecv(self, src: int, dst: int, nbytes: int) -> FakePlan:
        return FakePlan(Flow((), 0), 0)


def synthetic(schedule: str, p: int, m: int, v: int, tf: float, tb: float) -> list[Program]:
    """Programs of equal stages (forward tf, backward tb per micro-batch) and free sends."""
    steps = schedules.stage_steps(schedule, p, m, v)
    received = schedules.received(steps, p)
    programs = []
    for r in range(p):
        prog = Program(world=p, ranks=(r,))
        calls = iter(received[r])
        last: list[int] = []
        for step in steps[r]:
            if isinstance(step, Call):
                def transfers(msgs: list) -> tuple[Transfer, ...]:  # noqa: ANN001
                    return tuple(Transfer(f"{k}.{i}.{s}", ((0, 0),), 0) for k, i, s in msgs)
                task = prog.add("p2p", SendRecv("call", transfers(list(step.sends)),
                                                transfers(next(calls))), tuple(last))
                last = [task] if step.waited else last
            else:
                kind = "forward" if step.kind == "F" else "backward"
                last = [prog.add("compute", Compute(kind, kind, (tf if step.kind == "F" else tb)
                                                    / v), tuple(last))]
        programs.append(prog)
    return programs


@pytest.mark.parametrize("schedule, p, m, v", CASES)
def test_equal_stages_idle_for_the_closed_form_bubble(schedule: str, p: int, m: int,
                                                      v: int) -> None:
    t = engine.simulate(synthetic(schedule, p, m, v, 1.0, 2.0), FreeTransfers({}))
    for r in range(p):
        busy = union_length((s.start, s.end) for s in t.spans_of(r) if s.is_compute)
        assert 1 - busy / t.step_time == pytest.approx(schedules.bubble_closed_form(p, m, v))


def test_the_interleaved_bubble_is_the_1f1b_bubble_divided_by_v() -> None:
    p, m = 4, 8
    plain = schedules.bubble_closed_form(p, m)
    assert plain == pytest.approx(3 / 11)
    bubble_time = plain / (1 - plain)  # in units of the ideal time: (p-1)/m
    for v in (2, 4):
        inter = schedules.bubble_closed_form(p, m, v)
        assert inter / (1 - inter) == pytest.approx(bubble_time / v)


def test_stages_are_contiguous_rank_blocks_in_megatrons_order() -> None:
    lay = pipeline_layout.layout(8, pp=2, tp=2)
    assert lay.stages == ((0, 1, 2, 3), (4, 5, 6, 7))
    assert lay.tp_groups(1) == ((4, 5), (6, 7)) and lay.dp_groups(1) == ((4, 6), (5, 7))
    with pytest.raises(Exception, match="does not divide"):
        pipeline_layout.layout(8, pp=3, tp=1)


def test_stages_balance_op_time_with_embedding_first_and_head_last() -> None:
    machine = api.load_machine("8x5090-dual-socket")
    job = api.load_job("llama2-7b", None, None, None, "full")
    four = pipeline_layout.split_blocks(job, machine.gpu, 4)
    assert [len([b for b in c if 0 <= b < 32]) for c in four] == [8, 8, 8, 8]
    assert four[0][0] == -1 and four[-1][-1] == 32  # embedding first, final norm + head last
    three = pipeline_layout.split_blocks(job, machine.gpu, 3)
    layers = [len([b for b in c if 0 <= b < 32]) for c in three]
    assert sum(layers) == 32 and layers[-1] == min(layers)  # the head's stage gets fewer layers


def test_the_first_stage_holds_the_most_layer_activations_under_1f1b() -> None:
    p, m = 4, 8
    one = [pipeline_layout.in_flight(s, [8], 0 if r == p - 1 else None)
           for r, s in enumerate(schedules.stage_steps("1f1b", p, m))]
    assert [layers for layers, _ in one] == [8 * (p - r) for r in range(p)]  # p - r in flight
    gpipe = [pipeline_layout.in_flight(s, [8], 0 if r == p - 1 else None)
             for r, s in enumerate(schedules.stage_steps("gpipe", p, m))]
    assert [layers for layers, _ in gpipe] == [8 * m] * p  # every micro-batch in flight
    assert gpipe[-1][1] == m and one[-1][1] == 1  # the head's logits: m against one


ACCEPTANCE = api.RunSpec("8x5090-dual-socket", "llama2-7b", "ddp", grad_accum=8,
                         checkpointing="full", pp=4, schedule="1f1b")


def test_1f1b_on_a_dual_socket_box_idles_for_about_its_closed_form() -> None:
    r = api.simulate(ACCEPTANCE, baseline=False)
    pipe = r.report["pipeline"]
    assert {"stages", "schedule", "micro_batches", "bubble_fraction"} <= set(pipe)
    assert (pipe["stages"], pipe["schedule"], pipe["micro_batches"]) == (4, "1f1b", 8)
    assert pipe["bubble_fraction"] == pytest.approx(3 / 11, abs=0.02)
    # stages run different layers: GPU 0 holds the embedding, GPU 6 the head
    names = [{s.name.split(".", 1)[1] for s in r.timeline.spans_of(g)
              if s.is_compute and s.name.startswith("micro")}
             for g in (0, 6)]
    assert "embedding" in names[0] and "lm_head" in names[1] and not names[0] & names[1]
    # one b x s x h bf16 activation per data-parallel replica, over the machine's paths
    sends = [s for s in r.timeline.spans_of(0) if s.kind == "p2p" and s.args["sends"]]
    assert sends[0].args["bytes"] == 2 * 4096 * 4096 * 2
    # across sockets
    assert collectives.p2p_plan(Communicator(r.machine), 2, 4, 1 << 25).transport == "SHM"
    stages = r.report["memory"]["stages"]
    assert stages[0]["activations_bytes"] > stages[1]["activations_bytes"] > \
        stages[2]["activations_bytes"]


def test_pipeline_combines_with_tensor_and_sharded_data_parallelism() -> None:
    r = api.simulate(api.RunSpec("8x5090-dual-socket", "llama3.2-1b", "tp+fsdp", tp=2,
                                 grad_accum=4, pp=2, checkpointing="full"), baseline=False)
    spans = r.timeline.spans_of(4)
    tp = [s for s in spans if s.stream == "tp"]
    gathers = [s for s in spans if s.kind == "allgather" and s.stream == "allgather"]
    assert tp and all(s.args["ranks"] == 2 for s in tp)
    # FSDP under a pipeline keeps units unsharded: one all-gather per unit per step
    assert len(gathers) == len({s.args["unit"] for s in gathers})
    assert r.report["pipeline"]["stage_gpus"] == [[0, 1, 2, 3], [4, 5, 6, 7]]


@pytest.mark.parametrize("argv, message", [
    (["-s", "zero2", "--pp", "2"], "DeepSpeed refuses ZeRO-2 and ZeRO-3"),
    (["--pp", "4", "--schedule", "interleaved", "--virtual-stages", "2", "--grad-accum", "6"],
     "must be a multiple of the 4 stages"),
    (["--pp", "2", "--grad-accum", "10000"], "op executions, at most 100,000"),
    (["--schedule", "gpipe"], "give --pp P"),
    (["--pp", "2", "--schedule", "zb"], "choose from gpipe, 1f1b, interleaved"),
])
def test_pipeline_flags_that_cannot_run_are_one_line(argv: list[str], message: str,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["run", "-t", "8x5090-dual-socket", "-w", "llama3.2-1b", *argv])
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_memory_of_a_pipeline_is_its_fullest_stage(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    argv = ["memory", "-t", "8x5090-dual-socket", "-w", "llama2-7b", "-s", "fsdp", "--pp", "4",
            "--grad-accum", "8", "--checkpointing", "full", "--json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    stages = out["stages"]
    assert len(stages) == 4 and out["peak_bytes"] == max(s["peak_bytes"] for s in stages)
    layers = [s["activations_bytes"] for s in stages[:3]]  # the head's logits sit on stage 3
    assert layers == sorted(layers, reverse=True)  # 1F1B: p - r micro-batches in flight
    run = api.simulate(api.RunSpec("8x5090-dual-socket", "llama2-7b", "fsdp", grad_accum=8,
                                   checkpointing="full", pp=4), baseline=False)
    assert run.report["memory"]["peak_bytes"] == out["peak_bytes"]  # run and memory agree
