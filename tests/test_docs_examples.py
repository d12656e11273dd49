"""docs/api.md's examples for running advise on a cluster run as pasted into a script: the
Dask block and the Ray block, each where its library is installed."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BLOCKS = re.findall(r"```python\n(.*?)```", (ROOT / "docs" / "api.md").read_text(), re.S)


def _block(word: str) -> str:
    (found,) = [b for b in BLOCKS if word in b and "__main__" in b]
    return found


@pytest.mark.parametrize(("library", "word", "install"), [
    ("distributed", "LocalCluster", "pip install 'stepsim[dask]'"),
    ("ray", "RayExecutor", "pip install ray")])
def test_the_cluster_example_runs_as_a_script(library: str, word: str, install: str,
                                             tmp_path: Path) -> None:
    if importlib.util.find_spec(library) is None:
        pytest.skip(f"{library} is not installed ({install})")
    script = tmp_path / "example.py"
    script.write_text(_block(word))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_USAGE_STATS_ENABLED": "0"}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "best (throughput): " in done.stdout
