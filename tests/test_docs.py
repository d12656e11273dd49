"""docs/inputs.md lists every key the input schema accepts, so the reference cannot drift."""

import dataclasses
import re
from pathlib import Path
from typing import Any, get_args, get_type_hints

import pytest

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


ROOT = Path(__file__).resolve().parent.parent
ARCHITECTURE = (ROOT / "docs" / "architecture.md").read_text()


def test_every_module_the_architecture_names_exists() -> None:
    named = set(re.findall(r"`((?:[\w]+/)*[\w]+\.py)`", ARCHITECTURE))
    places = [ROOT, ROOT / "simulator", *[p for p in (ROOT / "simulator").iterdir()
                                          if p.is_dir()], ROOT / "scripts"]
    missing = sorted(n for n in named if not any((place / n).exists() for place in places))
    assert not missing, f"docs/architecture.md names modules that do not exist: {missing}"


def test_the_architecture_names_every_module() -> None:
    unnamed = []
    for path in sorted((ROOT / "simulator").rglob("*.py")):
        rel = path.relative_to(ROOT / "simulator")
        if "_presets" in rel.parts or (path.name == "__init__.py" and len(rel.parts) > 1
                                       and rel.parent.name != "api"
                                       and rel.parent.name != "strategies"):
            continue
        shown = {f"`{rel.as_posix()}`", f"`{path.name}`", f"{rel.as_posix()}`",
                 f"`{path.stem}`"}
        if not any(s in ARCHITECTURE for s in shown):
            unnamed.append(rel.as_posix())
    assert not unnamed, f"modules docs/architecture.md does not name: {unnamed}"


def _validate() -> Any:
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location("validate", ROOT / "scripts" / "validate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["validate"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_accuracy_md_and_the_readme_table_are_what_validate_py_writes_now() -> None:
    validate = _validate()
    data = validate.load_all()
    sections = {name: rows(data) for name, rows in validate.SECTIONS.items()}
    written = (ROOT / "docs" / "accuracy.md").read_text(encoding="utf-8")
    assert written == validate.markdown(sections), \
        "run: python scripts/validate.py --markdown"
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "\n".join(validate.summary_table(sections)) in readme, \
        "README.md's accuracy table: copy it from docs/accuracy.md"


def test_the_readme_is_a_front_door() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 200
    # the two set-up commands .ci/run and newcomers run
    assert "pip install -e . && stepsim run -t 8x5090-switch -w llama2-7b-lora -s ddp" in readme
    assert 'pip install -e ".[dev,torch]" && pytest' in readme
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert 'pip install -e ".[dev,torch]" && pytest' in ci


def _squeezed(text: str) -> list[str]:
    return [" ".join(line.split()) for line in text.splitlines() if line.strip()]


def test_the_readme_example_is_what_the_quick_start_prints(
        capsys: pytest.CaptureFixture[str]) -> None:
    """Every line of the README's example table is a line the quick-start command prints."""
    from simulator.cli import main

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    example = readme.split("```\nstep time", 1)[1].split("```", 1)[0]
    assert main(["run", "-t", "8x5090-switch", "-w", "llama2-7b-lora", "-s", "ddp"]) == 0
    printed = set(_squeezed(capsys.readouterr().out))
    missing = [line for line in _squeezed("step time" + example) if line not in printed]
    assert not missing, f"README.md's example is stale: {missing}"


def test_the_readme_answers_are_what_stepsim_says_now() -> None:
    """The figures of 'A few answers it gives', each from the command it stands for."""
    from simulator import api

    readme = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    busbw = [api.collective(api.CollectiveSpec(t, "allreduce", (2**30,)))[0].busbw_gbps
             for t in ("8x5090-switch", "8x5090-switch-p2p", "8x5090-dual-socket")]
    assert f"all-reduce 1 GiB at **{busbw[0]:.1f} GB/s**" in readme
    assert f"reaches {busbw[1]:.1f} GB/s" in readme and f"{busbw[2]:.1f} GB/s (NCCL's" in readme
    peaks = [api.memory(api.RunSpec("8x5090-dual-socket", "llama2-7b", "fsdp",
                                    checkpointing=mode)).summary["peak_bytes"] / 2**30
             for mode in ("none", "full")]
    assert f"the peak to {peaks[0]:.1f} GiB" in readme and f"fits in {peaks[1]:.1f} GiB" in readme
    steps = [round(api.step_time(api.RunSpec("8x5090-dual-socket", "gpt2-medium", "ddp",
                                             bucket_mb=mb)) * 1e3)
             for mb in (1, 5, 25, 100, 400)]
    assert "{} / {} / **{}** / {} / {} ms a step".format(*steps) in readme
