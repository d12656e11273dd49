"""The bundled presets as `stepsim presets` lists them: a line of facts per machine and job.

Read from the YAML as written, without pydantic or the models: listing every preset is then a
few milliseconds instead of the models' import. This relies on the presets being valid, which
the test suite checks for every one (tests/test_presets_*.py); a preset that leaves a listed
key to its schema default, or gives its card with overrides, is loaded through the models
instead. The precision shown is the recipe's: the workload's own, else its framework's.
"""

from __future__ import annotations

from typing import Any

from simulator.inputs.config import load_topology, load_workload, preset_dir, preset_names
from simulator.inputs.loader import decode, load_yaml
from simulator.job import recipe

RECIPE_KEYS = ("finetune", "seq_len", "micro_batch", "precision")  # what a workload line shows
_GIVEN = ("finetune", "seq_len", "micro_batch")  # read as written (precision: from the recipe)


def _raw(kind: str, name: str) -> dict[str, Any]:
    path = preset_dir(kind) / f"{name}.yaml"
    data, _ = load_yaml(decode(path.read_bytes(), str(path)), str(path))
    return data if isinstance(data, dict) else {}


def topology(name: str) -> dict[str, Any]:
    """A bundled topology's name, GPU count, card and description."""
    raw = _raw("topologies", name)
    if isinstance(raw.get("gpu"), str) and isinstance(raw.get("nodes"), list):
        gpus = sum(1 for n in raw["nodes"] if isinstance(n, dict) and n.get("kind") == "gpu")
        return {"name": name, "gpus": gpus, "gpu": raw["gpu"],
                "description": str(raw.get("description", ""))}
    cfg = load_topology(name)  # a card with overrides: the model says how to print it
    return {"name": name, "gpus": sum(1 for n in cfg.nodes if n.kind == "gpu"),
            "gpu": str(cfg.gpu), "description": cfg.description}


def workload(name: str) -> dict[str, Any]:
    """A bundled workload's name, recipe keys (``RECIPE_KEYS``) and description."""
    raw = _raw("workloads", name)
    training = raw.get("training")
    if isinstance(training, dict) and all(k in training for k in _GIVEN):
        framework = training.get("framework", recipe.DEFAULT_FRAMEWORK)
        precision = training.get("precision", recipe.bundle(framework)["precision"])
        return {"name": name, **{k: training[k] for k in _GIVEN}, "precision": precision,
                "description": str(raw.get("description", ""))}
    w = load_workload(name)  # some key left to its schema default
    return {"name": name, **{k: getattr(w.training, k) for k in _GIVEN},
            "precision": recipe.resolve(w.training).precision, "description": w.description}


def topologies() -> list[dict[str, Any]]:
    return [topology(n) for n in preset_names("topologies")]


def workloads() -> list[dict[str, Any]]:
    return [workload(n) for n in preset_names("workloads")]
