"""A diffusers model config (``unet/config.json``) as a workload: ``UNet2DConditionModel``
(Stable Diffusion 1.x/2.x, SDXL) laid out by simulator/job/diffusion.py.

Keys read, with diffusers' defaults (``UNet2DConditionModel.__init__``): ``block_out_channels``,
``down_block_types``, ``up_block_types``, ``layers_per_block`` (2), ``attention_head_dim`` (8;
the number of heads, diffusers' own naming) or ``num_attention_heads``,
``transformer_layers_per_block`` (1), ``cross_attention_dim`` (1280), ``in_channels`` and
``out_channels`` (4), ``norm_num_groups`` (32), ``use_linear_projection`` (false),
``addition_embed_type`` "text_time" with ``projection_class_embeddings_input_dim`` (SDXL),
``sample_size`` (the latent side: images are 8x it).

Training defaults are those of diffusers' ``examples/text_to_image/train_text_to_image.py``
(and ``_sdxl.py``): ``train_batch_size`` 16, the resolution of ``sample_size``, AdamW, fp32
weights with mixed-precision autocast, no gradient checkpointing. A sample is one image
(``seq_len`` 1, so tokens/s reads images/s). The text encoders and the VAE are frozen and not
in the step: the SDXL script precomputes both (``compute_embeddings``, ``compute_vae_encodings``
with ``dataset.map``); SD 1.x's script runs them forward each step, which is left out.
Diffusion transformers (SD3's ``SD3Transformer2DModel``, Flux) are refused with one line.
"""

from __future__ import annotations

from typing import Any

from simulator.inputs.jsonfile import JsonDoc, Loc

CLASSES = ("UNet2DConditionModel",)
BLOCKS = ("DownBlock2D", "CrossAttnDownBlock2D", "UpBlock2D", "CrossAttnUpBlock2D")
TRAIN_BATCH = 16  # train_text_to_image.py --train_batch_size default
KNOWN = {"_class_name", "_diffusers_version", "_name_or_path", "act_fn", "attention_head_dim",
         "num_attention_heads", "block_out_channels", "center_input_sample",
         "class_embed_type", "class_embeddings_concat", "conv_in_kernel", "conv_out_kernel",
         "cross_attention_dim", "cross_attention_norm", "down_block_types",
         "downsample_padding", "dual_cross_attention", "encoder_hid_dim",
         "encoder_hid_dim_type", "flip_sin_to_cos", "freq_shift", "in_channels",
         "layers_per_block", "mid_block_only_cross_attention", "mid_block_scale_factor",
         "mid_block_type", "norm_eps", "norm_num_groups", "num_class_embeds",
         "only_cross_attention", "out_channels", "projection_class_embeddings_input_dim",
         "resnet_out_scale_factor", "resnet_skip_time_act", "resnet_time_scale_shift",
         "sample_size", "time_cond_proj_dim", "time_embedding_act_fn", "time_embedding_dim",
         "time_embedding_type", "timestep_post_act", "transformer_layers_per_block",
         "up_block_types", "upcast_attention", "use_linear_projection",
         "addition_embed_type", "addition_embed_type_num_heads", "addition_time_embed_dim",
         "attention_type", "reverse_transformer_layers_per_block", "dropout"}
# keys whose non-default value changes the layout in a way not modelled
UNMODELLED = {"class_embed_type": None, "encoder_hid_dim": None, "encoder_hid_dim_type": None,
              "dual_cross_attention": False, "only_cross_attention": False,
              "time_cond_proj_dim": None, "num_class_embeds": None,
              "mid_block_type": "UNetMidBlock2DCrossAttn", "conv_in_kernel": 3,
              "conv_out_kernel": 3, "resnet_time_scale_shift": "default",
              "time_embedding_dim": None, "reverse_transformer_layers_per_block": None}


def is_diffusers(doc: JsonDoc) -> bool:
    return "_class_name" in doc.data and "model_type" not in doc.data


def unet(doc: JsonDoc) -> dict[str, Any]:
    """The workload's ``unet`` keys and ``training`` defaults, or the one-line refusal."""
    cls = doc.get(("_class_name",), (str,), required=True)
    if cls not in CLASSES:
        raise doc.error(("_class_name",), f"{cls!r}: diffusion transformers and other "
                        f"diffusers models are not modelled; known: {', '.join(CLASSES)}")
    for key, default in UNMODELLED.items():
        value = doc.data.get(key, default)
        if value != default:
            raise doc.error((key,), f"{value!r} is not modelled (diffusers' default: "
                            f"{default!r})")
    extra = doc.get(("addition_embed_type",), (str,))
    if extra not in (None, "text_time"):
        raise doc.error(("addition_embed_type",), f"{extra!r} is not modelled (text_time or "
                        "none)")
    channels = _ints(doc, ("block_out_channels",), [320, 640, 1280, 1280])
    n = len(channels)
    down = _types(doc, ("down_block_types",), n)
    up = _types(doc, ("up_block_types",), n)
    heads_loc: Loc = ("num_attention_heads",) if doc.get(("num_attention_heads",), (int, list)) \
        is not None else ("attention_head_dim",)
    heads = _per_block(doc, heads_loc, 8, n)
    layers = _per_block(doc, ("transformer_layers_per_block",), 1, n)
    latent = doc.positive_int(("sample_size",), 64) or 64
    doc.warn_unknown((), KNOWN)
    return {"block_out_channels": channels, "down_block_types": down, "up_block_types": up,
            "layers_per_block": doc.positive_int(("layers_per_block",), 2) or 2,
            "heads": heads, "transformer_layers": layers,
            "cross_attention_dim": doc.positive_int(("cross_attention_dim",), 1280) or 1280,
            "in_channels": doc.positive_int(("in_channels",), 4) or 4,
            "out_channels": doc.positive_int(("out_channels",), 4) or 4,
            "norm_groups": doc.positive_int(("norm_num_groups",), 32) or 32,
            "linear_projection": doc.get(("use_linear_projection",), (bool,), False),
            "addition_embed_dim": doc.positive_int(("projection_class_embeddings_input_dim",),
                                                   None) or 0 if extra else 0,
            "image_size": 8 * latent}


def _ints(doc: JsonDoc, loc: Loc, default: list[int]) -> list[int]:
    values = doc.get(loc, (list,), default)
    if not values or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0
                             for v in values):
        raise doc.error(loc, "expected a list of positive integers")
    return list(values)


def _types(doc: JsonDoc, loc: Loc, n: int) -> list[str]:
    values = doc.get(loc, (list,), required=True)
    if len(values) != n:
        raise doc.error(loc, f"{len(values)} block types for {n} block_out_channels")
    for i, v in enumerate(values):
        if v not in BLOCKS:
            raise doc.error((*loc, i), f"{v!r} is not modelled; known: {', '.join(BLOCKS)}")
    return list(values)


def _per_block(doc: JsonDoc, loc: Loc, default: int, n: int) -> list[int]:
    value = doc.get(loc, (int, list), default)
    if isinstance(value, int):
        return [value] * n
    if len(value) != n or not all(isinstance(v, int) and v > 0 for v in value):
        raise doc.error(loc, f"expected one positive integer or {n} of them")
    return list(value)
