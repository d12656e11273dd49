"""stepsim advise: candidates pruned by memory, ranked as their runs are, explained."""

from __future__ import annotations

import json
import shlex

import pytest

from simulator import api
from simulator.advice import advise, candidates
from simulator.advice.cost import Prices
from simulator.cli import main

KEYS = {"candidates", "best", "nothing_fits", "what_would_fit", "explanation"}


@pytest.fixture(scope="module")
def answer() -> dict:
    machine = advise.Machine("2x5090", Prices(usd_per_gpu_hour=1.0))
    return advise.advise([machine], "gpt2-medium", jobs=1)


def test_the_answer_has_exactly_the_contract_keys(answer: dict) -> None:
    assert set(answer) == KEYS
    assert answer["nothing_fits"] is False and answer["what_would_fit"] == []


def test_nothing_that_does_not_fit_is_ranked(answer: dict) -> None:
    assert len(answer["candidates"]) > 20
    assert all(r["memory"]["fits"] for r in answer["candidates"])


def test_candidates_are_ranked_by_the_objective(answer: dict) -> None:
    speeds = [r["tokens_per_s"] for r in answer["candidates"]]
    assert speeds == sorted(speeds, reverse=True)
    assert answer["best"]["options"] == answer["candidates"][0]["options"]


def test_the_winner_is_what_stepsim_run_gives_with_its_options(
        answer: dict, capsys: pytest.CaptureFixture[str]) -> None:
    best = answer["best"]
    argv = shlex.split(best["command"])[1:] + ["--json"]
    assert main(argv) == 0
    run = json.loads(capsys.readouterr().out)
    assert run["step_time_s"] == pytest.approx(best["step_time_s"], rel=1e-9)
    assert run["tokens_per_s"] == pytest.approx(answer["candidates"][0]["tokens_per_s"])
    assert best["step_time_s_range"][0] <= best["step_time_s"] <= best["step_time_s_range"][1]


def test_the_explanation_names_the_winner_its_bottleneck_and_the_runner_up(answer: dict
                                                                          ) -> None:
    text = "\n".join(answer["explanation"])
    assert text.count("best (throughput):") == 1 and "why: " in text
    assert "runner-up:" in text and "per million tokens" in text
    assert "range: " in text


def test_a_job_that_needs_sharding_says_why_plain_ddp_does_not_fit() -> None:
    # memory only (no simulation): a full 7B fine-tune on eight 32 GB cards
    choices = candidates.enumerate_machine(api.RunSpec("8x5090-dual-socket", "llama2-7b"))
    assert choices.first and {s.strategy for s in choices.first} >= {"fsdp", "zero3"}
    assert "ddp" not in {s.strategy for s in choices.first if s.pp == 1}  # plain DDP
    assert any(s.pp > 1 for s in choices.first)  # a pipeline of DDP stages can fit
    lines = advise.not_fitting_lines(choices.verdicts)
    ddp = next(line for line in lines if line.startswith("ddp does not fit"))
    assert "checkpointing full at micro-batch 1" in ddp and "every GPU" in ddp


def test_when_nothing_fits_it_says_what_would(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["advise", "-t", "2x5090", "-w", "llama2-70b", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"schema_version", *KEYS} and out["nothing_fits"] is True
    assert out["candidates"] == [] and out["best"] is None
    changes = " ".join(w["change"] for w in out["what_would_fit"])
    assert "QLoRA" in changes and "x rtx5090" in changes and "GiB of RAM" in changes
    assert all(w["fits"] and w["peak_bytes"] > 0 for w in out["what_would_fit"])
    assert any("nothing fits" in line for line in out["explanation"])


def test_micro_batches_go_up_to_the_largest_that_fits() -> None:
    assert candidates.micro_batches(6) == [1, 2, 4, 6]
    assert candidates.micro_batches(8, above=2) == [4, 8]
    spec = api.RunSpec("2x5090", "gpt2-medium")
    verdict = candidates.largest_micro_batch(spec, candidates.Recipe("fsdp"), "none")
    assert verdict is not None and verdict.largest > 1
    at = api.memory_of(api.RunSpec("2x5090", "gpt2-medium", "fsdp", micro_batch=verdict.largest,
                                   checkpointing="none"))
    over = api.memory_of(api.RunSpec("2x5090", "gpt2-medium", "fsdp",
                                     micro_batch=verdict.largest + 1, checkpointing="none"))
    assert at["fits"] and not over["fits"]


@pytest.mark.parametrize(("flags", "message"), [
    (["--objective", "cost"], "--price-per-gpu-hour"),
    (["--objective", "time-to-train"], "--train-tokens"),
    (["--objective", "speed"], "--objective"),
])
def test_an_objective_without_what_it_needs_is_one_line(
        flags: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["advise", "-t", "2x3090ti-nvlink", "-w", "gpt2-medium", *flags]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_several_machines_ranked_per_dollar_in_parallel(capsys: pytest.CaptureFixture[str]
                                                        ) -> None:
    assert main(["advise", "-t", "2x5090", "-t", "2x3090ti-nvlink", "-w", "gpt2-medium",
                 "--objective", "cost", "--price-per-gpu-hour", "0.9",
                 "--price-per-gpu-hour", "0.3", "--jobs", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    costs = [r["cost"]["usd_per_million_tokens"] for r in out["candidates"]]
    assert costs == sorted(costs)
    assert {r["options"]["topology"] for r in out["candidates"]} == {"2x5090", "2x3090ti-nvlink"}
    text = "\n".join(out["explanation"])
    assert "machines, best first:" in text and "wins on cost" in text


def test_pipelines_are_candidates_with_enough_micro_batches() -> None:
    recipes = candidates.recipes(8)
    pipes = [r for r in recipes if r.pp > 1]
    assert {r.pp for r in pipes} == {2, 4, 8}
    assert all(r.grad_accum is not None and r.grad_accum >= 2 * r.pp for r in pipes)
    spec = next(s for s in candidates.enumerate_machine(
        api.RunSpec("8x5090-dual-socket", "llama2-7b")).first if s.pp > 1)
    assert "--pp" in candidates.run_command(spec) and "pipeline" in candidates.label(spec)


def test_offload_is_tried_where_the_gpus_cannot_hold_the_states_alone() -> None:
    choices = candidates.enumerate_machine(api.RunSpec("2x5090", "llama2-7b"))
    offloaded = [s for s in choices.first if s.offload != "none"]
    assert offloaded and all(s.strategy in ("zero1", "zero2", "zero3", "fsdp")
                             for s in offloaded)
    assert "--offload" in candidates.run_command(offloaded[0])
