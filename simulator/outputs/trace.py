"""Chrome Trace Event JSON of a simulated step, for Perfetto (ui.perfetto.dev) or chrome://tracing.

Layout (Trace Event Format, domain-model 7.1; like a PyTorch profiler trace, 7.2):
- one process per group of identical ranks (``pid`` = its first GPU, named "GPU k (stands for
  GPUs k-m)"), or with ``every_gpu`` one per GPU ("GPU k"), sorted by index,
- one thread per stream (``tid`` = stream number, named after the stream), so slices on one
  track never overlap (Perfetto drops overlapping slices on one track),
- complete events (``"ph": "X"``) with ``ts`` and ``dur`` in microseconds, named after the
  layer / bucket / unit, ``cat`` = the span kind, args with bytes, algorithm, protocol,
- flow arrows (``"ph": "s"``/``"f"``, ``cat: dependency``) from each task to the tasks on
  other streams that wait for it (on one stream the order already says it),
- a "links" process with a counter track (``"ph": "C"``) of the utilisation (percent of
  capacity) of every link that carried traffic.
A pure function of a `Timeline` (and the programs' dependencies, for the arrows).
Kineto-shaped per-rank traces for HTA are in ``kineto.py``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from simulator.engine.timeline import Timeline

_US = 1e6  # seconds -> microseconds
_ROUND = 3  # decimals of a microsecond kept (nanoseconds): stable output, no overlap from noise


def _us(seconds: float) -> float:
    return round(seconds * _US, _ROUND)


def _meta(name: str, pid: int, tid: int | None, value: Any) -> dict[str, Any]:
    event: dict[str, Any] = {"name": name, "ph": "M", "pid": pid, "args": {}}
    if tid is not None:
        event["tid"] = tid
    event["args"]["sort_index" if name.endswith("sort_index") else "name"] = value
    return event


def chrome_trace(timeline: Timeline, *, deps: Sequence[Mapping[int, Sequence[int]]] = (),
                 every_gpu: bool = False) -> dict[str, Any]:
    """The trace as a JSON-ready dict: {"traceEvents": [...], "displayTimeUnit": "ms"}.
    ``deps``: each rank group's ``{task: the tasks it waits for}`` (for the flow arrows).
    ``every_gpu``: a process for every GPU; by default one per group of identical ranks (its
    first GPU, named with the GPUs it stands for), as the others' tracks are the same."""
    streams = timeline.streams()
    tid_of = {name: i + 1 for i, name in enumerate(streams)}
    groups = timeline.rank_groups
    group_of = {gpu: g for g, group in enumerate(groups) for gpu in group}
    gpus = range(timeline.world) if every_gpu else [group[0] for group in groups]
    events: list[dict[str, Any]] = []
    for gpu in gpus:
        events.append(_meta("process_name", gpu, None, _process_name(gpu, groups[group_of[gpu]],
                                                                     every_gpu)))
        events.append(_meta("process_sort_index", gpu, None, gpu))
        for stream, tid in tid_of.items():
            events.append(_meta("thread_name", gpu, tid, stream))
            events.append(_meta("thread_sort_index", gpu, tid, tid))
    placed: dict[int, dict[int, tuple[float, int, str]]] = {}
    for span in (s for gpu in gpus for s in timeline.spans_of(gpu)):
        start, end = _us(span.start), _us(span.end)
        events.append({
            "name": span.name, "cat": span.kind, "ph": "X", "pid": span.gpu,
            "tid": tid_of[span.stream], "ts": start, "dur": round(end - start, _ROUND),
            "args": {"kind": span.kind, **span.args},
        })
        task = span.args.get("task")
        if deps and isinstance(task, int) and end > start:
            placed.setdefault(span.gpu, {})[task] = (start, tid_of[span.stream], span.stream)
    for gpu, tasks in placed.items():
        events += flows(tasks, deps[group_of[gpu]], pid=gpu, key=gpu)
    if any(v > 0 for v in timeline.link_bytes.values()):
        pid = timeline.world
        events.append(_meta("process_name", pid, None, "links"))
        events.append(_meta("process_sort_index", pid, None, pid))
        events += link_counters(timeline, pid, _us)
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"step_time_s": timeline.step_time, "world": timeline.world,
                      "strategy": timeline.meta.get("strategy")},
    }


