"""What scripts read: flat CSV, schema_version in every JSON, error objects, exit statuses."""

from __future__ import annotations

import csv
import io
import json
from typing import Any

import pytest

from simulator import api
from simulator.api import RunSpec
from simulator.cli import main
from simulator.outputs import csvdoc

SMALL = ["-t", "2x5090", "-w", "gpt2-medium", "--no-ranges"]


def _rows(text: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(text)))


def test_flatten_dots_nested_keys_splits_ranges_and_counts_object_lists() -> None:
    row = csvdoc.flatten({"step_time_s": 1.5, "step_time_s_range": [1.25, 2.0],
                          "memory": {"fits": False, "breakdown_bytes": {"weights": 7}},
                          "buckets": [{"bytes": 1}, {"bytes": 2}], "words": ["a", "b"],
                          "scaling_efficiency": None, "cost": {"usd_range": None}})
    assert row == {"step_time_s": 1.5, "step_time_s_low": 1.25, "step_time_s_high": 2.0,
                   "memory.fits": "false", "memory.breakdown_bytes.weights": 7,
                   "buckets.count": 2, "words": "a;b", "scaling_efficiency": "",
                   "cost.usd_low": "", "cost.usd_high": ""}


def test_rows_that_differ_share_one_header_in_first_seen_order() -> None:
    text = csvdoc.dumps([{"a": 1, "b": {"c": 2}}, {"a": 3, "d": "x,y"}], first=["d"])
    assert text.splitlines()[0] == "d,a,b.c"
    assert _rows(text) == [{"d": "", "a": "1", "b.c": "2"}, {"d": "x,y", "a": "3", "b.c": ""}]


def test_sweep_csv_is_a_header_and_a_row_per_point(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["sweep", *SMALL, "--bucket-mb", "5,25,100", "--micro-batch", "1,2"]
    assert main([*argv, "--json"]) == 0
    reports = json.loads(capsys.readouterr().out)
    assert main([*argv, "--csv"]) == 0
    rows = _rows(capsys.readouterr().out)
    assert len(rows) == 6 == len(reports)
    assert list(rows[0])[:2] == ["point.bucket_mb", "point.micro_batch"]
    for row, report in zip(rows, reports, strict=True):
        assert float(row["step_time_s"]) == report["step_time_s"]  # full precision
        assert float(row["tokens_per_s"]) == report["tokens_per_s"]
        assert row["memory.fits"] == str(report["memory"]["fits"]).lower()
        assert int(row["buckets.count"]) == len(report["buckets"])
        assert float(row["point.bucket_mb"]) == report["point"]["bucket_mb"]


def test_compare_csv_has_a_row_per_run_with_its_ranges(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", "-t", "2x5090", "-t", "4x5090", "-w", "gpt2-medium", "-s", "ddp",
                 "-s", "fsdp", "--csv"]) == 0
    rows = _rows(capsys.readouterr().out)
    assert [(r["topology"], r["strategy"]) for r in rows] == [
        ("2x5090", "ddp"), ("2x5090", "fsdp"), ("4x5090", "ddp"), ("4x5090", "fsdp")]
    for r in rows:
        low, mid, high = (float(r[k]) for k in ("step_time_s_low", "step_time_s",
                                                 "step_time_s_high"))
        assert low <= mid <= high
    assert rows[1]["buckets.count"] == ""  # FSDP has no DDP buckets: an empty cell


def _answer(candidates: list[dict[str, Any]]) -> dict[str, Any]:
    return {"candidates": candidates, "best": candidates[0] if candidates else None,
            "nothing_fits": not candidates, "what_would_fit": [], "explanation": ["x"]}


