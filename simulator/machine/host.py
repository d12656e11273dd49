"""The host side of a GPU box: each socket's cores and RAM, the copies between a GPU and host
memory, and the CPU optimizer step that offloaded training runs (DeepSpeed ZeRO-Offload,
FSDP2 ``CPUOffloadPolicy``).

- A copy between GPU r and host memory crosses r's own PCIe path to the socket NCCL pins it to
  (``Machine.local_cpu``) and writes or reads that socket's memory once: the same link ids as
  the SHM collectives' routes, so offload traffic and NCCL's host-staged traffic share every
  switch uplink, socket link and memory controller they both cross.
- Pinned (page-locked) copies run at the path's DMA rate (the PCIe payload efficiency in
  hardware.py is calibrated on pinned copies). Pageable ones are staged by the CUDA driver
  through a pinned bounce buffer, one more host memcpy (a write and a read); measured, pinning
  made DeepSpeed's H2D copies 6x faster on one GPU (DeepSpeed PR #5301), so a pageable copy
  runs at most at a sixth of the path's rate.
- The CPU optimizer of one rank is a flow through its socket's memory of ``bytes_per_param``
  per parameter, capped by its threads x the optimizer's per-core rate: memory-bound when the
  socket's memory is busy (SHM collectives, other ranks' steps), compute-bound otherwise.

Defaults where a topology gives no ``cores`` or ``memory_gib`` are stated below.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from simulator.engine.program import Flow
from simulator.units import GiB

if TYPE_CHECKING:
    from simulator.inputs.schema import NodeConfig
    from simulator.machine.topology import Machine

DEFAULT_CORES = 32  # assumption: a 32-core server socket (Xeon Gold 6448Y, EPYC 9354)
DEFAULT_MEMORY_GIB = 512  # assumption: 8 DDR5 channels with one 64 GiB RDIMM each
PAGEABLE_SLOWDOWN = 6.0  # DeepSpeed PR #5301: pinned H2D 6x faster than pageable, one GPU


@dataclass(frozen=True)
class CpuOptimizer:
    """One CPU implementation of Adam: its per-core rate and its memory traffic."""

    name: str
    params_per_s_per_core: float
    bytes_per_param: float  # host-memory bytes read and written per parameter and step
    source: str


# DeepSpeed PR #735 (its CPU-Adam author, 2021): an 11.6B-parameter GPT-2 step takes 8.2 s with
# DeepSpeedCPUAdam and 56 s with torch.optim.Adam. The PR names no host; taken as DeepSpeed's
# DGX-2 test host (2 x 24-core Xeon Platinum 8168, the ZeRO-Offload paper's testbed, arXiv:
# 2101.06840): 29.5 M and 4.3 M parameters/s per core, uncertain by about 2x with the core count.
CPU_ADAM = CpuOptimizer(
    "DeepSpeedCPUAdam", 11.6e9 / 8.2 / 48,
    # fused AVX kernel: reads fp32 param, grad, m, v (16 B), writes param, m, v (12 B) and the
    # 16-bit copy for the GPU (2 B), as job/ops.py counts the GPU step
    30.0, "DeepSpeed PR #735: 11.6B parameters in 8.2 s, 48 cores assumed")
TORCH_ADAMW = CpuOptimizer(
    "torch.optim.AdamW on CPU (for-loop)", 11.6e9 / 56 / 48,
    # torch/optim/adamw.py _single_tensor_adamw: mul_, lerp_, mul_, addcmul_, sqrt, div_, add_,
    # addcdiv_ each read and write fp32 tensors: about 80 B per parameter
    80.0, "DeepSpeed PR #735: torch.optim.Adam 56 s for 11.6B parameters, 48 cores assumed")


def _cpu_config(machine: Machine, cpu: str) -> NodeConfig:
    config: NodeConfig = machine.graph.nodes[cpu]["config"]
    return config


def cores(machine: Machine, cpu: str) -> int:
    return _cpu_config(machine, cpu).cores or DEFAULT_CORES


def memory_bytes(machine: Machine) -> int:
    """Host RAM of the whole machine (every socket's)."""
    cpus = [n for n, d in machine.graph.nodes(data=True) if d["kind"] == "cpu"]
    return int(sum((_cpu_config(machine, c).memory_gib or DEFAULT_MEMORY_GIB) * GiB
                   for c in cpus))


def socket(machine: Machine, rank: int) -> str:
    cpu = machine.local_cpu(rank)
    if cpu is None:
        raise ValueError(f"{machine.name}: no cpu node for GPU {rank}'s host memory")
    return cpu


def local_ranks(machine: Machine, cpu: str) -> int:
    return sum(1 for r in range(machine.n_gpus) if machine.local_cpu(r) == cpu)


def copy_flow(machine: Machine, rank: int, nbytes: float, *, to_host: bool,
              pinned: bool = True) -> Flow:
    """``nbytes`` between GPU ``rank`` and its socket's memory, as a fabric flow."""
    cpu = socket(machine, rank)
    gpu = machine.gpu_nodes[rank]
    path = machine.best_path(gpu, cpu) if to_host else machine.best_path(cpu, gpu)
    usage = {lid: 1.0 for lid in path.links}
    usage[f"mem:{cpu}"] = 1.0 if pinned else 3.0  # pageable: + the bounce buffer's memcpy
    cap = float("inf") if pinned else path.capacity / PAGEABLE_SLOWDOWN
    latency = sum(machine.links[lid].latency for lid in path.links)
    return Flow(tuple(usage.items()), float(nbytes), cap, latency)


def optimizer_flow(machine: Machine, rank: int, params: float, optimizer: CpuOptimizer,
                   threads: float) -> Flow:
    """One rank's CPU optimizer step over ``params`` parameters on ``threads`` cores."""
    cpu = socket(machine, rank)
    rate = threads * optimizer.params_per_s_per_core * optimizer.bytes_per_param
    return Flow(((f"mem:{cpu}", 1.0),), params * optimizer.bytes_per_param, rate)


def threads_per_rank(machine: Machine, rank: int, *, torchrun: bool) -> float:
    """CPU threads one rank's optimizer gets.

    DeepSpeed's launcher leaves OMP_NUM_THREADS unset, so CPU-Adam's OpenMP loop spreads over
    the socket's cores, shared by the ranks on that socket (what --bind_cores_to_rank makes
    explicit). torchrun sets OMP_NUM_THREADS=1 for every process when it starts more than one
    (torch/distributed/run.py), so PyTorch's CPU optimizer runs on one thread per rank.
    """
    cpu = socket(machine, rank)
    if torchrun and machine.n_gpus > 1:
        return 1.0
    return cores(machine, cpu) / max(1, local_ranks(machine, cpu))

