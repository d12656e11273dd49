"""A DeepSpeed config (``ds_config.json``) as run settings: ``--deepspeed ds_config.json``.

What is inside: ``settings(path)`` returns the ``RunSpec`` fields (simulator/api/) the file
sets; the API applies each where the run leaves it at its default, so explicit command-line
flags win. ``"auto"`` (the Hugging Face Trainer's placeholder) and absent keys leave the
simulator's default.

From DeepSpeed (``deepspeed/runtime/zero/config.py`` DeepSpeedZeroConfig and
``offload_config.py``; ``runtime/config.py``; docs/_pages/config-json.md):
- ``zero_optimization.stage`` 0 (plain data parallelism with bucketed all-reduce) -> ddp,
  1 -> zero1, 2 -> zero2, 3 -> zero3.
- ``overlap_comm`` -> the ZeRO-1/2 reduction stream (stepsim's ZeRO-3 always overlaps, as
  DeepSpeed's default for stage 3 does).
- ``offload_optimizer.device: cpu`` -> offload optimizer; ``offload_param.device: cpu`` ->
  offload params (parameters and optimizer states, ZeRO-3); ``pin_memory`` of the offloaded
  part -> pin_memory. ``nvme`` is not modelled and refused.
- ``train_micro_batch_size_per_gpu`` -> micro_batch, ``gradient_accumulation_steps`` ->
  grad_accum; ``bf16.enabled`` / ``fp16.enabled`` true -> precision bf16 / fp16, both
  false -> fp32.
- ``reduce_bucket_size`` and ``allgather_bucket_size`` count elements (DeepSpeedZeroConfig:
  "Number of elements reduced/allreduced at a time") -> the ZeRO-1/2 gradient buckets and
  the chunks of the parameter all-gather after the step (strategies/zero.py). ZeRO-3's
  gathers follow stepsim's per-block units, so there they are reported, not applied.
Every other key DeepSpeed reads and the step does not feel (optimizer and scheduler
parameters, loss scaling, logging, checkpoint saving) is accepted silently; keys DeepSpeed
does not have are reported on stderr, one line each.
"""

from __future__ import annotations

from typing import Any

from simulator.errors import quoted
from simulator.inputs.file_warnings import show
from simulator.inputs.jsonfile import JsonDoc, Loc, read
from simulator.inputs.schema import MAX_BATCH

STRATEGY_OF_STAGE = {0: "ddp", 1: "zero1", 2: "zero2", 3: "zero3"}
DEFAULT_BUCKET_ELEMENTS = 500_000_000  # DeepSpeedZeroConfig reduce/allgather_bucket_size
DEFAULT_PREFETCH_ELEMENTS = 50_000_000  # DeepSpeedZeroConfig prefetch_bucket_size (stage3_)

_TOP = {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
        "gradient_clipping", "zero_optimization", "bf16", "bfloat16", "fp16", "amp",
        "optimizer", "scheduler", "zero_allow_untested_optimizer",
        "zero_force_ds_cpu_optimizer", "steps_per_print", "wall_clock_breakdown",
        "dump_state", "prescale_gradients", "gradient_predivide_factor", "sparse_gradients",
        "communication_data_type", "seq_parallel_communication_data_type",
        "activation_checkpointing", "flops_profiler", "tensorboard", "wandb", "csv_monitor",
        "comet", "comms_logger", "comms_config", "monitor_config", "aio", "elasticity",
        "pipeline", "checkpoint", "data_types", "data_efficiency", "compression_training",
        "autotuning", "memory_breakdown", "disable_allgather", "sparse_attention",
        "curriculum_learning", "progressive_layer_drop", "eigenvalue", "quantize_training",
        "train_batch_size_per_gpu", "gradient_accumulation_dtype", "torch_autocast",
        "use_data_before_expert_parallelism", "compile", "timers", "nebula", "weight_quantization",
        "hybrid_engine", "load_universal_checkpoint", "use_node_local_storage",
        "graph_harvesting", "dataloader_drop_last", "zero_optimization_stage"}
_ZERO = {"stage", "overlap_comm", "contiguous_gradients", "reduce_bucket_size",
         "allgather_bucket_size", "reduce_scatter", "allgather_partitions", "offload_optimizer",
         "offload_param", "sub_group_size", "stage3_prefetch_bucket_size",
         "stage3_param_persistence_threshold", "stage3_model_persistence_threshold",
         "stage3_max_live_parameters", "stage3_max_reuse_distance",
         "stage3_gather_16bit_weights_on_model_save",
         "stage3_gather_fp16_weights_on_model_save", "round_robin_gradients",
         "elastic_checkpoint", "load_from_fp32_weights", "ignore_unused_parameters",
         "legacy_stage1", "cpu_offload", "cpu_offload_params", "cpu_offload_use_pin_memory",
         "memory_efficient_linear", "zero_hpz_partition_size", "zero_quantized_weights",
         "zero_quantized_nontrainable_weights", "zero_quantized_gradients",
         "mics_shard_size", "mics_hierarchical_params_gather", "use_multi_rank_bucket_allreduce",
         "pipeline_loading_checkpoint", "override_module_apply", "log_trace_cache_warnings",
         "module_granularity_threshold", "use_all_reduce_for_fetch_params",
         "stage3_use_all_reduce_for_fetch_params", "offload_optimizer_config"}
_OFFLOAD = {"device", "pin_memory", "buffer_count", "buffer_size", "max_in_cpu", "nvme_path",
            "fast_init", "pipeline", "pipeline_read", "pipeline_write", "ratio"}
_PRECISION = {"enabled", "loss_scale", "loss_scale_window", "initial_scale_power",
              "hysteresis", "consecutive_hysteresis", "min_loss_scale", "auto_cast",
              "fp16_master_weights_and_grads", "immediate_grad_update", "check_grad_overflow",
              "bf16_master_weights_and_grads", "bf16_optimizer_states"}


