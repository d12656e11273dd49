"""The outputs a script reads from `sweep`, `compare` and `advise`: JSON, CSV, an exit status.

``--json`` prints the reports (each with ``schema_version``), ``--csv`` one flat row per
point (simulator/outputs/csvdoc.py), and ``--fail-if-no-fit`` turns "no point fits in
memory" into exit status 3 (after the usual output), so a shell loop can tell a job too big
for a machine (3) from bad input (2).
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from simulator.commands.parsing import NO_FIT_EXIT
from simulator.errors import InputError
from simulator.outputs import csvdoc, jsondoc


def add_arguments(parser: argparse.ArgumentParser, *, row: str) -> None:
    """--json, --csv and --fail-if-no-fit; ``row`` names what one row is ("point"), for --help."""
    parser.add_argument("--json", action="store_true",
                        help=f"print the {row}s as JSON (each with schema_version)")
    parser.add_argument("--csv", action="store_true",
                        help=f"print CSV on stdout: a header, then a row per {row} "
                        "(nested keys dotted, ranges as _low/_high)")
    parser.add_argument("--fail-if-no-fit", action="store_true",
                        help=f"exit {NO_FIT_EXIT} (after the usual output) when no {row} fits "
                        "in GPU and host memory")


def check(args: argparse.Namespace) -> None:
    """Refuse --json with --csv before any work: stdout holds one of them."""
    if args.json and args.csv:
        raise InputError("--json and --csv both print on stdout: give one of them")


def print_json(doc: Any) -> None:
    print(jsondoc.dumps(doc))


def print_csv(docs: Iterable[Mapping[str, Any]], *, first: Sequence[str] = ()) -> None:
    print(csvdoc.dumps(docs, first=first), end="")


def fits(memory: Mapping[str, Any]) -> bool:
    """GPU memory holds the job, and host RAM holds what it offloads."""
    return bool(memory["fits"]) and memory.get("host_fits", True) is not False


def status(args: argparse.Namespace, memories: Iterable[Mapping[str, Any]]) -> int:
    """0, or NO_FIT_EXIT under --fail-if-no-fit when none of the points fits."""
    if args.fail_if_no_fit and not any(fits(m) for m in memories):
        return NO_FIT_EXIT
    return 0
