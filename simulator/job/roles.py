"""Which op of a transformer block each module belongs to (its weights, its kernels), and the
ops of a block in forward order: decoders, BERT's post-LN encoder, a mixture of experts."""

from __future__ import annotations

from typing import TYPE_CHECKING

from simulator.job import moe, vision

if TYPE_CHECKING:
    from simulator.job.modules import Module


# Which op of a block each module's weights belong to (leaf name; GPT-2's c_proj by parent).
_ROLE = {
    "input_layernorm": "attn_norm", "ln_1": "attn_norm", "norm_1": "attn_norm",
    "q_proj": "qkv", "k_proj": "qkv", "v_proj": "qkv", "c_attn": "qkv", "Wqkv": "qkv",
    "o_proj": "attn_out", "out_proj": "attn_out",
    "post_attention_layernorm": "mlp_norm", "ln_2": "mlp_norm", "norm_2": "mlp_norm",
    "gate_proj": "mlp_in", "up_proj": "mlp_in", "c_fc": "mlp_in",
    "down_proj": "mlp_out",
    # Qwen3's q_norm / k_norm and MLA's projections and norms run inside the q/k/v op
    "q_norm": "qkv", "k_norm": "qkv", "q_a_proj": "qkv", "q_a_layernorm": "qkv",
    "q_b_proj": "qkv", "kv_a_proj_with_mqa": "qkv", "kv_a_layernorm": "qkv", "kv_b_proj": "qkv",
    "qkv_proj": "qkv", "gate_up_proj": "mlp_in",  # Phi-3's fused projections
    "sinks": "attention",  # gpt-oss: the softmax's per-head logit, inside the attention core
    # Gemma 2/3 (sandwich): the MLP's input norm, and the norm of its output
    "pre_feedforward_layernorm": "mlp_norm", "post_feedforward_layernorm": "mlp_out",
}
BLOCK_OPS = ("attn_norm", "qkv", "attention", "attn_out", "mlp_norm", "mlp_in", "mlp_act",
             "mlp_out")
MOE_BLOCK_OPS = BLOCK_OPS[:5] + moe.MOE_OPS  # a mixture of experts in place of the MLP
EVERY_BLOCK_OP = frozenset(BLOCK_OPS + moe.MOE_OPS)
# BERT is post-LN: each sub-layer's LayerNorm follows its residual add (modeling_bert.py
# BertSelfOutput / BertOutput: LayerNorm(dropout(dense(x)) + input)).
POST_LN_BLOCK_OPS = ("qkv", "attention", "attn_out", "attn_norm", "mlp_in", "mlp_act",
                      "mlp_out", "mlp_norm")
# BERT module paths inside a layer -> op (checked in order: "attention.output.dense" before
# "output.dense").
_BERT_ROLE = (("attention.self.", "qkv"), ("attention.output.dense", "attn_out"),
              ("attention.output.LayerNorm", "attn_norm"), ("intermediate.dense", "mlp_in"),
              ("output.dense", "mlp_out"), ("output.LayerNorm", "mlp_norm"))


def role(mod: Module, n_layers: int, sandwich: bool = False) -> str:
    """The op of ``mod``: by its leaf name, its parent (GPT-2's c_proj), its place (the
    embedding, the head, the final norm), or the expert layout (moe.role)."""
    if vision.is_vision(mod):
        return "vision"
    if mod.kind == "embedding":
        return "embedding"
    if mod.path == "lm_head":
        return "lm_head"
    if mod.path == "qa_outputs":
        return "qa_head"
    if mod.kind == "norm" and mod.block == -1:  # BERT's embedding LayerNorm
        return "embedding_norm"
    if mod.block == n_layers:
        return "final_norm"
    if ".encoder.layer." in mod.path:
        return next(role for part, role in _BERT_ROLE if part in mod.path)
    if mod.leaf == "c_proj":
        return "attn_out" if ".attn." in mod.path else "mlp_out"
    if sandwich and mod.leaf == "post_attention_layernorm":  # Gemma 2: on attention's output
        return "attn_out"
    return moe.role(mod) or _ROLE[mod.leaf]
