"""Eager PyTorch: the kernels a transformer block launches when its modules run as written.

One function per stage between GEMMs. Each lists the aten kernels the module's forward
launches, the kernels autograd runs for it in backward (torch/csrc/autograd derivatives.yaml),
and the bytes per token it saves for backward (autograd saves an input only when the other
input's gradient needs it). Sizes are per element of the stage's tensor; e is the activation
dtype's size, fp32 upcasts are 4 bytes. Kernels over one value per row (a variance, its rsqrt)
move negligible bytes but still launch.

Sources, one per stage:
- RMSNorm: transformers models/llama/modeling_llama.py LlamaRMSNorm.forward (``to(float32)``,
  ``pow(2).mean(-1)``, ``* rsqrt(variance + eps)``, ``.to(input_dtype)``, ``weight *``); the same
  ops in torchtitan models/norms.py RMSNorm and torchtune modules/rms_norm.py.
- LayerNorm: nn.LayerNorm is one native kernel each way (aten native_layer_norm and
  native_layer_norm_backward, the latter a dx kernel and a gamma/beta kernel): GPT-2, BERT,
  llm-foundry's LPLayerNorm.
- Rotary, three ways: transformers apply_rotary_pos_emb (``q * cos + rotate_half(q) * sin``,
  rotate_half = ``cat((-x2, x1))``); torchtitan models/llama/model.py apply_rotary_emb (fp32
  ``view_as_complex`` times ``freqs_cis``, ``type_as``); torchtune modules/
  position_embeddings.py RotaryPositionalEmbeddings (fp32 pairs, four products, ``stack``).
- Attention layout: repeat_kv (transformers integrations/sdpa_attention.py, torchtitan
  model.py) copies K and V to every query head before SDPA under grouped-query attention; a
  fused QKV projection (GPT-2 c_attn ``split``, MPT Wqkv ``chunk``) is split by views, and its
  backward concatenates dq, dk, dv.
- SwiGLU: LlamaMLP ``act_fn(gate_proj(x)) * up_proj(x)`` (silu and mul kernels), torchtitan
  FeedForward ``F.silu(w1(x)) * w3(x)``.
- GELU: GPT-2's ``gelu_new`` is transformers activations.py NewGELUActivation, eight aten ops
  (``0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))``), in fp32 from ``pow`` on under
  torch.autocast (``_gelu_new_autocast``); MPT and BERT use the native GELU kernel.
- Residual: ``residual + hidden_states`` (one add); GPT-2 drops the branch first
  (resid_pdrop, aten native_dropout: a 1-byte mask); in backward the stream's two gradients
  (through the branch and around it) meet in one add.
- The residual stream under torch.autocast over fp32 weights is fp32: the embedding looks up
  fp32 rows (embedding is on none of autocast's lists), a 16-bit branch added to it promotes
  to fp32, and nn.LayerNorm is on autocast's fp32 list (autocast_mode.cpp ``KERNEL_CUDA(
  layer_norm, fp32)``), RMSNorm's ``.to(input_dtype)`` returns fp32. Each linear layer that
  reads a norm's fp32 output casts it to 16 bit itself (addmm, linear: the lower-precision
  list; autocast caches casts of leaf weights only, autocast_mode.cpp ``cached_cast``), and
  autograd casts each gradient back to its input's dtype (engine.cpp validate_outputs):
  ``stream_norm``, ``residual(stream=FP32)``.
"""

from __future__ import annotations

from dataclasses import replace

from simulator.job.kernels import FP32, BlockShape, Kernel, MemoryBound, pointwise, tiny

RotaryStyle = str  # "rotate_half" (transformers), "complex" (torchtitan), "pairs" (torchtune)


def _cast(name: str, n: float, src: int, dst: int) -> list[Kernel]:
    """``x.to(dtype)``: no kernel when the dtype already matches."""
    return [] if src == dst else [pointwise(name, n, reads=src, writes=dst)]


