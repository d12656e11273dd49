"""Model families read from Hugging Face configs (inputs/hf_decoders.py, inputs/hf_vision.py):
parameter counts against the model cards, and the mechanisms each family adds."""

import json
from pathlib import Path

import pytest

from simulator.errors import InputError
from simulator.inputs import hf_config
from simulator.job import attention
from simulator.job.workload import Job

HF = Path(__file__).parent / "fixtures" / "hf"


def job(name: str, **training: object) -> Job:
    workload = hf_config.load(f"hf:{HF / name}")
    if training:
        workload = workload.with_training(**training)
    return Job.from_config(workload)


# (folder, exact count, model card's count, the card's rounding)
CARDS = [
    ("phi-3-mini-4k", 3_821_079_552, 3.8e9, 0.05e9),  # microsoft/Phi-3-mini-4k-instruct "3.8B"
    ("gemma-2-9b", 9_241_705_984, 9.24e9, 0.005e9),  # google/gemma-2-9b: 9.24B on the Hub
    ("gemma-3-1b", 999_885_952, 1.0e9, 0.005e9),  # google/gemma-3-1b-it: "1B"
    ("llava-1.5-7b", 7_063_427_072, 7.06e9, 0.005e9),  # llava-hf/llava-1.5-7b-hf: 7.06B
    ("qwen2-vl-7b", 8_291_375_616, 8.29e9, 0.005e9),  # Qwen/Qwen2-VL-7B-Instruct: 8.29B
]


@pytest.mark.parametrize(("name", "exact", "card", "digits"), CARDS)
def test_counts_match_the_model_cards(name: str, exact: int, card: float,
                                      digits: float) -> None:
    j = job(name)
    assert j.n_params == exact
    assert j.n_params == pytest.approx(card, abs=digits)


def test_gemma_7b_head_dim_is_not_hidden_over_heads(tmp_path: Path) -> None:
    """google/gemma-7b: 16 heads of 256 on a 3072-wide model; "8.54B" on the Hub."""
    data = json.loads((HF / "gemma-2b" / "config.json").read_text())
    data.update(hidden_size=3072, num_attention_heads=16, num_key_value_heads=16,
                num_hidden_layers=28, intermediate_size=24576)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    j = Job.from_config(hf_config.load(f"hf:{path}"))
    assert j.n_params == 8_537_680_896
    q = next(m for m in j.modules if m.path.endswith("layers.0.self_attn.q_proj"))
    assert q.out_features == 16 * 256


def test_phi3_fuses_qkv_and_gate_up() -> None:
    j = job("phi-3-mini-4k")
    names = [m.path for m in j.modules if m.block == 0]
    assert names[:4] == ["model.layers.0.self_attn.qkv_proj", "model.layers.0.self_attn.o_proj",
                         "model.layers.0.mlp.gate_up_proj", "model.layers.0.mlp.down_proj"]
    assert j.arch is not None and j.arch.window(0) == 2047  # every layer local


def test_gemma2_alternates_windows_caps_logits_and_trains_with_eager_attention() -> None:
    j = job("gemma-2-9b", seq_len=8192, micro_batch=1)
    a = j.arch
    assert a is not None and a.window(0) == 4096 and a.window(1) is None
    assert j.training.attention == "eager"  # transformers' advice for Gemma 2
    names = [k.name for op in j.ops("forward") if op.name == "lm_head" for k in op.kernels]
    assert {"softcap_div", "tanh", "softcap_mul"} <= set(names)
    attn = [op for op in j.ops("forward") if op.name == "layers.0.attention"][0]
    assert any(k.name == "softcap.tanh" for k in attn.kernels)
    sandwich = [m.path for m in j.modules if m.block == 0 and m.kind == "norm"]
    assert len(sandwich) == 4


def test_a_window_cuts_attention_flops_past_it() -> None:
    full = attention.flash(1, 8192, 4096, 4096, 2, causal=True, backward=False)
    local = attention.flash(1, 8192, 4096, 4096, 2, causal=True, backward=False, window=4096)
    short = attention.flash(1, 4096, 4096, 4096, 2, causal=True, backward=False, window=4096)
    assert local.flops / full.flops == pytest.approx((2 * 4096 * 8192 - 4096**2) / 8192**2)
    assert short.flops == attention.flash(1, 4096, 4096, 4096, 2, causal=True,
                                          backward=False).flops


def test_gemma3_local_blocks_five_to_one() -> None:
    a = job("gemma-3-1b").arch
    assert a is not None and a.qk_norm
    assert [b for b in range(12) if a.window(b) is None] == [5, 11]


def test_vision_tower_runs_forward_only_and_stays_frozen() -> None:
    j = job("llava-1.5-7b", finetune="full")
    vision_params = [p for p in j.params if p.name.startswith("vision_tower.")]
    assert vision_params and not any(p.trainable for p in vision_params)
    assert all(p.trainable for p in j.params if p.name.startswith("multi_modal_projector."))
    fwd = [op for op in j.ops("forward") if op.name == "vision"][0]
    assert sum(k.kind == "attention_fwd" for k in fwd.kernels) == 24
    bwd = [op for op in j.ops("backward") if op.name == "vision"][0]
    assert all("vision_tower" not in k.name for k in bwd.kernels)
    assert len([k for k in bwd.kernels if k.kind == "gemm"]) == 4  # the projector's two


@pytest.mark.parametrize(("changes", "key", "words"), [
    ({"model_type": "gemma3"}, "vision_config", "SigLIP vision tower is not modelled"),
    ({"model_type": "mllama"}, "text_config.cross_attention_layers", "cross-attention"),
    ({"vision_config": None}, "vision_config", "without its vision_config"),
    ({"model_type": "t5"}, "model_type", "known: llama, mistral"),
])
def test_what_is_not_modelled_is_one_line(tmp_path: Path, changes: dict, key: str,
                                          words: str) -> None:
    data = json.loads((HF / "llava-1.5-7b" / "config.json").read_text())
    data.update(changes)
    data = {k: v for k, v in data.items() if v is not None}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    with pytest.raises(InputError) as err:
        hf_config.load(f"hf:{path}")
    line = str(err.value)
    assert "\n" not in line and key in line and words in line
