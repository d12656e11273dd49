"""The optimizer step in backward (torchtune ``optimizer_in_bwd``) and a paged optimizer's
states crossing the host link (bitsandbytes ``PagedAdamW8bit``/``PagedAdamW``).

How the frameworks run it:
- optimizer_in_bwd (torchtune training/memory.py ``register_optim_in_bwd_hooks``): one
  optimizer per parameter, stepped from the parameter's post-accumulate-grad hook (then
  ``zero_grad()``), so each step runs in backward right after the op that completes its
  gradient, on the compute stream.
- A paged optimizer's ``step()`` (bitsandbytes optim/optimizer.py) does, per parameter,
  ``prefetch_state(p)`` (``cudaMemPrefetchAsync`` of m and v on stream 0, csrc/
  pythonInterface.cpp ``cprefetch``), the update kernel, then ``sync_gpu(p)``
  (``torch.cuda.synchronize()``): the migration sits in line with the compute stream and
  nothing overlaps it.
- When the states do not fit beside everything else, making room evicts managed memory only
  (cudaMemPrefetchAsync's documentation: cudaMalloc memory is never evicted), a 2 MB root chunk
  at a time from the head of an LRU list (open-gpu-kernel-modules nvidia-uvm/uvm_pmm_gpu.c,
  ``pick_root_chunk_to_evict``). Every step touches every parameter's states once in the same
  order, a cycle longer than the space left: LRU then evicts each chunk before it comes round
  again, so every paged byte comes in and goes back out once per step (it was written by the
  update, so eviction copies it to the host).
- Evictions and migrations use separate UVM channel types (GPU_TO_CPU, CPU_TO_GPU, on their
  own copy engines where the GPU has them: nvidia-uvm/uvm_channel.h), and an eviction's copies
  join the chunk's tracker without a wait (uvm_pmm_gpu.c ``evict_root_chunk_from_va_block``),
  so the driver goes on to the next chunk while they run: over a full-duplex link the two
  directions run at once, each on its own direction of the GPU's host path (the
  same flows as offload copies, machine/host.py ``copy_flow``, as pinned copies: the copy
  engines move the managed pages themselves, with no staging buffer).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from simulator.engine.program import Move, MoveKind, Program
from simulator.job import optimizer
from simulator.job.ops import Op, tensor_step_op
from simulator.job.workload import Job
from simulator.machine import host
from simulator.strategies.steps import Emit, as_compute

if TYPE_CHECKING:
    from simulator.machine.topology import Machine
    from simulator.strategies.options import StrategyOptions


def paged_bytes(job: Job, indices: Sequence[int]) -> float:
    """Managed-memory state bytes of these parameters (0 unless the optimizer is paged)."""
    if job.optimizer not in optimizer.PAGED:
        return 0.0
    return sum(optimizer.paged_state_split(job.optimizer, job.params[i].numel, 0.0)[1]
               for i in indices if job.params[i].trainable)


def page(prog: Program, machine: Machine, options: StrategyOptions, nbytes: float, name: str,
         deps: tuple[int, ...]) -> tuple[int, ...]:
    """``nbytes`` of states migrated to every GPU and as many evicted, both ways at once;
    returns the two tasks the update waits for."""
    ranks = options.ranks or tuple(range(machine.n_gpus))
    tasks = []
    directions: tuple[tuple[bool, MoveKind, str], ...] = ((False, "h2d", "prefetch"),
                                                         (True, "d2h", "evict"))
    for to_host, kind, what in directions:
        flows = tuple(host.copy_flow(machine, r, nbytes, to_host=to_host) for r in ranks)
        tasks.append(prog.add(f"uvm.{kind}", Move(f"{name}.{what}", kind, flows,
                                                  {"paged_state_bytes": nbytes}), deps))
    prog.meta["paged_bytes_per_step"] = prog.meta.get("paged_bytes_per_step", 0.0) + nbytes
    return tuple(tasks)


def step(prog: Program, job: Job, machine: Machine, options: StrategyOptions, op: Op,
         indices: Sequence[int], deps: tuple[int, ...], scale: float = 1.0) -> int:
    """One optimizer op on the compute stream, after its states come in when they page."""
    if options.page_optimizer_states and (nbytes := paged_bytes(job, indices)):
        deps = page(prog, machine, options, nbytes * scale, op.name, deps)
    return prog.add("compute", as_compute(op, machine.gpu, scale=scale), deps)


def backward_with_steps(prog: Program, job: Job, machine: Machine, options: StrategyOptions,
                        backward: Sequence[Op], emit: Emit, after: int, prefix: str) -> int:
    """Backward with each op's parameters stepped right after it (optimizer_in_bwd); returns
    the last task."""
    last = after
    stepped: set[int] = set()
    for op in backward:
        last = emit(prog, op, (last,), prefix)
        grads = [i for i in op.grads if job.params[i].trainable and i not in stepped]
        if grads:
            stepped.update(grads)
            last = step(prog, job, machine, options,
                        tensor_step_op(job, grads, f"{prefix}{op.name}.optimizer", op.block),
                        grads, (last,))
    rest = [i for i, p in enumerate(job.params) if p.trainable and i not in stepped]
    if rest:  # gradients no backward op claims: their hooks fire as backward ends
        last = step(prog, job, machine, options,
                    tensor_step_op(job, rest, f"{prefix}optimizer.rest", -1), rest, (last,))
    return last
