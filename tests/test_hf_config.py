"""`-w hf:config.json`: a Hugging Face config as a workload, with the model card's parameters.

Counts are the model cards' (the Hub's safetensors figure, tests/fixtures/hf/README.md),
checked exactly against transformers 5.24's own count of the same config (meta device).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simulator.api import load_job
from simulator.cli import main
from simulator.errors import InputError
from simulator.inputs.config import load_workload
from simulator.job.workload import Job

HF = Path(__file__).resolve().parent / "fixtures" / "hf"

# folder -> (transformers' exact count, the model card's figure in billions, its decimals);
# cards print the count cut or rounded to those decimals, so within one unit of the last
CARDS = {
    "llama-3.2-1b": (1_235_814_400, 1.23, 2),
    "llama-3.1-8b": (8_030_261_248, 8.03, 2),
    "mistral-7b-v0.1": (7_241_732_096, 7.24, 2),
    "qwen2.5-7b": (7_615_616_512, 7.61, 2),
    "gpt2-medium": (354_823_168, 0.355, 3),
    "gemma-2b": (2_506_172_416, 2.51, 2),
    "mpt-7b": (6_649_286_656, 6.65, 2),
    "tinyllama-1.1b-chat": (1_100_048_384, 1.1, 1),
    "qwen2.5-0.5b": (494_032_768, 0.49, 2),
    "gpt2": (124_439_808, 0.124, 3),
}


@pytest.mark.parametrize("folder", list(CARDS))
def test_parameter_count_is_the_model_cards(folder: str, capsys: pytest.CaptureFixture[str]
                                            ) -> None:
    exact, card, digits = CARDS[folder]
    job = load_job(f"hf:{HF / folder / 'config.json'}", None, None, None)
    assert job.n_params == exact
    assert abs(job.n_params / 1e9 - card) < 10**-digits
    assert job.micro_batch == 8  # TrainingArguments' per_device_train_batch_size
    err = capsys.readouterr().err  # every key of a real config is known
    assert err == "" or (folder.startswith("mistral") and "sliding_window: warning" in err)


def test_a_folder_names_its_config_json() -> None:
    by_folder = load_workload(f"hf:{HF / 'mistral-7b-v0.1'}")
    assert by_folder == load_workload(f"hf:{HF / 'mistral-7b-v0.1' / 'config.json'}")
    assert by_folder.name == "mistral-7b-v0.1"


def test_a_config_json_or_its_folder_needs_no_hf_prefix(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]
                                                        ) -> None:
    """A model's folder or its config.json, as a user has them, is read as hf: reads it; a
    folder without one, or a JSON without model_type, is refused in one line naming it."""
    folder = HF / "mistral-7b-v0.1"
    expected = load_workload(f"hf:{folder}")
    assert load_workload(str(folder)) == expected
    assert load_workload(str(folder / "config.json")) == expected
    (tmp_path / "empty.json").write_text("{}", encoding="utf-8")
    args = ["memory", "-t", "8xh100-nvswitch", "-s", "fsdp", "-w"]
    assert main([*args, str(tmp_path / "empty.json")]) == 2
    err = capsys.readouterr().err
    assert "empty.json" in err and "model_type" in err and len(err.strip().splitlines()) == 1
    assert main([*args, str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "is a directory" in err and "config.json" in err


def test_layouts_follow_transformers() -> None:
    qwen = load_workload(f"hf:{HF / 'qwen2.5-7b'}").model
    assert qwen is not None and qwen.qkv_bias and not qwen.bias  # modeling_qwen2.py
    gemma = load_workload(f"hf:{HF / 'gemma-2b'}").model
    assert gemma is not None and gemma.tie_embeddings and gemma.kv_heads == 1
    gpt2 = load_workload(f"hf:{HF / 'gpt2-medium'}")
    assert gpt2.model is not None and gpt2.model.ffn_hidden == 4 * 1024  # n_inner null
    assert gpt2.training.seq_len == 1024 and gpt2.training.dropout == 0.1  # n_positions
    mpt = load_workload(f"hf:{HF / 'mpt-7b'}").model
    assert mpt is not None and mpt.positions == "alibi" and mpt.bias is False
    llama = load_workload(f"hf:{HF / 'llama-3.1-8b'}")
    assert llama.training.seq_len == 1024  # TRL SFTConfig max_length, not the 131,072 context


def _write(tmp_path: Path, base: str, **changes: object) -> Path:
    data = json.loads((HF / base / "config.json").read_text())
    data.update(changes)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data, indent=2))
    return path


def test_gpt2_n_inner_and_untied_head(tmp_path: Path) -> None:
    path = _write(tmp_path, "gpt2-medium", n_inner=2048, tie_word_embeddings=False)
    job = Job.from_config(load_workload(f"hf:{path}"))
    h, layers, vocab = 1024, 24, 50257
    fewer_ffn = layers * 2 * (4096 - 2048) * h + layers * (4096 - 2048)  # c_fc w+b, c_proj w
    assert job.n_params == 354_823_168 - fewer_ffn + vocab * h


def test_a_4bit_quantized_config_is_qlora(tmp_path: Path) -> None:
    path = _write(tmp_path, "llama-3.2-1b", quantization_config={
        "quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4"})
    training = load_workload(f"hf:{path}").training
    assert training.finetune == "qlora" and training.activation_checkpointing == "full"


def test_unknown_keys_are_warned_one_line_each(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path, "llama-3.2-1b", made_up_key=1, another_one="x")
    load_workload(f"hf:{path}")
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2
    assert lines[0].startswith(f"{path}:") and "made_up_key: warning: unknown key" in lines[0]
    assert "another_one" in lines[1]


# (what is wrong, config changes, key the error names, words in the message)
BAD = [
    ("a text layer count", "llama-3.2-1b", {"num_hidden_layers": "16"}, "num_hidden_layers",
     'expected an integer, got "16"'),
    ("a boolean width", "llama-3.2-1b", {"hidden_size": True}, "hidden_size",
     "expected an integer, got true"),
    ("no layer count", "llama-3.2-1b", {"num_hidden_layers": None}, "num_hidden_layers",
     "required key is missing"),
    ("a mixture of experts without experts", "mistral-7b-v0.1", {"model_type": "mixtral"},
     "num_local_experts", "required key is missing"),
    ("o_proj bias alone", "llama-3.2-1b", {"attention_bias": True}, "attention_bias",
     "attention_bias true with mlp_bias false"),
    ("kv heads that do not divide", "llama-3.2-1b", {"num_key_value_heads": 5},
     "num_key_value_heads", "kv_heads 5 must divide heads 32"),
    ("too many layers", "llama-3.2-1b", {"num_hidden_layers": 10**6}, "num_hidden_layers",
     "must be at most 4,096"),
    ("gptq weights", "llama-3.2-1b", {"quantization_config": {"quant_method": "gptq"}},
     "quantization_config", "gptq quantization is not modelled"),
    ("top-k above the experts", "qwen3-30b-a3b", {"num_experts_per_tok": 200}, "num_experts",
     "200 experts per token of 128"),
    ("sparse-layer indices", "qwen3-30b-a3b", {"mlp_only_layers": ["0"]}, "mlp_only_layers",
     "expected a list of layer indices"),
    ("a negative count", "tinyllama-1.1b-chat", {"num_hidden_layers": -3}, "num_hidden_layers",
     "must be at least 1"),
    # checked before a per-layer list is built from it (phi-3's sliding window: every layer)
    ("a billion layers", "phi-3-mini-4k", {"num_hidden_layers": 1e9}, "num_hidden_layers",
     "must be at most 4,096"),
    ("an overflowing vocabulary", "tinyllama-1.1b-chat", {"vocab_size": 1e400}, "vocab_size",
     "Infinity is not a number JSON allows"),
    ("an encoder-decoder", "tinyllama-1.1b-chat", {"model_type": "t5"}, "model_type",
     "'t5' is not one stepsim lays out"),
]


@pytest.mark.parametrize(("base", "changes", "key", "words"),
                         [case[1:] for case in BAD], ids=[case[0] for case in BAD])
def test_bad_configs_are_one_line_with_file_line_and_key(
        tmp_path: Path, base: str, changes: dict[str, object], key: str, words: str) -> None:
    data = json.loads((HF / base / "config.json").read_text())
    data.update(changes)
    data = {k: v for k, v in data.items() if v is not None}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data, indent=2))
    with pytest.raises(InputError) as err:
        load_workload(f"hf:{path}")
    line = next((i for i, text in enumerate(path.read_text().splitlines(), 1)
                 if f'"{key}"' in text), None)
    assert err.value.file == str(path) and err.value.key == key and words in err.value.message
    if line is not None:
        assert err.value.line == line


def test_a_missing_key_has_no_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "config.json"
    path.write_text('{"model_type": "gpt2", "n_embd": 768, "n_head": 12, "vocab_size": 9}')
    assert main(["memory", "-t", "2x5090", "-w", f"hf:{path}"]) == 2
    assert f"{path}: n_layer: required key is missing" in capsys.readouterr().err


def test_run_fsdp_with_training_flags(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "-t", "8x5090-dual-socket", "-w", f"hf:{HF / 'tinyllama-1.1b-chat'}",
                 "-s", "fsdp", "--seq-len", "512", "--micro-batch", "2", "--no-ranges",
                 "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["workload"] == "tinyllama-1.1b-chat"
    assert (report["seq_len"], report["micro_batch"]) == (512, 2)


def test_malformed_json_names_its_line(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text('{\n  "model_type": "llama",\n  "hidden_size": 4096,,\n}\n')
    with pytest.raises(InputError) as err:
        load_workload(f"hf:{path}")
    assert err.value.line == 3 and "invalid JSON" in err.value.message
    path.write_text('{\n  "model_type": "llama",\n  "hidden_size": 1e400\n}\n')
    with pytest.raises(InputError) as err:
        load_workload(f"hf:{path}")
    assert (err.value.line, err.value.key) == (3, "hidden_size")
    assert "1e400 is too large a number" in err.value.message


def test_cli_refuses_a_bad_config_in_one_line(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "config.json"
    path.write_text('{"model_type": "llama", "hidden_size": NaN}')
    assert main(["memory", "-t", "1x4090", "-w", f"hf:{path}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"{path}:1" in err and "NaN" in err
    assert main(["memory", "-t", "1x4090", "-w", f"hf:{tmp_path}/none"]) == 2
    assert "no such file" in capsys.readouterr().err


def test_run_reports_the_config_and_its_parameters(capsys: pytest.CaptureFixture[str]
                                                   ) -> None:
    config = HF / "llama-3.2-1b" / "config.json"
    assert main(["run", "-t", "8x5090-dual-socket", "-w", f"hf:{config}", "-s", "fsdp",
                 "--no-ranges", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["config_files"] == {"hf": str(config), "parameters": 1_235_814_400,
                                      "trainable_parameters": 1_235_814_400}
    assert report["workload"] == "llama-3.2-1b" and report["step_time_s"] > 0


def test_a_warning_shows_once_however_often_the_file_is_read(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path, "llama-3.2-1b", made_up_key=1)
    assert main(["memory", "-t", "1x4090", "-w", f"hf:{path}", "--micro-batch", "64"]) == 0
    assert capsys.readouterr().err.count("made_up_key: warning") == 1  # hints rebuild the job
