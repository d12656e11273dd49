"""Pictures of a simulated step: the Gantt chart, sweep and compare charts (the memory curve is
in memory_plot.py).

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

from simulator.engine.timeline import Timeline  # noqa: E402
from simulator.outputs.lanes import (  # noqa: E402
    COLOURS,
    EXPOSED,
    EXPOSED_LANE,
    _idle,
    _lanes,
    exposed_intervals,
)

__all__ = ["COLOURS", "EXPOSED", "EXPOSED_LANE", "compare_chart", "exposed_intervals", "gantt",
           "image_format", "sweep_chart", "sweep_layout"]

_EXPOSED_SHADE = "#E0000018"  # the same intervals, faintly, across the group's lanes
_IDLE = "#9A9A9A"  # hatch over a lane's waits when ranks differ (pipeline bubble, slow peers)
_MS = 1e3


def gantt(timeline: Timeline, path: str | Path, *, title: str = "",
          collapse: bool = True) -> None:
    """Draw lanes per GPU and stream, a colour per kind, exposed comm shaded, step time marked."""
    lanes = _lanes(timeline, collapse)
    height = max(2.6, 0.55 * len(lanes) + 1.6)
    fig, ax = plt.subplots(figsize=(14, height), dpi=110)
    kinds_seen: dict[str, None] = {}
    exposed = {rep: exposed_intervals(timeline, rep) for _, rep, _ in lanes}
    for row, (_label, rep, stream) in enumerate(lanes):
        y = len(lanes) - 1 - row
        if stream == EXPOSED_LANE:  # solid, edged in its own colour: a sliver stays visible
            ax.broken_barh([(a * _MS, (b - a) * _MS) for a, b in exposed[rep]],
                           (y - 0.38, 0.76), facecolors=EXPOSED, edgecolor=EXPOSED,
                           linewidth=0.6)
            continue
        by_kind: dict[str, list[tuple[float, float]]] = {}
        for span in timeline.spans_of(rep):
            if span.stream == stream:
                by_kind.setdefault(span.kind, []).append(
                    (span.start * _MS, max(span.duration * _MS, 1e-6)))
        # thin white edges keep neighbouring layers apart, unless they are so many that the
        # edges would hide the colours; communication is edged in its own colour instead, so
        # a short collective is never thinner than a line
        many = sum(len(b) for b in by_kind.values()) >= 200
        for kind, bars in by_kind.items():
            kinds_seen[kind] = None
            colour = COLOURS.get(kind, "#777777")
            comm = kind not in ("forward", "backward", "recompute", "optimizer", "other")
            ax.broken_barh(bars, (y - 0.38, 0.76), facecolors=colour,
                           edgecolor=colour if comm else "white",
                           linewidth=0.5 if comm else (0.0 if many else 0.3))
        if stream == "compute" and len(timeline.rank_groups) > 1:
            gaps = _idle(by_kind)  # ranks that differ: where this one waits (a bubble)
            if gaps:
                kinds_seen["idle"] = None
                ax.broken_barh(gaps, (y - 0.38, 0.76), facecolors="none", hatch="////",
                               edgecolor=_IDLE, linewidth=0)
    bottom, top = -0.6, len(lanes) - 0.1
    for group in timeline.rank_groups:  # shade each group's own lanes
        rows = [len(lanes) - 1 - r for r, lane in enumerate(lanes) if lane[1] == group[0]]
        band = ((0.0, 1.0) if len(timeline.rank_groups) == 1 else
                ((min(rows) - 0.5 - bottom) / (top - bottom),
                 (max(rows) + 0.5 - bottom) / (top - bottom)))
        for start, end in exposed.get(group[0], []):
            ax.axvspan(start * _MS, end * _MS, *band, color=_EXPOSED_SHADE, linewidth=0)
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
    handles = [Patch(facecolor="none", edgecolor=_IDLE, hatch="////", label="idle (bubble)")
               if k == "idle" else Patch(color=COLOURS.get(k, "#777777"), label=k)
               for k in kinds_seen]
    first = exposed.get(timeline.rank_groups[0][0], [])
    if first:
        total = sum(b - a for a, b in first)
        share = f", {total / timeline.step_time:.0%} of the step" if timeline.step_time else ""
        handles.append(Patch(color=EXPOSED, label=f"exposed communication: compute waits "
                             f"{total * _MS:.1f} ms{share}"))
    # below the x label: about 0.8 inch under the axes, as a fraction of the axes' height
    below = -0.28 if len(lanes) < 4 else -min(0.12, 0.8 / (0.55 * len(lanes)))
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, below),
              ncol=min(len(handles), 8), fontsize=8, frameon=False)
    ax.set_title(title or f"one training step on {timeline.world} GPU(s)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, format=image_format(path))
    plt.close(fig)


def sweep_layout(points: Sequence[Mapping[str, float]]
                 ) -> tuple[str | None, str | None, list[str]]:
    """The swept option along x (the one with most values), the one drawn as a line per value
    (the next), and the rest, which get a panel per combination of their values."""
    swept = sorted((k for k in points[0] if len({p[k] for p in points}) > 1),
                   key=lambda k: -len({p[k] for p in points})) if points else []
    return (swept[0] if swept else None, swept[1] if len(swept) > 1 else None, swept[2:])


def sweep_chart(points: Sequence[Mapping[str, float]],
                metrics: Mapping[str, Sequence[float | None]], path: str | Path, *,
                title: str = "", ylabel: str = "milliseconds") -> None:
    """Small multiples of a sweep: a panel per metric (and, with three or more swept options,
    per value of the others); the option with the most values along x, a line per value of
    the next one. ``points``: each point's option values; ``metrics``: name -> a value per
    point (None where it does not apply)."""
    x_key, line_key, rest = sweep_layout(points)

    def values(key: str) -> list[float]:
        return sorted({p[key] for p in points})

    def words(point: Mapping[str, float], keys: Sequence[str]) -> str:
        return ", ".join(f"{k.replace('_', '-')}={point[k]:g}" for k in keys)

    xs = values(x_key) if x_key else [0.0]
    facets = list(dict.fromkeys(words(p, rest) for p in points))
    names = list(metrics)
    rows, cols = (1, len(names)) if len(facets) == 1 else (len(names), len(facets))
    fig, axes = plt.subplots(rows, cols, figsize=(3.9 * cols, 2.9 * rows + 0.9), dpi=110,
                             squeeze=False, sharex=True,
                             sharey="row" if len(facets) > 1 else False)
    lines = values(line_key) if line_key else [None]
    colours = plt.get_cmap("viridis")
    for m, name in enumerate(names):
        for f, facet in enumerate(facets):
            ax = axes[0][m] if len(facets) == 1 else axes[m][f]
            for i, value in enumerate(lines):
                ys = {p[x_key] if x_key else 0.0: y for p, y in zip(points, metrics[name],
                                                                     strict=True)
                      if words(p, rest) == facet and (line_key is None or p[line_key] == value)
                      and y is not None}
                xy = [(xs.index(x), ys[x]) for x in xs if x in ys]
                label = f"{line_key.replace('_', '-')}={value:g}" if line_key else None
                ax.plot([a for a, _ in xy], [b for _, b in xy], marker="o", markersize=4,
                        color=colours(i / max(1, len(lines) - 1) * 0.9), label=label)
            ax.set_title(name + (f"\n{facet}" if facet else ""), fontsize=9)
            ax.set_xticks(range(len(xs)))
            ax.set_xticklabels([f"{x:g}" for x in xs], fontsize=8)
            ax.grid(linewidth=0.3, alpha=0.6)
            ax.set_ylim(bottom=0)  # differences read honestly against zero
            if ax in (axes[-1][0], axes[-1][-1]) or len(facets) == 1:
                ax.set_xlabel(x_key.replace("_", "-") if x_key else "point", fontsize=8)
        (axes[0][m] if len(facets) == 1 else axes[m][0]).set_ylabel(ylabel, fontsize=8)
    if line_key:  # one legend for every panel, below them
        handles, labels = axes[0][0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="lower center", ncol=min(len(lines), 8), fontsize=8,
                   frameon=False)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0.07 if line_key else 0, 1, 1))
    fig.savefig(path, format=image_format(path))
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
    fig.savefig(path, format=image_format(path))
    plt.close(fig)


def image_format(path: str | Path) -> str:
    """matplotlib's format for a path: its suffix when png, svg or pdf, else png."""
    suffix = Path(path).suffix.lstrip(".").lower()
    return suffix if suffix in ("png", "svg", "pdf") else "png"

