"""`stepsim sweep`: one job over list-valued options (bucket size, GPUs, micro-batch, ...).

``--bucket-mb 1,5,25,100,400`` (and any other option given as a comma list) runs every
combination; the table has a row per point. Points run in parallel processes when
``--jobs N`` asks for it (a point takes tens of milliseconds, less than starting a
process); progress shows on stderr for a sweep over two seconds (simulator/commands/terminal.py).
`--png` draws step time and exposed communication over the swept values; `--json` prints
a list of `run --json` objects, each with the point's option values under ``"point"``;
`--csv` the same as a row per point (``point.bucket_mb``, ..., first).
"""

from __future__ import annotations

import argparse
import itertools
import os
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from typing import Any

from simulator import api
from simulator.api import RunSpec
from simulator.commands import figures as fig
from simulator.commands import price_flags, recipe_flags, script_output, terminal
from simulator.commands.parsing import whole
from simulator.commands.run import NUMBER_FLAGS, add_job_arguments, memory_verdict
from simulator.errors import InputError, quoted
from simulator.outputs.cost import Prices
from simulator.outputs.files import write_atomically
from simulator.units import fraction

# option name -> (RunSpec field, parser of one value): run's number flags, as lists
LIST_OPTIONS: dict[str, tuple[str, Callable[[str, str], Any]]] = {
    field: (field, parse) for field, parse in NUMBER_FLAGS.items()}


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "sweep", help="one job over list-valued options (e.g. --bucket-mb 1,5,25,100,400)",
        description="Simulate one job at every combination of list-valued options: "
        "--bucket-mb, --gpus, --nnodes, --tp, --micro-batch, --grad-accum, --seq-len take comma "
        "lists.")
    add_job_arguments(parser)
    parser.add_argument("--png", metavar="FILE.png", help="chart of the sweep")
    script_output.add_arguments(parser, row="point")
    parser.add_argument("--jobs", type=whole(1, 256), default=None,
                        help="parallel worker processes (default 1: a point is faster than a "
                        "process start)")
    parser.set_defaults(handler=run)


def points(args: argparse.Namespace) -> tuple[list[str], list[dict[str, Any]]]:
    """The swept option names and every combination of their values."""
    axes: dict[str, list[Any]] = {}
    for option, (_, parse) in LIST_OPTIONS.items():
        text = getattr(args, option)
        if text is None:
            continue
        flag = "--" + option.replace("_", "-")
        items = [v.strip() for v in str(text).split(",")]
        if not all(items):
            raise InputError(f"{flag}: expected a comma-separated list of values, "
                             f"got {quoted(text)}")
        values = [parse(v, flag) for v in items]
        axes[option] = values
    swept = [k for k, v in axes.items() if len(v) > 1]
    combos = [dict(zip(axes, values, strict=True)) for values in itertools.product(*axes.values())]
    return swept, combos


def _run_point(point: tuple[RunSpec, Prices, bool]) -> dict[str, Any]:
    spec, prices, ranges = point
    return api.simulate(spec, prices=prices, ranges=ranges).report


