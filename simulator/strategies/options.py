"""The strategies, the options they read, which recipe options each has a use for, and the
check that refuses the rest.

A flag a strategy ignores would silently describe another run (a DDP comm hook under FSDP),
so ``check_recipe`` refuses it with one line naming the flag and the strategies it fits.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from simulator.errors import InputError, quoted

STRATEGIES = ("ddp", "zero1", "zero2", "zero3", "fsdp", "hsdp", "tp", "tp+ddp", "tp+fsdp")


@dataclass(frozen=True)
class StrategyOptions:
    """Run choices a strategy reads; defaults are the frameworks' own defaults."""

    bucket_mb: float | None = None  # DDP bucket_cap_mb; None = PyTorch's 25 with a 1 MiB first
    grad_compression: Literal["none", "bf16"] = "none"  # DDP comm hook (bf16_compress_hook)
    no_overlap: bool = False  # Megatron local DDP: all-reduce after the whole backward
    overlap: bool = True  # the same choice, stated positively (False == no_overlap)
    grad_accum: int | None = None  # micro-steps per optimizer step; None = the job's
    tp: int | None = None  # tensor-parallel degree (tp: all GPUs; tp+ddp/tp+fsdp: 2)
    sequence_parallel: bool = False  # Megatron sequence parallelism (Korthikanti et al.)
    reshard_after_forward: bool = True  # FSDP2 default for non-root units
    forward_prefetch: bool = True  # FSDP2 implicit forward prefetch (next unit's all-gather)
    backward_prefetch: bool = True  # FSDP2 default: one unit ahead in backward
    gradient_as_bucket_view: bool = False  # PyTorch DDP default
    legacy_reducer: bool = False  # PyTorch <= 1.4 DDP reducer (strategies/ddp.py)
    zero_overlap_comm: bool | None = None  # DeepSpeed overlap_comm; None = its default
    # DeepSpeed zero_optimization.reduce_bucket_size / allgather_bucket_size (elements, ZeRO-1
    # and -2); None = its default 5e8 (strategies/zero.py)
    reduce_bucket_size: int | None = None
    allgather_bucket_size: int | None = None
    # DeepSpeed zero_optimization.stage3_prefetch_bucket_size (elements); None = Hugging Face's
    # "auto", 0.9 x hidden^2 (strategies/zero3.py)
    prefetch_bucket_size: int | None = None
    offload: str = "none"  # optimizer | params to host memory (offload.py)
    pin_memory: bool | None = None  # pinned host buffers; None = the framework's default
    ranks: tuple[int, ...] = ()  # the ranks a program stands for (set per card on mixed boxes)
    pp: int = 1  # pipeline stages (pipeline.py); the strategy runs inside each stage
    schedule: str = "1f1b"  # gpipe | 1f1b | interleaved (schedules.py)
    virtual_stages: int = 1  # model chunks per stage (interleaved)
    dp_groups: tuple[tuple[int, ...], ...] = ()  # set by tensor.py for TP x DP
    # a paged optimizer's states overflow the card and cross the host link every step
    # (paging.py); set from the memory verdict (api.strategy_options)
    page_optimizer_states: bool = False
    # several boxes: a tensor-parallel group may span them (never advised: check_tp_groups)
    allow_tp_across_nodes: bool = False

    @property
    def overlapped(self) -> bool:
        return self.overlap and not self.no_overlap


Options = StrategyOptions  # short alias used by the commands


DDP_STRATEGIES = ("ddp", "tp", "tp+ddp")  # the ones that wrap the model in torch DDP
TP_STRATEGIES = ("tp", "tp+ddp", "tp+fsdp")
FSDP_STRATEGIES = ("fsdp", "hsdp", "tp+fsdp")
ZERO_STRATEGIES = ("zero1", "zero2")


