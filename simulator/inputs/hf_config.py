"""A Hugging Face ``config.json`` as a workload: ``-w hf:path/to/config.json`` (or ``hf:DIR``
holding one).

What is inside: :func:`load` maps the config of a llama, mistral, qwen2, gemma, gpt2 or mpt
model to the workload schema (``model:`` keys) and validates it like a YAML workload, so a
bad value names the file, the line and the config's own key. The training keys are not in a
model's config: they come from flags (``--seq-len``, ``--micro-batch``, ``--grad-accum``,
``--precision``...) over the defaults below. Keys that would change the step but are not
modelled (``rope_scaling`` aside, which changes no shape: ``sliding_window``, ``attention_bias``
on the output projection...) are reported on stderr, once per file, not refused.

Assumes: the names of transformers' own config classes (``models/<type>/configuration_*.py``
in huggingface/transformers); a model whose heads times head size is not its width (Gemma 7B,
Mistral NeMo) or that routes experts is refused: the transformer builder has neither shape.
"""

from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from simulator.errors import InputError

if TYPE_CHECKING:
    from simulator.inputs.schema import WorkloadConfig

PREFIX = "hf:"
# Training defaults where no flag is given: TRL SFTConfig max_length 1024
# (trl/trainer/sft_config.py), capped by the model's context; micro-batch 8 =
# TrainingArguments per_device_train_batch_size (transformers/training_args.py).
DEFAULT_SEQ_LEN = 1024
DEFAULT_MICRO_BATCH = 8

# model_type -> the schema family whose layout it has (modeling_<type>.py)
FAMILIES = {"llama": "llama", "mistral": "llama", "qwen2": "llama", "gemma": "llama",
            "gpt2": "gpt2", "mpt": "mpt"}
# keys that change nothing a training step costs (ids, initialisation, epsilons, rotary base,
# inference switches, bookkeeping)
_NO_COST = {
    "architectures", "model_type", "transformers_version", "torch_dtype", "dtype",
    "_name_or_path", "bos_token_id", "eos_token_id", "pad_token_id", "initializer_range",
    "rms_norm_eps", "layer_norm_epsilon", "layer_norm_eps", "rope_theta", "rope_scaling",
    "use_cache", "pretraining_tp", "hidden_act", "hidden_activation", "activation_function",
    "attention_dropout", "resid_pdrop", "embd_pdrop", "attn_pdrop", "summary_type",
    "summary_use_proj", "summary_activation", "summary_proj_to_labels", "summary_first_dropout",
    "task_specific_params", "scale_attn_weights", "reorder_and_upcast_attn",
    "scale_attn_by_inverse_layer_idx", "n_ctx", "use_sliding_window", "max_window_layers",
    "mlp_bias", "emb_pdrop", "init_config", "logit_scale", "learned_pos_emb",
    "norm_type", "verbose", "use_pad_tok_in_ffn", "ffn_config", "init_device", "tokenizer_name",
    "embedding_fraction", "fc_type", "logit_soft_cap", "query_pre_attn_scalar",
    "head_dim", "tie_word_embeddings", "no_bias", "attn_config", "auto_map",
    "sliding_window", "attention_bias", "max_position_embeddings", "max_seq_len",
    "expansion_ratio",
}
_REPORTED: set[str] = set()


def is_hf(name: str) -> bool:
    return name.startswith(PREFIX)


def config_path(name: str) -> Path:
    """The config.json an ``hf:`` name points at (a file, or a folder holding one)."""
    given = name[len(PREFIX):]
    path = Path(given)
    if path.is_dir():
        path = path / "config.json"
    if not path.exists():
        raise InputError(f"{name}: no such file: {path}")
    if not path.is_file():
        raise InputError(f"{name}: {path} is not a regular file; expected a config.json")
    return path


def load(name: str) -> WorkloadConfig:
    from simulator.inputs.config import validate
    from simulator.inputs.loader import decode
    from simulator.inputs.schema import WorkloadConfig

    path = config_path(name)
    file = str(path)
    text = decode(path.read_bytes(), file)
    try:
        cfg = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"not JSON: {exc.msg}", file=file, line=exc.lineno) from None
    except RecursionError:
        raise InputError("not JSON: nested too deeply", file=file) from None
    except ValueError as exc:  # an integer past Python's digit limit
        raise InputError(f"not JSON stepsim reads: {exc}", file=file) from None
    if not isinstance(cfg, dict):
        raise InputError("expected a JSON object (a Hugging Face config.json)", file=file)
    lines = _key_lines(text)
    model_type = cfg.get("model_type")
    if model_type not in FAMILIES:
        raise InputError(f"model_type {model_type!r} is not one stepsim maps; it maps "
                         f"{', '.join(FAMILIES)}", file=file, line=lines.get("model_type"),
                         key="model_type")
    if any(k in cfg for k in ("num_local_experts", "num_experts", "n_routed_experts")):
        raise InputError("a mixture of experts is not modelled", file=file)
    model, keys = _model(model_type, cfg, file, lines)
    context = model.get("max_positions") or cfg.get("max_position_embeddings")
    seq_len = min(DEFAULT_SEQ_LEN, context) if isinstance(context, int) and context > 0 \
        else DEFAULT_SEQ_LEN
    data = {"name": path.parent.name if path.name == "config.json" else path.stem,
            "description": f"Hugging Face config ({model_type}) from {file}",
            "source": file, "model": model,
            "training": {"seq_len": seq_len, "micro_batch": DEFAULT_MICRO_BATCH}}
    for ours in ("layers", "hidden", "heads", "vocab"):
        if model.get(ours) is None:
            raise InputError("required key is missing", file=file, key=keys[ours])
    locs = {("model", ours): lines[theirs] for ours, theirs in keys.items() if theirs in lines}
    try:
        workload = validate(data, locs, WorkloadConfig, file)
    except InputError as exc:  # name the config's own key, not the schema's
        ours = (exc.key or "").removeprefix("model.")
        raise InputError(exc.message, file=file, line=exc.line,
                         key=keys.get(ours, exc.key)) from None
    _report(file, sorted(k for k in cfg if k not in keys.values() and k not in _NO_COST),
            _not_modelled(model_type, cfg))
    return workload


