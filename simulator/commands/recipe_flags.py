"""The training-recipe flags of `run`, `compare` and `sweep`, named after the frameworks' options.

Each flag maps to one field of ``RunSpec`` (simulator/api/), which passes it on to
``strategies.StrategyOptions`` and to ``memory.estimate`` so the time and the memory verdict
describe the same recipe. ``strategies.recipe.check_recipe`` rejects a flag the chosen
strategy has no use for (one line, exit 2), e.g. a DDP comm hook under FSDP.
"""

from __future__ import annotations

import argparse
from typing import Any, get_args

from simulator.errors import InputError, did_you_mean, quoted
from simulator.inputs.schema import (
    CHECKPOINTING_MODES,
    Attention,
    CrossEntropy,
    Framework,
    Kernels,
    Optimizer,
    Precision,
)

COMM_HOOKS = ("none", "bf16")
# the training keys a flag can set: flag -> (RunSpec field, choices)
TRAINING_FLAGS: dict[str, tuple[str, tuple[str, ...]]] = {
    "--framework": ("framework", get_args(Framework)),
    "--kernels": ("kernels", get_args(Kernels)),
    "--attention": ("attention", get_args(Attention)),
    "--amp": ("amp", ("o1", "o2")),
    "--ddp": ("ddp", ("torch", "apex")),
    "--cross-entropy": ("cross_entropy", get_args(CrossEntropy)),
    "--precision": ("precision", get_args(Precision)),
    "--optimizer": ("optimizer", get_args(Optimizer)),
}
_HELP = {
    "--framework": "the framework whose defaults the recipe takes (training.framework)",
    "--kernels": "eager (modules op by op) | compiled (torch.compile) | fused (Megatron/TE)",
    "--attention": "flash2 | flash1 | flash3 | sdpa (FA1 before torch 2.2, FA2 after) | triton "
                   "(flash-attn's Triton kernel) | eager (scores in memory); default: the "
                   "framework's",
    "--amp": "apex amp opt_level: o1 (as torch.autocast) | o2 (16-bit model, fp32 master "
             "weights, 16-bit gradients); default torch.autocast",
    "--ddp": "the DDP wrapper under -s ddp: torch | apex (apex.parallel."
             "DistributedDataParallel: 1e7-element buckets on its own stream)",
    "--cross-entropy": "fp32 (logits.float()) | chunked (torchtune) | fused (one kernel)",
    "--precision": "bf16 | fp16 (AMP) | fp32 | pure-bf16 (bf16 weights and states)",
    "--optimizer": "adamw | adamw-8bit | paged-adamw-8bit | paged-adamw (bitsandbytes; paged: "
                   "states in CUDA managed memory) | sgd",
}


def add_training_arguments(parser: argparse.ArgumentParser) -> None:
    """--framework, --kernels, --attention, --cross-entropy, --precision, --optimizer,
    --optimizer-in-bwd, --padded, --software, --checkpointing: the workload's training keys of
    the same names, overridden."""
    for flag, (_, choices) in TRAINING_FLAGS.items():
        parser.add_argument(flag, default=None, metavar="|".join(choices), help=_HELP[flag])
    parser.add_argument("--optimizer-in-bwd", action=argparse.BooleanOptionalAction,
                        default=None, help="torchtune optimizer_in_bwd: each parameter's "
                        "optimizer step in backward as its gradient is ready (one GPU, no "
                        "gradient accumulation)")
    parser.add_argument("--padded", action=argparse.BooleanOptionalAction, default=None,
                        help="the batches are padded and carry their attention mask "
                        "(training.padded; tokenizer padding, DataCollatorWithPadding): sdpa "
                        "then runs its memory-efficient kernel over every query-key pair")
    parser.add_argument("--software", default=None, metavar="STACK",
                        help="the software stack: a year (2023) or torch=2.1,cuda=12.1 "
                        "(training.software); GEMM and attention rates by library generation "
                        "(default: today's)")
    parser.add_argument("--checkpointing", default=None, metavar="MODE",
                        help="activation checkpointing override: none | selective | op | full "
                        "(full: HF gradient_checkpointing / torch.utils.checkpoint per block; "
                        "selective: Megatron --recompute-granularity selective; op: "
                        "torchtitan's op-level selective checkpointing)")


