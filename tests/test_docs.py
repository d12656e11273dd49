"""docs/inputs.md lists every key the input schema accepts, so the reference cannot drift."""

import re
from pathlib import Path

from pydantic import BaseModel

from simulator.inputs import schema

DOC = (Path(__file__).resolve().parent.parent / "docs" / "inputs.md").read_text()
DOCUMENTED = set(re.findall(r"`(\w+)`", DOC))


def _keys(model: type[BaseModel]) -> set[str]:
    return set(model.model_fields)


def test_every_schema_key_is_documented():
    models = [schema.TopologyConfig, schema.GpuSpec, schema.NodeConfig, schema.LinkConfig,
              schema.CalibrationConfig, schema.FittedValue, schema.UnfittedValue,
              schema.ComputeCalibration, schema.WorkloadConfig,
              schema.ModelConfig, schema.GenericLayer, schema.TrainingConfig, schema.LoraConfig]
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


def _bounds(model: type[BaseModel]) -> dict[str, object]:
    """Each field's upper bound (le or max_length) from the pydantic metadata."""
    out: dict[str, object] = {}
    for name, info in model.model_fields.items():
        for meta in info.metadata:
            for attr in ("le", "max_length"):
                if getattr(meta, attr, None) is not None:
                    out[name] = getattr(meta, attr)
    return out


def test_every_bound_is_in_the_limits_table():
    section = DOC.split("## Limits", 1)[1]
    rows = {line.split("|")[1]: line for line in section.splitlines() if line.startswith("| `")}
    models = [schema.TopologyConfig, schema.NodeConfig, schema.LinkConfig, schema.ModelConfig,
              schema.GenericLayer, schema.TrainingConfig, schema.LoraConfig, schema.WorkloadConfig]
    wrong = []
    for model in models:
        for key, bound in _bounds(model).items():
            whole = isinstance(bound, int) or (isinstance(bound, float) and bound.is_integer()
                                               and bound < 1e15)
            text = f"{int(bound):,}" if whole else f"{bound:g}"  # type: ignore[call-overload]
            if not any(f"`{key}`" in head and text in row for head, row in rows.items()):
                wrong.append(f"{model.__name__}.{key} <= {text}")
    assert not wrong, f"bounds missing from docs/inputs.md Limits: {wrong}"
