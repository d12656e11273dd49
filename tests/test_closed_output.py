"""A stdout that goes away: a reader that leaves early (`stepsim ... | head -1`) ends the
command quietly with status 0; a stdout that cannot take the bytes (a full disk, /dev/full,
or closed by the shell) is one line on stderr and a nonzero status. Each is the `stepsim`
program as a shell starts it, in a process of its own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RUN = ["run", "-t", "8x5090-switch", "-w", "llama2-7b-lora", "-s", "ddp"]  # the command
COMMANDS = {
    "run": RUN,
    "run --json": [*RUN, "--json"],
    "collective": ["collective", "-t", "8x5090-switch", "--op", "allreduce", "-b", "8",
                   "-e", "8G"],
    "compare": ["compare", "-t", "8x5090-switch", "-t", "2x5090", "-w", "gpt2-medium"],
}
MORE = {  # each way of writing stdout: CSV, a trace streamed, help, nccl-tests text, plain
    "compare --csv": [*COMMANDS["compare"], "--csv"],
    "sweep": ["sweep", "-t", "2x5090", "-w", "gpt2-medium", "--bucket-mb", "1,25",
              "--no-ranges"],
    "run --trace /dev/stdout": [*RUN, "--no-ranges", "--trace", "/dev/stdout"],
    "memory": ["memory", "-t", "8x5090-switch", "-w", "llama2-7b-lora"],
    "topo": ["topo", "-t", "8x5090-switch"],
    "presets": ["presets"],
    "schema": ["schema", "topology"],
    "help": ["run", "--help"],
    "version": ["--version"],
    "bad input --json": ["run", "-t", "no-such-box", "-w", "gpt2-medium", "--json"],
}


def _stepsim(argv: list[str], **kwargs: object) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "simulator", *argv], cwd=ROOT,
                            stderr=subprocess.PIPE, **kwargs)  # type: ignore[call-overload]


@pytest.mark.parametrize("name", list(COMMANDS))
def test_head_1_gets_status_0_and_an_empty_stderr_every_time(name: str) -> None:
    # the shell's `stepsim ... | head -1`: the reader takes one line and closes the pipe while
    # the command may still be writing; whichever way the race goes, the same answer
    outcomes = set()
    for _ in range(20):
        proc = _stepsim(COMMANDS[name], stdout=subprocess.PIPE)
        assert proc.stdout is not None and proc.stderr is not None
        first = proc.stdout.readline()
        proc.stdout.close()
        outcomes.add((proc.wait(timeout=60), proc.stderr.read().decode(), bool(first)))
        proc.stderr.close()
    assert outcomes == {(0, "", True)}


@pytest.mark.parametrize("name", [*COMMANDS, *MORE])
def test_a_reader_gone_before_the_first_byte_is_status_0_and_silence(name: str) -> None:
    # the race decided the hard way: nothing the command writes reaches anyone, every write
    # fails with EPIPE (rich's tables, print, JSON, CSV, a streamed trace, argparse's help)
    argv = {**COMMANDS, **MORE}[name]
    read, write = os.pipe()
    os.close(read)
    try:
        proc = _stepsim(argv, stdout=write)
    finally:
        os.close(write)
    _, err = proc.communicate(timeout=60)
    expected = 2 if name == "bad input --json" else 0  # the error line is the answer there
    assert (proc.returncode, err.decode().count("\n")) == (expected, expected // 2)
    assert "Traceback" not in err.decode()


def test_a_streamed_trace_whose_reader_leaves_leaves_the_other_files_whole(
        tmp_path: Path) -> None:
    gantt = tmp_path / "g.png"
    read, write = os.pipe()
    os.close(read)
    try:
        proc = _stepsim([*RUN, "--no-ranges", "--json", "--trace", "/dev/stdout", "--gantt",
                         str(gantt)], stdout=write)
    finally:
        os.close(write)
    _, err = proc.communicate(timeout=60)
    assert (proc.returncode, err.decode()) == (0, f"wrote {gantt}\n")
    assert gantt.read_bytes().startswith(b"\x89PNG") and list(tmp_path.iterdir()) == [gantt]


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
@pytest.mark.parametrize("name", [*COMMANDS, *MORE])
def test_a_full_stdout_is_one_line_and_a_nonzero_status(name: str) -> None:
    argv = {**COMMANDS, **MORE}[name]
    with open("/dev/full", "wb") as full:
        proc = _stepsim(argv, stdout=full)
        _, err = proc.communicate(timeout=60)
    lines = err.decode().splitlines()
    assert proc.returncode == 2 and "Traceback" not in err.decode()
    if name == "bad input --json":  # the error itself is the line; its JSON copy is lost
        assert len(lines) == 1 and "unknown topology" in lines[0]
    else:
        command = "stepsim" if name == "version" else f"stepsim {argv[0]}"
        assert lines == [f"{command}: error: cannot write "
                         f"{'/dev/stdout' if '/dev/stdout' in argv else 'the output'}: "
                         "No space left on device"]


def _shell(command: str) -> subprocess.CompletedProcess[str]:
    """`stepsim COMMAND` in bash (pipefail: a pipeline's status is stepsim's)."""
    return subprocess.run(["bash", "-o", "pipefail", "-c",
                           f"{sys.executable} -m simulator {command}"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)


def test_a_closed_stdout_is_one_line_and_no_file_takes_its_place(tmp_path: Path) -> None:
    # `>&-`: no stdout at all; the first file opened would get its descriptor
    trace = tmp_path / "t.json"
    done = _shell(f"run -t 2x5090 -w gpt2-medium --no-ranges --trace {trace} >&-")
    assert done.returncode == 2 and done.stderr.splitlines() == [
        f"wrote {trace}", "stepsim run: error: cannot write the output: Bad file descriptor"]
    assert json.loads(trace.read_text())["traceEvents"]  # the trace, and nothing else, in it


def test_a_closed_stderr_keeps_errors_off_stdout() -> None:
    done = _shell("run -t no-such-box -w gpt2-medium 2>&-")
    assert (done.returncode, done.stdout) == (2, "")
    done = _shell(f"{' '.join(RUN)} 2>&- | head -1")  # and a reader that leaves, on top
    assert (done.returncode, done.stdout.count("\n")) == (0, 1)
