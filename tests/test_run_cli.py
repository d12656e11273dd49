"""`stepsim run`, `compare` and `sweep` end to end: exit codes, text, JSON keys, files written.

The strategy here is a small stand-in (forward and backward per block, an all-reduce per
four blocks, the optimizer), so these tests check the commands, not a strategy's physics.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest

from simulator import report
from simulator import trace as trace_module
from simulator.cli import main
from simulator.commands import run as run_cmd
from simulator.program import Comm, Compute, Program


@dataclass(frozen=True)
class Options:
    bucket_mb: float | None = None
    tp: int | None = None
    overlap: bool = True


def build(name, job, machine, options):  # noqa: ANN001, ANN201
    p = Program(world=machine.n_gpus, meta={"strategy": name, "buckets": []})
    for b in range(job.n_blocks):
        p.add("compute", Compute(f"layer {b} forward", "forward", 1e-3, 1e12, b))
    ranks = tuple(range(machine.n_gpus))
    cap = (options.bucket_mb or 25) * 2**20
    pending = 0
    for b in reversed(range(job.n_blocks)):
        c = p.add("compute", Compute(f"layer {b} backward", "backward", 2e-3, 2e12, b))
        pending += sum(x.numel for x in job.params if x.block == b) * 4
        if pending >= cap or b == 0:
            t = p.add("nccl", Comm(f"bucket {len(p.meta['buckets'])}", "allreduce", pending,
                                   (ranks,)), deps=(c,))
            p.meta["buckets"].append({"bytes": pending, "tensors": 9, "task": t})
            pending = 0
    p.add("compute", Compute("optimizer", "optimizer", 1e-3),
          deps=tuple(b["task"] for b in p.meta["buckets"]))
    return p


@pytest.fixture(autouse=True)
def fake_strategies(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> None:
    run_cmd.single_gpu_tokens_per_s.cache_clear()
    if "real" not in request.node.name:
        monkeypatch.setattr(run_cmd, "strategies", SimpleNamespace(Options=Options, build=build))


def test_run_json_has_every_contract_key(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "-t", "4x5090", "-w", "gpt2-medium", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert set(report.CONTRACT_KEYS) <= set(r)
    assert set(r["memory"]["breakdown_bytes"]) == set(report.BREAKDOWN_KEYS)
    assert r["gpus"] == 4 and r["buckets"] and r["bottleneck"]["link"]
    assert 0 < r["scaling_efficiency"] <= 1.0
    starts = [b["start_s"] for b in r["buckets"]]
    assert starts == sorted(starts)


def test_run_text_is_a_compact_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "-t", "4x5090", "-w", "gpt2-medium", "--gpus", "2"]) == 0
    out = capsys.readouterr().out
    for row in ("step time", "tokens/s per GPU", "MFU", "exposed communication",
                "scaling efficiency", "memory per GPU", "bottleneck link", "buckets:"):
        assert row in out
    assert out.index("step time") < out.index("memory per GPU")


def test_a_job_that_does_not_fit_says_so_first(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "-t", "4x5090", "-w", "llama2-70b"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("memory: DOES NOT FIT")
    assert "step time" in out


def test_run_writes_trace_gantt_and_memory_files(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    trace, gantt, mem = tmp_path / "s.json", tmp_path / "s.png", tmp_path / "m.png"
    assert main(["run", "-t", "4x5090", "-w", "gpt2-medium", "--trace", str(trace),
                 "--gantt", str(gantt), "--memory-png", str(mem)]) == 0
    doc = json.loads(trace.read_text())
    assert doc["traceEvents"] and trace_module.problems(doc) == []
    for png in (gantt, mem):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.png", "s.json", "s.png"]


@pytest.mark.parametrize("argv, message", [
    (["-s", "pipeline"], "unknown strategy"),
    (["--gpus", "0"], "--gpus: must be at least 1"),
    (["--gpus", "16"], "only 4 GPUs"),
    (["--bucket-mb", "big"], "--bucket-mb: expected a number"),
])
def test_bad_flags_are_one_line_and_exit_2(argv: list[str], message: str,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "-t", "4x5090", "-w", "gpt2-medium", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_unwritable_output_leaves_nothing_behind(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nope" / "s.json"
    assert main(["run", "-t", "4x5090", "-w", "gpt2-medium", "--trace", str(missing)]) == 2
    assert not (tmp_path / "nope").exists()


def test_compare_puts_machines_side_by_side(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", "-t", "4x5090", "-t", "2x5090", "-w", "gpt2-medium"]) == 0
    out = capsys.readouterr().out
    assert "4x5090" in out and "2x5090" in out and "step time" in out
    assert main(["compare", "-t", "4x5090", "-t", "2x5090", "-w", "gpt2-medium", "--json"]) == 0
    reports = json.loads(capsys.readouterr().out)
    assert [r["gpus"] for r in reports] == [4, 2]
    # per dollar of GPUs: 4 cards cost twice 2 cards; throughput per $1k follows tokens/s
    four, two = reports
    assert four["gpus_price_usd"] == pytest.approx(2 * two["gpus_price_usd"])
    assert four["tokens_per_s_per_kusd"] == pytest.approx(
        four["tokens_per_s"] / four["gpus_price_usd"] * 1000)


def test_compare_lists_a_row_only_some_machines_have(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", "-t", "2x5090", "-t", "8xh100-nvswitch", "-w", "gpt2-medium",
                 "--gpus", "2"]) == 0
    out = capsys.readouterr().out
    price_row = next(line for line in out.splitlines() if "price" in line and "$" in line)
    assert "-" in price_row and "per million tokens" in price_row


def test_sweep_over_bucket_sizes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    png = tmp_path / "sweep.png"
    assert main(["sweep", "-t", "4x5090", "-w", "gpt2-medium", "--bucket-mb", "1,100,400",
                 "--jobs", "1", "--json", "--png", str(png)]) == 0
    reports = json.loads(capsys.readouterr().out)
    assert [r["point"]["bucket_mb"] for r in reports] == [1, 100, 400]
    counts = [len(r["buckets"]) for r in reports]
    assert counts[0] > counts[1] > counts[2] >= 1
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert main(["sweep", "-t", "4x5090", "-w", "gpt2-medium", "--gpus", "1,2"]) == 0
    assert "gpus=2" in capsys.readouterr().out


@pytest.mark.parametrize("strategy", ["ddp", "zero2", "fsdp", "tp+ddp"])
def test_real_strategies_give_the_contract_and_a_clean_trace(
        strategy: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "t.json"
    assert main(["run", "-t", "4x5090", "-w", "gpt2-medium", "-s", strategy, "--json",
                 "--trace", str(out)]) == 0
    r = json.loads(capsys.readouterr().out)
    assert set(report.CONTRACT_KEYS) <= set(r)
    assert r["step_time_s"] >= r["compute_time_s"] > 0
    assert r["step_time_s"] >= r["exposed_comm_s"]
    if strategy in ("ddp", "tp+ddp"):
        assert r["buckets"] and all(b["end_s"] > b["start_s"] for b in r["buckets"])
    assert trace_module.problems(json.loads(out.read_text())) == []