def run(args: argparse.Namespace) -> int:
    script_output.check(args)
    slowdown = fraction(args.compute_slowdown, "--compute-slowdown")
    swept, combos = points(args)
    base = api.configured(RunSpec(
        args.topology, args.workload, api.check_strategy(args.strategy or "ddp"),
        overlap=not args.no_overlap, compute_slowdown=slowdown,
        nccl=api.NcclEnv.from_environ(os.environ),
        allow_tp_across_nodes=args.allow_tp_across_nodes,
        **recipe_flags.fields_from_args(args)))  # the same at every point
    specs = [replace(base, **{LIST_OPTIONS[k][0]: v for k, v in combo.items()})
             for combo in combos]
    for message in dict(api.unused_flags(base.strategy, tp=specs[0].tp,
                                         bucket_mb=specs[0].bucket_mb,
                                         overlap=base.overlap)).values():
        raise InputError(message)
    # the first point runs here, so bad input fails in this process with one clear line
    prices = price_flags.prices(args)
    ranges = not args.no_ranges
    reports: list[dict[str, Any]] = [_run_point((specs[0], prices, ranges))]
    rest = [(spec, prices, ranges) for spec in specs[1:]]
    # A 7B step simulates in tens of milliseconds, less than a worker process takes to start
    # (about 0.5 s measured on 2 cores), so processes are used only when asked for.
    jobs = min(args.jobs or 1, max(1, len(rest)))
    with terminal.progress(f"simulating {len(specs)} points") as update:
        if jobs > 1:
            with ProcessPoolExecutor(max_workers=jobs) as pool:
                for report in pool.map(_run_point, rest):
                    reports.append(report)
                    update(len(reports), len(specs))
        else:
            for point in rest:
                reports.append(_run_point(point))
                update(len(reports), len(specs))
    for report, combo in zip(reports, combos, strict=True):
        report["point"] = combo
    labels = [", ".join(f"{k.replace('_', '-')}={v:g}" for k, v in c.items() if k in swept)
              or "default" for c in combos]
    if args.png:
        metrics = {"step time": [r["step_time_s"] * 1e3 for r in reports],
                   "exposed communication": [r["exposed_comm_s"] * 1e3 for r in reports],
                   "communication": [r["comm_time_s"] * 1e3 for r in reports]}
        title = f"{reports[0]['workload']} on {reports[0]['topology']}, {base.strategy}"
        from simulator.outputs import plots  # matplotlib only when a picture is asked for

        write_atomically(args.png, lambda p: plots.sweep_chart(combos, metrics, p, title=title))
    if args.json:
        script_output.print_json(reports)
    elif args.csv:
        script_output.print_csv(reports, first=[f"point.{k}" for k in combos[0]])
    else:
        print_table(reports, labels, base)
    return script_output.status(args, (r["memory"] for r in reports))


def print_table(reports: list[dict[str, Any]], labels: list[str], base: RunSpec) -> None:
    first = reports[0]
    table = terminal.table(title=f"{first['workload']} on {first['topology']}, {base.strategy}")
    priced = any(r["cost"]["usd_per_hour"] is not None for r in reports)
    # short headers and figures, a range on the line under its value (tokens/s per GPU is in
    # --json and --csv): eleven columns in 120
    for name in ("point", "step", "tokens/s", "scaling", "MFU", "comm",
                 "exposed", "buckets", "memory", *(["$/M tok"] if priced else []),
                 "kWh/M tok"):
        table.add_column(name, justify="left" if name in ("point", "memory") else "right",
                         overflow="fold")
    for label, r in zip(labels, reports, strict=True):
        buckets, eff = r.get("buckets"), r.get("scaling_efficiency")
        usd = r["cost"]["usd_per_million_tokens"]
        kwh = r["energy"]["kwh_per_million_tokens"]
        table.add_row(*(cell.replace(" (", "\n(") for cell in (
            label.replace(", ", "\n"),
            fig.seconds_ranged(r["step_time_s"], r.get("step_time_s_range")),
            fig.ranged(fig.short_count(r["tokens_per_s"]), r.get("tokens_per_s_range"),
                       fig.short_count),
 "-" if eff is None else f"{eff:.0%}",
            f"{r['mfu']:.1%}",
            f"{r['comm_time_s'] * 1e3:.1f} ms", f"{r['exposed_comm_s'] * 1e3:.1f} ms",
            "-" if buckets is None else str(len(buckets)),
            memory_verdict(r["memory"]).split(":")[0],
            *([("-" if usd is None else f"${usd:.3g}")] if priced else []),
            "-" if kwh is None else f"{kwh:.3g}")))
    console = terminal.console()
    console.print(table)
    recipes = dict.fromkeys(recipe_flags.training_words(r.get("recipe", {})) for r in reports)
    console.print("recipe: " + "; ".join(w for w in recipes if w))
    lines = dict.fromkeys(r["range_basis"]["summary"] for r in reports if r.get("range_basis"))
    for line in lines:
        console.print(line)
