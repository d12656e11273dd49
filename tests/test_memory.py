"""Memory model: ZeRO formulas, Korthikanti activations, LoRA/QLoRA, verdicts, `stepsim memory`."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.api import load_job
from simulator.catalog.gpus import gpu
from simulator.cli import main
from simulator.errors import InputError
from simulator.inputs.config import load_workload
from simulator.job.workload import Job
from simulator.memory import estimate as memory
from simulator.memory import search as memory_search
from simulator.units import GiB

RTX5090 = gpu("rtx5090")
_SMALL = Job.from_config(load_workload("llama3.2-1b"))


def job(name: str, **kw: int) -> Job:
    return Job.from_config(load_workload(name), **kw)


def states(report: memory.MemoryReport) -> int:
    return report.model_state_bytes


# --- ZeRO paper, figure 1: model states per GPU with mixed-precision Adam (K = 12) ----------

@pytest.mark.parametrize("n", [2, 4, 8, 64])
@pytest.mark.parametrize(("strategy", "formula"), [
    ("ddp", lambda p, n: 16 * p),
    ("zero1", lambda p, n: 4 * p + 12 * p / n),
    ("zero2", lambda p, n: 2 * p + 14 * p / n),
    ("zero3", lambda p, n: 16 * p / n),
    ("fsdp", lambda p, n: 16 * p / n),
])
def test_model_states_follow_the_zero_formulas(strategy: str, formula, n: int) -> None:  # type: ignore[no-untyped-def]
    j = job("llama3.2-1b")
    psi = j.n_params
    report = memory.estimate(j, RTX5090, strategy, world=n)
    assert states(report) == pytest.approx(formula(psi, n), rel=1e-9, abs=2)


def test_sgd_keeps_one_state_and_fp32_training_no_master_copy() -> None:
    cfg = load_workload("llama3.2-1b")
    sgd = Job.from_config(cfg.copy(training=cfg.training.copy(optimizer="sgd")))
    assert states(memory.estimate(sgd, RTX5090, "zero1", world=1)) == \
        pytest.approx(12 * sgd.n_params, abs=2)  # 2 + 2 + (4 master + 4 momentum)
    fp32 = Job.from_config(cfg.copy(training=cfg.training.copy(precision="fp32")))
    r = memory.estimate(fp32, RTX5090, "zero2", world=4)
    assert r.breakdown_bytes["weights"] == pytest.approx(4 * fp32.n_params, abs=2)
    assert states(r) == pytest.approx(4 * fp32.n_params + 12 * fp32.n_params / 4, abs=2)


# --- Korthikanti et al. 2022, table 2 (bytes per layer / (s b h)) ----------------------------

def gpt_job() -> Job:
    """gpt2-medium under Megatron's fused kernels: a GPT with f = 4h, dropout, MHA, exactly
    the paper's setting."""
    cfg = load_workload("gpt2-medium")
    return Job.from_config(cfg.with_training(framework="megatron"))


@pytest.mark.parametrize("t", [1, 2, 4])
def test_tensor_parallel_activations_match_korthikanti(t: int) -> None:
    j = gpt_job()
    h, a, s = j.hidden, j.heads, j.seq_len
    stored, _ = memory.activations_per_token(j, tp=t, flash_attention=False)
    assert stored == pytest.approx(h * (10 + 24 / t + 5 * a * s / (h * t)))
    sp, _ = memory.activations_per_token(j, tp=t, sequence_parallel=True,
                                         flash_attention=False)
    assert sp == pytest.approx(h / t * (34 + 5 * a * s / h))
    sel, _ = memory.activations_per_token(j, tp=t, sequence_parallel=True,
                                          flash_attention=False, checkpointing="selective")
    assert sel == pytest.approx(34 * h / t)
    full, working = memory.activations_per_token(j, tp=t, sequence_parallel=True,
                                                 flash_attention=False, checkpointing="full")
    assert full == pytest.approx(2 * h / t)
    assert working == pytest.approx(sp)


