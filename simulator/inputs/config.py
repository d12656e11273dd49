"""Load and validate the two input files: a topology (the machine) and a workload (the job).

A name without a path is a bundled preset (``topologies/NAME.yaml``, ``workloads/NAME.yaml``);
presets ship inside the wheel under ``simulator/_presets``. Validation errors name the file,
the line and the key, and are raised as :class:`simulator.errors.InputError`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from simulator.errors import InputError
from simulator.inputs.schema import TopologyConfig, WorkloadConfig

M = TypeVar("M", bound=BaseModel)

_PACKAGE_DIR = Path(__file__).resolve().parent.parent  # simulator/
_PRESET_ROOTS = (_PACKAGE_DIR / "_presets", _PACKAGE_DIR.parent)  # wheel, then source tree


class _Loader(yaml.SafeLoader):
    """SafeLoader that reads `1e9` as a number (YAML 1.1 would read it as a string)."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:\d[\d_]*(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?$"),
    list("-+0123456789."),
)
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:int", re.compile(r"^[-+]?\d[\d_]*$"), list("-+0123456789")
)


def preset_dir(kind: str) -> Path:
    """The folder holding bundled presets of one kind (``topologies`` or ``workloads``)."""
    for root in _PRESET_ROOTS:
        if (root / kind).is_dir():
            return root / kind
    raise InputError(f"no bundled {kind} found (broken installation?)")


def preset_names(kind: str) -> list[str]:
    return sorted(p.stem for p in preset_dir(kind).glob("*.yaml"))


def resolve(name_or_path: str, kind: str) -> Path:
    """A YAML path as given, or the bundled preset of that name; unknown names list the presets."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or path.exists():
        if path.is_dir():
            raise InputError(f"{name_or_path} is a directory; expected a YAML file")
        if not path.is_file():
            raise InputError(f"no such file: {name_or_path}")
        return path
    candidate = preset_dir(kind) / f"{name_or_path}.yaml"
    if candidate.is_file():
        return candidate
    names = ", ".join(preset_names(kind))
    singular = {"topologies": "topology", "workloads": "workload"}.get(kind, kind)
    raise InputError(f"unknown {singular} {name_or_path!r}; presets: {names} "
                     "(`stepsim presets` describes them)")


def load_topology(name_or_path: str) -> TopologyConfig:
    return _load(resolve(name_or_path, "topologies"), TopologyConfig)


def load_workload(name_or_path: str) -> WorkloadConfig:
    return _load(resolve(name_or_path, "workloads"), WorkloadConfig)


def _load(path: Path, model: type[M]) -> M:
    text = path.read_text(encoding="utf-8")
    try:
        node = yaml.compose(text, Loader=_Loader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark else None
        problem = getattr(exc, "problem", None) or str(exc)
        raise InputError(f"invalid YAML: {problem}", file=str(path), line=line) from None
    if node is None:
        raise InputError("the file is empty", file=str(path))
    lines: dict[tuple[Any, ...], int] = {}
    data = _construct(node, (), lines)
    try:
        obj = model.model_validate(data)
    except ValidationError as exc:
        err = _first_error(exc)
        loc = tuple(err["loc"])
        raise InputError(_explain(err), file=str(path), line=_line_for(loc, lines),
                         key=_key(loc)) from None
    for loc, message in getattr(obj, "reference_errors", list)():
        raise InputError(message, file=str(path), line=_line_for(loc, lines), key=_key(loc))
    return obj


def _construct(node: yaml.Node, loc: tuple[Any, ...], lines: dict[tuple[Any, ...], int]) -> Any:
    """Build plain Python data from a YAML node, remembering the line of every key path."""
    lines[loc] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        out: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            key = _Loader(" ").construct_object(key_node)  # type: ignore[no-untyped-call]
            lines[loc + (key,)] = key_node.start_mark.line + 1
            out[key] = _construct(value_node, loc + (key,), lines)
            lines[loc + (key,)] = key_node.start_mark.line + 1
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_construct(item, loc + (i,), lines) for i, item in enumerate(node.value)]
    return _Loader(" ").construct_object(node)  # type: ignore[no-untyped-call]


def _first_error(exc: ValidationError) -> Any:
    """The error to report: a misspelt key first, as it usually explains a missing one."""
    errors = exc.errors()
    return next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])


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


def _explain(err: Any) -> str:
    kind = err["type"]
    if kind == "extra_forbidden":
        return "unknown key (misspelt?)"
    if kind == "missing":
        return "required key is missing"
    msg = str(err["msg"]).removeprefix("Value error, ")
    value = err.get("input")
    if kind != "value_error" and not isinstance(value, dict | list):
        msg += f", got {value!r}"
    return msg
