"""A JSON config with an error says that one line naming the file (its warnings wait for a
file that reads); limits and required keys as the YAML inputs have them."""

import json
from pathlib import Path

import pytest

from simulator.cli import main

FIXTURES = Path(__file__).resolve().parent / "fixtures"


def _write(tmp_path: Path, data: dict) -> str:
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(data, indent=1))
    return str(path)


def test_an_error_comes_alone_and_warnings_come_once_the_file_reads(tmp_path, capsys):  # noqa: ANN001
    data = json.loads((FIXTURES / "deepspeed" / "ds_z3_offload_config.json").read_text())
    data["zero_optimization"]["overlap_comm"] = False  # a warning (not modelled)
    data["made_up_key"] = 1  # and another
    data["bf16"] = {"enabled": "yes"}  # and an error
    path = _write(tmp_path, data)
    argv = ["memory", "-t", "2x5090", "-w", "gpt2-medium", "--deepspeed", path]
    assert main(argv) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"stepsim memory: error: {path}:")
    data["bf16"] = {"enabled": True}
    path = _write(tmp_path, data)
    assert main(argv) == 0
    warnings = capsys.readouterr().err.splitlines()
    assert len(warnings) == 2 and all(": warning: " in w and path in w for w in warnings)


def test_a_deepspeed_batch_past_the_limits_names_the_file(tmp_path, capsys):  # noqa: ANN001
    data = json.loads((FIXTURES / "deepspeed" / "ds_z2_offload_config.json").read_text())
    data["gradient_accumulation_steps"] = 2**70
    path = _write(tmp_path, data)
    assert main(["memory", "-t", "2x5090", "-w", "gpt2-medium", "--deepspeed", path]) == 2
    err = capsys.readouterr().err.strip()
    assert path in err and "gradient_accumulation_steps: at most 65,536" in err
    data["gradient_accumulation_steps"] = 60_000  # within its own bound, too many tokens a step
    path = _write(tmp_path, data)
    assert main(["memory", "-t", "2x5090", "-w", "gpt2-medium", "--deepspeed", path]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"stepsim memory: error: {path}: ") and "tokens per GPU" in err


def test_a_required_key_given_as_null_is_the_one_line(tmp_path, capsys):  # noqa: ANN001
    data = json.loads((FIXTURES / "hf" / "mistral-7b-v0.1" / "config.json").read_text())
    data["num_hidden_layers"] = None
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data, indent=1))
    assert main(["memory", "-t", "2x5090", "-w", f"hf:{path}"]) == 2
    err = capsys.readouterr().err.strip()
    assert f"error: {path}:" in err and err.endswith("num_hidden_layers: required, got null")


def test_a_topology_whose_gpus_cannot_reach_a_cpu_is_named_by_its_file(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A route the machine lacks, found while `run` sizes NCCL's buffers for the memory
    verdict, names the topology file (it was the machine's name alone)."""
    path = tmp_path / "islands.yaml"
    path.write_text("name: islands\ngpu: rtx4090\nnodes:\n  - {id: cpu0, kind: cpu}\n"
                    "  - {id: gpu0, kind: gpu}\n  - {id: gpu1, kind: gpu}\n"
                    "links:\n  - {a: cpu0, b: gpu0, kind: pcie, gen: 4, lanes: 16}\n"
                    "  - {a: gpu0, b: gpu1, kind: pcie, gen: 4, lanes: 16}\n")
    assert main(["run", "-t", str(path), "-w", "gpt2-medium", "--no-ranges"]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"stepsim run: error: {path}: ") and "no path from" in line


def test_a_model_too_deep_to_simulate_is_named_by_its_file(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """560 layers: more ops a micro-step than a run simulates in seconds; the workload file
    that gave them is named."""
    path = tmp_path / "deep.yaml"
    path.write_text("name: deep\nmodel: {family: llama, layers: 560, hidden: 1024, heads: 8, "
                    "ffn_hidden: 2816, vocab: 32000}\ntraining: {seq_len: 256, micro_batch: 1}\n")
    assert main(["run", "-t", "2x5090", "-w", str(path), "--no-ranges"]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"stepsim run: error: {path}: a micro-step of 560 layers")


def test_one_box_of_a_cluster_that_does_not_connect_is_named_by_its_file(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Four DGX-like boxes without the link from one socket to its PCIe switch: the boxes still
    connect through that switch's NICs and the network, but one box alone (the one-GPU
    baseline cuts it) leaves the switch and its NICs unreached: the topology file is named."""
    preset = Path(__file__).resolve().parent.parent / "topologies" / "4x8xh100-400g-ib.yaml"
    text = preset.read_text()
    cut_link = "  - {a: cpu1, b: sw3, kind: pcie, gen: 5, lanes: 16}\n"
    assert cut_link in text
    path = tmp_path / "cut.yaml"
    path.write_text(text.replace(cut_link, ""))
    code = main(["run", "-t", str(path), "-w", "gpt2-medium", "--seq-len", "256",
                 "--no-ranges"])
    [line] = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and line.startswith(f"stepsim run: error: {path}: "), line
    assert "not connected" in line
