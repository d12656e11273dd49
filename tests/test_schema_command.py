"""`stepsim schema`: the JSON Schema editors validate YAML with, from the input models."""

from __future__ import annotations

import dataclasses
import json

import pytest
import yaml

from simulator.cli import main
from simulator.inputs.config import preset_dir
from simulator.inputs.schema import TopologyConfig, WorkloadConfig


@pytest.mark.parametrize(("kind", "model"), [("topology", TopologyConfig),
                                             ("workload", WorkloadConfig)])
def test_the_schema_is_the_models(kind: str, model: type, capsys: pytest.CaptureFixture[str]
                                  ) -> None:
    assert main(["schema", kind]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["title"] == f"stepsim {kind}" and doc["$schema"].endswith("2020-12/schema")
    assert set(doc["properties"]) == {f.name for f in dataclasses.fields(model)}
    assert doc["additionalProperties"] is False  # a misspelt key is an error in the editor too


@pytest.mark.parametrize("kind", ["topology", "workload"])
def test_every_preset_validates_and_a_wrong_type_does_not(
        kind: str, capsys: pytest.CaptureFixture[str]) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    assert main(["schema", kind]) == 0
    validator = jsonschema.Draft202012Validator(json.loads(capsys.readouterr().out))
    folder = preset_dir({"topology": "topologies", "workload": "workloads"}[kind])
    for path in sorted(folder.glob("*.yaml")):
        data = yaml.safe_load(path.read_text())
        assert not list(validator.iter_errors(data)), path.name
    assert list(validator.iter_errors({**data, "name": 7}))
