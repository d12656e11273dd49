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

from dataclasses import dataclass, replace

from simulator.job.kernels import FP32, Kernel, gemm, memory


def flash(b: int, s: int, h: int, kv_in: int, e: int, *, causal: bool,
          backward: bool, version: int | str = 2, window: int | None = None) -> Kernel:
    """``kv_in``: the K/V width the kernel reads (kv_dim, or hidden when repeated);
    ``version`` 1 (FlashAttention-1, SDPA's kernel before PyTorch 2.2), 2, 3
    (FlashAttention-3, Shah et al. 2024) or "triton" (flash-attn's flash_attn_triton.py, the
    same algorithm in Triton) or "mem_efficient" (sdpa's memory-efficient kernel given a
    padding mask: it skips no tile, so every query-key pair is computed, and it reads the
    (b, 1, s, s) mask): compute.py times them apart.
    ``window``: local (sliding-window) causal attention, each query over its last ``window``
    keys, whose tiles outside the band FlashAttention skips (flash-attn 2.3 ``window_size``):
    w s - w^2 / 2 query-key pairs instead of s^2 / 2 once the sequence passes the window."""
    masked = version == "mem_efficient"
    causal = causal and not masked  # the mask is a tensor: no tile is known to be empty
    pairs = s * s / (2 if causal else 1)
    if window is not None and causal and s > window:
        pairs = window * s - window * window / 2
    flops = 4.0 * b * pairs * h
    tokens = b * s
    mask_bytes = b * s * s * e if masked else 0
    names: dict[int | str, str] = {1: "flash1_attention", 2: "flash_attention",
                                   3: "flash3_attention", "triton": "triton_flash_attention",
                                   "mem_efficient": "mem_efficient_attention"}
    name = names[version]
    mask = "_causal" if causal else ""  # compute.py: a causal kernel has its own efficiency
    if not backward:
        return Kernel("attention_fwd", flops,
                      (2 * tokens * h + 2 * tokens * kv_in) * e + mask_bytes,
                      element_bytes=e, name=f"{name}_forward{mask}")
    return Kernel("attention_bwd", 2.5 * flops,
                  (4 * tokens * h + 4 * tokens * kv_in) * e + mask_bytes,
                  element_bytes=e, name=f"{name}_backward{mask}")


def flash_saved_per_token(h: int, kv_in: int, heads: int, e: int) -> float:
    """q, k, v, the output and the log-sum-exp."""
    return (h + 2 * kv_in + h) * e + FP32 * heads


def _bmm(m: int, n: int, k: int, e: int) -> Kernel:
    return replace(gemm(m, n, k, e), name="bmm")  # aten.bmm, not aten.mm (no SAC save)


@dataclass(frozen=True)
class Pass:
    """One elementwise pass over the s x s scores: bytes read and written per score element."""

    name: str
    reads: float
    writes: float


@dataclass(frozen=True)
class EagerChain:
    """The elementwise kernels between Q K^T and P V as a framework's eager module runs them
    under a dtype regime, and the bytes per score element autograd keeps for backward."""

    forward: tuple[Pass, ...]
    backward: tuple[Pass, ...]
    saved: float

    @property
    def forward_bytes(self) -> float:
        return sum(p.reads + p.writes for p in self.forward)

    @property
    def backward_bytes(self) -> float:
        return sum(p.reads + p.writes for p in self.backward)


PATTERNS = ("fused", "gpt2", "bert", "llama", "gpt_oss")


