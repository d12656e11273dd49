"""The HTML report's pictures as inline SVG: each step split into compute, exposed
communication and idle (with the step-time range as a whisker), each run's memory per GPU by
kind against the card, and the Gantt of a step (lanes.py's lanes, exposed communication in
red on a lane of its own). Pure functions of reports; text is escaped; no script, no font
file, no network: the SVG scales to the page's width (a phone's too).
"""

from __future__ import annotations

from collections.abc import Sequence
from html import escape
from typing import Any

from simulator.outputs.lanes import COLOURS, EXPOSED

STEP_PARTS = (("compute", "#4C72B0"), ("exposed communication", EXPOSED), ("idle", "#C8C8C8"))
MEMORY_PARTS = (("weights", "#4C72B0"), ("gradients", "#55A868"), ("optimizer", "#8172B3"),
                ("activations", "#DD8452"), ("other", "#A6A6A6"))
GIB = 2**30
WIDTH = 900  # the drawing's own units; it is drawn at the page's width
LABEL = 170  # room for the run's label on the left


def _text(x: float, y: float, words: str, *, anchor: str = "start", size: int = 11,
          cls: str = "") -> str:
    extra = f' class="{cls}"' if cls else ""
    return (f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}"{extra}>'
            f"{escape(words)}</text>")


def _rect(x: float, y: float, w: float, h: float, fill: str, title: str = "") -> str:
    tip = f"<title>{escape(title)}</title>" if title else ""
    return (f'<rect x="{x:.2f}" y="{y:.1f}" width="{max(w, 0.0):.2f}" height="{h:.1f}" '
            f'fill="{fill}">{tip}</rect>')


def _svg(height: float, body: list[str], label: str) -> str:
    return (f'<svg viewBox="0 0 {WIDTH} {height:.0f}" width="100%" role="img" '
            f'aria-label="{escape(label)}" xmlns="http://www.w3.org/2000/svg">'
            + "".join(body) + "</svg>")


def _legend(parts: Sequence[tuple[str, str]], y: float) -> list[str]:
    out, x = [], float(LABEL)
    for name, colour in parts:
        out += [_rect(x, y - 9, 10, 10, colour), _text(x + 14, y, name, size=10)]
        x += 22 + 6 * len(name)
    return out


def step_bars(labels: Sequence[str], reports: Sequence[dict[str, Any]]) -> str:
    """A bar per simulated run: compute, exposed communication, idle; whisker: the range."""
    runs = [(label, r) for label, r in zip(labels, reports, strict=True)
            if r.get("simulated", True)]
    if not runs:
        return ""
    longest = max(max(r.get("step_time_s_range") or [r["step_time_s"]])
                  for _, r in runs) or 1.0
    scale = (WIDTH - LABEL - 150) / longest
    body, y = [], 8.0
    for label, r in runs:
        step, compute, exposed = r["step_time_s"], r["compute_time_s"], r["exposed_comm_s"]
        idle = max(0.0, step - compute - exposed)
        body.append(_text(LABEL - 6, y + 13, label[:28], anchor="end"))
        x = float(LABEL)
        for (name, colour), value in zip(STEP_PARTS, (compute, exposed, idle), strict=True):
            body.append(_rect(x, y, value * scale, 18, colour,
                              f"{label}: {name} {value * 1e3:,.1f} ms"))
            x += value * scale
        bounds = r.get("step_time_s_range")
        if bounds:
            lo, hi = LABEL + bounds[0] * scale, LABEL + bounds[1] * scale
            body += [f'<line x1="{lo:.1f}" x2="{hi:.1f}" y1="{y + 9}" y2="{y + 9}" '
                     'stroke="black" stroke-width="1.2"/>',
                     f'<line x1="{lo:.1f}" x2="{lo:.1f}" y1="{y + 3}" y2="{y + 15}" '
                     'stroke="black"/>',
                     f'<line x1="{hi:.1f}" x2="{hi:.1f}" y1="{y + 3}" y2="{y + 15}" '
                     'stroke="black"/>']
        mark = " (as if it fit)" if r.get("simulated_anyway") else ""
        body.append(_text(max(x, LABEL + (bounds[1] * scale if bounds else 0)) + 5, y + 13,
                          f"{step * 1e3:,.0f} ms{mark}", size=10))
        y += 26
    body += _legend(STEP_PARTS, y + 10)
    return _svg(y + 18, body, "where each step goes: compute, exposed communication, idle")