def norm(s: BlockShape, kind: str, *, residual: bool = False) -> MemoryBound:
    """Pre-LN norm on the residual stream (eager never fuses the residual add into it)."""
    n, e = s.n_h, s.e
    if kind == "layernorm":
        return MemoryBound.of([pointwise("native_layer_norm", n, reads=e, writes=e)],
                        [pointwise("layer_norm_backward.dx", n, reads=2 * e, writes=e),
                         pointwise("layer_norm_backward.dgamma_dbeta", n, reads=2 * e, writes=0),
                         tiny("layer_norm_backward.sum")],
                        saved_per_token=e * s.hidden)  # its input (mean, rstd: one per row)
    f32 = FP32
    forward = [*_cast("to_fp32", n, e, f32),
               pointwise("pow", n, reads=f32, writes=f32),
               pointwise("mean", n, reads=f32, writes=0),
               tiny("add_eps"), tiny("rsqrt"),
               pointwise("mul_rsqrt", n, reads=f32, writes=f32),
               *_cast("to_dtype", n, f32, e),
               pointwise("mul_weight", n, reads=e, writes=e)]
    backward = [pointwise("mul_weight.grad_input", n, reads=e, writes=e),
                pointwise("mul_weight.grad_weight", n, reads=2 * e, writes=e),
                pointwise("sum_tokens.grad_weight", n, reads=e, writes=0),
                *_cast("to_dtype.backward", n, e, f32),
                pointwise("mul_rsqrt.grad_x", n, reads=f32, writes=f32),
                pointwise("mul_rsqrt.grad_rsqrt", n, reads=2 * f32, writes=f32),
                pointwise("sum_row.grad_rsqrt", n, reads=f32, writes=0),
                tiny("rsqrt_backward"), tiny("add_eps_backward"),
                pointwise("mean_backward", n, reads=0, writes=f32),
                pointwise("pow_backward.two_x", n, reads=f32, writes=f32),
                pointwise("pow_backward.mul_grad", n, reads=2 * f32, writes=f32),
                pointwise("accumulate_grad_x", n, reads=2 * f32, writes=f32),
                *_cast("to_fp32.backward", n, f32, e)]
    # pow and mul save the fp32 input (x itself under fp32); the weight mul saves its bf16 input
    return MemoryBound.of(forward, backward, saved_per_token=(f32 + e) * s.hidden)


def stream_norm(s: BlockShape, kind: str, consumers: int) -> MemoryBound:
    """A norm on the fp32 residual stream under autocast: the norm in fp32, then one cast to
    16 bit per linear layer that reads its output (backward: each one's cast back)."""
    n, f = s.n_h, FP32
    fp32 = norm(replace(s, e=f), kind)
    casts = [pointwise("autocast_to_16bit", n, reads=f, writes=s.e) for _ in range(consumers)]
    backs = [pointwise("autocast_to_16bit_backward", n, reads=s.e, writes=f)
             for _ in range(consumers)]
    return MemoryBound.of([*fp32.forward, *casts], [*backs, *fp32.backward],
                          fp32.saved_per_token)


def _rotary_one(n: float, e: int, style: RotaryStyle, tag: str) -> tuple[list[Kernel],
                                                                          list[Kernel]]:
    f32 = FP32
    if style == "complex":
        fwd = [*_cast(f"{tag}.float", n, e, f32),
               pointwise(f"{tag}.mul_freqs_cis", n, reads=f32, writes=f32),
               *_cast(f"{tag}.type_as", n, f32, e)]
        bwd = [*_cast(f"{tag}.type_as.backward", n, e, f32),
               pointwise(f"{tag}.mul_conj_freqs_cis", n, reads=f32, writes=f32),
               *_cast(f"{tag}.float.backward", n, f32, e)]
        return fwd, bwd
    if style == "pairs":  # four half-size products, a sub, an add, a stack, all fp32
        half = n / 2
        fwd = [*_cast(f"{tag}.float", n, e, f32),
               *[pointwise(f"{tag}.mul{i}", half, reads=f32, writes=f32) for i in range(4)],
               pointwise(f"{tag}.sub", half, reads=2 * f32, writes=f32),
               pointwise(f"{tag}.add", half, reads=2 * f32, writes=f32),
               pointwise(f"{tag}.stack", n, reads=f32, writes=f32),
               *_cast(f"{tag}.type_as", n, f32, e)]
        bwd = [*_cast(f"{tag}.type_as.backward", n, e, f32),
               pointwise(f"{tag}.sub_backward.neg", half, reads=f32, writes=f32),
               *[pointwise(f"{tag}.mul{i}_backward", half, reads=f32, writes=f32)
                 for i in range(4)],
               *[pointwise(f"{tag}.accumulate_pair{i}", half, reads=2 * f32, writes=f32)
                 for i in range(2)],
               *[k for i in range(2) for k in (
                   pointwise(f"{tag}.select_backward{i}.zeros", n, reads=0, writes=f32),
                   pointwise(f"{tag}.select_backward{i}.copy", half, reads=f32, writes=f32))],
               pointwise(f"{tag}.accumulate", n, reads=2 * f32, writes=f32),
               *_cast(f"{tag}.float.backward", n, f32, e)]
        return fwd, bwd
    # rotate_half: q * cos + cat(-x2, x1) * sin
    fwd = [pointwise(f"{tag}.mul_cos", n, reads=e, writes=e),
           pointwise(f"{tag}.neg", n / 2, reads=e, writes=e),
           pointwise(f"{tag}.cat", n, reads=e, writes=e),
           pointwise(f"{tag}.mul_sin", n, reads=e, writes=e),
           pointwise(f"{tag}.add", n, reads=2 * e, writes=e)]
    bwd = [pointwise(f"{tag}.mul_sin_backward", n, reads=e, writes=e),
           pointwise(f"{tag}.neg_backward", n / 2, reads=e, writes=e),
           *[k for i in range(2) for k in (
               pointwise(f"{tag}.slice_backward{i}.zeros", n, reads=0, writes=e),
               pointwise(f"{tag}.slice_backward{i}.copy", n / 2, reads=e, writes=e))],
           pointwise(f"{tag}.mul_cos_backward", n, reads=e, writes=e),
           pointwise(f"{tag}.accumulate0", n, reads=2 * e, writes=e),
           pointwise(f"{tag}.accumulate1", n, reads=2 * e, writes=e)]
    return fwd, bwd