def eager_chain(pattern: str, *, e: int, autocast: bool, dropout: bool) -> EagerChain:
    """The score chain of one eager attention implementation (``e``: bytes of the activations;
    ``autocast``: torch.autocast over fp32 parameters, where the additive mask is built in the
    parameters' fp32 and promotes the 16-bit scores, and softmax runs in fp32). Masks are
    broadcast ([b,1,1,s] or [1,1,s,s]): their reads are left out.

    - ``fused``: Megatron-LM CoreAttention, FusedScaleMaskSoftmax (scale, mask and softmax in
      one kernel, fp32 inside, 16-bit out), then dropout.
    - ``gpt2``: transformers modeling_gpt2.py GPT2Attention._attn (commit 0010f602, v4.3x; the
      same chain in later eager_attention_forward): ``attn_weights / torch.full([], ...)``,
      ``torch.where(causal_mask, attn_weights, mask_value)``, ``attn_weights +
      attention_mask`` (GPT2Model.forward builds it ``.to(dtype=self.dtype)``: the parameters'
      dtype), ``softmax``, ``.type(value.dtype)``, ``attn_dropout``. GPT-J, OPT and CodeGen
      run the same steps.
    - ``bert``: modeling_bert.py BertSelfAttention (and NVIDIA DeepLearningExamples'): ``/
      math.sqrt(d)``, ``+ attention_mask`` (get_extended_attention_mask, the parameters'
      dtype), ``softmax``, dropout; under autocast the P V matmul casts the fp32 probabilities
      to 16 bit (autocast's lower-precision list) as a kernel of its own.
    - ``llama``: transformers eager_attention_forward (modeling_llama.py): ``* scaling``, ``+
      causal_mask`` (built in the embeddings' dtype), ``softmax(..., dtype=torch.float32)``,
      ``.to(query.dtype)``, dropout (Llama's attention_dropout is 0: no kernel, ATen's dropout
      returns its input at p = 0). MPT's torch attention (llm-foundry) runs the same steps.
    - ``gpt_oss``: modeling_gpt_oss.py eager_attention_forward: ``* scaling``, ``+
      causal_mask``, ``torch.cat([scores, sinks])`` (the sinks' one extra column per row
      left out of the bytes), ``combined - combined.max(dim=-1, keepdim=True).values`` (a reduction
      and a pass), ``softmax(..., dtype=combined.dtype)``, ``probs[..., :-1]`` (a view),
      dropout, ``.to(value_states.dtype)``. Backward adds the slice's slice_backward (a
      zero-filled tensor, the gradient copied in), the max's: the subtraction's gradient
      summed per row, scattered into a zero-filled tensor (value_selecting_reduction_backward)
      and added to the passed-through one.

    Autocast's op lists (pytorch aten/src/ATen/autocast_mode.h): matmul, bmm lower precision;
    softmax CastPolicy::fp32_set_opt_dtype (a 16-bit input is read and fp32 written by the one
    kernel); div, mul, add, where are not listed and follow type promotion. Backward, from
    autograd's formulas (tools/autograd/derivatives.yaml): a scalar scale's gradient is one
    pass, where's ``where(cond, grad, 0)`` one pass, a promoting add's a cast back, softmax's
    _softmax_backward_data reads its output and the gradient, a cast's is the reverse cast.
    Saved: softmax's output, dropout's 1-byte mask, and the P V matmul's input."""
    if pattern not in PATTERNS:
        raise ValueError(f"unknown eager attention pattern {pattern!r}")
    s = e  # Q K^T writes the activations' dtype (16-bit under autocast: its matmul list)
    if pattern == "gpt_oss":
        return _sinks_chain(e, autocast=autocast, dropout=dropout)
    if pattern == "fused":
        fwd = [Pass("scale_mask_softmax", s, e)]
        bwd = [Pass("scale_mask_softmax_backward", 2 * e, e)]
        out = e
        last = e
    else:
        m = FP32 if autocast else e  # the additive mask, in the parameters' dtype
        p = max(s, m)  # scores + mask: type promotion
        # softmax(dtype=fp32) (llama), or autocast's fp32 softmax; else the promoted dtype
        out = FP32 if pattern == "llama" or autocast else p
        scale = "mul_scaling" if pattern == "llama" else "div_scale"
        fwd = [Pass(scale, s, s)]
        bwd = [Pass(f"{scale}_backward", s, s)]
        if pattern == "gpt2":
            fwd.append(Pass("where_causal_mask", s, s))
            bwd.insert(0, Pass("where_backward", s, s))
        fwd.append(Pass("add_attention_mask", s, p))
        if p != s:  # the promoted gradient cast back to the scores' dtype
            bwd.insert(0, Pass("add_backward.to_scores_dtype", p, s))
        fwd.append(Pass("softmax", p, out))
        bwd.insert(0, Pass("softmax_backward", 2 * out, p))
        last = out
        if pattern in ("gpt2", "llama") and out != e:  # .type(value.dtype) / .to(query.dtype)
            fwd.append(Pass("to_value_dtype", out, e))
            bwd.insert(0, Pass("to_value_dtype_backward", e, out))
            last = e
    saved = out  # softmax keeps its output
    if dropout:
        fwd.append(Pass("dropout", last, last + 1))  # and a 1-byte mask
        bwd.insert(0, Pass("dropout_backward", last + 1, last))
        saved += 1
    if pattern == "bert" and last != e:  # autocast casts P for the P V matmul
        fwd.append(Pass("autocast_probs_to_16bit", last, e))
        bwd.insert(0, Pass("autocast_probs_to_16bit_backward", e, last))
        last = e
    if dropout or last != out:  # the P V matmul's own input (else softmax's output again)
        saved += e
    return EagerChain(tuple(fwd), tuple(bwd), saved)


