"""The preset folders' index.json is current, and a stale or missing one never shows."""

import json
import shutil

import pytest

from simulator.api import listing as catalog
from simulator.inputs import bundled


@pytest.mark.parametrize("kind", catalog.KINDS)
def test_the_index_is_current(kind):
    stored = json.loads((bundled.preset_dir(kind) / catalog.INDEX).read_text())
    assert stored == catalog.index(kind), "run: python scripts/presets_index.py"


@pytest.mark.parametrize("kind", catalog.KINDS)
def test_the_listing_reads_the_files_where_the_index_is_stale(kind, tmp_path, monkeypatch):
    folder = tmp_path / kind
    shutil.copytree(bundled.preset_dir(kind), folder)
    monkeypatch.setattr(bundled, "PRESET_ROOTS", (tmp_path,))
    fresh = [{k: v for k, v in e.items() if k != "crc32"} for e in catalog.index(kind)]
    stored = json.loads((folder / catalog.INDEX).read_text())
    stored[0]["description"] = "stale"  # an index entry no longer true of its file ...
    (folder / catalog.INDEX).write_text(json.dumps(stored))
    assert catalog.listing(kind)[0]["description"] == "stale"  # (the checksum is trusted)
    edited = folder / f"{stored[0]['name']}.yaml"
    edited.write_text(edited.read_text() + "# edited\n")  # ... once the file changes
    assert catalog.listing(kind) == fresh
    (folder / "zz-extra.yaml").write_bytes(edited.read_bytes())  # a file the index lacks
    assert catalog.listing(kind) == [*fresh, {**fresh[0], "name": "zz-extra"}]
    (folder / catalog.INDEX).write_text("{not json")  # an unreadable index: every file read
    assert catalog.listing(kind) == [*fresh, {**fresh[0], "name": "zz-extra"}]


def test_listing_presets_imports_neither_yaml_nor_pydantic():
    import subprocess
    import sys

    code = ("import sys; from simulator.cli import main; main(['presets']); "
            "print(sorted(m for m in ('yaml', 'pydantic', 'numpy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip().endswith("[]")
