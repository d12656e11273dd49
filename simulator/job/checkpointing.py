"""Activation checkpointing as the frameworks define it: what a block keeps, what it recomputes.

Modes (``training.activation_checkpointing``), each per transformer block:
- ``none``: everything autograd saves (the kernel regime's stage tensors, the inputs of the
  GEMMs whose weight gradients need them, and the attention kernel's inputs and output).
- ``selective``: Megatron-LM ``--recompute-granularity selective`` (Korthikanti et al. 2022,
  arXiv:2205.05198, section 4.2): the attention core is recomputed, so its softmax (and dropout)
  tensors are not kept; Q, K, V are.
- ``op``: torchtitan's op-level selective checkpointing (parallelize_llama.py
  ``_apply_ac_to_transformer_block`` with ``selective_ac_option = 'op'``): the outputs of the ops
  in its ``_save_list`` (``aten.mm``, the SDPA kernels, ``aten.max``, ...) are saved, except
  every second ``aten.mm`` (``meta[mm_count_key] % 2 == 0`` -> PREFER_RECOMPUTE), counted per
  block and per forward; everything else is recomputed from the block's input. In a Llama block
  (wq, wk, wv, wo, w1, w3, w2 in execution order) that keeps wq, wv, w1 and w2 and the attention
  output, and recomputes wk, wo, w3 and every elementwise op.
- ``full``: only the block's input is kept (HF ``gradient_checkpointing_enable``,
  ``torch.utils.checkpoint`` per block; torchtitan ``mode = 'full'``); during the block's
  backward its whole forward is recomputed and alive at once.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from functools import partial
from typing import TYPE_CHECKING

from simulator.job import attention, moe
from simulator.job.kernels import FP32, Kernel
from simulator.memo import Memo

if TYPE_CHECKING:
    from simulator.job.workload import Job

MODES = ("none", "selective", "op", "full")

# A block's saved bytes per token by job shape: the stages' saved bytes and the GEMM widths are
# per token, so every micro-batch of a memory search shares them (one op builder per shape)
_SAVED: Memo[dict[str, tuple[float, bool]]] = Memo(limit=256)
_OP_SAVED: Memo[float] = Memo(limit=256)


def job_shape(job: Job) -> Hashable:
    """Everything the per-token figures read of a job but its micro-batch: its modules and
    parameters follow from the architecture and the training block (Job.from_config), whose
    repr stands for it (its lists keep it from hashing), and the sequence length."""
    return (job.arch, repr(job.training), job.recipe, job.seq_len, job.ep)


def op_policy_saves(kernels: Sequence[Kernel]) -> list[bool]:
    """torchtitan's policy over one block's forward kernels, in order: True where the
    kernel's output is saved (odd-numbered ``aten.mm``, and the attention kernel)."""
    count = 0
    out = []
    for k in kernels:
        if k.name == "mm":
            count += 1
            out.append(count % 2 == 1)
        else:
            out.append(k.kind == "attention_fwd")
    return out


def recompute(mode: str, block: list[tuple[str, list[Kernel]]]) -> list[tuple[str, list[Kernel]]]:
    """The block ops (and their kernels) re-run before the block's backward."""
    if mode == "full":
        return [(op, ks) for op, ks in block if ks]
    if mode == "selective":
        return [(op, ks) for op, ks in block if op == "attention"]
    if mode != "op":
        return []
    flat = [k for _, ks in block for k in ks]
    saves = iter(op_policy_saves(flat))
    out = []
    for op, ks in block:
        keep = [k for k in ks if not next(saves)]
        if keep:
            out.append((op, keep))
    return out


def _needs_input(job: Job, mods: list) -> bool:  # type: ignore[type-arg]
    """A GEMM's input is saved when some weight it feeds gets a gradient (or a LoRA A does)."""
    return job.finetune == "full" or any(m.lora for m in mods)


def saved_tensors(job: Job, *, flash: bool | None = None) -> dict[str, tuple[float, bool]]:
    """One block's saved tensors with no checkpointing: name -> (bytes per token, split over a
    tensor-parallel group). Residual-stream tensors (norm inputs and outputs, dropout masks)
    are replicated across TP ranks; the rest are split."""
    if flash is None:
        flash = job.flash_attention
    return dict(_SAVED.get((job_shape(job), flash), partial(_saved_tensors, job, flash)))


