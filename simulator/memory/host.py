"""What offloading moves from GPU memory to host RAM, line by line (memory.py's lines in,
lines out, host lines marked).

DeepSpeed (deepspeed/runtime/zero/stage_1_and_2.py, stage3.py; offload_optimizer,
offload_param) keeps on the CPU, per rank: the fp32 master partition with Adam's m and v
(12 B per parameter of its 1/N share), an fp32 gradient partition (4 B: gradients are cast on
the GPU and copied down, torch copy_ with non_blocking converts on the device) and, with
offload_param, the 16-bit parameter partition (2 B), 18 B in all, the figures of DeepSpeed's own
estimate_zero3_model_states_mem_needs; ZeRO-1/2 also pin a 16-bit buffer of the partition for
the updated parameters' H2D copy (DeepSpeed PR #7309). DeepSpeed's estimator multiplies the
host figure by 1.5 (``additional_buffer_factor``) as a safety margin; the runs do not allocate
it: IST-DASLab/llmq's LLaMA-Factory ZeRO-3 offload of Qwen2.5-14B on four 4090s logs 256.66 GB
of host memory in use after the optimizer's setup, the 18 B x 14.8 B parameters (248 GiB) plus
the four processes themselves, so the host need here is the states alone. FSDP2
``CPUOffloadPolicy`` keeps the fp32 parameter shard, its fp32 gradient and the optimizer
states on the CPU (16 B with Adam, the same bytes the GPU held: memory is conserved), and the
CPU step needs no foreach temporaries.
On the GPU, ZeRO-2 and ZeRO-3 keep no gradient partition (it is copied down as it is reduced);
ZeRO-1 still builds the full 16-bit gradients; units in flight and buckets stay.
Not counted: the host memory every process holds anyway (Python, CUDA, libraries).
"""

from __future__ import annotations

from dataclasses import replace

from simulator.errors import InputError, quoted
from simulator.job.workload import Job
from simulator.memory.report import Line

OFFLOADS = ("none", "optimizer", "params")


def check(strategy: str, offload: str) -> None:
    """Which strategy can offload what, as the frameworks allow it."""
    if offload not in OFFLOADS:
        raise InputError(f"--offload {quoted(offload)}: choose from {', '.join(OFFLOADS[1:])}")
    if offload == "none":
        return
    if strategy not in ("zero1", "zero2", "zero3", "fsdp"):
        raise InputError(f"--offload does not apply to -s {strategy}: offloading is DeepSpeed "
                         "ZeRO's or FSDP2's (use it with zero1, zero2, zero3, fsdp)")
    if offload == "params" and strategy in ("zero1", "zero2"):
        raise InputError(f"--offload params with -s {strategy}: DeepSpeed offloads parameters "
                         "only under ZeRO-3 (offload_param); use --offload optimizer")
    if offload == "optimizer" and strategy == "fsdp":
        raise InputError("--offload optimizer with -s fsdp: FSDP2's CPUOffloadPolicy moves "
                         "parameters, gradients and optimizer states together; use --offload "
                         "params")


def offload_lines(lines: list[Line], job: Job, strategy: str, offload: str, dp: int,
                  tp: int) -> list[Line]:
    """The same lines with the offloaded ones moved to host RAM, plus the host-only buffers."""
    trainable = sum((p.numel / tp if len(p.shape) > 1 else p.numel)
                    for p in job.params if p.trainable)
    share = trainable / dp  # this rank's partition of the trainable parameters
    out: list[Line] = []
    host: list[Line] = []
    for line in lines:
        if line.category == "optimizer":
            host.append(replace(line, host=True))
        elif line.category == "gradients" and strategy != "zero1":
            if strategy == "fsdp":
                host.append(replace(line, host=True, phase="both"))
            # DeepSpeed: the partition is copied down as it is reduced; the fp32 line below
        elif line.category == "weights" and offload == "params":
            host.append(replace(line, host=True))
        elif "foreach fp32 intermediates" in line.label:
            continue  # the CPU optimizer steps on the host, one tensor at a time
        else:
            out.append(line)
    if strategy.startswith("zero"):
        host.append(Line("gradients", "fp32 gradient partition (cast on the GPU, copied down)",
                         4 * share, host=True))
        if strategy in ("zero1", "zero2"):
            host.append(Line("other", "pinned 16-bit buffer for the updated partition's H2D copy",
                             2 * share, host=True))
    return out + [replace(x, label=f"host: {x.label}") for x in host]
