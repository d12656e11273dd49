"""Offloaded training as tasks: the copies between each GPU and host memory, and the CPU
optimizer step (DeepSpeed ZeRO-Offload and ZeRO-3 offload, FSDP2 ``CPUOffloadPolicy``).

How the frameworks run it (bytes per parameter of a rank's 1/N share):
- DeepSpeed ZeRO-1/2, ``offload_optimizer`` (deepspeed/runtime/zero/stage_1_and_2.py): each
  reduced bucket's partition is copied down as fp32 (4 B; ``copy_`` with non_blocking casts on
  the GPU) on the stream that reduced it (``async_inplace_copy_grad_to_fp32_buffer_from_gpu``);
  after backward DeepSpeedCPUAdam steps the fp32 partition on the host; the updated 16-bit
  partition goes back up (2 B, through a pinned 16-bit buffer, DeepSpeed PR #7309) and is
  all-gathered as without offload.
- DeepSpeed ZeRO-3 (stage3.py): with ``offload_param`` each unit's 16-bit partition is copied
  up before its all-gather (2 B, forward and again in backward); reduced gradient partitions
  are copied down as fp32 (4 B); CPU-Adam steps on the host, which keeps the updated
  parameters (nothing goes up after the step). With ``offload_optimizer`` alone the parameter
  partition stays on the GPU and the updated one is copied up after the step (2 B).
- FSDP2 ``CPUOffloadPolicy`` (torch/distributed/fsdp/_fully_shard/_fsdp_param.py,
  ``_fsdp_collectives.py``): the fp32 shard is copied up before every all-gather (4 B,
  ``sharded_param.to(device, non_blocking=True)``, cast to bf16 on the GPU), the reduce-scattered
  fp32 gradient shard is copied down (4 B); the optimizer is the user's torch.optim on CPU
  tensors; parameters stay on the host.
DeepSpeed's ``pin_memory`` defaults to false (pageable copies, host.py), FSDP2's to true.
ZeRO-Offload's delayed parameter update (the paper's DPU, overlapping the CPU step with the
next step's compute) is not in DeepSpeed's engine, and is not modelled.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from simulator.engine.program import Move, MoveKind, Program
from simulator.machine import host

if TYPE_CHECKING:
    from simulator.machine.topology import Machine


class Offloader:
    """The offload tasks of one program (the ranks it stands for, each on its own path)."""

    def __init__(self, machine: Machine, ranks: Sequence[int], *, what: str, framework: str,
                 pinned: bool | None, optimizer_impl: str = "fused", state_bytes: int = 4,
                 torchrun: bool = False) -> None:
        self.machine = machine
        self.ranks = tuple(ranks) or tuple(range(machine.n_gpus))
        self.what = what  # "optimizer" | "params"
        self.framework = framework  # "deepspeed" | "fsdp"
        self.pinned = (framework == "fsdp") if pinned is None else pinned
        self.copied = {"d2h": 0.0, "h2d": 0.0}  # bytes one rank moves per step
        # DeepSpeed steps with CPU-Adam on fp32 partitions; FSDP2 with the recipe's torch AdamW
        # on the shards as they are (bf16 under torchtune's pure bf16)
        self.optimizer = host.CPU_OPTIMIZERS["deepspeed" if framework == "deepspeed"
                                             else optimizer_impl]
        self.state_bytes = 4 if framework == "deepspeed" else state_bytes
        self.torchrun = torchrun

    def copy(self, prog: Program, stream: str, name: str, nbytes: float, to_host: bool,
             deps: tuple[int, ...]) -> int:
        """``nbytes`` per rank between every GPU of the program and its socket's memory."""
        kind: MoveKind = "d2h" if to_host else "h2d"
        self.copied[kind] += nbytes
        flows = tuple(host.copy_flow(self.machine, r, nbytes, to_host=to_host,
                                     pinned=self.pinned) for r in self.ranks)
        return prog.add(stream, Move(name, kind, flows, {"pinned": self.pinned}), deps)

    def cpu_step(self, prog: Program, params: float, deps: tuple[int, ...]) -> int:
        """The optimizer over ``params`` parameters per rank, on every rank's socket at once."""
        flows = tuple(host.optimizer_flow(
            self.machine, r, params, self.optimizer,
            host.threads_per_rank(self.machine, r, torchrun=self.torchrun), self.state_bytes)
            for r in self.ranks)
        return prog.add("cpu", Move("optimizer.cpu", "cpu_optimizer", flows,
                                    {"optimizer": self.optimizer.name, "params": params}), deps)

    def cpu_pass(self, prog: Program, name: str, params: float, bytes_per_param: float,
                 deps: tuple[int, ...]) -> int:
        """A torch op over ``params`` host tensors per rank (on the CPU stream), each rank on
        its intra-op threads (OMP_NUM_THREADS: host.threads_per_rank)."""
        flows = tuple(host.cpu_pass_flow(
            self.machine, r, params, bytes_per_param,
            host.threads_per_rank(self.machine, r, torchrun=self.torchrun)) for r in self.ranks)
        return prog.add("cpu", Move(name, "cpu_optimizer", flows, {"params": params}), deps)

    def report(self, per_micro: dict[str, float], accum: int) -> dict[str, object]:
        """What the report says of the offload: bytes one GPU moves per step, each way."""
        step = {k: self.copied[k] - per_micro[k] for k in self.copied}  # after the last micro
        return {"what": self.what, "framework": self.framework, "pin_memory": self.pinned,
                "cpu_optimizer": self.optimizer.name,
                **{f"{k}_bytes_per_gpu": per_micro[k] * accum + step[k] for k in self.copied}}
