"""Bundled presets as validated once: the checked models pickled in the user's cache folder.

A preset is the same file on every run, yet checking it loads pydantic and builds its
validators (the larger part of starting a run). So the first load of each preset stores the
model it validated, and later loads read that back, without parsing, validating or importing
pydantic (the models are plain dataclasses, simulator/inputs/schema.py).

What it assumes: an entry is keyed by the preset's bytes, the model's class, the source of
every module of ``simulator/inputs/`` (the models and every rule that shapes them live there)
and of the catalogs the checks consult (``catalog/``), the stepsim and Python versions, and
pydantic's ``version.py`` (it names the pydantic and
pydantic-core releases, and is read without importing them); so an edited preset, a changed
rule or catalog, or an upgrade reads as a miss, never as a stale model. The folder is
``$STEPSIM_CACHE_DIR``, else ``$XDG_CACHE_HOME/stepsim``, else ``~/.cache/stepsim`` (none
without a home folder). An entry is written whole or not at all (a temporary file renamed into
place); a folder that cannot be written, or an entry that cannot be read, only means the preset
is validated as if there were no cache. Only bundled presets are kept: a user's own file is
checked every time, so its errors and warnings are always shown. An entry is a pickle, trusted
as Python trusts its own ``__pycache__``: the folder is the user's, and whoever can write there
can already run code as them.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import pickle
import sys
from functools import cache
from pathlib import Path
from typing import TypeVar

import simulator
from simulator.inputs import schema

M = TypeVar("M", bound=schema.Frozen)


def folder() -> Path | None:
    """Where the entries live (see the module docstring); None: nowhere to keep them."""
    own = os.environ.get("STEPSIM_CACHE_DIR")
    if own:
        return Path(own)
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg:
        return Path(xdg) / "stepsim"
    home = Path(os.path.expanduser("~"))
    return home / ".cache" / "stepsim" if home.is_absolute() else None  # "~": no home


@cache
def _salt() -> bytes:
    """What every entry's key shares: the rules and the versions that read the models."""
    digest = hashlib.sha256(f"{simulator.__version__}|{sys.version}".encode())
    inputs = Path(schema.__file__).parent
    catalog = inputs.parent / "catalog"  # the names the schema checks against
    sources = [*sorted(inputs.glob("*.py")), *sorted(catalog.glob("*.py"))]
    pydantic = importlib.util.find_spec("pydantic")
    if pydantic is not None and pydantic.origin is not None:
        sources.append(Path(pydantic.origin).with_name("version.py"))
    for source in sources:
        digest.update(source.name.encode() + b"\0" + source.read_bytes())
    return digest.digest()


def _entry(text: bytes, model: type[schema.Frozen]) -> Path | None:
    where = folder()
    if where is None:
        return None
    key = hashlib.sha256(_salt() + model.__qualname__.encode() + b"\0" + text).hexdigest()
    return where / "presets" / f"{key[:32]}.pickle"


def get(text: bytes, model: type[M]) -> M | None:
    """The model validated from ``text`` before, or None."""
    path = _entry(text, model)
    if path is None:
        return None
    try:
        with path.open("rb") as f:
            value = pickle.load(f)
    except Exception:  # noqa: BLE001 - absent, unreadable or truncated: validate afresh
        return None
    return value if type(value) is model else None


def put(text: bytes, model: type[M], value: M) -> None:
    """Keep ``value`` as what ``text`` validates to; silently nothing where it cannot."""
    import tempfile  # only a miss writes

    path = _entry(text, model)
    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                pickle.dump(value, f, protocol=pickle.HIGHEST_PROTOCOL)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError:
        return
