"""Mixtures of experts (job/moe.py, inputs/hf_decoders.py): parameter totals and active counts
against the model cards, transformers' module layout, and the experts' kernels."""

from pathlib import Path

import pytest

from simulator.cli import main
from simulator.inputs import hf_config
from simulator.job import moe
from simulator.job.workload import Job

HF = Path(__file__).parent / "fixtures" / "hf"
PEFT = Path(__file__).parent / "fixtures" / "peft"


def job(name: str, **training: object) -> Job:
    workload = hf_config.load(f"hf:{HF / name}")
    if training:
        workload = workload.with_training(**training)
    return Job.from_config(workload)


# (folder, exact total, model card's total, card's active, how the card rounds)
CARDS = [
    # mistralai/Mixtral-8x7B-v0.1: "46.7B parameters", 12.9B used per token (Mistral AI,
    # "Mixtral of experts", 2023-12-11)
    ("mixtral-8x7b", 46_702_792_704, 46.7e9, 12.9e9, 0.05e9),
    # Qwen/Qwen1.5-MoE-A2.7B: "14.3B parameters in total and 2.7B activated"
    ("qwen1.5-moe-a2.7b", 14_315_784_192, 14.3e9, 2.7e9, 0.05e9),
    # Qwen/Qwen3-30B-A3B: "30.5B in total and 3.3B activated"
    ("qwen3-30b-a3b", 30_532_122_624, 30.5e9, 3.3e9, 0.06e9),
]


@pytest.mark.parametrize(("name", "exact", "total", "active", "digits"), CARDS)
def test_totals_and_active_parameters_match_the_model_cards(
        name: str, exact: int, total: float, active: float, digits: float) -> None:
    j = job(name)
    assert j.n_params == exact
    assert j.n_params == pytest.approx(total, abs=digits)
    assert j.n_active == pytest.approx(active, abs=digits)


def test_deepseek_v2_lite_latent_attention_and_its_dense_first_block() -> None:
    """deepseek-ai/DeepSeek-V2-Lite: "15.7B total parameters, 2.4B activated" (the card's
    active count leaves the input embedding out: a lookup, not a multiply)."""
    j = job("deepseek-v2-lite")
    assert j.n_params == 15_706_484_224
    embedding = 102400 * 2048
    assert j.n_active - embedding == pytest.approx(2.4e9, abs=0.06e9)
    a = j.arch
    assert a is not None and not a.is_moe(0) and all(a.is_moe(b) for b in range(1, 27))
    names = [m.path for m in j.modules if m.block == 0]
    assert "model.layers.0.self_attn.q_proj" in names  # q_lora_rank null: no q_a_proj
    assert "model.layers.0.self_attn.kv_a_layernorm" in names
    assert "model.layers.0.mlp.gate_proj" in names  # dense
    moe_names = [m.path for m in j.modules if m.block == 1]
    # DeepseekV2Moe registers experts, gate, shared_experts
    first = [p for p in moe_names if ".mlp." in p]
    assert first[0].endswith("experts.0.gate_proj") and first[-1].endswith(
        "shared_experts.down_proj")
    assert "model.layers.1.mlp.gate" in first


def test_qwen3_dense_counts_head_dim_and_qk_norms() -> None:
    """Qwen/Qwen3-8B: "Number of Parameters: 8.2B; Non-Embedding: 6.95B"."""
    j = job("qwen3-8b")
    assert j.n_params == 8_190_735_360
    assert j.n_params - 2 * 151936 * 4096 == pytest.approx(6.95e9, abs=0.005e9)
    q = next(m for m in j.modules if m.path.endswith("layers.0.self_attn.q_proj"))
    assert (q.in_features, q.out_features) == (4096, 32 * 128)
    assert any(m.path.endswith("self_attn.k_norm") for m in j.modules)


