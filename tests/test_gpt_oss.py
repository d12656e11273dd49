"""gpt-oss (model_type gpt_oss): its parameters against the model card, transformers' layout
(modeling_gpt_oss.py), its eager attention with sinks, the clamped SwiGLU of its experts, and
the gradients of its fused expert tensors in transformers' loop."""

from __future__ import annotations

from pathlib import Path

import pytest

from simulator.cli import main
from simulator.inputs import hf_config
from simulator.inputs.schema import LoraConfig
from simulator.job import attention, moe
from simulator.job.workload import Job

CONFIG = Path(__file__).parent / "fixtures" / "hf" / "gpt-oss-20b"
H, F, E, HEADS, KV, D, VOCAB, LAYERS = 2880, 2880, 32, 64, 8, 64, 201088, 24


def job(**training: object) -> Job:
    workload = hf_config.load(f"hf:{CONFIG}")
    if training:
        workload = workload.with_training(**training)
    return Job.from_config(workload)


def test_parameters_are_the_model_cards(capsys: pytest.CaptureFixture[str]) -> None:
    """openai/gpt-oss-20b: "21B parameters with 3.6B active parameters"; the active count
    leaves the input embedding out (a lookup, not a multiply)."""
    j = job()
    attn = H * HEADS * D + HEADS * D + 2 * (H * KV * D + KV * D) + HEADS * D * H + H + HEADS
    experts = E * (H * 2 * F + 2 * F + F * H + H)
    layer = attn + (H * E + E) + experts + 2 * H
    assert j.n_params == LAYERS * layer + 2 * VOCAB * H + H == 20_914_757_184
    assert j.n_active - VOCAB * H == pytest.approx(3.6e9, abs=0.05e9)
    warnings = capsys.readouterr().err.strip().splitlines()
    assert len(warnings) == 1 and "quantization_config: warning: MXFP4 experts" in warnings[0]


def test_the_layout_is_transformers() -> None:
    j = job()
    block = [m for m in j.modules if m.block == 0]
    assert [m.leaf for m in block[:8]] == ["q_proj", "k_proj", "v_proj", "o_proj", "sinks",
                                           "router", "gate_up_proj", "down_proj"]
    assert all(m.bias for m in block if m.kind == "linear")  # attention_bias, experts, router
    gate_up = block[6]
    assert (gate_up.in_features, gate_up.out_features) == (H, 2 * F)
    a = j.arch
    assert a is not None and a.attention_sinks and a.sliding_window == 128
    assert a.local_layers == tuple(range(0, LAYERS, 2))  # layer_types: sliding, full, ...
    assert j.recipe.attention == "eager"  # _supports_sdpa = False


