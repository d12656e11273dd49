"""`-w hf:config.json`: Hugging Face configs as workloads, held to the model pages' parameter
counts (tests/fixtures/hf/README.md names each page), and their bad values as one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simulator.api import load_job
from simulator.cli import main

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "hf"

# model page parameter counts (tests/fixtures/hf/README.md)
CARDS = [("tinyllama-1.1b-chat", 1_100_048_384), ("qwen2.5-0.5b", 494_032_768),
         ("gpt2", 124_439_808)]


@pytest.mark.parametrize(("folder", "params"), CARDS, ids=[c[0] for c in CARDS])
def test_parameter_count_is_the_model_cards(folder: str, params: int) -> None:
    job = load_job(f"hf:{FIXTURES / folder}", None, None, None)
    assert job.n_params == params
    assert job.seq_len == 1024 and job.micro_batch == 8  # TRL's max_length, HF's batch


def test_a_folder_and_its_config_json_are_one_workload() -> None:
    a = load_job(f"hf:{FIXTURES / 'gpt2'}", None, None, None)
    b = load_job(f"hf:{FIXTURES / 'gpt2' / 'config.json'}", None, None, None)
    assert a.n_params == b.n_params and a.name == b.name == "gpt2"


def test_run_fsdp_on_a_hub_config(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["run", "-t", "8x5090-dual-socket", "-w", f"hf:{FIXTURES / 'tinyllama-1.1b-chat'}",
                 "-s", "fsdp", "--seq-len", "512", "--no-ranges", "--json"])
    out = capsys.readouterr()
    report = json.loads(out.out)
    assert code == 0 and report["workload"] == "tinyllama-1.1b-chat" and report["seq_len"] == 512
    assert report["step_time_s"] > 0


def test_unknown_keys_are_reported_not_fatal(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "config.json"  # a path of its own: each file is reported once a process
    path.write_bytes((FIXTURES / "qwen2.5-0.5b" / "config.json").read_bytes())
    assert main(["memory", "-t", "2x5090", "-w", f"hf:{path}"]) == 0
    err = capsys.readouterr().err
    assert "not modelled: unknown keys use_mrope" in err and err.count("\n") == 1


def _config(tmp_path: Path, **changes: object) -> Path:
    cfg = json.loads((FIXTURES / "tinyllama-1.1b-chat" / "config.json").read_text())
    cfg.update(changes)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg, indent=2))
    return path


BAD = [
    ({"num_hidden_layers": -3}, "num_hidden_layers", '"num_hidden_layers"'),
    ({"hidden_size": "wide"}, "hidden_size", '"hidden_size"'),
    ({"vocab_size": 1e400}, "vocab_size", '"vocab_size"'),
    ({"model_type": "t5"}, "model_type", '"model_type"'),
    ({"head_dim": 256}, "head_dim", '"head_dim"'),
]


@pytest.mark.parametrize(("changes", "key", "marker"), BAD, ids=[c[1] for c in BAD])
def test_a_bad_value_names_file_line_and_key(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                             changes: dict, key: str, marker: str) -> None:
    path = _config(tmp_path, **changes)
    line = next(n for n, text in enumerate(path.read_text().splitlines(), 1) if marker in text)
    assert main(["memory", "-t", "2x5090", "-w", f"hf:{path}"]) == 2
    err = capsys.readouterr().err
    assert f"{path}:{line}: {key}: " in err and err.count("\n") == 1, err


def test_not_json_and_a_missing_file_are_one_line(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "config.json"
    path.write_text('{\n  "model_type": "llama",\n  oops\n}')
    assert main(["memory", "-t", "2x5090", "-w", f"hf:{path}"]) == 2
    assert f"{path}:3: not JSON" in capsys.readouterr().err
    assert main(["memory", "-t", "2x5090", "-w", f"hf:{tmp_path / 'nothing'}"]) == 2
    assert "no such file" in capsys.readouterr().err


def test_a_missing_key_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "config.json"
    path.write_text('{"model_type": "gpt2", "n_embd": 768, "n_head": 12, "vocab_size": 9}')
    assert main(["memory", "-t", "2x5090", "-w", f"hf:{path}"]) == 2
    assert f"{path}: n_layer: required key is missing" in capsys.readouterr().err


def test_experts_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["memory", "-t", "2x5090", "-w", f"hf:{_config(tmp_path, num_local_experts=8)}"]
                ) == 2
    assert "mixture of experts is not modelled" in capsys.readouterr().err
