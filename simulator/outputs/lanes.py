"""A step's lanes, as every picture of it draws them: a lane per stream of each group of
identical GPUs (or of each GPU), a lane of exposed communication under each, the colour of
each kind of span, and where a GPU communicates with no compute beside it. Pure functions of a
Timeline, without matplotlib: plots.py draws them as a PNG, svg.py as SVG for the HTML report.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from simulator.engine.timeline import Timeline, merge

# Compute in cool colours and greys, communication in warm ones; pure red is kept for exposed
# communication alone (the optimizer is dark grey, not red), so the eye finds it at once.
COLOURS = {
    "forward": "#4C72B0", "backward": "#55A868", "recompute": "#A6A6A6",
    "optimizer": "#4D4D4D", "other": "#C8C8C8",
    "allreduce": "#DD8452", "allgather": "#8172B3", "reducescatter": "#DA8BC3",
    "broadcast": "#937860", "p2p": "#2CA9B7", "d2h": "#E6B800", "h2d": "#A67C00",
    "nvme": "#6B4E16", "cpu_optimizer": "#2F4F4F", "repeat": "#DDDDDD",
}
EXPOSED = "#E00000"  # the exposed-communication lane and its legend entry


def _gpus(group: Sequence[int]) -> str:
    if len(group) > 1 and list(group) == list(range(group[0], group[-1] + 1)):
        return f"GPU {group[0]}-{group[-1]}"
    return "GPU " + ",".join(map(str, group))


def _streams(timeline: Timeline, rep: int) -> list[str]:
    """The streams one representative uses, in the timeline's order (compute first)."""
    used = {s.stream for s in timeline.spans_of(rep)}
    return [s for s in timeline.streams() if s in used]


EXPOSED_LANE = "exposed comm"  # a lane of its own under each group's streams


def _lanes(timeline: Timeline, collapse: bool) -> list[tuple[str, int, str]]:
    """(label, representative GPU, stream) per lane, top to bottom; each GPU (or group) ends
    with its exposed-communication lane when it has any."""
    if collapse or timeline.world == 1:
        owners = [(_gpus(g), g[0]) for g in timeline.rank_groups]
    else:
        owners = [(f"GPU {gpu}", timeline.representative(gpu)) for gpu in range(timeline.world)]
    lanes = []
    for name, rep in owners:
        lanes += [(f"{name} · {s}", rep, s) for s in _streams(timeline, rep)]
        if exposed_intervals(timeline, rep):
            lanes.append((f"{name} · {EXPOSED_LANE}", rep, EXPOSED_LANE))
    return lanes


def exposed_intervals(timeline: Timeline, gpu: int | None = None) -> list[tuple[float, float]]:
    """Intervals where one GPU (default: the first) communicates and does no compute."""
    gpu = timeline.rank_groups[0][0] if gpu is None else gpu
    compute = merge((s.start, s.end) for s in timeline.compute_spans(gpu))
    out: list[tuple[float, float]] = []
    for start, end in merge((s.start, s.end) for s in timeline.comm_spans(gpu)):
        cursor = start
        for c_start, c_end in compute:
            if c_end <= cursor or c_start >= end:
                continue
            if c_start > cursor:
                out.append((cursor, c_start))
            cursor = max(cursor, c_end)
        if cursor < end:
            out.append((cursor, end))
    return out


def _idle(by_kind: Mapping[str, list[tuple[float, float]]]) -> list[tuple[float, float]]:
    """(start, width) of the gaps between a lane's first and last span."""
    bars = sorted(b for kind in by_kind.values() for b in kind)
    gaps, end = [], bars[0][0] + bars[0][1] if bars else 0.0
    for start, width in bars[1:]:
        if start > end:
            gaps.append((end, start - end))
        end = max(end, start + width)
    return gaps


def gantt_data(timeline: Timeline, collapse: bool = True) -> dict[str, object]:
    """The step's lanes as plain data (JSON, picklable) for a picture drawn elsewhere (the
    HTML report's SVG): ``{"step_ms", "exposed_ms", "lanes": [{"label", "exposed", "bars":
    [[start_ms, width_ms, kind], ...]}]}``; spans of one kind that touch are one bar."""
    ms = 1e3
    lanes = []
    for label, rep, stream in _lanes(timeline, collapse):
        if stream == EXPOSED_LANE:
            bars = [[round(a * ms, 4), round((b - a) * ms, 4), "exposed"]
                    for a, b in exposed_intervals(timeline, rep)]
            lanes.append({"label": label, "exposed": True, "bars": bars})
            continue
        spans = sorted((s.start, s.end, s.kind) for s in timeline.spans_of(rep)
                       if s.stream == stream)
        merged: list[list[float | str]] = []
        for start, end, kind in spans:
            last = merged[-1] if merged else None
            if last is not None and last[2] == kind and start - float(last[1]) <= 1e-9:
                last[1] = max(float(last[1]), end)
            else:
                merged.append([start, end, kind])
        lanes.append({"label": label, "exposed": False,
                      "bars": [[round(float(a) * ms, 4), round((float(b) - float(a)) * ms, 4), k]
                               for a, b, k in merged]})
    first = exposed_intervals(timeline, timeline.rank_groups[0][0])
    return {"step_ms": timeline.step_time * ms, "lanes": lanes,
            "exposed_ms": sum(b - a for a, b in first) * ms}
