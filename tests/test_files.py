"""Safe outputs: special files are streamed or refused, never replaced; links stay links;
a replaced file is there at every moment, old or new; several outputs are all or nothing,
with what was replaced put back.

Every special file here lives in a temporary folder: a FIFO, a symlink to this process's
stdout, a device node made with mknod (root only; never opened). No real device is touched.
"""

from __future__ import annotations

import gzip
import json
import os
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from simulator.cli import main
from simulator.errors import InputError
from simulator.outputs import files
from simulator.outputs.files import text_writer, write_files

RUN = ["run", "-t", "2x5090", "-w", "gpt2-medium", "--seq-len", "256"]


def test_a_symlinked_output_keeps_its_link(tmp_path: Path) -> None:
    target = tmp_path / "real.json"
    target.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(target.name)
    write_files({link: text_writer("new")}, announce=False)
    assert link.is_symlink() and target.read_text() == "new"


def test_a_dangling_symlink_creates_its_target(tmp_path: Path) -> None:
    link = tmp_path / "link.json"
    link.symlink_to("made.json")
    write_files({link: text_writer("x")}, announce=False)
    assert link.is_symlink() and (tmp_path / "made.json").read_text() == "x"


def test_a_replaced_file_keeps_its_permissions(tmp_path: Path) -> None:
    out = tmp_path / "t.json"
    out.write_text("old")
    out.chmod(0o600)
    write_files({out: text_writer("new")}, announce=False)
    assert stat.S_IMODE(out.stat().st_mode) == 0o600 and out.read_text() == "new"


def test_a_file_being_replaced_is_never_missing(tmp_path: Path) -> None:
    # a reader polls the outputs while `stepsim run` rewrites them again and again: one file
    # (perfetto) and several at once (kineto, one per rank: the old files are kept for a
    # roll-back); each time they must be there, old or new, with the mode they had
    one, ranks = tmp_path / "t.json", [tmp_path / "k.rank0.json", tmp_path / "k.rank1.json"]
    for path in (one, *ranks):
        path.write_text("old")
        path.chmod(0o640)
    seen = {"reads": 0, "missing": 0}
    stop = threading.Event()

    def poll() -> None:
        while not stop.is_set():
            for path in (one, *ranks):
                seen["reads"] += 1
                seen["missing"] += not os.path.exists(path)

    poller = threading.Thread(target=poll)
    poller.start()
    try:
        for trace, fmt in [(one, "perfetto"), (tmp_path / "k.json", "kineto")] * 3:
            subprocess.run([sys.executable, "-m", "simulator", *RUN, "--no-ranges", "--json",
                            "--trace", str(trace), "--trace-format", fmt],
                           stdout=subprocess.DEVNULL, timeout=120, check=True)
    finally:
        stop.set()
        poller.join()
    assert seen["reads"] > 1000 and seen["missing"] == 0
    for path in (one, *ranks):
        assert stat.S_IMODE(path.stat().st_mode) == 0o640 and "traceEvents" in path.read_text()
    assert sorted(tmp_path.iterdir()) == sorted([*ranks, one])  # no temporary left behind


