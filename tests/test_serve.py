"""`stepsim serve` without a browser: bound to 127.0.0.1, the same answers and error lines as
the CLI for the same inputs, answers cached by command line."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from simulator.cli import main
from simulator.commands import serve


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    server, session = serve.serve(0)
    assert server.server_address[0] == "127.0.0.1"  # this machine only
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        session.close()


def _post(url: str, path: str, doc: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(url + path, data=json.dumps(doc).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as r:
        return dict(json.load(r))


def _finished(url: str, job: str) -> dict[str, Any]:
    for _ in range(600):
        with urllib.request.urlopen(f"{url}/api/job?id={job}", timeout=60) as r:
            status = dict(json.load(r))
        if status["finished"]:
            return status
        time.sleep(0.1)
    raise AssertionError("the job did not finish")


FORM = {"machines": [{"name": "8x4090-dual-socket", "gpus": "4"},
                     {"name": "8xa100-nvswitch", "gpus": "1"}],
        "workload": "llama2-7b-lora", "strategy": "ddp", "micro_batch": "",
        "seq_len": "2048", "checkpointing": ""}


def test_compare_is_the_commands_own_answer(url: str,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    job = _post(url, "/api/compare", FORM)["job"]
    status = _finished(url, job)
    argv = ["compare", "-t", "8x4090-dual-socket:4", "-t", "8xa100-nvswitch:1", "-w",
            "llama2-7b-lora", "-s", "ddp", "--seq-len", "2048"]
    assert status["command"] == "stepsim " + " ".join(argv)
    assert main([*argv, "--json"]) == 0
    assert json.loads(status["stdout"]) == json.loads(capsys.readouterr().out)
    assert status["html"].startswith('<section id="answer">')
    assert status["html"].count("<tr>") == 3  # the header and a row per machine
    assert _post(url, "/api/compare", FORM)["job"] == job  # the same command: cached


def test_the_padded_box_is_the_padded_flag_of_every_command() -> None:
    session = serve.Session()
    try:
        padded = {**FORM, "padded": True}
        assert session.command("compare", padded)[-1] == "--padded"
        assert session.command("advise", padded)[-1] == "--padded"
        assert "--padded" in session.knob_args(padded)  # the memory bar's line too
        assert "--padded" not in session.command("compare", FORM)
        assert "--padded" not in session.command("advise", {**FORM, "padded": "yes"})
    finally:
        session.close()


def test_the_memory_bar_is_stepsim_memorys_verdict(url: str,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    answer = _post(url, "/api/memory", {**FORM, "micro_batch": "3"})
    assert answer["errors"] == {}
    peaks = []
    for machine, gpus in (("8x4090-dual-socket", "4"), ("8xa100-nvswitch", "1")):
        assert main(["memory", "-t", machine, "--gpus", gpus, "-w", "llama2-7b-lora", "-s",
                     "ddp", "--micro-batch", "3", "--seq-len", "2048", "--json"]) == 0
        peaks.append(json.loads(capsys.readouterr().out)["peak_bytes"])
    assert answer["peaks"] == peaks
    assert "<svg" in answer["html"] and "--micro-batch 3 --seq-len 2048" in answer["command"]


def test_an_error_is_the_line_the_cli_prints_beside_its_field(
        url: str, capsys: pytest.CaptureFixture[str]) -> None:
    answer = _post(url, "/api/memory", {**FORM, "seq_len": "-5"})
    assert main(["memory", "-t", "8x4090-dual-socket", "--gpus", "4", "-w", "llama2-7b-lora",
                 "-s", "ddp", "--seq-len", "-5"]) == 2
    assert answer["errors"] == {"seq_len": capsys.readouterr().err.strip()}
    job = _post(url, "/api/compare", {**FORM, "strategy": "zero-3"})["job"]
    error = _finished(url, job)["error"]
    assert error["field"] == "strategy"
    assert error["line"].startswith("stepsim compare: error: unknown strategy 'zero-3'")
    assert error["line"].endswith("did you mean zero3?")


def test_a_pasted_config_is_named_as_the_user_names_it(url: str) -> None:
    config = json.dumps({"model_type": "llama", "hidden_size": 2048, "num_hidden_layers": 16,
                         "num_attention_heads": 32, "num_key_value_heads": 8,
                         "intermediate_size": 8192, "vocab_size": 128256,
                         "tie_word_embeddings": True})
    answer = _post(url, "/api/memory", {**FORM, "config_json": config, "lora_rank": "16"})
    assert answer["errors"] == {}, answer["errors"]
    assert "-w hf:config.json" in answer["command"]
    assert "--peft adapter_config.json" in answer["command"]
    broken = _post(url, "/api/memory", {**FORM, "config_json": "{\"hidden_size\": 12"})
    (line,) = broken["errors"].values()
    assert line.startswith("stepsim memory: error: config.json:1")


def test_micro_batch_max_draws_the_largest_that_fits(url: str,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """The bar at the micro-batch compare would run: the largest that fits."""
    form = {**FORM, "machines": [{"name": "8x5090-switch"}], "workload": "llama2-7b",
            "strategy": "fsdp", "seq_len": "", "micro_batch": "max"}
    answer = _post(url, "/api/memory", form)
    assert main(["memory", "-t", "8x5090-switch", "-w", "llama2-7b", "-s", "fsdp",
                 "--micro-batch", "max", "--json"]) == 0
    largest = json.loads(capsys.readouterr().out)["largest_micro_batch"]
    assert main(["memory", "-t", "8x5090-switch", "-w", "llama2-7b", "-s", "fsdp",
                 "--micro-batch", str(largest), "--json"]) == 0
    assert answer["peaks"] == [json.loads(capsys.readouterr().out)["peak_bytes"]]
    assert f"8x5090-switch (micro-batch {largest})" in answer["html"]
