"""Metrics of a simulated step, as `stepsim run --json` prints them (design.md, `run` contract).

`step_report` is a pure function of a `Timeline` and a few facts about the job (tokens and
model FLOPs per step, the GPU's peak, the memory verdict, the one-GPU baseline); the command
gathers those. Definitions:

- compute_time_s: time the GPU runs any compute kernel (union of compute spans);
- comm_time_s: time any collective, point-to-point batch or host copy runs (union);
- exposed_comm_s: time communication runs while no compute does (what overlap failed to hide);
- these three are of the GPU that computes longest (it paces the step); where ranks differ
  (pipeline stages, mixed cards) ``ranks`` lists them for each group of identical GPUs;
- mfu: model FLOPs of the step (all ranks) / (step time * GPUs * the GPU's dense peak);
  ``flops_counted`` says what the numerator counts (6N + attention for full training; for LoRA
  4 per frozen weight and 6 per adapter weight); hfu: the same with the FLOPs activation
  checkpointing recomputes added (hardware FLOPs, Korthikanti et al. 2022);
- scaling_efficiency: tokens/s per GPU here / tokens/s of one GPU of the same machine with
  the same per-GPU batch (None where one GPU cannot hold the job);
- bottleneck: the link with the highest utilisation = bytes carried / (capacity * step time);
  ``utilization_during_comm`` divides by the time collectives run instead of the step;
- cost: ``{usd_per_hour, usd_per_step, usd_per_million_tokens, train_tokens, time_to_train_s,
  usd_to_train, breakeven_months}`` (simulator/outputs/cost.py; null where unknown), with the
  prices it used in ``cost_basis``; energy: ``{joules_per_step, avg_power_w,
  kwh_per_million_tokens}`` (simulator/outputs/energy.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from simulator.engine.timeline import (
    REPEAT_KIND,
    Span,
    Timeline,
    merge,
    subtract_length,
    union_length,
)

CONTRACT_KEYS = (
    "step_time_s", "compute_time_s", "comm_time_s", "exposed_comm_s", "tokens_per_s",
    "tokens_per_s_per_gpu", "samples_per_s", "mfu", "scaling_efficiency", "memory",
    "bottleneck",
)
MEMORY_KEYS = ("peak_bytes", "capacity_bytes", "fits", "breakdown_bytes")
BREAKDOWN_KEYS = ("weights", "gradients", "optimizer", "activations", "other")


def _split(spans: list[Span]) -> dict[str, float]:
    # each set of intervals merged once (union_length and subtract_length would each merge it)
    compute = merge([(s.start, s.end) for s in spans if s.is_compute])
    comm = merge([(s.start, s.end) for s in spans if s.is_comm])
    return {"compute_time_s": sum(end - start for start, end in compute),
            "comm_time_s": sum(end - start for start, end in comm),
            "exposed_comm_s": subtract_length(comm, compute)}


def time_split(timeline: Timeline, gpu: int | None = None) -> dict[str, float]:
    """compute, communication and exposed-communication seconds of one GPU (default: the
    GPU with the most compute, which paces the step). A replayed unit counts ``times`` over."""
    if gpu is None:
        splits = [time_split(timeline, group[0]) for group in timeline.rank_groups]
        return max(splits, key=lambda x: x["compute_time_s"])
    spans = timeline.spans_of(gpu)
    plain = [s for s in spans if s.kind != REPEAT_KIND]
    out = _split(plain)
    for rep in (s for s in spans if s.kind == REPEAT_KIND):
        lo, hi = rep.args["unit_tasks"]
        unit = _split([s for s in plain if lo <= s.args.get("task", -1) <= hi])
        for key, value in unit.items():
            out[key] += rep.args["times"] * value
    return out


def rank_split(timeline: Timeline) -> list[dict[str, Any]]:
    """`time_split` of each group of identical GPUs, with the GPUs it stands for."""
    return [{"gpus": list(group), **time_split(timeline, group[0])}
            for group in timeline.rank_groups]


def pipeline_report(timeline: Timeline) -> dict[str, Any]:
    """The pipeline's shape and its bubble. Over the pipeline phase (first forward to last
    backward, on any stage), each stage's idle share is the time it runs no compute;
    ``bubble_fraction`` is the pacing stage's (the one that computes most: the others also
    wait for it), the figure the closed form (p-1)/(m+p-1) (or /v, interleaved) describes."""
    meta = timeline.meta["pipeline"]
    reps = [timeline.representative(gpus[0]) for gpus in meta["stage_gpus"]]
    work = [s for s in timeline.spans if s.kind in ("forward", "backward")]
    start = min((s.start for s in work), default=0.0)
    end = max((s.end for s in work), default=0.0)
    busy = []
    for rep in reps:
        busy.append(union_length((max(s.start, start), min(s.end, end))
                                 for s in timeline.spans_of(rep) if s.is_compute))
    length = end - start
    idle = [1.0 - b / length if length > 0 else 0.0 for b in busy]
    pacing = max(range(len(busy)), key=busy.__getitem__)
    p = meta["stages"]
    return {"stages": p, "schedule": meta["schedule"], "micro_batches": meta["micro_batches"],
            "virtual_stages": meta["virtual_stages"], "bubble_fraction": idle[pacing],
            "bubble_fraction_closed_form": meta["closed_form_bubble"], "pacing_stage": pacing,
            "stage_idle_fraction": idle, "stage_gpus": meta["stage_gpus"],
            "stage_layers": [sum((meta["layers"][c] for c in range(r, len(meta["layers"]), p)),
                                 []) for r in range(p)],
            "pipeline_phase_s": length}


def offload_report(timeline: Timeline) -> dict[str, Any]:
    """What offloading moved and how long it took on the first GPU: copies each way and the
    CPU optimizer step (seconds their spans cover, replays counted)."""
    out: dict[str, Any] = dict(timeline.meta["offload"])
    for kind in ("d2h", "h2d", "cpu_optimizer"):
        out[f"{kind}_s"] = _kind_seconds(timeline, kind)
    return out


def _kind_seconds(timeline: Timeline, kind: str, stream: str | None = None) -> float:
    """Seconds the first GPU's spans of ``kind`` (on ``stream``) cover, replays counted."""
    spans = timeline.spans_of(timeline.rank_groups[0][0])
    mine = [s for s in spans if s.kind == kind and stream in (None, s.stream)]
    return union_length((s.start, s.end) for s in mine) + sum(
        rep.args["times"] * union_length(
            (s.start, s.end) for s in mine
            if rep.args["unit_tasks"][0] <= s.args.get("task", -1) <= rep.args["unit_tasks"][1])
        for rep in spans if rep.kind == REPEAT_KIND)


