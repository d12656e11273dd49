"""Read NCCL's topology XML (``NCCL_TOPO_DUMP_FILE``, or a hand-written ``NCCL_TOPO_FILE``).

The format, as NCCL writes and reads it (src/graph/xml.cc ncclTopoDumpXmlRec, src/graph/topo.cc
ncclTopoAddCpu / ncclTopoAddPci / ncclTopoAddNvLinks): ``<system>`` holds one ``<cpu>`` per NUMA
node (``numaid``, ``arch``, ``vendor``, ``familyid``, ``modelid``); under it nested ``<pci>``
nodes (``busid``, ``class``, ``link_speed`` like ``"16.0 GT/s PCIe"``, ``link_width``): class
0x0604 is a PCIe bridge (a switch), 0x03.... a GPU (a ``<gpu dev sm rank>`` child, with
``<nvlink target count tclass>`` children: tclass 0x068000 is an NVSwitch, 0x03.... a GPU),
0x02.... a NIC (``<nic><net name speed>``); a ``<nic>`` straight under a ``<cpu>`` is a NIC NCCL
found no PCI path for.

``parse(text, source)`` returns an :class:`NcclSystem`: CPUs and the PCI tree with the facts
stepsim uses (PCIe generation and width of each link, NVLink counts, the CPU generation).
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass, field

from simulator.errors import InputError, cut, quoted

# topo.cc kvDictPciGen: link_speed string -> PCIe generation (GT/s per lane)
PCI_GEN = {"2.5": 1, "5": 2, "5.0": 2, "8": 3, "8.0": 3, "16": 4, "16.0": 4, "32": 5,
           "32.0": 5, "64": 6, "64.0": 6}
BRIDGE_CLASS = "0x0604"  # PCI_BRIDGE_DEVICE_CLASS 0x060400
NVSWITCH_CLASS = "0x0680"  # PCI_NVSWITCH_CLASS 0x068000
GPU_CLASS, NIC_CLASS = "0x03", "0x02"  # topo.cc kvDictPciClass prefixes


@dataclass
class PciNode:
    """A PCI device or bridge of NCCL's tree: kind "switch" | "gpu" | "nic" | "other"."""

    busid: str
    kind: str
    gen: int | None  # PCIe generation of its link to the parent (None: not given)
    width: int | None  # lanes of that link (NCCL reads 0 as 16)
    children: list[PciNode] = field(default_factory=list)
    sm: int | None = None  # gpu: compute capability
    rank: int | None = None  # gpu: NCCL rank in the dump
    nvlinks: list[tuple[str, int, str]] = field(default_factory=list)  # (target, count, class)
    nic_name: str | None = None
    nic_facts: dict[str, float | bool] = field(default_factory=dict)  # net_facts()


@dataclass
class Cpu:
    numaid: int
    arch: str | None
    vendor: str | None
    familyid: int | None
    modelid: int | None
    children: list[PciNode] = field(default_factory=list)
    nics: list[str] = field(default_factory=list)  # NICs without a PCI path
    nic_facts: dict[str, dict[str, float | bool]] = field(default_factory=dict)  # by name

    @property
    def model(self) -> str | None:
        """The socket-link catalog name for this CPU (topo.cc ncclTopoAddCpu's Intel rule)."""
        if self.vendor == "AuthenticAMD":
            return "amd-xgmi"
        if self.vendor != "GenuineIntel" or self.familyid != 6 or self.modelid is None:
            return None
        if self.modelid >= 0xCF:
            return "emerald-rapids-upi"
        if self.modelid >= 0x8F:
            return "sapphire-rapids-upi"
        return "skylake-upi" if self.modelid >= 0x55 else "broadwell-qpi"


@dataclass
class NcclSystem:
    cpus: list[Cpu]

    def gpus(self) -> list[PciNode]:
        """GPUs in NCCL rank order when the dump has ranks, else in PCI bus id order (the
        order nvidia-smi and CUDA_DEVICE_ORDER=PCI_BUS_ID number them)."""
        found = [n for cpu in self.cpus for n in _walk(cpu.children) if n.kind == "gpu"]
        if all(g.rank is not None for g in found):
            return sorted(found, key=lambda g: g.rank or 0)
        return sorted(found, key=lambda g: g.busid.lower())


def _walk(nodes: list[PciNode]) -> list[PciNode]:
    out: list[PciNode] = []
    for node in nodes:
        out.append(node)
        out.extend(_walk(node.children))
    return out