# what other programs call the checkpointing modes
CHECKPOINTING_SYNONYMS = {
    "True": ("full", "Hugging Face gradient_checkpointing and torchtune "
             "enable_activation_checkpointing"),
    "False": ("none", "Hugging Face gradient_checkpointing"),
    "recompute-activations": ("selective", "Megatron"),
    "uniform": ("full", "Megatron --recompute-method"),
}


def training_fields(args: argparse.Namespace) -> dict[str, Any]:
    """RunSpec fields of the training flags, each checked against its choices."""
    out: dict[str, Any] = {}
    for flag, (field, choices) in TRAINING_FLAGS.items():
        value = getattr(args, field)
        if value is not None and value not in choices:
            raise InputError(f"{flag}: expected one of {', '.join(choices)}, got {quoted(value)}"
                             + did_you_mean(value, choices))
        out[field] = value
    mode = args.checkpointing
    if mode is not None and mode not in CHECKPOINTING_MODES:
        raise InputError(f"--checkpointing: expected one of {', '.join(CHECKPOINTING_MODES)}, "
                         f"got {quoted(mode)}" + did_you_mean(mode, CHECKPOINTING_MODES,
                                                             CHECKPOINTING_SYNONYMS))
    out["checkpointing"] = mode
    out["optimizer_in_bwd"] = args.optimizer_in_bwd
    out["padded"] = args.padded
    if args.software is not None:
        from simulator.inputs.choices import check_software

        check_software(args.software)  # a malformed stack: one line now, not at the first run
    out["software"] = args.software
    return out


def add_adapter_arguments(parser: argparse.ArgumentParser) -> None:
    """--peft, --load-in-4bit: the adapters of a PEFT adapter_config.json."""
    parser.add_argument("--peft", metavar="adapter_config.json",
                        help="a PEFT adapter_config.json: LoRA of its r, lora_alpha and "
                        "target_modules replaces the workload's (QLoRA with --load-in-4bit)")
    parser.add_argument("--load-in-4bit", action="store_true",
                        help="bitsandbytes NF4 base weights (BitsAndBytesConfig load_in_4bit): "
                        "the LoRA job becomes QLoRA")


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """--peft, --load-in-4bit, --deepspeed: the config files users already have."""
    add_adapter_arguments(parser)
    parser.add_argument("--deepspeed", metavar="ds_config.json",
                        help="a DeepSpeed config: ZeRO stage (-> -s ddp|zero1|zero2|zero3), "
                        "overlap_comm, offload_optimizer/offload_param (cpu), pin_memory, "
                        "train_micro_batch_size_per_gpu, gradient_accumulation_steps, bf16/fp16; "
                        "\"auto\" keeps stepsim's default and flags given here win over the file")


def config_fields(args: argparse.Namespace) -> dict[str, Any]:
    """RunSpec fields of the config-file flags; ``explicit`` names the flags given whose
    value may equal the default, so that a DeepSpeed config does not override them."""
    explicit = {field for field, given in (("strategy", getattr(args, "strategy", None)),
                                           ("offload", getattr(args, "offload", None)))
                if given is not None}
    return {"peft": args.peft, "load_in_4bit": args.load_in_4bit, "deepspeed": args.deepspeed,
            "explicit": frozenset(explicit)}


