"""What padded batches cost advise's pick, and the attention implementation that avoids it.

With padded batches (``training.padded``) transformers hands ``scaled_dot_product_attention``
the mask as a tensor, so ``sdpa`` runs its memory-efficient kernel over every query-key pair
(catalog/software.py), as transformers 4.38 and 4.39 do for Llama whatever the batches.
flash-attn 2 (``attn_implementation="flash_attention_2"``) takes no mask tensor: it unpads the
batch and runs FlashAttention-2 over the real tokens' causal pairs. The pick is simulated again
with it: the user's choice of implementation, not a strategy's, so it is said beside the pick
rather than ranked.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from simulator import api
from simulator.advice import spec_text
from simulator.catalog import software
from simulator.catalog.gpus import GPUS


def flash_instead(best: dict[str, Any]) -> list[str]:
    """A line for the pick when padding sends its attention to sdpa's memory-efficient kernel:
    its throughput under flash-attn 2 instead; none otherwise (a GPU below sm80 runs that
    kernel whatever the batches, and no flash-attn 2)."""
    attention = (best.get("software") or {}).get("attention") or {}
    if attention.get("kernel") != "mem_efficient":
        return []
    gpu = GPUS.get(best.get("gpu", ""))
    if gpu is not None and software.attention_gpu_problem("flash2", gpu.compute_capability,
                                                          gpu.name):
        return []
    spec = replace(spec_text.spec_of(best["options"]), attention="flash2")
    flash = api.simulate(spec, baseline=False, ranges=False).report
    gain = flash["tokens_per_s"] / best["tokens_per_s"] - 1
    cause, cure = ((attention["why"], "takes no mask") if "why" in attention
                   else ("padded batches", "unpads them"))
    return [f"{cause}: sdpa runs its memory-efficient kernel over every query-key pair; "
            f"flash-attn 2 (attn_implementation=\"flash_attention_2\", --attention flash2) "
            f"{cure}: {flash['tokens_per_s']:,.0f} tokens/s ({gain:+.0%}) with the same "
            "recipe"]
