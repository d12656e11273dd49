"""Read `nvidia-smi topo -m` as drivers print it: the GPU/NIC matrix, affinities and legends.

``parse(text, source)`` returns a :class:`TopoMatrix`: the device columns (``GPU0``..,
``NIC0``.. or, from older drivers, the NIC's own name such as ``mlx5_0``), the relation of
every pair (``X``, ``PIX``, ``PXB``, ``PHB``, ``NODE``, ``SYS``, ``NV#``; older drivers' ``SOC``
reads as ``SYS``), each GPU's CPU and NUMA affinity, the NIC legend, and the `topo -p2p` matrix
when the paste has one. Cells may be separated by tabs or spaces; lines before the header (a
shell prompt) and ANSI escapes are skipped.

Legend (nvidia-smi's own): PIX = at most one PCIe bridge; PXB = several bridges without the host
bridge; PHB = through a PCIe host bridge (the CPU); NODE = across host bridges within one NUMA
node; SYS = across the SMP link between NUMA nodes; NV# = a bonded set of # NVLinks.

What a paste often lacks is recovered where the matrix itself says it, each with a warning: one
missing row is its column read across (the matrix is symmetric); ``...`` standing for the
columns after the last device (the affinities) leaves those out. ``nvidia-smi -L`` lines in the
same paste (``GPU 0: NVIDIA A40 (UUID: ...)``) name each GPU's model. Anything else truncated or
malformed raises :class:`InputError` naming the file and line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from simulator.errors import InputError, cut, quoted

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_NV = re.compile(r"^NV(\d+)$")
RELATIONS = ("X", "PIX", "PXB", "PHB", "NODE", "SYS")
_OLD_NAMES = {"SOC": "SYS"}  # drivers before ~384 named the socket link SOC
_AFFINITY_HEADERS = ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID")
P2P_STATUS = ("X", "OK", "CNS", "GNS", "TNS", "NS", "U")  # `nvidia-smi topo -p2p` legend


@dataclass(frozen=True)
class TopoMatrix:
    """One `nvidia-smi topo -m` matrix."""

    devices: tuple[str, ...]  # column order
    relation: dict[tuple[str, str], str]  # (a, b) -> "PIX" | "NV4" | ... ("X" on the diagonal)
    cpu_affinity: dict[str, str] = field(default_factory=dict)  # GPU -> "0-35,72-107"
    numa_affinity: dict[str, int] = field(default_factory=dict)  # GPU -> NUMA node id
    nic_names: dict[str, str] = field(default_factory=dict)  # NIC0 -> mlx5_0
    p2p: dict[tuple[str, str], str] = field(default_factory=dict)  # `topo -p2p` status
    gpu_names: dict[str, str] = field(default_factory=dict)  # GPU0 -> "NVIDIA A40" (-L lines)
    warnings: tuple[str, ...] = ()  # what was recovered, and how

    @property
    def gpus(self) -> tuple[str, ...]:
        return tuple(d for d in self.devices if is_gpu(d))

    @property
    def nics(self) -> tuple[str, ...]:
        return tuple(d for d in self.devices if not is_gpu(d))

    def nvlinks(self, a: str, b: str) -> int:
        """NVLinks bonded between two devices (0 if their relation is PCIe)."""
        match = _NV.match(self.relation[(a, b)])
        return int(match.group(1)) if match else 0


def is_gpu(device: str) -> bool:
    return re.fullmatch(r"GPU\d+", device) is not None


_LIST = re.compile(r"^\s*GPU (\d+): (.+?)\s*(\(UUID:.*)?$")  # nvidia-smi -L


def parse(text: str, source: str = "<topo>") -> TopoMatrix:
    lines = [_ANSI.sub("", line).rstrip("\r\n") for line in text.splitlines()]
    start = _header_index(lines, source)
    header = lines[start]
    devices, affinity_headers = _columns(header, source, start + 1)
    warnings: list[str] = []
    elided = header.split()[-1:] == ["..."]  # the columns after the last device, left out
    if elided:
        affinity_headers = []
        warnings.append("the columns after the devices are abbreviated ('...'): no CPU or NUMA "
                        "affinity, sockets from which GPUs are SYS apart")
    relation: dict[tuple[str, str], str] = {}
    cpu: dict[str, str] = {}
    numa: dict[str, int] = {}
    seen: list[str] = []
    i = start + 1
    while i < len(lines) and lines[i].strip() and not _is_legend(lines[i]):
        line_no = i + 1
        tokens = lines[i].split()
        if elided and tokens[-1:] == ["..."]:
            tokens = tokens[:-1]
        if "..." in tokens:
            raise InputError("the matrix is abbreviated ('...'); paste the whole output of "
                             "`nvidia-smi topo -m`", file=source, line=line_no)
        name, cells = tokens[0], tokens[1:]
        if name not in devices:
            if seen:  # the matrix ended, something else follows (a prompt, another command)
                break
            raise InputError(f"row {quoted(name)} is not one of the header's devices",
                             file=source, line=line_no)
        if len(cells) < len(devices):
            raise InputError(f"row {cut(name)} has {len(cells)} cells for {len(devices)} devices "
                             "(truncated?)", file=source, line=line_no)
        for other, cell in zip(devices, cells, strict=False):
            relation[(name, other)] = _relation(cell, source, line_no)
        if relation[(name, name)] != "X":
            raise InputError(f"row {cut(name)}: its own column should be X, got "
                             f"{quoted(relation[(name, name)])}", file=source, line=line_no)
        extra = cells[len(devices):]
        if is_gpu(name) and extra:
            _affinity(name, extra, affinity_headers, cpu, numa)
        seen.append(name)
        i += 1
    missing = [d for d in devices if d not in seen]
    if len(missing) > 1 or (missing and not seen):
        raise InputError(f"the matrix has no row for {cut(', '.join(missing))} (truncated?)",
                         file=source, line=i + 1)
    for gone in missing:  # one row: its column, read across, says the same
        relation[(gone, gone)] = "X"
        for other in seen:
            relation[(gone, other)] = relation[(other, gone)]
        warnings.append(f"the matrix has no row for {gone}: inferred from its column (the "
                        "matrix is symmetric); its CPU and NUMA affinity are unknown")
    if not any(is_gpu(d) for d in devices):
        raise InputError("the matrix has no GPU column", file=source, line=start + 1)
    for a in devices:
        for b in devices:
            if _NV.match(relation[(a, b)]) and relation[(a, b)] != relation[(b, a)]:
                raise InputError(f"{cut(a)}-{cut(b)} is {cut(relation[(a, b)])} but "
                                 f"{cut(b)}-{cut(a)} is {cut(relation[(b, a)])}", file=source)
    rest = lines[i:]
    names = {f"GPU{m.group(1)}": m.group(2) for line in lines if (m := _LIST.match(line))}
    return TopoMatrix(tuple(devices), relation, cpu, numa, _nic_legend(rest),
                      _p2p_matrix(rest, devices, source, i),
                      {g: n for g, n in names.items() if g in devices}, tuple(warnings))


def _header_index(lines: list[str], source: str) -> int:
    for i, line in enumerate(lines):
        tokens = line.split()
        if "GPU0" in tokens and "X" not in tokens:  # a row has its own X; the header has none
            return i
    raise InputError("no `nvidia-smi topo -m` header (a line naming GPU0, GPU1, ...) found",
                     file=source, line=1)


def _columns(header: str, source: str, line_no: int) -> tuple[list[str], list[str]]:
    """Device columns and the affinity headers that follow them, in order."""
    rest = header
    found = [(rest.find(h), h) for h in _AFFINITY_HEADERS if h in rest]
    affinity = [h for _, h in sorted(found)]
    for h in affinity:
        rest = rest.replace(h, " ")
    devices = rest.split()
    if devices[-1:] == ["..."] and len(devices) > 1:  # only the trailing columns left out
        devices = devices[:-1]
    if "..." in devices:
        raise InputError("the matrix is abbreviated ('...'); paste the whole output of "
                         "`nvidia-smi topo -m`", file=source, line=line_no)
    if len(set(devices)) != len(devices):
        raise InputError("the header names a device twice", file=source, line=line_no)
    return devices, affinity


def _relation(cell: str, source: str, line_no: int) -> str:
    cell = _OLD_NAMES.get(cell, cell)
    if cell in RELATIONS or _NV.match(cell):
        return cell
    raise InputError(f"unknown relation {quoted(cell)}; expected X, PIX, PXB, PHB, NODE, SYS "
                     "or NV#", file=source, line=line_no)


def _affinity(gpu: str, extra: list[str], headers: list[str], cpu: dict[str, str],
              numa: dict[str, int]) -> None:
    values = dict(zip(headers, extra, strict=False))
    cpu_set = values.get("CPU Affinity")
    if cpu_set and cpu_set != "N/A":
        cpu[gpu] = cpu_set
    node = values.get("NUMA Affinity", "")
    if re.fullmatch(r"\d+", node):
        numa[gpu] = int(node)


def _is_legend(line: str) -> bool:
    return line.strip().startswith(("Legend", "NIC Legend"))


def _nic_legend(lines: list[str]) -> dict[str, str]:
    names: dict[str, str] = {}
    for line in lines:
        match = re.fullmatch(r"\s*(NIC\d+):\s*(\S+)\s*", line)
        if match:
            names[match.group(1)] = match.group(2)
    return names


def _p2p_matrix(lines: list[str], devices: list[str], source: str,
                offset: int) -> dict[tuple[str, str], str]:
    """The `nvidia-smi topo -p2p ...` block, if the paste has one after the legend."""
    gpus = [d for d in devices if is_gpu(d)]
    out: dict[tuple[str, str], str] = {}
    header = None
    for k, line in enumerate(lines):
        tokens = line.split()
        if header is None:
            if tokens and tokens == gpus[: len(tokens)] and len(tokens) == len(gpus):
                header = tokens
            continue
        if not tokens or tokens[0] not in header:
            if out:
                break
            continue
        for other, cell in zip(header, tokens[1:], strict=False):
            if cell not in P2P_STATUS:
                raise InputError(f"unknown P2P status {quoted(cell)}; expected one of "
                                 f"{', '.join(P2P_STATUS)}", file=source, line=offset + k + 1)
            out[(tokens[0], other)] = cell
    return out
