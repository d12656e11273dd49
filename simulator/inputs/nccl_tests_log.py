"""Read an nccl-tests log (all_reduce_perf, all_gather_perf, reduce_scatter_perf, broadcast_perf)
as the tests print it (src/common.cu): the ``# nThread .. nGpus ..`` preamble, the ``# Using
devices`` block naming each GPU and its bus id, rows of 13 fields (size, count, type, redop,
root, then time / algbw / busbw / #wrong for out-of-place and again for in-place), and the
``# Avg bus bandwidth`` footer. Any of the header, device block and footer may be missing (logs
pasted from issues often start at the banner); NCCL INFO lines and shell prompts between them
are skipped.

The collective comes from the binary named on a prompt line, else from the rows: a redop of
``none`` with root -1 is all-gather, with a root broadcast; a reduction whose count times the
element size is the size is all-reduce, else reduce-scatter. The GPU count comes from the
device lines, else from busbw / algbw (nccl-tests' bus factors, doc/PERFORMANCE.md).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from simulator.errors import InputError, quoted

ELEMENT_BYTES = {"int8": 1, "uint8": 1, "char": 1, "int32": 4, "uint32": 4, "int": 4,
                 "int64": 8, "uint64": 8, "half": 2, "float": 4, "double": 8, "bfloat16": 2,
                 "f8e4m3": 1, "f8e5m2": 1}
BINARIES = {"all_reduce_perf": "allreduce", "all_gather_perf": "allgather",
            "reduce_scatter_perf": "reducescatter", "broadcast_perf": "broadcast"}
_DEVICE = re.compile(r"#\s+Rank\s+(\d+)\s.*?device\s+(\d+)\s+\[([0-9a-fA-Fx:.]+)\]\s+(.*)$")
_PREAMBLE = re.compile(r"#\s*nThread\s+(\d+)\s+nGpus\s+(\d+)")


@dataclass(frozen=True)
class LogRow:
    bytes: int
    count: int
    time_us: float  # out-of-place
    busbw_gbps: float
    in_place_time_us: float | None
    in_place_busbw_gbps: float | None
    line: int


@dataclass(frozen=True)
class NcclTestsLog:
    source: str
    op: str
    gpus: int
    datatype: str
    rows: tuple[LogRow, ...]
    devices: tuple[tuple[int, str, str], ...] = field(default=())  # (rank, bus id, name)
    avg_busbw_gbps: float | None = None

    @property
    def sizes(self) -> str:
        return f"{self.rows[0].bytes} - {self.rows[-1].bytes} B"


def _number(text: str, source: str, line: int) -> float:
    try:
        return float(text)
    except ValueError:
        raise InputError(f"expected a number in the result row, got {quoted(text)}", file=source,
                         line=line) from None


def parse(text: str, source: str = "<log>") -> NcclTestsLog:
    binary: str | None = None
    devices: list[tuple[int, str, str]] = []
    threads_gpus: tuple[int, int] | None = None
    rows: list[LogRow] = []
    types: set[str] = set()
    redops: set[str] = set()
    roots: set[str] = set()
    avg: float | None = None
    for k, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        for name in BINARIES:
            if re.search(rf"(^|[/\s]){name}(\s|$)", line) and not line.startswith("#"):
                binary = name
        if (m := _PREAMBLE.match(line)) is not None:
            threads_gpus = (int(m.group(1)), int(m.group(2)))
        elif (m := _DEVICE.match(line)) is not None:
            devices.append((int(m.group(1)), m.group(3), m.group(4).strip()))
        elif line.startswith("# Avg bus bandwidth"):
            avg = _number(line.split(":")[-1].split()[0], source, k)
        elif not line.startswith("#") and re.match(r"^\d+\s", line):
            fields = line.split()
            if len(fields) not in (9, 13) or fields[2] not in ELEMENT_BYTES:
                raise InputError(f"a result row with {len(fields)} fields (nccl-tests prints 13: "
                                 "size count type redop root, then time algbw busbw #wrong "
                                 "twice)", file=source, line=k)
            types.add(fields[2])
            redops.add(fields[3])
            roots.add(fields[4])
            in_place = len(fields) == 13
            rows.append(LogRow(
                int(fields[0]), int(fields[1]), _number(fields[5], source, k),
                _number(fields[7], source, k),
                _number(fields[9], source, k) if in_place else None,
                _number(fields[11], source, k) if in_place else None, k))
    if not rows:
        raise InputError("no nccl-tests result rows (lines of size, count, type, ...) found",
                         file=source)
    if len(types) != 1:
        raise InputError(f"rows of several datatypes ({', '.join(sorted(types))}); give one "
                         "datatype per log", file=source)
    datatype = types.pop()
    op = BINARIES[binary] if binary else _op_from_rows(rows, redops, roots, datatype)
    gpus = len(devices) if devices else (threads_gpus[0] * threads_gpus[1] if threads_gpus
                                         else _gpus_from_bandwidth(text, op, source))
    if gpus < 2:
        raise InputError(f"the log ran on {gpus} GPU; calibration needs two or more",
                         file=source)
    return NcclTestsLog(source, op, gpus, datatype, tuple(rows), tuple(devices), avg)


def _op_from_rows(rows: list[LogRow], redops: set[str], roots: set[str], datatype: str) -> str:
    if redops == {"none"}:
        return "allgather" if roots == {"-1"} else "broadcast"
    element = ELEMENT_BYTES[datatype]
    big = max(rows, key=lambda r: r.bytes)
    return "allreduce" if big.count * element == big.bytes else "reducescatter"


def _gpus_from_bandwidth(text: str, op: str, source: str) -> int:
    """busbw / algbw = 2(n-1)/n (all-reduce) or (n-1)/n (gathers), from the largest row."""
    best = None
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 8 and not line.lstrip().startswith("#") and fields[0].isdigit():
            algbw, busbw = float(fields[6]), float(fields[7])
            if algbw > 0 and (best is None or algbw > best[0]):
                best = (algbw, busbw)
    if best is None or op == "broadcast":
        raise InputError("the log names no GPUs (no `# Using devices` block) and its rows do "
                         "not give their number; paste the whole log", file=source)
    ratio = best[1] / best[0]
    n = 2 / (2 - ratio) if op == "allreduce" else 1 / (1 - ratio) if ratio < 1 else 0
    if n < 1.5:
        raise InputError("cannot tell the GPU count from busbw / algbw; paste the log's "
                         "`# Using devices` block", file=source)
    return round(n)
