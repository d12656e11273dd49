"""The confidence grade: from the validation residuals of each mechanism a run leans on (how
many points, how far off), the run's grade its weakest mechanism's."""

from __future__ import annotations

import pytest

from simulator import api
from simulator.api import confidence
from simulator.api.confidence import Evidence


@pytest.mark.parametrize(("points", "low", "high", "grade"), [
    (3, 0.95, 1.05, "high"),  # enough points, none more than 10% off
    (3, 0.91, 1.0, "high"),  # 1/0.91 = 9.9% off
    (2, 0.95, 1.05, "medium"),  # two points only
    (5, 0.80, 1.06, "medium"),  # 25% off at the slow end
    (5, 0.79, 1.0, "low"),  # 26.6% off
    (22, 0.24, 1.26, "low"),  # many points, far off (SHM without P2P)
    (1, 0.99, 1.0, "low"),  # one point, however close
    (0, None, None, "none"),
])
def test_grades_count_points_and_how_far_off_they_were(points: int, low: float | None,
                                                       high: float | None, grade: str) -> None:
    assert Evidence(points, 1, low, high, "").grade == grade


def _block(topology: str, workload: str = "gpt2-medium", strategy: str = "ddp",
           **kw: object) -> dict:
    spec = api.RunSpec(topology, workload, strategy, **kw)  # type: ignore[arg-type]
    return api.simulate(spec, baseline=False).report["confidence"]


def _graded(mechanism: str, topology: str) -> str:
    """The grade the validation set gives a mechanism on a machine, as the table holds it."""
    return confidence.evidence(mechanism, api.load_machine(topology)).grade


def test_a_box_without_p2p_rests_on_shm_which_is_graded_low() -> None:
    from simulator.api import ranges

    block = _block("8x5090-switch")
    assert list(block["mechanisms"]) == ["compute", "shm"]
    assert block["mechanisms"]["compute"]["grade"] == _graded("compute", "8x5090-switch")
    shm = block["mechanisms"]["shm"]
    points = ranges.residual_table()["shm"]["points"]
    assert shm["grade"] == "low" and shm["points"] == points >= 20 and shm["low"] < 0.5
    assert block["grade"] == "low" and block["thin"] == ["shm"]
    assert block["summary"].startswith("confidence: low: collectives through host memory")


def test_the_grade_is_the_weakest_mechanisms() -> None:
    block = _block("8xh100-nvswitch")
    grades = {m: info["grade"] for m, info in block["mechanisms"].items()}
    assert grades == {"compute": "medium", "nvlink": "medium"}
    assert block["grade"] == "medium" and block["thin"] == []
    # one GPU: compute alone
    assert _block("1x4090")["grade"] == _graded("compute", "1x4090") != "none"


def test_offload_is_graded_by_whose_offload_it_is() -> None:
    """Each kind of offload is graded by the runs that isolate it (one GPU, or collectives over
    NVLink): DeepSpeed's ZeRO-3 parameter offload on one 4090 within 12% in two runs, FSDP's
    CPU offload in one NVLink run. The four-GPU LLaMA-Factory runs, whose misses are their box's
    SHM rate, set no offload spread (scripts/validate_offload.py)."""
    from simulator.api import ranges

    table = ranges.residual_table()
    entry = table["offload:deepspeed-params"]
    assert entry["points"] == 2 and 0.85 < entry["low"] < entry["high"] < 1.0
    assert all(box.startswith("llmq-1x4090") for box in entry["boxes"])
    deepspeed = _block("4x5090", "llama2-7b", "zero3", offload="params", micro_batch=1)
    info = deepspeed["mechanisms"]["offload:deepspeed-params"]
    assert info["grade"] == "medium" and info["points"] == entry["points"]
    assert "offload:deepspeed-params" not in deepspeed["thin"]
    fsdp = _block("4x5090", "llama2-7b", "fsdp", offload="params", micro_batch=1)
    assert fsdp["mechanisms"]["offload:fsdp-params"]["points"] == 1
    assert "offload:fsdp-params" in fsdp["thin"]  # one run on one box: thin
    assert confidence.offload_mechanism("zero2", "optimizer") == "offload:deepspeed-optimizer"
    # a mechanism graded from the table: as many points as it holds, "none" without any
    ev = confidence.evidence("offload:deepspeed-optimizer", api.load_machine("4x5090"))
    assert ev.points == table.get("offload:deepspeed-optimizer", {}).get("points", 0)
    assert ev.grade == ("none" if ev.points == 0 else ev.grade)


