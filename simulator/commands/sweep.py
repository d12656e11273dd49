"""`stepsim sweep`: one job over list-valued options (bucket size, GPUs, micro-batch, ...).

``--bucket-mb 1,5,25,100,400`` (and any other option given as a comma list) runs every
combination; the table has a row per point. Points run in parallel processes when
``--jobs N`` asks for it (a point takes tens of milliseconds, less than starting a
process); progress shows on stderr for a sweep over two seconds (simulator/commands/terminal.py).
Under the table: the winner (most tokens/s among the points that fit) and one sentence of why,
held against the slowest point (advice/decide.py). ``--micro-batch`` takes ``max`` among its
values (the largest that fits at that point). A point that does not fit shows its verdict, no
figures (``--simulate-anyway``: figures marked). `--png` draws step time and exposed
communication over the swept values; `--json` prints a list of `run --json` objects, each with
the point's option values under ``"point"``; `--csv` the same as a row per point
(``point.bucket_mb``, ..., first); `--html` the self-contained report.
"""

from __future__ import annotations

import argparse
import itertools
import os
import re
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from typing import Any

from simulator import api
from simulator.advice import decide
from simulator.api import RunSpec
from simulator.commands import html_flag, price_flags, recipe_flags, script_output, terminal
from simulator.commands.parsing import whole
from simulator.commands.run import (
    MAX,
    NUMBER_FLAGS,
    add_job_arguments,
    largest,
    number_flag,
    would_fit,
)
from simulator.commands.run_text import memory_verdict
from simulator.errors import InputError, quoted
from simulator.outputs import figures as fig
from simulator.outputs.files import write_atomically
from simulator.units import fraction

# a range line's "<mechanism> sets N% of its width" (api/ranges.py summary_line)
_SHARE = re.compile(r" sets (\d+)% of its width")


def merged_shares(lines: list[str]) -> list[str]:
    """The points' summary lines, once each; lines that differ only in the share a mechanism
    sets of the range's width become one, with the points' lowest and highest share."""
    shares: dict[str, list[int]] = {}
    for line in lines:
        shares.setdefault(_SHARE.sub(" sets \0% of its width", line), []).extend(
            int(m) for m in _SHARE.findall(line))
    out = []
    for text, values in shares.items():
        lo, hi = (min(values), max(values)) if values else (0, 0)
        out.append(text.replace("\0", f"{lo}" if lo == hi else f"{lo}-{hi}") if values else text)
    return out


def _list_value(field: str) -> Callable[[str, str], Any]:
    return lambda text, _flag: number_flag(field, text)


# option name -> (RunSpec field, parser of one value): run's number flags, as lists
# (--micro-batch takes max among its values)
LIST_OPTIONS: dict[str, tuple[str, Callable[[str, str], Any]]] = {
    field: (field, _list_value(field)) for field in NUMBER_FLAGS}


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "sweep", help="one job over list-valued options (e.g. --bucket-mb 1,5,25,100,400)",
        description="Simulate one job at every combination of list-valued options: "
        "--bucket-mb, --gpus, --nnodes, --tp, --micro-batch, --grad-accum, --seq-len take comma "
        "lists.")
    add_job_arguments(parser)
    parser.add_argument("--png", metavar="FILE.png", help="chart of the sweep")
    html_flag.add_argument(parser)
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


def _specs(args: argparse.Namespace, combos: list[dict[str, Any]]) -> list[RunSpec]:
    """Each point's spec; a point at ``--micro-batch max`` at the largest that fits there."""
    slowdown = fraction(args.compute_slowdown, "--compute-slowdown")
    fields = recipe_flags.fields_from_args(args)
    searched = any(c.get("micro_batch") == MAX for c in combos)
    if searched:  # the search decides it: a DeepSpeed config's micro-batch does not apply
        fields["explicit"] = fields["explicit"] | {"micro_batch"}
    base = api.configured(RunSpec(
        args.topology, args.workload, api.check_strategy(args.strategy or "ddp"),
        overlap=not args.no_overlap, compute_slowdown=slowdown,
        nccl=api.NcclEnv.from_environ(os.environ),
        allow_tp_across_nodes=args.allow_tp_across_nodes, **fields))  # the same at every point
    specs = []
    for combo in combos:
        values: dict[str, Any] = {LIST_OPTIONS[k][0]: (None if v == MAX else v)
                                  for k, v in combo.items()}
        spec = replace(base, **values)
        specs.append(largest(spec) if combo.get("micro_batch") == MAX else spec)
    for message in dict(api.unused_flags(base.strategy, tp=specs[0].tp,
                                         bucket_mb=specs[0].bucket_mb,
                                         overlap=base.overlap)).values():
        raise InputError(message)
    return specs


