"""What a built distribution carries: the Apache-2.0 text, PEP 639 metadata, py.typed, presets.

Building a wheel needs the build backend from an index, so these read what the build reads
(pyproject.toml and the files it names); `pip wheel . -w DIR --no-deps` shows the result.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_license_is_the_full_apache_2_text_named_by_pep_639_metadata() -> None:
    text = (ROOT / "LICENSE").read_text()
    assert text.lstrip().startswith("Apache License\n                           Version 2.0")
    assert "END OF TERMS AND CONDITIONS" in text and "APPENDIX: How to apply" in text
    assert len(text.splitlines()) == 202  # apache.org/licenses/LICENSE-2.0.txt, unabridged
    project = PROJECT["project"]
    assert project["license"] == "Apache-2.0"  # an SPDX expression, not a table
    assert project["license-files"] == ["LICENSE"]
    assert any(r.startswith("hatchling>=1.27") for r in PROJECT["build-system"]["requires"])
    assert "License :: " not in " ".join(project["classifiers"])  # PEP 639: not both


def test_the_package_is_typed_and_its_presets_are_shipped() -> None:
    assert (ROOT / "simulator" / "py.typed").is_file()
    wheel = PROJECT["tool"]["hatch"]["build"]["targets"]["wheel"]
    assert wheel["packages"] == ["simulator"]  # every file under simulator/, py.typed too
    shipped = wheel["force-include"]
    assert {"topologies", "workloads"} <= set(shipped)
    assert "LICENSE" in PROJECT["tool"]["hatch"]["build"]["targets"]["sdist"]["include"]


def test_urls_classifiers_and_the_torch_extra_are_documented() -> None:
    project = PROJECT["project"]
    assert {"Homepage", "Source", "Issues"} <= set(project["urls"])
    assert "Typing :: Typed" in project["classifiers"]
    torch = project["optional-dependencies"]["torch"]
    assert torch and not any("==" in r for r in torch)  # a range, not one exact build
    readme = (ROOT / "README.md").read_text()
    assert "pip install torch --index-url https://download.pytorch.org/whl/cpu" in readme
