"""torch.compile (Inductor): each chain of elementwise ops between GEMMs becomes one kernel.

The rules, from how Inductor lowers a block (torch/_inductor scheduler fusion of pointwise and
reduction nodes; GEMMs stay cuBLAS extern kernels):
- a fused kernel reads each distinct input once and writes each output it must materialise once;
  upcasts to fp32 happen in registers and cost no HBM traffic;
- what is saved for backward follows the min-cut partitioner (torch/_functorch/partitioners.py
  min_cut_rematerialization_partition): a pointwise intermediate is recomputed in backward
  unless a non-fusible backward op (a GEMM, SDPA) needs it, in which case it is saved; GEMM and
  SDPA outputs cannot be recomputed; reductions that shrink their input (a norm's rstd) are
  saved. So an RMSNorm saves its input, the GEMM after it its output; SwiGLU saves gate and up
  and recomputes silu; rotary saves nothing.
- torchtitan and torchtune compile each transformer block separately (torchtitan
  parallelize_llama.py apply_compile, torchtune training.compile_model per layer): the residual
  add after attention fuses into the MLP norm, the one that closes a block does not fuse across
  the block boundary, and the final norm, LM head and loss stay eager.
- in backward the stream's gradient from around a branch is added inside the norm's dx kernel.
"""

from __future__ import annotations

from simulator.job.kernels import NONE, BlockShape, Kernel, MemoryBound, pointwise, tiny


def norm(s: BlockShape, kind: str, *, residual: bool = False) -> MemoryBound:
    """The norm as one reduction kernel; ``residual``: the add before it is fused in (reads
    the stream and the branch, writes the new stream and the normalised output)."""
    n, e = s.n_h, s.e
    reads, writes = (2 * e, 2 * e) if residual else (e, e)
    fwd = [pointwise(f"{kind}{'_add' if residual else ''}", n, reads=reads, writes=writes)]
    # dx reads dy, x (and the gradient from around the branch) and writes dx; the weight's
    # gradient is a second reduction over tokens reading dy and x
    bwd = [pointwise(f"{kind}_backward.dx", n, reads=3 * e, writes=e),
           pointwise(f"{kind}_backward.dweight", n, reads=2 * e, writes=0),
           tiny(f"{kind}_backward.dweight_sum")]
    return MemoryBound.of(fwd, bwd, saved_per_token=e * s.hidden)  # its input; rstd is one per row


def rotary(s: BlockShape, style: str) -> MemoryBound:
    """q and k rotated in one kernel (any style: it is register arithmetic); under
    grouped-query attention the rotated K is written once per query head in the same kernel
    (see attention_layout)."""
    e = s.e
    k_out = s.n_q if s.repeats_kv else s.n_kv
    fwd = [Kernel("memory", 6 * (s.n_q + s.n_kv), (2 * s.n_q + s.n_kv + k_out) * e,
                  name="rotary_qk")]
    bwd = [Kernel("memory", 6 * (s.n_q + s.n_kv), (2 * s.n_q + k_out + s.n_kv) * e,
                  name="rotary_qk_backward")]
    return MemoryBound.of(fwd, bwd)


def attention_layout(s: BlockShape, *, qkv_fused: bool) -> MemoryBound:
    """V repeated per query head (K's repeat is fused into the rotary kernel); a fused QKV
    projection's dq, dk, dv are written straight into one gradient buffer by the kernels that
    produce them, so no concatenation."""
    if not s.repeats_kv:
        return NONE
    e = s.e
    return MemoryBound.of([Kernel("memory", 0.0, (s.n_kv + s.n_q) * e, name="repeat_kv.v")],
                    [Kernel("memory", s.n_q, (s.n_q + s.n_kv) * e,
                            name="repeat_kv.v.sum_backward")])


def activation(s: BlockShape, mlp: str, *, gelu: str = "native") -> MemoryBound:
    """One kernel each way; saves the GEMM outputs it reads (gate and up, or the GELU input)."""
    n, e = s.n_f, s.e
    if mlp == "swiglu":
        return MemoryBound.of([pointwise("silu_mul", n, reads=2 * e, writes=e,
                                         flops_per_element=5)],
                        [pointwise("silu_mul_backward", n, reads=3 * e, writes=2 * e,
                                   flops_per_element=10)],
                        saved_per_token=2 * e * s.ffn)
    return MemoryBound.of([pointwise("gelu", n, reads=e, writes=e, flops_per_element=8)],
                    [pointwise("gelu_backward", n, reads=2 * e, writes=e, flops_per_element=12)],
                    saved_per_token=e * s.ffn)


def residual(s: BlockShape, *, dropout: bool, into_norm: bool = False) -> MemoryBound:
    """``into_norm``: fused into the next norm's kernel (inside a compiled block); otherwise
    one add (with the dropout) of its own. Backward: folded into the norms' dx kernels."""
    mask = s.hidden if dropout else 0.0  # the dropout mask (random ops are never recomputed)
    if into_norm:
        return MemoryBound(saved_per_token=mask)
    n, e = s.n_h, s.e
    writes = e + (1 if dropout else 0)
    fwd = [pointwise("add_residual" + ("_dropout" if dropout else ""), n, reads=2 * e,
                     writes=writes)]
    bwd = [pointwise("dropout_backward", n, reads=e + 1, writes=e)] if dropout else []
    return MemoryBound.of(fwd, bwd, saved_per_token=mask)