def answers(args: argparse.Namespace, *, progress: Any = None
            ) -> tuple[list[str], list[dict[str, Any]], list[str], RunSpec]:
    """Each point's label and answer, the swept options, and the first point's spec."""
    swept, combos = points(args)
    specs = _specs(args, combos)
    options = {"prices": price_flags.prices(args), "ranges": not args.no_ranges,
               "simulate_anyway": args.simulate_anyway,
               "gantt": bool(getattr(args, "html", None))}
    # the first point runs here, so bad input fails in this process with one clear line
    reports: list[dict[str, Any]] = [api.answer(specs[0], **options)]
    rest = specs[1:]
    # A 7B step simulates in tens of milliseconds, less than a worker process takes to start
    # (about 0.5 s measured on 2 cores), so processes are used only when asked for.
    jobs = min(getattr(args, "jobs", None) or 1, max(1, len(rest)))

    def update(done: int, total: int) -> None:
        if progress is not None:
            progress(done + 1, total + 1)

    pool = ProcessPoolExecutor(max_workers=jobs) if jobs > 1 else None
    try:
        reports += api.answer_all(rest, executor=pool, progress=update, **options)
    finally:
        if pool is not None:
            pool.shutdown()
    for spec, report, combo in zip(specs, reports, combos, strict=True):
        report["point"] = {k: (spec.micro_batch if v == MAX else v) for k, v in combo.items()}
        changes = would_fit(report, spec)
        if changes:
            report["what_would_fit"] = changes
    labels = [", ".join(f"{k.replace('_', '-')}={v:g}" + (" (max)" if c[k] == MAX else "")
                        for k, v in r["point"].items() if k in swept) or "default"
              for c, r in zip(combos, reports, strict=True)]
    return labels, reports, swept, specs[0]


def run(args: argparse.Namespace) -> int:
    script_output.check(args)
    html_flag.check(args)
    with terminal.progress("simulating the points") as update:
        labels, reports, swept, base = answers(args, progress=update)
    lines = decide.winner_lines(reports, labels, against="slowest")
    if args.png:
        def each(key: str) -> list[float | None]:
            return [r[key] * 1e3 if r.get("simulated", True) else None for r in reports]

        metrics = {"step time": each("step_time_s"),
                   "exposed communication": each("exposed_comm_s"),
                   "communication": each("comm_time_s")}
        title = f"{reports[0]['workload']} on {reports[0]['topology']}, {base.strategy}"
        from simulator.outputs import plots  # matplotlib only when a picture is asked for

        combos = [r["point"] for r in reports]
        write_atomically(args.png, lambda p: plots.sweep_chart(combos, metrics, p, title=title))
    html_flag.write(args, labels, reports, lines)
    for report in reports:
        report.pop("gantt", None)  # the pictures' data: in the HTML report, not the JSON
    if args.json:
        script_output.print_json(reports)
    elif args.csv:
        script_output.print_csv(reports, first=[f"point.{k}" for k in reports[0]["point"]])
    else:
        print_table(reports, labels, base)
        console = terminal.console()
        for line in lines:
            console.print(line)
    return script_output.status(args, (r["memory"] for r in reports))


def print_table(reports: list[dict[str, Any]], labels: list[str], base: RunSpec) -> None:
    first = reports[0]
    table = terminal.table(title=f"{first['workload']} on {first['topology']}, {base.strategy}")
    priced = any(r["cost"]["usd_per_hour"] is not None for r in reports if "cost" in r)
    # short headers and figures, a range on the line under its value (tokens/s per GPU is in
    # --json and --csv): eleven columns in 120
    for name in ("point", "step", "tokens/s", "scaling", "MFU", "comm",
                 "exposed", "buckets", "memory", *(["$/M tok"] if priced else []),
                 "kWh/M tok"):
        table.add_column(name, justify="left" if name in ("point", "memory") else "right",
                         overflow="fold")
    for label, r in zip(labels, reports, strict=True):
        if not r.get("simulated", True):  # no figures for a step that runs out of memory
            cells = [label.replace(", ", "\n"), *["-"] * 7, memory_verdict(r["memory"]),
                     *(["-"] if priced else []), "-"]
            table.add_row(*cells)
            continue
        buckets, eff = r.get("buckets"), r.get("scaling_efficiency")
        usd = r["cost"]["usd_per_million_tokens"]
        kwh = r["energy"]["kwh_per_million_tokens"]
        mark = "\n(as if it fit)" if r.get("simulated_anyway") else ""
        table.add_row(*(cell.replace(" (", "\n(") for cell in (
            label.replace(", ", "\n") + mark,
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
    terminal.show(table, console)
    recipes = dict.fromkeys(recipe_flags.training_words(r.get("recipe", {})) for r in reports)
    console.print("recipe: " + "; ".join(w for w in recipes if w))
    for key in ("range_basis", "confidence"):
        for line in merged_shares([r[key]["summary"] for r in reports if r.get(key)]):
            console.print(line)
    for label, r in zip(labels, reports, strict=True):
        changes = r.get("what_would_fit") or []
        if changes and not r.get("simulated", True):
            first = changes[0]
            console.print(f"{label}: does not fit; would fit with "
                          f"{first['flags'] or first['change']} ({first['detail']})")
