"""Read an nccl-tests log (all_reduce_perf, all_gather_perf, reduce_scatter_perf, broadcast_perf)
as the tests print it (src/common.cu): the ``# nThread .. nGpus ..`` preamble, the ``# Using
devices`` block naming each GPU and its bus id, rows of 13 fields (size, count, type, redop,
root, then time / algbw / busbw / #wrong for out-of-place and again for in-place), and the
``# Avg bus bandwidth`` footer. Any of the header, device block and footer may be missing (logs
pasted from issues often start at the banner).

What the run was, as far as the log says it: the command line on a prompt (its binary, ``-g``,
and the ``NCCL_*`` and ``CUDA_VISIBLE_DEVICES`` assignments before it, or ``export`` lines),
NCCL's own INFO lines (``NCCL version 2.16.2``, ``NCCL_P2P_DISABLE set by environment to 1.``
(src/misc/param.cc), ``comm .. nranks 2`` (init.cc), ``Channel 00/0 : 0[0] -> 1[1] via P2P/IPC``
(the transports, p2p.cc / shm.cc / net.cc)).

The collective comes from the binary named on a prompt line, else from the rows: a redop of
``none`` with root -1 is all-gather, with a root broadcast; a reduction whose count times the
element size is the size is all-reduce, else reduce-scatter. The GPU count comes from the
device lines, else the preamble, else NCCL's nranks, else from busbw / algbw (nccl-tests' bus
factors, doc/PERFORMANCE.md).

A row is used only if it is whole where it is read: its size an integer, its time a positive
number that agrees with its printed algbw (size / time, to the printed rounding), #wrong 0; an
in-place half only if the row carries it whole. Every other row-like line is kept in
``skipped`` with the reason (a cell ``N/A``, a row cut short, a time of 1e-308), and a log is
refused only when no row is left.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass, field

from simulator.errors import InputError, quoted

ELEMENT_BYTES = {"int8": 1, "uint8": 1, "char": 1, "int32": 4, "uint32": 4, "int": 4,
                 "int64": 8, "uint64": 8, "half": 2, "float": 4, "double": 8, "bfloat16": 2,
                 "f8e4m3": 1, "f8e5m2": 1}
BINARIES = {"all_reduce_perf": "allreduce", "all_gather_perf": "allgather",
            "reduce_scatter_perf": "reducescatter", "broadcast_perf": "broadcast"}
_DEVICE = re.compile(r"#\s+Rank\s+(\d+)\s.*?device\s+(\d+)\s+\[([0-9a-fA-Fx:.]+)\]\s+(.*)$")
_PREAMBLE = re.compile(r"#\s*nThread\s+(\d+)\s+nGpus\s+(\d+)")
_VERSION = re.compile(r"NCCL version (\d+\.\d+\.\d+)")
_SET_BY_ENV = re.compile(r"\b(NCCL_[A-Z0-9_]+) set by environment to (.*?)\.?\s*$")
_ASSIGN = re.compile(r"(?:^|\s)(?:export\s+)?((?:NCCL_[A-Z0-9_]+|CUDA_VISIBLE_DEVICES))="
                     r"(\"[^\"]*\"|'[^']*'|\S*)")
_NRANKS = re.compile(r"\bnranks (\d+)\b", re.IGNORECASE)
_VIA = re.compile(r"\bvia (P2P|SHM|NET)\b")
_G_FLAG = re.compile(r"(?:^|\s)(?:-g|--ngpus)\s*(\d+)\b")
# a printed algbw is rounded to 0.01 GB/s: a time agrees with it within that and 2 %
_ALGBW_ROUNDING, _ALGBW_SHARE = 0.006, 0.02


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
    # what the run was, as the log says it
    env: tuple[tuple[str, str], ...] = ()  # NCCL_* variables, in the order found
    nccl_version: str | None = None
    visible_devices: tuple[int, ...] | None = None  # CUDA_VISIBLE_DEVICES on its command line
    transports: frozenset[str] = frozenset()  # what NCCL's channel lines say it used
    # rows not used: (line, why), and sizes measured more than once
    skipped: tuple[tuple[int, str], ...] = ()
    duplicates: tuple[int, ...] = ()

    @property
    def sizes(self) -> str:
        return f"{self.rows[0].bytes} - {self.rows[-1].bytes} B"

    @property
    def device_names(self) -> tuple[str, ...]:
        return tuple(name for _, _, name in self.devices)

    def warning(self) -> str | None:
        """The one line that says which rows were left out and why (None: none)."""
        parts = []
        if self.skipped:
            shown = "; ".join(f"line {k}: {why}" for k, why in self.skipped[:4])
            more = len(self.skipped) - 4
            parts.append(f"{len(self.skipped)} row(s) not used ({shown}"
                         + (f"; and {more} more" if more > 0 else "") + ")")
        if self.duplicates:
            parts.append(f"{len(self.duplicates)} size(s) measured more than once, all fitted "
                         f"(first {self.duplicates[0]} B)")
        return "; ".join(parts) or None


def _float(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _half(fields: list[str], at: int, size: int) -> tuple[float, float] | str:
    """(time us, busbw) of the half whose time is ``fields[at]``, or why it cannot be used."""
    if len(fields) < at + 4:
        return f"cut short ({len(fields)} of 13 fields)"
    time, algbw, busbw, wrong = (fields[at], fields[at + 1], fields[at + 2], fields[at + 3])
    t, a, b = _float(time), _float(algbw), _float(busbw)
    if t is None or a is None or b is None:
        bad = next(c for c, v in ((time, t), (algbw, a), (busbw, b)) if v is None)
        return f"{quoted(bad)} is not a number"
    if t <= 0:
        return f"time {time} us is not positive"
    if wrong not in ("0", "N/A"):
        return f"#wrong {wrong}: the data were wrong"
    implied = size / t / 1e3  # GB/s, as nccl-tests computes algbw
    if abs(implied - a) > max(_ALGBW_ROUNDING, _ALGBW_SHARE * a):
        return f"time {time} us disagrees with its algbw {algbw} (size / time is {implied:.3g})"
    return t, b


def _row(fields: list[str], line: int) -> LogRow | str:
    """A result row, or why it cannot be used."""
    if not re.fullmatch(r"\d+", fields[0]) or not re.fullmatch(r"\d+", fields[1]):
        return f"size {quoted(fields[0])} / count {quoted(fields[1])} is not an integer"
    size, count = int(fields[0]), int(fields[1])
    out = _half(fields, 5, size)
    if isinstance(out, str):
        return out
    inp = _half(fields, 9, size)
    return LogRow(size, count, out[0], out[1], None if isinstance(inp, str) else inp[0],
                  None if isinstance(inp, str) else inp[1], line)


def _looks_like_a_row(fields: list[str]) -> bool:
    return len(fields) >= 3 and fields[2] in ELEMENT_BYTES and fields[0][:1].isdigit()


def parse(text: str, source: str = "<log>") -> NcclTestsLog:
    binary: str | None = None
    devices: list[tuple[int, str, str]] = []
    threads_gpus: tuple[int, int] | None = None
    found: list[tuple[list[str], int]] = []  # row-like lines, with their line numbers
    avg: float | None = None
    env: dict[str, str] = {}
    version = nranks = command_gpus = None
    visible: tuple[int, ...] | None = None
    via: set[str] = set()
    for k, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if (m := _VERSION.search(line)) is not None:
            version = m.group(1)
        if (m := _SET_BY_ENV.search(line)) is not None:
            env.setdefault(m.group(1), m.group(2).strip())
        if (m := _NRANKS.search(line)) is not None:
            nranks = int(m.group(1))
        via.update(_VIA.findall(line))
        if line.startswith("#"):
            if (m := _PREAMBLE.match(line)) is not None:
                threads_gpus = (int(m.group(1)), int(m.group(2)))
            elif (m := _DEVICE.match(line)) is not None:
                devices.append((int(m.group(1)), m.group(3), m.group(4).strip()))
            elif line.startswith("# Avg bus bandwidth"):
                avg = _float(line.split(":")[-1].split()[0]) if ":" in line else None
            continue
        fields = line.split()
        if _looks_like_a_row(fields):
            found.append((fields, k))
            continue
        for name in BINARIES:
            if re.search(rf"(^|[/\s]){name}(\s|$)", line):
                binary = name
                visible = _command(line, env, visible)
                if (m := _G_FLAG.search(line.split(name, 1)[1])) is not None:
                    command_gpus = int(m.group(1))
        if line.startswith("export "):
            visible = _command(line, env, visible)
    rows, skipped = [], []
    types = Counter(fields[2] for fields, _ in found)
    datatype = types.most_common(1)[0][0] if types else "float"
    redops, roots = set(), set()
    for fields, k in found:
        if fields[2] != datatype:
            skipped.append((k, f"datatype {fields[2]}, the log's rows are {datatype}"))
            continue
        row = _row(fields, k)
        if isinstance(row, str):
            skipped.append((k, row))
            continue
        rows.append(row)
        redops.add(fields[3] if len(fields) > 3 else "")
        roots.add(fields[4] if len(fields) > 4 else "")
    if not rows:
        why = f" ({skipped[0][1]}, line {skipped[0][0]})" if skipped else ""
        raise InputError("no usable nccl-tests result row (lines of size, count, type, ..., "
                         f"time, algbw, busbw){why}", file=source)
    op = BINARIES[binary] if binary else _op_from_rows(rows, redops, roots, datatype)
    counted = Counter(r.bytes for r in rows)
    duplicates = tuple(sorted(size for size, n in counted.items() if n > 1))
    if devices:
        gpus = len(devices)
    elif threads_gpus:
        gpus = threads_gpus[0] * threads_gpus[1]
    elif nranks:
        gpus = nranks
    elif command_gpus:
        gpus = command_gpus
    else:
        gpus = _gpus_from_bandwidth(found, op, source)
    if gpus < 2:
        raise InputError(f"the log ran on {gpus} GPU; calibration needs two or more",
                         file=source)
    return NcclTestsLog(source, op, gpus, datatype, tuple(rows), tuple(devices), avg,
                        tuple((k, v) for k, v in env.items() if k.startswith("NCCL_")),
                        version, visible, frozenset(via), tuple(skipped), duplicates)


def _command(line: str, env: dict[str, str], visible: tuple[int, ...] | None
             ) -> tuple[int, ...] | None:
    """The NCCL_* and CUDA_VISIBLE_DEVICES assignments of a command or export line."""
    for name, value in _ASSIGN.findall(line):
        value = value.strip("\"'")
        if name == "CUDA_VISIBLE_DEVICES":
            ids = value.split(",")
            if ids and all(i.strip().isdigit() for i in ids):
                visible = tuple(int(i) for i in ids)
        else:
            env.setdefault(name, value)
    return visible


def _op_from_rows(rows: list[LogRow], redops: set[str], roots: set[str], datatype: str) -> str:
    if redops == {"none"}:
        return "allgather" if roots == {"-1"} else "broadcast"
    element = ELEMENT_BYTES[datatype]
    big = max(rows, key=lambda r: r.bytes)
    return "allreduce" if big.count * element == big.bytes else "reducescatter"


def _gpus_from_bandwidth(found: list[tuple[list[str], int]], op: str, source: str) -> int:
    """busbw / algbw = 2(n-1)/n (all-reduce) or (n-1)/n (gathers), from the fastest row."""
    best = None
    for fields, _ in found:
        if len(fields) < 8:
            continue
        algbw, busbw = _float(fields[6]), _float(fields[7])
        if algbw is not None and busbw is not None and algbw > 0 and \
                (best is None or algbw > best[0]):
            best = (algbw, busbw)
    if best is None or op == "broadcast":
        raise InputError("the log names no GPUs (no `# Using devices` block) and its rows do "
                         "not give their number; paste the whole log", file=source)
    ratio = best[1] / best[0]
    n = 2 / (2 - ratio) if op == "allreduce" and ratio < 2 else \
        1 / (1 - ratio) if op != "allreduce" and ratio < 1 else 0
    if not 1.5 <= n < 1e6:
        raise InputError("cannot tell the GPU count from busbw / algbw; paste the log's "
                         "`# Using devices` block", file=source)
    return round(n)
