"""Eager attention by dtype flow (simulator/job/attention.py eager_chain), apex amp O2 and
apex DDP (training.amp, training.ddp)."""

from __future__ import annotations

import pytest

from simulator.api import RunSpec, job_of, simulate
from simulator.engine.program import Comm, Compute
from simulator.job.attention import eager_chain
from simulator.memory.estimate import recipe
from simulator.strategies import ddp


def test_hf_gpt2_under_autocast_moves_33_and_37_bytes_per_score() -> None:
    """div, where, add of the fp32 mask (promotes), fp32 softmax, cast back, dropout."""
    chain = eager_chain("gpt2", e=2, autocast=True, dropout=True)
    assert [p.name for p in chain.forward] == ["div_scale", "where_causal_mask",
                                               "add_attention_mask", "softmax",
                                               "to_value_dtype", "dropout"]
    assert chain.forward_bytes == 33 and chain.backward_bytes == 37
    assert chain.saved == 4 + 1 + 2  # fp32 softmax output, dropout mask, 16-bit probabilities


def test_hf_bert_under_autocast_and_under_apex_o2() -> None:
    autocast = eager_chain("bert", e=2, autocast=True, dropout=True)
    assert (autocast.forward_bytes, autocast.backward_bytes, autocast.saved) == (33, 37, 7)
    assert autocast.forward[-1].name == "autocast_probs_to_16bit"
    half = eager_chain("bert", e=2, autocast=False, dropout=True)  # apex O2: all fp16
    assert (half.forward_bytes, half.backward_bytes, half.saved) == (17, 15, 5)


def test_megatron_fused_softmax_and_llama_without_dropout() -> None:
    fused = eager_chain("fused", e=2, autocast=False, dropout=True)
    assert (fused.forward_bytes, fused.backward_bytes, fused.saved) == (9, 11, 5)
    llama = eager_chain("llama", e=2, autocast=True, dropout=False)
    assert [p.name for p in llama.forward][-1] == "to_value_dtype"  # no dropout kernel at p=0
    assert (llama.forward_bytes, llama.saved) == (24, 6)
    fp32 = eager_chain("gpt2", e=4, autocast=False, dropout=True)
    assert all(p.reads >= 4 for p in fp32.forward)


def test_the_job_picks_the_chain_of_its_family_and_regime() -> None:
    spec = RunSpec("2x3090ti-nvlink", "gpt2-medium", "ddp", gpus=1, framework="hf",
                   kernels="eager", precision="fp16", attention="eager", micro_batch=2)
    job = job_of(spec)
    (attn,) = [op for op in job.ops("forward", autocast=True) if op.name == "layers.0.attention"]
    scores = job.micro_batch * job.heads * job.seq_len ** 2
    passes = {k.name: k.bytes for k in attn.kernels if k.kind == "memory"
              and not k.name.startswith("matmul_reshape_copy")}
    assert sum(passes.values()) == pytest.approx(33 * scores)
    megatron = job_of(RunSpec("2x3090ti-nvlink", "gpt2-medium", "ddp", gpus=1))
    assert megatron.eager_chain.forward_bytes == 9


def test_amp_o2_holds_a_16bit_model_beside_fp32_master_state() -> None:
    r = recipe("ddp", "fp16", "adamw", "fused", amp_o2=True)
    assert (r.weight, r.grad, r.weight + r.grad + r.optimizer) == (2, 2, 20)
    job = job_of(RunSpec("8xh100-nvswitch", "bert-large-squad", "ddp", gpus=2))
    assert job.recipe.amp_o2 and not job.recipe.autocast and job.grad_bytes == 2
    names = [k.name for op in job.optimizer_ops() for k in op.kernels]
    assert names[0] == "amp_o2.model_grads_to_master" and names[-1] == "amp_o2.master_to_model"


def test_apex_ddp_buckets_hold_ten_million_elements_on_its_own_stream() -> None:
    result = simulate(RunSpec("8xh100-nvswitch", "bert-large-squad", "ddp", gpus=2),
                      baseline=False)
    (program,) = result.programs
    comms = [t for t in program.tasks if isinstance(t.work, Comm)]
    sizes = [t.work.nbytes for t in comms]
    assert max(sizes) >= ddp.APEX_MESSAGE_SIZE * 2  # fp16 gradients, full buckets first
    assert all(s >= ddp.APEX_MESSAGE_SIZE * 2 for s in sizes[:-1])
    side = [t for t in program.tasks if t.stream == "nccl" and isinstance(t.work, Compute)]
    assert len(side) == 2 * len(comms)  # flatten before, average and copy back after
    assert not any(t.work.name.endswith("ddp_hook") for t in program.tasks
                   if isinstance(t.work, Compute))


def test_apex_keys_outside_ddp_are_refused() -> None:
    from simulator.errors import InputError

    with pytest.raises(InputError, match="amp o2"):
        simulate(RunSpec("8xh100-nvswitch", "bert-large-squad", "fsdp", gpus=2),
                 baseline=False)
