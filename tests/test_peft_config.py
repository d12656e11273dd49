"""`--peft adapter_config.json`: the LoRA of a PEFT file, counted as PEFT counts it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simulator import api
from simulator.errors import InputError
from simulator.inputs.config import load_workload
from simulator.inputs.peft_config import apply
from simulator.job.workload import Job

FIXTURES = Path(__file__).resolve().parent / "fixtures"
ADAPTER = FIXTURES / "peft" / "adapter_config.json"
LLAMA8B = f"hf:{FIXTURES / 'hf' / 'llama-3.1-8b'}"


def test_rank_alpha_and_targets_are_the_files() -> None:
    workload = apply(load_workload(LLAMA8B), str(ADAPTER))
    t = workload.training
    assert t.finetune == "lora" and t.lora is not None
    assert (t.lora.rank, t.lora.alpha) == (16, 32)
    assert set(t.lora.targets) == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                   "up_proj", "down_proj"}


def test_trainable_parameters_are_pefts() -> None:
    # peft 0.21.2 get_peft_model on Llama 3.1 8B with this file: "trainable params:
    # 41,943,040 || all params: 8,072,204,288" (tests/fixtures/hf/README.md)
    job = Job.from_config(apply(load_workload(LLAMA8B), str(ADAPTER)))
    assert job.n_trainable == 41_943_040 and job.n_params == 8_072_204_288
    per_layer = 16 * (4096 + 4096) * 2 + 16 * (4096 + 1024) * 2 + 16 * (4096 + 14336) * 3
    assert job.n_trainable == 32 * per_layer  # r x (in + out) per adapted linear layer


def test_four_bit_makes_qlora_with_checkpointing() -> None:
    t = apply(load_workload(LLAMA8B), str(ADAPTER), four_bit=True).training
    assert t.finetune == "qlora" and t.activation_checkpointing == "full"
    job = api.job_of(api.RunSpec("1x4090", LLAMA8B, peft=str(ADAPTER), load_in_4bit=True,
                                 checkpointing="selective"))
    assert job.finetune == "qlora" and job.checkpointing == "selective"  # the flag wins


def _adapter(tmp_path: Path, **changes: object) -> Path:
    data = json.loads(ADAPTER.read_text())
    data.update(changes)
    path = tmp_path / "adapter_config.json"
    path.write_text(json.dumps(data, indent=2))
    return path


def test_default_and_all_linear_targets_are_pefts(tmp_path: Path) -> None:
    # peft utils/constants.py: llama -> q_proj, v_proj; gpt2 -> c_attn
    llama = apply(load_workload(LLAMA8B), str(_adapter(tmp_path, target_modules=None)))
    assert llama.training.lora is not None and llama.training.lora.targets == ["q_proj", "v_proj"]
    gpt2 = apply(load_workload("gpt2-medium"), str(_adapter(tmp_path, target_modules=None)))
    assert gpt2.training.lora is not None and gpt2.training.lora.targets == ["c_attn"]
    every = apply(load_workload("gpt2-medium"),
                  str(_adapter(tmp_path, target_modules="all-linear")))
    assert every.training.lora is not None
    assert every.training.lora.targets == ["c_attn", "c_proj", "c_fc"]


def test_unmatched_targets_and_unknown_keys_are_warned(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _adapter(tmp_path, target_modules=["q_proj", "lm_head"], made_up=True,
                    use_dora=True)
    lora = apply(load_workload(LLAMA8B), str(path)).training.lora
    assert lora is not None and lora.targets == ["q_proj"]
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 3 and all(line.startswith(f"{path}:") for line in lines)
    assert any("made_up: warning: unknown key" in line for line in lines)
    assert any("target_modules[1]: warning: 'lm_head'" in line for line in lines)
    assert any("use_dora: warning: DoRA" in line for line in lines)


@pytest.mark.parametrize(("changes", "key", "words"), [
    ({"r": "16"}, "r", 'expected an integer, got "16"'),
    ({"r": 0}, "r", "must be at least 1"),
    ({"lora_alpha": -1}, "lora_alpha", "must be positive"),
    ({"target_modules": ".*proj"}, "target_modules", "regular expression"),
    ({"target_modules": ["wte"]}, "target_modules", "no target matches"),
    ({"peft_type": "PREFIX_TUNING"}, "peft_type", "only LoRA adapters"),
])
def test_bad_adapter_configs_are_one_line(tmp_path: Path, changes: dict[str, object],
                                          key: str, words: str) -> None:
    path = _adapter(tmp_path, **changes)
    with pytest.raises(InputError) as err:
        apply(load_workload(LLAMA8B), str(path))
    line = next(i for i, text in enumerate(path.read_text().splitlines(), 1)
                if f'"{key}"' in text)
    assert (err.value.file, err.value.line, err.value.key) == (str(path), line, key)
    assert words in err.value.message


def test_load_in_4bit_needs_adapters() -> None:
    with pytest.raises(InputError, match="--load-in-4bit trains LoRA adapters"):
        api.job_of(api.RunSpec("1x4090", "llama2-7b", load_in_4bit=True))
