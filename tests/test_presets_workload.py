"""Every bundled workload preset against the parameter count its model card publishes."""

import pytest

from simulator.inputs.config import load_workload, preset_names
from simulator.job.workload import Job

# Published totals (model cards / `sum(p.numel() for p in model.parameters())` of the HF model).
PUBLISHED = {
    "gpt2-medium": 354_823_168,  # HF count, wpe included, lm_head tied
    "llama3.2-1b": 1_235_814_400,
    "llama2-7b": 6_738_415_616,
    "llama3-8b": 8_030_261_248,
    "llama2-13b": 13_015_864_320,
    "qwen2.5-14b": 14_770_033_664,
    "llama2-70b": 68_976_648_192,
    "mpt-7b": 6_649_286_656,
}
# LoRA presets: the base model's count plus the adapters (rank 16, seven linear layers).
LORA_BASE = {"llama2-7b-lora": "llama2-7b", "llama2-7b-qlora": "llama2-7b",
             "llama2-70b-qlora": "llama2-70b"}


def test_every_preset_is_checked() -> None:
    assert set(preset_names("workloads")) >= set(PUBLISHED) | set(LORA_BASE)


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_parameter_total_matches_model_card(name: str) -> None:
    job = Job.from_config(load_workload(name))
    assert job.n_params == PUBLISHED[name]
    assert job.n_trainable == PUBLISHED[name]


@pytest.mark.parametrize("name", sorted(LORA_BASE))
def test_lora_presets_freeze_the_base(name: str) -> None:
    job = Job.from_config(load_workload(name))
    base = PUBLISHED[LORA_BASE[name]]
    assert job.n_params - job.n_trainable == base
    assert 0 < job.n_trainable < 0.01 * base


@pytest.mark.parametrize("name", preset_names("workloads"))
def test_preset_names_its_source(name: str) -> None:
    cfg = load_workload(name)
    assert cfg.name == name
    assert "huggingface.co" in cfg.source or "arXiv" in cfg.source
    assert cfg.description
