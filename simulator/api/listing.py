"""The bundled presets as `stepsim presets` lists them: a line of facts per machine and job.

Each preset folder keeps an index of those facts (``index.json``, written by
``python scripts/presets_index.py``) with a CRC-32 of every file it was read from: listing
the presets is then a JSON read and a checksum per file, with neither YAML nor pydantic
imported. A file added, edited or missing from the index is read from its YAML instead, so
the listing is never stale; tests/test_presets_index.py keeps the index current so that the
fast path is the one taken.

Reading the YAML takes it as written, without pydantic or the models; this relies on the
presets being valid, which the test suite checks for every one (tests/test_presets_*.py). A
preset that leaves a listed key to its schema default, or gives its card with overrides, is
loaded through the models instead. The precision shown is the recipe's: the workload's own,
else its framework's.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterator
from typing import Any

from simulator.inputs.bundled import preset_dir, preset_names

RECIPE_KEYS = ("finetune", "seq_len", "micro_batch", "precision")  # what a workload line shows
_GIVEN = ("finetune", "seq_len", "micro_batch")  # read as written (precision: from the recipe)
INDEX = "index.json"
KINDS = ("topologies", "workloads")


def _raw(text: bytes, path: str) -> dict[str, Any]:
    from simulator.inputs.loader import decode, load_yaml

    data, _ = load_yaml(decode(text, path), path)
    return data if isinstance(data, dict) else {}


def topology(name: str, text: bytes) -> dict[str, Any]:
    """A bundled topology's name, GPU count (of all its boxes), card and description
    (``text``: its file)."""
    raw = _raw(text, str(preset_dir("topologies") / f"{name}.yaml"))
    boxes = raw.get("nnodes", 1) if isinstance(raw.get("nnodes", 1), int) else 1
    if isinstance(raw.get("gpu"), str) and isinstance(raw.get("nodes"), list):
        gpus = sum(1 for n in raw["nodes"] if isinstance(n, dict) and n.get("kind") == "gpu")
        return {"name": name, "gpus": gpus * boxes, "gpu": raw["gpu"],
                "description": str(raw.get("description", ""))}
    from simulator.inputs.config import load_topology

    cfg = load_topology(name)  # a card with overrides: the model says how to print it
    return {"name": name, "gpus": sum(1 for n in cfg.nodes if n.kind == "gpu") * cfg.nnodes,
            "gpu": str(cfg.gpu), "description": cfg.description}


def workload(name: str, text: bytes) -> dict[str, Any]:
    """A bundled workload's name, recipe keys (``RECIPE_KEYS``) and description (``text``:
    its file)."""
    from simulator.job import recipe

    raw = _raw(text, str(preset_dir("workloads") / f"{name}.yaml"))
    training = raw.get("training")
    if isinstance(training, dict) and all(k in training for k in _GIVEN):
        framework = training.get("framework", recipe.DEFAULT_FRAMEWORK)
        precision = training.get("precision", recipe.bundle(framework)["precision"])
        return {"name": name, **{k: training[k] for k in _GIVEN}, "precision": precision,
                "description": str(raw.get("description", ""))}
    from simulator.inputs.config import load_workload

    w = load_workload(name)  # some key left to its schema default
    return {"name": name, **{k: getattr(w.training, k) for k in _GIVEN},
            "precision": recipe.resolve(w.training).precision, "description": w.description}


def _stored(kind: str) -> dict[str, dict[str, Any]]:
    """The folder's index by preset name; empty when it is absent or unreadable."""
    try:
        entries = json.loads((preset_dir(kind) / INDEX).read_text(encoding="utf-8"))
        return {e["name"]: e for e in entries}
    except (OSError, ValueError, TypeError, KeyError):
        return {}


def _files(kind: str) -> Iterator[tuple[str, bytes, int]]:
    """(name, bytes, CRC-32) of every bundled preset file of ``kind``, by name."""
    for name in preset_names(kind):
        text = (preset_dir(kind) / f"{name}.yaml").read_bytes()
        yield name, text, zlib.crc32(text)


def listing(kind: str) -> list[dict[str, Any]]:
    """Every bundled preset of ``kind``, by name: from the index where a file's checksum
    matches it, from the file itself otherwise."""
    read = topology if kind == "topologies" else workload
    stored = _stored(kind)
    return [{k: v for k, v in stored[name].items() if k != "crc32"}
            if name in stored and stored[name].get("crc32") == crc else read(name, text)
            for name, text, crc in _files(kind)]


def index(kind: str) -> list[dict[str, Any]]:
    """What ``index.json`` of ``kind`` holds: each preset's facts read from its YAML, with the
    file's CRC-32."""
    read = topology if kind == "topologies" else workload
    return [{**read(name, text), "crc32": crc} for name, text, crc in _files(kind)]


def topologies() -> list[dict[str, Any]]:
    return listing("topologies")


def workloads() -> list[dict[str, Any]]:
    return listing("workloads")
