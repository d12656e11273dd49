"""Hugging Face decoder configs in the Llama layout (RMSNorm, rotary, gated MLP): the fields
of stepsim's ``model:`` from each ``model_type``'s config keys, as transformers lays the model
out (``models/<type>/modeling_<type>.py`` and ``configuration_<type>.py`` of 4.x).

- llama: q/k/v/o_proj ``bias=attention_bias``, gate/up/down ``bias=mlp_bias``; ``head_dim`` or
  hidden / heads; ties nothing. mistral: every bias False. qwen2: q/k/v ``bias=True``, the rest
  False. gemma: GeGLU (three projections as SwiGLU), ``head_dim`` (256), tied embeddings.
- qwen3: Qwen3Attention adds ``q_norm`` and ``k_norm`` (RMSNorm of head_dim) after o_proj;
  ``head_dim`` 128 by default, so q_proj is heads x 128 wide whatever the hidden size.
- mixtral: MixtralSparseMoeBlock (``block_sparse_moe``: gate, experts w1/w2/w3) of
  ``num_local_experts`` experts of ``intermediate_size``, top ``num_experts_per_tok``.
- qwen2_moe / qwen3_moe: ``num_experts`` of ``moe_intermediate_size``; a block is sparse when
  it is not in ``mlp_only_layers`` and ``(i + 1) % decoder_sparse_step == 0`` (else a dense MLP
  of ``intermediate_size``); qwen2_moe adds a shared expert of
  ``shared_expert_intermediate_size`` and its gate, and biases on q/k/v; qwen3_moe q/k norms.
- phi3: Phi3Attention's one ``qkv_proj`` (q + 2 kv wide) and o_proj; Phi3MLP's one
  ``gate_up_proj`` (2 x intermediate) and down_proj; no biases; ``sliding_window`` on every
  layer (Phi-3-mini-4k: 2047).
- gemma2: ``head_dim`` (256) whatever hidden / heads; four norms a block (Gemma2DecoderLayer:
  input, post_attention, pre_feedforward, post_feedforward); ``attn_logit_softcapping`` and
  ``final_logit_softcapping`` (cap * tanh(x / cap) on the scores and the logits); local
  attention over ``sliding_window`` on the even blocks (``layer_types``, else every second:
  ``bool((i + 1) % 2)``); tied embeddings. Training uses eager attention, as transformers
  asks for Gemma 2 (the soft-capped scores are materialised).
- gemma3_text: as gemma2 with q_norm and k_norm instead of soft-capping and five local blocks
  to one global (``layer_types``, else ``sliding_window_pattern`` 6).
- deepseek_v2 / deepseek_v3: multi-head latent attention (``q_lora_rank`` (None: q_proj),
  ``kv_lora_rank``, ``qk_nope_head_dim``, ``qk_rope_head_dim``, ``v_head_dim``);
  ``n_routed_experts`` of ``moe_intermediate_size``, ``n_shared_experts`` of that width as one
  MLP; a block is sparse from ``first_k_dense_replace`` on, every ``moe_layer_freq``-th. V3's
  multi-token-prediction layers (``num_nextn_predict_layers``) are not built by transformers.
- gpt_oss (configuration_gpt_oss.py, modeling_gpt_oss.py): q/k/v/o_proj ``bias=attention_bias``
  (True), ``head_dim`` (64) whatever hidden / heads, a sink logit per head (``sinks``);
  GptOssMLP of ``num_local_experts`` experts of ``intermediate_size``, top
  ``num_experts_per_tok``, router and experts with biases (moe.py); local attention over
  ``sliding_window`` (128) on the blocks ``layer_types`` names, else every second from the
  first (``bool((i + 1) % 2)``). GptOssPreTrainedModel sets ``_supports_sdpa = False``: it
  trains with eager attention (or a sink-aware FlashAttention-3 kernel on Hopper).
"""

from __future__ import annotations

from typing import Any

