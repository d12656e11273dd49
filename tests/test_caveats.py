"""How sure advise's pick is: its thinly validated mechanisms, those every candidate shares,
and the best candidate that avoids the others."""

from __future__ import annotations

import json

import pytest

from simulator.advice import caveats
from simulator.cli import main


def _candidate(label: str, tokens: float, thin: list[str], machine: str = "box") -> dict:
    words = {"shm": "SHM collectives", "offload:deepspeed-params": "ZeRO-3 offload",
             "compute": "compute"}
    mechanisms = {m: {"grade": "low" if m in thin else "high", "words": words[m],
                      "basis": f"{m} points"} for m in ("compute", *thin)}
    return {"label": label, "tokens_per_s": tokens, "topology": machine,
            "options": {"topology": machine, "gpus": None},
            "confidence": {"grade": "low" if thin else "high", "thin": thin,
                           "mechanisms": mechanisms, "summary": f"confidence: {label}"}}


def test_the_pick_on_thin_offload_names_the_best_that_avoids_it() -> None:
    pick = _candidate("zero3 offload", 30_000, ["shm", "offload:deepspeed-params"])
    other = _candidate("zero3 offload mb2", 29_500, ["shm", "offload:deepspeed-params"])
    sure = _candidate("fsdp offload", 29_000, ["shm"])
    reports = [pick, other, sure]
    assert caveats.alternative(pick, reports) is sure
    common = caveats.shared(pick, reports)
    assert common == {"shm"}  # every candidate on the box rests on it
    lines = caveats.lines(pick, sure, common)
    assert lines[0] == "confidence: zero3 offload"
    assert lines[1].startswith("thinly validated: the pick rests on ZeRO-3 offload (low: ")
    assert "The best pick that does not: fsdp offload on box: 29,000 tokens/s (3% fewer)" \
        in lines[1]
    assert lines[2].startswith("every candidate on box rests on SHM collectives (low: ")
    assert "nccl-tests log" in lines[2]


def test_a_sure_pick_has_nothing_to_say() -> None:
    pick = _candidate("ddp", 10, [])
    assert caveats.alternative(pick, [pick]) is None
    assert caveats.lines(pick, None, caveats.shared(pick, [pick])) == ["confidence: ddp"]


def test_no_candidate_avoids_it_without_another_thin_one() -> None:
    pick = _candidate("zero3 offload", 10, ["offload:deepspeed-params"])
    shm = _candidate("ddp", 5, ["shm"])  # avoids the offload, rests on SHM instead
    assert caveats.alternative(pick, [pick, shm]) is None
    (line,) = caveats.lines(pick, None, caveats.shared(pick, [pick, shm]))[1:]
    assert "no ranked candidate avoids it without resting on another thin one" in line


def test_advise_takes_a_gpu_count_and_grades_its_pick(
        capsys: pytest.CaptureFixture[str]) -> None:
    """One GPU of a box without P2P: no collective, so no SHM; the grade is compute's."""
    assert main(["advise", "-t", "2x5090:1", "-w", "gpt2-medium", "--jobs", "1", "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["best"]["gpus"] == 1 and answer["best"]["options"]["gpus"] == 1
    assert answer["confidence"]["grade"] == "high"
    assert list(answer["confidence"]["mechanisms"]) == ["compute"]
    assert "on 2x5090:1" in answer["explanation"][2]
