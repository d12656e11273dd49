"""The `stepsim` command: one subcommand per module in simulator/commands/.

Every subcommand module has ``add_parser(subparsers)`` and ``run(args) -> int``. Bad input
(an :class:`InputError`) is printed as one line on stderr with exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import sys
from collections.abc import Sequence

from simulator import __version__
from simulator.commands.parsing import Parser, UsageError
from simulator.errors import InputError
from simulator.outputs.jsondoc import SCHEMA_VERSION

COMMANDS = ("run", "collective", "memory", "topo", "calibrate", "compare", "sweep", "advise",
            "presets")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="stepsim",
        description="Simulate one multi-GPU training step on a modelled machine, without a GPU.",
    )
    parser.add_argument("--version", action="version", version=f"stepsim {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True,
                                parser_class=Parser)
    for name in COMMANDS:
        importlib.import_module(f"simulator.commands.{name}").add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    prog = "stepsim"
    try:
        args = build_parser().parse_args(argv)
        prog = f"stepsim {args.command}"
        code = int(args.handler(args))
        sys.stdout.flush()  # a full or closed stdout fails here, not in interpreter teardown
        return code
    except UsageError as exc:
        return _fail(exc.prog, exc, argv)
    except InputError as exc:
        return _fail(prog, exc, argv)
    except BrokenPipeError:  # `stepsim ... | head`: the reader has all it wanted
        _silence_stdout()
        return 0
    except OSError as exc:  # stdout itself cannot be written (a full disk, /dev/full)
        _silence_stdout()
        print(f"{prog}: error: cannot write the output: {exc.strerror or exc}",
              file=sys.stderr)
        return 2


def _fail(prog: str, exc: InputError, argv: Sequence[str]) -> int:
    """One line on stderr; under --json also ``{"error": {...}}`` on stdout. Exit status 2."""
    print(f"{prog}: error: {exc}", file=sys.stderr)
    if "--json" in argv:
        error = {"file": exc.file, "line": exc.line, "key": exc.key, "message": exc.message}
        try:
            print(json.dumps({"schema_version": SCHEMA_VERSION, "error": error}))
            sys.stdout.flush()
        except OSError:
            _silence_stdout()
    return 2


def _silence_stdout() -> None:
    """Point stdout at /dev/null so Python's exit does not fail flushing it a second time."""
    with contextlib.suppress(OSError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


if __name__ == "__main__":
    sys.exit(main())