def test_flash_attention_drops_the_score_term() -> None:
    j = gpt_job()
    h, a = j.hidden, j.heads
    flash, _ = memory.activations_per_token(j, flash_attention=True)
    assert flash == pytest.approx(34 * h + 4 * a)  # only the fp32 log-sum-exp per head remains
    assert memory.activations_per_token(j, flash_attention=True, checkpointing="selective")[0] \
        == pytest.approx(34 * h)


def test_the_workload_says_which_attention_it_runs() -> None:
    eager = gpt_job()  # gpt2-medium: unfused attention, as the Megatron release it models
    assert eager.training.attention == "eager"
    assert memory.activations_per_token(eager)[0] == pytest.approx(
        memory.activations_per_token(eager, flash_attention=False)[0])


def test_peak_is_the_larger_end_of_backward_not_the_sum() -> None:
    # PyTorch frees gradients between steps: at the start of backward every activation is alive
    # and no gradient; at its end every gradient and (almost) no activation (no checkpointing:
    # a recomputed block's working set lives only during its own backward)
    cfg = load_workload("llama2-7b").with_training(activation_checkpointing="none")
    r = memory.estimate(Job.from_config(cfg), gpu("rtx5090"), "ddp", world=8)
    start, end = r.phase_total("loss_backward"), r.phase_total("backward_end")
    grads, acts = r.category_bytes("gradients"), r.category_bytes("activations")
    assert r.peak_bytes == pytest.approx(max(r.phase_total(m) for m in memory.MOMENTS))
    assert start - end == pytest.approx((acts - grads) * (1 + memory.FRAGMENTATION), rel=1e-6)


def test_the_logits_and_a_blocks_recompute_never_coexist() -> None:
    """The loss's and the head's backward free the logits before the first block's backward
    recomputes it: the timeline's peak holds one or the other, each counter its own peak."""
    full = Job.from_config(load_workload("llama2-7b").with_training(
        activation_checkpointing="full"))
    r = memory.estimate(full, gpu("rtx5090"), "ddp", world=1)
    loss = [x for x in r.lines if x.phase == "loss"]
    recompute = [x for x in r.lines if x.phase == "recompute"]
    assert loss and recompute
    assert not any(memory.alive(x, "backward") for x in loss)
    assert not any(memory.alive(x, "loss_backward") for x in recompute)
    timeline = {t["moment"]: t for t in r.timeline()}
    for counter in ("allocated", "reserved", "total"):
        assert r.peak_as(counter) == max(t[f"{counter}_bytes"] for t in timeline.values())
    assert r.peak_as("allocated") < r.peak_as("reserved") < r.peak_as("total") == r.peak_bytes
    zero = memory.estimate(job("llama2-7b"), gpu("rtx5090"), "zero2", world=8)
    # DeepSpeed keeps its gradient partitions: counted at the start of backward too
    assert zero.breakdown_bytes["gradients"] > 0


@pytest.mark.parametrize(("kernels", "hand_count"), [
    # eager (modeling_llama.py): RMSNorm keeps its fp32 input and its bf16 pre-weight output
    # (6h each), the GEMM inputs 2h + 2h + 2f, SDPA q, K and V repeated to 32 heads, output
    # (8h) and lse, SwiGLU gate, silu(gate) and up (6f)
    ("eager", lambda h, kv, f, a: 12 * h + 4 * h + 2 * f + 8 * h + 4 * a + 6 * f),
    # compiled: a norm keeps its bf16 input (2h), silu is recomputed (gate and up: 4f)
    ("compiled", lambda h, kv, f, a: 4 * h + 4 * h + 2 * f + 8 * h + 4 * a + 4 * f),
    # fused: flash-attn takes 8 K/V heads as they are (2h + 4kv + 2h)
    ("fused", lambda h, kv, f, a: 4 * h + 4 * h + 2 * f + 4 * h + 4 * kv + 4 * a + 4 * f),
])
def test_one_llama_block_keeps_what_its_kernels_save(kernels: str, hand_count) -> None:  # type: ignore[no-untyped-def]
    j = Job.from_config(load_workload("llama3-8b").with_training(
        kernels=kernels, activation_checkpointing="none"))
    h, kv, f = j.hidden, j.kv_heads * 128, j.ffn_hidden
    stored, _ = memory.activations_per_token(j)
    assert stored == pytest.approx(hand_count(h, kv, f, j.heads))