def rotary(s: BlockShape, style: RotaryStyle) -> MemoryBound:
    """Rotary embedding of q and k. Nothing large is saved: cos, sin or freqs_cis carry no
    gradient, so autograd keeps only them."""
    fq, bq = _rotary_one(s.n_q, s.e, style, "rope_q")
    fk, bk = _rotary_one(s.n_kv, s.e, style, "rope_k")
    return MemoryBound.of(fq + fk, bq + bk)


def attention_layout(s: BlockShape, *, qkv_fused: bool) -> MemoryBound:
    """Copies between the projections and the attention kernel (SDPA takes strided q, k, v
    whose last dimension is contiguous, so transposes are views; its output is laid out
    (b, s, heads, d), so ``transpose(1, 2).contiguous()`` copies nothing)."""
    e = s.e
    fwd: list[Kernel] = []
    bwd: list[Kernel] = []
    if qkv_fused:  # split is views; backward writes dq, dk, dv into one (T, h + 2 kv) grad
        width = s.tokens * (s.hidden + 2 * s.kv_dim)
        bwd.append(pointwise("cat_qkv_grad", width, reads=e, writes=e))
    if s.repeats_kv:  # expand + reshape materialises K and V per query head
        for t in ("k", "v"):
            fwd.append(Kernel("memory", 0.0, (s.n_kv + s.n_q) * e, name=f"repeat_kv.{t}"))
            bwd.append(Kernel("memory", s.n_q, (s.n_q + s.n_kv) * e,
                              name=f"repeat_kv.{t}.sum_backward"))
    return MemoryBound.of(fwd, bwd)


def activation(s: BlockShape, mlp: str, *, gelu: str = "native",
               autocast: bool = False) -> MemoryBound:
    """The MLP's activation between the up and down projections. Saved here: what the
    activation's own backward needs (its output, the down projection's input, is counted
    with the GEMM inputs). ``autocast``: torch.autocast is on (``_gelu_new_autocast``)."""
    n, e = s.n_f, s.e
    if mlp == "swiglu":
        return MemoryBound.of([pointwise("silu", n, reads=e, writes=e, flops_per_element=4),
                         pointwise("mul", n, reads=2 * e, writes=e)],
                        [pointwise("mul_backward.grad_silu", n, reads=2 * e, writes=e),
                         pointwise("mul_backward.grad_up", n, reads=2 * e, writes=e),
                         pointwise("silu_backward", n, reads=2 * e, writes=e,
                                   flops_per_element=6)],
                        saved_per_token=3 * e * s.ffn)  # gate, silu(gate), up
    if gelu == "python" and autocast and e != FP32:
        return _gelu_new_autocast(n, e, s.ffn)
    if gelu == "python":  # NewGELUActivation, op by op
        ops = [("pow3", 1), ("mul_c1", 1), ("add_x", 2), ("mul_c2", 1), ("tanh", 1),
               ("add_one", 1), ("mul_half", 1), ("mul", 2)]
        fwd = [pointwise(f"gelu_new.{name}", n, reads=r * e, writes=e) for name, r in ops]
        bops = [("mul_backward.a", 2), ("mul_backward.b", 2), ("tanh_backward", 2),
                ("mul_c2_backward", 1), ("mul_c1_backward", 1), ("pow_backward.pow2", 1),
                ("pow_backward.mul3", 1), ("pow_backward.mul_grad", 2),
                ("mul_half_backward", 1), ("accumulate0", 2), ("accumulate1", 2)]
        bwd = [pointwise(f"gelu_new.{name}", n, reads=r * e, writes=e) for name, r in bops]
        # pow saves x, tanh its output, the last mul both of its inputs
        return MemoryBound.of(fwd, bwd, saved_per_token=4 * e * s.ffn)
    return MemoryBound.of([pointwise("gelu", n, reads=e, writes=e, flops_per_element=8)],
                    [pointwise("gelu_backward", n, reads=2 * e, writes=e, flops_per_element=12)],
                    saved_per_token=e * s.ffn)  # its input


