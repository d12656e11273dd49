"""Flags: one parser style in every command (a bad value is one line, exit 2, no usage),
no abbreviations, no repeats, flags a strategy has no use for refused, and `run` and
`memory` agreeing on every strategy's parallel degrees (and saying them in JSON)."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pytest

from simulator.cli import main
from simulator.strategies import STRATEGIES

SMALL = ["-t", "8x5090-switch", "-w", "gpt2-medium", "--seq-len", "256"]

ONE_LINE = [
    (["run", *SMALL, "--bucket-m", "5"], "stepsim run: error: unrecognized argument",
     "did you mean --bucket-mb?"),
    (["run", *SMALL, "--tp", "2", "--tp", "4", "-s", "tp"], "stepsim run: error:",
     "--tp is given twice"),
    (["run", *SMALL, "--frobnicate"], "stepsim run: error: unrecognized argument",
     "--frobnicate"),
    (["run", "-t", "2x5090"], "stepsim run: error:", "required: -w/--workload"),
    (["collective", "-t", "2x5090", "--op", "allreduce", "-f", "x"],
     "stepsim collective: error:", "-f/--stepfactor: invalid int value: 'x'"),
    (["memory", *SMALL, "--tp", "0"], "stepsim memory: error:", "--tp: must be at least 1"),
    (["memory", *SMALL, "--gpus", "many"], "stepsim memory: error:",
     "--gpus: expected a whole number"),
    (["topo", "-t", "2x5090", "--gpus", "99999"], "stepsim topo: error:", "at most 1,024"),
    (["run", *SMALL, "-s", "ddp", "--tp", "2"], "stepsim run: error:",
     "--tp does not apply to -s ddp"),
    (["run", *SMALL, "-s", "fsdp", "--bucket-mb", "5"], "stepsim run: error:",
     "--bucket-mb does not apply to -s fsdp"),
    (["run", *SMALL, "-s", "zero2", "--no-overlap"], "stepsim run: error:",
     "--no-overlap does not apply"),
    (["memory", *SMALL, "-s", "zero3", "--tp", "2"], "stepsim memory: error:",
     "--tp does not apply to -s zero3"),
    (["sweep", *SMALL, "-s", "fsdp", "--tp", "1,2"], "stepsim sweep: error:",
     "--tp does not apply to -s fsdp"),
    (["nonsense"], "stepsim: error:", "invalid choice: 'nonsense'"),
]


@pytest.mark.parametrize(("argv", "starts", "words"), ONE_LINE,
                         ids=[" ".join(c[0][:1] + c[0][-2:]) for c in ONE_LINE])
def test_every_bad_flag_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str],
                                               argv: list[str], starts: str,
                                               words: str) -> None:
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1, err
    assert err.startswith(starts) and words in err and "usage:" not in err, err


def test_compare_gives_a_flag_only_to_the_strategies_that_use_it(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", *SMALL, "-s", "ddp", "-s", "tp+ddp", "--tp", "2", "--no-ranges",
                 "--json"]) == 0
    ddp, tp = json.loads(capsys.readouterr().out)
    assert ddp["parallelism"] == {"world": 8, "tp": 1, "dp": 8, "pp": 1}
    assert tp["parallelism"] == {"world": 8, "tp": 2, "dp": 4, "pp": 1}


def test_a_comma_list_is_the_flag_repeated(capsys: pytest.CaptureFixture[str],
                                           tmp_path: Path) -> None:
    base = ["compare", "-w", "llama3.2-1b", "--no-ranges", "--json"]
    listed = _json([*base, "-t", "2x5090, 1x5090", "-s", "ddp,fsdp"], capsys)
    repeated = _json([*base, "-t", "2x5090", "-t", "1x5090", "-s", "ddp", "-s", "fsdp"], capsys)
    assert listed == repeated and len(listed) == 4
    # a file whose name has a comma is one value, not two
    named = tmp_path / "a,b.yaml"
    shutil.copy(Path(__file__).parents[1] / "topologies" / "2x5090.yaml", named)
    assert len(_json([*base, "-t", str(named)], capsys)) == 1
    folder = tmp_path / "my,model"  # an hf: folder named with a comma, as -w names it
    shutil.copytree(Path(__file__).parent / "fixtures" / "hf" / "llama-3.2-1b", folder)
    assert len(_json(["compare", "-t", "2x5090", "-w", f"hf:{folder}", "--no-ranges",
                      "--json"], capsys)) == 1
    assert main([*base, "-t", "2x5090,"]) == 2
    assert capsys.readouterr().err.strip().endswith(
        "-t: an empty item in '2x5090,' (`stepsim compare --help` lists the flags)")


def _json(argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict:
    assert main(argv) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


# (strategy, --tp given or None) -> the (tp, dp) degrees both commands must use on 8 GPUs
DEGREES = [(s, None) for s in STRATEGIES] + [("tp", 1), ("tp+ddp", 1), ("tp+fsdp", 1),
                                             ("tp", 4), ("tp+ddp", 4), ("tp+fsdp", 4)]


@pytest.mark.parametrize(("strategy", "tp"), DEGREES, ids=[f"{s}-{t}" for s, t in DEGREES])
def test_run_and_memory_agree_on_the_degrees_and_the_verdict(
        capsys: pytest.CaptureFixture[str], strategy: str, tp: int | None) -> None:
    argv = [*SMALL, "-s", strategy, "--json", *(["--tp", str(tp)] if tp else [])]
    mem = _json(["memory", *argv], capsys)
    run = _json(["run", *argv, "--no-ranges"], capsys)
    assert (run["parallelism"]["tp"], run["parallelism"]["dp"]) == (mem["tp"], mem["dp"])
    assert run["parallelism"]["tp"] * run["parallelism"]["dp"] * run["parallelism"]["pp"] == 8
    assert run["memory"]["peak_bytes"] == mem["peak_bytes"]
    if tp == 1:  # TP of one is data parallelism: the memory of DDP/FSDP, not of TP 8
        plain = "fsdp" if strategy == "tp+fsdp" else "ddp"
        other = _json(["memory", *SMALL, "-s", plain, "--json"], capsys)
        assert mem["peak_bytes"] == other["peak_bytes"]


def test_run_json_says_what_was_simulated(capsys: pytest.CaptureFixture[str]) -> None:
    r = _json(["run", "-t", "8x5090-switch", "-w", "llama2-7b-lora", "--micro-batch", "2",
               "--grad-accum", "3", "--bucket-mb", "50", "--no-ranges", "--json"], capsys)
    assert r["parallelism"] == {"world": 8, "tp": 1, "dp": 8, "pp": 1}
    assert (r["micro_batch"], r["seq_len"], r["grad_accum"], r["bucket_mb"]) == (2, 4096, 3, 50)
    assert r["recipe"]["activation_checkpointing"] == "full"  # the preset's own
    fsdp = _json(["run", *SMALL, "-s", "fsdp", "--no-ranges", "--json"], capsys)
    assert fsdp["bucket_mb"] is None and fsdp["seq_len"] == 256


def test_json_errors_are_json_on_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", *SMALL, "-s", "ddp", "--tp", "2", "--json"]) == 2
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert doc["schema_version"] >= 1 and set(doc["error"]) == {"file", "line", "key",
                                                                "message"}
    assert "--tp does not apply" in doc["error"]["message"] and err.count("\n") == 1


def test_a_file_error_under_json_names_file_line_and_key(
        tmp_path, capsys: pytest.CaptureFixture[str]) -> None:  # noqa: ANN001
    bad = tmp_path / "w.yaml"
    bad.write_text("name: x\nmodel: {family: llama, layers: 0, hidden: 8, heads: 2, "
                   "vocab: 10}\ntraining: {seq_len: 8}\n")
    assert main(["run", "-t", "2x5090", "-w", str(bad), "--json"]) == 2
    error = json.loads(capsys.readouterr().out)["error"]
    assert (error["file"], error["line"], error["key"]) == (str(bad), 2, "model.layers")


class _Full(io.TextIOWrapper):
    """A stdout on a full disk: every write fails with ENOSPC."""

    def __init__(self) -> None:
        super().__init__(io.BytesIO())

    def write(self, text: str) -> int:
        raise OSError(28, "No space left on device")


def test_a_full_stdout_is_one_line_not_a_traceback(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr("sys.stdout", _Full())
    monkeypatch.setattr("simulator.cli._silence", lambda stream: None)
    assert main(["presets"]) == 2
    err = capsys.readouterr().err
    assert err == "stepsim presets: error: cannot write the output: No space left on device\n"


def test_a_file_that_fails_to_open_is_named_not_taken_for_stdout(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    def refused(args: object) -> int:
        raise PermissionError(13, "Permission denied", "/srv/box.yaml")

    monkeypatch.setattr("simulator.commands.presets.run", refused)
    assert main(["presets"]) == 2
    assert capsys.readouterr().err == "stepsim presets: error: /srv/box.yaml: Permission denied\n"


@pytest.mark.parametrize("command", ["run", "memory"])
def test_fail_if_no_fit_exits_3_after_the_usual_output(
        command: str, capsys: pytest.CaptureFixture[str]) -> None:
    argv = [command, "-t", "2x5090", "-w", "llama2-7b", "--json"] + \
        (["--no-ranges"] if command == "run" else [])
    assert main(argv) == 0  # without the flag, "does not fit" is an answer
    capsys.readouterr()
    assert main([*argv, "--fail-if-no-fit"]) == 3
    doc = json.loads(capsys.readouterr().out)
    assert (doc["memory"] if command == "run" else doc)["fits"] is False
    assert main([command, "-t", "2x5090", "-w", "gpt2-medium", "--fail-if-no-fit"]) == 0
