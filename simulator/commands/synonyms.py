"""Framework option names, and the `stepsim` flag that means the same (the "did you mean" of
a flag stepsim does not have).

People come with the names of the tools they run: PyTorch DDP's ``bucket_cap_mb``, torchrun's
``--nproc-per-node``, Megatron's ``--tensor-model-parallel-size``, Hugging Face's
``per_device_train_batch_size``, DeepSpeed's keys. A spelling match would point them at an
unrelated flag (``--nproc-per-node`` is close to ``--price-per-gpu-hour``); this table points
them at the flag with the same meaning. Names are compared without case, dashes or
underscores.
"""

from __future__ import annotations

# another program's name -> (stepsim's flag, whose name it is)
FLAGS: dict[str, tuple[str, str]] = {
    "bucket_cap_mb": ("--bucket-mb", "PyTorch DDP"),
    "reduce_bucket_size": ("--bucket-mb", "DeepSpeed (bytes there; MiB here)"),
    "nproc_per_node": ("--gpus", "torchrun"),
    "num_gpus": ("--gpus", "the deepspeed launcher"),
    "world_size": ("--gpus", "torch.distributed"),
    "tensor_model_parallel_size": ("--tp", "Megatron"),
    "tensor_parallel_size": ("--tp", "vLLM and others"),
    "tp_size": ("--tp", "DeepSpeed and others"),
    "pipeline_model_parallel_size": ("--pp", "Megatron"),
    "pipeline_parallel_size": ("--pp", "others"),
    "num_virtual_stages": ("--virtual-stages", "others"),
    "virtual_pipeline_model_parallel_size": ("--virtual-stages", "Megatron"),
    "num_layers_per_virtual_pipeline_stage": ("--virtual-stages", "Megatron"),
    "micro_batch_size": ("--micro-batch", "Megatron"),
    "per_device_train_batch_size": ("--micro-batch", "Hugging Face TrainingArguments"),
    "train_micro_batch_size_per_gpu": ("--micro-batch", "DeepSpeed"),
    "batch_size": ("--micro-batch", "torchtune"),
    "gradient_accumulation_steps": ("--grad-accum", "Hugging Face, DeepSpeed and torchtune"),
    "gradient_checkpointing": ("--checkpointing full", "Hugging Face TrainingArguments"),
    "enable_activation_checkpointing": ("--checkpointing full", "torchtune"),
    "recompute_granularity": ("--checkpointing", "Megatron"),
    "recompute_activations": ("--checkpointing selective", "Megatron"),
    "activation_checkpointing": ("--checkpointing", "llm-foundry and torchtitan"),
    "seq_length": ("--seq-len", "Megatron"),
    "max_seq_length": ("--seq-len", "TRL"),
    "max_seq_len": ("--seq-len", "torchtune"),
    "model_max_length": ("--seq-len", "Hugging Face tokenizers"),
    "zero_stage": ("-s zero1|zero2|zero3", "DeepSpeed"),
    "zero_optimization": ("-s zero1|zero2|zero3 (or --deepspeed ds_config.json)", "DeepSpeed"),
    "fsdp": ("-s fsdp", "Hugging Face TrainingArguments"),
    "torch_compile": ("--kernels compiled", "Hugging Face TrainingArguments"),
    "compile": ("--kernels compiled", "torchtune and torchtitan"),
    "bf16": ("--precision", "Hugging Face TrainingArguments"),
    "fp16": ("--precision", "Hugging Face TrainingArguments"),
    "mixed_precision": ("--precision", "Accelerate"),
    "dtype": ("--precision", "torchtune"),
    "optim": ("--optimizer", "Hugging Face TrainingArguments"),
    "offload_optimizer": ("--offload optimizer", "DeepSpeed"),
    "offload_param": ("--offload params", "DeepSpeed"),
    "cpu_offload": ("--offload params", "PyTorch FSDP"),
    "fsdp_cpu_offload": ("--offload params", "torchtune"),
    "lora_r": ("--peft adapter_config.json", "PEFT"),
    "lora_rank": ("--peft adapter_config.json", "torchtune"),
    "target_modules": ("--peft adapter_config.json", "PEFT"),
    "ddp_bucket_cap_mb": ("--bucket-mb", "Hugging Face TrainingArguments"),
    "use_distributed_optimizer": ("-s zero1", "Megatron"),
}


def _plain(flag: str) -> str:
    return "".join(c for c in flag.lower() if c.isalnum())


def meaning(flag: str) -> tuple[str, str, str] | None:
    """(the name as the table spells it, stepsim's flag, whose name it is) for another
    program's option name, or None."""
    given = _plain(flag.split("=", 1)[0])
    for name, (ours, whose) in FLAGS.items():
        if _plain(name) == given:
            return name, ours, whose
    return None
