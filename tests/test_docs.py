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
