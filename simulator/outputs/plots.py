"""Pictures of a simulated step: the Gantt chart, the memory-over-the-step curve, sweep charts.

Pure functions of a `Timeline` (and, for memory, the per-rank memory breakdown), drawn with
matplotlib on the Agg backend; every figure is closed after saving. By default each group of
identical GPUs shares one lane per stream ("GPU 0-7 · compute"; a pipeline's stages and a mixed
box's cards get lanes of their own).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from simulator.engine.timeline import Timeline, merge  # noqa: E402

COLOURS = {
    "forward": "#4C72B0", "backward": "#55A868", "recompute": "#8C8C8C",
    "optimizer": "#C44E52", "other": "#B0B0B0",
    "allreduce": "#DD8452", "allgather": "#8172B3", "reducescatter": "#DA8BC3",
    "broadcast": "#937860", "p2p": "#2CA9B7", "d2h": "#E6B800", "h2d": "#A67C00",
    "nvme": "#6B4E16", "cpu_optimizer": "#7F2A2D", "repeat": "#DDDDDD",
}
_EXPOSED = "#FF000022"
_MS = 1e3


def _gpus(group: Sequence[int]) -> str:
    if len(group) > 1 and list(group) == list(range(group[0], group[-1] + 1)):
        return f"GPU {group[0]}-{group[-1]}"
    return "GPU " + ",".join(map(str, group))


def _streams(timeline: Timeline, rep: int) -> list[str]:
    """The streams one representative uses, in the timeline's order (compute first)."""
    used = {s.stream for s in timeline.spans if s.gpu == rep}
    return [s for s in timeline.streams() if s in used]


def _lanes(timeline: Timeline, collapse: bool) -> list[tuple[str, int, str]]:
    """(label, representative GPU, stream) per lane, top to bottom."""
    if collapse or timeline.world == 1:
        return [(f"{_gpus(g)} · {s}", g[0], s) for g in timeline.rank_groups
                for s in _streams(timeline, g[0])]
    lanes = []
    for gpu in range(timeline.world):
        rep = timeline.representative(gpu)
        lanes += [(f"GPU {gpu} · {s}", rep, s) for s in _streams(timeline, rep)]
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


