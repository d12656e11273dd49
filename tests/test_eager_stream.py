"""The fp32 residual stream of eager modules under torch.autocast over fp32 weights
(simulator/job/eager.py stream_norm, residual(stream=...); block_memory.stream_fp32)."""

from __future__ import annotations

import pytest

from simulator.api import RunSpec, job_of
from simulator.job import eager
from simulator.job.kernels import BlockShape

SHAPE = BlockShape(tokens=1000, hidden=8, kv_dim=8, ffn=32, heads=1, e=2)


def test_layernorm_on_the_fp32_stream_and_three_readers() -> None:
    """fp32 in and out (8 bytes), then each of q, k, v casts it (4 + 2); backward: three casts
    back (2 + 4), the fp32 dx (12) and dgamma/dbeta (8) passes."""
    mb = eager.stream_norm(SHAPE, "layernorm", consumers=3)
    n = SHAPE.n_h
    assert mb.forward_bytes == pytest.approx((8 + 3 * 6) * n)
    assert mb.backward_bytes == pytest.approx((3 * 6 + 12 + 8) * n)
    assert mb.saved_per_token == 4 * SHAPE.hidden
    # RMSNorm's own casts to fp32 and back vanish on an fp32 stream
    rms = eager.stream_norm(SHAPE, "rmsnorm", consumers=1)
    assert not any(k.name.startswith("to_") for k in rms.forward)


def test_a_16bit_branch_added_to_the_fp32_stream_promotes() -> None:
    wide = eager.residual(SHAPE, dropout=False, stream=4)
    assert wide.forward_bytes == pytest.approx((2 + 4 + 4) * SHAPE.n_h)
    assert wide.backward_bytes == pytest.approx((4 + 2 + 12) * SHAPE.n_h)  # cast back, add
    assert eager.residual(SHAPE, dropout=False, stream=2) == eager.residual(SHAPE, dropout=False)


def test_only_autocast_over_fp32_weights_in_eager_keeps_the_stream_fp32() -> None:
    spec = dict(topology="2x3090ti-nvlink", workload="gpt2-medium", strategy="ddp", gpus=1,
                micro_batch=2)
    hf = job_of(RunSpec(**spec, framework="hf"))  # type: ignore[arg-type]
    (norm,) = [op for op in hf.ops("forward", autocast=True) if op.name == "layers.0.attn_norm"]
    n = hf.tokens_per_micro_batch * hf.hidden
    assert norm.bytes == pytest.approx((8 + 6) * n)  # fp32 LayerNorm, c_attn's cast
    (plain,) = [op for op in hf.ops("forward") if op.name == "layers.0.attn_norm"]
    assert plain.bytes == pytest.approx(4 * n)  # FSDP/ZeRO's 16-bit weights: a 16-bit stream
    megatron = job_of(RunSpec(**spec))  # type: ignore[arg-type]
    (fused,) = [op for op in megatron.ops("forward", autocast=True)
                if op.name == "layers.0.attn_norm"]
    assert fused.bytes == pytest.approx(4 * n)
