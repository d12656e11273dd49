"""The host side of a GPU box: each socket's cores and RAM, the copies between a GPU and host
memory, and the CPU optimizer step that offloaded training runs (DeepSpeed ZeRO-Offload,
FSDP2 ``CPUOffloadPolicy``).

- A copy between GPU r and host memory crosses r's own PCIe path to the socket NCCL pins it to
  (``Machine.local_cpu``) and writes or reads that socket's memory once: the same link ids as
  the SHM collectives' routes, so offload traffic and NCCL's host-staged traffic share every
  switch uplink, socket link and memory controller they both cross.
- Pinned (page-locked) copies run at the path's DMA rate (the PCIe payload efficiency in
  catalog/links.py is calibrated on pinned copies). Pageable ones are staged by the CUDA driver
  through a pinned bounce buffer, one more host memcpy (a write and a read); measured, pinning
  made DeepSpeed's H2D copies 6x faster on one GPU (DeepSpeed PR #5301), so a pageable copy
  runs at most at a sixth of the path's rate.
- The CPU optimizer of one rank is a flow through its socket's memory of the bytes its kernel
  reads and writes per parameter, capped by its threads x one thread's rate: memory-bound
  when the socket's memory is busy (SHM collectives, other ranks' steps), otherwise bound by
  how fast one core streams memory. Every CPU Adam is an elementwise pass over four or five
  arrays far larger than the caches, so one thread's rate is one core's streaming bandwidth
  (SINGLE_THREAD_STREAM) over the bytes a parameter costs that thread: its memory traffic for
  the fused kernels (DeepSpeedCPUAdam, torch's fused CPU AdamW), more for torch's per-op loop,
  whose eight ATen ops each stream the arrays again and allocate temporaries.

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


SINGLE_THREAD_STREAM = 12e9  # B/s one core streams; see below


@dataclass(frozen=True)
class CpuOptimizer:
    """One CPU implementation of Adam: the host-memory bytes it reads and writes per fp32
    parameter and step, and the bytes' worth of one thread's time a parameter costs."""

    name: str
    bytes_per_param: float
    thread_bytes_per_param: float
    source: str

    def thread_rate(self, state_bytes: int = 4) -> float:
        """Parameters per second one thread steps, states of ``state_bytes`` each."""
        return SINGLE_THREAD_STREAM / (self.thread_bytes_per_param * state_bytes / 4)


# One core's streaming bandwidth: single-thread STREAM triad is about 12 GB/s on Skylake-SP
# with DDR4-2666 (AnandTech, "Intel Skylake-EP vs AMD EPYC 7000", 2017) and about 20 GB/s on
# Haswell-EP (J. McCalpin, Intel community forum, "single core bandwidth"); Little's law
# (outstanding misses x 64 B / latency) keeps every server core of the last decade near that.
# Assumption: 12 GB/s, the lower of the two.
CPU_ADAM = CpuOptimizer(
    "DeepSpeedCPUAdam",
    # fused AVX kernel (csrc/adam/cpu_adam_impl.cpp): reads the fp32 parameter, gradient, m, v
    # (16 B), writes parameter, m, v (12 B) and the 16-bit copy for the GPU (2 B)
    30.0, 30.0, "deepspeed/ops/adam/cpu_adam.py: 5x to 7x faster than torch.optim.Adam(W); "
    "memory-bound at one core's streaming rate")
TORCH_FUSED_ADAMW = CpuOptimizer(
    "torch.optim.AdamW(fused=True) on CPU",
    # aten _fused_adamw on CPU (torch >= 2.4): one vectorized pass, reads 16 B, writes 12 B
    28.0, 28.0, "pytorch/pytorch PR #123074: fused CPU Adam(W), 5.1x the for-loop on a "
    "56-core Sapphire Rapids")
TORCH_ADAMW = CpuOptimizer(
    "torch.optim.AdamW on CPU (for-loop)",
    # torch/optim/adamw.py _single_tensor_adamw: mul_, lerp_, mul_, addcmul_, sqrt, div_, add_,
    # addcdiv_ each stream fp32 tensors (about 88 B a parameter); one thread's time per
    # parameter is the fused kernel's x 5.1 (PR #123074), within DeepSpeed's 5x-7x for CPU-Adam
    88.0, 28.0 * 5.1, "pytorch/pytorch PR #123074: the fused CPU kernel is 5.1x the for-loop")
# torch's foreach path does not run on CPU tensors (foreach kernels are CUDA's and XPU's:
# torch/utils/_foreach_utils.py), so foreach on the host is the for-loop.
CPU_OPTIMIZERS = {"deepspeed": CPU_ADAM, "fused": TORCH_FUSED_ADAMW, "foreach": TORCH_ADAMW,
                  "loop": TORCH_ADAMW}


def _cpu_config(machine: Machine, cpu: str) -> NodeConfig:
    return machine.nodes[cpu]


def cores(machine: Machine, cpu: str) -> int:
    return _cpu_config(machine, cpu).cores or DEFAULT_CORES


def memory_bytes(machine: Machine) -> int:
    """Host RAM of the whole machine (every socket's)."""
    return int(sum((_cpu_config(machine, c).memory_gib or DEFAULT_MEMORY_GIB) * GiB
                   for c in machine.cpu_nodes))


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
    scale = machine.scales.factor("offload")  # the ranges' factor (scales.py), else 1
    usage = {lid: 1.0 / scale for lid in path.links}
    usage[f"mem:{cpu}"] = (1.0 if pinned else 3.0) / scale  # pageable: + the bounce's memcpy
    cap = float("inf") if pinned else scale * path.capacity / PAGEABLE_SLOWDOWN
    latency = sum(machine.links[lid].latency for lid in path.links)
    return Flow(tuple(usage.items()), float(nbytes), cap, latency)


def optimizer_flow(machine: Machine, rank: int, params: float, optimizer: CpuOptimizer,
                   threads: float, state_bytes: int = 4) -> Flow:
    """One rank's CPU optimizer step over ``params`` parameters on ``threads`` cores, its
    parameters and states ``state_bytes`` each (2 when they are bf16, as torchtune keeps them)."""
    cpu = socket(machine, rank)
    scale = machine.scales.factor("offload")
    nbytes = params * optimizer.bytes_per_param * state_bytes / 4
    seconds = params / (threads * optimizer.thread_rate(state_bytes))
    return Flow(((f"mem:{cpu}", 1.0 / scale),), nbytes, scale * nbytes / seconds)


def cpu_pass_flow(machine: Machine, rank: int, params: float, bytes_per_param: float,
                  threads: float) -> Flow:
    """One rank's elementwise pass over ``params`` host tensors on the CPU (a torch op on CPU
    tensors: read and write ``bytes_per_param`` in all), on ``threads`` intra-op threads each
    streaming at one core's rate, through its socket's memory."""
    cpu = socket(machine, rank)
    scale = machine.scales.factor("offload")
    nbytes = params * bytes_per_param
    return Flow(((f"mem:{cpu}", 1.0 / scale),), nbytes, scale * threads * SINGLE_THREAD_STREAM)


def threads_per_rank(machine: Machine, rank: int, *, torchrun: bool) -> float:
    """CPU threads one rank's optimizer gets.

    DeepSpeed's launcher leaves OMP_NUM_THREADS unset, so CPU-Adam's OpenMP loop spreads over
    the socket's cores, shared by the ranks on that socket (what --bind_cores_to_rank makes
    explicit); so do a process per GPU started by torch.multiprocessing (AnswerDotAI/fsdp_qlora
    train.py) and accelerate launch, which gives each process cores / processes threads
    (``num_cpu_threads_per_process``). torchrun (torchtune's ``tune run``, torchtitan's
    run_train.sh) sets OMP_NUM_THREADS=1 for every process when it starts more than one
    (torch/distributed/run.py), so PyTorch's CPU optimizer runs on one thread per rank.
    """
    cpu = socket(machine, rank)
    if torchrun and machine.n_gpus > 1:
        return 1.0
    return cores(machine, cpu) / max(1, local_ranks(machine, cpu))

