"""GPT-2's python GELU (transformers NewGELUActivation) under torch.autocast: fp32 from pow on
(simulator/job/eager.py _gelu_new_autocast)."""

from __future__ import annotations

import pytest

from simulator.api import RunSpec, job_of
from simulator.job import eager
from simulator.job.kernels import BlockShape

SHAPE = BlockShape(tokens=1000, hidden=8, kv_dim=8, ffn=32, heads=1, e=2)


def test_gelu_new_under_autocast_moves_76_and_118_bytes_per_element() -> None:
    """Forward: 0.5*x (2+2), cast (2+4), pow, *c1, +x (2+4+4), *c2, tanh, +1, mul (2+4+4), the
    down projection's cast (4+2); backward: fifteen passes, four of them casts."""
    mb = eager.activation(SHAPE, "gelu", gelu="python", autocast=True)
    n = SHAPE.n_f
    assert len(mb.forward) == 10 and mb.forward_bytes == pytest.approx(76 * n)
    assert len(mb.backward) == 15 and mb.backward_bytes == pytest.approx(118 * n)
    assert mb.saved_per_token == 14 * SHAPE.ffn  # fp32 x, fp32 tanh, 16-bit 0.5x, fp32 1+tanh


def test_without_autocast_gelu_new_stays_in_its_own_dtype() -> None:
    half = eager.activation(SHAPE, "gelu", gelu="python", autocast=False)
    assert half.forward_bytes == pytest.approx(36 * SHAPE.n_f)  # eight 16-bit passes
    fp32 = BlockShape(1000, 8, 8, 32, 1, e=4)  # fp32 training: no casts, autocast or not
    assert eager.activation(fp32, "gelu", gelu="python", autocast=True) == \
        eager.activation(fp32, "gelu", gelu="python")


def test_the_hf_gpt2_job_runs_the_autocast_gelu_and_megatron_its_fused_one() -> None:
    hf = job_of(RunSpec("2x3090ti-nvlink", "gpt2-medium", "ddp", gpus=1, framework="hf",
                        micro_batch=2))
    (act,) = [op for op in hf.ops("forward", autocast=True) if op.name == "layers.0.mlp_act"]
    assert act.bytes == pytest.approx(76 * hf.tokens_per_micro_batch * hf.arch.ffn_hidden)
    megatron = job_of(RunSpec("2x3090ti-nvlink", "gpt2-medium", "ddp", gpus=1))
    (fused,) = [op for op in megatron.ops("forward") if op.name == "layers.0.mlp_act"]
    assert [k.name for k in fused.kernels] == ["bias_gelu"]