def test_a_pipelines_sends_count_as_the_transport_they_cross() -> None:
    """Eight stages of one GPU have no collective, but their activations cross SHM."""
    block = _block("8x5090-dual-socket", "llama2-7b", "ddp", pp=8, grad_accum=8)
    assert "shm" in block["mechanisms"]


def test_a_machine_fitted_on_its_own_points_is_graded_by_them() -> None:
    """8xh200-nvswitch's NVLink points fixed a constant of the model: its own 5 points,
    within 1%, grade it high where every box together grades NVLink medium."""
    block = _block("8xh200-nvswitch", "llama3-8b", "fsdp")
    nvlink = block["mechanisms"]["nvlink"]
    assert nvlink["grade"] == "high" and nvlink["basis"].startswith("fitted on this box")


def test_every_command_prints_the_grade(capsys: pytest.CaptureFixture[str]) -> None:
    from simulator.cli import main

    assert main(["run", "-t", "2x5090", "-w", "gpt2-medium", "--no-ranges"]) == 0
    assert "confidence: low: collectives through host memory (SHM) low" in \
        capsys.readouterr().out
    assert main(["compare", "-t", "2x5090", "-t", "1x4090", "-w", "gpt2-medium",
                 "--no-ranges"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines()
               if line.startswith("confidence "))
    assert "low (collectives through host memory (SHM))" in row
    grade = _graded("compute", "1x4090")  # one GPU: compute alone
    assert row.endswith(grade if grade == "high" else f"{grade} (compute on GeForce GPUs)")
    assert main(["sweep", "-t", "2x5090", "-w", "gpt2-medium", "--bucket-mb", "5,25",
                 "--no-ranges"]) == 0
    assert "confidence: low" in capsys.readouterr().out


def test_sweep_prints_a_range_line_once_with_the_points_shares() -> None:
    from simulator.commands.sweep import merged_shares

    basis = "(uncalibrated: 9 points on 5 boxes measure 0.90-1.09x the model)"
    lines = [f"range: compute on GeForce GPUs sets {p}% of its width {basis}"
             for p in (100, 94, 97)]
    assert merged_shares(lines) == [f"range: compute on GeForce GPUs sets 94-100% of its width "
                                    f"{basis}"]
    assert merged_shares(lines[:1] * 2) == lines[:1]
    other = "range: no validation spread applies to this run's mechanisms"
    assert merged_shares([other, lines[0], other]) == [other, lines[0]]


def test_a_mechanism_calibrated_on_one_step_is_graded_by_the_better_evidence(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """One measured step has no fit error: SHM, low over every box, takes the scatter boxes
    keep about their own fit (medium); a mechanism every box grades high stays high."""
    machine = api.load_machine("2x5090")
    shm = confidence.evidence("shm", machine, {"shm": None})
    assert shm.grade == "medium" and "measured step" in shm.basis
    entry = {"low": 0.95, "high": 1.05, "points": 9,
             "boxes": {f"b{i}": {"topology": f"t{i}", "low": 0.95, "high": 1.05, "points": 3,
                                 "fit": False} for i in range(3)}}
    table = {**confidence.residual_table(), "compute:geforce": entry}
    monkeypatch.setattr(confidence, "residual_table", lambda: table)
    assert confidence.evidence("compute", machine, {"compute": None}).grade == "high"
