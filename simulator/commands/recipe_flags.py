"""The training-recipe flags of `run`, `compare` and `sweep`, named after the frameworks' options.

Each flag maps to one field of ``RunSpec`` (simulator/api.py), which passes it on to
``strategies.StrategyOptions`` and to ``memory.estimate`` so the time and the memory verdict
describe the same recipe. ``strategies.recipe.check_recipe`` rejects a flag the chosen
strategy has no use for (one line, exit 2), e.g. a DDP comm hook under FSDP.
"""

from __future__ import annotations

import argparse
from typing import Any

from simulator.errors import InputError
from simulator.inputs.schema import CHECKPOINTING_MODES

COMM_HOOKS = ("none", "bf16")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--checkpointing", default=None, metavar="MODE",
                        help="activation checkpointing override: none | selective | full "
                        "(HF gradient_checkpointing / torch.utils.checkpoint per block; "
                        "selective: Megatron --recompute-granularity selective)")
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
    parser.add_argument("--overlap-comm", action="store_true",
                        help="DeepSpeed zero_optimization.overlap_comm=true (zero1, zero2): "
                        "gradient reductions on their own stream during backward")


def fields_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """RunSpec fields from the parsed flags (format checks only; see ``check_recipe``)."""
    mode = args.checkpointing
    if mode is not None and mode not in CHECKPOINTING_MODES:
        raise InputError(f"--checkpointing: expected one of {', '.join(CHECKPOINTING_MODES)}, "
                         f"got {mode!r}")
    hook = args.comm_hook
    if hook is not None and hook not in COMM_HOOKS:
        raise InputError(f"--comm-hook: expected one of {', '.join(COMM_HOOKS)}, got {hook!r}")
    return {"checkpointing": mode, "grad_compression": hook or "none",
            "gradient_as_bucket_view": args.gradient_as_bucket_view,
            "sequence_parallel": args.sequence_parallel,
            "reshard_after_forward": not args.no_reshard_after_forward,
            "zero_overlap_comm": True if args.overlap_comm else None}


def words(rec: dict[str, Any]) -> list[str]:
    """The recipe choices that differ from the frameworks' defaults, in their own names."""
    out = []
    if rec.get("activation_checkpointing") not in (None, "none"):
        out.append(f"checkpointing {rec['activation_checkpointing']}")
    if rec.get("comm_hook", "none") != "none":
        out.append(f"{rec['comm_hook']}_compress_hook")
    for key in ("gradient_as_bucket_view", "sequence_parallel", "overlap_comm"):
        if rec.get(key):
            out.append(key)
    if rec.get("reshard_after_forward") is False:
        out.append("reshard_after_forward=False")
    return out