def _saved_tensors(job: Job, flash: bool) -> dict[str, tuple[float, bool]]:
    from simulator.job.transformer_ops import builder

    bld = builder(job)
    A, e = job.arch, job.activation_bytes
    assert A is not None
    rep = bld.representative  # block 0, or a mixture of experts' first MoE block
    out: dict[str, tuple[float, bool]] = {}
    for op in bld.ops_of(rep):
        saved = bld.memory_bound(rep, op).saved_per_token
        if saved:
            out[f"{op} (kernel regime)"] = (saved, op == "mlp_act")
    if flash:
        out["attention q, k, v, output, log-sum-exp"] = (
            attention.flash_saved_per_token(A.attn_dim, bld.kv_in, A.heads, e), True)
    else:
        out["attention q, k, v, output, softmax"] = (
            attention.eager_saved_per_token(A.attn_dim, A.kv_dim, A.heads, job.seq_len, e,
                                            job.eager_chain), True)
    for op, width, name in (("qkv", A.hidden, "attention input (norm output)"),
                            ("mlp_in", A.hidden, "MLP input (norm output)"),
                            ("mlp_out", A.ffn_hidden, "down-projection input")):
        mods = bld.by_op.get((rep, op), [])
        if mods and _needs_input(job, mods):
            out[name] = (width * e, op == "mlp_out")
    if A.is_moe(rep):
        out.update(moe.saved_per_token(bld))
    rank = job.lora_rank
    routed = A.moe.top_k / A.moe.experts if A.moe is not None else 1.0
    lora = sum(routed if ".experts." in m.path else 1.0
               for m in job.modules if m.block == rep and m.lora)
    if lora:
        out["LoRA A outputs"] = (lora * rank * e, False)
    if lora and job.lora_dropout > 0:  # each adapter's own dropped copy of its input, and mask
        width = sum(m.in_features for m in job.modules if m.block == 0 and m.lora)
        out["LoRA dropout outputs and masks"] = (width * (e + 1), False)
    return out


def scores_per_token(job: Job, flash: bool) -> float:
    """What ``selective`` drops: the attention core's softmax tensors (flash: the lse)."""
    A = job.arch
    assert A is not None
    if flash:
        return FP32 * A.heads
    return A.heads * job.seq_len * job.eager_chain.saved


def op_saved_per_token(job: Job) -> float:
    """``op`` mode: the block input, the outputs of the saved GEMMs, the attention output and
    its log-sum-exp."""
    return _OP_SAVED.get(job_shape(job), partial(_op_saved_per_token, job))


def _op_saved_per_token(job: Job) -> float:
    from simulator.job.transformer_ops import builder

    bld = builder(job)
    A, e = job.arch, job.activation_bytes
    assert A is not None
    rep = bld.representative
    kernels = [k for op in bld.ops_of(rep) for k in bld.forward(rep, op)]
    total = float(A.hidden * e)
    for k, saved in zip(kernels, op_policy_saves(kernels), strict=True):
        if saved and k.kind == "attention_fwd":
            total += A.attn_dim * e + FP32 * A.heads
        elif saved and k.shape is not None:  # the GEMM's output (an expert's: its rows)
            total += k.shape[1] * e * k.shape[0] / bld.T
    return total


def per_token(job: Job, *, tp: int = 1, sequence_parallel: bool = False,
              flash: bool | None = None, mode: str | None = None) -> tuple[float, float]:
    """Bytes per token one block keeps for backward on one rank: (stored, working set held
    while the block is recomputed)."""
    mode = mode or job.checkpointing
    if flash is None:
        flash = job.flash_attention
    tensors = saved_tensors(job, flash=flash)

    def share(split: bool) -> float:
        return 1 / tp if (split or sequence_parallel) else 1.0

    total = sum(b * share(split) for b, split in tensors.values())
    e = job.activation_bytes
    block_input = job.hidden * e * share(False)
    if mode == "selective":
        return total - scores_per_token(job, flash) / tp, 0.0
    if mode == "op":
        return (op_saved_per_token(job) - job.hidden * e) / tp + block_input, total
    if mode == "full":
        return block_input, total
    return total, 0.0
