"""A Hugging Face ``config.json`` as a workload: ``-w hf:path/to/config.json`` (or its folder).

What is inside: ``load(name)`` reads the config of a ``model_type`` the job model can lay out
(the Llama-layout decoders of simulator/inputs/hf_decoders.py: llama, mistral, qwen2, gemma,
qwen3, and the mixtures of experts mixtral, qwen2_moe, qwen3_moe, deepseek_v2, deepseek_v3;
gpt2; mpt) and returns the :class:`WorkloadConfig` a workload YAML would give, so the
parameter count is transformers' own. A model's config holds no training keys: the flags set
them (``--seq-len``, ``--micro-batch``, ``--grad-accum``, the recipe flags, ``--peft``,
``--deepspeed``) over the defaults of a Hugging Face fine-tune below (full fine-tune
otherwise).

Parameter layout, from transformers (``models/<type>/modeling_<type>.py``); the Llama-layout
types are described in hf_decoders.py:
- gpt2: GPT2MLP ``inner_dim = n_inner or 4 * n_embd``, wpe of ``n_positions`` rows, biases
  everywhere, lm_head tied (GPT2Config ``tie_word_embeddings=True``).
- mpt: the Hub's MPT configs run llm-foundry's code (their ``auto_map``): ffn of
  ``expansion_ratio * d_model`` (or ``ffn_config.ffn_hidden_size``), no biases with
  ``no_bias``, ALiBi (``attn_config.alibi``) or else a learned wpe, k/v heads from
  ``attn_config.attn_type`` (multi-query: 1; grouped-query: ``kv_n_heads``), tied embeddings.

A shape the job model cannot express (an o_proj bias without MLP biases) is refused with its
file, line and key; an unknown ``model_type`` with one line naming the known ones.
``quantization_config`` of bitsandbytes 4-bit makes the job QLoRA. Keys the reader does not
know are reported on stderr, one line each, and ignored.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from simulator.errors import InputError, quoted
from simulator.inputs import hf_decoders, hf_diffusers, hf_vision
from simulator.inputs.jsonfile import JsonDoc, Loc, read

if TYPE_CHECKING:  # pydantic and the models load with the first file validated, not before
    from simulator.inputs.schema import WorkloadConfig

Fields = dict[str, tuple[Any, Loc]]  # ModelConfig key -> (value, the config key it came from)

PREFIX = "hf:"
# Where no flag is given: TRL SFTConfig max_length 1024 (trl/trainer/sft_config.py), capped by
# the model's context; TrainingArguments per_device_train_batch_size 8
# (transformers/training_args.py).
DEFAULT_SEQ_LEN = 1024
DEFAULT_MICRO_BATCH = 8
LLAMA_LAYOUT = hf_decoders.TYPES
MODEL_TYPES = (*LLAMA_LAYOUT, *hf_vision.TYPES, "gpt2", "mpt")

# Keys every PretrainedConfig may carry that do not change a training step's shape or time.
_COMMON = {"architectures", "_name_or_path", "model_type", "torch_dtype", "dtype",
           "transformers_version", "bos_token_id", "eos_token_id", "pad_token_id",
           "sep_token_id", "decoder_start_token_id", "use_cache", "initializer_range",
           "tie_word_embeddings", "quantization_config", "auto_map", "id2label", "label2id",
           "task_specific_params", "problem_type", "output_attentions", "output_hidden_states",
           "return_dict", "torchscript", "is_decoder", "is_encoder_decoder", "tokenizer_class",
           "finetuning_task", "pruned_heads", "chunk_size_feed_forward", "num_labels",
           "max_length", "attn_implementation", "_attn_implementation_autoset"}
_GPT2_KNOWN = {"n_embd", "n_layer", "n_head", "n_inner", "n_positions", "n_ctx", "vocab_size",
               "attn_pdrop", "resid_pdrop", "embd_pdrop", "activation_function",
               "layer_norm_epsilon", "scale_attn_weights", "scale_attn_by_inverse_layer_idx",
               "reorder_and_upcast_attn", "add_cross_attention", "n_special",
               "predict_special_tokens", "summary_type", "summary_use_proj",
               "summary_activation", "summary_proj_to_labels", "summary_first_dropout"}
_MPT_KNOWN = {"d_model", "n_layers", "n_heads", "expansion_ratio", "vocab_size", "max_seq_len",
              "no_bias", "attn_config", "ffn_config", "learned_pos_emb", "norm_type",
              "emb_pdrop", "resid_pdrop", "embedding_fraction", "init_config", "init_device",
              "logit_scale", "verbose", "tokenizer_name", "layer_norm_epsilon",
              "use_pad_tok_in_ffn", "fc_type", "block_overrides", "final_logit_softcapping"}
_MPT_ATTN_KNOWN = {"alibi", "alibi_bias_max", "attn_impl", "attn_pdrop", "attn_type",
                   "attn_uses_sequence_id", "clip_qkv", "prefix_lm", "qk_ln", "qk_gn",
                   "softmax_scale", "kv_n_heads", "rope", "rope_theta", "rope_impl",
                   "rope_dail_config", "rope_hf_config", "sliding_window_size", "fused_qkv"}
_TIED = {"llama": False, "mistral": False, "qwen2": False, "gemma": True, "gpt2": True,
         "mpt": True}  # each configuration_<type>.py's tie_word_embeddings default


def config_path(name: str) -> Path:
    """The config.json a Hugging Face workload names (``hf:`` optional): the file, or
    ``config.json`` in a folder."""
    given = name.removeprefix(PREFIX)
    if not given:
        raise InputError("hf: needs a path to a config.json or the folder holding it")
    path = Path(given)
    with contextlib.suppress(OSError):  # a name too long to be a path: jsonfile.read says so
        if path.is_dir():
            path = path / "config.json"
            if not path.is_file():
                raise InputError("the folder holds no config.json", file=given)
    return path


def load(name: str) -> WorkloadConfig:
    """The workload of the Hugging Face config ``name`` (a path, ``hf:`` optional)."""
    path = config_path(name)
    doc = read(path, "a Hugging Face config.json")
    if hf_diffusers.is_diffusers(doc):  # a diffusers unet/config.json
        return _diffusers(doc, path)
    model_type = doc.get(("model_type",), (str,), required=True)
    if model_type not in MODEL_TYPES:
        raise doc.error(("model_type",), f"{quoted(model_type)} is not one stepsim lays out; "
                        f"known: {', '.join(MODEL_TYPES)} (or write a workload YAML, "
                        "docs/inputs.md)")
    fields: Fields
    if model_type in LLAMA_LAYOUT:
        fields = hf_decoders.fields(doc, model_type)
        seq = _context(doc, "max_position_embeddings")
        dropout: Loc = ("attention_dropout",)
        known = hf_decoders.KNOWN
    elif model_type in hf_vision.TYPES:  # the language model of text_config, and the images
        base, text_type = hf_vision.text_base(doc, model_type)
        fields = hf_decoders.fields(doc, text_type, base)
        fields["vision"] = (hf_vision.vision(doc, model_type), ("vision_config",))
        seq = _context(doc, "max_position_embeddings") if not base else min(
            doc.positive_int((*base, "max_position_embeddings"), DEFAULT_SEQ_LEN)
            or DEFAULT_SEQ_LEN, DEFAULT_SEQ_LEN)
        dropout = (*base, "attention_dropout")
        known = hf_vision.TOP_KNOWN | (hf_decoders.KNOWN if not base else set())
        if base:
            doc.warn_unknown(base, hf_decoders.KNOWN | _COMMON)
        doc.warn_unknown(("vision_config",), hf_vision.VISION_KNOWN | _COMMON)
        model_type = f"{model_type} ({text_type} language model)"
    elif model_type == "gpt2":
        fields, seq = _gpt2(doc), _context(doc, "n_positions", 1024)
        dropout = ("attn_pdrop",)
        known = _GPT2_KNOWN
    else:
        fields, seq = _mpt(doc), _context(doc, "max_seq_len", 2048)
        dropout = ("attn_config", "attn_pdrop")
        known = _MPT_KNOWN
        doc.warn_unknown(("attn_config",), _MPT_ATTN_KNOWN)
    doc.warn_unknown((), known | _COMMON)
    # GPT2Config attn_pdrop defaults to 0.1; the others' attention dropout to 0
    rate = doc.get(dropout, (float,), 0.1 if model_type == "gpt2" else 0.0)
    if not 0 <= rate < 1:
        raise doc.error(dropout, f"a dropout rate is in [0, 1), got {rate:g}")
    training_attention: str | None = None
    if model_type == "gemma2" and doc.get(("attn_logit_softcapping",), (int, float), 50.0):
        # transformers: "It is strongly recommended to train Gemma2 models with the `eager`
        # attention implementation" (models/gemma2/modeling_gemma2.py): SDPA cannot cap scores
        training_attention = "eager"
    if model_type == "gpt_oss":  # GptOssPreTrainedModel._supports_sdpa = False: the sinks
        training_attention = "eager"
    if model_type == "mistral" and doc.get(("sliding_window",), (int,)) and \
            doc.get(("use_sliding_window",), (bool,), True):
        doc.warn(("sliding_window",), f"{doc.data['sliding_window']}-token window not modelled: "
                 "attention over the whole sequence is timed (the same up to the window)")
    training: dict[str, Any] = {"seq_len": seq, "micro_batch": DEFAULT_MICRO_BATCH,
                                "finetune": "full", "dropout": rate}
    if training_attention is not None:
        training["attention"] = training_attention
    if _four_bit(doc):
        # PEFT prepare_model_for_kbit_training turns gradient checkpointing on by default
        training.update(finetune="qlora", activation_checkpointing="full")
    workload = _workload(doc, path, model_type, fields, training)
    doc.show_warnings()
    return workload


def _gpt2(doc: JsonDoc) -> Fields:
    if doc.get(("add_cross_attention",), (bool,), False):
        raise doc.error(("add_cross_attention",), "cross-attention blocks (an encoder-decoder "
                        "GPT-2) are not modelled")
    hidden = _int(doc, "n_embd")
    return {"family": ("gpt2", ("model_type",)), "layers": (_int(doc, "n_layer"), ("n_layer",)),
            "hidden": (hidden, ("n_embd",)), "heads": (_int(doc, "n_head"), ("n_head",)),
            "ffn_hidden": (doc.positive_int(("n_inner",), 4 * hidden), ("n_inner",)),
            "vocab": (_int(doc, "vocab_size"), ("vocab_size",)),
            "max_positions": (doc.positive_int(("n_positions",), 1024), ("n_positions",)),
            "tie_embeddings": (doc.get(("tie_word_embeddings",), (bool,), True),
                               ("tie_word_embeddings",))}


def _mpt(doc: JsonDoc) -> Fields:
    hidden = _int(doc, "d_model")
    heads = _int(doc, "n_heads")
    attn: Loc = ("attn_config",)
    kind = doc.get((*attn, "attn_type"), (str,), "multihead_attention")
    kv_heads = {"multihead_attention": heads, "multiquery_attention": 1}.get(kind)
    if kind == "grouped_query_attention":
        kv_heads = doc.positive_int((*attn, "kv_n_heads"), 1)
    if kv_heads is None:
        raise doc.error((*attn, "attn_type"), f"{quoted(kind)}: expected multihead_attention, "
                        "multiquery_attention or grouped_query_attention")
    if doc.get((*attn, "rope"), (bool,), False):
        raise doc.error((*attn, "rope"), "rotary MPT is not modelled (ALiBi or learned "
                        "positions)")
    ffn_type = doc.get(("ffn_config", "ffn_type"), (str,), "mptmlp")
    if ffn_type not in ("mptmlp", "te_ln_mlp"):
        raise doc.error(("ffn_config", "ffn_type"), f"{quoted(ffn_type)}: only MPT's plain MLP "
                        "(mptmlp) is modelled")
    ratio = doc.get(("expansion_ratio",), (int, float), 4)
    ffn = doc.positive_int(("ffn_config", "ffn_hidden_size"), int(ratio * hidden))
    # transformers' MptAttentionConfig alibi default True; without ALiBi llm-foundry learns wpe
    alibi = doc.get((*attn, "alibi"), (bool,), True)
    if not alibi and not doc.get(("learned_pos_emb",), (bool,), True):
        raise doc.error(("learned_pos_emb",), "an MPT with neither ALiBi nor learned positions "
                        "is not modelled")
    norm = doc.get(("norm_type",), (str,), "low_precision_layernorm")
    return {"family": ("mpt", ("model_type",)), "layers": (_int(doc, "n_layers"), ("n_layers",)),
            "hidden": (hidden, ("d_model",)), "heads": (heads, ("n_heads",)),
            "kv_heads": (kv_heads, (*attn, "attn_type")),
            "ffn_hidden": (ffn, ("expansion_ratio",)),
            "vocab": (_int(doc, "vocab_size"), ("vocab_size",)),
            "bias": (not doc.get(("no_bias",), (bool,), True), ("no_bias",)),
            "positions": ("alibi" if alibi else "learned", (*attn, "alibi")),
            "max_positions": (doc.positive_int(("max_seq_len",), 2048), ("max_seq_len",)),
            "norm": ("rmsnorm" if "rmsnorm" in norm else "layernorm", ("norm_type",)),
            "tie_embeddings": (doc.get(("tie_word_embeddings",), (bool,), True),
                               ("tie_word_embeddings",))}


def _int(doc: JsonDoc, key: str) -> int:
    value = doc.positive_int((key,), required=True)
    assert value is not None
    return value


def _context(doc: JsonDoc, key: str, default: int = DEFAULT_SEQ_LEN) -> int:
    context = doc.positive_int((key,), default)
    assert context is not None
    return min(context, DEFAULT_SEQ_LEN)


def _four_bit(doc: JsonDoc) -> bool:
    """bitsandbytes 4-bit weights (a pre-quantized or load_in_4bit model): QLoRA."""
    q: Loc = ("quantization_config",)
    if doc.get(q, (dict,)) is None:
        return False
    method = doc.get((*q, "quant_method"), (str,), "bitsandbytes")
    if method == "mxfp4":  # gpt-oss's published experts
        doc.warn(q, "MXFP4 experts are dequantized to bf16 to train (transformers "
                 "Mxfp4Config(dequantize=True), as gpt-oss fine-tuning recipes load them): timed "
                 "and counted in bf16")
        return False
    if method != "bitsandbytes" or doc.get((*q, "load_in_8bit"), (bool,), False):
        raise doc.error(q, f"{method} quantization is not modelled; stepsim's quantized "
                        "training is bitsandbytes NF4 (QLoRA, load_in_4bit)")
    return bool(doc.get((*q, "load_in_4bit"), (bool,), True))


def _diffusers(doc: JsonDoc, path: Path) -> WorkloadConfig:
    """A diffusers UNet config as a workload (hf_diffusers.py), checked as a YAML one is."""
    from pydantic import ValidationError

    from simulator.inputs.model_errors import explain
    from simulator.inputs.schema import WorkloadConfig

    unet = hf_diffusers.unet(doc)
    stem = path.parent.name if path.name == "config.json" and path.parent.name else path.stem
    data = {"name": stem or "unet", "description": "a diffusers UNet2DConditionModel",
            "source": f"{path} (diffusers UNet2DConditionModel)", "unet": unet,
            "training": {"seq_len": 1, "micro_batch": hf_diffusers.TRAIN_BATCH}}
    try:
        workload = WorkloadConfig.from_data(data)
    except ValidationError as exc:
        error = exc.errors()[0]
        raise doc.error(("_class_name",), explain(error)) from None
    for _, message in workload.reference_errors():
        raise doc.error(("_class_name",), message)
    doc.show_warnings()
    return workload


def _workload(doc: JsonDoc, path: Path, model_type: str, fields: Fields,
              training: dict[str, Any]) -> WorkloadConfig:
    """The workload, checked as a YAML one is; a problem is named by the config's own key."""
    from pydantic import ValidationError

    from simulator.inputs.model_errors import explain
    from simulator.inputs.schema import WorkloadConfig

    stem = path.parent.name if path.name == "config.json" and path.parent.name else path.stem
    data = {"name": stem or "hf-model",
            "description": f"{model_type} from a Hugging Face config.json",
            "source": f"{path} (model_type {model_type})",
            "model": {k: v for k, (v, _) in fields.items()}, "training": training}

    def source(loc: tuple[Any, ...]) -> Loc:
        field = loc[1] if len(loc) > 1 and loc[0] == "model" else None
        return fields[field][1] if field in fields else ("model_type",)

    try:
        workload = WorkloadConfig.from_data(data)
    except ValidationError as exc:  # a limit (docs/inputs.md)
        error = exc.errors()[0]
        raise doc.error(source(tuple(error["loc"])), explain(error)) from None
    for loc, message in workload.reference_errors():
        raise doc.error(source(loc), message)
    return workload
