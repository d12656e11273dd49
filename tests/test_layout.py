"""The package's layout is its architecture: subpackages import only downward (no cycle), the
engine knows no physics, the commands reach the rest through the API (scripts/imports.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("imports", ROOT / "scripts" / "imports.py")
assert _spec is not None and _spec.loader is not None
imports = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(imports)


def test_subpackages_import_each_other_without_a_cycle() -> None:
    for typing in (False, True):  # type-only imports make no circle either
        graph = imports.package_graph(imports.module_graph(typing))
        assert list(nx.simple_cycles(graph)) == []


def test_the_layering_rules_hold() -> None:
    assert imports.broken_rules(imports.module_graph(typing=True)) == []


def test_the_script_sees_function_local_imports_and_breaks(tmp_path: Path) -> None:
    """A circle hidden inside a function is found, and a forbidden import is named."""
    package = tmp_path / "simulator"
    (package / "engine").mkdir(parents=True)
    (package / "nccl").mkdir()
    for folder in (package, package / "engine", package / "nccl"):
        (folder / "__init__.py").write_text("")
    (package / "engine" / "core.py").write_text("def f():\n    from simulator.nccl import plan\n")
    (package / "nccl" / "plan.py").write_text("from simulator.engine import core\n")
    old = imports.ROOT, imports.PACKAGE
    imports.ROOT, imports.PACKAGE = tmp_path, package
    try:
        modules = imports.module_graph()
        assert list(nx.simple_cycles(imports.package_graph(modules))) != []
        assert imports.broken_rules(modules) == [
            "simulator.engine.core imports simulator.nccl.plan (engine/ must not import it)"]
    finally:
        imports.ROOT, imports.PACKAGE = old


def test_every_public_api_name_resolves() -> None:
    from simulator import api

    assert sorted(api.__all__) == sorted(api._HOME)
    for name in api.__all__:
        assert getattr(api, name) is not None


def test_modules_import_each_other_without_a_cycle() -> None:
    """Inside a subpackage too: a module that needs another's names never serves them back."""
    assert list(nx.simple_cycles(imports.module_graph())) == []
