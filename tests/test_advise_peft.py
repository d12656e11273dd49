"""advise --peft: every candidate trains the adapter_config.json's LoRA, and its winner is what
`stepsim run` gives with the command it prints (--peft included)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from simulator import api
from simulator.advice import advise
from simulator.cli import main
from simulator.outputs.cost import Prices

PEFT = str(Path(__file__).resolve().parent / "fixtures" / "peft" / "adapter_config.json")


def test_every_candidate_trains_the_adapters_and_the_winner_reruns(
        capsys: pytest.CaptureFixture[str]) -> None:
    answer = advise.advise([advise.PricedMachine("2x5090", Prices())], "llama3.2-1b", jobs=1,
                           peft=PEFT)
    assert answer["candidates"] and all(c["options"]["peft"] == PEFT
                                        for c in answer["candidates"])
    job = api.job_of(api.RunSpec("2x5090", "llama3.2-1b", peft=PEFT))
    assert job.finetune == "lora" and job.n_trainable < job.n_params / 50
    best = answer["best"]
    assert "--peft " + PEFT in best["command"]
    assert main(shlex.split(best["command"])[1:] + ["--json"]) == 0
    run = json.loads(capsys.readouterr().out)
    assert run["step_time_s"] == pytest.approx(best["step_time_s"], rel=1e-9)
