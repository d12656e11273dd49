"""Load and validate the two input files: a topology (the machine) and a workload (the job).

A name without a path is a bundled preset (``topologies/NAME.yaml``, ``workloads/NAME.yaml``);
presets ship inside the wheel under ``simulator/_presets``. Validation errors name the file,
the line and the key, and are raised as :class:`simulator.errors.InputError`.
"""

from __future__ import annotations

import contextlib
import errno
import stat
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from simulator.errors import PATH_CHARS, InputError, cut, quoted
from simulator.inputs.bundled import preset_dir, preset_names
from simulator.inputs.model_errors import explain, first_error

if TYPE_CHECKING:  # pydantic loads with the first file checked, not before (never for a
    # preset read back from the cache)

    from simulator.inputs.loader import Loc
    from simulator.inputs.schema import Frozen, TopologyConfig, WorkloadConfig

M = TypeVar("M", bound="Frozen")


def is_hf_config(name: str) -> bool:
    """Whether a workload names a Hugging Face (or diffusers) config rather than a workload
    YAML: ``hf:PATH``, a ``.json`` file, or a folder holding ``config.json`` (as
    ``from_pretrained`` takes a model's folder)."""
    if name.startswith("hf:"):
        return True
    path = Path(name)
    with contextlib.suppress(OSError, ValueError):  # no path at all: not one either
        return (path.suffix == ".json" and path.is_file()) or (path / "config.json").is_file()
    return False


def resolve(name_or_path: str, kind: str) -> Path:
    """A YAML path as given, or the bundled preset of that name; unknown names list the presets.
    A workload that is a Hugging Face config (is_hf_config) is the config.json it names."""
    if kind == "workloads" and is_hf_config(name_or_path):
        from simulator.inputs import hf_config

        return hf_config.config_path(name_or_path)
    path = Path(name_or_path)
    shown = cut(name_or_path, PATH_CHARS)
    try:
        mode: int | None = path.stat().st_mode
    except OSError as exc:  # absent, or no path at all (a name longer than a path may be)
        mode, problem = None, exc
    if path.suffix in (".yaml", ".yml") or mode is not None:
        if mode is None:
            if problem.errno == errno.ENOENT:
                raise InputError(f"no such file: {shown}")
            raise InputError(f"cannot read the file: {problem.strerror or problem}",
                             file=name_or_path)
        if stat.S_ISDIR(mode):
            also = " or a folder holding a config.json" if kind == "workloads" else ""
            raise InputError(f"{shown} is a directory; expected a YAML file{also}")
        if not stat.S_ISREG(mode):  # a FIFO or a device would block or never end
            raise InputError(f"{shown} is not a regular file; expected a YAML file")
        return path
    candidate = preset_dir(kind) / f"{name_or_path}.yaml"
    with contextlib.suppress(OSError):  # a name too long for a file is no preset either
        if candidate.is_file():
            return candidate
    from simulator.errors import did_you_mean

    names = ", ".join(preset_names(kind))
    singular = {"topologies": "topology", "workloads": "workload"}.get(kind, kind)
    if kind == "workloads" and name_or_path.count("/") == 1 and "." not in name_or_path[:1]:
        # a Hugging Face Hub id (org/model): stepsim reads no network, only the model's config
        raise InputError(f"unknown workload {quoted(name_or_path)}: a Hugging Face model is read "
                         "from its config.json (`huggingface-cli download "
                         f"{cut(name_or_path, PATH_CHARS)} config.json --local-dir DIR`, then "
                         "-w DIR)")
    raise InputError(f"unknown {singular} {quoted(name_or_path)}"
                     f"{did_you_mean(name_or_path, preset_names(kind))}; presets: {names} "
                     "(`stepsim presets` describes them)")


def load_topology(name_or_path: str) -> TopologyConfig:
    from simulator.inputs.schema import TopologyConfig

    return _load(resolve(name_or_path, "topologies"), TopologyConfig, "topologies")


def load_workload(name_or_path: str) -> WorkloadConfig:
    """A workload YAML or preset, or a Hugging Face config.json (is_hf_config; hf_config.py)."""
    from simulator.inputs.schema import WorkloadConfig

    if is_hf_config(name_or_path):
        from simulator.inputs import hf_config

        return hf_config.load(name_or_path)
    return _load(resolve(name_or_path, "workloads"), WorkloadConfig, "workloads")


def _load(path: Path, model: type[M], kind: str) -> M:
    file = str(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise InputError(f"cannot read the file: {exc.strerror or exc}", file=file) from None
    bundled = path.resolve().parent == preset_dir(kind).resolve()
    if bundled:  # checked once, then read back (preset_cache.py)
        from simulator.inputs import preset_cache

        known = preset_cache.get(data, model)
        if known is not None:
            return known
    from simulator.inputs.loader import decode, load_yaml  # YAML loads only if it is read

    value, lines = load_yaml(decode(data, file), file)
    obj = validate(value, lines, model, file)
    if bundled:
        preset_cache.put(data, model, obj)
    return obj


def validate(data: Any, lines: dict[Loc, int], model: type[M], file: str) -> M:
    """``data`` as ``model``, or the first problem as one line naming file, line and key."""
    from pydantic import ValidationError

    if data is None:
        raise InputError("the file is empty", file=file)
    if not isinstance(data, dict):
        raise InputError(f"expected keys (`name: ...`) at the top level, got "
                         f"{type(data).__name__}", file=file, line=lines.get(()))
    try:
        obj = model.from_data(data)
    except ValidationError as exc:
        err = first_error(exc)
        loc = tuple(err["loc"])
        raise InputError(explain(err), file=file, line=_line_for(loc, lines),
                         key=_key(loc)) from None
    for loc, message in getattr(obj, "reference_errors", list)():
        raise InputError(message, file=file, line=_line_for(loc, lines), key=_key(loc))
    return obj


def key_line(path: Path, key: str) -> int | None:
    """The line of a dotted key (``training.attention``) in a YAML file, or of its nearest
    enclosing key; None where the file cannot be read as YAML (a config.json)."""
    if path.suffix not in (".yaml", ".yml"):
        return None
    from simulator.inputs.loader import decode, load_yaml

    try:
        _, lines = load_yaml(decode(path.read_bytes(), str(path)), str(path))
    except (InputError, OSError):
        return None
    return _line_for(tuple(key.split(".")), lines)


def _line_for(loc: tuple[Any, ...], lines: dict[tuple[Any, ...], int]) -> int | None:
    while loc:
        if loc in lines:
            return lines[loc]
        loc = loc[:-1]
    return lines.get(())


def _key(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not str(part).startswith(("function-", "tagged-union")):
            out += ("." if out else "") + str(part)
    return out or "(top level)"