def settings(path: str) -> dict[str, Any]:
    """The RunSpec fields ``path`` sets (field -> value); fields it leaves are absent. Its
    warnings (unknown keys) are printed (file_warnings.show)."""
    fields, warnings = read_settings(path)
    show(warnings)
    return fields


def read_settings(path: str) -> tuple[dict[str, Any], tuple[str, ...]]:
    """``settings`` and its warning lines, unprinted (a cached reader shows them at each use)."""
    doc = read(path, "a DeepSpeed config")
    doc.warn_unknown((), _TOP)
    zero: Loc = ("zero_optimization",)
    doc.warn_unknown(zero, _ZERO)
    out: dict[str, Any] = {}
    stage = doc.get((*zero, "stage"), (int,), auto=True)
    if stage is not None:
        if stage not in STRATEGY_OF_STAGE:
            raise doc.error((*zero, "stage"), f"ZeRO stage {stage}: expected 0, 1, 2 or 3")
        out["strategy"] = STRATEGY_OF_STAGE[stage]
    overlap = doc.get((*zero, "overlap_comm"), (bool,), auto=True)
    if overlap is not None and stage in (1, 2):
        out["zero_overlap_comm"] = overlap
    elif overlap is False and stage == 3:
        doc.warn((*zero, "overlap_comm"), "false under ZeRO-3 is not modelled: stepsim's "
                 "ZeRO-3 overlaps its collectives, as DeepSpeed's stage-3 default does")
    for key in ("reduce_bucket_size", "allgather_bucket_size"):
        size = doc.positive_int((*zero, key), auto=True)
        if stage == 3 and key == "reduce_bucket_size":  # ZeRO-3's gradient buckets
            if size is not None or doc.get((*zero, key), (int, float, str)) is None:
                # absent: DeepSpeed's default, not Hugging Face's "auto" (strategies/zero3.py)
                out[key] = size if size is not None else DEFAULT_BUCKET_ELEMENTS
            continue
        if size is None or size == DEFAULT_BUCKET_ELEMENTS:
            continue
        if stage in (1, 2):
            out[key] = size
        else:
            doc.warn((*zero, key), f"{size:,} elements: applied under ZeRO-1 and -2 only "
                     "(ZeRO-3 gathers per module)")
    if stage == 3:  # stage3_prefetch_bucket_size: "auto" is Hugging Face's 0.9 x hidden^2
        key = "stage3_prefetch_bucket_size"
        prefetch = doc.positive_int((*zero, key), auto=True)
        if prefetch is not None or doc.get((*zero, key), (int, float, str)) is None:
            out["prefetch_bucket_size"] = (prefetch if prefetch is not None
                                           else DEFAULT_PREFETCH_ELEMENTS)
    offload = _offload(doc, zero)
    if offload and stage == 0:  # offloading is ZeRO's: stage 0 is plain data parallelism
        part = "offload_param" if offload["offload"] == "params" else "offload_optimizer"
        raise doc.error((*zero, part), "offload needs ZeRO stage 1, 2 or 3; the file's stage "
                        "is 0 (plain data parallelism)")
    out.update(offload)
    for key, field in (("train_micro_batch_size_per_gpu", "micro_batch"),
                       ("gradient_accumulation_steps", "grad_accum")):
        value = doc.positive_int((key,), auto=True, at_most=MAX_BATCH)  # the schema's bound
        if value is not None:
            out[field] = value
    precision = _precision(doc)
    if precision is not None:
        out["precision"] = precision
    return out, tuple(doc.warned)


def _offload(doc: JsonDoc, zero: Loc) -> dict[str, Any]:
    """offload (optimizer | params) and pin_memory from the two offload sections."""
    devices: dict[str, str] = {}
    for part in ("offload_optimizer", "offload_param"):
        loc = (*zero, part)
        doc.warn_unknown(loc, _OFFLOAD)
        device = doc.get((*loc, "device"), (str,), "none", auto=True)
        if device == "nvme":
            raise doc.error((*loc, "device"), "NVMe offload is not modelled; cpu or none")
        if device not in ("cpu", "none"):
            raise doc.error((*loc, "device"), f"{quoted(device)}: expected cpu, nvme or none")
        devices[part] = device
    if devices["offload_param"] == "cpu":
        part, offload = "offload_param", "params"
        if devices["offload_optimizer"] != "cpu":
            doc.warn((*zero, "offload_param"), "stepsim's parameter offload moves the optimizer "
                     "states to the host too (as with offload_optimizer cpu)")
    elif devices["offload_optimizer"] == "cpu":
        part, offload = "offload_optimizer", "optimizer"
    else:
        return {}
    out: dict[str, Any] = {"offload": offload}
    pin = doc.get((*zero, part, "pin_memory"), (bool,), auto=True)
    if pin is not None:
        out["pin_memory"] = pin
    return out


def _precision(doc: JsonDoc) -> str | None:
    """bf16 or fp16 when enabled, fp32 when both say false, None (the default) otherwise."""
    enabled: dict[str, bool | None] = {}
    for section in ("bf16", "fp16"):
        doc.warn_unknown((section,), _PRECISION)
        enabled[section] = doc.get((section, "enabled"), (bool,), auto=True)
    if enabled["bf16"] and enabled["fp16"]:
        raise doc.error(("fp16", "enabled"), "bf16 and fp16 are both enabled; DeepSpeed "
                        "refuses that too")
    if enabled["bf16"]:
        return "bf16"
    if enabled["fp16"]:
        return "fp16"
    if enabled["bf16"] is False and enabled["fp16"] is False:
        return "fp32"
    return None
