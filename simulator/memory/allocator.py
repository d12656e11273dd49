"""What PyTorch's caching allocator reserves beyond the live tensors (the ``cache`` pool).

The allocator (c10/cuda/CUDACachingAllocator.cpp) never hands memory back to the driver during
training: a freed block stays in its pool until a later request fits it (best fit over the
free blocks of the same stream and size class, ``get_free_block``), so
``torch.cuda.max_memory_reserved`` is the live tensors plus the blocks that are free but cached.
Two parts are modelled:

- the idle 16-bit logits: an fp32 cross-entropy upcasts the LM head's 16-bit logits
  (transformers 4.38 models/llama/modeling_llama.py LlamaForCausalLM.forward
  ``logits = logits.float()``; transformers >= 4.46 loss/loss_utils.py ForCausalLMLoss;
  torchtitan ``pred.float()`` then ``del pred``) and drops the 16-bit tensor. Every large
  request from then until the cast back in backward (the fp32 copy, log_softmax's output,
  nll_loss's zero-filled gradient, log_softmax_backward's output) is twice its size, so best
  fit cannot place one in it: the block sits in the cache through the loss's backward, the
  step's allocated peak, and only ToCopyBackward's 16-bit gradient reuses it. Not part of the
  verdict: before reporting out-of-memory the allocator frees such unsplit cached blocks and
  retries (``release_cached_blocks`` in ``malloc``), so the card never has to hold them.
- the rest of rounding and fragmentation (2 MiB rounding of large blocks, 20 MiB segments for
  1-10 MiB requests, split blocks no request fits), assumed a fixed share of the tensors.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from simulator.job.workload import Job
from simulator.memory.report import MOMENTS, Line, alive

if TYPE_CHECKING:
    from simulator.memory.activations import StageShare

# Caching-allocator rounding and fragmentation: assumed 5% of the tensors' bytes (not calibrated;
# PyTorch OOM reports show 2-3% reserved-but-unallocated on large jobs, e.g.
# vllm-project/compressed-tensors#587: 1.83 GiB of 78 GiB; far more without expandable_segments
# on varying shapes, meta-pytorch/torchtune#1185).
FRAGMENTATION = 0.05


def idle_logit_bytes(job: Job) -> float:
    """Bytes per logit of the LM head's 16-bit output left idle in the cache while the loss's
    backward runs: its dtype's size under an eager, unchunked fp32 cross-entropy that drops it
    after the upcast, else 0 (a loop that keeps the 16-bit output keeps the block allocated)."""
    a, e, recipe = job.arch, job.activation_bytes, job.recipe
    if (a is None or a.encoder or recipe.cross_entropy != "fp32" or recipe.loss_compiled
            or e >= 4 or job.output_logit_bytes == e):
        return 0.0
    return float(e)


def cache_lines(lines: list[Line], job: Job, b: int, tp: int,
                stage: StageShare | None = None) -> list[Line]:
    """The allocator's cached-but-free blocks at each moment of the step, beside ``lines``."""
    out = []
    heads = 1 if stage is None else stage.heads_in_flight
    idle = idle_logit_bytes(job)
    if idle and heads and job.arch is not None:
        logits = b * job.seq_len * job.arch.vocab / tp * heads
        out.append(Line("other", f"allocator: the LM head's {idle:g}-byte logits, freed by the "
                        "fp32 upcast and idle in the cache through the loss's backward",
                        idle * logits, "only:loss_backward", pool="idle"))
    for moment in MOMENTS:
        tensors = sum(x.bytes for x in lines if alive(x, moment))
        out.append(Line("other", f"allocator rounding and fragmentation ({FRAGMENTATION:.0%} "
                        "of tensor bytes, assumed)", FRAGMENTATION * tensors, f"only:{moment}",
                        pool="cache"))
    return out
