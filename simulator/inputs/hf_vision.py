"""Vision-language configs: the language model from ``text_config`` (a Llama-layout decoder,
hf_decoders.py) and the image encoder from ``vision_config`` (simulator/job/vision.py).

- llava (LlavaForConditionalGeneration): ``text_config`` (its model_type, llama by default;
  LlamaConfig's defaults fill the keys the Hub's LLaVA configs leave out) and a CLIP
  ``vision_config`` (CLIPVisionConfig's defaults for missing keys); the projector maps the
  vision width to the text width.
- qwen2_vl: the Qwen2 language model's keys (top level, or ``text_config`` in newer files) and
  ``vision_config`` (``depth``, ``embed_dim``, ``mlp_ratio``, ``num_heads``, ``patch_size``,
  ``in_chans``). Its images come at any resolution: 448 x 448 pixels (1,024 patches, 256
  language-model tokens) is assumed unless a workload YAML says otherwise.
- gemma3 (multimodal) and mllama are refused, each with what is not modelled: Gemma 3's
  SigLIP tower, Mllama's cross-attention layers in the language model.
A missing ``vision_config`` is refused: the image encoder would go uncounted.
"""

from __future__ import annotations

from typing import Any

from simulator.inputs import hf_decoders
from simulator.inputs.jsonfile import JsonDoc, Loc

TYPES = ("llava", "qwen2_vl", "gemma3", "mllama")
# LlamaConfig's defaults (configuration_llama.py): the Hub's LLaVA text_config lists few keys
LLAMA_DEFAULTS = {"hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
                  "num_attention_heads": 32, "vocab_size": 32000,
                  "max_position_embeddings": 2048}
# CLIPVisionConfig's defaults (configuration_clip.py)
CLIP_DEFAULTS = {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12,
                 "num_attention_heads": 12, "image_size": 224, "patch_size": 32,
                 "num_channels": 3}
QWEN2_VL_IMAGE = 448  # assumed image side, pixels (the processor resizes to any multiple of 28)
TOP_KNOWN = {"text_config", "vision_config", "image_token_index", "image_token_id",
             "video_token_id", "vision_start_token_id", "vision_end_token_id",
             "vision_token_id", "projector_hidden_act", "vision_feature_select_strategy",
             "vision_feature_layer", "ignore_index", "image_seq_length",
             "multimodal_projector_bias", "rope_scaling", "vocab_size", "hidden_size"}
VISION_KNOWN = {"hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "image_size", "patch_size", "num_channels", "projection_dim", "model_type",
                "hidden_act", "layer_norm_eps", "attention_dropout", "initializer_range",
                "initializer_factor", "dropout", "vocab_size", "torch_dtype", "depth",
                "embed_dim", "mlp_ratio", "num_heads", "in_chans", "in_channels",
                "spatial_merge_size", "spatial_patch_size", "temporal_patch_size"}


def text_base(doc: JsonDoc, model_type: str) -> tuple[Loc, str]:
    """Where the language model's keys are, and its model_type."""
    if model_type == "gemma3":
        raise doc.error(("vision_config",), "gemma3's SigLIP vision tower is not modelled; "
                        "give its text model's config (model_type gemma3_text) to fine-tune "
                        "the language model alone")
    if model_type == "mllama":
        raise doc.error(("text_config", "cross_attention_layers"), "mllama's language model "
                        "has cross-attention layers to the image features: not modelled")
    if doc.get(("vision_config",), (dict,)) is None:
        raise doc.error(("vision_config",), f"{model_type} without its vision_config: the "
                        "image encoder cannot be laid out (give the model's full config.json)")
    if model_type == "qwen2_vl" and doc.get(("text_config",), (dict,)) is None:
        return (), "qwen2"
    text = doc.get(("text_config",), (dict,), required=True)
    kind = doc.get(("text_config", "model_type"), (str,), "llama")
    if kind not in hf_decoders.TYPES:
        raise doc.error(("text_config", "model_type"), f"{kind!r} is not a language model "
                        f"stepsim lays out; known: {', '.join(hf_decoders.TYPES)}")
    if kind == "llama":  # LlamaConfig's defaults for the keys the file leaves out
        for key, value in LLAMA_DEFAULTS.items():
            text.setdefault(key, value)
    return ("text_config",), kind


def vision(doc: JsonDoc, model_type: str) -> dict[str, Any]:
    """The image encoder's ``model.vision`` keys."""
    v: Loc = ("vision_config",)
    if model_type == "llava":
        def get(key: str) -> int:
            value = doc.positive_int((*v, key), CLIP_DEFAULTS[key])
            assert value is not None
            return value

        return {"layers": get("num_hidden_layers"), "hidden": get("hidden_size"),
                "heads": get("num_attention_heads"), "ffn_hidden": get("intermediate_size"),
                "patch": get("patch_size"), "image_size": get("image_size"),
                "channels": get("num_channels"), "layout": "clip"}
    width = doc.positive_int((*v, "embed_dim"), 1280) or 1280
    ratio = doc.get((*v, "mlp_ratio"), (int, float), 4)
    return {"layers": doc.positive_int((*v, "depth"), 32) or 32, "hidden": width,
            "heads": doc.positive_int((*v, "num_heads"), 16) or 16,
            "ffn_hidden": int(width * ratio), "patch": doc.positive_int((*v, "patch_size"),
                                                                         14) or 14,
            "image_size": QWEN2_VL_IMAGE,
            "channels": doc.positive_int((*v, "in_chans"), 3) or 3, "layout": "qwen2_vl"}
