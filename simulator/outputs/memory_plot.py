"""The memory-over-the-step picture: memory per GPU as each line of the memory model is alive.

A pure function of a `Timeline` and simulator/memory/estimate.py's lines (``memory.lines`` of
`api.simulate(...).memory`), drawn with matplotlib on the Agg backend and closed after saving.
``memory_over_step`` gives the bands' bytes at any times, so tests check the curve against the
model's totals at its moments.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from simulator.engine.timeline import Span, Timeline  # noqa: E402
from simulator.memory.activations import RECOMPUTED_LAYER  # noqa: E402
from simulator.outputs.plots import image_format  # noqa: E402

_MS = 1e3
_HEADS = ("lm_head", "qa_head", "loss")  # ops whose saved tensors are the logits' (head) band


def activation_fraction(timeline: Timeline, times: Sequence[float], gpu: int | None = None,
                        micro_steps: int = 1) -> list[float]:
    """Share of the blocks' peak activations alive at each time: forward work done minus
    backward done (the head's and the loss's work left out: their tensors are the logits').

    Activations of a micro-batch accumulate as its forward runs and are freed as its backward
    runs; work is measured in idle-GPU seconds so the curve follows the real kernels.
    """
    micro = max(1, micro_steps)
    spans = [s for s in (timeline.spans if gpu is None else timeline.spans_of(gpu))
             if not s.name.endswith(_HEADS)]  # the head's tensors are the logits' band
    phases = {"forward": [s for s in spans if s.kind == "forward"],
              "backward": [s for s in spans if s.kind == "backward"]}
    return [min(1.0, max(0.0, f - b)) for f, b in zip(
        _work_done(phases["forward"], times, micro), _work_done(phases["backward"], times, micro),
        strict=True)]


def _work_done(spans: Sequence[Span], times: Sequence[float], micro: int) -> list[float]:
    """Work of ``spans`` done by each time, in micro-steps (0 to ``micro``)."""
    total = sum(s.args.get("idle_s", s.duration) for s in spans)
    if total <= 0:
        return [0.0] * len(times)
    out = []
    for t in times:
        work = 0.0
        for s in spans:
            if t >= s.end:
                work += s.args.get("idle_s", s.duration)
            elif t > s.start:
                work += s.args.get("idle_s", s.duration) * (t - s.start) / s.duration
        out.append(work / total * micro)
    return out


# memory.py's categories, bottom to top: what lives all step first, what comes and goes last
MEMORY_BANDS = {"weights": "#4C72B0", "optimizer": "#8172B3", "gradients": "#55A868",
                "other": "#B0B0B0", "activations": "#DD8452", "recompute": "#E6B800"}


def memory_over_step(timeline: Timeline, lines: Sequence[Mapping[str, object]],
                     times: Sequence[float], micro_steps: int = 1) -> dict[str, list[float]]:
    """Bytes per band at each time, from memory.py's lines and when each is alive.

    A line's ``phase`` (simulator/memory/report.py) says when it lives: ``both`` all step;
    ``grads`` appear as the first micro-step's backward makes them and stay through the
    optimizer step (zero_grad(set_to_none=True) frees them at the next step's start); saved
    activations (``backward``) rise with forward work and fall with backward work, per
    micro-step; the logits and the loss's tensors (``loss``) from the head's forward to the
    end of its backward; the model output a loop keeps (``output``) from the head's forward to
    the step's end; the recomputed layer's working set (``recompute``) while the blocks'
    backward runs; other ``backward`` lines (units in flight, autocast copies) from forward
    until the optimizer; ``step`` during the optimizer; ``only:<moment>`` (allocator overhead
    at that moment) in the part of the step that moment stands for. At the loss's backward, a
    block's backward, the end of backward and the optimizer step the bands add up to
    memory.py's totals there, so the curve's top is the reported peak.
    """
    gpu = timeline.rank_groups[0][0]
    mine = timeline.spans_of(gpu)
    micro = max(1, micro_steps)
    forward = [s for s in mine if s.kind == "forward"]
    backward = [s for s in mine if s.kind == "backward"]
    optimizer = [(s.start, s.end) for s in mine if s.kind == "optimizer"]
    end = timeline.step_time
    f0 = min((s.start for s in forward), default=0.0)
    b0 = min((s.start for s in backward), default=end)
    b1 = max((s.end for s in backward), default=end)
    optimizer = optimizer or [(b1, end)]
    o0 = min(max(b1, min(a for a, _ in optimizer)), end)  # the step starts after backward
    mid = (b0 + b1) / 2
    heads = _head_windows(mine)  # the logits: from the head's forward to its backward
    h1 = max((b for _, b in heads), default=b0)
    saved = activation_fraction(timeline, times, gpu, micro)
    made = [min(1.0, d) for d in _work_done(backward, times, micro)]

    def during(windows: Sequence[tuple[float, float]]) -> list[float]:
        return [1.0 if any(a <= t < b or (t == end and b == end) for a, b in windows) else 0.0
                for t in times]

    shapes = {"both": [1.0] * len(times), "grads": made, "step": during(optimizer),
              "only:loss_backward": during([(0.0, h1)]), "only:backward": during([(h1, mid)]),
              "only:backward_end": during([(mid, o0)]), "only:step": during(optimizer),
              "running": during([(f0, o0)]), "loss": during(heads or [(b0, b0)]),
              "recompute": during([(h1, b1)]), "saved": saved,
              "output": during([(min((a for a, _ in heads), default=b0), end)])}
    bands: dict[str, list[float]] = {k: [0.0] * len(times) for k in MEMORY_BANDS}
    for line in lines:
        # host RAM, managed (paged) memory, or a cached block the allocator frees before it
        # runs out (``idle``): none of them is what the card must hold
        if line.get("host") or line.get("paged") or line.get("idle"):
            continue
        category, phase = str(line["category"]), str(line["phase"])
        band = category
        if category == "activations" and phase == "backward":
            shape = "saved"
        elif phase == "recompute" or line.get("label") == RECOMPUTED_LAYER:
            band = shape = "recompute"
        else:
            shape = "running" if phase == "backward" else phase
        size = float(line["bytes"])  # type: ignore[arg-type]
        bands[band] = [b + size * x for b, x in zip(bands[band], shapes[shape], strict=True)]
    return {k: v for k, v in bands.items() if any(v)}


def _head_windows(spans: Sequence[Span]) -> list[tuple[float, float]]:
    """(start, end) of each micro-step's logits: from its head's forward to the end of the
    head's backward that follows."""
    heads = sorted((s for s in spans if s.name.endswith(_HEADS)
                    and s.kind in ("forward", "backward")), key=lambda s: s.start)
    out: list[tuple[float, float]] = []
    opened: float | None = None
    for s in heads:
        if s.kind == "forward":
            opened = s.start if opened is None else opened
        elif opened is not None:
            out.append((opened, s.end))
            opened = None
    return out


def _phase_runs(timeline: Timeline) -> list[tuple[str, float, float]]:
    """(kind, start, end) of each unbroken run of forward, backward or optimizer compute on
    the first GPU: a micro-step's forward, its backward, the step."""
    runs: list[tuple[str, float, float]] = []
    spans = sorted((s for s in timeline.spans_of(timeline.rank_groups[0][0])
                    if s.kind in ("forward", "backward", "optimizer")), key=lambda s: s.start)
    for s in spans:
        if runs and runs[-1][0] == s.kind:
            runs[-1] = (s.kind, runs[-1][1], max(runs[-1][2], s.end))
        else:
            runs.append((s.kind, s.start, s.end))
    return runs


def memory_curve(timeline: Timeline, lines: Sequence[Mapping[str, object]], capacity: float,
                 path: str | Path, *, title: str = "", micro_steps: int = 1) -> None:
    """Memory per GPU over the step, a band per category as it is alive (memory_over_step)."""
    gib = 1024**3
    n = 600
    times = [timeline.step_time * i / (n - 1) for i in range(n)]
    bands = memory_over_step(timeline, lines, times, micro_steps)
    fig, ax = plt.subplots(figsize=(10, 4.2), dpi=110)
    xs = [t * _MS for t in times]
    names = {"optimizer": "optimizer states", "recompute": "recomputed layer"}
    ax.stackplot(xs, *[[b / gib for b in v] for v in bands.values()],
                 labels=[names.get(k, k) for k in bands],
                 colors=[MEMORY_BANDS[k] for k in bands], linewidth=0)
    total = [sum(v) / gib for v in zip(*bands.values(), strict=True)]
    top = max(total, default=0.0)
    at = total.index(top) if total else 0
    ax.plot(xs, total, color="black", linewidth=0.8)
    ax.annotate(f"peak {top:.1f} GiB", (xs[at], top), xytext=(0, 4), textcoords="offset points",
                ha="center", va="bottom", fontsize=8)
    for kind, a, b in _phase_runs(timeline):  # where each phase runs, named on top
        ax.axvline(a * _MS, color="#555555", linewidth=0.6, linestyle=":")
        if b - a > 0.04 * timeline.step_time:
            ax.text((a + b) / 2 * _MS, 1.005, kind, transform=ax.get_xaxis_transform(),
                    ha="center", va="bottom", fontsize=8, color="#555555")
    ax.axhline(capacity / gib, color="black", linestyle="--", linewidth=1.2)
    ax.text(xs[0], capacity / gib, f" capacity {capacity / gib:.1f} GiB", va="bottom", fontsize=9)
    ax.set_ylim(0, max(capacity / gib, top) * 1.15)
    ax.set_xlim(xs[0], xs[-1] if xs[-1] > 0 else 1)
    ax.set_xlabel("time in the step (ms)")
    ax.set_ylabel("memory per GPU (GiB)")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), fontsize=8, ncol=len(bands),
              frameon=False)
    ax.set_title(title or "memory per GPU over the step", fontsize=10, pad=16)
    fig.tight_layout()
    fig.savefig(path, format=image_format(path))
    plt.close(fig)

