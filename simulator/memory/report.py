"""A memory estimate as memory.py reports it: itemised ``Line``s in five categories, the moments
a peak can fall on, and the ``MemoryReport`` that sums them into the peak, the verdict and its
JSON. The lines themselves (what a recipe holds) are memory.py's.

Lines in host RAM or in CUDA managed memory (a paged optimizer's states) are outside the GPU's
peak; the managed ones take what the peak leaves, the rest is paged to host RAM.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

from simulator.units import GiB

CATEGORIES = ("weights", "gradients", "optimizer", "activations", "other")
# the pools each of PyTorch's counters sees (Line.pool)
COUNTER_POOLS = {"allocated": ("tensor",), "reserved": ("tensor", "cache", "idle"),
                 "total": ("tensor", "cache", "idle", "driver")}
# the pools the card must hold for the job to run (the verdict): not "idle", cached blocks the
# allocator frees and retries with before it reports out-of-memory (allocator.py)
NEEDED_POOLS = ("tensor", "cache", "driver")


@dataclass(frozen=True)
class Line:
    """One allocation of the memory estimate: what it is, its bytes, and when it is alive."""

    category: str  # one of CATEGORIES
    label: str  # what this memory is, in words
    bytes: float
    # when it is alive (MOMENTS): "both" (all step), "backward" (saved in forward and held
    # through backward: activations, units in flight), "loss" (the logits and the loss's
    # tensors: from the head's forward to its backward), "recompute" (a block's recomputed
    # forward: during that block's backward only), "output" (the model output a training
    # loop keeps: from the head's forward to the step's end), "grads" (made during backward,
    # all alive at its end and at the step), "step" (the optimizer step only) or
    # "only:<moment>"
    phase: str = "both"
    host: bool = False  # in host RAM (offloaded), not on the GPU
    # where it lives: "tensor" (allocated through PyTorch's caching allocator), "cache" (held
    # by the allocator but not by a tensor: rounding, fragmentation), "driver" (outside it:
    # the CUDA context, NCCL's buffers), "idle" (a free block cached that no request of the
    # moment fits: in the counters, not in the verdict)
    pool: str = "tensor"
    # in CUDA managed memory (a paged optimizer's states, cudaMallocManaged): outside the
    # caching allocator and evictable, so not in the verdict; it takes what the rest leaves
    paged: bool = False


# The allocation timeline of a step, as the moments its peak can fall on, in the order they
# come. Forward saves every block's activations; the loss and the LM head's backward run with
# the logits alive and no block recomputed yet; then each block's backward runs with its own
# recompute alive and frees its activations as it creates its gradients (blocks alike: the
# first block's backward holds the most activations, the last the most gradients); the
# optimizer step follows.
MOMENTS = {"loss_backward": "loss and LM-head backward (logits alive)",
           "backward": "first block's backward (its recompute alive)",
           "backward_end": "end of backward (every gradient)",
           "step": "optimizer step"}


def alive(line: Line, moment: str) -> bool:
    """Whether ``line`` holds GPU memory at ``moment`` (one of MOMENTS)."""
    if line.host or line.paged:
        return False
    phase = line.phase
    if phase.startswith("only:"):
        return phase == f"only:{moment}"
    if phase in ("both", "output"):
        return True
    if phase == "loss":
        return moment == "loss_backward"
    if phase == "recompute":
        return moment == "backward"
    if phase == "backward":
        return moment in ("loss_backward", "backward") or (
            moment == "backward_end" and line.category != "activations")
    if phase == "grads":
        return moment in ("backward_end", "step")
    return phase == moment


@dataclass(frozen=True)
class MemoryReport:
    """Memory per GPU of one job under one strategy: what it holds, against the capacity."""

    strategy: str
    world: int
    tp: int
    dp: int
    micro_batch: int
    seq_len: int
    checkpointing: str
    parameters: int
    trainable_parameters: int
    capacity_bytes: int
    lines: tuple[Line, ...]
    notes: tuple[str, ...] = field(default=())
    host_capacity_bytes: int = 0  # the machine's host RAM (every socket's)
    offload: str = "none"  # what lives in host RAM: none | optimizer | params
    # the reserved peak at the ends of the middle half of published allocator overheads
    # (allocator.py); None where nobody worked it out
    reserved_range: tuple[int, int] | None = None
    # what the model's set-up leaves on the allocator before the first step, where it is
    # replayed (fsdp_wrap.py: FSDP built with sync_module_states): (reserved, allocated)
    setup: tuple[int, int] | None = None
    # the reserved counter from a replay of the allocator (step_replay.py), not the median
    reserved_replayed: bool = False
    # the replay's pools by stream after its steps: (stream, bytes)
    reserved_streams: tuple[tuple[str, int], ...] = ()

    @property
    def paged_bytes(self) -> int:
        """A paged optimizer's states in managed memory (bitsandbytes ``is_paged``)."""
        return int(sum(x.bytes for x in self.lines if x.paged))

    @property
    def paged_resident_bytes(self) -> int:
        """The paged states the card holds beside everything else: what the peak leaves free
        (the UVM driver evicts only managed pages, never cudaMalloc memory: CUDA runtime API,
        cudaMemPrefetchAsync)."""
        return max(0, min(self.paged_bytes, self.capacity_bytes - self.peak_bytes))

    @property
    def paged_to_host_bytes(self) -> int:
        """The paged states that do not fit beside the rest and live in host RAM."""
        return self.paged_bytes - self.paged_resident_bytes

    @property
    def host_peak_bytes(self) -> int:
        """Host RAM the job's offloaded states need: every rank's host lines (ranks alike),
        and the paged optimizer states the GPUs cannot hold."""
        return int((sum(x.bytes for x in self.lines if x.host) + self.paged_to_host_bytes)
                   * self.world)

    @property
    def host_fits(self) -> bool:
        return self.host_peak_bytes <= self.host_capacity_bytes or not self.host_peak_bytes

    @staticmethod
    def holds(line: Line, moment: str) -> bool:
        """Whether the card must hold ``line`` at ``moment`` (alive, and not an idle block)."""
        return line.pool in NEEDED_POOLS and alive(line, moment)

    def phase_total(self, moment: str) -> float:
        """What the card must hold at ``moment`` (the verdict's figure)."""
        return sum(x.bytes for x in self.lines if self.holds(x, moment))

    @cached_property
    def peak_phase(self) -> str:
        """The moment of the peak (worked out once: every figure of the peak reads it)."""
        return max(MOMENTS, key=self.phase_total)

    @property
    def peak_bytes(self) -> int:
        return int(self.phase_total(self.peak_phase))

    def counter_at(self, counter: str, moment: str) -> float:
        """One of PyTorch's counters at a moment: ``allocated`` (tensors), ``reserved`` (the
        allocator's segments: tensors and what it caches) or ``total`` (the card: and the
        CUDA context and NCCL's buffers beside the allocator)."""
        pools = COUNTER_POOLS[counter]
        held = sum(x.bytes for x in self.lines
                   if x.pool in pools and x.pool != "idle" and alive(x, moment))
        if "idle" not in pools:
            return held
        idle = sum(x.bytes for x in self.lines if x.pool == "idle" and alive(x, moment))
        # the allocator frees idle blocks and retries rather than run out (allocator.py): it
        # caches no more of them than the card has room for beside what it must hold
        return held + min(idle, max(0.0, self.capacity_bytes - self.phase_total(moment)))

    def peak_as(self, counter: str) -> int:
        """The peak as a counter reports it, its own maximum over the step's timeline:
        ``allocated`` (torch.cuda.max_memory_allocated, torchtune's "peak memory active"),
        ``reserved`` (max_memory_reserved: torchtitan's and fsdp_qlora's figures) or
        ``total`` (what the card must hold, the verdict's)."""
        return int(max(self.counter_at(counter, m) for m in MOMENTS))

    def timeline(self) -> list[dict[str, object]]:
        """The step's allocation timeline: each moment with the three counters there."""
        return [{"moment": m, "what": words,
                 **{f"{c}_bytes": int(self.counter_at(c, m)) for c in COUNTER_POOLS}}
                for m, words in MOMENTS.items()]

    @property
    def breakdown_bytes(self) -> dict[str, int]:
        out = dict.fromkeys(CATEGORIES, 0.0)
        moment = self.peak_phase
        for x in self.lines:
            if self.holds(x, moment):
                out[x.category] += x.bytes
        return {k: int(v) for k, v in out.items()}

    @property
    def model_state_bytes(self) -> int:
        """Weights, gradients and optimizer states on the GPU, all of them (the ZeRO paper's
        sum; a paged optimizer's managed states excluded)."""
        return int(sum(x.bytes for x in self.lines if not x.host and not x.paged
                       and x.category in ("weights", "gradients", "optimizer")))

    def category_bytes(self, category: str) -> int:
        """Every GPU line of one category, whenever it is alive."""
        return int(sum(x.bytes for x in self.lines if x.category == category and not x.host
                       and not x.paged and x.pool in NEEDED_POOLS))

    @property
    def fits(self) -> bool:
        return self.peak_bytes <= self.capacity_bytes

    def verdict(self) -> str:
        need = f"{self.peak_bytes / GiB:.1f} GiB of {self.capacity_bytes / GiB:.1f} GiB per GPU"
        text = f"fits: needs {need}" if self.fits else f"does not fit: needs {need}"
        if self.paged_bytes:
            text += (f"; paged optimizer states {self.paged_bytes / GiB:.1f} GiB: "
                     f"{self.paged_resident_bytes / GiB:.1f} GiB on the GPU, "
                     f"{self.paged_to_host_bytes / GiB:.1f} GiB paged to host RAM")
        if self.host_peak_bytes:
            host = (f"{self.host_peak_bytes / GiB:.1f} GiB of host RAM of "
                    f"{self.host_capacity_bytes / GiB:.1f} GiB")
            text += f"; host {'fits' if self.host_fits else 'does not fit'}: needs {host}"
        return text

    def to_json(self) -> dict[str, object]:
        return {
            "strategy": self.strategy, "world": self.world, "tp": self.tp, "dp": self.dp,
            "micro_batch": self.micro_batch, "seq_len": self.seq_len,
            "activation_checkpointing": self.checkpointing,
            "parameters": self.parameters, "trainable_parameters": self.trainable_parameters,
            "peak_bytes": self.peak_bytes, "capacity_bytes": self.capacity_bytes,
            "peak_allocated_bytes": self.peak_as("allocated"),
            "peak_reserved_bytes": self.peak_as("reserved"),
            **({"peak_reserved_range_bytes": list(self.reserved_range)}
               if self.reserved_range else {}),
            "peak_reserved_from": "replay" if self.reserved_replayed else "published median",
            "peak_device_total_bytes": self.peak_as("total"),
            **({"setup_reserved_bytes": self.setup[0], "setup_allocated_bytes": self.setup[1]}
               if self.setup else {}),
            **({"reserved_by_stream_bytes": dict(self.reserved_streams)}
               if self.reserved_streams else {}),
            "timeline": self.timeline(),
            "fits": self.fits, "peak_phase": self.peak_phase,
            "host_peak_bytes": self.host_peak_bytes,
            "host_capacity_bytes": self.host_capacity_bytes, "host_fits": self.host_fits,
            "offload": self.offload,
            **({"paged_optimizer": {"bytes": self.paged_bytes,
                                    "resident_bytes": self.paged_resident_bytes,
                                    "paged_to_host_bytes": self.paged_to_host_bytes}}
               if self.paged_bytes else {}),
            "breakdown_bytes": self.breakdown_bytes,
            "lines": [{"category": x.category, "label": x.label, "bytes": int(x.bytes),
                       "phase": x.phase, **({"host": True} if x.host else {}),
                       **({"paged": True} if x.paged else {}),
                       **({"idle": True} if x.pool == "idle" else {})}
                      for x in self.lines],
            "notes": list(self.notes),
        }
