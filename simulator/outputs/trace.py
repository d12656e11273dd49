"""Chrome Trace Event JSON of a simulated step, for Perfetto (ui.perfetto.dev) or chrome://tracing.

Layout (Trace Event Format, domain-model 7.1; like a PyTorch profiler trace, 7.2):
- one process per GPU (``pid`` = GPU index, named "GPU k" and sorted by index),
- one thread per stream (``tid`` = stream number, named after the stream), so slices on one
  track never overlap (Perfetto drops overlapping slices on one track),
- complete events (``"ph": "X"``) with ``ts`` and ``dur`` in microseconds, named after the
  layer / bucket / unit, ``cat`` = the span kind, args with bytes, algorithm, protocol,
- a "links" process with counter tracks (``"ph": "C"``) of the utilisation (percent of
  capacity) of the busiest links over the step.
A pure function of a `Timeline`.
"""

from __future__ import annotations

import json
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


def busiest_links(timeline: Timeline, count: int) -> list[str]:
    """The `count` links with the highest utilisation over the step, busiest first."""
    ranked = sorted(timeline.link_bytes, key=lambda k: (-timeline.link_utilization(k), k))
    return [k for k in ranked if timeline.link_bytes[k] > 0][:count]


def chrome_trace(timeline: Timeline, *, counter_links: int = 8) -> dict[str, Any]:
    """The trace as a JSON-ready dict: {"traceEvents": [...], "displayTimeUnit": "ms"}."""
    streams = timeline.streams()
    tid_of = {name: i + 1 for i, name in enumerate(streams)}
    events: list[dict[str, Any]] = []
    for gpu in range(timeline.world):
        events.append(_meta("process_name", gpu, None, f"GPU {gpu}"))
        events.append(_meta("process_sort_index", gpu, None, gpu))
        for stream, tid in tid_of.items():
            events.append(_meta("thread_name", gpu, tid, stream))
            events.append(_meta("thread_sort_index", gpu, tid, tid))
    for span in timeline.spans_per_gpu():
        start, end = _us(span.start), _us(span.end)
        events.append({
            "name": span.name, "cat": span.kind, "ph": "X", "pid": span.gpu,
            "tid": tid_of[span.stream], "ts": start, "dur": round(end - start, _ROUND),
            "args": {"kind": span.kind, **span.args},
        })
    links = busiest_links(timeline, counter_links)
    if links:
        pid = timeline.world
        events.append(_meta("process_name", pid, None, "links"))
        events.append(_meta("process_sort_index", pid, None, pid))
        last: dict[str, float] = {}
        for sample in timeline.link_usage:
            for link in links:
                util = round(100 * sample.rates.get(link, 0.0) / timeline.link_capacity[link], 2)
                if last.get(link) != util:
                    events.append({"name": link, "ph": "C", "pid": pid,
                                   "ts": _us(sample.time), "args": {"utilization_pct": util}})
                    last[link] = util
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"step_time_s": timeline.step_time, "world": timeline.world,
                      "strategy": timeline.meta.get("strategy")},
    }


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