from simulator.inputs.jsonfile import JsonDoc, Loc
from simulator.inputs.schema import MAX_LAYERS

Fields = dict[str, tuple[Any, Loc]]  # ModelConfig key -> (value, the config key it came from)

TYPES = ("llama", "mistral", "qwen2", "gemma", "qwen3", "phi3", "gemma2", "gemma3_text",
         "mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v2", "deepseek_v3", "gpt_oss")
MOE_TYPES = ("mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v2", "deepseek_v3", "gpt_oss")
# each configuration_<type>.py's tie_word_embeddings default
TIED = {"llama": False, "mistral": False, "qwen2": False, "gemma": True, "qwen3": False,
        "phi3": False, "gemma2": True, "gemma3_text": True,
        "mixtral": False, "qwen2_moe": False, "qwen3_moe": False, "deepseek_v2": False,
        "deepseek_v3": False, "gpt_oss": False}
# Read, with no effect on the layout: norm epsilons, activations (the MLP's shape is the same),
# rotary settings, routing details that do not change a step's kernels or sizes
KNOWN = {"hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
         "intermediate_size", "vocab_size", "head_dim", "attention_bias", "mlp_bias",
         "attention_dropout", "max_position_embeddings", "hidden_act", "hidden_activation",
         "rms_norm_eps", "rope_theta", "rope_scaling", "rope_parameters", "pretraining_tp",
         "sliding_window", "use_sliding_window", "max_window_layers", "use_mrope", "layer_types",
         # mixtures of experts
         "num_local_experts", "num_experts", "num_experts_per_tok", "moe_intermediate_size",
         "shared_expert_intermediate_size", "decoder_sparse_step", "mlp_only_layers",
         "norm_topk_prob", "router_aux_loss_coef", "output_router_logits", "router_jitter_noise",
         "n_routed_experts", "n_shared_experts", "first_k_dense_replace", "moe_layer_freq",
         "routed_scaling_factor", "scoring_func", "topk_method", "n_group", "topk_group",
         "aux_loss_alpha", "seq_aux", "ep_size", "num_nextn_predict_layers",
         # multi-head latent attention
         "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
         # phi3, gemma2, gemma3
         "resid_pdrop", "embd_pdrop", "original_max_position_embeddings", "partial_rotary_factor",
         "query_pre_attn_scalar", "attn_logit_softcapping", "final_logit_softcapping",
         "sliding_window_pattern", "rope_local_base_freq", "cache_implementation",
         "final_logit_soft_cap", "attention_chunk_size", "sliding_window_size",
         # gpt_oss: the clamped SwiGLU's constants, the context before YaRN, a duplicate top-k
         "swiglu_alpha", "swiglu_limit", "initial_context_length", "experts_per_token"}


