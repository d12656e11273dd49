"""Bundled presets are validated once and read back (simulator/inputs/preset_cache.py): what is
read back equals what validating gives, and anything amiss falls back to validating."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from simulator.inputs import config, preset_cache
from simulator.inputs.bundled import preset_dir, preset_names
from simulator.inputs.schema import TopologyConfig, WorkloadConfig

KINDS = [("topologies", TopologyConfig, config.load_topology),
         ("workloads", WorkloadConfig, config.load_workload)]


@pytest.fixture()
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("STEPSIM_CACHE_DIR", str(tmp_path))
    return tmp_path


def _entries(folder: Path) -> list[Path]:
    return sorted((folder / "presets").glob("*.pickle"))


@pytest.mark.parametrize(("kind", "model", "load"), KINDS)
def test_every_preset_reads_back_as_it_validates(folder: Path, kind: str, model: type,
                                                 load: object) -> None:
    for name in preset_names(kind):
        fresh = load(name)  # type: ignore[operator]
        text = (preset_dir(kind) / f"{name}.yaml").read_bytes()
        kept = preset_cache.get(text, model)
        assert kept is not None and kept is not fresh, name
        assert kept == fresh, name
        assert load(name) == fresh, name  # type: ignore[operator]
    assert len(_entries(folder)) == len(preset_names(kind))


def test_a_kept_preset_is_not_parsed_or_validated_again(folder: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    first = config.load_topology("8x5090-switch")

    def refuse(*_: object) -> None:
        raise AssertionError("validated again")

    monkeypatch.setattr(config, "validate", refuse)
    assert config.load_topology("8x5090-switch") == first


def test_an_unreadable_entry_is_validated_afresh_and_replaced(folder: Path) -> None:
    first = config.load_workload("llama2-7b")
    (entry,) = _entries(folder)
    entry.write_bytes(entry.read_bytes()[:40])  # truncated, as by a full disk
    assert config.load_workload("llama2-7b") == first
    assert preset_cache.get((preset_dir("workloads") / "llama2-7b.yaml").read_bytes(),
                            WorkloadConfig) == first


def test_an_entry_of_another_model_is_a_miss(folder: Path) -> None:
    text = (preset_dir("workloads") / "llama2-7b.yaml").read_bytes()
    preset_cache.put(text, WorkloadConfig, config.load_topology("8x5090-switch"))  # type: ignore[arg-type]
    assert preset_cache.get(text, WorkloadConfig) is None


def test_a_folder_that_cannot_be_written_changes_nothing(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("STEPSIM_CACHE_DIR", str(blocker))
    assert config.load_topology("8x5090-switch").name == "8x5090-switch"
    assert blocker.read_text() == "not a folder"


def test_a_users_own_file_is_validated_every_time(folder: Path, tmp_path: Path) -> None:
    own = tmp_path / "mine.yaml"
    shutil.copy(preset_dir("topologies") / "8x5090-switch.yaml", own)
    config.load_topology(str(own))
    assert _entries(folder) == []


def test_an_edited_preset_is_a_different_entry(folder: Path) -> None:
    text = (preset_dir("workloads") / "llama2-7b.yaml").read_bytes()
    assert preset_cache.get(text + b"\n# edited\n", WorkloadConfig) is None
    config.load_workload("llama2-7b")
    assert preset_cache.get(text + b"\n# edited\n", WorkloadConfig) is None
    assert preset_cache.get(text, WorkloadConfig) is not None


def test_without_a_home_folder_nothing_is_kept(monkeypatch: pytest.MonkeyPatch,
                                               tmp_path: Path) -> None:
    for name in ("STEPSIM_CACHE_DIR", "XDG_CACHE_HOME", "HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(preset_cache.os.path, "expanduser", lambda path: path)  # "~" stays
    monkeypatch.chdir(tmp_path)
    assert preset_cache.folder() is None
    assert config.load_topology("8x5090-switch").name == "8x5090-switch"
    assert list(tmp_path.iterdir()) == []  # no "~" folder made where the command ran


def test_the_folder_follows_xdg(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("STEPSIM_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert preset_cache.folder() == tmp_path / "stepsim"


def test_a_changed_rule_or_catalog_is_a_different_entry(folder: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    text = (preset_dir("topologies") / "8x5090-switch.yaml").read_bytes()
    config.load_topology("8x5090-switch")
    assert preset_cache.get(text, TopologyConfig) is not None
    real = Path.read_bytes

    def edited(path: Path) -> bytes:
        return real(path) + (b"\n# edited\n" if path.name == "gpus.py" else b"")

    monkeypatch.setattr(Path, "read_bytes", edited)
    preset_cache._salt.cache_clear()
    try:
        assert preset_cache.get(text, TopologyConfig) is None
    finally:
        monkeypatch.undo()
        preset_cache._salt.cache_clear()
