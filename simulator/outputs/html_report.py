"""The self-contained HTML report of `run`, `compare`, `sweep` and `advise` (``--html``).

One file, everything inline (html_assets.py's style and script, svg.py's pictures): no
network, no external script or font, readable on a phone. It shows the answer's lines (the
winner and why, or advise's pick and its caveats), a sortable table of the runs (fits, step
time with its range, tokens/s, $ per million tokens, buy-versus-rent months, the bottleneck
in words, the confidence grade), each step split into compute / exposed communication /
idle with its range, the memory per GPU by kind, each step's Gantt with exposed
communication marked, what would fit for a run that does not, and the exact `stepsim`
command and its JSON with copy buttons. A pure function of the reports: ``sections`` is the
answer alone, which the local page (`stepsim serve`) inserts as it answers.
"""

from __future__ import annotations

from collections.abc import Sequence
from html import escape
from typing import Any

from simulator import __version__
from simulator.outputs import figures as fig
from simulator.outputs import svg
from simulator.outputs.html_assets import SCRIPT, STYLE

NOTE = ("Simulated by stepsim, not measured: every figure is a model's, its range comes from "
        "how far the model was off on published measurements of the same mechanisms, and the "
        "confidence grade says how many such measurements there are.")


def _fits(r: dict[str, Any]) -> bool:
    mem = r["memory"]
    return bool(mem["fits"]) and mem.get("host_fits", True) is not False


def _cell(text: str, value: Any = None, cls: str = "") -> str:
    v = escape(str(text if value is None else value))
    c = f' class="{cls}"' if cls else ""
    return f'<td data-v="{v}"{c}>{escape(text)}</td>'


def _range(text: str, bounds: Sequence[float] | None, fmt: Any) -> str:
    return fig.ranged(text, bounds, fmt)


def _row(label: str, r: dict[str, Any]) -> str:
    mem = r["memory"]
    gib = 2**30
    need = f"{mem['peak_bytes'] / gib:.1f} of {mem['capacity_bytes'] / gib:.1f} GiB"
    fits = _fits(r)
    cells = [_cell(label), _cell(("fits: " if fits else "DOES NOT FIT: ") + need,
                                 mem["peak_bytes"] / mem["capacity_bytes"],
                                 "ok" if fits else "bad")]
    if not r.get("simulated", True):  # no figures for a step that runs out of memory
        cells += [_cell("not simulated", "")] + [_cell("-", "") for _ in range(5)]
        return "<tr>" + "".join(cells) + "</tr>"
    mark = " (as if it fit)" if r.get("simulated_anyway") else ""
    cost = r["cost"]
    usd = cost["usd_per_million_tokens"]
    months = cost.get("breakeven_months")
    bn = r.get("bottleneck") or {}
    where = (f"{bn.get('description') or bn['link']}: {bn['utilization_during_comm']:.0%} busy "
             "while communicating") if bn.get("link") else "none"
    grade = (r.get("confidence") or {}).get("grade", "none")
    cells += [
        _cell(fig.seconds_ranged(r["step_time_s"], r.get("step_time_s_range")) + mark,
              r["step_time_s"], "num"),
        _cell(_range(fig.count(r["tokens_per_s"]), r.get("tokens_per_s_range"), fig.count)
              + mark, r["tokens_per_s"], "num"),
        _cell("-" if usd is None else _range(f"${usd:.3g}",
                                             cost.get("usd_per_million_tokens_range"),
                                             lambda x: f"${x:.3g}") + mark,
              "" if usd is None else usd, "num"),
        _cell(grade, ["high", "medium", "low", "none"].index(grade), f"grade-{grade}"),
        _cell("-" if months is None else f"{months:.3g} months", "" if months is None
              else months, "num"),
        _cell(where),
    ]
    return "<tr>" + "".join(cells) + "</tr>"


HEADERS = ("run", "memory per GPU", "step time (range)", "tokens/s (range)",
           "$ per million tokens", "confidence", "buying pays off after", "bottleneck")


def table(labels: Sequence[str], reports: Sequence[dict[str, Any]]) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in HEADERS)
    rows = "".join(_row(label, r) for label, r in zip(labels, reports, strict=True))
    return (f'<div class="scroll"><table class="sortable" id="runs"><thead><tr>{head}</tr>'
            f"</thead><tbody>{rows}</tbody></table></div>")


def _details(label: str, r: dict[str, Any]) -> str:
    """Per run: its confidence and range lines, what would fit, its Gantt."""
    items = []
    if not r.get("simulated", True):
        items.append("Not simulated: a step that runs out of memory has no step time, "
                     "throughput or price (--simulate-anyway gives them as if it fit).")
    for key in ("range_basis", "confidence"):
        if r.get(key):
            items.append(r[key]["summary"])
    for w in r.get("what_would_fit", []):
        items.append(f"would fit with {w['flags'] or w['change']}: {w['detail']}")
    body = "".join(f"<li>{escape(i)}</li>" for i in items)
    picture = (svg.gantt(r["gantt"], f"the step of {label}") if r.get("gantt") else "")
    return (f"<details{' open' if len(items) < 4 else ''}><summary>{escape(label)}</summary>"
            f'<ul class="lines">{body}</ul>{picture}</details>')


def sections(labels: Sequence[str], reports: Sequence[dict[str, Any]],
             lines: Sequence[str]) -> str:
    """The answer: its lines, the table, the pictures, each run's details."""
    out = ['<section id="answer">']
    if lines:
        out.append('<h2>The answer</h2><ul class="lines" id="advice">'
                   + "".join(f"<li>{escape(line)}</li>" for line in lines) + "</ul>")
    out.append("<h2>Runs</h2>" + table(labels, reports))
    steps = svg.step_bars(labels, reports)
    if steps:
        out.append("<h2>Where each step goes</h2>" + steps
                   + '<p class="note">Bars: compute, exposed communication (compute waits), '
                     "idle. Whiskers: the step-time range.</p>")
    out.append('<h2>Memory per GPU</h2><div id="memory">' + svg.memory_bars(labels, reports)
               + "</div>")
    out.append("<h2>Each run</h2>" + "".join(_details(label, r)
                                             for label, r in zip(labels, reports, strict=True)))
    out.append("</section>")
    return "".join(out)


def _block(ident: str, title: str, text: str) -> str:
    return (f'<h2>{escape(title)}</h2><button class="copy" data-target="{ident}">copy</button>'
            f'<pre id="{ident}">{escape(text)}</pre>')


def page(title: str, body: str, *, command: str | None = None, json_text: str | None = None,
         script: str = "") -> str:
    """A whole page: ``body`` with the command and the JSON under it, style and script
    inline (``script``: more of it, for the local page)."""
    tail = (_block("command", "The command", command) if command else "") + (
        f"<details><summary>JSON</summary>{_block('json', 'JSON', json_text)}</details>"
        if json_text else "")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{escape(title)}</title><style>{STYLE}</style></head><body>"
            f"<h1>{escape(title)}</h1><p class=\"note\">{escape(NOTE)} stepsim {__version__}."
            f"</p>{body}{tail}<script>{SCRIPT}{script}</script></body></html>\n")


def render(title: str, labels: Sequence[str], reports: Sequence[dict[str, Any]],
           lines: Sequence[str], *, command: str, json_text: str) -> str:
    """The report file of one command's answer."""
    return page(title, sections(labels, reports, lines), command=command, json_text=json_text)