def config_words(files: dict[str, Any]) -> str:
    """``hf path (8,030,261,248 parameters, 41,943,040 trainable); deepspeed path``."""
    counts = f"{files['parameters']:,} parameters"
    if files["trainable_parameters"] != files["parameters"]:
        counts += f", {files['trainable_parameters']:,} trainable"
    names = [f"{kind} {files[kind]}" for kind in ("hf", "peft", "deepspeed") if kind in files]
    return f"{'; '.join(names)} ({counts})"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_training_arguments(parser)
    add_config_arguments(parser)
    parser.add_argument("--comm-hook", default=None, metavar="HOOK",
                        help="DDP communication hook: bf16 = register_comm_hook("
                        "bf16_compress_hook), 2-byte gradients on the wire; none (default)")
    parser.add_argument("--gradient-as-bucket-view", action="store_true",
                        help="DDP gradient_as_bucket_view=True: gradients are views into the "
                        "buckets (no second buffer, no copies in and out)")
    parser.add_argument("--sequence-parallel", action="store_true",
                        help="Megatron --sequence-parallel with tp, tp+ddp, tp+fsdp: norms and "
                        "dropout split over the TP group, all-gather/reduce-scatter "
                        "instead of all-reduce")
    parser.add_argument("--no-reshard-after-forward", action="store_true",
                        help="FSDP2 fully_shard(reshard_after_forward=False): units stay "
                        "unsharded after forward, no all-gathers in backward")
    parser.add_argument("--offload", default=None, metavar="WHAT",
                        help="to host memory: optimizer (DeepSpeed offload_optimizer; zero1, "
                        "zero2, zero3) or params (DeepSpeed offload_param + offload_optimizer, "
                        "zero3; FSDP2 CPUOffloadPolicy, fsdp); the CPU optimizer steps there")
    parser.add_argument("--pin-memory", action=argparse.BooleanOptionalAction, default=None,
                        help="pinned host buffers for offload copies (default: the framework's: "
                        "DeepSpeed pin_memory false, FSDP2 true)")
    parser.add_argument("--overlap-comm", action="store_true",
                        help="DeepSpeed zero_optimization.overlap_comm=true (zero1, zero2): "
                        "gradient reductions on their own stream during backward")


def fields_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """RunSpec fields from the parsed flags (format checks only; see ``check_recipe``)."""
    hook = args.comm_hook
    if hook is not None and hook not in COMM_HOOKS:
        raise InputError(f"--comm-hook: expected one of {', '.join(COMM_HOOKS)}, "
                         f"got {quoted(hook)}")
    return {**training_fields(args), "grad_compression": hook or "none",
            "gradient_as_bucket_view": args.gradient_as_bucket_view,
            "sequence_parallel": args.sequence_parallel,
            "reshard_after_forward": not args.no_reshard_after_forward,
            "zero_overlap_comm": True if args.overlap_comm else None,
            "offload": args.offload or "none", "pin_memory": args.pin_memory,
            **config_fields(args)}


def training_words(rec: dict[str, Any]) -> str:
    """``hf: eager kernels, sdpa attention, fp32 cross-entropy, bf16, adamw, checkpointing
    none`` (apex's amp and DDP named where the recipe uses them)."""
    if "framework" not in rec:
        return ""
    attention = f"{rec['attention']} attention, " if rec["attention"] else ""
    return (f"{rec['framework']}: {rec['kernels']} kernels, {attention}{rec['cross_entropy']} "
            f"cross-entropy, {rec['precision']}, {rec['optimizer']}"
            + (" in backward (optimizer_in_bwd)" if rec.get("optimizer_in_bwd") else "")
            + (f", apex amp {rec['amp'].upper()}" if rec.get("amp") else "")
            + (", apex DDP" if rec.get("ddp") == "apex" else "")
            + f", checkpointing {rec['activation_checkpointing']}")


def words(rec: dict[str, Any]) -> list[str]:
    """The parallelism recipe choices that differ from the frameworks' defaults, in their own
    names (the training recipe is printed on a line of its own, ``training_words``)."""
    out = []
    if rec.get("comm_hook", "none") != "none":
        out.append(f"{rec['comm_hook']}_compress_hook")
    for key in ("gradient_as_bucket_view", "sequence_parallel", "overlap_comm"):
        if rec.get(key):
            out.append(key)
    if rec.get("reshard_after_forward") is False:
        out.append("reshard_after_forward=False")
    if rec.get("offload", "none") != "none":
        out.append(f"offload {rec['offload']}")
    if rec.get("pin_memory") is not None:
        out.append(f"pin_memory={rec['pin_memory']}")
    return out
