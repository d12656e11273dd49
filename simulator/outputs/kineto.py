"""A simulated step as PyTorch-profiler (Kineto) traces, one file per rank, for HTA and friends.

What is inside: ``rank_traces(timeline, devices, ...)`` gives one JSON-ready dict per rank in
the shape ``torch.profiler`` exports (domain-model 7.2, checked against HolisticTraceAnalysis'
own test traces): ``schemaVersion``, ``deviceProperties``, ``distributedInfo`` (backend,
rank, world_size), ``traceEvents`` and ``displayTimeUnit``. On the GPU (``pid`` = device,
``tid`` = CUDA stream) every compute span is a ``cat: kernel`` event named after its op, every
collective an NCCL kernel named as NCCL builds them (``src/device/generate.py``
``best_kernel``: ``ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)``,
``ncclDevKernel_AllGather_RING_LL(...)``), host copies ``Memcpy`` events (``gpu_memcpy``);
kernels carry ``args.device/stream/correlation/External id`` and the NCCL ones the collective's
name, sizes, group size and dtype as recent PyTorch records them. On the CPU (``pid`` = a
process id of its own) a ``ProfilerStep#N`` annotation spans the step, and host work (a CPU
optimizer) is a ``cpu_op``. Flow events (``cat: dependency``) link dependent tasks on
different streams; rank 0 also carries a counter per link with traffic.

What it assumes: times are whole microseconds (HTA rounds fractional ones itself, ceiling
starts and flooring ends, which would open gaps between back-to-back kernels), each span's
ends rounded once, so adjacent kernels stay adjacent. There are no CPU launch events (the
simulator does not model the host's launch thread). A replay of identical micro-steps drawn as
one span (too many to copy) is an annotation, not a kernel. A pure function of a `Timeline`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from simulator.engine.timeline import COLLECTIVE_KINDS, HOST_KINDS, REPEAT_KIND, Span, Timeline
from simulator.outputs.trace import flows, link_counters

COMPUTE_STREAM = 7  # PyTorch's default stream as CUDA numbers it in profiler traces
FIRST_COMM_STREAM = 20  # ProcessGroupNCCL's streams: any number other than the default's
CPU_PID = 1_000_000  # + rank: host-side events (a process of its own in the trace)
LINKS_PID = CPU_PID - 1  # the machine's link counters (rank 0's file)

# NCCL's names: src/device/generate.py (collective, reduction op, whether typed)
_NCCL = {"allreduce": ("AllReduce", True), "reducescatter": ("ReduceScatter", True),
         "allgather": ("AllGather", False), "broadcast": ("Broadcast", False),
         "reduce": ("Reduce", True)}
_ELEMENT_BYTES = {"f32": 4, "bf16": 2, "f16": 2}
_COPIES = {"d2h": "Memcpy DtoH (Device -> Pinned)", "h2d": "Memcpy HtoD (Pinned -> Device)",
           "nvme": "Memcpy DtoH (Device -> Pinned)"}


def rank_paths(path: str | Path, world: int) -> list[str]:
    """The per-rank file names beside ``path``: ``step.json`` -> ``step.rank0.json``, ...
    (``step.json.gz`` -> ``step.rank0.json.gz``; no suffix: ``.json`` is added)."""
    text = str(path)
    for suffix in (".json.gz", ".json"):
        if text.endswith(suffix):
            stem = text[: -len(suffix)]
            return [f"{stem}.rank{r}{suffix}" for r in range(world)]
    return [f"{text}.rank{r}.json" for r in range(world)]


def nccl_kernel(kind: str, algorithm: str, dtype: str) -> str:
    """The kernel NCCL launches for a collective (its specialised LL kernel dispatches the
    protocol actually chosen: generate.py ``best_kernel``)."""
    if kind in ("p2p", "alltoall"):  # ncclAlltoAll runs as send/recv tasks (enqueue.cc)
        return "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)"
    coll, typed = _NCCL[kind]
    algo = "TREE" if algorithm == "tree" and typed else "RING"
    parts = [coll, "Sum", dtype, algo, "LL"] if typed else [coll, algo, "LL"]
    return f"ncclDevKernel_{'_'.join(parts)}(ncclDevKernelArgsStorage<4096ul>)"


def comm_dtypes(strategy: str, precision: str, comm_hook: str = "none") -> tuple[str, str]:
    """(gradient reductions, tensor-parallel activations) dtypes as the strategies move them:
    DDP and FSDP reduce fp32 gradients under AMP (strategies/ddp.py, fsdp.py), a bf16 comm
    hook halves them, DeepSpeed ZeRO reduces its 16-bit gradients (strategies/zero.py), and
    TP all-reduces activations in the compute dtype."""
    activation = {"bf16": "bf16", "fp16": "f16"}.get(precision, "f32")
    if precision == "fp32":
        return "f32", "f32"
    if strategy.startswith("zero"):
        return activation, activation
    return ("bf16" if comm_hook == "bf16" else "f32"), activation


def device_properties(name: str, memory_bytes: int, compute_capability: int,
                      sms: int) -> dict[str, Any]:
    """A ``deviceProperties`` entry as Kineto writes it (``computeMajor`` 12 for sm120)."""
    return {"name": name, "totalGlobalMem": memory_bytes,
            "computeMajor": compute_capability // 10, "computeMinor": compute_capability % 10,
            "numSms": sms, "warpSize": 32}  # every NVIDIA GPU's warp (CUDA guide)


def rank_traces(timeline: Timeline, devices: Sequence[Mapping[str, Any]], *,
                reduce_dtype: str = "f32", activation_dtype: str = "bf16",
                deps: Sequence[Mapping[int, Sequence[int]]] = (), step: int = 1,
                ) -> list[dict[str, Any]]:
    """One Kineto-shaped trace per rank. ``devices``: each rank's ``deviceProperties`` entry;
    ``reduce_dtype``/``activation_dtype``: the NCCL dtype of gradient reductions and of
    tensor-parallel activations; ``deps``: each rank group's ``{task: its dependencies}``."""
    streams = {name: COMPUTE_STREAM if name == "compute" else FIRST_COMM_STREAM + i
               for i, name in enumerate(timeline.streams())}
    group_of = {gpu: g for g, group in enumerate(timeline.rank_groups) for gpu in group}
    out = []
    for rank in range(timeline.world):
        spans = timeline.spans_of(rank)
        edges = deps[group_of[rank]] if deps else {}
        events = _metadata(rank, streams)
        events += _events(spans, rank, streams, edges, reduce_dtype, activation_dtype)
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}",
                       "pid": CPU_PID + rank, "tid": CPU_PID + rank, "ts": 0,
                       "dur": _us(timeline.step_time), "args": {"External id": 0}})
        if rank == 0:
            events += _link_counters(timeline)
        out.append({
            "schemaVersion": 1,
            "deviceProperties": [dict(devices[rank], id=rank)],
            "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": timeline.world,
                                "pg_count": 1, "pg_config": [{
                                    "pg_name": "0", "pg_desc": "default_pg",
                                    "backend_config": "cuda:nccl",
                                    "ranks": list(range(timeline.world)),
                                    "group_size": timeline.world}]},
            "traceEvents": events,
            "traceName": f"stepsim rank {rank}",
            "displayTimeUnit": "ms",
            "baseTimeNanoseconds": 0,
        })
    return out


