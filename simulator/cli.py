"""The `stepsim` command: one subcommand per module in simulator/commands/.

Every subcommand module has ``add_parser(subparsers)`` and ``run(args) -> int``. Bad input
(an :class:`InputError`) is printed as one line on stderr with exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from simulator import __version__
from simulator.errors import InputError

COMMANDS = ("run", "collective", "memory", "topo", "compare", "sweep", "advise", "presets")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="stepsim",
        description="Simulate one multi-GPU training step on a modelled machine, without a GPU.",
    )
    parser.add_argument("--version", action="version", version=f"stepsim {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        importlib.import_module(f"simulator.commands.{name}").add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args))
    except InputError as exc:
        print(f"stepsim {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
