"""What a collective's kernel costs the compute that runs beside it, by transport and protocol.

A GPU shares two resources with NCCL's kernels:
- SMs: a channel is one thread block that holds its SM for the whole call, compute blocks
  never share it ("NCCL CTAs won't share an SM with compute kernels", NVIDIA/nccl issue 689,
  maintainer). The engine takes ``Planned.n_channels`` of them away from compute.
- Memory bandwidth: the kernel reads and writes the GPU's memory for every byte it moves, and
  a memory-bound compute kernel beside it gets what is left ("a fully loaded GPU can detract
  from comms performance ... by competing for memory bandwidth", NVIDIA/nccl issue 701,
  maintainer: the same bandwidth either way). ``hbm_share`` is the share of the card's
  achievable memory bandwidth the kernel takes at its lone rate; the engine slows a compute
  task's memory-bound share by it.

Local memory bytes per byte of a rank's progress (the bytes it sends), from the ring's
primitives (NCCL src/device/prims_simple.h, prims_ll.h: a reducing step reads its own input
and the receive buffer and writes its output, a copying step writes what it receives):
- P2P (NVLink, PCIe): the peer writes into this GPU's receive buffer and the kernel reads it
  back (both times the protocol's line overhead: LL 8 bytes per 4 of data, LL128 128 per
  120), plus the input read and output write of a reduction (2) or the output write of a
  copy (1);
- SHM and NET staged through host memory: the buffers are in host memory, so only the input
  read and output write of a reduction (2), or the output write of a copy (1), touch the
  GPU's memory; the host side (memory, PCIe) is on the fabric already.
What a transport costs the host (host-memory bandwidth an SHM collective takes from a CPU
optimizer or an offload copy) is the fabric's: their flows share ``mem:cpu`` links.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from simulator.catalog.gpus import achievable_memory_bandwidth
from simulator.nccl.wire import WIRE_OVERHEAD

if TYPE_CHECKING:
    from simulator.nccl.communicator import Communicator

REDUCING = ("allreduce", "reducescatter")


def local_bytes(op: str, transports: str, protocol: str) -> float:
    """Bytes through a rank's own memory per byte of its progress."""
    own = 2.0 if op in REDUCING else 1.0  # input read + output write, or the output write
    if "P2P" not in transports.split("+"):  # SHM, NET: the receive buffer is in host memory
        return own
    return own + 2.0 * WIRE_OVERHEAD[protocol]  # the peer's write into it, and its read


def lone_rate(comm: Communicator, usage: tuple[tuple[str, float], ...],
              max_rate: float) -> float:
    """Bytes of progress per second of a flow alone on its links (its fastest)."""
    links = comm.machine.links
    rate = min((links[lid].capacity / w for lid, w in usage if w > 0), default=math.inf)
    return min(rate, max_rate)


def hbm_share(comm: Communicator, op: str, ranks: tuple[int, ...], transports: str,
              protocol: str, usage: tuple[tuple[str, float], ...], max_rate: float) -> float:
    """The share of the slowest-memory rank's bandwidth the call's kernel takes at its lone
    rate (an upper bound: beside compute it runs no faster)."""
    rate = lone_rate(comm, usage, max_rate)
    if not math.isfinite(rate) or rate <= 0:
        return 0.0
    memory = min(achievable_memory_bandwidth(comm.machine.gpu_of(r)) for r in ranks)
    return rate * local_bytes(op, transports, protocol) / memory
