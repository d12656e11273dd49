"""docs/inputs.md lists every key the input schema accepts, so the reference cannot drift."""

import dataclasses
import re
from pathlib import Path
from typing import Any, get_args, get_type_hints

from simulator.inputs import schema

DOC = (Path(__file__).resolve().parent.parent / "docs" / "inputs.md").read_text()
DOCUMENTED = set(re.findall(r"`(\w+)`", DOC))


def _keys(model: type[schema.Frozen]) -> set[str]:
    return {f.name for f in dataclasses.fields(model)}


def test_every_schema_key_is_documented():
    models = [schema.TopologyConfig, schema.GpuSpec, schema.NodeConfig, schema.LinkConfig,
              schema.CalibrationConfig, schema.FittedValue, schema.UnfittedValue,
              schema.ComputeCalibration, schema.WorkloadConfig,
              schema.ModelConfig, schema.GenericLayer, schema.TrainingConfig, schema.LoraConfig,
              schema.MoeConfig, schema.MlaConfig, schema.VisionConfig, schema.UNetConfig]
    missing = {f"{m.__name__}.{k}" for m in models for k in _keys(m) if k not in DOCUMENTED}
    assert not missing, f"keys missing from docs/inputs.md: {sorted(missing)}"


def test_the_documented_example_topology_loads(tmp_path):
    from simulator.inputs.config import load_topology

    example = DOC.split("```yaml", 1)[1].split("```", 1)[0]
    path = tmp_path / "example.yaml"
    path.write_text(example)
    machine = load_topology(str(path))
    assert str(machine.gpu) == "rtx5090" and len(machine.nodes) == 3


def test_the_documented_example_workload_loads(tmp_path):
    from simulator.inputs.config import load_workload

    example = DOC.split("```yaml", 2)[2].split("```", 1)[0]
    path = tmp_path / "example.yaml"
    path.write_text(example)
    workload = load_workload(str(path))
    assert workload.model is not None and workload.model.layers == 32


def _bounds(model: type[schema.Frozen]) -> dict[str, object]:
    """Each field's upper bound (le or max_length), from the Bounds in its annotation."""
    def upper(tp: Any) -> object:
        for part in [getattr(tp, "__metadata__", ()), get_args(tp)]:
            for item in part:
                found = (item.bounds.get("le", item.bounds.get("max_length"))
                         if isinstance(item, schema.Bounds) else upper(item))
                if found is not None:
                    return found
        return None

    hints = get_type_hints(model, include_extras=True)
    out = {f.name: upper(hints[f.name]) for f in dataclasses.fields(model)}
    return {name: bound for name, bound in out.items() if bound is not None}


def test_every_bound_is_in_the_limits_table():
    section = DOC.split("## Limits", 1)[1]
    rows = {line.split("|")[1]: line for line in section.splitlines() if line.startswith("| `")}
    models = [schema.TopologyConfig, schema.NodeConfig, schema.LinkConfig, schema.ModelConfig,
              schema.GenericLayer, schema.TrainingConfig, schema.LoraConfig, schema.WorkloadConfig,
              schema.MoeConfig, schema.MlaConfig, schema.VisionConfig, schema.UNetConfig]
    wrong = []
    for model in models:
        for key, bound in _bounds(model).items():
            whole = isinstance(bound, int) or (isinstance(bound, float) and bound.is_integer()
                                               and bound < 1e15)
            text = f"{int(bound):,}" if whole else f"{bound:g}"  # type: ignore[call-overload]
            if not any(f"`{key}`" in head and text in row for head, row in rows.items()):
                wrong.append(f"{model.__name__}.{key} <= {text}")
    assert not wrong, f"bounds missing from docs/inputs.md Limits: {wrong}"
