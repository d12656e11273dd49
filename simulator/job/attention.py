"""The attention core: its kernels and what it keeps for backward.

- ``flash``: one FlashAttention kernel each way (SDPA's flash backend, flash-attn). It
  *executes* half of the 4*b*s^2*h FLOPs under a causal mask (it skips masked tiles);
  FlashAttention-2's own benchmark counts causal FLOPs halved (flash-attention
  benchmarks/benchmark_flash_attention.py: ``// (2 if causal else 1)``) and its efficiency
  figures, used in compute.py, are on that count. Backward executes 2.5x the forward FLOPs
  (same file: 5 GEMMs instead of 2, because it recomputes the scores). It saves q, k, v (K and
  V as it was given them: per query head when repeat_kv expanded them), its output and an fp32
  log-sum-exp per head (Dao et al. 2022, arXiv:2205.14135: no s x s matrix).
- ``eager``: the b*heads*s*s scores in HBM (Megatron-LM CoreAttention: batched GEMM, fused
  scale-mask-softmax, dropout, batched GEMM); the full s*s is computed. BERT's eager attention
  scales and masks the scores in two kernels of their own before the softmax (HF
  modeling_bert.py and NVIDIA DeepLearningExamples modeling.py BertSelfAttention:
  ``scores / sqrt(d)``, ``+ attention_mask``, ``softmax``). It saves the softmax output, and
  with dropout the 1-byte mask and the dropped probabilities (Korthikanti et al. 2022,
  arXiv:2205.05198, 5as/h per token).
"""

from __future__ import annotations

from dataclasses import replace

from simulator.job.kernels import FP32, Kernel, gemm, memory


def flash(b: int, s: int, h: int, kv_in: int, e: int, *, causal: bool,
          backward: bool, version: int | str = 2, window: int | None = None) -> Kernel:
    """``kv_in``: the K/V width the kernel reads (kv_dim, or hidden when repeated);
    ``version`` 2, 3 (FlashAttention-3, Shah et al. 2024) or "triton" (flash-attn's
    flash_attn_triton.py, the same algorithm in Triton): compute.py times them apart.
    ``window``: local (sliding-window) causal attention, each query over its last ``window``
    keys, whose tiles outside the band FlashAttention skips (flash-attn 2.3 ``window_size``):
    w s - w^2 / 2 query-key pairs instead of s^2 / 2 once the sequence passes the window."""
    pairs = s * s / (2 if causal else 1)
    if window is not None and causal and s > window:
        pairs = window * s - window * window / 2
    flops = 4.0 * b * pairs * h
    tokens = b * s
    names: dict[int | str, str] = {2: "flash_attention", 3: "flash3_attention",
                                   "triton": "triton_flash_attention"}
    name = names[version]
    mask = "_causal" if causal else ""  # compute.py: a causal kernel has its own efficiency
    if not backward:
        return Kernel("attention_fwd", flops, (2 * tokens * h + 2 * tokens * kv_in) * e,
                      name=f"{name}_forward{mask}")
    return Kernel("attention_bwd", 2.5 * flops, (4 * tokens * h + 4 * tokens * kv_in) * e,
                  name=f"{name}_backward{mask}")


def flash_saved_per_token(h: int, kv_in: int, heads: int, e: int) -> float:
    """q, k, v, the output and the log-sum-exp."""
    return (h + 2 * kv_in + h) * e + FP32 * heads


def _bmm(m: int, n: int, k: int, e: int) -> Kernel:
    return replace(gemm(m, n, k, e), name="bmm")  # aten.bmm, not aten.mm (no SAC save)


def eager(b: int, s: int, heads: int, d: int, e: int, *, dropout: float, unfused_mask: bool,
          backward: bool, matmul_copies: bool = False) -> list[Kernel]:
    """Scores materialised; ``unfused_mask``: the scale and the mask add are kernels of their
    own (BERT), each a pass over the scores (backward: the scale's gradient is one more pass,
    the mask add's is the identity). ``matmul_copies``: the modules call torch.matmul on
    permuted 4-D q, k and v (HF modeling_bert.py, DeepLearningExamples BERT modeling.py,
    eager_attention_forward), which folds the batch dimensions with ``reshape``
    (aten/src/ATen/native/LinearAlgebra.cpp _matmul_impl): a permuted tensor is copied, and so
    is the output's ``permute(0, 2, 1, 3).contiguous()``; backward reshapes the four gradients
    back through the same non-viewable layouts, one copy each (Megatron's CoreAttention uses
    views and strided baddbmm instead)."""
    scores = b * heads * s * s  # elements
    unfused = 2 * scores * e if unfused_mask else 0.0
    rows = b * heads * s
    copies = [memory(2 * rows * d * e, name=f"matmul_reshape_copy.{t}")
              for t in ("q", "k", "v", "context")] if matmul_copies else []
    if not backward:
        out = [*copies, _bmm(rows, s, d, e)]  # Q K^T
        if unfused:
            out += [memory(unfused, name="scale"), memory(unfused, name="mask_add")]
        out.append(memory(2 * scores * e, name="softmax"))
        if dropout > 0:  # read probabilities, write dropped ones and a 1-byte mask
            out.append(memory(scores * (2 * e + 1), name="dropout"))
        out.append(_bmm(rows, d, s, e))  # P V
        return out
    out = [_bmm(rows, s, d, e), _bmm(rows, d, s, e)]  # dP, dV
    if dropout > 0:
        out.append(memory(scores * (2 * e + 1), name="dropout_backward"))
    out.append(memory(3 * scores * e, name="softmax_backward"))
    if unfused:
        out.append(memory(unfused, name="scale_backward"))
    out += [_bmm(rows, d, s, e), _bmm(rows, d, s, e)]  # dQ, dK
    return out + copies


def eager_saved_per_token(h: int, kv: int, heads: int, s: int, e: int, dropout: float) -> float:
    """q, k, v and the output, plus the softmax (and its dropout mask and output) per head."""
    probs = heads * s * (e + (1 + e if dropout > 0 else 0))
    return (h + 2 * kv + h) * e + probs