def memory_bars(labels: Sequence[str], reports: Sequence[dict[str, Any]]) -> str:
    """A bar per run: its memory per GPU by kind, the card's capacity as a line."""
    if not reports:
        return ""
    top = max(max(r["memory"]["peak_bytes"], r["memory"]["capacity_bytes"]) for r in reports)
    scale = (WIDTH - LABEL - 190) / (top or 1)  # room for the verdict on the right
    body, y = [], 8.0
    for label, r in zip(labels, reports, strict=True):
        mem = r["memory"]
        parts = mem.get("breakdown_bytes") or {}
        body.append(_text(LABEL - 6, y + 13, label[:28], anchor="end"))
        x = float(LABEL)
        for name, colour in MEMORY_PARTS:
            value = parts.get(name, 0) or 0
            body.append(_rect(x, y, value * scale, 18, colour,
                              f"{label}: {name} {value / GIB:.1f} GiB"))
            x += value * scale
        cap = LABEL + mem["capacity_bytes"] * scale
        body.append(f'<line x1="{cap:.1f}" x2="{cap:.1f}" y1="{y - 3}" y2="{y + 21}" '
                    'stroke="black" stroke-width="2"/>')
        verdict = "fits" if mem["fits"] else "DOES NOT FIT"
        body.append(_text(max(x, cap) + 5, y + 13, f"{mem['peak_bytes'] / GIB:.1f} of "
                          f"{mem['capacity_bytes'] / GIB:.1f} GiB: {verdict}", size=10,
                          cls="ok" if mem["fits"] else "bad"))
        y += 26
    body += _legend((*MEMORY_PARTS, ("card's memory", "#000000")), y + 10)
    return _svg(y + 18, body, "memory per GPU by kind against the card's")


def gantt(data: dict[str, Any], title: str) -> str:
    """One step's lanes (lanes.gantt_data): a bar per span, exposed communication in red."""
    lanes = data["lanes"]
    step = data["step_ms"] or 1.0
    scale = (WIDTH - LABEL - 10) / step
    body, y = [], 6.0
    kinds: dict[str, None] = {}
    for lane in lanes:
        body.append(_text(LABEL - 6, y + 11, lane["label"], anchor="end", size=10))
        body.append(_rect(LABEL, y, step * scale, 14, "#F4F4F4"))
        for start, width, kind in lane["bars"]:
            colour = EXPOSED if lane["exposed"] else COLOURS.get(kind, "#777777")
            kinds[kind if not lane["exposed"] else "exposed communication"] = None
            body.append(_rect(LABEL + start * scale, y, max(width * scale, 0.3), 14, colour,
                              f"{kind} {start:,.2f}-{start + width:,.2f} ms"))
        y += 18
    body.append(_text(WIDTH - 10, y + 12, f"step {step:,.1f} ms; exposed communication "
                      f"{data['exposed_ms']:,.1f} ms ({data['exposed_ms'] / step:.0%})",
                      anchor="end", size=10))
    legend = [(k, EXPOSED if k == "exposed communication" else COLOURS.get(k, "#777777"))
              for k in kinds]
    rows = [legend[i:i + 6] for i in range(0, len(legend), 6)]
    for n, row in enumerate(rows):
        body += _legend(row, y + 30 + 14 * n)
    return _svg(y + 36 + 14 * len(rows), body, title)