def _sinks_chain(e: int, *, autocast: bool, dropout: bool) -> EagerChain:
    """gpt-oss's eager attention (``eager_chain``'s ``gpt_oss``): the mask in the parameters'
    dtype promotes the scores (and the sinks' column joins them in it); its softmax keeps
    that dtype."""
    m = FP32 if autocast else e
    p = max(e, m)
    fwd = [Pass("mul_scaling", e, e), Pass("add_attention_mask", e, p), Pass("cat_sinks", p, p),
           Pass("amax", p, 0), Pass("sub_max", p, p), Pass("softmax", p, p)]
    bwd = [Pass("slice_backward.zeros", 0, p), Pass("slice_backward.copy", p, p),
           Pass("softmax_backward", 2 * p, p), Pass("sub_backward.sum_for_max", p, 0),
           Pass("amax_backward.zeros", 0, p), Pass("accumulate_combined", 2 * p, p)]
    if p != e:
        bwd.append(Pass("add_backward.to_scores_dtype", p, e))
    bwd.append(Pass("mul_scaling_backward", e, e))
    last, saved = p, float(p)  # softmax keeps its output
    if dropout:
        fwd.append(Pass("dropout", p, p + 1))
        bwd.insert(0, Pass("dropout_backward", p + 1, p))
        saved += 1
    if p != e:
        fwd.append(Pass("to_value_dtype", p, e))
        bwd.insert(0, Pass("to_value_dtype_backward", e, p))
        last = e
    if dropout or last != p:  # the P V matmul's own input
        saved += e
    return EagerChain(tuple(fwd), tuple(bwd), saved)


def eager(b: int, s: int, heads: int, d: int, e: int, *, chain: EagerChain,
          backward: bool, matmul_copies: bool = False) -> list[Kernel]:
    """Scores materialised: Q K^T, the chain's passes over the b x heads x s x s scores, P V.
    ``matmul_copies``: the modules call torch.matmul on permuted 4-D q, k and v (HF
    modeling_bert.py, DeepLearningExamples BERT modeling.py, eager_attention_forward), which
    folds the batch dimensions with ``reshape`` (aten/src/ATen/native/LinearAlgebra.cpp
    _matmul_impl): a permuted tensor is copied, and so is the output's ``permute(0, 2, 1,
    3).contiguous()``; backward reshapes the four gradients back through the same
    non-viewable layouts, one copy each (Megatron's CoreAttention uses views and strided
    baddbmm instead)."""
    scores = b * heads * s * s  # elements
    rows = b * heads * s
    copies = [memory(2 * rows * d * e, name=f"matmul_reshape_copy.{t}")
              for t in ("q", "k", "v", "context")] if matmul_copies else []
    if not backward:
        return [*copies, _bmm(rows, s, d, e),  # Q K^T
                *[memory(scores * (x.reads + x.writes), name=x.name) for x in chain.forward],
                _bmm(rows, d, s, e)]  # P V
    return [_bmm(rows, s, d, e), _bmm(rows, d, s, e),  # dP, dV
            *[memory(scores * (x.reads + x.writes), name=x.name) for x in chain.backward],
            _bmm(rows, d, s, e), _bmm(rows, d, s, e), *copies]  # dQ, dK


def eager_saved_per_token(h: int, kv: int, heads: int, s: int, e: int,
                          chain: EagerChain) -> float:
    """q, k, v and the output, plus what the score chain keeps per head and key."""
    return (h + 2 * kv + h) * e + heads * s * chain.saved
