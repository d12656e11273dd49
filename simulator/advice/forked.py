"""Independent calls on two cores: half of them in a child forked from this process.

The range re-runs (ranges.py) simulate the same step again at other rates, each on its own.
A forked child starts with every module and cache this process holds (a fresh interpreter
would import them all again, which costs as much as the re-runs), computes its share, and
sends the results back pickled through a pipe; this process computes the other share
meanwhile. Results are the same wherever a call runs: everything it reads was built before
the fork, and the simulation is deterministic.

Forking is safe only in a process that knows it holds no other thread and will not be forked
again by a pool: the `stepsim` program says so (``allow``, beside its ``gc.freeze``). A library
caller's process, a pool's worker (another pid), a machine of one core, or a platform whose
processes do not start by fork (anything but Linux) runs every call here, in order. A child
that fails for any reason changes nothing: its share is then run here too.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

_allowed_pid: int | None = None  # the process that may fork (not a process forked from it)


def allow() -> None:
    """This process is single-threaded and ends with its command: it may fork for its work."""
    global _allowed_pid
    _allowed_pid = os.getpid()


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))  # the cores this process may run on
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def may_fork() -> bool:
    return (_allowed_pid == os.getpid() and sys.platform == "linux"
            and threading.active_count() == 1 and _cores() >= 2)


def run_all(calls: Sequence[Callable[[], Any]]) -> list[Any]:
    """Each call's result, in the calls' order: every other call in a forked child where this
    process may fork (``may_fork``), else all of them here."""
    if len(calls) < 2 or not may_fork():
        return [call() for call in calls]
    theirs, mine = calls[0::2], calls[1::2]
    import pickle

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its share down the pipe, then out without any clean-up
        code = 1
        try:
            os.close(read)
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, 1)  # it computes; whatever it would print, this process prints
            os.dup2(null, 2)
            data = pickle.dumps([call() for call in theirs])
            with os.fdopen(write, "wb") as pipe:
                pipe.write(data)
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    try:
        here = [call() for call in mine]
    except BaseException:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(read)
        raise
    with os.fdopen(read, "rb") as pipe:
        data = pipe.read()
    _, status = os.waitpid(pid, 0)
    there = None
    if status == 0:
        try:
            there = pickle.loads(data)
        except Exception:  # a child cut short: its share is run here
            there = None
    if there is None:
        there = [call() for call in theirs]
    out: list[Any] = [None] * len(calls)
    out[0::2], out[1::2] = there, here
    return out
