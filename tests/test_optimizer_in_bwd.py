"""torchtune's optimizer_in_bwd: one gradient alive at a time (hand-counted on a small Llama),
each tensor stepped right after the backward op that completes its gradient, the recipe key
and flag, and the combinations torchtune refuses (one line, exit 2)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simulator import api
from simulator.cli import main
from simulator.memory import estimate as memory

# a small Llama: embeddings 1000 x 64, 2 blocks of q/k/v/o 64 x 64, gate/up/down 64 x 128, two
# norms of 64; final norm 64; an untied LM head 64 x 1000
WORKLOAD = """\
name: tiny-llama
model: {family: llama, layers: 2, hidden: 64, heads: 4, kv_heads: 4, ffn_hidden: 128,
        vocab: 1000, tie_embeddings: false}
training: {seq_len: 128, micro_batch: 2, framework: torchtune%s}
"""
EMBEDDING = 1000 * 64
BLOCK = 4 * 64 * 64 + 3 * 64 * 128 + 2 * 64
PARAMS = EMBEDDING + 2 * BLOCK + 64 + EMBEDDING


def workload(tmp_path: Path, extra: str = "") -> str:
    """The small Llama with more training keys, in a file of its own (files are cached by
    path)."""
    path = tmp_path / f"tiny{len(list(tmp_path.iterdir()))}.yaml"
    path.write_text(WORKLOAD % extra)
    return str(path)


def gradient_line(path: str) -> memory.Line:
    job = api.load_job(path, None, None, None)
    report = memory.estimate(job, api.load_machine("1x4090").gpu, "ddp", world=1)
    [line] = [x for x in report.lines if x.category == "gradients"]
    return line


def test_the_hand_count_of_the_small_llama_is_the_jobs() -> None:
    assert PARAMS == 210_240


def test_without_it_every_gradient_is_alive_at_the_end_of_backward(tmp_path: Path) -> None:
    line = gradient_line(workload(tmp_path))
    assert line.bytes == 2 * PARAMS  # pure bf16: 2 B per gradient
    assert memory.alive(line, "backward_end") and memory.alive(line, "step")


def test_with_it_only_the_largest_tensors_gradient_is(tmp_path: Path) -> None:
    line = gradient_line(workload(tmp_path, ", optimizer_in_bwd: true"))
    assert line.bytes == 2 * EMBEDDING  # the embedding (and the LM head) are the largest
    assert memory.alive(line, "backward") and not memory.alive(line, "step")


def kinds(path: str) -> list[str]:
    """The kind of each compute task of the one-GPU step, in program order."""
    [program] = api.simulate(api.RunSpec("1x4090", path), baseline=False).programs
    return [getattr(t.work, "kind", "") for t in program.tasks]


def test_each_tensor_steps_right_after_the_op_that_completes_its_gradient(
        tmp_path: Path) -> None:
    fused = kinds(workload(tmp_path, ", optimizer_in_bwd: true"))
    last_backward = max(i for i, k in enumerate(fused) if k == "backward")
    steps = [i for i, k in enumerate(fused) if k == "optimizer"]
    assert len(steps) > 2 and steps[0] < last_backward  # inside backward, not after it
    assert fused[steps[0] - 1] == "backward"  # right after an op that completed gradients
    plain = kinds(workload(tmp_path))
    last_backward = max(i for i, k in enumerate(plain) if k == "backward")
    assert min(i for i, k in enumerate(plain) if k == "optimizer") > last_backward


def test_the_recipe_says_it_in_text_and_json(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    path = workload(tmp_path)
    assert main(["run", "-t", "1x4090", "-w", path, "--optimizer-in-bwd", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["recipe"]["optimizer_in_bwd"] is True
    assert main(["memory", "-t", "1x4090", "-w", path, "--optimizer-in-bwd"]) == 0
    assert "(optimizer_in_bwd)" in capsys.readouterr().out
    assert main(["run", "-t", "1x4090", "-w", path, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["recipe"]["optimizer_in_bwd"] is False


def refused(argv: list[str], words: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and words in err and "Traceback" not in err, err


def test_gradient_accumulation_is_refused_from_the_flags(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = workload(tmp_path)
    refused(["run", "-t", "1x4090", "-w", path, "--optimizer-in-bwd", "--grad-accum", "2"],
            "torchtune refuses gradient accumulation", capsys)


def test_gradient_accumulation_is_refused_in_the_file_with_its_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = workload(tmp_path, ", grad_accum: 2, optimizer_in_bwd: true")
    refused(["memory", "-t", "1x4090", "-w", path], f"{path}:4: training.optimizer_in_bwd",
            capsys)


def test_more_than_one_gpu_is_refused(tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    refused(["run", "-t", "2x5090", "-w", workload(tmp_path), "--optimizer-in-bwd"],
            "modelled on one GPU only", capsys)