def test_a_fifo_with_a_reader_is_streamed_not_replaced(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    for _ in range(100):  # wait for the reader to open its end
        time.sleep(0.01)
        try:
            write_files({fifo: text_writer("through the pipe")}, announce=False)
            break
        except InputError:
            continue
    reader.join(timeout=5)
    assert got == [b"through the pipe"] and stat.S_ISFIFO(fifo.stat().st_mode)


def test_a_fifo_nobody_reads_is_refused_at_once(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    started = time.perf_counter()
    with pytest.raises(InputError, match="a FIFO with no reader"):
        write_files({fifo: text_writer("x")}, announce=False)
    assert time.perf_counter() - started < 2 and stat.S_ISFIFO(fifo.stat().st_mode)


@pytest.mark.skipif(os.geteuid() != 0, reason="mknod needs root")
def test_a_device_node_is_refused_without_being_opened(tmp_path: Path) -> None:
    node = tmp_path / "disk"
    os.mknod(node, stat.S_IFBLK | 0o600, os.makedev(7, 0))  # a loop device's numbers
    zero = tmp_path / "zero"
    os.mknod(zero, stat.S_IFCHR | 0o600, os.makedev(1, 5))  # /dev/zero's numbers
    for path, words in ((node, "a block device"), (zero, "it is a device")):
        with pytest.raises(InputError, match=words):
            write_files({path: text_writer("x")}, announce=False)
    assert stat.S_ISBLK(node.lstat().st_mode) and stat.S_ISCHR(zero.lstat().st_mode)


def test_a_socket_is_refused(tmp_path: Path) -> None:
    import socket

    path = tmp_path / "s"
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(path))
        with pytest.raises(InputError, match="a socket"):
            write_files({path: text_writer("x")}, announce=False)


def test_trace_to_a_link_to_stdout_streams_into_the_redirected_file(tmp_path: Path) -> None:
    # `--trace /dev/stdout` with stdout redirected to a file: the file gets the trace and
    # stays the same file (today's /dev/stdout is a link to /proc/self/fd/1; a link of our
    # own stands for it, so the real /dev is never at stake)
    link = tmp_path / "stdout-link"
    link.symlink_to("/proc/self/fd/1")
    out = tmp_path / "captured.txt"
    with out.open("wb") as fd:
        before = os.fstat(fd.fileno()).st_ino
        done = subprocess.run([sys.executable, "-m", "simulator", *RUN, "--json",
                               "--trace", str(link)], stdout=fd, stderr=subprocess.PIPE,
                              timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert link.is_symlink() and out.stat().st_ino == before
    text = out.read_text()
    assert '"traceEvents"' in text and '"step_time_s"' in text


def test_a_dash_is_refused_not_written_as_a_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    assert main([*RUN, "--trace", "-"]) == 2
    err = capsys.readouterr().err
    assert "cannot write -:" in err and "/dev/stdout" in err and err.count("\n") == 1
    assert list(tmp_path.iterdir()) == []  # refused before any work, nothing written


def test_two_outputs_on_one_file_are_refused(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    link = tmp_path / "alias.png"
    link.symlink_to("same.png")
    for other in (tmp_path / "same.png", link):
        assert main([*RUN, "--gantt", str(tmp_path / "same.png"), "--memory-png",
                     str(other)]) == 2
        err = capsys.readouterr().err
        assert "two outputs would write the same file" in err and err.count("\n") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["alias.png"]


def test_a_failed_move_puts_back_what_was_replaced(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    first.write_text("old a")
    real_replace = os.replace

    def replace(src: os.PathLike[str] | str, dst: os.PathLike[str] | str) -> None:
        if Path(dst) == second:
            raise OSError(28, "No space left on device")
        real_replace(src, dst)

    monkeypatch.setattr(files.os, "replace", replace)
    with pytest.raises(InputError, match="cannot write .*b.json: No space left"):
        write_files({first: text_writer("new a"), second: text_writer("new b")},
                    announce=False)
    assert first.read_text() == "old a" and not second.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json"]


def test_without_hard_links_a_copy_of_the_old_file_is_put_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    first.write_text("old a")
    first.chmod(0o604)

    def no_link(src: object, dst: object) -> None:
        raise OSError(1, "Operation not permitted")  # FAT, some network file systems

    real_replace = os.replace

    def replace(src: os.PathLike[str] | str, dst: os.PathLike[str] | str) -> None:
        if Path(dst) == second:
            raise OSError(5, "Input/output error")
        real_replace(src, dst)

    monkeypatch.setattr(files.os, "link", no_link)
    monkeypatch.setattr(files.os, "replace", replace)
    with pytest.raises(InputError, match="cannot write .*b.json: Input/output error"):
        write_files({first: text_writer("new a"), second: text_writer("new b")},
                    announce=False)
    assert first.read_text() == "old a" and stat.S_IMODE(first.stat().st_mode) == 0o604
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json"]


def test_json_gz_is_gzip_and_deterministic(tmp_path: Path) -> None:
    out = tmp_path / "step.json.gz"
    assert main([*RUN, "--trace", str(out)]) == 0
    first = out.read_bytes()
    assert first[:2] == b"\x1f\x8b" and "traceEvents" in json.loads(gzip.decompress(first))
    assert main([*RUN, "--trace", str(out)]) == 0
    assert out.read_bytes() == first


def test_every_written_path_is_named_on_stderr(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    trace, gantt = tmp_path / "t.json", tmp_path / "g.png"
    assert main([*RUN, "--json", "--trace", str(trace), "--gantt", str(gantt)]) == 0
    out, err = capsys.readouterr()
    assert err.splitlines() == [f"wrote {trace}", f"wrote {gantt}"]
    json.loads(out)  # stdout stays pure JSON
