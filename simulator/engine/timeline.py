"""The record of one simulated step: spans on streams, and what the links carried.

A `Span` is one task's run on one stream of one GPU (start and end in seconds from the start
of the step). The engine runs one program per group of identical ranks (`Timeline.groups`;
one group of every rank when they are all alike) and records the spans of each group's first
GPU, its representative; `spans_of(gpu)` and `spans_per_gpu()` give them for any GPU.

`LinkSample`s are the fabric's rate history: from `time` until the next sample, each listed
link carries `rates[link]` bytes/s (links at zero are left out). Exporters draw utilisation
from them.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

COLLECTIVE_KINDS = ("allreduce", "allgather", "reducescatter", "broadcast", "reduce", "alltoall")
# what moves data: collectives, point-to-point batches, copies to and from host memory or NVMe
COMM_KINDS = (*COLLECTIVE_KINDS, "p2p", "d2h", "h2d", "nvme")
HOST_KINDS = ("cpu_optimizer",)  # work of the host CPU, not of the GPU
REPEAT_KIND = "repeat"  # iterations replayed from a simulated unit (args: times, unit_tasks)


@dataclass(frozen=True)
class Span:
    """One task as it ran: its GPU, stream, kind and start and end times."""

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

    @property
    def is_compute(self) -> bool:
        """GPU kernels of the model (not communication, host work or a replay marker)."""
        return not (self.kind in COMM_KINDS or self.kind in HOST_KINDS
                    or self.kind == REPEAT_KIND)


@dataclass(frozen=True)
class LinkSample:
    """From `time` until the next sample, each link carries `rates[link]` B/s (zeros omitted)."""

    time: float
    rates: dict[str, float]


@dataclass
class Timeline:
    """The simulated step: every span, the step time and what each link carried."""

    spans: list[Span]  # each group's representative GPU, program by program, in task order
    world: int  # GPUs in the job
    step_time: float  # seconds: end of the last task
    link_bytes: dict[str, float]  # bytes carried per directed link over the whole step
    link_capacity: dict[str, float]  # B/s per directed link
    link_usage: list[LinkSample] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)  # the first program's meta
    # GPUs each program stands for, its representative first; () = one group of every GPU
    groups: tuple[tuple[int, ...], ...] = ()

    @property
    def rank_groups(self) -> tuple[tuple[int, ...], ...]:
        return self.groups or (tuple(range(self.world)),)

    def representative(self, gpu: int) -> int:
        """The GPU whose spans stand for ``gpu``."""
        for group in self.rank_groups:
            if gpu in group:
                return group[0]
        raise ValueError(f"GPU {gpu} is not in the job ({self.world} GPUs)")

    @cached_property
    def _by_gpu(self) -> dict[int, list[Span]]:
        """The spans of each representative, in order: indexed once (a pipeline step has
        ~100,000 spans and every report asks per rank group); the engine's spans never change
        after it made them."""
        out: dict[int, list[Span]] = {}
        for s in self.spans:
            out.setdefault(s.gpu, []).append(s)
        return out

    def spans_of(self, gpu: int) -> list[Span]:
        """The spans of one GPU (its representative's, relabelled)."""
        rep = self.representative(gpu)
        own = self._by_gpu.get(rep, [])
        return list(own) if gpu == rep else [replace(s, gpu=gpu) for s in own]

    def spans_per_gpu(self) -> Iterator[Span]:
        """Every span for every GPU of the world, GPU by GPU."""
        for gpu in range(self.world):
            yield from self.spans_of(gpu)

    def streams(self) -> list[str]:
        """Stream names in order of first use."""
        return list(dict.fromkeys(s.stream for s in self.spans))

    def compute_spans(self, gpu: int | None = None) -> list[Span]:
        """GPU compute spans of one GPU (default: of every representative)."""
        spans = self.spans if gpu is None else self.spans_of(gpu)
        return [s for s in spans if s.is_compute]

    def comm_spans(self, gpu: int | None = None) -> list[Span]:
        spans = self.spans if gpu is None else self.spans_of(gpu)
        return [s for s in spans if s.is_comm]

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
    ends = [end for _, end in cuts]
    total = 0.0
    for start, end in merge(base):
        total += _uncovered(start, end, cuts, ends)
    return total


def uncovered_lengths(intervals: Iterable[tuple[float, float]],
                      cut: Iterable[tuple[float, float]]) -> list[float]:
    """Each interval's own length not covered by `cut`: ``subtract_length([i], cut)`` for
    every ``i``, with `cut` merged once for all of them."""
    cuts = merge(cut)
    ends = [end for _, end in cuts]
    return [_uncovered(start, end, cuts, ends) if end > start else 0.0
            for start, end in intervals]


def _uncovered(start: float, end: float, cuts: list[tuple[float, float]],
               ends: list[float]) -> float:
    """The part of [start, end) outside the merged `cuts` (`ends`: their ends, sorted)."""
    covered = 0.0
    for k in range(bisect_right(ends, start), len(cuts)):  # cuts ending by `start` miss it
        c_start, c_end = cuts[k]
        if c_start >= end:
            break
        covered += min(end, c_end) - max(start, c_start)
    return end - start - covered
