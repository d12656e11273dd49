"""The `stepsim` command: one subcommand per module in simulator/commands/.

Every subcommand module has ``add_parser(subparsers)`` and ``run(args) -> int``. Only the
module of the command being run is imported (its flags are built then); the others appear in
``stepsim --help`` by the one-line help in ``COMMANDS``, so `stepsim --version` or `stepsim
presets` never load the simulator. Bad input (an :class:`InputError`) is printed as one line
on stderr with exit status 2, never a traceback. A reader that leaves early (`stepsim ... |
head -1`) ends the command quietly with status 0, whatever was being written (tables, JSON,
CSV, a trace streamed to /dev/stdout); a stdout that cannot be written (a full disk, or one
the shell closed) is one line on stderr and status 2.

``entry`` is the installed `stepsim` program: once the answer is written and flushed it ends
the process without tearing the interpreter down (freeing every module and object of a
finished run costs a tenth of a short run and changes nothing the user sees).
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import io
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, TextIO

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
    prog = "stepsim"
    command = _command_of(argv)
    try:
        if argv == ["--version"]:  # argparse's own answer, without building (or importing) it
            print(f"stepsim {__version__}")
            sys.stdout.flush()
            return 0
        known = command if command in COMMANDS else None
        # the others are listed only where argparse may print them: an unknown command, or a
        # help flag before the command (`stepsim --help run` is the top-level help)
        listed = known is None or any(a in ("-h", "--help") for a in argv[:argv.index(known)])
        if not listed:  # its help is the command's own (a full disk names the command)
            prog = f"stepsim {known}"
        args = build_parser(known or "", listed=listed).parse_args(argv)
        prog = f"stepsim {args.command}"
        args.argv = argv  # the command line as given (an HTML report shows it)
        if whole_process:
            # what the imports built (modules, the models' schemas) lives until the process
            # ends: keep the cyclic collector from scanning it again at every collection the
            # simulation's allocations trigger (a fifth of a short run's CPU)
            gc.freeze()
        from simulator.inputs.file_warnings import held_warnings

        with held_warnings():  # an error ends the command in one line, its warnings dropped
            code = int(args.handler(args))
        sys.stdout.flush()  # a full or closed stdout fails here, not in interpreter teardown
        return code
    except InputError as exc:  # a UsageError (parsing.py) names the (sub)command argparse read
        return _fail(getattr(exc, "prog", prog), exc, argv)
    except BrokenPipeError:  # `stepsim ... | head`: the reader has all it wanted
        _silence(sys.stdout)
        return 0
    except OSError as exc:
        if exc.filename is not None:  # a file the command opened, not its stdout
            return _fail(prog, InputError(exc.strerror or str(exc), file=str(exc.filename)),
                         argv)
        return _cannot_write(prog, exc)  # stdout itself (a full disk, /dev/full)


def _fail(prog: str, exc: InputError, argv: Sequence[str]) -> int:
    """One line on stderr; under --json also ``{"error": {...}}`` on stdout. Exit status 2."""
    import json
    import re

    from simulator.outputs.jsondoc import SCHEMA_VERSION

    _tell(f"{prog}: error: {exc}")
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
            _silence(sys.stdout)
    return 2


def _cannot_write(prog: str, exc: OSError) -> int:
    """stdout failed (ENOSPC, EIO): one line on stderr, exit 2 (no error object: stdout is
    what failed)."""
    _silence(sys.stdout)
    _tell(f"{prog}: error: cannot write the output: {exc.strerror or exc}")
    return 2


def _tell(line: str) -> None:
    """A line on stderr, if stderr can still be written (its reader may have left too)."""
    try:
        print(line, file=sys.stderr)
        sys.stderr.flush()
    except OSError:
        _silence(sys.stderr)


def _silence(stream: TextIO) -> None:
    """Point ``stream``'s descriptor at /dev/null, so that Python's exit does not fail
    flushing what it still holds a second time."""
    with contextlib.suppress(OSError, ValueError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), stream.fileno())


def _hold_closed_streams() -> None:
    """A standard stream the shell closed (`>&-`) is /dev/null here, so that no file the
    command opens takes its descriptor (a trace would be written where stdout was): stdout's
    read-only, so the output fails as on a full disk (one line, exit 2); stderr's writable, as
    nothing can be told there anyway."""
    for fd, mode in ((1, os.O_RDONLY), (2, os.O_WRONLY)):
        try:
            os.fstat(fd)
            continue
        except OSError:
            held = os.open(os.devnull, mode)  # the lowest free descriptor: usually fd itself
        if held != fd:
            os.dup2(held, fd)
            os.close(held)
        stream = io.TextIOWrapper(io.FileIO(fd, "w", closefd=False), line_buffering=fd == 2)
        if fd == 1:
            sys.stdout = stream
        else:
            sys.stderr = stream


def entry() -> None:
    """The `stepsim` program: run, flush what was printed, and leave without teardown."""
    # stepsim multiplies no matrices: OpenBLAS's thread pool, which numpy starts at import (for
    # the PNGs and `calibrate`'s fit) with a thread per core spinning for work, only costs CPU
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    _hold_closed_streams()
    try:
        code = main(whole_process=True)
    except SystemExit as exc:  # argparse's --help and --version
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
        if exc.code is not None and not isinstance(exc.code, int):
            _tell(str(exc.code))
    try:  # what argparse's help left in the buffer
        sys.stdout.flush()
    except BrokenPipeError:
        _silence(sys.stdout)
    except OSError as exc:
        code = code or _cannot_write("stepsim", exc)
    try:
        sys.stderr.flush()
    except OSError:
        _silence(sys.stderr)
    os._exit(code)


if __name__ == "__main__":
    entry()
