"""`stepsim presets` lists every bundled preset, in text and JSON."""

import json

from simulator.cli import main
from simulator.inputs.config import preset_names


def test_presets_lists_every_bundled_file(capsys):
    assert main(["presets", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [t["name"] for t in data["topologies"]] == preset_names("topologies")
    assert [w["name"] for w in data["workloads"]] == preset_names("workloads")
    assert all(t["description"] for t in data["topologies"])
    assert main(["presets"]) == 0
    out = capsys.readouterr().out
    assert "8x5090-switch" in out and "llama2-7b-lora" in out
    assert max(len(line) for line in out.splitlines()) < 200
