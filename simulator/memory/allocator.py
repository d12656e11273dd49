"""What PyTorch's caching allocator reserves beyond the live tensors (the ``cache`` and
``idle`` pools of report.py).

The allocator (c10/cuda/CUDACachingAllocator.cpp) never hands memory back to the driver during
training: a freed block stays in its pool until a later request fits it (best fit over the
free blocks of the same stream and size class, ``get_free_block``), so
``torch.cuda.max_memory_reserved`` is the live tensors plus the blocks that are free but cached.
Three parts are modelled:

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
  1-10 MiB requests, split blocks no request fits), assumed a fixed share of the tensors that
  the card must hold (the verdict's); and
- what else a training step leaves cached: the published peaks below put max_memory_reserved a
  median 23% above max_memory_allocated with PyTorch's default allocator (interquartile
  12-36%) and 12% with ``expandable_segments`` (the recipe's; job/recipe.py); the counters
  carry the part the two items above do not explain, as idle (the allocator frees it before
  it reports out-of-memory, which is also why the share falls as a card fills: report.py caps
  what is reserved at what the card has).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from simulator.catalog.gpus import median
from simulator.job.workload import Job
from simulator.memory.report import MOMENTS, Line, alive

if TYPE_CHECKING:
    from simulator.memory.activations import StageShare

# Caching-allocator rounding and fragmentation: assumed 5% of the tensors' bytes (not calibrated;
# PyTorch OOM reports show 2-3% reserved-but-unallocated on large jobs, e.g.
# vllm-project/compressed-tensors#587: 1.83 GiB of 78 GiB; far more without expandable_segments
# on varying shapes, meta-pytorch/torchtune#1185).
FRAGMENTATION = 0.05

# Published training peaks, (peak allocated or active, peak reserved), in each source's unit
# (the ratio is what counts). fsdp_qlora's own pairs are left out: they check this
# (validation/frameworks.yaml). Default allocator:
DEFAULT_PAIRS = (
    (15006, 16726), (17402, 19354),  # pytorch/pytorch#40989, MB
    # huggingface/peft#1469: bert-base and ESM fine-tunes on one GPU (full, head, LoRA), GB
    (12.56, 12.939), (1.0308, 1.6973), (8.2309, 8.6074), (10.006, 10.443), (2.5259, 3.0078),
    (0.30024, 0.5293), (1.7746, 1.9824), (2.1725, 2.4082), (5.1249, 5.6836),
    # meta-llama/llama-cookbook#41: Llama-2 7B LoRA, FSDP1, 4x A100 40GB (active, GB)
    (25.86, 32.67), (20.2, 27.36), (15.22, 19.36),
    (14.93, 19.52),  # meta-llama/llama-cookbook#165: LLaMA 7B, per-parameter FSDP (active)
    # pytorch/torchtitan#165: 8x H100, FSDP1 / FSDP2 with full or selective checkpointing (% of
    # 95.04 GiB, active / reserved)
    (24.81, 33.82), (52.98, 67.23), (23.92, 32.64), (52.13, 62.51),
    (15.098, 17.354),  # ecmwf/WeatherGenerator#2628, GiB
    (77, 93),  # meta-pytorch/torchrec#4584 baseline, GiB
    # gpjt/fine-tune-2024-04 (HF Trainer + DeepSpeed, fixed-length batches; active, MiB):
    # Qwen1.5-0.5B ZeRO-3 at seq 1021 and 2041, and 2048 with checkpointing at batch 3;
    # Llama-3-8B ZeRO-3 on 8 GPUs at seq 2041, with checkpointing at batch 1 and 12, ZeRO-2
    # with CPU Adam at seq 1001
    (11195, 15904), (14220, 19442), (19288, 21918), (48853, 61508), (26523, 37521),
    (64646, 77607), (20890, 26442))
# ...and the same gpjt runs with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
EXPANDABLE_PAIRS = ((11179, 13252), (14212, 16698), (19281, 20804), (49029, 54972),
                    (26520, 34680), (69632, 78332), (20880, 21184))


def _quartiles(values: list[float]) -> tuple[float, float]:
    """The medians of the lower and the upper half (Tukey's hinges)."""
    ordered = sorted(values)
    half = (len(ordered) + 1) // 2
    return median(ordered[:half]), median(ordered[-half:])


_SHARES = {expandable: [r / a - 1 for a, r in pairs]
           for expandable, pairs in ((False, DEFAULT_PAIRS), (True, EXPANDABLE_PAIRS))}
# reserved beyond allocated at a training peak, as a share of allocated: the pairs' median, and
# the middle half of them (the range the reserved counter carries)
OVERHEAD = {expandable: median(shares) for expandable, shares in _SHARES.items()}
OVERHEAD_MIDDLE_HALF = {expandable: _quartiles(shares) for expandable, shares in _SHARES.items()}


def overhead(expandable: bool) -> float:
    """The share of allocated a training peak reserves beyond it (OVERHEAD)."""
    return OVERHEAD[expandable]


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
                stage: StageShare | None = None, share: float | None = None,
                replayed: dict[str, int] | None = None) -> list[Line]:
    """The allocator's cached-but-free blocks at each moment of the step, beside ``lines``;
    ``share``: what the step reserves beyond its tensors (default: the published median);
    ``replayed``: the reserved figure at each moment from a replay (step_replay.py), which
    then stands for the median."""
    out = []
    heads = 1 if stage is None else stage.heads_in_flight
    idle = idle_logit_bytes(job) if replayed is None else 0.0  # a replay has its own logits
    if idle and heads and job.arch is not None:
        logits = b * job.seq_len * job.arch.vocab / tp * heads
        out.append(Line("other", f"allocator: the LM head's {idle:g}-byte logits, freed by the "
                        "fp32 upcast and idle in the cache through the loss's backward",
                        idle * logits, "only:loss_backward", pool="idle"))
    share = overhead(job.recipe.expandable_segments) if share is None else share
    mode = "expandable segments" if job.recipe.expandable_segments else "default allocator"
    for moment in MOMENTS:
        tensors = sum(x.bytes for x in lines if alive(x, moment))
        out.append(Line("other", f"allocator rounding and fragmentation ({FRAGMENTATION:.0%} "
                        "of tensor bytes, assumed)", FRAGMENTATION * tensors, f"only:{moment}",
                        pool="cache"))
        explained = FRAGMENTATION * tensors + sum(x.bytes for x in out if x.pool == "idle"
                                                  and alive(x, moment))
        if replayed is not None:
            if replayed[moment] > tensors + explained:
                out.append(Line("other", "allocator: blocks cached, replayed over the FSDP "
                                "wrap and three steps (memory/step_replay.py)",
                                replayed[moment] - tensors - explained, f"only:{moment}",
                                pool="idle"))
            continue
        if share * tensors > explained:
            out.append(Line("other", f"allocator: blocks cached beyond the tensors (published "
                            f"training peaks, {mode}: reserved {share:.0%} above allocated)",
                            share * tensors - explained, f"only:{moment}", pool="idle"))
    return out
