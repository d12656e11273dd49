"""The training-recipe flags of `run`, `compare` and `sweep`, named after the frameworks' options.

Each flag maps to one field of ``RunSpec`` (simulator/commands/run.py), which passes it on to
``strategies.StrategyOptions`` and to ``memory.estimate`` so the time and the memory verdict
describe the same recipe. ``check`` rejects a flag the chosen strategy has no use for (one
line, exit 2), e.g. a DDP comm hook under FSDP.
"""

from __future__ import annotations

import argparse
from typing import Any

from simulator.errors import InputError
from simulator.schema import CHECKPOINTING_MODES

DDP_STRATEGIES = ("ddp", "tp", "tp+ddp")  # the ones that wrap the model in torch DDP
TP_STRATEGIES = ("tp", "tp+ddp", "tp+fsdp")
FSDP_STRATEGIES = ("fsdp", "tp+fsdp")
ZERO_STRATEGIES = ("zero1", "zero2")
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
    """RunSpec fields from the parsed flags (format checks only; see ``check``)."""
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


def check(strategy: str, *, tp: int, overlap: bool, grad_compression: str,
          gradient_as_bucket_view: bool, sequence_parallel: bool, reshard_after_forward: bool,
          zero_overlap_comm: bool | None) -> None:
    """Reject a recipe flag the strategy does not use: one line naming flag and strategy."""
    def refuse(flag: str, wants: tuple[str, ...], why: str) -> None:
        raise InputError(f"{flag} does not apply to -s {strategy}: {why} "
                         f"(use it with {', '.join(wants)})")

    if grad_compression != "none" and strategy not in DDP_STRATEGIES:
        refuse("--comm-hook", DDP_STRATEGIES, "it is a torch DDP communication hook")
    if gradient_as_bucket_view and strategy not in DDP_STRATEGIES:
        refuse("--gradient-as-bucket-view", DDP_STRATEGIES, "it is a torch DDP option")
    if not overlap and (grad_compression != "none" or gradient_as_bucket_view):
        flag = "--comm-hook" if grad_compression != "none" else "--gradient-as-bucket-view"
        raise InputError(f"{flag} does not apply with --no-overlap: that models Megatron's "
                         "local DDP, not torch DDP")
    if sequence_parallel and strategy not in TP_STRATEGIES:
        refuse("--sequence-parallel", TP_STRATEGIES, "it splits activations over a TP group")
    if sequence_parallel and tp < 2:
        raise InputError("--sequence-parallel needs a tensor-parallel degree of at least 2, "
                         f"got --tp {tp}")
    if not reshard_after_forward and strategy not in FSDP_STRATEGIES:
        refuse("--no-reshard-after-forward", FSDP_STRATEGIES, "it is an FSDP option")
    if zero_overlap_comm and strategy not in ZERO_STRATEGIES:
        refuse("--overlap-comm", ZERO_STRATEGIES, "it is a DeepSpeed ZeRO-1/2 option")


def words(rec: dict[str, Any]) -> list[str]:
    """The recipe choices that differ from the frameworks' defaults, in their own names."""
    out = []
    if rec.get("activation_checkpointing"):
        out.append(f"checkpointing {rec['activation_checkpointing']}")
    if rec.get("comm_hook", "none") != "none":
        out.append(f"{rec['comm_hook']}_compress_hook")
    for key in ("gradient_as_bucket_view", "sequence_parallel", "overlap_comm"):
        if rec.get(key):
            out.append(key)
    if rec.get("reshard_after_forward") is False:
        out.append("reshard_after_forward=False")
    return out
