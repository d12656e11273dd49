"""nccl-tests' text output, exactly, for simulated collectives (pure functions, no I/O).

The layout is nccl-tests' own (src/common.cu of the 2.13 series, the one most published logs
carry): the ``# nThread .. nGpus ..`` preamble, ``# Using devices`` with one ``#  Rank`` line per
GPU, the out-of-place / in-place banner, rows of ``%12li  %12li  %8s  %6s  %6s`` then twice
``  %7s  %6.2f  %6.2f  %5g`` (time as %7.0f from 10 ms, %7.1f from 100 us, else %7.2f), and the
``# Out of bounds values`` / ``# Avg bus bandwidth`` footer. Sizes follow nccl-tests' own rules
(the count of elements of the datatype; all-gather and reduce-scatter split the count over the
ranks in multiples of 4 elements, src/all_gather.cu; alltoall, gather and scatter give each peer
count/n, src/alltoall.cu, and print that per-peer count). stepsim's own facts come after the
footer, each on a ``# stepsim:`` comment line, so parsers of nccl-tests logs read it unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# nccl-tests test_typenames and their sizes (int8 .. bfloat16, f8e4m3 / f8e5m2 in newer builds)
DATATYPES = {"int8": 1, "uint8": 1, "int32": 4, "uint32": 4, "int64": 8, "uint64": 8,
             "half": 2, "float": 4, "double": 8, "bfloat16": 2, "f8e4m3": 1, "f8e5m2": 1}
REDOPS = ("sum", "prod", "max", "min", "avg", "mulsum")  # test_opnames
BINARIES = {"all_reduce_perf": "allreduce", "all_gather_perf": "allgather",
            "reduce_scatter_perf": "reducescatter", "broadcast_perf": "broadcast",
            "reduce_perf": "reduce", "alltoall_perf": "alltoall", "sendrecv_perf": "sendrecv",
            "gather_perf": "gather", "scatter_perf": "scatter"}
REDUCING = ("allreduce", "reducescatter", "reduce", "sendrecv")  # show -o's reduction
ROOTED = ("broadcast", "reduce", "gather", "scatter")  # root 0 (nccl-tests' -r default)
SPLIT = ("alltoall", "gather", "scatter")  # count/n per peer, the count column per peer
ALIGN = 4  # all_gather.cu, reduce_scatter.cu


@dataclass(frozen=True)
class Row:
    """One size as nccl-tests prints it; in-place repeats out-of-place (no difference is
    modelled)."""

    bytes: int
    count: int
    time_us: float
    algbw_gbps: float
    busbw_gbps: float


@dataclass(frozen=True)
class Header:
    n_gpus: int
    min_bytes: int
    max_bytes: int
    step: int
    step_is_factor: bool
    warmup_iters: int = 5
    iters: int = 20
    agg_iters: int = 1
    validation: int = 1
    graph: int = 0
    device_name: str = "GPU"
    boxes: int = 1  # processes (mpirun -np), each with n_gpus / boxes GPUs (-g) on its own host


def sizes(op: str, requested: int, n_ranks: int, element_bytes: int) -> tuple[int, int]:
    """(bytes nccl-tests moves, the count column) for a requested size (setupArgs)."""
    count = requested // element_bytes
    if op in ("allgather", "reducescatter"):
        base = count // (ALIGN * n_ranks) * ALIGN
        return base * n_ranks * element_bytes, base
    if op in SPLIT:  # alltoall.cu, gather.cu, scatter.cu: count/nranks per peer
        base = count // n_ranks
        return base * n_ranks * element_bytes, base
    return count * element_bytes, count


def _time(us: float) -> str:
    if us >= 10000.0:
        return f"{us:7.0f}"
    if us >= 100.0:
        return f"{us:7.1f}"
    return f"{us:7.2f}"


def render(header: Header, op: str, datatype: str, redop: str, rows: Sequence[Row],
           notes: Sequence[str], check: bool = True) -> str:
    """The whole log: nccl-tests' lines, then ``# stepsim:`` notes."""
    step = f"{header.step}({'factor' if header.step_is_factor else 'bytes'})"
    per_box = header.n_gpus // header.boxes
    lines = [f"# nThread 1 nGpus {per_box} minBytes {header.min_bytes} maxBytes "
             f"{header.max_bytes} step: {step} warmup iters: {header.warmup_iters} iters: "
             f"{header.iters} agg iters: {header.agg_iters} validation: {header.validation} "
             f"graph: {header.graph}", "#", "# Using devices"]
    host = ["stepsim" if header.boxes == 1 else f"stepsim{r // per_box}"
            for r in range(header.n_gpus)]
    lines += [f"#  Rank {r:2d} Group {0:2d} Pid {r // per_box:6d} on {host[r]:>10} device "
              f"{r % per_box:2d} [0x{r % per_box:02x}] {header.device_name}"
              for r in range(header.n_gpus)]
    lines += ["#",
              f"# {'':>10}  {'':>12}  {'':>8}  {'':>6}  {'':>6}           out-of-place"
              "                       in-place          ",
              f"# {'size':>10}  {'count':>12}  {'type':>8}  {'redop':>6}  {'root':>6}  "
              f"{'time':>7}  {'algbw':>6}  {'busbw':>6} {'#wrong':>6}  {'time':>7}  "
              f"{'algbw':>6}  {'busbw':>6} {'#wrong':>6}",
              f"# {'(B)':>10}  {'(elements)':>12}  {'':>8}  {'':>6}  {'':>6}  {'(us)':>7}  "
              f"{'(GB/s)':>6}  {'(GB/s)':>6}  {'':>5}  {'(us)':>7}  {'(GB/s)':>6}  "
              f"{'(GB/s)':>6}  {'':>5}"]
    shown_op = redop if op in REDUCING else "none"
    root = 0 if op in ROOTED else -1
    wrong = f"{0:5g}" if check else f"{'N/A':>5}"
    for r in rows:
        half = f"  {_time(r.time_us)}  {r.algbw_gbps:6.2f}  {r.busbw_gbps:6.2f}  {wrong}"
        lines.append(f"{r.bytes:12d}  {r.count:12d}  {datatype:>8}  {shown_op:>6}  "
                     f"{root:6d}{half}{half}")
    average = sum(r.busbw_gbps for r in rows) / len(rows) if rows else 0.0
    lines += ["# Out of bounds values : 0 OK", f"# Avg bus bandwidth    : {average:g} ", "#"]
    lines += [f"# stepsim: {note}" for note in notes]
    return "\n".join(lines)
