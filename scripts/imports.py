"""The import graph between stepsim's subpackages, from the code's own imports.

Every ``import`` and ``from ... import`` that runs counts, function-local ones included, so a
circle hidden inside a function shows; those under ``if TYPE_CHECKING:`` never run and name
types only, so they are left out (``--typing`` counts them too). A top-level module
(``units.py``) is its own node; a subpackage is one node.

    python scripts/imports.py            # edges, then any cycle, then the layering rules
    python scripts/imports.py --modules  # the same at file level: cycles between modules

Exit status 1 when there is a cycle or a layering rule is broken (docs/architecture.md),
so a test can run it.
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "simulator"

# What a subpackage must never import (docs/architecture.md, "The layers").
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "engine": ("machine", "nccl", "job", "memory", "strategies"),
    "commands": ("catalog", "machine", "nccl", "job", "memory", "strategies", "engine"),
    "cli": ("catalog", "machine", "nccl", "job", "memory", "strategies", "engine"),
    "outputs": ("engine.core", "strategies", "advice", "calibration", "commands"),
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _typing_only(tree: ast.AST) -> set[int]:
    """ids of the import statements under ``if TYPE_CHECKING:``."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test).endswith("TYPE_CHECKING"):
            out.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return out


def imported_modules(path: Path, known: set[str], typing: bool = False) -> set[str]:
    """The simulator modules a file imports, wherever in the file the import stands (with
    ``typing``, those it imports for type annotations only as well)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found: set[str] = set()
    tree = ast.parse(path.read_text(), str(path))
    skip = set() if typing else _typing_only(tree)
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            # `from pkg import mod` imports the module pkg.mod when there is one
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                       for alias in node.names]
        else:
            continue
        found.update(t for t in targets if t.split(".")[0] == "simulator")
    found.discard(name)
    return found


def module_graph(typing: bool = False) -> nx.DiGraph:
    files = sorted(PACKAGE.rglob("*.py"))
    known = {module_name(f) for f in files}
    graph = nx.DiGraph()
    for f in files:
        graph.add_node(module_name(f))
        for target in imported_modules(f, known, typing):
            # `import simulator.a.b` also runs simulator/a/__init__.py; count the module itself
            graph.add_edge(module_name(f), target)
    return graph


def unit(module: str) -> str:
    """The node a module belongs to: its subpackage, or itself at the top level."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "simulator"


def package_graph(modules: nx.DiGraph) -> nx.DiGraph:
    graph = nx.DiGraph()
    for a, b in modules.edges:
        ua, ub = unit(a), unit(b)
        graph.add_nodes_from((ua, ub))
        if ua != ub and ub != "simulator":  # the package's own __init__ is not a layer
            graph.add_edge(ua, ub)
    return graph


def broken_rules(modules: nx.DiGraph) -> list[str]:
    out = []
    for a, b in sorted(modules.edges):
        for source, banned in FORBIDDEN.items():
            if unit(a) != source:
                continue
            rest = b.removeprefix("simulator.")
            if any(rest == x or rest.startswith(x + ".") for x in banned):
                out.append(f"{a} imports {b} ({source}/ must not import it)")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modules", action="store_true", help="cycles between files")
    parser.add_argument("--typing", action="store_true",
                        help="count the imports under `if TYPE_CHECKING:` too")
    args = parser.parse_args(argv)
    modules = module_graph(args.typing)
    graph = modules if args.modules else package_graph(modules)
    if not args.modules:
        for node in sorted(graph):
            print(f"{node:12} -> {', '.join(sorted(graph.successors(node))) or '-'}")
    cycles = sorted(sorted(c) for c in nx.simple_cycles(graph) if len(c) > 1)
    print(f"\n{len(cycles)} cycle(s)" + "".join(f"\n  {' <-> '.join(c)}" for c in cycles))
    rules = broken_rules(modules)
    print(f"{len(rules)} layering rule(s) broken" + "".join(f"\n  {r}" for r in rules))
    return 1 if cycles or rules else 0


if __name__ == "__main__":
    sys.exit(main())
