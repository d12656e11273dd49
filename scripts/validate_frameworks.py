"""validate.py's `frameworks` section: training runs as the frameworks publish them.

Every training point of validation/frameworks.yaml is simulated on the machine, workload and
recipe flags listed in RUNS (the workloads and the Grand Teton machine live in
validation/workloads and validation/topologies). Throughput is compared per GPU; memory as the
framework printed it (``memory``: torchtune's "peak memory active" is the allocator's
allocated peak, torchtitan's figure its reserved peak). None of these points fixed a constant
of the model: the kernel lists come from the frameworks' code, the rates from the GEMM points
and the papers the compute module cites; every row is a check.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
WORKLOADS = ROOT / "validation" / "workloads"
TOPOLOGIES = ROOT / "validation" / "topologies"


def _w(name: str) -> str:
    return str(WORKLOADS / f"{name}.yaml")


_TUNE_3B = {"topology": "8xa100-nvswitch", "gpus": 1, "workload": _w("torchtune-llama3.2-3b"),
            "strategy": "ddp", "memory": "allocated"}
# each run's software stack is its point's ``software`` in validation/frameworks.yaml
_FOUNDRY_H100 = {"topology": "8xh100-nvswitch", "strategy": "fsdp"}
_FOUNDRY_A100 = {"topology": "8xa100-nvswitch", "strategy": "fsdp"}

# LLaMA-Factory on IST-DASLab/llmq's 4 x 4090 box (no P2P); its one-GPU runs on one of them
_LLMQ = {"topology": str(TOPOLOGIES / "4x4090-llmq.yaml"), "strategy": "ddp"}

# point id -> how it is simulated: RunSpec fields, and which memory counter it printed
RUNS: dict[str, dict[str, Any]] = {
    "torchtune-a100-llama3.2-3b-packed-eager": _TUNE_3B,
    "torchtune-a100-llama3.2-3b-packed-compile": {**_TUNE_3B, "kernels": "compiled"},
    "torchtune-4090-llama3.1-8b-full": {"topology": "1x4090",
                                        "workload": _w("torchtune-llama3.1-8b-4090"),
                                        "strategy": "ddp", "memory": "allocated"},
    "torchtitan-h100-llama3.1-8b-compile": {
        "topology": str(TOPOLOGIES / "8xh100-96gb-500w.yaml"),
        "workload": _w("torchtitan-llama3.1-8b"), "strategy": "fsdp", "kernels": "compiled",
        "memory": "reserved"},
    "llmfoundry-h100-mpt-3b-s4096": {**_FOUNDRY_H100, "workload": _w("mpt-3b"),
                                     "seq_len": 4096, "micro_batch": 5, "grad_accum": 6},
    "llmfoundry-h100-mpt-1b-s2048": {**_FOUNDRY_H100, "workload": _w("mpt-1b"),
                                     "micro_batch": 14, "grad_accum": 1},
    "llmfoundry-a100-mpt-3b-s2048": {**_FOUNDRY_A100, "workload": _w("mpt-3b"),
                                     "micro_batch": 10, "grad_accum": 2},
    "llmfoundry-a100-mpt-760m-s2048": {**_FOUNDRY_A100, "workload": _w("mpt-760m"),
                                       "micro_batch": 24, "grad_accum": 2},
    "llmfoundry-a100-mpt-125m-s2048": {**_FOUNDRY_A100, "workload": _w("mpt-125m"),
                                       "micro_batch": 40, "grad_accum": 2},
    "flashattn-a100-gpt3-125m": {"topology": "8xa100-nvswitch", "workload": _w("gpt3-125m-flash"),
                                 "strategy": "zero1"},
    "lambda-1x4090-bert-large": {"topology": "1x4090", "workload": "bert-large-squad",
                                 "strategy": "ddp", "micro_batch": 28},
    "torchtune-4090-llama3.1-8b-qlora": {"topology": "1x4090",
                                         "workload": _w("torchtune-llama3.1-8b-qlora-4090"),
                                         "strategy": "ddp", "memory": "allocated"},
    "llmq-1x4090-qwen2.5-0.5b": {**_LLMQ, "gpus": 1, "workload": _w("llamafactory-qwen2.5-0.5b")},
    "llmq-1x4090-qwen2.5-1.5b": {**_LLMQ, "gpus": 1, "workload": _w("llamafactory-qwen2.5-1.5b")},
    "llmq-4x4090-qwen2.5-0.5b": {**_LLMQ, "workload": _w("llamafactory-qwen2.5-0.5b"),
                                 "micro_batch": 128, "grad_accum": 1},
    "llmq-4x4090-qwen2.5-1.5b": {**_LLMQ, "workload": _w("llamafactory-qwen2.5-1.5b"),
                                 "micro_batch": 32, "grad_accum": 4},
    "llmfoundry-h100-mpt-7b-s2048": {**_FOUNDRY_H100, "workload": _w("mpt-7b"),
                                     "micro_batch": 6, "grad_accum": 1},
    "mli-3090ti-gpt2-medium-hf": {"topology": "2x3090ti-nvlink", "gpus": 1,
                                  "workload": "gpt2-medium", "strategy": "ddp",
                                  "framework": "hf", "micro_batch": 2, "grad_accum": 4},
    **{f"answerdotai-2x3090-llama2-7b-lora-c{s}{suffix}": {
        "topology": str(TOPOLOGIES / "2x3090-pcie.yaml"), "workload": _w("fsdp-lora-llama2-7b"),
        "strategy": "fsdp", "micro_batch": 1, "seq_len": s, "memory": counter}
       for s in (2048, 512) for suffix, counter in (("", "allocated"), ("-reserved", "reserved"))},
    # the case study's other reserved peaks (memory only: the 3090 pair stands in, as above)
    **{f"answerdotai-2x3090-{model}-{finetune}{ddp}-{shape}-reserved": {
        "topology": str(TOPOLOGIES / "2x3090-pcie.yaml"),
        "workload": _w(f"fsdp-{finetune.removesuffix('-offload')}-{model}"),
        "strategy": "ddp" if ddp else "fsdp", "micro_batch": batch, "seq_len": seq,
        "memory": "reserved", **({"offload": "params"} if "offload" in finetune else {})}
       for model, finetune, ddp, shape, batch, seq in (
           ("llama2-7b", "qlora", "", "c512", 1, 512), ("llama2-7b", "qlora", "", "c2048", 1, 2048),
           ("llama2-7b", "qlora", "", "b4", 4, 2048), ("llama2-7b", "lora", "", "b4", 4, 2048),
           ("llama2-7b", "qlora", "-ddp", "b8", 8, 2048),
           ("llama2-7b", "lora", "-ddp", "b4", 4, 2048),
           ("yi-34b", "qlora", "", "b2", 2, 2048), ("yi-34b", "qlora-offload", "", "b4", 4, 2048))},
    "answerdotai-2x3090-llama2-7b-qlora-wrap": {
        "topology": str(TOPOLOGIES / "2x3090-pcie.yaml"), "workload": _w("fsdp-qlora-llama2-7b"),
        "strategy": "fsdp", "micro_batch": 1, "seq_len": 512},
    # the case study's 70B QLoRA on cloud machines, an effective batch of 32 (no offload)
    **{f"answerdotai-{gpus}x{card}-llama2-70b-qlora": {
        "topology": topology, "gpus": gpus, "workload": _w("fsdp-qlora-llama2-70b"),
        "strategy": "fsdp", "micro_batch": batch, "grad_accum": 32 // (gpus * batch)}
       for card, topology, gpus, batch in (
           ("a100-40gb", str(TOPOLOGIES / "8xa100-40gb-nvswitch.yaml"), 2, 1),
           ("a100-40gb", str(TOPOLOGIES / "8xa100-40gb-nvswitch.yaml"), 4, 4),
           ("a100-40gb", str(TOPOLOGIES / "8xa100-40gb-nvswitch.yaml"), 8, 4),
           ("h100", "8xh100-nvswitch", 4, 8))},
    # Hugging Face Trainer + DeepSpeed ZeRO-3 as gpjt's ds_config.json leaves it (DeepSpeed's
    # default buckets), padded batches with their mask
    **{f"gpjt-8xa100-llama3-8b-zero3-b{b}": {
        "topology": "8xa100-nvswitch", "workload": "llama3-8b", "strategy": "zero3",
        "precision": "fp16", "seq_len": 2048, "micro_batch": b, "checkpointing": "full",
        "reduce_bucket_size": 500_000_000, "prefetch_bucket_size": 50_000_000, "padded": True}
       for b in (1, 2, 4, 8, 12)},
    # 64 GPUs over 8 nodes in the source: eight GPUs of one node stand in for them
    "torchtitan-a100-llama3-8b-64gpu": {"topology": "8xa100-nvswitch",
                                        "workload": _w("torchtitan-llama3.1-8b"),
                                        "strategy": "fsdp", "micro_batch": 1, "proxy": True},
}
_SPEC_KEYS = ("gpus", "micro_batch", "grad_accum", "seq_len", "kernels", "cross_entropy",
              "precision", "optimizer", "checkpointing", "framework", "attention", "offload",
              "padded", "reduce_bucket_size", "prefetch_bucket_size")


def software_flag(point: dict[str, Any]) -> str | None:
    """A point's ``software`` (a year, or {torch, cuda, transformers, source}) as --software
    gives it."""
    stack = point.get("software")
    if stack is None or isinstance(stack, int):
        return None if stack is None else str(stack)
    return ",".join(f"{k}={stack[k]}" for k in ("torch", "cuda", "transformers") if k in stack)


def memory_row(row_type: Any, point: dict[str, Any], counter: str, gpus: int,
               memory: dict[str, Any], topology: str) -> Any:
    """A published memory peak beside the counter it was read from (``allocated`` or
    ``reserved``), with the reserved counter's range (simulator/memory/allocator.py)."""
    from simulator.units import GiB

    spread = memory.get(f"peak_{counter}_range_bytes")
    return row_type(point["id"], f"{counter} peak"[:13], gpus, None, "memory GiB",
                    point["peak_memory_gib"], memory[f"peak_{counter}_bytes"] / GiB, None,
                    topology, spread and (spread[0] / GiB, spread[1] / GiB))