def fields(doc: JsonDoc, model_type: str, base: Loc = ()) -> Fields:
    """stepsim's model keys of a Llama-layout decoder config (at ``base`` inside the file: a
    vision-language model's ``text_config``)."""
    def at(key: str) -> Loc:
        return (*base, key)

    hidden = _int(doc, at("hidden_size"))
    heads = _int(doc, at("num_attention_heads"))
    head_dim = doc.positive_int(at("head_dim"), 128 if model_type in ("qwen3", "qwen3_moe")
                                else 64 if model_type == "gpt_oss" else None)
    attention_bias = doc.get(at("attention_bias"), (bool,), False)
    mlp_bias = doc.get(at("mlp_bias"), (bool,), False) if model_type == "llama" else False
    if attention_bias != mlp_bias and model_type == "llama":
        raise doc.error(at("attention_bias"), f"attention_bias {str(attention_bias).lower()} "
                        f"with mlp_bias {str(mlp_bias).lower()}: stepsim gives o_proj and the "
                        "MLP biases together (write a workload YAML with qkv_bias and bias)")
    if model_type == "gpt_oss":  # GptOssAttention: q/k/v/o all bias=attention_bias (True)
        attention_bias = doc.get(at("attention_bias"), (bool,), True)
    elif model_type != "llama":
        attention_bias = False  # the o_proj of these has bias=False (config flag or not)
    qkv_bias = model_type in ("qwen2", "qwen2_moe") or doc.get(
        at("attention_bias"), (bool,), model_type == "gpt_oss")
    out: Fields = {
        "family": ("llama", at("model_type")),
        "layers": (_layers(doc, at("num_hidden_layers")), at("num_hidden_layers")),
        "hidden": (hidden, at("hidden_size")), "heads": (heads, at("num_attention_heads")),
        "kv_heads": (doc.positive_int(at("num_key_value_heads"), heads),
                     at("num_key_value_heads")),
        "ffn_hidden": (_int(doc, at("intermediate_size")), at("intermediate_size")),
        "vocab": (_int(doc, at("vocab_size")), at("vocab_size")),
        "tie_embeddings": (doc.get(at("tie_word_embeddings"), (bool,), TIED[model_type]),
                           at("tie_word_embeddings")),
        "bias": (attention_bias, at("attention_bias")),
        "qkv_bias": (qkv_bias and not model_type.startswith("deepseek"), at("attention_bias")),
    }
    if head_dim is not None and head_dim * heads != hidden:
        out["head_dim"] = (head_dim, at("head_dim"))
    if model_type in ("qwen3", "qwen3_moe", "gemma3_text"):
        out["qk_norm"] = (True, at("model_type"))
    if model_type == "phi3":
        out["fused_projections"] = (True, at("model_type"))
    layers = out["layers"][0]
    window = doc.positive_int(at("sliding_window"))
    if model_type == "phi3" and window:
        out["sliding_window"] = (window, at("sliding_window"))
        out["local_layers"] = (list(range(layers)), at("sliding_window"))
    if model_type == "gpt_oss":
        out["attention_sinks"] = (True, at("model_type"))
        out.update(_local_layers(doc, model_type, base, layers, window))
    if model_type in ("gemma2", "gemma3_text"):
        out["sandwich_norm"] = (True, at("model_type"))
        out.update(_local_layers(doc, model_type, base, layers, window))
        for key, name in (("attn_logit_softcapping", "attention_softcap"),
                          ("final_logit_softcapping", "logit_softcap")):
            cap = doc.get(at(key), (int, float), 50.0 if model_type == "gemma2" and
                          key.startswith("attn") else 30.0 if model_type == "gemma2" else None)
            if cap is not None:
                out[name] = (float(cap), at(key))
    if model_type.startswith("deepseek"):
        out["mla"] = (_mla(doc, base), at("kv_lora_rank"))
    if model_type in MOE_TYPES:
        out["moe"] = (_moe(doc, model_type, base), at(_experts_key(model_type)))
    return out


def _local_layers(doc: JsonDoc, model_type: str, base: Loc, layers: int,
                  window: int | None) -> Fields:
    """Gemma's local blocks: ``layer_types`` where given, else its pattern."""
    loc = (*base, "layer_types")
    kinds = doc.get(loc, (list,))
    if kinds is not None:
        if len(kinds) != layers or not all(k in ("sliding_attention", "full_attention")
                                          for k in kinds):
            raise doc.error(loc, f"expected {layers} entries of sliding_attention or "
                            "full_attention")
        local = [i for i, k in enumerate(kinds) if k == "sliding_attention"]
    else:
        step = 2 if model_type in ("gemma2", "gpt_oss") else (
            doc.positive_int((*base, "sliding_window_pattern"), 6) or 6)
        local = [i for i in range(layers) if (i + 1) % step]
    if not local:
        return {}
    if window is None:  # the configs' defaults
        window = {"gemma2": 4096, "gpt_oss": 128}.get(model_type, 512)
    return {"sliding_window": (window, (*base, "sliding_window")),
            "local_layers": (local, loc)}