def gantt(timeline: Timeline, path: str | Path, *, title: str = "",
          collapse: bool = True) -> None:
    """Draw lanes per GPU and stream, a colour per kind, exposed comm shaded, step time marked."""
    lanes = _lanes(timeline, collapse)
    height = max(2.6, 0.55 * len(lanes) + 1.6)
    fig, ax = plt.subplots(figsize=(14, height), dpi=110)
    kinds_seen: dict[str, None] = {}
    for row, (_label, rep, stream) in enumerate(lanes):
        by_kind: dict[str, list[tuple[float, float]]] = {}
        for span in timeline.spans:
            if span.stream == stream and span.gpu == rep:
                by_kind.setdefault(span.kind, []).append(
                    (span.start * _MS, max(span.duration * _MS, 1e-6)))
        y = len(lanes) - 1 - row
        # thin white edges keep neighbouring buckets and layers apart, unless they are so
        # many that the edges would hide the colours
        edge = 0.3 if sum(len(b) for b in by_kind.values()) < 200 else 0.0
        for kind, bars in by_kind.items():
            kinds_seen[kind] = None
            ax.broken_barh(bars, (y - 0.38, 0.76), facecolors=COLOURS.get(kind, "#777777"),
                           edgecolor="white", linewidth=edge)
    bottom, top = -0.6, len(lanes) - 0.1
    for group in timeline.rank_groups:  # shade each group's own lanes
        rows = [len(lanes) - 1 - r for r, lane in enumerate(lanes) if lane[1] == group[0]]
        band = ((0.0, 1.0) if len(timeline.rank_groups) == 1 else
                ((min(rows) - 0.5 - bottom) / (top - bottom),
                 (max(rows) + 0.5 - bottom) / (top - bottom)))
        for start, end in exposed_intervals(timeline, group[0]):
            ax.axvspan(start * _MS, end * _MS, *band, color=_EXPOSED, linewidth=0)
    step_ms = timeline.step_time * _MS
    ax.axvline(step_ms, color="black", linewidth=1.2, linestyle="--")
    ax.text(step_ms, 1.01, f"step {step_ms:.1f} ms", va="bottom", ha="right", fontsize=9,
            transform=ax.get_xaxis_transform())
    ax.set_yticks(range(len(lanes)))
    ax.set_yticklabels([label for label, _, _ in reversed(lanes)], fontsize=9)
    ax.set_ylim(bottom, top)
    ax.set_xlim(0, step_ms * 1.01 if step_ms > 0 else 1)
    ax.set_xlabel("time in the step (ms)")
    ax.grid(axis="x", linewidth=0.3, alpha=0.6)
    handles = [Patch(color=COLOURS.get(k, "#777777"), label=k) for k in kinds_seen]
    handles.append(Patch(color=_EXPOSED, label="exposed communication"))
    # below the x label: about 0.8 inch under the axes, as a fraction of the axes' height
    below = -0.28 if len(lanes) < 4 else -min(0.12, 0.8 / (0.55 * len(lanes)))
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, below),
              ncol=min(len(handles), 8), fontsize=8, frameon=False)
    ax.set_title(title or f"one training step on {timeline.world} GPU(s)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, format=_fmt(path))
    plt.close(fig)


def activation_fraction(timeline: Timeline, times: Sequence[float]) -> list[float]:
    """Share of the peak activations alive at each time: forward work done minus backward done.

    Activations of a micro-batch accumulate as its forward runs and are freed as its backward
    runs; work is measured in idle-GPU seconds so the curve follows the real kernels.
    """
    micro = max(1, int(timeline.meta.get("grad_accum", 1)))
    phases = {"forward": [s for s in timeline.spans if s.kind == "forward"],
              "backward": [s for s in timeline.spans if s.kind == "backward"]}
    totals = {k: sum(s.args.get("idle_s", s.duration) for s in v) for k, v in phases.items()}

    def done(kind: str, t: float) -> float:
        total = totals[kind]
        if total <= 0:
            return 0.0
        work = 0.0
        for s in phases[kind]:
            if t >= s.end:
                work += s.args.get("idle_s", s.duration)
            elif t > s.start:
                work += s.args.get("idle_s", s.duration) * (t - s.start) / s.duration
        return work / total * micro

    return [min(1.0, max(0.0, done("forward", t) - done("backward", t))) for t in times]


def memory_curve(timeline: Timeline, breakdown: Mapping[str, float], capacity: float,
                 path: str | Path, *, title: str = "") -> None:
    """Per-GPU memory over the step: static state plus activations that rise and fall."""
    gib = 1024**3
    n = 400
    times = [timeline.step_time * i / (n - 1) for i in range(n)]
    static_keys = [k for k in ("weights", "gradients", "optimizer", "other") if k in breakdown]
    frac = activation_fraction(timeline, times)
    fig, ax = plt.subplots(figsize=(10, 4), dpi=110)
    layers = [[breakdown[k] / gib] * n for k in static_keys]
    layers.append([f * breakdown.get("activations", 0.0) / gib for f in frac])
    xs = [t * _MS for t in times]
    palette = {"weights": "#4C72B0", "gradients": "#55A868", "optimizer": "#C44E52",
               "other": "#B0B0B0"}
    ax.stackplot(xs, *layers, labels=[*static_keys, "activations"],
                 colors=[palette[k] for k in static_keys] + ["#DD8452"])
    ax.axhline(capacity / gib, color="black", linestyle="--", linewidth=1.2)
    ax.text(xs[0], capacity / gib, f" capacity {capacity / gib:.1f} GiB", va="bottom", fontsize=9)
    peak = sum(breakdown.get(k, 0.0) for k in static_keys) + max(layers[-1]) * gib
    ax.set_ylim(0, max(capacity, peak) / gib * 1.12)
    ax.set_xlim(xs[0], xs[-1] if xs[-1] > 0 else 1)
    ax.set_xlabel("time in the step (ms)")
    ax.set_ylabel("memory per GPU (GiB)")
    ax.legend(loc="upper right", fontsize=8, ncol=5, frameon=False)
    ax.set_title(title or "memory per GPU over the step", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, format=_fmt(path))
    plt.close(fig)


def sweep_chart(xs: Sequence[str], series: Mapping[str, Sequence[float | None]],
                xlabel: str, ylabel: str, path: str | Path, *, title: str = "") -> None:
    """One line per series over a list-valued option (bucket size, GPUs, ...)."""
    fig, ax = plt.subplots(figsize=(8, 4.2), dpi=110)
    for name, ys in series.items():
        points = [(i, y) for i, y in enumerate(ys) if y is not None]
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=name)
    ax.set_xticks(range(len(xs)))
    ax.set_xticklabels(xs)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(linewidth=0.3, alpha=0.6)
    ax.set_ylim(bottom=0)  # differences read honestly against zero
    if len(series) > 1:  # below the axes, so it never hides a line
        ax.legend(fontsize=8, frameon=False, loc="upper center", bbox_to_anchor=(0.5, -0.18),
                  ncol=len(series))
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, format=_fmt(path))
    plt.close(fig)


