"""Bundled topology presets: the promised names, each loads, describes itself, and draws."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from simulator.cli import main
from simulator.inputs.config import load_topology, preset_names
from simulator.machine.topology import Machine
from simulator.nccl.communicator import Communicator

REQUIRED = {"1x4090", "1x5090", "2x5090", "4x5090", "8x5090-switch", "8x5090-switch-p2p",
            "8x5090-dual-socket", "8x4090-dual-socket", "8xa100-nvswitch", "8xh100-nvswitch",
            "8xh200-nvswitch", "2x2080ti-switch", "2x3090ti-nvlink", "2x3090ti-pcie"}
NAMES = preset_names("topologies")


def test_every_promised_preset_exists() -> None:
    assert set(NAMES) >= REQUIRED


@pytest.mark.parametrize("name", NAMES)
def test_preset_loads_and_says_what_machine_it_is(name: str) -> None:
    config = load_topology(name)
    assert config.name == name
    assert len(config.description) > 40 and config.source
    machine = Machine.from_config(config)
    # "8x5090-switch": 8; a mixed box names each kind: "2x5090-2x4090": 4; several boxes
    # name their count first: "2x8x5090-100g-roce": 2 boxes of 8
    boxes = re.match(r"^(\d+)x(\d+)x", name)
    expected_gpus = int(boxes.group(1)) * int(boxes.group(2)) if boxes else \
        sum(int(n) for n in re.findall(r"(?:^|-)(\d+)x", name))
    assert machine.n_gpus == expected_gpus
    assert machine.nnodes == (int(boxes.group(1)) if boxes else 1)
    ring = Communicator(machine).ring()
    assert sorted(ring.order) == list(range(expected_gpus)) and ring.n_channels >= 1


def test_geforce_presets_have_no_pcie_p2p_except_the_patched_one() -> None:
    for name in NAMES:
        config = load_topology(name)
        if config.gpu.base.startswith("rtx"):
            assert config.p2p == name.endswith("-p2p"), name


def test_topo_plain_output(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["topo", "-t", "8x5090-dual-socket"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    row = next(line for line in lines if line.startswith("gpu0") and "SYS" in line)
    assert row.split() == ["gpu0", "X", "PHB", "PHB", "PHB", "SYS", "SYS", "SYS", "SYS"]
    assert "Transport" in out and "Bottleneck GB/s" in out
    assert "Ring: gpu0 -> gpu1 -> gpu2 -> gpu3 -> gpu4" in out
    assert "Channels: 1 x 20 GB/s" in out


def test_topo_json_with_gpus(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["topo", "-t", "8xh200-nvswitch", "--gpus", "4", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["gpus"] == ["gpu0", "gpu1", "gpu2", "gpu3"]
    assert report["path_type"][0][1] == "NVL" and report["transport"][2][3] == "P2P"
    assert report["bottleneck_gbps"][0][1] == pytest.approx(450.0)
    assert report["ring"]["n_channels"] == 12 and report["ring"]["channel_gbps"] == 30


def test_topo_png_is_written_whole(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "machine.png"
    assert main(["topo", "-t", "2x2080ti-switch", "--png", str(target)]) == 0
    assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in tmp_path.iterdir()] == ["machine.png"]  # no temp file left


def test_topo_png_into_missing_directory_is_an_input_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["topo", "-t", "1x4090", "--png", str(tmp_path / "no" / "m.png")]) == 2
    assert "no such folder" in capsys.readouterr().err


def test_topo_too_many_gpus(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["topo", "-t", "2x5090", "--gpus", "3"]) == 2
    assert "2 GPUs" in capsys.readouterr().err