def paging_report(timeline: Timeline) -> dict[str, Any]:
    """A paged optimizer's states crossing the first GPU's host link each step
    (strategies/paging.py): bytes each way and the seconds each direction is busy."""
    nbytes = timeline.meta["paged_bytes_per_step"]
    return {"h2d_bytes_per_gpu": nbytes, "d2h_bytes_per_gpu": nbytes,
            "h2d_s": _kind_seconds(timeline, "h2d", "uvm.h2d"),
            "d2h_s": _kind_seconds(timeline, "d2h", "uvm.d2h")}


def bottleneck(timeline: Timeline, comm_time_s: float | None = None) -> dict[str, Any]:
    """The busiest link over the step (bytes / (capacity * step time))."""
    used = [k for k, b in timeline.link_bytes.items() if b > 0]
    if not used or timeline.step_time <= 0:
        return {"link": None, "utilization": 0.0, "utilization_during_comm": 0.0,
                "bytes": 0, "window": "step"}
    link = max(sorted(used), key=timeline.link_utilization)
    # while any GPU communicates: the union over groups (replays counted by the pacing GPU's)
    comm_time = union_length((s.start, s.end) for s in timeline.comm_spans())
    comm_time = max(comm_time, time_split(timeline)["comm_time_s"] if comm_time_s is None
                    else comm_time_s)
    carried = timeline.link_bytes[link]
    capacity = timeline.link_capacity[link]
    return {
        "link": link,
        "utilization": timeline.link_utilization(link),
        "utilization_during_comm": carried / (capacity * comm_time) if comm_time > 0 else 0.0,
        "bytes": int(carried),
        "capacity_gbps": capacity / 1e9,
        "window": "step",
    }


def interference_report(timeline: Timeline) -> dict[str, Any]:
    """How much collectives slowed the pacing GPU's compute: the seconds its compute spans
    took beyond their idle-GPU time (SMs held by NCCL's channels, memory bandwidth its kernels
    take: nccl/interference.py), and the transports of the collectives beside them."""
    gpu = max(timeline.rank_groups, key=lambda g: time_split(timeline, g[0])
              ["compute_time_s"])[0]
    spans = timeline.spans_of(gpu)
    lost = sum(s.duration - s.args["idle_s"] for s in spans
               if s.is_compute and "idle_s" in s.args and s.kind != REPEAT_KIND)
    lost += sum(rep.args["times"] * sum(
        s.duration - s.args["idle_s"] for s in spans
        if s.is_compute and "idle_s" in s.args
        and rep.args["unit_tasks"][0] <= s.args.get("task", -1) <= rep.args["unit_tasks"][1])
        for rep in spans if rep.kind == REPEAT_KIND)
    idle = sum(s.args["idle_s"] for s in spans if s.is_compute and "idle_s" in s.args)
    transports = sorted({str(s.args["transport"]) for s in spans
                         if s.is_comm and s.args.get("transport")})
    return {"compute_slowed_s": max(0.0, lost), "share_of_compute": lost / idle if idle else 0.0,
            "transports": transports,
            "mechanism": "NCCL channels hold SMs; their kernels take memory bandwidth by "
                         "transport and protocol (nccl/interference.py)"}


