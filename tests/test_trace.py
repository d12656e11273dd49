"""Chrome trace structure: what Perfetto needs to show one track per GPU stream."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from simulator.engine.timeline import LinkSample, Span, Timeline
from simulator.outputs import trace


def timeline(world: int = 4) -> Timeline:
    spans = [
        Span(0, "compute", "layer 0 forward", "forward", 0.0, 0.001, {"block": 0}),
        Span(0, "compute", "layer 0 backward", "backward", 0.001, 0.003, {"block": 0}),
        Span(0, "nccl", "bucket 0", "allreduce", 0.003 / 3, 0.0021,
             {"bytes": 26214400, "algorithm": "ring", "protocol": "Simple"}),
        Span(0, "nccl", "bucket 1", "allreduce", 0.0021, 0.0035, {"bytes": 1048576}),
        Span(0, "compute", "optimizer", "optimizer", 0.0035, 0.004, {}),
    ]
    usage = [LinkSample(0.0, {}), LinkSample(0.001, {"a->b": 5e9, "b->a": 2e9}),
             LinkSample(0.0035, {})]
    return Timeline(spans=spans, world=world, step_time=0.004,
                    link_bytes={"a->b": 5e9 * 0.0025, "b->a": 2e9 * 0.0025},
                    link_capacity={"a->b": 10e9, "b->a": 10e9}, link_usage=usage,
                    meta={"strategy": "ddp"})


def test_trace_is_valid_json_with_the_perfetto_top_level() -> None:
    doc = json.loads(trace.dumps(timeline()))
    assert doc["displayTimeUnit"] == "ms"
    assert isinstance(doc["traceEvents"], list)


def test_a_process_per_gpu_and_a_thread_per_stream_are_named() -> None:
    events = json.loads(trace.dumps(timeline(world=4), every_gpu=True))["traceEvents"]
    meta = [e for e in events if e["ph"] == "M"]
    procs = {e["pid"]: e["args"]["name"] for e in meta if e["name"] == "process_name"}
    assert procs == {0: "GPU 0", 1: "GPU 1", 2: "GPU 2", 3: "GPU 3", 4: "links"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in meta if e["name"] == "thread_name"}
    assert threads[(2, 1)] == "compute" and threads[(2, 2)] == "nccl"
    assert {e["pid"] for e in meta if e["name"] == "process_sort_index"} == set(range(5))


def test_slices_are_microseconds_and_never_overlap_on_a_thread() -> None:
    events = json.loads(trace.dumps(timeline(), every_gpu=True))["traceEvents"]
    slices = [e for e in events if e["ph"] == "X"]
    assert len(slices) == 5 * 4  # replicated to every GPU
    by_track: dict[tuple[int, int], list[dict]] = defaultdict(list)
    for e in slices:
        by_track[(e["pid"], e["tid"])].append(e)
    for track in by_track.values():
        ts = [e["ts"] for e in track]
        assert ts == sorted(ts)  # monotonic per thread
        for a, b in zip(track, track[1:], strict=False):
            assert b["ts"] >= a["ts"] + a["dur"] - 1e-6
    bucket = next(e for e in slices if e["name"] == "bucket 0")
    assert bucket["ts"] == 1000.0 and bucket["dur"] == 1100.0
    assert bucket["args"]["bytes"] == 26214400 and bucket["args"]["protocol"] == "Simple"


def test_link_counters_show_utilisation_of_every_link_with_traffic() -> None:
    events = json.loads(trace.dumps(timeline()))["traceEvents"]
    counters = [e for e in events if e["ph"] == "C"]
    assert {e["pid"] for e in counters} == {4}
    ab = [(e["ts"], e["args"]["utilization_pct"]) for e in counters if e["name"] == "a->b"]
    assert ab == [(0.0, 0.0), (1000.0, 50.0), (3500.0, 0.0)]
    # the less busy link keeps its track too (ties and quieter links are not dropped)
    assert {e["name"] for e in counters} == {"a->b", "b->a"}


def test_dependencies_across_streams_are_flow_arrows() -> None:
    t = timeline()
    spans = [Span(s.gpu, s.stream, s.name, s.kind, s.start, s.end, {**s.args, "task": i})
             for i, s in enumerate(t.spans)]
    t = Timeline(spans=spans, world=2, step_time=t.step_time, link_bytes=t.link_bytes,
                 link_capacity=t.link_capacity, link_usage=t.link_usage)
    deps = [{1: (0,), 2: (1,), 3: (2,), 4: (1, 3)}]  # bucket 0 waits for backward, ...
    events = trace.chrome_trace(t, deps=deps, every_gpu=True)["traceEvents"]
    starts = [e for e in events if e["ph"] == "s"]
    ends = [e for e in events if e["ph"] == "f"]
    # 1->2 and 3->4 cross streams; 0->1, 2->3 and 1->4 stay on one stream: no arrow
    assert len(starts) == len(ends) == 2 * 2  # two arrows on each of the two GPUs
    assert len({e["id"] for e in starts}) == 4 and all(e["bp"] == "e" for e in ends)
    by_id = {e["id"]: e for e in ends}
    for s in starts:
        assert by_id[s["id"]]["pid"] == s["pid"] and by_id[s["id"]]["tid"] != s["tid"]


def test_the_same_timeline_gives_the_same_bytes() -> None:
    assert trace.dumps(timeline()) == trace.dumps(timeline())


def test_the_structural_check_passes_a_real_trace_and_catches_overlap() -> None:
    doc = json.loads(trace.dumps(timeline()))
    assert trace.problems(doc) == []
    first = next(e for e in doc["traceEvents"] if e["ph"] == "X")
    doc["traceEvents"].append({**first, "name": "intruder", "ts": first["ts"] + 1, "dur": 1.0})
    found = trace.problems(doc)
    assert len(found) == 1 and "intruder" in found[0]
    doc["traceEvents"].append({**first, "tid": 99})
    assert any("no process/thread name" in p for p in trace.problems(doc))


def test_groups_of_ranks_get_their_own_spans_in_the_trace() -> None:
    spans = [Span(0, "compute", "stage 0 forward", "forward", 0.0, 0.001),
             Span(2, "compute", "stage 1 forward", "forward", 0.001, 0.003)]
    t = Timeline(spans=spans, world=4, step_time=0.003, link_bytes={}, link_capacity={},
                 groups=((0, 1), (2, 3)))
    events = [e for e in trace.chrome_trace(t, every_gpu=True)["traceEvents"] if e["ph"] == "X"]
    assert [(e["pid"], e["name"], e["dur"]) for e in events] == [
        (0, "stage 0 forward", 1000.0), (1, "stage 0 forward", 1000.0),
        (2, "stage 1 forward", 2000.0), (3, "stage 1 forward", 2000.0)]


def test_by_default_each_group_of_identical_ranks_is_one_process() -> None:
    spans = [Span(0, "compute", "stage 0 forward", "forward", 0.0, 0.001),
             Span(2, "compute", "stage 1 forward", "forward", 0.001, 0.003)]
    t = Timeline(spans=spans, world=4, step_time=0.003, link_bytes={}, link_capacity={},
                 groups=((0, 1), (2, 3)))
    events = trace.chrome_trace(t)["traceEvents"]
    assert [(e["pid"], e["name"]) for e in events if e["ph"] == "X"] == [
        (0, "stage 0 forward"), (2, "stage 1 forward")]
    names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert names == {0: "GPU 0 (stands for GPUs 0-1)", 2: "GPU 2 (stands for GPUs 2-3)"}
    one = json.loads(trace.dumps(timeline(world=8)))["traceEvents"]  # data parallel: all alike
    assert {e["pid"] for e in one if e["ph"] == "X"} == {0}


def test_gantt_lanes_follow_the_groups() -> None:
    from simulator.outputs import plots

    spans = [Span(0, "compute", "f", "forward", 0.0, 0.001),
             Span(0, "p2p", "send", "p2p", 0.001, 0.002),
             Span(2, "compute", "f", "forward", 0.002, 0.003)]
    t = Timeline(spans=spans, world=4, step_time=0.003, link_bytes={}, link_capacity={},
                 groups=((0, 1), (2, 3)))
    assert [label for label, _, _ in plots._lanes(t, collapse=True)] == [
        "GPU 0-1 · compute", "GPU 0-1 · p2p", "GPU 0-1 · exposed comm", "GPU 2-3 · compute"]
    assert [(label, rep) for label, rep, _ in plots._lanes(t, collapse=False)][-2:] == [
        ("GPU 2 · compute", 2), ("GPU 3 · compute", 2)]
    assert plots.exposed_intervals(t, 0) == [(0.001, 0.002)]
    assert plots.exposed_intervals(t, 2) == []


def test_run_writes_one_process_per_group_unless_every_gpu_is_asked(tmp_path) -> None:  # noqa: ANN001
    from simulator.cli import main

    run = ["run", "-t", "4x5090", "-w", "gpt2-medium", "--seq-len", "512", "--no-ranges"]
    pids = {}
    for flags in ([], ["--trace-per-gpu"]):
        path = tmp_path / f"t{len(flags)}.json"
        assert main([*run, "--trace", str(path), *flags]) == 0
        doc = json.loads(path.read_text())
        assert trace.problems(doc) == []
        pids[len(flags)] = {e["pid"] for e in doc["traceEvents"] if e["ph"] == "X"}
    assert pids == {0: {0}, 1: {0, 1, 2, 3}}
    assert main([*run, "--trace-per-gpu"]) == 2  # without a trace to change


@pytest.mark.parametrize("trace_format", ["perfetto", "kineto"])
def test_a_trace_is_the_same_bytes_in_processes_of_different_hash_seeds(
        tmp_path: Path, trace_format: str) -> None:
    """Nothing in a trace depends on the order of a set or dict of strings (Python hashes
    them with a seed of the process's own): two processes write the same files. A pipeline
    with data parallelism in each stage: several programs, point-to-point and collectives."""
    written = []
    for seed in ("1", "2"):
        folder = tmp_path / seed
        folder.mkdir()
        subprocess.run(
            [sys.executable, "-m", "simulator", "run", "-t", "8x5090-dual-socket", "-w",
             "llama3.2-1b", "-s", "ddp", "--pp", "2", "--grad-accum", "4", "--no-ranges",
             "--trace", "x.json", "--trace-format", trace_format],
            cwd=folder, env={**os.environ, "PYTHONHASHSEED": seed}, check=True,
            capture_output=True)
        written.append({p.name: p.read_bytes() for p in folder.iterdir()})
    assert len(written[0]) == (1 if trace_format == "perfetto" else 8)
    assert written[0] == written[1]
