"""`stepsim compare`: several machines, workloads or strategies side by side in one table.

Every combination of the repeated ``-t``, ``-w``, ``-s`` and ``--nnodes`` options is answered
with the same flags; ``-t NAME:K`` uses the first K GPUs of that machine (4x 4090 against one
A100 in one command: ``-t 8x4090-dual-socket:4 -t 8xa100-nvswitch:1``). The table has a column per
combination and a row per metric, then the winner and the mechanism that decides it
(advice/decide.py), the ranges' and the confidence lines. A combination that does not fit
shows its verdict and what would fit, no figures (``--simulate-anyway``: figures marked).
``--json``: a list of the `run --json` objects; ``--csv``: a row per combination; ``--html``:
the self-contained report (outputs/html_report.py).
"""

from __future__ import annotations

import argparse
import itertools
from typing import Any

from simulator import api
from simulator.advice import decide
from simulator.api.ranges import WORDS
from simulator.api.spec import RunSpec
from simulator.commands import html_flag, price_flags, script_output, terminal
from simulator.commands.parsing import machine_gpus
from simulator.commands.run import add_job_arguments, spec_from_args, would_fit
from simulator.commands.run_text import AS_IF, FIGURES, memory_verdict, summary_rows
from simulator.outputs.files import write_atomically


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "compare", help="several machines / workloads / strategies side by side",
        description="Simulate every combination of the given topologies, workloads and "
        "strategies and print them side by side, e.g. "
        "`stepsim compare -t 8x5090-switch -t 8x5090-dual-socket -w llama3.2-1b -s ddp`; "
        "-t NAME:K uses the first K GPUs of that machine "
        "(`-t 8x4090-dual-socket:4 -t 8xa100-nvswitch:1`).")
    add_job_arguments(parser, many=True)
    parser.add_argument("--png", metavar="FILE.png",
                        help="draw the runs side by side: compute, exposed communication and "
                        "idle per step, and tokens/s, with their ranges")
    html_flag.add_argument(parser)
    script_output.add_arguments(parser, row="run")
    parser.set_defaults(handler=run)


def _label(combo: tuple[str, str, str, str | None], varying: set[str]) -> str:
    parts = [str(v) for k, v in zip(("topology", "workload", "strategy"), combo[:3], strict=True)
             if k in varying]
    if "nnodes" in varying:  # the flag's values were checked by spec_from_args
        parts.append(f"{combo[3]} box{'' if str(combo[3]).strip() == '1' else 'es'}")
    return " / ".join(parts) or combo[0]


def specs_of(args: argparse.Namespace
             ) -> tuple[list[tuple[str, str, str, str | None]], list[RunSpec]]:
    """Every combination (as given on the command line) and its spec."""
    boxes: list[str | None] = list(args.nnodes or [None])
    combos = list(itertools.product(args.topology, args.workload, args.strategy or ["ddp"],
                                    boxes))
    strategies = tuple(args.strategy or ["ddp"])
    specs = []
    for t, w, s, n in combos:
        topology, gpus = machine_gpus(t)
        specs.append(spec_from_args(args, topology, w, s, others=strategies, gpus=gpus,
                                    nnodes=n))
    return combos, specs


def answers(args: argparse.Namespace, *, progress: Any = None
            ) -> tuple[list[str], list[dict[str, Any]]]:
    """Each combination's label and answer (the `run --json` object, or its verdict), what
    would fit added where it does not: what every output of `compare` shows."""
    combos, specs = specs_of(args)
    machines = len(args.topology)
    prices = [price_flags.prices(args, args.topology.index(t), machines)
              for t, _, _, _ in combos]
    reports = api.answer_all(specs, prices=prices, ranges=not args.no_ranges,
                             simulate_anyway=args.simulate_anyway, progress=progress,
                             gantt=bool(getattr(args, "html", None)))
    for spec, report in zip(specs, reports, strict=True):
        changes = would_fit(report, spec)
        if changes:
            report["what_would_fit"] = changes
    varying = {name for name, values in (("topology", args.topology),
                                         ("workload", args.workload),
                                         ("strategy", args.strategy or ["ddp"]),
                                         ("nnodes", args.nnodes or [None]))
               if len(set(values)) > 1}
    return [_label(c, varying) for c in combos], reports


def run(args: argparse.Namespace) -> int:
    script_output.check(args)
    html_flag.check(args)
    runs = len(args.topology) * len(args.workload) * len(args.strategy or ["ddp"]) * \
        len(args.nnodes or [None])
    with terminal.progress(f"simulating {runs} runs") as update:
        labels, reports = answers(args, progress=update)
    simulated = [(label, r) for label, r in zip(labels, reports, strict=True)
                 if r.get("simulated", True)]
    lines = decide.winner_lines(reports, labels)
    if args.png and simulated:
        from simulator.outputs import plots  # matplotlib only when a picture is asked for

        title = " / ".join(sorted({f"{r['workload']}" for r in reports}))
        write_atomically(args.png, lambda p: plots.compare_chart(
            [label for label, _ in simulated], [r for _, r in simulated], p, title=title))
    html_flag.write(args, labels, reports, lines)
    for report in reports:
        report.pop("gantt", None)  # the pictures' data: in the HTML report, not the JSON
    if args.json or args.csv:
        if args.json:
            script_output.print_json(reports)
        else:
            script_output.print_csv(reports)
        return script_output.status(args, (r["memory"] for r in reports))
    print_table(labels, reports, ranges=not args.no_ranges, title=len(reports) > 1)
    console = terminal.console()
    for line in lines:
        console.print(line)
    for line in dict.fromkeys(r["confidence"]["summary"] for r in reports if r.get("confidence")):
        console.print(line)
    return script_output.status(args, (r["memory"] for r in reports))


def print_table(labels: list[str], reports: list[dict[str, Any]], *, ranges: bool,
                title: bool) -> None:
    table = terminal.table(title="same flags, side by side" if title else None)
    table.add_column("", style="bold")
    for label, report in zip(labels, reports, strict=True):
        table.add_column(label + (AS_IF if report.get("simulated_anyway") else ""))
    table.add_row("GPUs", *[f"{r['gpus']} x {r['gpu']}" for r in reports])
    rows = [dict(summary_rows(r)) if r.get("simulated", True) else
            {"memory per GPU": memory_verdict(r["memory"]),
             "would fit with": "; ".join(w["flags"] or w["change"]
                                         for w in r.get("what_would_fit", [])) or "-"}
            for r in reports]
    names = list(dict.fromkeys(name for r in rows for name in r))  # union, first-seen order
    for name in names:
        table.add_row(name, *[_cell(r, report, name) for r, report in
                              zip(rows, reports, strict=True)])
    if ranges:
        table.add_row("range set by", *[_dominant(r) for r in reports])
    table.add_row("confidence", *[_confidence(r) for r in reports])
    terminal.show(table, terminal.console())


def _cell(row: dict[str, str], report: dict[str, Any], name: str) -> str:
    value = row.get(name, "-")
    return value + (AS_IF if report.get("simulated_anyway") and name in FIGURES else "")


def _confidence(report: dict[str, Any]) -> str:
    from simulator.api.confidence import short

    return short(report.get("confidence"))


def _dominant(report: dict[str, Any]) -> str:
    """The mechanism that sets most of the step-time range, and its spread."""
    basis = report.get("range_basis")
    if not basis or basis["dominant"] is None:
        return "-"
    info = basis["mechanisms"][basis["dominant"]]
    return (f"{WORDS[basis['dominant']]}: {info['low']:.2f}-{info['high']:.2f}x "
            f"({info['basis'].split(':')[0]})")