def _gelu_new_autocast(n: float, e: int, ffn: int) -> MemoryBound:
    """NewGELUActivation under torch.autocast: ``pow`` is on autocast's fp32 list (PyTorch
    autocast_mode.cpp ``KERNEL_CUDA2(pow, Tensor_Scalar, fp32)``; docs amp.rst "CUDA Ops that
    can autocast to float32"), so the 16-bit input is cast to fp32 for it and everything after
    it is fp32 by type promotion; only ``0.5 * input`` stays 16-bit. The fp32 output is cast
    back by the down projection's addmm (autocast's lower-precision list). Backward: autograd's
    engine casts each input gradient to its input's dtype (torch/csrc/autograd/engine.cpp
    validate_outputs), so the mul and add that mixed dtypes hand back one cast each."""
    f = FP32
    fwd = [pointwise("gelu_new.mul_half", n, reads=e, writes=e),
           pointwise("gelu_new.pow.autocast_to_fp32", n, reads=e, writes=f),
           *[pointwise(f"gelu_new.{name}", n, reads=r, writes=f) for name, r in (
               ("pow3", f), ("mul_c1", f), ("add_x", e + f), ("mul_c2", f), ("tanh", f),
               ("add_one", f), ("mul", e + f))],
           pointwise("gelu_new.autocast_to_16bit", n, reads=f, writes=e)]
    bops: list[tuple[str, float, float]] = [
        ("autocast_to_16bit_backward", e, f), ("mul_backward.a", 2 * f, f),
        ("mul_backward.a.to_16bit", f, e), ("mul_backward.b", e + f, f),
        ("tanh_backward", 2 * f, f), ("mul_c2_backward", f, f),
        ("add_x_backward.to_16bit", f, e), ("mul_c1_backward", f, f),
        ("pow_backward.pow2", f, f), ("pow_backward.mul3", f, f),
        ("pow_backward.mul_grad", 2 * f, f), ("pow.autocast_to_fp32_backward", f, e),
        ("mul_half_backward", e, e), ("accumulate0", 2 * e, e), ("accumulate1", 2 * e, e)]
    bwd = [pointwise(f"gelu_new.{name}", n, reads=r, writes=w) for name, r, w in bops]
    # pow saves its fp32 input, tanh its fp32 output, the last mul its 16-bit and fp32 inputs
    return MemoryBound.of(fwd, bwd, saved_per_token=(3 * f + e) * ffn)


def residual(s: BlockShape, *, dropout: bool, into_norm: bool = False,
             stream: int | None = None) -> MemoryBound:
    """``residual + dropout(branch)``; backward: the dropout's mask pass and the add where the
    stream's two gradients meet. ``stream``: the stream's dtype where it is wider than the
    branch's (fp32 under autocast): the add promotes, and the branch's gradient is cast back."""
    n, e = s.n_h, s.e
    r = stream or e
    fwd: list[Kernel] = []
    bwd: list[Kernel] = []
    if r != e:
        bwd.append(pointwise("add_residual_backward.to_16bit", n, reads=r, writes=e))
    if dropout:
        fwd.append(pointwise("native_dropout", n, reads=e, writes=e + 1))
        bwd.append(pointwise("native_dropout_backward", n, reads=e + 1, writes=e))
    fwd.append(pointwise("add_residual", n, reads=e + r, writes=r))
    bwd.append(pointwise("accumulate_residual_grad", n, reads=2 * r, writes=r))
    return MemoryBound.of(fwd, bwd, saved_per_token=s.hidden if dropout else 0.0)  # 1-byte mask
