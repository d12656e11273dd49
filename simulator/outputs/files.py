"""Writing output files safely, all or nothing: a run leaves every file it was asked for, or
none of them changed.

What is inside: ``write_files({path: writer})``. Each writer renders its file at a temporary
path beside the target (the temporary keeps the target's suffix, so ``.png`` and ``.gz``
writers know their format); only when every file has rendered are they moved into place, each
by one ``os.replace`` of the complete temporary over the target: a reader sees the old file or
the new one, never neither. When several files are written, a target that existed keeps a
second name (a hard link, else a copy) until all are in place, and is put back over the new
file by the same one-step rename if a later one fails, so a failure part-way leaves the folder
as it was. ``text_writer`` writes text, gzipped for ``*.gz``.

What a path may be, and what happens:
- a regular file, or a path that does not exist yet in an existing folder: replaced by rename
  (its permissions kept; a new file gets the usual mode, 0666 less the umask);
- a symlink: the file it points to is written, so the link stays a link;
- this process's own stdout or stderr (``/dev/stdout``, ``/dev/fd/1``, or a file the shell
  redirected them to), a FIFO with a reader, a terminal, ``/dev/null``: streamed, never
  replaced; nothing else of a run depends on a stream, so streams are written last, and a
  stream whose reader leaves early (`--trace /dev/stdout | head`) fails nothing: the files
  stay, and for stdout or stderr the ``BrokenPipeError`` goes on to the CLI, which ends
  quietly;
- a directory, a socket, a block device or any other character device, and ``-``: refused.
Two outputs naming one file are refused. Every problem is one :class:`InputError` line
("cannot write PATH: reason"), never a traceback.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from simulator.errors import PATH_CHARS, InputError, cut

Writer = Callable[[Path], object]  # renders one file at the path it is given (result unused)


def text_writer(text: str) -> Writer:
    """A writer of ``text`` as UTF-8, gzipped when the target ends in ``.gz``."""
    def write(path: Path) -> None:
        data = text.encode("utf-8")
        if path.suffix == ".gz":
            import gzip  # imported for a gzipped file only

            data = gzip.compress(data, mtime=0)  # mtime 0: the same run gives the same bytes
        path.write_bytes(data)
    return write


@dataclass
class _Target:
    """One output path and where its bytes are in the all-or-nothing write."""

    given: str  # as the user wrote it, for messages
    path: Path  # where the bytes go (a symlink's target)
    stream: bool  # written in place (stdout, FIFO, terminal, /dev/null), never renamed
    left: bool = False  # a stream whose reader left before the end
    tmp: Path | None = None
    backup: Path | None = None  # a second name of the file it replaced, while others move
    moved: bool = False
    created: bool = False  # no file was there before


def write_files(writers: Mapping[str | Path, Writer] | Sequence[tuple[str | Path, Writer]], *,
                announce: bool = True) -> list[str]:
    """Render every file, then put them all in place; on any failure change none of them.

    ``writers``: path -> writer, or (path, writer) pairs (so that two flags naming one file
    are seen, and refused). Returns the paths written, as given; with ``announce`` each is
    named on stderr ("wrote PATH"), so a command's stdout stays its own (JSON, CSV).
    """
    pairs = list(writers.items()) if isinstance(writers, Mapping) else list(writers)
    targets = [_classify(str(p)) for p, _ in pairs]
    _refuse_duplicates(targets)
    current = targets[0] if targets else None
    left: BrokenPipeError | None = None
    try:
        for current, (_, write) in zip(targets, pairs, strict=True):
            current.tmp = _temporary(current)
            write(current.tmp)
        undoable = len(targets) > 1  # a later file may fail: keep what each replaces
        for current in targets:
            if not current.stream:
                _move_into_place(current, keep_old=undoable)
        for current in targets:
            if current.stream:
                try:
                    _stream(current)
                except BrokenPipeError as exc:  # its reader left: it had what it wanted
                    current.left = True
                    if _same_as_std_stream(current.path):  # ... the command's reader too
                        left = exc
    except OSError as exc:
        _roll_back(targets)
        assert current is not None
        raise InputError(f"cannot write {cut(current.given, PATH_CHARS)}: "
                         f"{_reason(exc)}") from None
    except BaseException:
        _roll_back(targets)
        raise
    finally:
        for t in targets:
            for leftover in (t.tmp, t.backup):
                if leftover is not None:
                    leftover.unlink(missing_ok=True)
    written = [t.given for t in targets if not t.left]
    if announce:
        for name in written:
            print(f"wrote {name}", file=sys.stderr)
    if left is not None:  # the files are in place; the CLI ends quietly (cli.py)
        raise left
    return written


def check_outputs(paths: Sequence[str | Path | None]) -> None:
    """Refuse now what ``write_files`` would refuse later (unset paths are skipped)."""
    _refuse_duplicates([_classify(str(p)) for p in paths if p])


def write_atomically(path: str | Path, write: Writer, *, announce: bool = True) -> None:
    write_files({path: write}, announce=announce)


# --- what a path is ---------------------------------------------------------------------------

def _classify(given: str) -> _Target:
    """Where ``given`` leads and how to write it; refuses what must not be written."""
    def refuse(why: str) -> InputError:
        return InputError(f"cannot write {cut(given, PATH_CHARS)}: {why}")

    if given == "-":  # many tools' "stdout"; here it would silently be a file named "-"
        raise refuse("`-` is not a file name stepsim takes; give a path, or /dev/stdout to "
                     "stream it")
    path = Path(given)
    if _same_as_std_stream(path):
        return _Target(given, path, stream=True)
    try:
        real = Path(os.path.realpath(path)) if path.is_symlink() else path  # the link's file
        info = os.stat(real)
    except FileNotFoundError:
        folder = real.parent
        if not folder.is_dir():
            raise refuse(f"no such folder {cut(folder, PATH_CHARS)}") from None
        return _Target(given, real, stream=False)
    except OSError as exc:
        raise refuse(_reason(exc)) from None
    mode = info.st_mode
    if stat.S_ISREG(mode):
        return _Target(given, real, stream=False)
    if stat.S_ISDIR(mode):
        raise refuse("it is a directory")
    if stat.S_ISFIFO(mode):
        return _Target(given, real, stream=True)
    if stat.S_ISCHR(mode) and _harmless_device(info):
        return _Target(given, real, stream=True)
    kind = "a block device" if stat.S_ISBLK(mode) else "a socket" if stat.S_ISSOCK(mode) \
        else "a device"
    raise refuse(f"it is {kind}; give the path of a regular file")


def _same_as_std_stream(path: Path) -> bool:
    """Whether ``path`` is this process's stdout or stderr (however the shell set them up)."""
    try:
        info = os.stat(path)
    except OSError:
        return False
    for fd in (1, 2):
        with contextlib.suppress(OSError):
            if os.path.samestat(info, os.fstat(fd)):
                return True
    return False


