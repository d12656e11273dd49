"""Questions in one command: per-machine GPU counts, the winner and the mechanism that decides,
no figures under DOES NOT FIT, --micro-batch max in compare and sweep."""

from __future__ import annotations

import json

import pytest

from simulator import api
from simulator.advice import decide
from simulator.cli import main


def _report(tokens: float, compute: float, exposed: float, step: float, *,
            fits: bool = True, usd: float | None = None, gpu: str = "rtx4090",
            tokens_range: list[float] | None = None) -> dict:
    return {"tokens_per_s": tokens, "tokens_per_step": tokens * step, "step_time_s": step,
            "compute_time_s": compute, "exposed_comm_s": exposed, "mfu": 0.4, "gpus": 4,
            "gpu": gpu, "memory": {"fits": fits}, "cost": {"usd_per_million_tokens": usd},
            "bottleneck": {"link": "mem:cpu0", "description": "host memory of cpu0"},
            **({"tokens_per_s_range": tokens_range} if tokens_range else {})}


def test_the_winner_is_the_fastest_that_fits_and_the_largest_gap_decides() -> None:
    fast = _report(1000, compute=0.9, exposed=0.1, step=1.0, usd=0.5)
    slow = _report(500, compute=0.9, exposed=1.1, step=2.0, usd=0.2)  # waits on SHM
    huge = _report(5000, compute=1.0, exposed=0.0, step=1.0, fits=False)  # does not fit
    winner, why = decide.winner_lines([slow, fast, huge], ["a", "b", "c"])
    assert winner.startswith("winner: b: 1,000 tokens/s, $0.5 per million tokens, 2.00x a")
    assert "cheapest per token: a at $0.2 per million" in winner
    assert why.startswith("why: communication decides: a waits 55% of its step")
    assert "host memory of cpu0" in why


def test_compute_decides_between_cards_and_overlapping_ranges_are_said() -> None:
    a = _report(1000, compute=1.0, exposed=0.0, step=1.0, tokens_range=[900, 1100])
    b = _report(950, compute=1.05, exposed=0.0, step=1.0, gpu="a100",
                tokens_range=[800, 1000])
    winner, why = decide.winner_lines([a, b], ["x", "y"])
    assert "the order of these two is not certain" in winner
    assert why.startswith("why: compute decides: x spends")


def test_nothing_or_one_that_fits() -> None:
    unfit = _report(1, 1, 0, 1, fits=False)
    assert decide.winner_lines([unfit], ["a"]) == ["winner: none: no run fits in memory"]
    assert decide.winner_lines([unfit, _report(1, 1, 0, 1)], ["a", "b"]) == [
        "winner: b: 1 tokens/s (the only run that fits)"]


def test_compare_takes_a_gpu_count_per_machine(capsys: pytest.CaptureFixture[str]) -> None:
    """4x 4090 against one A100 in one command."""
    argv = ["compare", "-t", "8x4090-dual-socket:4", "-t", "8xa100-nvswitch:1",
            "-w", "llama2-7b-lora", "--no-ranges"]
    assert main([*argv, "--json"]) == 0
    reports = json.loads(capsys.readouterr().out)
    assert [(r["topology"], r["gpus"]) for r in reports] == [("8x4090-dual-socket", 4),
                                                           ("8xa100-nvswitch", 1)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    header = out.splitlines()[1]
    assert "8x4090-dual-socket:4" in header and "8xa100-nvswitch:1" in header
    winner = next(line for line in out.splitlines() if line.startswith("winner: "))
    assert winner.startswith("winner: 8x4090-dual-socket:4: ")
    assert next(line for line in out.splitlines() if line.startswith("why: compute decides"))
    assert main(["compare", "-t", "8xa100-nvswitch:0", "-w", "gpt2-medium"]) == 2
    assert "the GPU count after ':' must be from 1" in capsys.readouterr().err


def test_run_and_memory_take_the_same_gpu_count(capsys: pytest.CaptureFixture[str]) -> None:
    """-t NAME:K means the same on every command: K of its GPUs, as --gpus K does."""
    for command in (["run", "--no-ranges"], ["memory"]):
        outs = []
        for machine in (["-t", "8x5090-switch:4"], ["-t", "8x5090-switch", "--gpus", "4"]):
            assert main([*command, *machine, "-w", "gpt2-medium", "--json"]) == 0
            outs.append(json.loads(capsys.readouterr().out))
        assert outs[0] == outs[1]
    assert main(["run", "-t", "8x5090-switch:0", "-w", "gpt2-medium"]) == 2
    assert "the GPU count after ':' must be from 1" in capsys.readouterr().err


def test_no_price_under_does_not_fit(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["compare", "-t", "8x5090-switch", "-t", "8x5090-dual-socket", "-w", "llama2-7b",
            "-s", "fsdp", "--checkpointing", "none", "--no-ranges"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "DOES NOT FIT: needs 38.9 GiB of 32.0 GiB per GPU" in out
    assert "$" not in out and "per million tokens" not in out
    assert not any(line.startswith(("price", "step time", "tokens/s")) for line in out.splitlines())
    assert "winner: none: no run fits in memory" in out
    assert main([*argv, "--fail-if-no-fit"]) == 3
    capsys.readouterr()
    assert main([*argv, "--json"]) == 0
    for report in json.loads(capsys.readouterr().out):
        assert report["simulated"] is False and "cost" not in report
        assert report["what_would_fit"][0]["flags"] == "--checkpointing full"


def test_the_preset_7b_full_fine_tune_fits_as_people_run_it(
        capsys: pytest.CaptureFixture[str]) -> None:
    """llama2-7b checkpoints fully, as torchtune's 7B full fine-tune does: FSDP fits 32 GB."""
    assert main(["compare", "-t", "8x5090-switch", "-t", "8x5090-dual-socket", "-w",
                 "llama2-7b", "-s", "fsdp", "--no-ranges", "--json"]) == 0
    reports = json.loads(capsys.readouterr().out)
    assert all(r["memory"]["fits"] and r["recipe"]["activation_checkpointing"] == "full"
               for r in reports)
    assert all(r["cost"]["usd_per_million_tokens"] > 0 for r in reports)


def test_sweep_names_its_winner_against_the_slowest(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sweep", "-t", "8x5090-dual-socket", "-w", "gpt2-medium", "--bucket-mb",
                 "1,25,400", "--no-ranges"]) == 0
    lines = capsys.readouterr().out.splitlines()
    winner = next(line for line in lines if line.startswith("winner: "))
    assert winner.startswith("winner: bucket-mb=25: ")
    why = next(line for line in lines if line.startswith("why: "))
    assert "bucket-mb=400" in why and "communication decides" in why


def test_sweep_and_compare_take_micro_batch_max(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sweep", "-t", "8x5090-switch", "-w", "llama2-7b", "-s", "fsdp",
                 "--micro-batch", "1,max", "--no-ranges", "--json"]) == 0
    points = [r["point"]["micro_batch"] for r in json.loads(capsys.readouterr().out)]
    largest = api.memory(api.RunSpec("8x5090-switch", "llama2-7b", "fsdp"),
                         largest_micro_batch=True).summary["largest_micro_batch"]
    assert points == [1, largest] and largest > 1
    assert main(["compare", "-t", "8x5090-switch", "-t", "8xh100-nvswitch", "-w", "llama2-7b",
                 "-s", "fsdp", "--micro-batch", "max", "--no-ranges", "--json"]) == 0
    each = [r["micro_batch"] for r in json.loads(capsys.readouterr().out)]
    assert each[0] == largest and each[1] > largest  # each machine its own largest
