"""What the wheel and sdist carry besides code: the licence text and metadata, py.typed."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_license_is_apache_2_and_shipped() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "Apache-2.0"  # PEP 639: an SPDX expression
    assert project["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text()
    assert text.lstrip().startswith("Apache License") and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text  # the whole text, not a stub


def test_the_package_says_it_is_typed() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert (ROOT / "simulator" / "py.typed").exists()
    assert "Typing :: Typed" in project["classifiers"]
