"""The `stepsim` command: one subcommand per module in simulator/commands/.

Every subcommand module has ``add_parser(subparsers)`` and ``run(args) -> int``. Only the
module of the command being run is imported (its flags are built then); the others appear in
``stepsim --help`` by the one-line help in ``COMMANDS``, so `stepsim --version` or `stepsim
presets` never load the simulator. Bad input (an :class:`InputError`) is printed as one line
on stderr with exit status 2, never a traceback.

``entry`` is the installed `stepsim` program: once the answer is written and flushed it ends
the process without tearing the interpreter down (freeing every module and object of a
finished run costs a tenth of a short run and changes nothing the user sees).
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from simulator import __version__
from simulator.errors import InputError

if TYPE_CHECKING:
    import argparse

# command -> its one-line help (tests/test_cli.py checks each module registers the same line)
COMMANDS: dict[str, str] = {
    "run": "simulate one training step",
    "collective": "time one NCCL collective over a range of sizes, like nccl-tests",
    "memory": "memory per GPU of a training job and whether it fits",
    "topo": "GPU-pair matrix (path type, transport, GB/s) and NCCL rings",
    "calibrate": "fit a topology to your nccl-tests logs and a measured GPU step",
    "compare": "several machines / workloads / strategies side by side",
    "sweep": "one job over list-valued options (e.g. --bucket-mb 1,5,25,100,400)",
    "advise": "the best strategy, recipe and micro-batch for a job on each machine",
    "presets": "list the bundled topologies and workloads",
    "schema": "the JSON Schema of topology or workload YAML (for editors)",
    "serve": "a local page to compare boxes, live (127.0.0.1)",
}


def _command_of(argv: Sequence[str]) -> str | None:
    """The subcommand named on the command line (the first word that is not an option)."""
    return next((a for a in argv if not a.startswith("-")), None)


def build_parser(command: str | None = None, *, listed: bool = True) -> argparse.ArgumentParser:
    """The parser with ``command``'s full flags (every command's when None); ``listed``: the
    other commands too, by their help line, for the top-level help and the unknown-command
    error (each costs argparse a parser and its message-catalogue lookups)."""
    from simulator.commands.parsing import Parser

    parser = Parser(
        prog="stepsim",
        description="Simulate one multi-GPU training step on a modelled machine, without a GPU.",
    )
    parser.add_argument("--version", action="version", version=f"stepsim {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True,
                                parser_class=Parser)
    for name, help_line in COMMANDS.items():
        if command is None or name == command:
            importlib.import_module(f"simulator.commands.{name}").add_parser(sub)
        elif listed:
            sub.add_parser(name, help=help_line)
    return parser


def main(argv: Sequence[str] | None = None, *, whole_process: bool = False) -> int:
    """Run one command; ``whole_process``: the process ends with it (the `stepsim` program)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv == ["--version"]:  # argparse's own answer, without building (or importing) it
        print(f"stepsim {__version__}")
        return 0
    from simulator.commands.parsing import UsageError

    prog = "stepsim"
    command = _command_of(argv)
    try:
        known = command if command in COMMANDS else None
        # the others are listed only where argparse may print them: an unknown command, or a
        # help flag before the command (`stepsim --help run` is the top-level help)
        listed = known is None or any(a in ("-h", "--help") for a in argv[:argv.index(known)])
        args = build_parser(known or "", listed=listed).parse_args(argv)
        prog = f"stepsim {args.command}"
        args.argv = argv  # the command line as given (an HTML report shows it)
        if whole_process:
            # what the imports built (modules, the models' schemas) lives until the process
            # ends: keep the cyclic collector from scanning it again at every collection the
            # simulation's allocations trigger (a fifth of a short run's CPU)
            gc.freeze()
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
        return 2  # no error object: stdout is what failed


def _fail(prog: str, exc: InputError, argv: Sequence[str]) -> int:
    """One line on stderr; under --json also ``{"error": {...}}`` on stdout. Exit status 2."""
    import json
    import re

    from simulator.outputs.jsondoc import SCHEMA_VERSION

    print(f"{prog}: error: {exc}", file=sys.stderr)
    if "--json" in argv:
        key, message = exc.key, exc.message
        flag = re.match(r"(-{1,2}[A-Za-z][\w-]*): (.+)", message)
        if key is None and exc.file is None and flag:  # "--gpus: expected ...": its flag is the key
            key, message = flag.groups()
        error = {"file": exc.file, "line": exc.line, "key": key, "message": message}
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


def entry() -> None:
    """The `stepsim` program: run, flush what was printed, and leave without teardown."""
    # stepsim multiplies no matrices: OpenBLAS's thread pool, which numpy starts at import (for
    # the PNGs and `calibrate`'s fit) with a thread per core spinning for work, only costs CPU
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    try:
        code = main(whole_process=True)
    except SystemExit as exc:  # argparse's --help and --version
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
        if exc.code is not None and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except OSError:  # the reader left (`stepsim ... | head`), or the disk is full
            _silence_stdout()
    os._exit(code)


if __name__ == "__main__":
    entry()