def bucket_list(timeline: Timeline) -> list[dict[str, Any]]:
    """DDP buckets in launch order with their all-reduce start and end (from program meta).

    Each bucket in ``meta["buckets"]`` names its all-reduce task (``task``, the task id) or
    its span (``name``); steady state, last micro-step (the one that all-reduces).
    """
    first = timeline.rank_groups[0][0]  # meta is the first program's
    spans_by_task = {s.args.get("task"): s for s in timeline.comm_spans(first)}
    spans_by_name: dict[str, Any] = {}
    for s in timeline.comm_spans(first):
        spans_by_name[s.name] = s  # the last one: the micro-step that all-reduces
    out = []
    for bucket in timeline.meta.get("buckets", []):
        span = spans_by_task.get(bucket.get("task")) or spans_by_name.get(bucket.get("name", ""))
        out.append({
            "bytes": int(bucket["bytes"]),
            "tensors": int(bucket["tensors"]),
            "start_s": span.start if span else None,
            "end_s": span.end if span else None,
        })
    out.sort(key=lambda b: (b["start_s"] is None, b["start_s"] or 0.0))
    return out


def step_report(timeline: Timeline, *, tokens_per_step: float, samples_per_step: float,
                model_flops_per_step: float, peak_flops: float,
                memory: Mapping[str, Any], hardware_flops_per_step: float | None = None,
                flops_counted: Mapping[str, str] | None = None,
                baseline_tokens_per_s: float | None = None,
                gpu_price_usd: float | None = None,
                cost: Mapping[str, Any] | None = None,
                cost_basis: Mapping[str, Any] | None = None,
                energy: Mapping[str, Any] | None = None,
                extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Every key of the `run --json` contract (plus a few descriptive ones in `extra`)."""
    step = timeline.step_time
    world = timeline.world
    tokens_per_s = tokens_per_step / step if step > 0 else 0.0
    per_gpu = tokens_per_s / world
    report: dict[str, Any] = dict(extra or {})
    report["gpus"] = world
    report["step_time_s"] = step
    ranks = rank_split(timeline)  # each group's split, once: the pacing group's is the headline
    pacing = max(ranks, key=lambda r: r["compute_time_s"])
    report.update({k: pacing[k] for k in ("compute_time_s", "comm_time_s", "exposed_comm_s")})
    report["tokens_per_s"] = tokens_per_s
    report["tokens_per_s_per_gpu"] = per_gpu
    report["samples_per_s"] = samples_per_step / step if step > 0 else 0.0
    report["mfu"] = model_flops_per_step / (step * world * peak_flops) if step > 0 else 0.0
    hardware = model_flops_per_step if hardware_flops_per_step is None else \
        hardware_flops_per_step
    report["hfu"] = hardware / (step * world * peak_flops) if step > 0 else 0.0
    if flops_counted is not None:
        report["flops_counted"] = dict(flops_counted)
    report["scaling_efficiency"] = (per_gpu / baseline_tokens_per_s
                                    if baseline_tokens_per_s else None)
    report["memory"] = {
        "peak_bytes": int(memory["peak_bytes"]),
        "capacity_bytes": int(memory["capacity_bytes"]),
        "fits": bool(memory["fits"]),
        "breakdown_bytes": {k: int(memory["breakdown_bytes"].get(k, 0)) for k in BREAKDOWN_KEYS},
    }
    for key in ("host_peak_bytes", "host_capacity_bytes", "host_fits", "paged_optimizer",
                "stage", "stages"):
        if key in memory:  # host RAM (offload); a pipeline's fullest stage and every stage's
            report["memory"][key] = memory[key]
    report["bottleneck"] = bottleneck(timeline, pacing["comm_time_s"])
    if world > 1:
        report["interference"] = interference_report(timeline)
    if len(ranks) > 1:
        report["ranks"] = ranks
    if "pipeline" in timeline.meta:
        report["pipeline"] = pipeline_report(timeline)
    if "offload" in timeline.meta:
        report["offload"] = offload_report(timeline)
    if "paged_bytes_per_step" in timeline.meta:
        report["paging"] = paging_report(timeline)
    if "buckets" in timeline.meta:
        report["buckets"] = bucket_list(timeline)
    if cost is not None:
        report["cost"] = dict(cost)
        report["cost_basis"] = dict(cost_basis or {})
    if energy is not None:
        report["energy"] = dict(energy)
    if gpu_price_usd:  # buying rather than renting: throughput per dollar of GPUs
        report["gpus_price_usd"] = gpu_price_usd * world
        report["tokens_per_s_per_kusd"] = tokens_per_s / (gpu_price_usd * world / 1000)
    return report