def test_advise_csv_ranks_its_candidates(monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    ranked = [api.simulate(RunSpec("2x5090", "gpt2-medium", s), ranges=False).report
              for s in ("fsdp", "ddp")]  # advise's own search is tested in test_advise.py
    monkeypatch.setattr("simulator.advice.advise.advise", lambda *a, **k: _answer(ranked))
    assert main(["advise", "-t", "2x5090", "-w", "gpt2-medium", "--csv"]) == 0
    rows = _rows(capsys.readouterr().out)
    assert [(r["rank"], r["strategy"]) for r in rows] == [("1", "fsdp"), ("2", "ddp")]
    monkeypatch.setattr("simulator.advice.advise.advise", lambda *a, **k: _answer([]))
    assert main(["advise", "-t", "2x5090", "-w", "llama2-70b", "--fail-if-no-fit"]) == 3
    assert main(["advise", "-t", "2x5090", "-w", "llama2-70b"]) == 0


@pytest.mark.parametrize("command", ["sweep", "compare"])
def test_fail_if_no_fit_is_3_only_when_no_point_fits(
        command: str, capsys: pytest.CaptureFixture[str]) -> None:
    many = ["--micro-batch", "1,2"] if command == "sweep" else ["-s", "ddp", "-s", "fsdp"]
    big = [command, "-t", "2x5090", "-w", "llama2-7b", "--no-ranges", *many]
    assert main([*big, "--csv"]) == 0  # "does not fit" is an answer without the flag
    capsys.readouterr()
    assert main([*big, "--csv", "--fail-if-no-fit"]) == 3
    rows = _rows(capsys.readouterr().out)
    assert rows and all(r["memory.fits"] == "false" for r in rows)  # the output still came
    assert main([command, *SMALL, *many, "--fail-if-no-fit"]) == 0


def test_json_and_csv_together_are_refused_before_any_work(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sweep", *SMALL, "--bucket-mb", "5,25", "--json", "--csv"]) == 2
    out, err = capsys.readouterr()
    assert json.loads(out)["error"]["message"].startswith("--json and --csv")


# every command that prints JSON, with the cheapest arguments that make it print
JSON_COMMANDS = {
    "run": ["run", *SMALL],
    "memory": ["memory", "-t", "2x5090", "-w", "gpt2-medium"],
    "collective": ["collective", "-t", "2x5090", "--op", "allreduce", "-b", "1K", "-e", "4K"],
    "topo": ["topo", "-t", "2x5090"],
    "presets": ["presets"],
    "sweep": ["sweep", *SMALL, "--bucket-mb", "5,25"],
    "compare": ["compare", *SMALL],
}


@pytest.mark.parametrize("command", list(JSON_COMMANDS))
def test_every_json_carries_its_schema_version(
        command: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*JSON_COMMANDS[command], "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    for obj in doc if isinstance(doc, list) else [doc]:
        assert obj["schema_version"] == 1 and next(iter(obj)) == "schema_version"


@pytest.mark.parametrize("argv", [
    ["sweep", *SMALL, "--bucket-mb", "5,,25"],  # a command's own check
    ["compare", *SMALL, "--gpus", "x"],  # a bad flag value
    ["advise", "-t", "2x5090", "-w", "gpt2-medium", "--frobnicate"],  # an unknown flag
    ["topo", "-t", "no-such-machine"],  # a file that is not there
    ["collective", "-t", "2x5090", "--op", "allreduce", "-b", "1K", "-e", "x"],
    ["schema", "topologies"],  # argparse's own choices
])
def test_input_errors_under_json_are_an_error_object_and_exit_2(
        argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*argv, "--json"]) == 2
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert set(doc) == {"schema_version", "error"}
    assert set(doc["error"]) == {"file", "line", "key", "message"}
    assert doc["error"]["message"] and err.count("\n") == 1 and doc["error"]["message"] in err


def test_a_bad_flag_value_under_json_names_the_flag_as_its_key(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sweep", *SMALL, "--gpus", "1,x", "--json"]) == 2
    error = json.loads(capsys.readouterr().out)["error"]
    assert error["key"] == "--gpus" and error["message"].startswith("expected a whole number")
    assert error["file"] is None and error["line"] is None
