"""Kineto-shaped per-rank traces: the PyTorch profiler's layout, and Holistic Trace Analysis
(an optional dependency: those tests skip without it) agreeing with `stepsim run`."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import pytest

from simulator.cli import main
from simulator.outputs import kineto
from simulator.outputs.trace import problems

# (name, run flags): the acceptance case first, then FSDP's two streams and TP's critical path
CASES = [
    ("ddp-lora", ["-t", "8x5090-switch", "-w", "llama2-7b-lora", "-s", "ddp"]),
    ("fsdp", ["-t", "8x5090-dual-socket", "-w", "gpt2-medium", "-s", "fsdp", "--seq-len",
              "512"]),
    ("tp", ["-t", "8xa100-nvswitch", "-w", "gpt2-medium", "-s", "tp", "--seq-len", "512"]),
    ("zero2-accum", ["-t", "4x5090", "-w", "gpt2-medium", "-s", "zero2", "--seq-len", "256",
                     "--grad-accum", "3"]),
]


def _kineto(tmp_path: Path, flags: list[str], capsys: pytest.CaptureFixture[str]
            ) -> tuple[dict, list[dict], Path]:
    folder = tmp_path / "trace"
    folder.mkdir()
    assert main(["run", *flags, "--no-ranges", "--json", "--trace", str(folder / "step.json"),
                 "--trace-format", "kineto"]) == 0
    report = json.loads(capsys.readouterr().out)
    paths = kineto.rank_paths(folder / "step.json", report["gpus"])
    return report, [json.loads(Path(p).read_text()) for p in paths], folder


def test_rank_paths_sit_beside_the_given_one() -> None:
    assert kineto.rank_paths("out/step.json", 2) == ["out/step.rank0.json",
                                                     "out/step.rank1.json"]
    assert kineto.rank_paths("s.json.gz", 1) == ["s.rank0.json.gz"]
    assert kineto.rank_paths("s", 1) == ["s.rank0.json"]


def test_nccl_kernel_names_follow_ncclbuild() -> None:
    # src/device/generate.py best_kernel: the LL kernel of the algorithm; no type for gathers
    assert kineto.nccl_kernel("allreduce", "ring", "f32") == \
        "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
    assert kineto.nccl_kernel("allreduce", "tree", "bf16").startswith(
        "ncclDevKernel_AllReduce_Sum_bf16_TREE_LL(")
    assert kineto.nccl_kernel("allgather", "ring", "bf16").startswith(
        "ncclDevKernel_AllGather_RING_LL(")
    assert kineto.nccl_kernel("reducescatter", "ring", "f32").startswith(
        "ncclDevKernel_ReduceScatter_Sum_f32_RING_LL(")


def _hta_split(doc: dict) -> tuple[float, float]:
    """HTA's temporal breakdown, by its own rule (analyzers/breakdown_analysis.py): kernels are
    events with a stream; non-compute time = kernel time - merged compute - idle."""
    kernels = [e for e in doc["traceEvents"] if e.get("ph") == "X" and "stream" in
               e.get("args", {})]

    def merged(events: list[dict]) -> float:
        total, end = 0.0, -1.0
        for e in sorted(events, key=lambda e: e["ts"]):
            start, stop = e["ts"], e["ts"] + e["dur"]
            if start > end:
                total += stop - start
                end = stop
            elif stop > end:
                total += stop - end
                end = stop
        return total

    window = max(e["ts"] + e["dur"] for e in kernels) - min(e["ts"] for e in kernels)
    idle = window - merged(kernels)
    compute = merged([e for e in kernels if not re.match(r"^nccl|^Memcpy", e["name"])])
    return window - compute - idle, compute


@pytest.mark.parametrize(("name", "flags"), CASES, ids=[c[0] for c in CASES])
def test_each_rank_file_has_the_profilers_shape(tmp_path: Path, name: str, flags: list[str],
                                                capsys: pytest.CaptureFixture[str]) -> None:
    report, docs, _ = _kineto(tmp_path, flags, capsys)
    assert len(docs) == report["gpus"]
    for rank, doc in enumerate(docs):
        assert doc["distributedInfo"]["rank"] == rank
        assert doc["distributedInfo"]["world_size"] == report["gpus"]
        assert doc["deviceProperties"][0]["id"] == rank and doc["deviceProperties"][0]["numSms"]
        events = doc["traceEvents"]
        kernels = [e for e in events if e.get("cat") == "kernel"]
        assert kernels and all(e["pid"] == rank and e["args"]["device"] == rank and
                               e["args"]["stream"] == e["tid"] for e in kernels)
        assert len({e["args"]["correlation"] for e in kernels}) == len(kernels)
        assert all(isinstance(e["ts"], int) and isinstance(e["dur"], int)
                   for e in events if e.get("ph") == "X")
        assert any(e["name"] == "ProfilerStep#1" and e["cat"] == "user_annotation"
                   for e in events)
        assert any(e["name"].startswith("ncclDevKernel_") for e in kernels)
        assert problems(doc) == []  # named tracks, no overlapping slices on one stream
        flows = [e for e in events if e.get("cat") == "dependency"]
        assert {e["ph"] for e in flows} == {"s", "f"}


@pytest.mark.parametrize(("name", "flags"), CASES, ids=[c[0] for c in CASES])
def test_the_traces_expose_what_run_reports(tmp_path: Path, name: str, flags: list[str],
                                            capsys: pytest.CaptureFixture[str]) -> None:
    report, docs, _ = _kineto(tmp_path, flags, capsys)
    exposed, compute = _hta_split(docs[0])
    assert exposed / 1e6 == pytest.approx(report["exposed_comm_s"], rel=0.01, abs=5e-6)
    if name != "zero2-accum":  # a replay too long to copy is an annotation, not kernels
        assert compute / 1e6 == pytest.approx(report["compute_time_s"], rel=0.01)


def test_hta_reads_the_traces_and_agrees_with_run(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    analysis = pytest.importorskip("hta.trace_analysis")
    logging.getLogger("hta").setLevel(logging.ERROR)
    report, docs, folder = _kineto(tmp_path, CASES[0][1], capsys)
    hta = analysis.TraceAnalysis(trace_dir=str(folder))
    assert sorted(hta.t.traces) == list(range(report["gpus"]))
    breakdown = hta.get_temporal_breakdown(visualize=False)
    exposed = breakdown["non_compute_time(us)"] / 1e6
    assert all(abs(e - report["exposed_comm_s"]) <= 0.01 * report["exposed_comm_s"]
               for e in exposed), (list(exposed), report["exposed_comm_s"])
    overlap = hta.get_comm_comp_overlap(visualize=False)["comp_comm_overlap_pctg"] / 100
    hidden = 1 - report["exposed_comm_s"] / report["comm_time_s"]
    assert all(abs(o - hidden) < 0.01 for o in overlap)
    kinds, kernels = hta.get_gpu_kernel_breakdown(visualize=False)
    assert "COMMUNICATION" in set(kinds["kernel_type"])
    assert kernels["name"].str.startswith("ncclDevKernel_AllReduce").any()