def test_sdpa_and_flash_attn_2_take_no_sinks(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["run", "-w", f"hf:{CONFIG}", "-s", "fsdp", "--seq-len", "512", "--micro-batch", "1",
            "--checkpointing", "full", "--no-ranges"]
    assert main([*base, "-t", "8xh100-nvswitch", "--attention", "sdpa"]) == 2
    assert "--attention sdpa: attention sdpa takes no attention sinks" in \
        capsys.readouterr().err
    assert main([*base, "-t", "8xa100-nvswitch", "--attention", "flash3"]) == 2
    assert "is the Hopper (sm90) kernel of kernels-community/vllm-flash-attn3" in \
        capsys.readouterr().err
    assert main([*base, "-t", "8xh100-nvswitch", "--attention", "flash3"]) == 0
    assert "attention kernel flash3" in capsys.readouterr().out


def test_eager_attention_with_sinks_byte_by_byte() -> None:
    """modeling_gpt_oss.py eager_attention_forward in bf16: scale, mask, cat the sinks, the
    row max subtracted, softmax in the scores' dtype, the sink column sliced off."""
    chain = attention.eager_chain("gpt_oss", e=2, autocast=False, dropout=False)
    assert [p.name for p in chain.forward] == ["mul_scaling", "add_attention_mask", "cat_sinks",
                                               "amax", "sub_max", "softmax"]
    assert chain.forward_bytes == 4 + 4 + 4 + 2 + 4 + 4
    # slice_backward (fill, copy), softmax's, the max's (its sum, a fill), the two summed, scale
    assert chain.backward_bytes == 2 + 4 + 6 + 2 + 2 + 6 + 4
    assert chain.saved == 2  # softmax's output, which P V reads through the slice
    amp = attention.eager_chain("gpt_oss", e=2, autocast=True, dropout=False)
    assert amp.forward[-1].name == "to_value_dtype" and amp.saved == 4 + 2
    assert job().eager_chain == amp  # HF's default bf16: autocast over fp32 parameters
    assert job(precision="pure-bf16").eager_chain == chain


def test_clamped_swiglu_op_by_op_and_fused_when_compiled() -> None:
    act = moe.clamped_swiglu(1000, 2, F)
    assert len(act.forward) == 7 and len(act.backward) == 14
    assert act.saved_per_token == 6 * 2 * F  # gate_up, the clamped gate, sigmoid, up + 1, glu
    assert sum(k.bytes for k in act.forward) == 1000 * 2 * (3 + 3 + 2 + 2 + 3 + 2 + 3)

    def forward_kernels(j: Job) -> list[str]:
        return [k.name for op in j.ops("forward") if op.name == "layers.0.experts"
                for k in op.kernels]

    assert "clamped_swiglu.sigmoid" in forward_kernels(job(seq_len=256, micro_batch=1))
    assert not any("clamped" in k for k in forward_kernels(
        job(seq_len=256, micro_batch=1, kernels="compiled")))


def _select(j: Job) -> list:
    return [k for op in j.ops("backward") if op.name == "layers.0.experts"
            for k in op.kernels if k.name.startswith("select_backward")]


def test_a_trained_fused_expert_tensor_gets_a_whole_gradient_per_expert() -> None:
    """ATen select_backward: each expert's slice comes back inside a zero-filled tensor of
    all the experts, and autograd adds those E tensors up."""
    full = _select(job(seq_len=256, micro_batch=1))
    whole = E * (3 * H * F + 2 * F + H) * 2  # bf16: the compute copy the forward indexed
    assert sum(k.bytes for k in full) == pytest.approx(
        E * (whole + whole / E) + (E - 1) * 3 * whole)
    assert _select(job(seq_len=256, micro_batch=1, finetune="lora")) == []  # frozen experts
    assert _select(job(seq_len=256, micro_batch=1, expert_gemms="grouped")) == []


def test_lora_all_linear_reaches_attention_only() -> None:
    """PEFT's target_modules match nn.Linear modules; gpt-oss's router and experts are
    parameters of their own modules (target_parameters reaches those, not modelled)."""
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_up_proj", "down_proj"]
    j = job(finetune="lora", lora=LoraConfig(rank=8, alpha=16, targets=targets))
    wrapped = {m.leaf for m in j.modules if m.lora}
    assert wrapped == {"q_proj", "k_proj", "v_proj", "o_proj"}
    r = 8
    per_layer = r * (H + HEADS * D) + 2 * r * (H + KV * D) + r * (HEADS * D + H)
    assert j.n_trainable == LAYERS * per_layer


def test_the_preset_is_the_published_config_with_the_cookbooks_training() -> None:
    from simulator.inputs.config import load_workload

    preset = load_workload("gpt-oss-20b-lora")
    full = Job.from_config(preset.with_training(finetune="full", lora=None))
    assert full.arch == job().arch and full.n_params == 20_914_757_184
    t = preset.training
    assert (t.seq_len, t.micro_batch, t.grad_accum, t.attention) == (2048, 4, 4, "eager")
    lora = Job.from_config(preset)
    assert {m.leaf for m in lora.modules if m.lora} == {"q_proj", "k_proj", "v_proj", "o_proj"}
