"""Hand-fused kernels: what Megatron-LM / Transformer Engine, apex and flash-attn's training
stack launch instead of PyTorch's op-by-op modules.

- Norm with the residual add folded in: flash-attn ``dropout_add_layer_norm`` /
  ``layer_norm_fn(x, weight, bias, residual=...)`` (flash_attn/ops/triton/layer_norm.py) reads
  the stream and the branch and writes the new stream and the normalised output in one kernel,
  RMSNorm or LayerNorm alike; its backward is one kernel that also adds the stream's gradient
  (plus a small reduction for the weight). Transformer Engine and apex FusedLayerNorm /
  FusedRMSNorm are the same norm kernel without the add.
- Rotary: Transformer Engine ``fused_apply_rotary_pos_emb`` and apex fused_rope, one kernel per
  tensor each way.
- Attention: flash-attn and TE take grouped-query K and V as they are, in (b, s, heads, d): no
  repeat, no transposes.
- MLP activation: Megatron-LM megatron/core/fusions/fused_bias_swiglu.py and fused_bias_gelu.py,
  one kernel each way that saves only its input.
- Residual: fused into the next norm everywhere, across blocks too (flash-attn's Block runs
  ``dropout_add_ln(hidden, residual)`` at its start).
"""

from __future__ import annotations

from simulator.job.kernels import BlockShape, MemoryBound, pointwise, tiny


def norm(s: BlockShape, kind: str, *, residual: bool = False) -> MemoryBound:
    n, e = s.n_h, s.e
    reads, writes = (2 * e, 2 * e) if residual else (e, e)
    fwd = [pointwise(f"fused_{kind}{'_add' if residual else ''}", n, reads=reads, writes=writes)]
    bwd = [pointwise(f"fused_{kind}_backward", n, reads=3 * e, writes=e),
           tiny(f"fused_{kind}_backward.dweight_sum")]
    return MemoryBound.of(fwd, bwd, saved_per_token=e * s.hidden)  # its input; rstd one per row


def rotary(s: BlockShape, style: str) -> MemoryBound:
    e = s.e
    return MemoryBound.of([pointwise("fused_rope.q", s.n_q, reads=e, writes=e),
                     pointwise("fused_rope.k", s.n_kv, reads=e, writes=e)],
                    [pointwise("fused_rope_backward.q", s.n_q, reads=e, writes=e),
                     pointwise("fused_rope_backward.k", s.n_kv, reads=e, writes=e)])


def attention_layout(s: BlockShape, *, qkv_fused: bool) -> MemoryBound:
    return MemoryBound()


def activation(s: BlockShape, mlp: str, *, gelu: str = "native") -> MemoryBound:
    n, e = s.n_f, s.e
    if mlp == "swiglu":  # bias_swiglu: input is gate and up side by side
        return MemoryBound.of([pointwise("bias_swiglu", n, reads=2 * e, writes=e,
                                         flops_per_element=5)],
                        [pointwise("bias_swiglu_backward", n, reads=3 * e, writes=2 * e,
                                   flops_per_element=10)],
                        saved_per_token=2 * e * s.ffn)
    return MemoryBound.of([pointwise("bias_gelu", n, reads=e, writes=e, flops_per_element=8)],
                    [pointwise("bias_gelu_backward", n, reads=2 * e, writes=e,
                               flops_per_element=12)],
                    saved_per_token=e * s.ffn)


def residual(s: BlockShape, *, dropout: bool, into_norm: bool = True) -> MemoryBound:
    """Always folded into the following norm's kernel; the dropout mask is what it keeps."""
    return MemoryBound(saved_per_token=s.hidden if dropout else 0.0)

