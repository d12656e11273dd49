"""`stepsim compare`: several machines, workloads or strategies side by side in one table.

Every combination of the repeated ``-t``, ``-w``, ``-s`` and ``--nnodes`` options is simulated
with the same flags; the table has a column per combination and a row per metric (`--json`: a
list of the `run --json` objects; `--csv`: a row per combination).
"""

from __future__ import annotations

import argparse
import itertools
from typing import Any

from simulator import api
from simulator.api.ranges import WORDS
from simulator.commands import price_flags, script_output, terminal
from simulator.commands.run import add_job_arguments, spec_from_args, summary_rows
from simulator.outputs.files import write_atomically


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "compare", help="several machines / workloads / strategies side by side",
        description="Simulate every combination of the given topologies, workloads and "
        "strategies and print them side by side, e.g. "
        "`stepsim compare -t 8x5090-switch -t 8x5090-dual-socket -w llama3.2-1b -s ddp`.")
    add_job_arguments(parser, many=True)
    parser.add_argument("--png", metavar="FILE.png",
                        help="draw the runs side by side: compute, exposed communication and "
                        "idle per step, and tokens/s, with their ranges")
    script_output.add_arguments(parser, row="run")
    parser.set_defaults(handler=run)


def _label(report: dict[str, Any], varying: set[str]) -> str:
    parts = [str(report[k]) for k in ("topology", "workload", "strategy") if k in varying]
    if "nnodes" in varying:
        boxes = report["parallelism"].get("nnodes", 1)
        parts.append(f"{boxes} box{'es' if boxes > 1 else ''}")
    return " / ".join(parts) or report["topology"]


def run(args: argparse.Namespace) -> int:
    script_output.check(args)
    boxes = args.nnodes or [None]
    combos = list(itertools.product(args.topology, args.workload, args.strategy or ["ddp"],
                                    boxes))
    strategies = tuple(args.strategy or ["ddp"])
    specs = [spec_from_args(args, t, w, s, others=strategies, nnodes=n) for t, w, s, n in combos]
    machines = len(args.topology)
    reports: list[dict[str, Any]] = []
    with terminal.progress(f"simulating {len(specs)} runs") as update:
        for spec, (t, _, _, _) in zip(specs, combos, strict=True):
            reports.append(api.simulate(spec, prices=price_flags.prices(
                args, args.topology.index(t), machines), ranges=not args.no_ranges).report)
            update(len(reports), len(specs))
    varying = {name for name, values in (("topology", args.topology),
                                         ("workload", args.workload),
                                         ("strategy", args.strategy or ["ddp"]),
                                         ("nnodes", boxes))
               if len(set(values)) > 1}
    if args.png:
        from simulator.outputs import plots  # matplotlib only when a picture is asked for

        labels = [_label(r, varying) for r in reports]
        title = " / ".join(sorted({f"{r['workload']}" for r in reports}))
        write_atomically(args.png, lambda p: plots.compare_chart(labels, reports, p,
                                                                 title=title))
    if args.json or args.csv:
        if args.json:
            script_output.print_json(reports)
        else:
            script_output.print_csv(reports)
        return script_output.status(args, (r["memory"] for r in reports))
    table = terminal.table(title="same flags, side by side" if varying else None)
    table.add_column("", style="bold")
    for report in reports:
        table.add_column(_label(report, varying), overflow="fold")
    table.add_row("GPUs", *[f"{r['gpus']} x {r['gpu']}" for r in reports])
    rows = [dict(summary_rows(r)) for r in reports]
    names = list(dict.fromkeys(name for r in rows for name in r))  # union, first-seen order
    for name in names:
        table.add_row(name, *[r.get(name, "-") for r in rows])
    if not args.no_ranges:
        table.add_row("range set by", *[_dominant(r) for r in reports])
    terminal.console().print(table)
    return script_output.status(args, (r["memory"] for r in reports))


def _dominant(report: dict[str, Any]) -> str:
    """The mechanism that sets most of the step-time range, and its spread."""
    basis = report["range_basis"]
    if basis["dominant"] is None:
        return "-"
    info = basis["mechanisms"][basis["dominant"]]
    return (f"{WORDS[basis['dominant']]}: {info['low']:.2f}-{info['high']:.2f}x "
            f"({info['basis'].split(':')[0]})")
