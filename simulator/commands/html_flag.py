"""``--html FILE.html`` on `run`, `compare`, `sweep` and `advise`: the answer as one
self-contained page (outputs/html_report.py), beside whatever the command prints.

The page carries the exact command line that made it (``args.argv``, which the CLI keeps) and
the JSON its ``--json`` prints, each with a copy button.
"""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Sequence
from typing import Any

from simulator.outputs.files import check_outputs, text_writer, write_atomically


def add_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--html", metavar="FILE.html",
                        help="write the answer as one self-contained HTML page (table, "
                        "pictures, memory, advice, the command and JSON; no network needed)")


def check(args: argparse.Namespace) -> None:
    """Refuse a path that cannot be written before the work."""
    check_outputs([args.html])


def command_line(args: argparse.Namespace) -> str:
    return "stepsim " + shlex.join(getattr(args, "argv", None) or [args.command])


def json_of(reports: Any) -> str:
    """What ``--json`` prints for the same answer (the pictures' data left out)."""
    from simulator.outputs import jsondoc

    def bare(doc: Any) -> Any:
        return {k: v for k, v in doc.items() if k != "gantt"} if isinstance(doc, dict) else doc

    if isinstance(reports, list):
        return jsondoc.dumps([bare(r) for r in reports])
    return jsondoc.dumps(bare(reports))


def title(args: argparse.Namespace, reports: Sequence[dict[str, Any]]) -> str:
    workloads = ", ".join(dict.fromkeys(r["workload"] for r in reports))
    machines = ", ".join(dict.fromkeys(args.topology if isinstance(args.topology, list)
                                       else [args.topology]))
    return f"stepsim {args.command}: {workloads} on {machines}"


def write(args: argparse.Namespace, labels: Sequence[str], reports: Sequence[dict[str, Any]],
          lines: Sequence[str], *, doc: Any = None) -> None:
    """Write the page when --html was given; ``doc``: the JSON shown (default the reports)."""
    if not getattr(args, "html", None):
        return
    from simulator.outputs import html_report  # only when a page is asked for

    text = html_report.render(title(args, reports), labels, reports, lines,
                              command=command_line(args),
                              json_text=json_of(list(reports) if doc is None else doc))
    write_atomically(args.html, text_writer(text))
