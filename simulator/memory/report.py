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


@dataclass(frozen=True)
class Line:
    """One allocation of the memory estimate: what it is, its bytes, and when it is alive."""

    category: str  # one of CATEGORIES
    label: str  # what this memory is, in words
    bytes: float
    # when it is alive: "both" (always), "backward" (from the start of backward: activations,
    # units in flight), "grads" (allocated during backward, all alive at its end and at the
    # step), "step" (the optimizer step only) or "only:<moment>" (one moment of MOMENTS)
    phase: str = "both"
    host: bool = False  # in host RAM (offloaded), not on the GPU
    # where it lives: "tensor" (allocated through PyTorch's caching allocator), "cache" (held
    # by the allocator but not by a tensor: rounding, fragmentation), "driver" (outside it:
    # the CUDA context, NCCL's buffers)
    pool: str = "tensor"
    # in CUDA managed memory (a paged optimizer's states, cudaMallocManaged): outside the
    # caching allocator and evictable, so not in the verdict; it takes what the rest leaves
    paged: bool = False


# The moments a peak can fall on. Backward frees each layer's activations as it creates that
# layer's gradients, so with layers alike the sum of the two is largest at one end or the other.
MOMENTS = {"backward": "start of backward", "backward_end": "end of backward",
           "step": "optimizer step"}


def alive(line: Line, moment: str) -> bool:
    """Whether ``line`` holds GPU memory at ``moment`` (one of MOMENTS)."""
    if line.host or line.paged:
        return False
    if line.phase.startswith("only:"):
        return line.phase == f"only:{moment}"
    if line.phase in ("both", moment):
        return True
    if moment == "backward_end":
        return line.phase == "grads" or (line.phase == "backward"
                                         and line.category != "activations")
    return moment == "step" and line.phase == "grads"


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

    def phase_total(self, moment: str) -> float:
        return sum(x.bytes for x in self.lines if alive(x, moment))

    @cached_property
    def peak_phase(self) -> str:
        """The moment of the peak (worked out once: every figure of the peak reads it)."""
        return max(MOMENTS, key=self.phase_total)

    @property
    def peak_bytes(self) -> int:
        return int(self.phase_total(self.peak_phase))

    def peak_as(self, counter: str) -> int:
        """The peak as PyTorch's counters report it: ``allocated`` (torch.cuda
        max_memory_allocated, torchtune's "peak memory active"), ``reserved``
        (max_memory_reserved: the allocator's segments, torchtitan's memory figure) or
        ``total`` (what the card must hold, the verdict's)."""
        pools = {"allocated": ("tensor",), "reserved": ("tensor", "cache"),
                 "total": ("tensor", "cache", "driver")}[counter]
        moment = self.peak_phase
        return int(sum(x.bytes for x in self.lines
                       if x.pool in pools and not x.host and alive(x, moment)))

    @property
    def breakdown_bytes(self) -> dict[str, int]:
        out = dict.fromkeys(CATEGORIES, 0.0)
        moment = self.peak_phase
        for x in self.lines:
            if alive(x, moment):
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
                       and not x.paged))

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
                       **({"paged": True} if x.paged else {})}
                      for x in self.lines],
            "notes": list(self.notes),
        }