def test_activations_and_logits_grow_with_the_micro_batch() -> None:
    j = job("llama2-7b")
    one = memory.estimate(j, RTX5090, "fsdp", world=8, micro_batch=1)
    two = memory.estimate(j, RTX5090, "fsdp", world=8, micro_batch=2)
    assert two.category_bytes("activations") == pytest.approx(
        2 * one.category_bytes("activations"), rel=1e-9)
    logits = next(x for x in one.lines if "cross-entropy" in x.label)
    assert logits.bytes >= j.seq_len * j.vocab * 12  # fp32 log-probabilities and two grads


# --- LoRA, QLoRA ------------------------------------------------------------------------------

def test_lora_and_qlora_need_less_than_full_fine_tuning() -> None:
    full = memory.estimate(job("llama2-7b"), RTX5090, "ddp", world=1)
    lora = memory.estimate(job("llama2-7b-lora"), RTX5090, "ddp", world=1)
    qlora = memory.estimate(job("llama2-7b-qlora"), RTX5090, "ddp", world=1)
    assert states(qlora) < states(lora) < states(full)
    assert qlora.peak_bytes < lora.peak_bytes < full.peak_bytes


def test_qlora_base_costs_nf4_bits_with_double_quantisation() -> None:
    j = job("llama2-7b-qlora")
    report = memory.estimate(j, RTX5090, "ddp", world=1)
    nf4 = next(x for x in report.lines if "NF4" in x.label)
    assert nf4.bytes == pytest.approx(j.n_quantized * (4 + 0.127) / 8, rel=1e-3)


# --- sharding invariants and verdicts -----------------------------------------------------------

@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 63), extra=st.integers(1, 64))
def test_more_gpus_never_increase_fsdp_states_per_gpu(n: int, extra: int) -> None:
    j = _SMALL
    fewer = memory.estimate(j, RTX5090, "fsdp", world=n)
    more = memory.estimate(j, RTX5090, "fsdp", world=n + extra)
    assert states(more) <= states(fewer)


def test_verdict_strings() -> None:
    big = memory.estimate(job("llama2-7b"), RTX5090, "ddp", world=1)
    assert not big.fits
    assert re.fullmatch(r"does not fit: needs \d+\.\d GiB of 32\.0 GiB per GPU", big.verdict())
    assert states(big) / GiB == pytest.approx(100.4, abs=0.1)  # 16 B x 6.74e9 parameters
    small = memory.estimate(job("llama3.2-1b"), gpu("h100-sxm"), "fsdp", world=8)
    assert small.fits
    assert re.fullmatch(r"fits: needs \d+\.\d GiB of 80\.0 GiB per GPU", small.verdict())


def test_largest_micro_batch_is_the_boundary() -> None:
    cfg = load_workload("llama2-7b")
    j = Job.from_config(cfg.copy(training=cfg.training.copy(activation_checkpointing="full")))
    b = memory_search.largest_micro_batch(j, RTX5090, "fsdp", world=8)
    assert b >= 1
    assert memory.estimate(j, RTX5090, "fsdp", world=8, micro_batch=b).fits
    assert not memory.estimate(j, RTX5090, "fsdp", world=8, micro_batch=b + 1).fits


def test_largest_full_fine_tune_on_one_32gb_card_is_between_1b_and_2b() -> None:
    found = memory_search.largest_model(load_workload("llama2-7b"), RTX5090, "ddp", world=1)
    assert found is not None and found.report.fits
    assert 1e9 < found.parameters < 2e9
    wider = memory_search.scaled_workload(load_workload("llama2-7b"), found.hidden + 128)
    assert not memory.estimate(Job.from_config(wider), RTX5090, "ddp", world=1).fits