def _experts_key(model_type: str) -> str:
    return {"mixtral": "num_local_experts", "gpt_oss": "num_local_experts",
            "deepseek_v2": "n_routed_experts",
            "deepseek_v3": "n_routed_experts"}.get(model_type, "num_experts")


def _moe(doc: JsonDoc, model_type: str, base: Loc) -> dict[str, Any]:
    def at(key: str) -> Loc:
        return (*base, key)

    layers = _layers(doc, at("num_hidden_layers"))
    experts = _int(doc, at(_experts_key(model_type)))
    top_k = _int(doc, at("num_experts_per_tok"))
    if model_type in ("mixtral", "gpt_oss"):  # each expert intermediate_size wide
        return {"experts": experts, "experts_per_token": top_k,
                "ffn_hidden": _int(doc, at("intermediate_size")), "names": model_type}
    ffn = _int(doc, at("moe_intermediate_size"))
    if model_type.startswith("deepseek"):
        first = _count(doc, at("first_k_dense_replace"))
        freq = doc.positive_int(at("moe_layer_freq"), 1) or 1
        shared = _count(doc, at("n_shared_experts"))
        dense = [i for i in range(layers) if not (i >= first and i % freq == 0)]
        return {"experts": experts, "experts_per_token": top_k, "ffn_hidden": ffn,
                "shared_ffn_hidden": shared * ffn, "dense_layers": dense, "names": "deepseek"}
    step = doc.positive_int(at("decoder_sparse_step"), 1) or 1
    only = doc.get(at("mlp_only_layers"), (list,), [])
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in only):
        raise doc.error(at("mlp_only_layers"), "expected a list of layer indices")
    dense = [i for i in range(layers) if i in only or (i + 1) % step != 0]
    shared = 0
    if model_type == "qwen2_moe":
        shared = _count(doc, at("shared_expert_intermediate_size"))
    return {"experts": experts, "experts_per_token": top_k, "ffn_hidden": ffn,
            "shared_ffn_hidden": shared, "shared_expert_gate": bool(shared),
            "dense_layers": dense, "names": "qwen"}


def _mla(doc: JsonDoc, base: Loc) -> dict[str, Any]:
    """DeepseekV2Config's defaults where a key is left out."""
    def get(key: str, default: int | None) -> int | None:
        return doc.positive_int((*base, key), default)

    # null: q_proj straight from the hidden state (DeepSeek-V2-Lite); absent: the default
    q_rank = get("q_lora_rank", None) if "q_lora_rank" in _section(doc, base) else 1536
    return {"q_lora_rank": q_rank, "kv_lora_rank": get("kv_lora_rank", 512),
            "qk_nope_head_dim": get("qk_nope_head_dim", 128),
            "qk_rope_head_dim": get("qk_rope_head_dim", 64),
            "v_head_dim": get("v_head_dim", 128)}


def _section(doc: JsonDoc, base: Loc) -> dict[str, Any]:
    data: Any = doc.data
    for key in base:
        data = data.get(key, {}) if isinstance(data, dict) else {}
    return data if isinstance(data, dict) else {}


def _count(doc: JsonDoc, loc: Loc) -> int:
    """A count that may be 0 (or null, or absent: 0)."""
    value = doc.get(loc, (int,), 0)
    if value < 0:
        raise doc.error(loc, f"must be at least 0, got {value}")
    return int(value)


def _layers(doc: JsonDoc, loc: Loc) -> int:
    """The layer count, bounded before any per-layer list is built from it (the schema's
    bound, which the model block checks only after)."""
    value = _int(doc, loc)
    if value > MAX_LAYERS:
        raise doc.error(loc, f"must be at most {MAX_LAYERS:,}, got {value:,}")
    return value


def _int(doc: JsonDoc, loc: Loc) -> int:
    value = doc.positive_int(loc, required=True)
    assert value is not None
    return value
