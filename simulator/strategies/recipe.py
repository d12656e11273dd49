"""Which recipe options each strategy has a use for, and the check that refuses the rest.

A flag a strategy ignores would silently describe another run (a DDP comm hook under FSDP),
so ``check_recipe`` refuses it with one line naming the flag and the strategies it fits.
"""

from __future__ import annotations

from simulator.errors import InputError

DDP_STRATEGIES = ("ddp", "tp", "tp+ddp")  # the ones that wrap the model in torch DDP
TP_STRATEGIES = ("tp", "tp+ddp", "tp+fsdp")
FSDP_STRATEGIES = ("fsdp", "tp+fsdp")
ZERO_STRATEGIES = ("zero1", "zero2")


def check_recipe(strategy: str, *, tp: int, overlap: bool, grad_compression: str,
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
