"""The nn.Modules that own parameters and the tensors each registers: what the model, the
memory model and the strategies count, whatever the family (parameters.py lays them out)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

ModuleKind = Literal["linear", "conv1d", "norm", "embedding", "generic"]
PEFT_PREFIX = "base_model.model."
# QLoRA's NF4 storage (bitsandbytes Linear4bit; Dettmers et al. 2023, arXiv:2305.14314, section
# 3 "Double Quant"): 4 bits per weight, an 8-bit absmax per block of 64 weights and an fp32
# absmax per 256 of those blocks: 8/64 + 32/(64*256) = 0.127 bits per parameter beside the 4
NF4_BLOCK, NF4_NESTED_BLOCK = 64, 256
NF4_BITS_PER_PARAM = 4 + 8 / NF4_BLOCK + 32 / (NF4_BLOCK * NF4_NESTED_BLOCK)


@dataclass(frozen=True)
class ParamTensor:
    """One registered parameter tensor. Sizes are element counts (dtype comes from training)."""

    name: str  # as model.named_parameters() prints it
    shape: tuple[int, ...]
    trainable: bool
    block: int  # -1 embeddings, 0..L-1 transformer blocks, L final norm / head
    quantized: bool = False  # QLoRA: stored as 4-bit NF4 (bitsandbytes Linear4bit)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class Module:
    """An nn.Module that owns parameters: a linear layer, a norm, an embedding, a generic layer."""

    path: str  # e.g. "model.layers.0.self_attn.q_proj"
    kind: ModuleKind
    in_features: int  # embedding: vocabulary size; norm: width
    out_features: int
    bias: bool
    block: int
    lora: bool = False
    sizes: tuple[int, ...] = ()  # generic layers: each parameter tensor's elements, if given

    @property
    def leaf(self) -> str:
        return self.path.rsplit(".", 1)[-1]
