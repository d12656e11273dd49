"""Load and validate the two input files: a topology (the machine) and a workload (the job).

A name without a path is a bundled preset (``topologies/NAME.yaml``, ``workloads/NAME.yaml``);
presets ship inside the wheel under ``simulator/_presets``. Validation errors name the file,
the line and the key, and are raised as :class:`simulator.errors.InputError`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from simulator.errors import InputError
from simulator.inputs.bundled import preset_dir, preset_names

if TYPE_CHECKING:  # pydantic loads with the first file checked, not before (never for a
    # preset read back from the cache)
    from pydantic import ValidationError

    from simulator.inputs.loader import Loc
    from simulator.inputs.schema import Frozen, TopologyConfig, WorkloadConfig

M = TypeVar("M", bound="Frozen")


def resolve(name_or_path: str, kind: str) -> Path:
    """A YAML path as given, or the bundled preset of that name; unknown names list the presets.
    A workload ``hf:PATH`` is the Hugging Face config.json it names."""
    if kind == "workloads" and name_or_path.startswith("hf:"):
        from simulator.inputs import hf_config

        return hf_config.config_path(name_or_path)
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or path.exists():
        if path.is_dir():
            raise InputError(f"{name_or_path} is a directory; expected a YAML file")
        if not path.exists():
            raise InputError(f"no such file: {name_or_path}")
        if not path.is_file():  # a FIFO or a device would block or never end
            raise InputError(f"{name_or_path} is not a regular file; expected a YAML file")
        return path
    candidate = preset_dir(kind) / f"{name_or_path}.yaml"
    if candidate.is_file():
        return candidate
    from simulator.errors import did_you_mean

    names = ", ".join(preset_names(kind))
    singular = {"topologies": "topology", "workloads": "workload"}.get(kind, kind)
    raise InputError(f"unknown {singular} {name_or_path!r}"
                     f"{did_you_mean(name_or_path, preset_names(kind))}; presets: {names} "
                     "(`stepsim presets` describes them)")


def load_topology(name_or_path: str) -> TopologyConfig:
    from simulator.inputs.schema import TopologyConfig

    return _load(resolve(name_or_path, "topologies"), TopologyConfig, "topologies")


def load_workload(name_or_path: str) -> WorkloadConfig:
    """A workload YAML or preset, or ``hf:PATH``: a Hugging Face config.json (hf_config.py)."""
    from simulator.inputs.schema import WorkloadConfig

    if name_or_path.startswith("hf:"):
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
        err = _first_error(exc)
        loc = tuple(err["loc"])
        raise InputError(explain(err), file=file, line=_line_for(loc, lines),
                         key=_key(loc)) from None
    for loc, message in getattr(obj, "reference_errors", list)():
        raise InputError(message, file=file, line=_line_for(loc, lines), key=_key(loc))
    return obj


def _first_error(exc: ValidationError) -> Any:
    """The error to report: a misspelt key first, as it usually explains a missing one."""
    errors = exc.errors()
    return next((e for e in errors if e["type"] == _UNKNOWN_KEY), errors[0])


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


def explain(err: Any) -> str:
    """A pydantic error (one of ``exc.errors()``) as the one-line message users read."""
    kind = err["type"]
    if kind == _UNKNOWN_KEY:
        return "unknown key (misspelt?)"
    if kind == "missing":
        return "required key is missing"
    if kind == "int_parsing_size":
        return f"{err.get('input')!r:.40} is too large a number (docs/inputs.md: Limits)"
    msg = str(err["msg"]).removeprefix("Value error, ")
    if kind == "dataclass_type":  # a scalar or a list where a mapping of keys belongs
        msg = f"Input should be a valid dictionary or instance of {err['ctx']['class_name']}"
    value = err.get("input")
    bound = _BOUNDS.get(kind)
    if bound is not None:
        limit = err["ctx"][bound[0]]
        msg = bound[1].format(f"{limit:,}" if isinstance(limit, int) else f"{limit:g}")
    if kind != "value_error" and not isinstance(value, dict | list):
        text = repr(value)
        msg += f", got {text if len(text) <= 60 else text[:57] + '...'}"
        if isinstance(value, str) and _YAML11.fullmatch(value) and kind.startswith(
                ("int", "float")):
            msg += " (YAML 1.1 read this as a boolean or a base-60 number; here it is text)"
    if bound is not None:
        msg += " (docs/inputs.md: Limits)"
    return msg


_UNKNOWN_KEY = "unexpected_keyword_argument"  # pydantic's error for a key a dataclass lacks
_BOUNDS = {"less_than_equal": ("le", "must be at most {}"),
           "greater_than_equal": ("ge", "must be at least {}"),
           "too_long": ("max_length", "at most {} entries")}
_YAML11 = re.compile(r"(?i:y|yes|n|no|on|off)|[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+(?:\.[0-9_]*)?")