def _process_name(gpu: int, group: tuple[int, ...], every_gpu: bool) -> str:
    if every_gpu or len(group) == 1:
        return f"GPU {gpu}"
    span = f"{group[0]}-{group[-1]}" if list(group) == list(range(group[0], group[-1] + 1)) \
        else ", ".join(map(str, group))
    return f"GPU {gpu} (stands for GPUs {span})"


def flows(placed: Mapping[int, tuple[float, int, str]], deps: Mapping[int, Sequence[int]], *,
          pid: int, key: int) -> list[dict[str, Any]]:
    """Flow arrows for dependencies that cross streams (on one stream the order says it).
    ``placed``: task -> (start, tid, stream) of its slice; ``key`` (the GPU) keeps the ids of
    different GPUs apart in one file."""
    events: list[dict[str, Any]] = []
    n = 0
    for task, (ts, tid, stream) in placed.items():
        for dep in deps.get(task, ()):
            if dep not in placed or placed[dep][2] == stream:
                continue
            src_ts, src_tid, _ = placed[dep]
            n += 1
            flow = key * 10_000_000 + n
            events.append({"ph": "s", "cat": "dependency", "name": "dependency", "id": flow,
                           "pid": pid, "tid": src_tid, "ts": src_ts})
            events.append({"ph": "f", "bp": "e", "cat": "dependency", "name": "dependency",
                           "id": flow, "pid": pid, "tid": tid, "ts": ts})
    return events


def link_counters(timeline: Timeline, pid: int,
                  us: Callable[[float], float]) -> list[dict[str, Any]]:
    """Utilisation (percent of capacity) of every link that carried traffic, as one counter
    track per link, an event wherever it changes (``us``: seconds to the trace's ts)."""
    links = sorted(k for k, v in timeline.link_bytes.items() if v > 0)
    events: list[dict[str, Any]] = []
    last: dict[str, float] = {}
    for sample in timeline.link_usage:
        for link in links:
            util = round(100 * sample.rates.get(link, 0.0) / timeline.link_capacity[link], 2)
            if last.get(link) != util:
                events.append({"name": link, "ph": "C", "pid": pid, "ts": us(sample.time),
                               "args": {"utilization_pct": util}})
                last[link] = util
    return events


def problems(doc: dict[str, Any]) -> list[str]:
    """Structural check of a Chrome trace: what Perfetto needs to draw it as intended.

    Every X event has name/ph/pid/tid/ts/dur with dur >= 0, every (pid, tid) with slices is
    named by M metadata, and slices on one (pid, tid) never overlap. Returns the problems found.
    """
    out: list[str] = []
    events = doc.get("traceEvents")
    if not isinstance(events, list):
        return ["no traceEvents list"]
    named_threads = {(e.get("pid"), e.get("tid")) for e in events
                     if e.get("ph") == "M" and e.get("name") == "thread_name"}
    named_procs = {e.get("pid") for e in events
                   if e.get("ph") == "M" and e.get("name") == "process_name"}
    tracks: dict[tuple[Any, Any], list[tuple[float, float, str]]] = {}
    for e in events:
        if e.get("ph") != "X":
            continue
        missing = [k for k in ("name", "pid", "tid", "ts", "dur") if k not in e]
        if missing:
            out.append(f"X event without {missing}: {e}")
            continue
        if e["dur"] < 0:
            out.append(f"negative duration: {e['name']}")
        tracks.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"],
                                                            e["name"]))
    for (pid, tid), slices in tracks.items():
        if (pid, tid) not in named_threads or pid not in named_procs:
            out.append(f"track pid={pid} tid={tid} has no process/thread name")
        slices.sort()
        for (_, end, name), (start, _, nxt) in zip(slices, slices[1:], strict=False):
            if start < end - 1e-6:  # a nanosecond of rounding slack
                out.append(f"pid={pid} tid={tid}: {nxt!r} starts before {name!r} ends")
    return out


def dumps(timeline: Timeline, **kwargs: Any) -> str:
    """The trace as JSON text; the same timeline always gives the same text."""
    return json.dumps(chrome_trace(timeline, **kwargs), separators=(",", ":"), default=str)
