"""Bad topology input: one line on stderr naming file, line and key; exit 2; no traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from simulator.cli import main
from simulator.inputs.config import preset_names

GOOD = """\
name: bad-input
gpu: rtx5090
nodes:
  - {id: cpu0, kind: cpu}
  - {id: gpu0, kind: gpu}
  - id: gpu1
    kind: gpu
links:
  - {a: cpu0, b: gpu0, kind: pcie, gen: 5, lanes: 16}
  - a: cpu0
    b: gpu1
    kind: pcie
    bandwidth_gb_per_s: 20
"""

# (what is wrong, text to replace, replacement, line, key, words in the message)
CASES = [
    ("misspelt key", "lanes: 16}", "lane: 16}", 9, "links[0].lane", "unknown key"),
    ("misspelt block key", "  - id: gpu1", "  - idd: gpu1", 6, "nodes[2].idd", "unknown key"),
    ("undefined node", "b: gpu1", "b: gpu9", 11, "links[1].b", "undefined node 'gpu9'"),
    ("negative bandwidth", "bandwidth_gb_per_s: 20", "bandwidth_gb_per_s: -3", 13,
     "links[1].bandwidth_gb_per_s", "at least 0.001"),
    ("unknown gpu", "gpu: rtx5090", "gpu: rtx5099", 2, "gpu", "unknown 'rtx5099'"),
    ("bad link kind", "kind: pcie\n", "kind: pcei\n", 12, "links[1].kind", "'pcei'"),
    ("duplicate link", "bandwidth_gb_per_s: 20", "bandwidth_gb_per_s: 20\n  - {a: gpu0, b: cpu0, "
     "kind: pcie}", 14, "links[2]", "second link"),
    ("unknown cpu model", "{id: cpu0, kind: cpu}", "{id: cpu0, kind: cpu, model: zen9}", 4,
     "nodes[0].model", "unknown 'zen9'"),
]


def run_topo(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(["topo", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_the_unbroken_file_loads(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "good.yaml"
    path.write_text(GOOD)
    code, out, err = run_topo(["-t", str(path)], capsys)
    assert code == 0 and err == "" and "SHM" in out


@pytest.mark.parametrize(("what", "old", "new", "line", "key", "words"), CASES,
                         ids=[c[0] for c in CASES])
def test_bad_file_names_file_line_and_key(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                          what: str, old: str, new: str, line: int, key: str,
                                          words: str) -> None:
    assert old in GOOD, what
    path = tmp_path / "broken.yaml"
    path.write_text(GOOD.replace(old, new, 1))
    code, out, err = run_topo(["-t", str(path)], capsys)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"stepsim topo: error: {path}:{line}: {key}: "), err
    assert words in err


def test_unknown_preset_lists_the_presets(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_topo(["-t", "8x5090-swtich"], capsys)
    assert code == 2 and err.count("\n") == 1
    assert "unknown topology '8x5090-swtich'" in err
    assert all(name in err for name in preset_names("topologies"))


def test_missing_file_and_invalid_yaml(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_topo(["-t", str(tmp_path / "nope.yaml")], capsys)
    assert code == 2 and "no such file" in err
    path = tmp_path / "cut.yaml"
    path.write_text("name: x\ngpu: rtx5090\nnodes: [\n")
    code, _, err = run_topo(["-t", str(path)], capsys)
    assert code == 2 and f"{path}:4: invalid YAML" in err and err.count("\n") == 1


def test_disconnected_gpu_is_an_input_error(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "island.yaml"
    text = GOOD.replace("  - id: gpu1", "  - {id: gpu2, kind: gpu}\n  - id: gpu1")
    path.write_text(text)
    code, _, err = run_topo(["-t", str(path)], capsys)
    assert code == 2 and "gpu2" in err and "not connected" in err


def test_bad_input_through_python_m_simulator(tmp_path: Path) -> None:
    path = tmp_path / "negative.yaml"
    path.write_text(GOOD.replace("bandwidth_gb_per_s: 20", "bandwidth_gb_per_s: -3"))
    done = subprocess.run([sys.executable, "-m", "simulator", "topo", "-t", str(path)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.splitlines() == [
        f"stepsim topo: error: {path}:13: links[1].bandwidth_gb_per_s: "
        "must be at least 0.001, got -3 (docs/inputs.md: Limits)"]