def _us(seconds: float) -> int:
    return round(seconds * 1e6)


def _metadata(rank: int, streams: Mapping[str, int]) -> list[dict[str, Any]]:
    cpu = CPU_PID + rank
    events: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": rank, "tid": 0, "args": {"name": "python"}},
        {"ph": "M", "name": "process_labels", "pid": rank, "tid": 0,
         "args": {"labels": f"GPU {rank}"}},
        {"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0,
         "args": {"sort_index": 16777216 + rank}},  # Kineto sorts GPUs after the host
        {"ph": "M", "name": "process_name", "pid": cpu, "tid": 0, "args": {"name": "python"}},
        {"ph": "M", "name": "thread_name", "pid": cpu, "tid": cpu,
         "args": {"name": f"thread {cpu} (pt_main_thread)"}},
    ]
    for name, tid in streams.items():
        events.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": tid,
                       "args": {"name": f"stream {tid} ({name})"}})
        events.append({"ph": "M", "name": "thread_sort_index", "pid": rank, "tid": tid,
                       "args": {"sort_index": tid}})
    return events


def _events(spans: list[Span], rank: int, streams: Mapping[str, int],
            deps: Mapping[int, Sequence[int]], reduce_dtype: str,
            activation_dtype: str) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    placed: dict[int, tuple[int, int, str]] = {}  # task -> (ts, tid, stream) for flows
    correlation = 0
    for span in spans:
        ts, end = _us(span.start), _us(span.end)
        if end <= ts:
            continue
        base = {"ph": "X", "ts": ts, "dur": end - ts}
        if span.kind == REPEAT_KIND or span.kind in HOST_KINDS:
            cat = "user_annotation" if span.kind == REPEAT_KIND else "cpu_op"
            events.append({**base, "cat": cat, "name": span.name, "pid": CPU_PID + rank,
                           "tid": CPU_PID + rank, "args": {"External id": 0}})
            continue
        correlation += 1
        tid = streams[span.stream]
        args: dict[str, Any] = {"External id": correlation, "device": rank, "stream": tid,
                                "correlation": correlation}
        if span.kind in COLLECTIVE_KINDS or span.kind == "p2p":
            dtype = activation_dtype if span.stream == "tp" else reduce_dtype
            name, cat = nccl_kernel(span.kind, str(span.args.get("algorithm", "ring")),
                                    dtype), "kernel"
            elements = int(span.args.get("bytes", 0)) // _ELEMENT_BYTES.get(dtype, 4)
            ranks = int(span.args.get("ranks", 1))
            gathered = span.kind == "allgather"
            scattered = span.kind == "reducescatter"
            args.update({"Collective name": _C10D_NAME[span.kind],
                         "In msg nelems": elements // ranks if gathered else elements,
                         "Out msg nelems": elements // ranks if scattered else elements,
                         "Group size": ranks, "dtype": _TORCH_DTYPE.get(dtype, dtype),
                         "algorithm": span.args.get("algorithm"),
                         "protocol": span.args.get("protocol"),
                         "channels": span.args.get("channels")})
        elif span.kind in _COPIES:
            name, cat = _COPIES[span.kind], "gpu_memcpy"
            args["bytes"] = span.args.get("bytes", 0)
        else:
            name, cat = span.name, "kernel"
        events.append({**base, "cat": cat, "name": name, "pid": rank, "tid": tid,
                       "args": args})
        task = span.args.get("task")
        if isinstance(task, int):
            placed[task] = (ts, tid, span.stream)
    events += flows(placed, deps, pid=rank, key=rank)
    return events


_TORCH_DTYPE = {"f32": "Float", "bf16": "BFloat16", "f16": "Half"}  # as c10 names them
# ProcessGroupNCCL's names for the calls (RECORD_PARAM_COMMS in ProcessGroupNCCL.cpp)
_C10D_NAME = {"allreduce": "allreduce", "allgather": "_allgather_base",
              "reducescatter": "_reduce_scatter_base", "broadcast": "broadcast", "p2p": "send",
              "reduce": "reduce", "alltoall": "all_to_all_single"}


def _link_counters(timeline: Timeline) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = [{"ph": "M", "name": "process_name", "pid": LINKS_PID,
                                     "tid": 0, "args": {"name": "links"}}]
    return events + link_counters(timeline, LINKS_PID, _us) if timeline.link_bytes else []
