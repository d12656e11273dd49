"""What bf16 costs advise's pick on a card without bf16 tensor cores, and fp16 instead.

Below sm80 (V100, T4, RTX 20xx) a bf16 job's matmuls are emulated on the CUDA cores, at a
seventh to a tenth of the fp16 tensor rate (catalog/gpus.py half_dtype_share); fp16 under
autocast with a GradScaler (``--precision fp16``, Hugging Face ``TrainingArguments(fp16=True)``)
runs them on the tensor cores. The pick is simulated again in fp16: a choice of number format,
not of strategy, so it is said beside the pick rather than ranked.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from simulator import api
from simulator.advice import spec_text


def fp16_instead(best: dict[str, Any]) -> list[str]:
    """A line for a bf16 pick on a card without bf16 tensor cores: its throughput in fp16;
    none otherwise, or where fp16 would not fit."""
    if not ((best.get("software") or {}).get("gemm") or {}).get("bf16_on_cuda_cores"):
        return []
    spec = replace(spec_text.spec_of(best["options"]), precision="fp16")
    fp16 = api.simulate(spec, baseline=False, ranges=False).report
    if not fp16.get("simulated", True):
        return []
    gain = fp16["tokens_per_s"] / best["tokens_per_s"] - 1
    return [f"bf16 on the {best['gpu']}: it has no bf16 tensor cores (before sm80), so bf16 "
            "matmuls are emulated on its CUDA cores; fp16 (--precision fp16: autocast to "
            "float16 with a GradScaler, TrainingArguments fp16=True) runs them on the tensor "
            "cores: "
            f"{fp16['tokens_per_s']:,.0f} tokens/s ({gain:+.0%}) with the same recipe"]