def test_layouts_follow_transformers_4() -> None:
    mixtral = [m.path for m in job("mixtral-8x7b").modules if m.block == 0]
    assert mixtral[4:8] == ["model.layers.0.block_sparse_moe.gate",
                            "model.layers.0.block_sparse_moe.experts.0.w1",
                            "model.layers.0.block_sparse_moe.experts.0.w2",
                            "model.layers.0.block_sparse_moe.experts.0.w3"]
    qwen2 = [m.path for m in job("qwen1.5-moe-a2.7b").modules if m.block == 0]
    assert qwen2[-3:] == ["model.layers.0.mlp.shared_expert_gate",
                          "model.layers.0.input_layernorm",
                          "model.layers.0.post_attention_layernorm"]
    assert "model.layers.0.mlp.shared_expert.down_proj" in qwen2


def test_expert_gemms_loop_in_transformers_and_group_in_megatron() -> None:
    """The same FLOPs either way; the loop launches each expert's kernels."""
    loop = job("qwen1.5-moe-a2.7b")
    grouped = job("qwen1.5-moe-a2.7b", framework="megatron")
    assert loop.recipe.expert_gemms == "loop" and grouped.recipe.expert_gemms == "grouped"

    def experts(j: Job) -> list:
        return [op for op in j.ops("forward") if op.name == "layers.0.experts"][0]

    a, b = experts(loop), experts(grouped)
    gemm_flops = [sum(k.flops for k in op.kernels if k.kind == "gemm") for op in (a, b)]
    T, k, h, f = loop.tokens_per_micro_batch, 4, 2048, 1408
    rows = -(-T * k // 60)  # rows per expert, rounded up as the loop's shapes are
    assert gemm_flops[0] == pytest.approx(2 * rows * 60 * 3 * h * f)
    assert gemm_flops[1] == pytest.approx(2 * rows * 60 * 3 * h * f)
    assert sum(kk.kind == "gemm" for kk in a.kernels) == 60 * 3
    assert sum(kk.kind == "gemm" for kk in b.kernels) == 3


def test_model_flops_count_the_routed_experts_only() -> None:
    j = job("mixtral-8x7b")
    T = j.tokens_per_micro_batch
    dense_like = 6 * T * (j.n_params - 2 * 32000 * 4096) + 6 * T * 32000 * 4096
    assert j.model_flops_per_step() < dense_like * 0.4  # 2 of 8 experts


def test_rank_load_one_hot_expert() -> None:
    shape = moe.MoeShape(experts=8, top_k=2, ffn=14336)
    assert moe.rank_load(shape, 1, 2.0) == 1.0  # one GPU: the loop's total rows
    assert moe.rank_load(shape, 8, 1.0) == 1.0
    assert moe.rank_load(shape, 8, 2.0) == 2.0  # one expert per rank: the hot one's rank
    assert moe.rank_load(shape, 4, 2.0) == pytest.approx(1.5)  # (1 + 2) / 2


def test_lora_on_every_expert_is_what_peft_wraps() -> None:
    from simulator.inputs.peft_config import apply as apply_peft

    workload = apply_peft(hf_config.load(f"hf:{HF / 'qwen3-30b-a3b'}"),
                          str(PEFT / "qwen3-moe-lora" / "adapter_config.json"))
    j = Job.from_config(workload)
    r, h, f, q, kv, layers = 8, 2048, 768, 4096, 512, 48
    attention = r * (h + q) + 2 * r * (h + kv) + r * (q + h)
    experts = 128 * (2 * r * (h + f) + r * (f + h))
    assert j.n_trainable == layers * (attention + experts)


def test_memory_command_shows_the_active_count(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["memory", "-t", "4x5090", "-w", f"hf:{HF / 'qwen3-30b-a3b'}", "--peft",
                 str(PEFT / "qwen3-moe-lora" / "adapter_config.json"), "-s", "zero3",
                 "--checkpointing", "full"]) in (0, 1)
    out = capsys.readouterr().out
    assert "active per token: 8 of 128 experts" in out