def compare_chart(labels: Sequence[str], reports: Sequence[Mapping[str, object]],
                  path: str | Path, *, title: str = "") -> None:
    """Runs side by side: each step split into compute, exposed communication and idle
    (stacked bars, the step-time range as a whisker), and tokens/s with its range."""
    def num(r: Mapping[str, object], key: str) -> float:
        return float(r[key])  # type: ignore[arg-type]

    def whiskers(key: str, scale: float = 1.0) -> list[list[float]] | None:
        if not all(f"{key}_range" in r for r in reports):
            return None
        lows: list[float] = []
        highs: list[float] = []
        for r in reports:
            bounds: Sequence[float] = r[f"{key}_range"]  # type: ignore[assignment]
            lows.append((num(r, key) - bounds[0]) * scale)
            highs.append((bounds[1] - num(r, key)) * scale)
        return [lows, highs]

    xs = range(len(reports))
    compute = [num(r, "compute_time_s") for r in reports]
    exposed = [num(r, "exposed_comm_s") for r in reports]
    idle = [max(0.0, num(r, "step_time_s") - c - e)
            for r, c, e in zip(reports, compute, exposed, strict=True)]
    steps = [num(r, "step_time_s") for r in reports]
    fig, (left, right) = plt.subplots(1, 2, figsize=(4 + 1.6 * len(reports), 4.4), dpi=110)
    left.bar(xs, compute, color="#4c72b0", label="compute")
    left.bar(xs, exposed, bottom=compute, color="#dd8452", label="exposed communication")
    left.bar(xs, idle, bottom=[c + e for c, e in zip(compute, exposed, strict=True)],
             color="#c8c8c8", label="idle")
    step_err = whiskers("step_time_s")
    if step_err:
        left.errorbar(xs, steps, yerr=step_err, fmt="none", ecolor="black", capsize=5, lw=1)
    left.set_ylabel("seconds per step")
    left.set_title("where the step goes", fontsize=9)
    right.bar(xs, [num(r, "tokens_per_s") for r in reports], color="#55a868")
    tps_err = whiskers("tokens_per_s")
    if tps_err:
        right.errorbar(xs, [num(r, "tokens_per_s") for r in reports], yerr=tps_err,
                       fmt="none", ecolor="black", capsize=5, lw=1)
    right.set_ylabel("tokens/s")
    right.set_title("throughput", fontsize=9)
    for ax in (left, right):
        ax.set_xticks(list(xs))
        ax.set_xticklabels(labels, rotation=20, ha="right", fontsize=8)
        ax.grid(axis="y", linewidth=0.3, alpha=0.6)
        ax.set_ylim(bottom=0)
    left.legend(fontsize=7, frameon=False, loc="upper center", bbox_to_anchor=(0.5, -0.3),
                ncol=3)
    fig.suptitle(title + ("  (whiskers: ranges)" if step_err else ""), fontsize=10)
    fig.tight_layout()
    fig.savefig(path, format=_fmt(path))
    plt.close(fig)


def _fmt(path: str | Path) -> str:
    suffix = Path(path).suffix.lstrip(".").lower()
    return suffix if suffix in ("png", "svg", "pdf") else "png"
