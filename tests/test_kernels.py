"""Kernel regimes: one Llama block's bytes against hand counts from the cited code, the order
of the regimes, and activation checkpointing's save lists."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.catalog.gpus import gpu
from simulator.inputs.config import load_workload
from simulator.inputs.schema import WorkloadConfig
from simulator.job import checkpointing, compute
from simulator.job.transformer_ops import builder
from simulator.job.workload import Job
from simulator.memory.activations import activations_per_token


def llama(**training: object) -> Job:
    """Llama 3 8B; without checkpointing unless asked (the preset checkpoints fully)."""
    training.setdefault("activation_checkpointing", "none")
    return Job.from_config(load_workload("llama3-8b").with_training(**training))


def op_bytes(job: Job, op: str, phase: str) -> float:
    bld = builder(job)
    kernels = bld.forward(1, op) if phase == "forward" else bld.backward(1, op)
    return sum(k.bytes for k in kernels if k.kind == "memory")


T, H, KV, F = 8192, 4096, 1024, 14336  # llama3-8b, one sequence of 8192


# Bytes per element moved by each block op's memory-bound kernels, counted by hand from the
# cited source (see the module docstrings of eager.py, compiled.py, fused.py).
@pytest.mark.parametrize(("kernels", "op", "forward", "backward"), [
    # LlamaRMSNorm: to fp32 (2+4), pow (8), mean (4), x*rsqrt (8), to bf16 (4+2), *weight (4);
    # backward 84 (autograd of each op, see eager.norm)
    ("eager", "attn_norm", 36 * T * H, 84 * T * H),
    # rotate_half on q and k (5 kernels, 10 bytes a element; backward 15), repeat_kv of K and V
    ("eager", "qkv", 20 * T * (H + KV) + 2 * 2 * T * (H + KV),
     30 * T * (H + KV) + 2 * 2 * T * (H + KV) + 2 * 6 * T * H),  # + two dX adds of q/k/v
    # silu (4) and mul (6); backward two muls and silu_backward (6 each)
    ("eager", "mlp_act", 10 * T * F, 18 * T * F),
    ("eager", "mlp_out", 6 * T * H, 6 * T * H),  # residual add; grads meet in one add
    # Inductor: the residual add folded into the MLP norm (reads x and the branch, writes both)
    ("compiled", "mlp_norm", 8 * T * H, 12 * T * H),
    ("compiled", "attn_norm", 4 * T * H, 12 * T * H),
    ("compiled", "mlp_act", 6 * T * F, 10 * T * F),
    ("compiled", "attn_out", 0, 0),
    ("compiled", "mlp_out", 6 * T * H, 0),  # the block's last add does not cross the boundary
    ("fused", "attn_norm", 8 * T * H, 8 * T * H),  # the previous block's residual folded in
    ("fused", "qkv", 4 * T * (H + KV), 4 * T * (H + KV)),  # fused rope, no repeat, one GEMM
    ("fused", "mlp_act", 6 * T * F, 10 * T * F),
    ("fused", "mlp_out", 0, 0),
])
def test_llama_block_bytes_match_the_hand_count(kernels: str, op: str, forward: float,
                                                backward: float) -> None:
    job = llama(kernels=kernels, framework="hf")
    assert op_bytes(job, op, "forward") == pytest.approx(forward)
    assert op_bytes(job, op, "backward") == pytest.approx(backward)


def test_rotary_styles_follow_their_frameworks() -> None:
    q = T * (H + KV)
    # torchtitan: float (6), complex multiply (8), type_as (6)
    assert op_bytes(llama(framework="torchtitan"), "qkv", "forward") == pytest.approx(
        20 * q + 2 * 2 * T * (H + KV))
    # torchtune: float (6), four half-size products (16), sub and add (12), stack (8), cast (6)
    assert op_bytes(llama(framework="torchtune"), "qkv", "forward") == pytest.approx(
        48 * q + 2 * 2 * T * (H + KV))


def step_time(job: Job, name: str = "h100-sxm") -> float:
    g = gpu(name)
    return sum(compute.op_time(op, g) for op in job.forward_ops() + job.backward_ops())


@settings(max_examples=20, deadline=None)
@given(layers=st.integers(1, 4), hidden=st.sampled_from([1024, 2048, 4096]),
       heads=st.sampled_from([8, 16, 32]), kv=st.sampled_from([1, 2, 8]),
       ffn=st.sampled_from([2816, 5632, 11008]), seq=st.sampled_from([512, 2048]),
       family=st.sampled_from(["llama", "gpt2", "mpt"]), name=st.sampled_from(
           ["h100-sxm", "rtx4090", "a100-sxm4-80gb"]))
def test_fused_and_compiled_are_never_slower_than_eager(
        layers: int, hidden: int, heads: int, kv: int, ffn: int, seq: int, family: str,
        name: str) -> None:
    model = {"family": family, "layers": layers, "hidden": hidden, "heads": heads,
             "ffn_hidden": ffn, "vocab": 32000}
    if family == "llama":
        model["kv_heads"] = heads // kv
    times = []
    for kernels in ("eager", "compiled", "fused"):
        cfg = WorkloadConfig.from_data({"name": "x", "model": model, "training": {
            "seq_len": seq, "kernels": kernels}})
        times.append(step_time(Job.from_config(cfg), name))
    # (compiled may beat fused: it compiles the loss too, the fused stacks keep their own)
    assert times[2] <= times[0] and times[1] <= times[0]


def test_op_policy_saves_every_other_matmul_and_attention_like_torchtitan() -> None:
    bld = builder(llama(framework="torchtitan"))
    kernels = [(op, k) for op in bld.block_ops for k in bld.forward(0, op)]
    saves = checkpointing.op_policy_saves([k for _, k in kernels])
    mms = [(op, saved) for (op, k), saved in zip(kernels, saves, strict=True) if k.name == "mm"]
    # wq, wk, wv, wo, w1 (gate), w3 (up), w2 (down): odd counts saved
    assert mms == [("qkv", True), ("qkv", False), ("qkv", True), ("attn_out", False),
                   ("mlp_in", True), ("mlp_in", False), ("mlp_out", True)]
    assert [op for (op, k), s in zip(kernels, saves, strict=True)
            if s and k.kind == "attention_fwd"] == ["attention"]
    assert not any(s for (_, k), s in zip(kernels, saves, strict=True) if k.kind == "memory")


def test_op_mode_keeps_about_64_kb_per_token_per_layer_of_llama3_8b() -> None:
    # the block input, wq, wv, w1 and w2 outputs, attention output and lse
    stored, working = activations_per_token(llama(activation_checkpointing="op"))
    assert stored == pytest.approx(2 * (4 * H + KV + F) + 4 * 32)
    assert 60_000 < stored < 66_000
    assert working == pytest.approx(activations_per_token(llama())[0])


def test_op_mode_recomputes_the_other_matmuls_and_every_elementwise_op() -> None:
    job = llama(framework="torchtitan", activation_checkpointing="op")
    recompute = [op for op in job.backward_ops() if op.phase == "recompute" and op.block == 5]
    mm = [k for op in recompute for k in op.kernels if k.name == "mm"]
    assert len(mm) == 3  # wk, wo, w3
    assert not any(k.kind == "attention_fwd" for op in recompute for k in op.kernels)
    norms = [op.name for op in recompute if op.name.endswith("norm")]
    assert norms == ["layers.5.attn_norm", "layers.5.mlp_norm"]


@pytest.mark.parametrize("workload", ["llama3-8b", "llama2-7b-lora", "gpt2-medium", "mpt-7b"])
@pytest.mark.parametrize("kernels", ["eager", "compiled", "fused"])
def test_op_mode_memory_lies_between_full_and_none(workload: str, kernels: str) -> None:
    cfg = load_workload(workload).with_training(kernels=kernels)
    stored = {mode: activations_per_token(Job.from_config(cfg.with_training(
        activation_checkpointing=mode)))[0] for mode in checkpointing.MODES}
    assert stored["full"] <= stored["op"] <= stored["none"]
    assert stored["selective"] <= stored["none"]
