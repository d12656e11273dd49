"""The record of one simulated step: spans on streams, and what the links carried.

A `Span` is one task's run on one stream of one GPU (start and end in seconds from the start
of the step). The engine runs one program for all data-parallel ranks (they are symmetric), so
it records the spans of one representative GPU and `Timeline.spans_per_gpu()` replicates them
for every GPU of the world when an exporter needs them all.

`LinkSample`s are the fabric's rate history: from `time` until the next sample, each listed
link carries `rates[link]` bytes/s (links at zero are left out). Exporters draw utilisation
from them.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

COMM_KINDS = ("allreduce", "allgather", "reducescatter", "broadcast")


@dataclass(frozen=True)
class Span:
    gpu: int
    stream: str
    name: str
    kind: str  # forward | backward | recompute | optimizer | other | allreduce | allgather | ...
    start: float  # seconds from the start of the step
    end: float
    args: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)

    @property
    def duration(self) -> float:
        return self.end - self.start

    @property
    def is_comm(self) -> bool:
        return self.kind in COMM_KINDS


@dataclass(frozen=True)
class LinkSample:
    """From `time` until the next sample, each link carries `rates[link]` B/s (zeros omitted)."""

    time: float
    rates: dict[str, float]


@dataclass
class Timeline:
    spans: list[Span]  # one representative GPU (gpu 0), in task order
    world: int  # GPUs in the job; spans replicate to gpus 0..world-1
    step_time: float  # seconds: end of the last task
    link_bytes: dict[str, float]  # bytes carried per directed link over the whole step
    link_capacity: dict[str, float]  # B/s per directed link
    link_usage: list[LinkSample] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)  # the program's meta, passed through

    def spans_per_gpu(self) -> Iterator[Span]:
        """Every span for every GPU of the world (ranks run the same program)."""
        for gpu in range(self.world):
            for span in self.spans:
                yield span if span.gpu == gpu else replace(span, gpu=gpu)

    def streams(self) -> list[str]:
        """Stream names in order of first use."""
        return list(dict.fromkeys(s.stream for s in self.spans))

    def compute_spans(self) -> list[Span]:
        return [s for s in self.spans if not s.is_comm]

    def comm_spans(self) -> list[Span]:
        return [s for s in self.spans if s.is_comm]

    def bytes_between(self, link: str, start: float, end: float) -> float:
        """Bytes `link` carried in [start, end], from the rate history."""
        total = 0.0
        for k, sample in enumerate(self.link_usage):
            t1 = self.link_usage[k + 1].time if k + 1 < len(self.link_usage) else self.step_time
            lo, hi = max(sample.time, start), min(t1, end)
            if hi > lo:
                total += sample.rates.get(link, 0.0) * (hi - lo)
        return total

    def link_utilization(self, link: str, window: tuple[float, float] | None = None) -> float:
        """Bytes carried / (capacity * window length); the window defaults to the whole step."""
        start, end = window if window else (0.0, self.step_time)
        capacity = self.link_capacity.get(link, 0.0)
        if end <= start or capacity <= 0:
            return 0.0
        if window is None:
            carried = self.link_bytes.get(link, 0.0)
        else:
            carried = self.bytes_between(link, start, end)
        return carried / (capacity * (end - start))


def union_length(intervals: Iterable[tuple[float, float]]) -> float:
    """Total length covered by a set of intervals (overlaps counted once)."""
    return sum(end - start for start, end in merge(intervals))


def merge(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """Sorted, disjoint intervals covering the same points."""
    out: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if end <= start:
            continue
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def subtract_length(base: Iterable[tuple[float, float]],
                    cut: Iterable[tuple[float, float]]) -> float:
    """Length of the points covered by `base` and not by `cut`."""
    cuts = merge(cut)
    total = 0.0
    for start, end in merge(base):
        covered = 0.0
        for c_start, c_end in cuts:
            if c_end <= start:
                continue
            if c_start >= end:
                break
            covered += min(end, c_end) - max(start, c_start)
        total += end - start - covered
    return total
