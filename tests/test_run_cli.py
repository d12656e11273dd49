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

from simulator import api
from simulator.api import runner
from simulator.cli import main
from simulator.engine.program import Comm, Compute, Program
from simulator.outputs import report
from simulator.outputs import trace as trace_module


@dataclass(frozen=True)
class Options:
    bucket_mb: float | None = None
    tp: int | None = None
    overlap: bool = True
    grad_compression: str = "none"
    gradient_as_bucket_view: bool = False
    legacy_reducer: bool = False
    sequence_parallel: bool = False
    reshard_after_forward: bool = True
    zero_overlap_comm: bool | None = None
    reduce_bucket_size: int | None = None
    allgather_bucket_size: int | None = None
    pp: int = 1
    schedule: str = "1f1b"
    virtual_stages: int = 1
    offload: str = "none"
    pin_memory: bool | None = None


def build(name, job, machine, options):  # noqa: ANN001, ANN201
    return [build_one(name, job, machine, options)]


def build_one(name, job, machine, options):  # noqa: ANN001, ANN201
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
    api.clear_caches()
    if "real" not in request.node.name:
        monkeypatch.setattr(runner, "strategies", SimpleNamespace(Options=Options, build=build))


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


def test_a_job_that_does_not_fit_gets_its_verdict_not_figures(
        capsys: pytest.CaptureFixture[str]) -> None:
    """No step time, throughput or price for a step that runs out of memory: the verdict, its
    memory by kind and what would fit (each checked by the memory model)."""
    assert main(["run", "-t", "8x5090-switch", "-w", "llama2-7b", "-s", "fsdp",
                 "--checkpointing", "none"]) == 0
    out = capsys.readouterr().out
    first, *rest = out.splitlines()
    assert "DOES NOT FIT: needs 38.9 GiB of 32.0 GiB per GPU" in first
    assert not any(line.startswith(("step time", "tokens/s", "price", "MFU"))
                   for line in rest)
    assert "$" not in out and "per million tokens" not in out
    assert "not simulated" in out
    assert "--checkpointing full: needs 16.7 of 32.0 GiB per GPU" in out
    assert main(["run", "-t", "8x5090-switch", "-w", "llama2-7b", "-s", "fsdp",
                 "--checkpointing", "none", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["simulated"] is False and doc["memory"]["fits"] is False
    assert not {"step_time_s", "tokens_per_s", "cost"} & set(doc)
    assert doc["what_would_fit"][0]["flags"] == "--checkpointing full"
    assert main(["run", "-t", "8x5090-switch", "-w", "llama2-7b", "-s", "fsdp",
                 "--checkpointing", "none", "--fail-if-no-fit"]) == 3


def test_simulated_anyway_every_figure_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "-t", "4x5090", "-w", "llama2-70b", "--simulate-anyway",
                 "--no-ranges"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("memory: DOES NOT FIT")
    assert "simulated anyway" in out.splitlines()[0]
    figures = [line for line in out.splitlines()
               if line.startswith(("step time", "tokens/s", "MFU", "price"))]
    assert len(figures) >= 4 and all(line.endswith("(as if it fit)") for line in figures)
    assert main(["run", "-t", "4x5090", "-w", "llama2-70b", "--simulate-anyway",
                 "--no-ranges", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["simulated_anyway"] is True and doc["step_time_s"] > 0


def test_micro_batch_max_runs_the_largest_that_fits(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["run", "-t", "8x5090-switch", "-w", "llama2-7b", "-s", "fsdp", "--no-ranges",
            "--json"]
    assert main([*argv, "--micro-batch", "max"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["micro_batch"] == 5 and doc["memory"]["fits"]
    assert main(["memory", "-t", "8x5090-switch", "-w", "llama2-7b", "-s", "fsdp",
                 "--micro-batch", "max", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["largest_micro_batch"] == 5
    assert main([*argv, "--micro-batch", "6"]) == 0  # one more does not fit
    assert json.loads(capsys.readouterr().out)["simulated"] is False


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
    assert main(["compare", "-t", "2x3090ti-nvlink", "-t", "8xh100-nvswitch", "-w",
                 "gpt2-medium", "--gpus", "2"]) == 0
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


# --- recipe flags (framework option names), against the real strategies ---

SMALL = ["-t", "4x5090", "-w", "gpt2-medium", "--seq-len", "512"]


def _run_json(argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict:  # type: ignore[type-arg]
    assert main(["run", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _trace_events(argv: list[str], path: Path, capsys: pytest.CaptureFixture[str]) -> list[dict]:  # type: ignore[type-arg]
    assert main(["run", *argv, "--trace", str(path)]) == 0
    capsys.readouterr()
    return [e for e in json.loads(path.read_text())["traceEvents"] if e.get("ph") == "X"]


def test_real_bf16_comm_hook_halves_the_all_reduced_bytes(
        capsys: pytest.CaptureFixture[str]) -> None:
    plain = _run_json([*SMALL, "--gpus", "2"], capsys)
    hooked = _run_json([*SMALL, "--gpus", "2", "--comm-hook", "bf16"], capsys)
    assert [b["bytes"] // 2 for b in plain["buckets"]] == [b["bytes"] for b in hooked["buckets"]]
    assert hooked["comm_time_s"] < plain["comm_time_s"]
    assert hooked["recipe"]["comm_hook"] == "bf16"


def test_real_full_checkpointing_lowers_memory_and_recomputes(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plain = _run_json([*SMALL, "--gpus", "2", "--checkpointing", "none"], capsys)
    full = _run_json([*SMALL, "--gpus", "2", "--checkpointing", "full"], capsys)
    assert full["memory"]["peak_bytes"] < plain["memory"]["peak_bytes"]
    assert full["recipe"]["activation_checkpointing"] == "full"
    assert full["compute_time_s"] > plain["compute_time_s"]
    kinds = {e["cat"] for e in _trace_events([*SMALL, "--gpus", "2", "--checkpointing", "full"],
                                             tmp_path / "t.json", capsys)}
    assert "recompute" in kinds
    none = {e["cat"] for e in _trace_events([*SMALL, "--gpus", "2", "--checkpointing", "none"],
                                            tmp_path / "u.json", capsys)}
    assert "recompute" not in none


def test_real_gradient_as_bucket_view_drops_the_bucket_copies_and_buffer(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = [*SMALL, "--gpus", "2"]
    plain = _run_json(argv, capsys)
    view = _run_json([*argv, "--gradient-as-bucket-view"], capsys)
    assert view["memory"]["peak_bytes"] < plain["memory"]["peak_bytes"]
    assert view["compute_time_s"] < plain["compute_time_s"]  # hooks copy less, no copy-back
    names = {e["name"] for e in _trace_events(argv, tmp_path / "a.json", capsys)}
    view_names = {e["name"] for e in _trace_events([*argv, "--gradient-as-bucket-view"],
                                                   tmp_path / "b.json", capsys)}
    assert "ddp.copy_back" in names and "ddp.copy_back" not in view_names


def test_real_no_reshard_after_forward_skips_backward_gathers_and_costs_memory(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = [*SMALL, "--gpus", "2", "-s", "fsdp"]
    gathers = [e for e in _trace_events(argv, tmp_path / "a.json", capsys)
               if e["cat"] == "allgather"]
    kept = [e for e in _trace_events([*argv, "--no-reshard-after-forward"], tmp_path / "b.json",
                                     capsys) if e["cat"] == "allgather"]
    assert any(".bwd." in e["name"] for e in gathers)
    assert not any(".bwd." in e["name"] for e in kept) and 0 < len(kept) < len(gathers)
    plain = _run_json(argv, capsys)
    unsharded = _run_json([*argv, "--no-reshard-after-forward"], capsys)
    assert unsharded["memory"]["peak_bytes"] > plain["memory"]["peak_bytes"]
    assert unsharded["step_time_s"] <= plain["step_time_s"]


def test_real_zero_overlap_comm_is_no_slower_and_overlaps(
        capsys: pytest.CaptureFixture[str]) -> None:
    # llama3.2-1b (1.2B parameters) fills more than one 5e8-element reduce bucket
    argv = ["-t", "8xh100-nvswitch", "--gpus", "2", "-w", "llama3.2-1b", "--seq-len", "512",
            "-s", "zero2"]
    plain = _run_json(argv, capsys)
    overlap = _run_json([*argv, "--overlap-comm"], capsys)
    assert overlap["step_time_s"] <= plain["step_time_s"]
    assert plain["exposed_comm_s"] == pytest.approx(plain["comm_time_s"])  # backward waits
    assert overlap["exposed_comm_s"] < overlap["comm_time_s"]
    # the second IPG buffer DeepSpeed allocates for overlap_comm
    assert overlap["memory"]["peak_bytes"] > plain["memory"]["peak_bytes"]


def test_real_sequence_parallel_gathers_and_scatters_on_the_tp_stream(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = [*SMALL, "--gpus", "2", "-s", "tp"]

    def tp_kinds(events: list[dict], path: Path) -> set[str]:  # type: ignore[type-arg]
        doc = json.loads(path.read_text())["traceEvents"]
        tids = {e["tid"] for e in doc if e.get("name") == "thread_name"
                and e["args"]["name"] == "tp"}
        return {e["cat"] for e in events if e["tid"] in tids}

    plain = tp_kinds(_trace_events(argv, tmp_path / "a.json", capsys), tmp_path / "a.json")
    sp = tp_kinds(_trace_events([*argv, "--sequence-parallel"], tmp_path / "b.json", capsys),
                  tmp_path / "b.json")
    assert plain == {"allreduce"}
    assert sp == {"allgather", "reducescatter"}
    mem = _run_json([*argv, "--sequence-parallel"], capsys)["memory"]
    assert mem["peak_bytes"] < _run_json(argv, capsys)["memory"]["peak_bytes"]


def _png_height(path: Path) -> int:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return int.from_bytes(data[20:24], "big")  # IHDR: width, then height


def test_real_gantt_per_gpu_draws_a_lane_per_gpu(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    shared, per_gpu = tmp_path / "a.png", tmp_path / "b.png"
    assert main(["run", *SMALL, "--gantt", str(shared)]) == 0
    assert main(["run", *SMALL, "--gantt", str(per_gpu), "--gantt-per-gpu"]) == 0
    assert _png_height(per_gpu) > 2 * _png_height(shared)


@pytest.mark.parametrize("argv, message", [
    (["-s", "fsdp", "--comm-hook", "bf16"], "--comm-hook does not apply to -s fsdp"),
    (["-s", "zero2", "--gradient-as-bucket-view"], "--gradient-as-bucket-view does not apply"),
    (["-s", "ddp", "--sequence-parallel"], "--sequence-parallel does not apply to -s ddp"),
    (["-s", "tp", "--tp", "1", "--sequence-parallel"], "at least 2"),
    (["-s", "ddp", "--no-reshard-after-forward"], "--no-reshard-after-forward does not apply"),
    (["-s", "fsdp", "--overlap-comm"], "--overlap-comm does not apply to -s fsdp"),
    (["--no-overlap", "--comm-hook", "bf16"], "local DDP"),
    (["--comm-hook", "fp8"], "--comm-hook: expected one of none, bf16"),
    (["--checkpointing", "some"], "--checkpointing: expected one of none, selective, op, full"),
    (["--gantt-per-gpu"], "--gantt FILE.png"),
])
def test_real_recipe_flags_that_do_not_apply_exit_2_with_one_line(
        argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", *SMALL, "--gpus", "2", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_real_compare_and_sweep_pass_the_recipe_flags_on(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", *SMALL, "--gpus", "2", "-s", "ddp", "-s", "fsdp",
                 "--comm-hook", "bf16"]) == 2
    assert "does not apply to -s fsdp" in capsys.readouterr().err
    assert main(["compare", *SMALL, "--gpus", "2", "-s", "fsdp", "-s", "tp+fsdp",
                 "--no-reshard-after-forward", "--json"]) == 0
    reports = json.loads(capsys.readouterr().out)
    assert [r["recipe"]["reshard_after_forward"] for r in reports] == [False, False]
    assert main(["sweep", *SMALL, "--gpus", "2", "--bucket-mb", "5,25", "--comm-hook", "bf16",
                 "--checkpointing", "full", "--json"]) == 0
    points = json.loads(capsys.readouterr().out)
    assert [p["recipe"]["comm_hook"] for p in points] == ["bf16", "bf16"]
    assert {p["recipe"]["activation_checkpointing"] for p in points} == {"full"}


def test_run_and_memory_give_the_same_verdict(capsys: pytest.CaptureFixture[str]) -> None:
    for strategy in ("ddp", "fsdp", "zero3"):
        base = ["-t", "4x5090", "-w", "gpt2-medium", "-s", strategy, "--json"]
        assert main(["memory", *base]) == 0
        mem = json.loads(capsys.readouterr().out)
        assert main(["run", *base]) == 0
        run = json.loads(capsys.readouterr().out)
        assert run["memory"]["peak_bytes"] == mem["peak_bytes"], strategy