def _model(model_type: str, cfg: dict[str, Any], file: str, lines: dict[str, int]
           ) -> tuple[dict[str, Any], dict[str, str]]:
    """The schema's ``model:`` keys, and which config key each came from (for line marks)."""
    if model_type == "gpt2":  # GPT2Config: n_inner None means 4 * n_embd
        keys = {"layers": "n_layer", "hidden": "n_embd", "heads": "n_head",
                "vocab": "vocab_size", "max_positions": "n_positions", "ffn_hidden": "n_inner"}
        model = {"family": "gpt2", **{k: cfg.get(v) for k, v in keys.items()}}
        if model["ffn_hidden"] is None:
            del model["ffn_hidden"]
        return model, keys
    if model_type == "mpt":  # MPTConfig: d_model, expansion_ratio, no_bias, attn_config.alibi
        keys = {"layers": "n_layers", "hidden": "d_model", "heads": "n_heads",
                "vocab": "vocab_size", "bias": "no_bias", "positions": "attn_config"}
        ratio = cfg.get("expansion_ratio", 4)
        attn = cfg.get("attn_config") or {}
        model = {"family": "mpt", **{k: cfg.get(v) for k, v in list(keys.items())[:4]},
                 "bias": not cfg.get("no_bias", False), "tie_embeddings": True,
                 "positions": "alibi" if isinstance(attn, dict) and attn.get("alibi", True)
                 else "learned"}
        if isinstance(model["hidden"], int):  # the schema refuses what is not a whole width
            width = ratio * model["hidden"] if isinstance(ratio, int | float) else ratio
            whole = isinstance(width, float) and math.isfinite(width) and width.is_integer()
            model["ffn_hidden"] = int(width) if whole else width
            keys["ffn_hidden"] = "expansion_ratio"
        if model["positions"] == "learned":
            model["max_positions"] = cfg.get("max_seq_len")
            keys["max_positions"] = "max_seq_len"
        return model, keys
    # llama layout: LlamaConfig, MistralConfig, Qwen2Config, GemmaConfig
    keys = {"layers": "num_hidden_layers", "hidden": "hidden_size",
            "heads": "num_attention_heads", "kv_heads": "num_key_value_heads",
            "ffn_hidden": "intermediate_size", "vocab": "vocab_size",
            "tie_embeddings": "tie_word_embeddings"}
    model = {"family": "llama", **{k: cfg.get(v) for k, v in keys.items()}}
    if model["kv_heads"] is None:
        model.pop("kv_heads")
    # tie_word_embeddings defaults: LlamaConfig, MistralConfig, Qwen2Config False; GemmaConfig
    # True (configuration_gemma.py)
    if model["tie_embeddings"] is None:
        model["tie_embeddings"] = model_type == "gemma"
    if model_type == "qwen2":  # modeling_qwen2.py: q/k/v Linear(bias=True), o_proj no bias
        model["qkv_bias"] = True
    elif cfg.get("attention_bias") is True:  # LlamaConfig attention_bias: q, k, v and o
        model["qkv_bias"] = True
        keys["qkv_bias"] = "attention_bias"
    head_dim, heads, hidden = cfg.get("head_dim"), model["heads"], model["hidden"]
    if isinstance(head_dim, int) and isinstance(heads, int) and isinstance(hidden, int) \
            and head_dim * heads != hidden:
        raise InputError(f"head_dim {head_dim} x {heads} heads is not hidden_size {hidden}: "
                         "attention wider or narrower than the model is not modelled",
                         file=file, line=lines.get("head_dim"), key="head_dim")
    return model, keys


def _not_modelled(model_type: str, cfg: dict[str, Any]) -> list[str]:
    notes = []
    if cfg.get("sliding_window") and cfg.get("use_sliding_window", model_type == "mistral"):
        notes.append(f"sliding_window {cfg['sliding_window']} (attention over the whole "
                     "sequence is simulated)")
    if cfg.get("attention_bias") is True and model_type != "qwen2":
        notes.append("attention_bias on o_proj (its bias is not counted)")
    if cfg.get("mlp_bias") is True:
        notes.append("mlp_bias (not counted)")
    return notes


def _report(file: str, unknown: list[str], notes: list[str]) -> None:
    """One note per file: keys stepsim does not know, and known ones it does not model."""
    if file in _REPORTED or not (unknown or notes):
        return
    _REPORTED.add(file)
    parts = ([f"unknown keys {', '.join(unknown)}"] if unknown else []) + notes
    print(f"note: {file}: not modelled: {'; '.join(parts)}", file=sys.stderr)


def _key_lines(text: str) -> dict[str, int]:
    """The line of each top-level-looking ``"key":`` (json has no marks; the first wins)."""
    lines: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), 1):
        for key in re.findall(r'"([^"\\]+)"\s*:', line):
            lines.setdefault(key, number)
    return lines
