"""A PEFT ``adapter_config.json`` as the workload's LoRA: ``--peft adapter_config.json``.

What is inside: ``apply(workload, path, four_bit)`` returns the workload fine-tuning LoRA
adapters of the file's rank (``r``), ``lora_alpha``, ``lora_dropout`` and ``target_modules``,
QLoRA when ``four_bit`` (``--load-in-4bit``) or the workload already has a 4-bit base.

From peft (``tuners/lora/config.py`` LoraConfig; ``utils/constants.py``
TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING; ``tuners/tuners_utils.py``):
- ``r`` defaults to 8, ``lora_alpha`` to 8, ``lora_dropout`` to 0.0 (above 0 each adapter
  drops its own copy of the layer input).
- ``target_modules`` null: the model type's default (llama, mistral, qwen2, gemma:
  q_proj and v_proj; gpt2: c_attn; mpt: Wqkv); ``"all-linear"``: every linear layer but
  the output layer; a list: module names matched as suffixes (``self_attn.q_proj`` is
  q_proj). A name that matches nothing is reported and dropped; none left is an error, as
  in PEFT. A regular expression (a string) is refused: list the names.
- Keys that change the step but are not modelled (DoRA, per-layer rank patterns, fully
  trained ``modules_to_save``, trained biases) are reported on stderr, one line each.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from simulator.errors import quoted
from simulator.inputs.jsonfile import JsonDoc, read

if TYPE_CHECKING:
    from simulator.inputs.schema import WorkloadConfig

# peft's LoraConfig fields (0.21), older ones (enable_lora, merge_weights) and PeftConfig's
KNOWN = {"peft_type", "task_type", "base_model_name_or_path", "revision", "inference_mode",
         "auto_mapping", "peft_version", "r", "lora_alpha", "target_modules", "lora_dropout",
         "bias", "fan_in_fan_out", "init_lora_weights", "use_rslora", "use_dora",
         "modules_to_save", "layers_to_transform", "layers_pattern", "rank_pattern",
         "alpha_pattern", "megatron_config", "megatron_core", "loftq_config",
         "layer_replication", "runtime_config", "exclude_modules", "lora_bias", "eva_config",
         "corda_config", "trainable_token_indices", "target_parameters", "use_qalora",
         "qalora_group_size", "alora_invocation_tokens", "arrow_config",
         "ensure_weight_tying", "kasa_config", "lora_ga_config", "monteclora_config",
         "use_bdlora", "velora_config", "enable_lora", "merge_weights"}
DEFAULT_TARGETS = {"llama": ("q_proj", "v_proj"), "gpt2": ("c_attn",), "mpt": ("Wqkv",),
                   "bert": ("query", "value")}


def apply(workload: WorkloadConfig, path: str, *, four_bit: bool = False) -> WorkloadConfig:
    """``workload`` fine-tuning the adapters ``path`` describes (QLoRA with ``four_bit``)."""
    from simulator.inputs.schema import (
        LORA_TARGETS,
        MAX_LORA_ALPHA,
        MAX_LORA_TARGETS,
        MAX_WIDTH,
        LoraConfig,
    )

    doc = read(path, "a PEFT adapter_config.json")
    kind = doc.get(("peft_type",), (str,), "LORA")
    if kind.upper() != "LORA":
        raise doc.error(("peft_type",), f"{kind}: only LoRA adapters are modelled")
    doc.warn_unknown((), KNOWN)
    _warn_unmodelled(doc)
    if workload.model is None and workload.unet is None:
        raise doc.error(("peft_type",), f"LoRA needs a transformer or a UNet; {workload.name} "
                        "is a list of generic layers")
    family = workload.model.family if workload.model is not None else "unet"
    rank = doc.positive_int(("r",), 8, at_most=MAX_WIDTH) or 8  # the workload schema's bounds
    alpha = doc.get(("lora_alpha",), (int, float), 8.0)
    if not 0 < alpha <= MAX_LORA_ALPHA:
        raise doc.error(("lora_alpha",), f"must be positive and at most {MAX_LORA_ALPHA:g}, "
                        f"got {alpha:g}")
    dropout = doc.get(("lora_dropout",), (int, float), 0.0)
    if not 0 <= dropout < 1:
        raise doc.error(("lora_dropout",), f"must be in [0, 1), got {dropout:g}")
    targets = _targets(doc, family, LORA_TARGETS.get(family, ()))
    if len(targets) > MAX_LORA_TARGETS:
        raise doc.error(("target_modules",), f"{len(targets)} modules; at most "
                        f"{MAX_LORA_TARGETS}")
    finetune = "qlora" if four_bit or workload.training.finetune == "qlora" else "lora"
    changes: dict[str, object] = {"finetune": finetune,
                                  "lora": LoraConfig(rank=rank, alpha=alpha, targets=targets,
                                                      dropout=float(dropout))}
    if finetune == "qlora" and workload.training.activation_checkpointing == "none":
        # PEFT prepare_model_for_kbit_training turns gradient checkpointing on by default
        changes["activation_checkpointing"] = "full"
    adapted = workload.with_training(**changes)
    doc.show_warnings()
    return adapted


def _targets(doc: JsonDoc, family: str, linear: tuple[str, ...]) -> list[str]:
    loc = ("target_modules",)
    given = doc.get(loc, (list, str))
    if given is None:
        if family == "unet":  # diffusers' train_text_to_image_lora.py
            return ["to_k", "to_q", "to_v", "to_out.0"]
        return list(DEFAULT_TARGETS.get(family, linear[:1]))
    if isinstance(given, str):
        if given.lower() == "all-linear":
            return list(linear)
        raise doc.error(loc, f"{quoted(given)}: a regular expression of module names is not read; "
                        f"list the names ({', '.join(linear)})")
    chosen: list[str] = []
    for i, name in enumerate(given):
        if not isinstance(name, str):
            raise doc.error((*loc, i), f"expected a module name, got {quoted(name)}")
        leaf = name.rsplit(".", 1)[-1]
        if family == "unet":  # diffusers' targets end in a module of their own (to_out.0)
            leaf = next((t for t in linear if name == t or name.endswith("." + t)), leaf)
        if leaf in linear:
            chosen.append(leaf)
        else:
            doc.warn((*loc, i), f"{quoted(name)} matches no {family} linear layer stepsim models "
                     f"({', '.join(linear)}); ignored")
    if not chosen:
        raise doc.error(loc, f"no target matches a {family} linear layer; choose from "
                        f"{', '.join(linear)}")
    return list(dict.fromkeys(chosen))


def _warn_unmodelled(doc: JsonDoc) -> None:
    """What PEFT would train or compute that the simulation leaves out, one line each."""
    if doc.get(("use_dora",), (bool,), False):
        doc.warn(("use_dora",), "DoRA's magnitude vectors and extra norm are not modelled; "
                 "timed as LoRA")
    for key in ("rank_pattern", "alpha_pattern"):
        if doc.get((key,), (dict,), {}):
            doc.warn((key,), "per-layer ranks are not modelled; every target takes r")
    if doc.get(("target_parameters",), (list,), []):  # PEFT >= 0.17: gpt-oss's experts
        doc.warn(("target_parameters",), "adapters on parameters (not modules) are not "
                 "modelled; those parameters stay frozen")
    if doc.get(("modules_to_save",), (list,), []):
        doc.warn(("modules_to_save",), "fully trained extra modules are not modelled")
    if doc.get(("layers_to_transform",), (list, int)) is not None:
        doc.warn(("layers_to_transform",), "adapters on some layers only are not modelled; "
                 "every layer gets them")
    bias = doc.get(("bias",), (str,), "none")
    if bias != "none":
        doc.warn(("bias",), f"bias {quoted(bias)}: trained biases are not modelled")
