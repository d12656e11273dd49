"""Which memory-bound kernels each op of a transformer block runs (norms, rotary, layouts,
residual adds, activations), by the job's kernel regime and dtype flow. Eager modules under
torch.autocast over fp32 weights keep the residual stream in fp32 (simulator/job/eager.py: the
embedding, the promoting adds, LayerNorm on autocast's fp32 list), so their norms run in fp32
and each linear layer that reads one casts its output."""

from __future__ import annotations

from typing import TYPE_CHECKING

from simulator.job import eager
from simulator.job.kernels import FP32, NONE, BlockShape, MemoryBound, pointwise

if TYPE_CHECKING:
    from simulator.job.transformer_ops import Builder


def stream_fp32(bld: Builder) -> bool:
    """Whether the residual stream is fp32: eager kernels under torch.autocast over fp32
    weights (full fine-tuning: its weights are the fp32 master copy)."""
    return bld.autocast and bld.kernels == "eager" and bld.a != FP32 \
        and bld.job.finetune == "full"


def stream_bytes(bld: Builder) -> int:
    """Bytes per element of the residual stream."""
    return FP32 if stream_fp32(bld) else bld.a


def _readers(bld: Builder, block: int, op: str) -> int:
    """How many linear layers read a norm's output (under autocast each casts it)."""
    A = bld.arch
    nxt = {"attn_norm": (block, "mlp_in" if A.encoder else "qkv"),
           "mlp_norm": (block + 1, "qkv") if A.encoder else (block, "mlp_in"),
           "embedding_norm": (0, "qkv"), "final_norm": (block, "lm_head")}[op]
    if A.encoder and nxt[0] == A.layers:
        nxt = (A.layers, "qa_head")
    mods = [m for m in bld.by_op.get(nxt, []) if m.kind in ("linear", "conv1d")]
    return max(1, sum(m.in_features == A.hidden for m in mods))


def of(bld: Builder, block: int, op: str) -> MemoryBound:
    """The memory-bound work of one block op: the job's kernel regime's (eager.py,
    compiled.py, fused.py), in eager under autocast over fp32 weights on an fp32 stream."""
    A, s, r, k = bld.arch, bld.shape, bld.regime, bld.kernels
    dropout = bld.job.hidden_dropout
    post_ln = A.encoder
    if stream_fp32(bld) and op in ("attn_norm", "mlp_norm", "final_norm"):
        return eager.stream_norm(s, A.norm, _readers(bld, block, op))
    if stream_fp32(bld) and op in ("attn_out", "mlp_out") and not A.sandwich_norm:
        return eager.residual(s, dropout=dropout, stream=FP32)
    # where the residual add before a norm is folded into it (see compiled.py, fused.py)
    if op == "attn_norm":
        fold = k != "eager" if post_ln else (k == "fused" and block > 0)
        return r.norm(s, A.norm, residual=fold)  # type: ignore[no-any-return]
    if op == "mlp_norm":
        return r.norm(s, A.norm, residual=k != "eager")  # type: ignore[no-any-return]
    if op == "final_norm":  # compiled runs compile each block: the final norm stays eager
        regime = eager if k == "compiled" else r
        return regime.norm(s, A.norm, residual=k == "fused")  # type: ignore[no-any-return]
    if op == "embedding_norm":  # BertEmbeddings: LayerNorm, then dropout
        x = stream_bytes(bld)
        drop = MemoryBound.of(
            [pointwise("native_dropout", s.n_h, reads=x, writes=x + 1)],
            [pointwise("native_dropout_backward", s.n_h, reads=x + 1, writes=x)],
            saved_per_token=s.hidden) if dropout else NONE
        if stream_fp32(bld):
            return eager.stream_norm(s, A.norm, _readers(bld, block, op)) + drop
        return r.norm(s, A.norm) + drop  # type: ignore[no-any-return]
    if op == "qkv":
        rope = r.rotary(s, bld.job.recipe.rotary) if A.positions == "rotary" else NONE
        fused_qkv = A.family in ("gpt2", "mpt") or A.fused_projections
        norms = NONE
        for mod in bld.by_op.get((block, op), []):  # q_norm, k_norm; MLA's latent norms
            if mod.kind == "norm":
                rows = s.tokens * {"q_norm": A.heads, "k_norm": A.kv_heads}.get(mod.leaf, 1)
                norms += r.norm(BlockShape(rows, mod.in_features, 0, 0, 1, s.e), A.norm)
        return rope + norms + r.attention_layout(s, qkv_fused=fused_qkv)  # type: ignore[no-any-return]
    if op in ("attn_out", "mlp_out"):
        into = k == "fused" or (k == "compiled" and (op == "attn_out" or post_ln))
        out = r.residual(s, dropout=dropout, into_norm=into)
        if A.sandwich_norm:  # Gemma 2/3: the branch is normalised before the residual add
            out = r.norm(s, A.norm) + out
        return out  # type: ignore[no-any-return]
    if op == "mlp_act":
        if k == "eager":  # autocast's fp32 ops change what eager's python GELU moves
            return eager.activation(s, A.mlp, gelu=A.gelu, autocast=bld.job.recipe.autocast)
        return r.activation(s, A.mlp, gelu=A.gelu)  # type: ignore[no-any-return]
    return NONE