def rows(data: dict[str, Any], row_type: Any, mechanism: Any) -> list[Any]:
    """One row per measured quantity of each run (throughput per GPU, memory, MFU);
    ``mechanism(gpu)`` tags a one-GPU throughput with the compute mechanism it measures."""
    import progress_bar

    from simulator.api import RunSpec, simulate
    from simulator.units import GiB

    out = []
    for point in data.get("frameworks", []):
        setup = RUNS.get(point["id"])
        if setup is None:
            continue
        spec = RunSpec(setup["topology"], setup["workload"], setup["strategy"],
                       software=software_flag(point),
                       **{k: setup[k] for k in _SPEC_KEYS if k in setup})
        result = simulate(spec, baseline=False)
        r = result.report
        gpus, label = r["gpus"], ("8-GPU proxy" if setup.get("proxy") else r["recipe"]["kernels"])
        tag = mechanism(r["gpu"]) if gpus == 1 else None
        if "tokens_per_s" in point:
            out.append(row_type(point["id"], label, gpus, None, "tok/s/GPU", point["tokens_per_s"],
                                r["tokens_per_s_per_gpu"], tag, r["topology"]))
        if "tqdm_s_per_it" in point:  # the machine's tokens over the second step
            out.append(row_type(point["id"], label, gpus, None, "tok/s/GPU",
                                progress_bar.tokens_per_s(point) / gpus,
                                r["tokens_per_s_per_gpu"], tag, r["topology"]))
        if "samples_per_s" in point:
            out.append(row_type(point["id"], label, gpus, None, "samples/s",
                                point["samples_per_s"], r["samples_per_s"], tag, r["topology"]))
        if "peak_memory_gib" in point:
            out.append(memory_row(row_type, point, setup.get("memory", "reserved"), gpus,
                                  result.memory, r["topology"]))
        if "setup_reserved_gib" in point:  # the set-up's allocator, replayed (fsdp_wrap.py)
            out.append(row_type(point["id"], "after wrap", gpus, None, "memory GiB",
                                point["setup_reserved_gib"],
                                result.memory["setup_reserved_bytes"] / GiB, None,
                                r["topology"]))
        if "mfu" in point:
            out.append(row_type(point["id"], label, gpus, None, "MFU", point["mfu"], r["mfu"],
                                None, r["topology"]))
    return out
