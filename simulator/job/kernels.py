"""The unit of GPU work the simulator times: a `Kernel`, and `MemoryBound` runs of them.

A `Kernel` is one launch: a GEMM (with its shape, for tile efficiency), a flash-attention
kernel, or a memory-bound elementwise kernel, with its FLOPs and the HBM bytes it reads and
writes. simulator/job/compute.py times each kernel by a roofline.

A `MemoryBound` is the memory-bound work between two GEMMs (a norm, rotary, the MLP activation,
a residual add) as one kernel regime runs it: its forward kernels, its backward kernels, and the
bytes per token it keeps for backward. The regimes are simulator/job/eager.py (PyTorch modules
as the frameworks write them), compiled.py (torch.compile / Inductor) and fused.py (hand-fused
kernels). Bytes are counted per element moved: a kernel reading a bf16 tensor of N elements
and writing one moves 4N bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

KernelKind = Literal["gemm", "attention_fwd", "attention_bwd", "memory", "dense"]
FP32 = 4  # bytes of an fp32 element (upcasts, reductions, optimizer states)


@dataclass(frozen=True)
class Kernel:
    """One GPU kernel: its FLOPs and the bytes it moves through memory."""

    kind: KernelKind
    flops: float
    bytes: float
    shape: tuple[int, int, int] | None = None  # GEMM (m, n, k)
    element_bytes: int = 2  # operand size: 4 under fp32 training (compute.py picks the rate)
    weight_grad: bool = False  # dW = dY^T X: needs the layer input, not the input gradient
    name: str = ""  # what the framework calls it (aten op), for tests and traces


def gemm(m: int, n: int, k: int, a: int, *, extra_bytes: float = 0.0) -> Kernel:
    """C[m,n] = A[m,k] @ B[k,n] with a-byte elements."""
    return Kernel("gemm", 2.0 * m * n * k, (m * k + k * n + m * n) * a + extra_bytes, (m, n, k),
                  a, name="mm")


def memory(nbytes: float, flops: float = 0.0, name: str = "") -> Kernel:
    """A memory-bound kernel moving ``nbytes`` through HBM."""
    return Kernel("memory", flops, nbytes, name=name)


def pointwise(name: str, elements: float, *, reads: float, writes: float,
              flops_per_element: float = 1.0) -> Kernel:
    """An elementwise (or row-reduction) kernel over ``elements``: ``reads`` and ``writes``
    bytes per element (a bf16 add of two tensors: reads 4, writes 2)."""
    return Kernel("memory", flops_per_element * elements, elements * (reads + writes),
                  name=name)


def tiny(name: str) -> Kernel:
    """A kernel over one value per row (a mean's scalar, rsqrt of a variance): its bytes are
    negligible, its launch is not."""
    return Kernel("memory", 0.0, 0.0, name=name)


@dataclass(frozen=True)
class MemoryBound:
    """Memory-bound work between GEMMs as one regime runs it."""

    forward: tuple[Kernel, ...] = ()
    backward: tuple[Kernel, ...] = ()
    saved_per_token: float = 0.0  # bytes kept for backward, beyond the GEMM and attention inputs

    @staticmethod
    def of(forward: list[Kernel], backward: list[Kernel],
           saved_per_token: float = 0.0) -> MemoryBound:
        return MemoryBound(tuple(forward), tuple(backward), saved_per_token)

    def __add__(self, other: MemoryBound) -> MemoryBound:
        return MemoryBound(self.forward + other.forward, self.backward + other.backward,
                     self.saved_per_token + other.saved_per_token)

    @property
    def forward_bytes(self) -> float:
        return sum(k.bytes for k in self.forward)

    @property
    def backward_bytes(self) -> float:
        return sum(k.bytes for k in self.backward)


NONE = MemoryBound()


@dataclass(frozen=True)
class BlockShape:
    """The sizes a block's stages work on: one micro-batch of ``tokens`` on one GPU."""

    tokens: int
    hidden: int
    kv_dim: int  # key/value width (GQA: kv_heads x head_dim)
    ffn: int
    heads: int
    e: int  # bytes per activation element: 2 under bf16/fp16, 4 under fp32
    q_dim: int = 0  # query width (heads x head_dim) when it differs from hidden

    @property
    def n_h(self) -> float:
        return float(self.tokens * self.hidden)

    @property
    def n_q(self) -> float:
        return float(self.tokens * (self.q_dim or self.hidden))

    @property
    def n_kv(self) -> float:
        return float(self.tokens * self.kv_dim)

    @property
    def n_f(self) -> float:
        return float(self.tokens * self.ffn)

    @property
    def repeats_kv(self) -> bool:
        """Grouped-query attention: fewer key/value heads than query heads."""
        return self.kv_dim < (self.q_dim or self.hidden)
