"""What FSDP1's wrap leaves reserved when it builds the sharded model from rank 0's host copy
(``sync_module_states=True``, as AnswerDotAI/fsdp_qlora's train.py does with ``low_memory``).

The caching allocator (caching_allocator.py) replays rank 0's allocations, unit by unit in the
order the auto-wrap builds them (torch/distributed/fsdp/wrap.py ``_recursive_wrap``: children
before their parent, the root last), each unit as torch/distributed/fsdp/_init_utils.py and
_flat_param.py (torch 2.2) build it:

1. ``_move_module_to_device``: each parameter still on the host copied to the GPU, one at a
   time (QLoRA's 4-bit weights are already packed: half a byte per weight);
2. ``_sync_module_params_and_buffers``: ``dist._broadcast_coalesced`` in buckets of
   PARAM_BROADCAST_BUCKET_SIZE (250 MiB; a bucket closes once it reaches the size,
   torch/csrc/distributed/c10d/reducer.cpp ``compute_bucket_assignment_by_size``), each
   flattened into a buffer of its own, two in flight (comm.cpp ``broadcast_coalesced``). The
   buffers are freed once copied back, but ProcessGroupNCCL records them on its stream
   (``recordStream``), so the allocator hands them out again only when that stream's event has
   completed (``process_events``): not to this unit's flat parameter and shard, queued right
   behind the broadcast, and, as assumed here, by the time the next unit's weights have come
   over the host link (a copy about as long as the broadcast);
3. ``flatten_tensors``: the unit's parameters concatenated into the flat parameter
   (``use_orig_params=False``: no alignment padding), then the originals freed;
4. ``FlatParamHandle.shard``: rank 0's chunk cloned and the unsharded storage freed
   (``orig_storage._resize_(0)``); with CPU offload the shard then moves to host memory
   (``flat_param_to(cpu)``). Under ``NO_SHARD`` the flat parameter stays whole.

The units are fsdp_qlora's policy (train.py ``get_wrapping_policy``): under LoRA and QLoRA every
leaf layer with a trainable weight (each LoRA A and B) is a unit of its own; every decoder
layer is a unit (for full fine-tuning the only policy); the root keeps the embeddings, the
final norm and the head. QLoRA's quantisation constants
(absmax and the double-quant state, numel / 64 + numel / 16384 x 4 bytes per weight) stay on
the GPU from loading, outside the flat parameters. ``torch.cuda.memory_reserved`` after the
wrap is what fsdp_qlora logs as ``reserved_after_model_wrap``.
"""

from __future__ import annotations

from dataclasses import dataclass

from simulator.job.modules import NF4_BLOCK, NF4_NESTED_BLOCK, ParamTensor
from simulator.job.workload import Job
from simulator.memory.caching_allocator import CachingAllocator

BROADCAST_BUCKET = 250 * (1 << 20)  # _init_utils.py PARAM_BROADCAST_BUCKET_SIZE
BROADCASTS_IN_FLIGHT = 2  # comm.cpp broadcast_coalesced: max_in_flight
# the replay makes a few allocations per parameter tensor and per layer: past this many tensors
# (Llama 3.1 405B with LoRA on every linear layer has about 2,900) it is not replayed, so no
# model file can make it take more than a few seconds (the reserved figure is then the median)
MAX_TENSORS = 20_000


@dataclass(frozen=True)
class WrapMemory:
    """Rank 0's allocator right after ``FSDP(model, ...)`` returns."""

    reserved: int  # torch.cuda.memory_reserved
    allocated: int  # torch.cuda.memory_allocated

    @property
    def cached(self) -> int:
        return self.reserved - self.allocated


def units(job: Job) -> list[list[ParamTensor]]:
    """fsdp_qlora's FSDP units in the order the auto-wrap builds them."""
    layers = job.arch.layers if job.arch is not None else job.n_blocks
    out = []
    for block in range(layers):
        params = [job.params[i] for i in job.block_params(block)]
        if job.finetune != "full":  # the lambda policy: each trainable leaf layer on its own
            out += [[p] for p in params if p.trainable]
            params = [p for p in params if not p.trainable]
        out.append(params)
    out.append([p for p in job.params if not 0 <= p.block < layers])
    return [u for u in out if u]


def tensor_bytes(p: ParamTensor, dtype_bytes: int) -> int:
    """A parameter's bytes on the GPU: 4-bit NF4 packed two to a byte, else its dtype."""
    return p.numel // 2 if p.quantized else p.numel * dtype_bytes


def _buckets(sizes: list[int]) -> list[int]:
    out, current = [], 0
    for size in sizes:
        current += size
        if current >= BROADCAST_BUCKET:
            out.append(current)
            current = 0
    return out + ([current] if current else [])


def build(alloc: CachingAllocator, job: Job, ranks: int, *, sharded: bool,
          offload: bool) -> None:
    """The wrap's allocations and frees on rank 0's allocator."""
    e = job.activation_bytes  # fsdp_qlora casts the model to the compute dtype first
    for p in job.params:
        if p.quantized:  # quant_state.absmax (uint8) and its own fp32 absmax
            alloc.malloc(p.numel // NF4_BLOCK)
            alloc.malloc(p.numel // (NF4_BLOCK * NF4_NESTED_BLOCK) * 4)
    broadcast: list[int] = []  # buffers the NCCL stream may still be reading
    for unit in units(job):
        sizes = [tensor_bytes(p, e) for p in unit]
        originals = [alloc.malloc(s) for s in sizes]
        for handle in broadcast:  # the last unit's broadcast is done by now
            alloc.free(handle)
        broadcast = []
        in_flight: list[int] = []
        for bucket in _buckets(sizes):
            in_flight.append(alloc.malloc(bucket))
            if len(in_flight) > BROADCASTS_IN_FLIGHT:
                broadcast.append(in_flight.pop(0))
        broadcast += in_flight
        flat = alloc.malloc(sum(sizes))
        for handle in originals:
            alloc.free(handle)
        if sharded and ranks > 1:
            shard = alloc.malloc(-(-sum(sizes) // ranks))
            alloc.free(flat)
            flat = shard
        if offload:
            alloc.free(flat)
    for handle in broadcast:
        alloc.free(handle)