def test_scaling_keeps_llama2_shapes() -> None:
    cfg = memory_search.scaled_workload(load_workload("llama2-7b"), 5120)
    assert cfg.model is not None
    assert (cfg.model.layers, cfg.model.heads, cfg.model.ffn_hidden) == (40, 40, 13824)  # 13B


def test_bad_strategy_and_tp_raise_input_errors() -> None:
    j = job("llama2-7b")
    with pytest.raises(InputError, match="unknown strategy"):
        memory.estimate(j, RTX5090, "pipeline", world=8)
    with pytest.raises(InputError, match="does not divide"):
        memory.estimate(j, RTX5090, "ddp", world=8, tp=3)


def test_tensor_parallel_splits_states_and_activations() -> None:
    j = job("llama2-7b")
    one = memory.estimate(j, RTX5090, "ddp", world=2)
    tp2 = memory.estimate(j, RTX5090, "tp", world=2)
    assert (tp2.tp, tp2.dp) == (2, 1)
    assert states(tp2) == pytest.approx(states(one) / 2, rel=1e-3)
    assert tp2.category_bytes("activations") < one.category_bytes("activations")


# --- CLI ------------------------------------------------------------------------------------------

def test_cli_text_starts_with_the_verdict(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["memory", "-t", "1x5090", "-w", "llama2-7b", "-s", "ddp"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("does not fit: needs ")
    assert any("model states alone 100.4 GiB" in line for line in out)


def test_cli_json_keys(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["memory", "-t", "8x5090-dual-socket", "-w", "llama2-7b", "-s", "fsdp",
                 "--checkpointing", "full", "--micro-batch", "max", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    for key in ("parameters", "trainable_parameters", "peak_bytes", "capacity_bytes", "fits",
                "breakdown_bytes", "strategy", "world", "micro_batch", "largest_micro_batch"):
        assert key in data
    assert set(data["breakdown_bytes"]) == set(memory.CATEGORIES)
    assert data["world"] == 8 and data["strategy"] == "fsdp"
    assert data["largest_micro_batch"] >= 1


@pytest.mark.parametrize("argv", [
    ["-s", "pipeline"],
    ["-s", "ddp", "--tp", "3"],
    ["--micro-batch", "lots"],
    ["--checkpointing", "some"],
    ["--gpus", "9"],
])
def test_cli_bad_input_exits_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["memory", "-t", "8x5090-switch", "-w", "llama2-7b", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("stepsim memory: error: ") and len(err.strip().splitlines()) == 1


def test_breakdown_sums_to_the_peak() -> None:
    for strategy in memory.STRATEGIES:
        r = memory.estimate(job("llama2-7b-lora"), RTX5090, strategy, world=8, tp=2)
        assert sum(r.breakdown_bytes.values()) == pytest.approx(r.peak_bytes, abs=8)


def test_generic_layer_list_uses_the_given_activation_bytes(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "unet.yaml"
    path.write_text(
        "name: unet\n"
        "layers:\n"
        "  - {name: down, params: 1000000, forward_flops_per_sample: 1e9,"
        " activation_bytes_per_sample: 1e6, tensors: 2}\n"
        "  - {name: up, params: 3000000, forward_flops_per_sample: 1e9,"
        " activation_bytes_per_sample: 3e6}\n"
        "training: {seq_len: 1, micro_batch: 4}\n")
    j = Job.from_config(load_workload(str(path)))
    r = memory.estimate(j, RTX5090, "ddp", world=2)
    assert r.category_bytes("activations") == pytest.approx(4 * 4e6)
    assert states(r) == pytest.approx(16 * 4e6)
    with pytest.raises(InputError, match="transformer"):
        memory.estimate(j, RTX5090, "tp", world=2)


def _other(report: memory.MemoryReport, words: str) -> float:
    return sum(x.bytes for x in report.lines if words in x.label)


def test_embeddings_and_output_of_their_own_leave_no_root_unit() -> None:
    """torchtune's custom_sharded_layers: no root unit stays gathered; the output unit,
    larger than a block under Llama 3's vocabulary, replaces a block in flight by the
    difference of the two with their gradients (pure bf16: 2 B each, and the reduce-scatter
    input)."""
    base = load_workload("llama3-8b").with_training(framework="torchtune")
    card = gpu("a100-sxm4-80gb")
    plain = memory.estimate(Job.from_config(base), card, "fsdp", world=8)
    own = memory.estimate(Job.from_config(base.with_training(
        custom_sharded_layers=["tok_embeddings", "output"])), card, "fsdp", world=8)
    hidden, vocab, layers = 4096, 128256, 32
    assert _other(plain, "root unit") == pytest.approx(2 * hidden * vocab * 2 * 2, rel=1e-3)
    assert _other(own, "root unit") == 0  # the final norm (16 KiB) goes with the output
    block = (plain.parameters - 2 * hidden * vocab - hidden) / layers
    extra = hidden * vocab * 2 * 3 - block * 2 - block * 2 * 2  # output + grads + RS input
    assert _other(own, "of their own") == pytest.approx(extra, rel=1e-3)
    assert own.peak_bytes < plain.peak_bytes


def test_fsdp2_holds_the_previous_units_reduce_scatter_input() -> None:
    """_fsdp_param_group.py post_backward keeps reduce_scatter_state until the next unit's:
    one unit's gradients beside a unit's reduce-scatter input, in reduce_dtype (fp32 under
    mixed precision, bf16 under pure bf16); DeepSpeed's ZeRO-3 has no such buffer."""
    job = Job.from_config(load_workload("llama2-7b"))
    pure = Job.from_config(load_workload("llama2-7b").with_training(precision="pure-bf16"))
    block = 202_383_360  # one Llama 2 7B block's parameters
    card = gpu("a100-sxm4-80gb")
    for j, per_element in ((job, 2 + 4), (pure, 2 + 2)):
        r = memory.estimate(j, card, "fsdp", world=8)
        assert _other(r, "unsharded gradients of one unit") == pytest.approx(
            block * per_element)
    zero3 = memory.estimate(job, card, "zero3", world=8)
    assert _other(zero3, "unsharded gradients of one unit") == pytest.approx(block * 2)


def _zero_lines(strategy: str, offload: str = "none", **kw: object) -> dict[str, float]:
    job = load_job("llama3-8b", 1, 2048, 1, "full", (("precision", "fp16"),))
    r = memory.estimate(job, gpu("a100-sxm4-80gb"), strategy, world=8, offload=offload, **kw)
    return {x.label: x.bytes for x in r.lines if not x.host}


def test_deepspeed_casts_the_partitions_gradients_to_fp32_for_its_step() -> None:
    """stage_1_and_2.py step() and stage3.py _prepare_fp32_grad_for_sub_group: the 16-bit
    gradients of the rank's partition are flattened, then cast to fp32 (2 + 4 B a parameter),
    at the step; ZeRO-3 one sub-group of at most 1e9 elements at a time; nothing on the GPU when
    the optimizer steps on the CPU."""
    n = 8_030_261_248
    for strategy, cap in (("zero2", n / 8), ("zero3", min(n / 8, 1e9))):
        lines = _zero_lines(strategy)
        [step] = [v for k, v in lines.items() if k.startswith("DeepSpeed step")]
        assert step == pytest.approx(cap * (2 + 4))
    assert not any(k.startswith("DeepSpeed step") for k in _zero_lines("zero3", "optimizer"))


def test_zero3_keeps_a_gradient_bucket_of_reduce_bucket_size() -> None:
    """contiguous_gradients: one buffer of reduce_bucket_size elements in the gradients'
    dtype (stage3.py), Hugging Face's "auto" hidden^2 unless a config gives it."""
    auto = _zero_lines("zero3")
    assert auto["ZeRO-3 gradient bucket buffer (reduce_bucket_size 16,777,216, "
                "contiguous_gradients)"] == 4096 * 4096 * 2
    given = _zero_lines("zero3", reduce_bucket_size=500_000_000)
    assert given["ZeRO-3 gradient bucket buffer (reduce_bucket_size 5e8, "
                 "contiguous_gradients)"] == 500_000_000 * 2
