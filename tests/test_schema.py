"""The input models (simulator/inputs/schema.py): plain frozen dataclasses that pydantic checks.

What pydantic's own models did for free is checked here: every numeric key refuses a boolean,
the keys a file gave are remembered (framework bundles fill in only the others), copies and
the preset cache keep them, and a preset read back needs no pydantic at all.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from typing import Any, get_args, get_type_hints

import pytest
from pydantic import ValidationError

from simulator.inputs import schema
from simulator.inputs.schema import TrainingConfig, WorkloadConfig

MODELS = [schema.GpuSpec, schema.NodeConfig, schema.LinkConfig, schema.FittedValue,
          schema.UnfittedValue, schema.ComputeCalibration, schema.CalibrationConfig,
          schema.TopologyConfig, schema.ModelConfig, schema.GenericLayer, schema.LoraConfig,
          schema.TrainingConfig, schema.WorkloadConfig, schema.MoeConfig, schema.MlaConfig,
          schema.VisionConfig, schema.UNetConfig]


def _leaves(tp: Any) -> set[Any]:
    """The plain types inside an annotation (``int | None`` -> {int, NoneType})."""
    args = [a for a in get_args(tp) if isinstance(a, type) or get_args(a)]
    return set().union(*map(_leaves, args)) if args else {tp}


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
def test_every_numeric_key_refuses_a_boolean(model: type[schema.Frozen]) -> None:
    hints = get_type_hints(model, include_extras=True)
    for f in dataclasses.fields(model):
        tp = hints[f.name]
        numeric = bool(_leaves(tp) & {int, float}) and bool not in _leaves(tp)
        marked = getattr(tp, "__metadata__", ())[-1:] == (schema.NUMBER,)
        assert numeric == marked, f"{model.__name__}.{f.name}: numeric {numeric}, marked {marked}"


def test_a_boolean_is_not_a_number_even_where_none_is_allowed() -> None:
    with pytest.raises(ValidationError, match="expected a number, got true"):
        TrainingConfig.from_data({"seq_len": True})
    with pytest.raises(ValidationError, match="expected a number, got false"):
        schema.LinkConfig.from_data({"a": "x", "b": "y", "kind": "pcie", "lanes": False})
    assert schema.LinkConfig.from_data({"a": "x", "b": "y", "kind": "pcie"}).lanes is None


def test_the_keys_a_file_gives_are_remembered_and_copies_add_theirs() -> None:
    training = TrainingConfig.from_data({"seq_len": 512, "framework": "torchtune"})
    assert training.given == {"seq_len", "framework"}
    assert TrainingConfig(seq_len=512, kernels="eager").given == {"seq_len", "kernels"}
    changed = training.copy(kernels="compiled")
    assert changed.given == {"seq_len", "framework", "kernels"}
    assert changed.kernels == "compiled" and training.kernels == "eager"
    workload = WorkloadConfig.from_data({"name": "w", "training": {"seq_len": 8},
                                         "model": {"family": "gpt2", "layers": 1, "hidden": 8,
                                                   "heads": 2, "vocab": 16}})
    assert workload.with_training(precision="fp32").training.given == {"seq_len", "precision"}


def test_what_is_given_does_not_make_two_models_differ() -> None:
    given = TrainingConfig.from_data({"seq_len": 8, "kernels": "eager"})
    assert given == TrainingConfig(seq_len=8) and given.given != {"seq_len"}


def test_a_gpu_name_is_the_catalog_entry_wherever_a_gpu_appears() -> None:
    top = schema.TopologyConfig.from_data({
        "name": "t", "gpu": "rtx5090",
        "nodes": [{"id": "g0", "kind": "gpu", "gpu": "rtx4090"}, {"id": "c", "kind": "cpu"}]})
    assert top.gpu == schema.GpuSpec(base="rtx5090")
    assert top.nodes[0].gpu == schema.GpuSpec(base="rtx4090")


def test_a_workload_needs_exactly_one_model_form() -> None:
    with pytest.raises(ValidationError, match="exactly one of `model`"):
        WorkloadConfig.from_data({"name": "w", "training": {"seq_len": 8}})


def test_dump_leaves_out_what_is_asked() -> None:
    calibration = schema.CalibrationConfig(source="logs", fitted=[schema.FittedValue(
        parameter="p", value=1.0, source="s")])
    assert schema.dump(calibration, exclude_defaults=True) == {
        "source": "logs", "fitted": [{"parameter": "p", "value": 1.0, "source": "s"}]}
    assert schema.dump(schema.GpuSpec(base="h100-sxm"), exclude_none=True) == {"base": "h100-sxm"}


def test_a_preset_read_back_needs_no_pydantic(tmp_path: Any) -> None:
    code = ("import sys\n"
            "from simulator.inputs.config import load_topology, load_workload\n"
            "load_topology('8x5090-switch'); w = load_workload('llama2-7b')\n"
            "print(sorted(m for m in ('pydantic', 'pydantic_core', 'yaml') if m in sys.modules),"
            " sorted(w.training.given))")
    env = {"STEPSIM_CACHE_DIR": str(tmp_path), "PATH": ""}
    first = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                           text=True, check=True).stdout.strip()
    again = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                           text=True, check=True).stdout.strip()
    assert first.startswith("['pydantic', 'pydantic_core', 'yaml']")
    assert again == "[] " + first.split("] ", 1)[1]  # the given keys survive the cache
