"""Where the bundled presets live: ``topologies/`` and ``workloads/`` in the source tree, under
``simulator/_presets/`` in the wheel. Standard library only, so listing them loads nothing."""

from __future__ import annotations

from pathlib import Path

from simulator.errors import InputError

_PACKAGE_DIR = Path(__file__).resolve().parent.parent  # simulator/
PRESET_ROOTS = (_PACKAGE_DIR / "_presets", _PACKAGE_DIR.parent)  # wheel, then source tree


def preset_dir(kind: str) -> Path:
    """The folder holding bundled presets of one kind (``topologies`` or ``workloads``)."""
    for root in PRESET_ROOTS:
        if (root / kind).is_dir():
            return root / kind
    raise InputError(f"no bundled {kind} found (broken installation?)")


def preset_names(kind: str) -> list[str]:
    return sorted(p.stem for p in preset_dir(kind).glob("*.yaml"))
