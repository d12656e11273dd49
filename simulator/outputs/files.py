"""Writing output files all or nothing: a run either leaves every file it was asked for, or none.

Each file is rendered to a temporary file beside its target; only when all have rendered are
they renamed into place. Any failure removes the temporaries and is reported as one
:class:`InputError` line ("cannot write PATH: reason"), never a traceback.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path

from simulator.errors import InputError

Writer = Callable[[Path], object]  # renders one file at the path it is given (result unused)


def write_files(writers: Mapping[str | Path, Writer]) -> None:
    """Render every file, then move them all into place; on any failure leave none behind."""
    pending: list[tuple[Path, Path]] = []
    target = Path()
    try:
        for path, write in writers.items():
            target = Path(path)
            pending.append((_temporary(target), target))
            write(pending[-1][0])
        mode = 0o666 & ~_umask()  # mkstemp makes 0600; give the files the usual mode
        for tmp, target in pending:
            os.chmod(tmp, mode)
            os.replace(tmp, target)
    except OSError as exc:
        raise InputError(f"cannot write {target}: {exc.strerror or exc}") from None
    finally:
        for tmp, _ in pending:
            tmp.unlink(missing_ok=True)


def write_atomically(path: str | Path, write: Writer) -> None:
    write_files({path: write})


def _temporary(target: Path) -> Path:
    if target.is_dir():
        raise InputError(f"cannot write {target}: it is a directory")
    folder = target.parent
    if not folder.is_dir():
        raise InputError(f"cannot write {target}: no such folder {folder}")
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=target.suffix, dir=folder)
    os.close(fd)
    return Path(tmp)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
