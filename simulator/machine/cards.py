"""The card at each GPU node: a catalog name, or a catalog entry with the topology's overrides."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from simulator.catalog.gpus import GPU, GiB
from simulator.catalog.gpus import gpu as catalog_gpu
from simulator.units import GB

if TYPE_CHECKING:
    from simulator.inputs.schema import GpuSpec, NodeConfig

_T = 1e12


def resolve_gpu(spec: GpuSpec | str) -> GPU:
    """The GPU a topology's ``gpu`` key names: a catalog name, or a mapping that starts from a
    catalog entry (``base``) and overrides some of its numbers. ``bf16_tflops`` alone scales
    the achieved GEMM rate with the spec (the base card's achieved/spec share is kept);
    ``matmul_tflops`` sets the achieved rate itself."""
    if isinstance(spec, str):
        return catalog_gpu(spec)
    base = catalog_gpu(spec.base)
    changes: dict[str, object] = {}
    if spec.memory_gib is not None:
        changes["memory_bytes"] = int(spec.memory_gib * GiB)
    if spec.memory_bandwidth_gb_per_s is not None:
        changes["memory_bandwidth"] = spec.memory_bandwidth_gb_per_s * GB
    if spec.power_limit_w is not None:
        changes["power_limit_w"] = float(spec.power_limit_w)
    if spec.sms is not None:
        changes["sms"] = spec.sms
    if spec.bf16_tflops is not None:
        changes["matmul_flops"] = spec.bf16_tflops * _T
        scale = spec.bf16_tflops * _T / base.matmul_flops
        for key in ("plain_matmul_flops", "measured_matmul_flops"):
            if getattr(base, key) is not None:
                changes[key] = getattr(base, key) * scale
    if spec.matmul_tflops is not None:
        changes["plain_matmul_flops"] = spec.matmul_tflops * _T
        changes["own_matmul"] = True
    if not changes:
        return base
    return replace(base, name=str(spec), source=f"{base.source}; overridden by the topology",
                   **changes)  # type: ignore[arg-type]


def node_gpu(node: NodeConfig, default: GPU) -> GPU:
    """The card at a GPU node: its own `gpu` where given, else the machine's."""
    return resolve_gpu(node.gpu) if node.gpu else default