# other programs' names for the strategies (the "did you mean" of a name not in STRATEGIES)
STRATEGY_SYNONYMS = {
    "DistributedDataParallel": ("ddp", "PyTorch"),
    "FullyShardedDataParallel": ("fsdp", "PyTorch"),
    "fully_shard": ("fsdp", "PyTorch FSDP2"), "fsdp2": ("fsdp", "PyTorch"),
    "FULL_SHARD": ("fsdp", "PyTorch FSDP's ShardingStrategy"),
    "SHARD_GRAD_OP": ("zero2", "PyTorch FSDP's ShardingStrategy"),
    "NO_SHARD": ("ddp", "PyTorch FSDP's ShardingStrategy"),
    "stage3": ("zero3", "DeepSpeed zero_optimization"),
    "stage2": ("zero2", "DeepSpeed zero_optimization"),
    "stage1": ("zero1", "DeepSpeed zero_optimization"),
    "tensor_parallel": ("tp", "Megatron and PyTorch"),
    "deepspeed": ("zero1, zero2 or zero3", "DeepSpeed, by ZeRO stage"),
    "zero": ("zero1, zero2 or zero3", "DeepSpeed, by stage"),
}


def check_strategy(name: str) -> str:
    if name not in STRATEGIES:
        from simulator.errors import did_you_mean

        raise InputError(f"unknown strategy {quoted(name)}; choose from {', '.join(STRATEGIES)}"
                         + did_you_mean(name, STRATEGIES, STRATEGY_SYNONYMS))
    return name


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


def check_pipeline(strategy: str, *, pp: int, schedule: str, virtual_stages: int) -> None:
    """Pipeline flags without a pipeline, or with a strategy that cannot run under one."""
    if pp < 1:
        raise InputError(f"--pp {pp}: must be at least 1")
    if pp == 1 and (schedule != "1f1b" or virtual_stages != 1):
        flag = "--schedule" if schedule != "1f1b" else "--virtual-stages"
        raise InputError(f"{flag} describes a pipeline: give --pp P (P > 1) too")
    if pp > 1 and strategy in ("zero2", "zero3"):
        raise InputError(f"-s {strategy} with --pp: DeepSpeed refuses ZeRO-2 and ZeRO-3 with "
                         "pipeline parallelism (use ddp, zero1, fsdp, tp, tp+ddp or tp+fsdp)")
    if pp > 1 and strategy == "hsdp":
        raise InputError("-s hsdp with --pp: HSDP inside pipeline stages is not modelled; "
                         "with --pp the stages go box by box, so use -s fsdp or ddp inside them")


def check_tp_groups(groups: tuple[tuple[int, ...], ...], box_of: Callable[[int], int],
                    allow: bool, machine: str = "") -> None:
    """Refuse a tensor-parallel group that spans boxes: its all-reduces sit on the critical
    path of every layer, and a network is 10-100x slower than a box's own links (Megatron-LM
    keeps TP inside a node, arXiv:2104.04473 section 3.2). ``allow``: the user insists."""
    for group in groups:
        boxes = len({box_of(r) for r in group})
        if boxes > 1 and not allow:  # the machine's name first: the error names its file
            raise InputError(f"{machine + ': ' if machine else ''}a tensor-parallel group of "
                             f"{len(group)} GPUs would span {boxes} "
                             "boxes: keep --tp at most the GPUs of one box (TP across a network "
                             "is never worth it), or give --allow-tp-across-nodes")


def unused_flags(strategy: str, *, tp: int | None, bucket_mb: float | None,
                 overlap: bool) -> list[tuple[str, str]]:
    """The run flags given that ``strategy`` would ignore, each with why: (flag, message)."""
    def why(flag: str, wants: tuple[str, ...], what: str) -> tuple[str, str]:
        return flag, (f"{flag} does not apply to -s {strategy}: {what} "
                      f"(use it with {', '.join(wants)})")

    out = []
    if tp is not None and strategy not in TP_STRATEGIES:
        out.append(why("--tp", TP_STRATEGIES, "it sets the tensor-parallel degree"))
    if bucket_mb is not None and strategy not in DDP_STRATEGIES:
        out.append(why("--bucket-mb", DDP_STRATEGIES, "it is torch DDP's bucket_cap_mb"))
    if not overlap and strategy not in DDP_STRATEGIES:
        out.append(why("--no-overlap", DDP_STRATEGIES,
                       "it models Megatron's local DDP (all-reduce after backward)"))
    return out