def parse(text: str, source: str = "<xml>") -> NcclSystem:
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        line = exc.position[0] if exc.position else None
        raise InputError(f"not valid XML ({exc.msg if hasattr(exc, 'msg') else exc})",
                         file=source, line=line) from None
    if root.tag != "system":
        raise InputError(f"expected NCCL's <system> root element, found <{cut(root.tag)}>",
                         file=source)
    cpus = [_cpu(el, source) for el in root if el.tag == "cpu"]
    if not cpus:
        raise InputError("no <cpu> element under <system>", file=source)
    system = NcclSystem(cpus)
    if not system.gpus():
        raise InputError("no GPU in the topology (no <pci> of class 0x03...)", file=source)
    return system


def _int(el: ET.Element, key: str, source: str) -> int | None:
    value = el.get(key)
    if value is None or value == "":
        return None
    try:
        return int(value, 0)
    except ValueError:
        raise InputError(f"<{cut(el.tag)}> {key}={quoted(value)} is not a number",
                         file=source) from None


def _cpu(el: ET.Element, source: str) -> Cpu:
    numaid = _int(el, "numaid", source)
    cpu = Cpu(numaid if numaid is not None else -1, el.get("arch"), el.get("vendor"),
              _int(el, "familyid", source), _int(el, "modelid", source))
    for child in el:
        if child.tag == "pci":
            cpu.children.append(_pci(child, source))
        elif child.tag == "nic":
            for net in (n for n in child if n.tag == "net"):
                cpu.nics.append(net.get("name", "nic"))
                cpu.nic_facts[cpu.nics[-1]] = net_facts(net, "", source)
    return cpu


# verbs devices' names (rdma-core providers): Mellanox/NVIDIA, Broadcom, Intel, Marvell
VERBS_PREFIXES = ("mlx", "bnxt_re", "irdma", "qedr", "ib")
IB_CLASS = "0x0207"  # PCI class 0x0207: InfiniBand controller


def net_facts(net: ET.Element, pci_class: str, source: str) -> dict[str, float | bool]:
    """A <net>'s line rate (``speed`` Mb/s, topo.cc) and whether it speaks verbs (an
    InfiniBand controller, a verbs device's name, or GDR, which only the IB plugin reports)."""
    facts: dict[str, float | bool] = {}
    speed = _int(net, "speed", source)
    if speed is not None and speed > 0:
        facts["gbps"] = speed / 1000
    name = net.get("name", "")
    facts["rdma"] = pci_class.startswith(IB_CLASS) or name.startswith(VERBS_PREFIXES) or \
        net.get("gdr") == "1"
    return facts


def _pci(el: ET.Element, source: str) -> PciNode:
    busid = el.get("busid")
    if not busid:
        raise InputError("a <pci> element has no busid", file=source)
    cls = el.get("class", "")
    gpu = el.find("gpu")
    nic = el.find("nic")
    if gpu is not None or cls.startswith(GPU_CLASS):
        kind = "gpu"
    elif nic is not None or cls.startswith(NIC_CLASS):
        kind = "nic"
    elif cls.startswith(BRIDGE_CLASS) or any(c.tag == "pci" for c in el):
        kind = "switch"
    else:
        kind = "other"
    speed = (el.get("link_speed") or "").split(" ")[0]
    if speed and speed not in PCI_GEN:
        raise InputError(f"<pci busid={quoted(busid)}> link_speed "
                         f"{quoted(el.get('link_speed'))} is not a PCIe rate NCCL knows "
                         "(2.5 .. 64 GT/s)", file=source)
    width = _int(el, "link_width", source)
    node = PciNode(busid, kind, PCI_GEN.get(speed), 16 if width == 0 else width)  # topo.cc: 0 -> 16
    if gpu is not None:
        node.sm, node.rank = _int(gpu, "sm", source), _int(gpu, "rank", source)
        for link in gpu.findall("nvlink"):
            count = _int(link, "count", source) or 0
            node.nvlinks.append((link.get("target", ""), count, link.get("tclass", "")))
    if nic is not None:
        net = nic.find("net")
        node.nic_name = net.get("name") if net is not None else None
        if net is not None:
            node.nic_facts = net_facts(net, cls, source)
    elif kind == "nic" and cls.startswith(IB_CLASS):
        node.nic_facts = {"rdma": True}
    node.children = [_pci(c, source) for c in el if c.tag == "pci"]
    return node