def _harmless_device(info: os.stat_result) -> bool:
    """A terminal or /dev/null: devices that only take bytes. Judged from stat alone:
    opening an unknown device can already act (a watchdog starts, a tape rewinds)."""
    safe: set[int] = set()
    for name in ("/dev/null", "/dev/tty"):
        with contextlib.suppress(OSError):
            safe.add(os.stat(name).st_rdev)
    return info.st_rdev in safe


def _refuse_duplicates(targets: list[_Target]) -> None:
    seen: dict[str, str] = {}
    for t in targets:
        key = os.path.realpath(t.path)
        if key in seen:
            raise InputError("two outputs would write the same file: "
                             f"{cut(seen[key], PATH_CHARS)} and {cut(t.given, PATH_CHARS)}")
        seen[key] = t.given


# --- writing ----------------------------------------------------------------------------------

def _temporary(t: _Target) -> Path:
    import tempfile  # only a run that writes a file needs it

    folder = t.path.parent if not t.stream else Path(tempfile.gettempdir())
    fd, tmp = tempfile.mkstemp(prefix=f".{t.path.name}.", suffix=t.path.suffix, dir=folder)
    os.close(fd)
    return Path(tmp)


def _move_into_place(t: _Target, *, keep_old: bool) -> None:
    """The rendered file over the target in one rename: the old file stays where it is until
    then. ``keep_old``: the old file keeps a second name, for ``_roll_back``."""
    assert t.tmp is not None
    try:
        mode = stat.S_IMODE(os.stat(t.path).st_mode)  # keep the replaced file's permissions
    except FileNotFoundError:
        mode = 0o666 & ~_umask()  # mkstemp makes 0600; give new files the usual mode
        t.created = True
    else:
        if keep_old:
            t.backup = _second_name(t.path)
    os.chmod(t.tmp, mode)
    os.replace(t.tmp, t.path)
    t.tmp, t.moved = None, True


def _second_name(path: Path) -> Path:
    """Another name in ``path``'s folder for the file at ``path``, which stays in place: a hard
    link, or a copy where the file system has none."""
    import secrets

    for _ in range(100):
        name = path.with_name(f".{path.name}.{secrets.token_hex(4)}.old")
        try:
            os.link(path, name)
            return name
        except FileExistsError:
            continue
        except OSError:  # no hard links here (FAT, some network file systems)
            break
    import shutil
    import tempfile

    fd, copy = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".old", dir=path.parent)
    os.close(fd)
    try:
        shutil.copy2(path, copy)
    except BaseException:
        os.unlink(copy)
        raise
    return Path(copy)


def _stream(t: _Target) -> None:
    import shutil  # only a file written to a stream or a FIFO needs it

    assert t.tmp is not None
    if _same_as_std_stream(t.path):
        out = sys.stdout if os.path.samestat(os.stat(t.path), os.fstat(1)) else sys.stderr
        out.flush()
        with open(t.tmp, "rb") as src:
            shutil.copyfileobj(src, out.buffer)
        out.flush()
        return
    flags = os.O_WRONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0)
    try:
        fd = os.open(t.path, flags)  # non-blocking: a FIFO nobody reads fails now, not hangs
    except OSError as exc:
        if exc.errno == errno.ENXIO:
            raise OSError(errno.ENXIO, "a FIFO with no reader") from None
        raise
    os.set_blocking(fd, True)
    with os.fdopen(fd, "wb") as dst, open(t.tmp, "rb") as src:
        shutil.copyfileobj(src, dst)


def _roll_back(targets: list[_Target]) -> None:
    """Put back what was replaced and remove what was created (best effort)."""
    for t in targets:
        if not t.moved:
            continue
        with contextlib.suppress(OSError):
            if t.backup is not None:  # the old file back in one step, as it went
                os.replace(t.backup, t.path)
                t.backup = None
            elif t.created:
                t.path.unlink()


def _reason(exc: OSError) -> str:
    return exc.strerror or str(exc)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
