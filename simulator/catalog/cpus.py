"""The CPU catalog: server and workstation CPU families by vendor, each with the link between its
sockets (a name in links.SOCKET_LINKS) and its host memory, every number with its source.

A topology's cpu node may name a family here as its ``model`` (or a socket link directly);
`stepsim topo import --cpu NAME` writes the family's socket link and memory bandwidth. Memory:
channels x transfer rate x 8 bytes is the peak per socket (the vendor's product pages); what
staged copies reach is taken as 80% of it, the share links.DEFAULT_HOST_MEMORY_BANDWIDTH assumes
(STREAM copy on a fully populated socket). A socket with fewer DIMMs than channels has less:
set ``memory_bandwidth_gb_per_s`` on its node.
"""

from __future__ import annotations

from dataclasses import dataclass

from simulator.errors import InputError
from simulator.units import GB

STREAM_SHARE = 0.8  # as links.DEFAULT_HOST_MEMORY_BANDWIDTH: 250 of 307 GB/s


@dataclass(frozen=True)
class CPU:
    """One CPU family: its vendor, the link between its sockets and its memory per socket."""

    name: str
    vendor: str  # amd | intel (NCCL's CPU vendor classes, topo.cc ncclTopoGetInterCpuBw)
    family: str  # in words
    socket_link: str  # links.SOCKET_LINKS name
    memory_channels: int  # DDR channels per socket
    memory_mts: int  # DDR transfers per second (MT/s) at the family's rated speed
    source: str

    @property
    def memory_bandwidth(self) -> float:
        """What staged copies reach from one socket's memory, B/s."""
        return STREAM_SHARE * self.memory_channels * self.memory_mts * 1e6 * 8

    @property
    def memory_gb_per_s(self) -> float:
        return self.memory_bandwidth / GB


CPUS: dict[str, CPU] = {c.name: c for c in (
    CPU("amd-epyc-7002", "amd", "AMD EPYC 7002 (Rome)", "amd-xgmi2", 8, 3200,
        "AMD EPYC 7002 product pages: 8 channels DDR4-3200, 4 xGMI links"),
    CPU("amd-epyc-7003", "amd", "AMD EPYC 7003 (Milan)", "amd-xgmi2", 8, 3200,
        "AMD EPYC 7003 product pages: 8 channels DDR4-3200, 4 xGMI links"),
    CPU("amd-epyc-9004", "amd", "AMD EPYC 9004 (Genoa)", "amd-xgmi", 12, 4800,
        "AMD EPYC 9004 product pages: 12 channels DDR5-4800, up to 4 xGMI3 links"),
    CPU("amd-epyc-9005", "amd", "AMD EPYC 9005 (Turin)", "amd-xgmi", 12, 6400,
        "AMD EPYC 9005 product pages: 12 channels DDR5-6400, up to 4 xGMI3 links"),
    CPU("amd-threadripper-3000", "amd", "AMD Ryzen Threadripper 3000 (TRX40)", "amd-xgmi", 4,
        3200, "AMD Ryzen Threadripper 3000 product pages: 4 channels DDR4-3200, one socket"),
    CPU("amd-threadripper-pro-3000", "amd", "AMD Ryzen Threadripper PRO 3000WX (WRX80)",
        "amd-xgmi", 8, 3200,
        "AMD Threadripper PRO 3000WX product pages: 8 channels DDR4-3200, one socket"),
    CPU("amd-threadripper-pro-5000", "amd", "AMD Ryzen Threadripper PRO 5000WX (WRX80)",
        "amd-xgmi", 8, 3200,
        "AMD Threadripper PRO 5000WX product pages: 8 channels DDR4-3200, one socket"),
    CPU("amd-threadripper-7000", "amd", "AMD Ryzen Threadripper 7000 (TRX50)", "amd-xgmi", 4,
        5200, "AMD Threadripper 7000 product pages: 4 channels DDR5-5200, one socket"),
    CPU("amd-threadripper-pro-7000", "amd", "AMD Ryzen Threadripper PRO 7000WX (WRX90)",
        "amd-xgmi", 8, 5200,
        "AMD Threadripper PRO 7000WX product pages: 8 channels DDR5-5200, one socket"),
    CPU("intel-xeon-broadwell", "intel", "Intel Xeon E5 v4 (Broadwell)", "broadwell-qpi", 4, 2400,
        "Intel ark, Xeon E5-2600 v4: 4 channels DDR4-2400, 2 QPI links at 9.6 GT/s"),
    CPU("intel-xeon-skylake", "intel", "Intel Xeon Scalable 1st gen (Skylake-SP)",
        "skylake-upi", 6, 2666,
        "Intel ark, Xeon Gold 6100: 6 channels DDR4-2666, 3 UPI links at 10.4 GT/s"),
    CPU("intel-xeon-cascade-lake", "intel", "Intel Xeon Scalable 2nd gen (Cascade Lake)",
        "skylake-upi", 6, 2933,
        "Intel ark, Xeon Gold 6200: 6 channels DDR4-2933, 3 UPI links at 10.4 GT/s"),
    CPU("intel-xeon-ice-lake", "intel", "Intel Xeon Scalable 3rd gen (Ice Lake-SP)",
        "ice-lake-upi", 8, 3200,
        "Intel ark, Xeon Gold 6300: 8 channels DDR4-3200, 3 UPI links at 11.2 GT/s"),
    CPU("intel-xeon-sapphire-rapids", "intel", "Intel Xeon Scalable 4th gen (Sapphire Rapids)",
        "sapphire-rapids-upi", 8, 4800,
        "Intel ark, Xeon Gold 6400: 8 channels DDR5-4800, 3 UPI 2.0 links at 16 GT/s"),
    CPU("intel-xeon-emerald-rapids", "intel", "Intel Xeon Scalable 5th gen (Emerald Rapids)",
        "emerald-rapids-upi", 8, 5600,
        "Intel ark, Xeon Gold 6500: 8 channels DDR5-5600, 3 UPI 2.0 links at 20 GT/s"),
    CPU("intel-xeon-granite-rapids", "intel", "Intel Xeon 6 (Granite Rapids, 6900P)",
        "granite-rapids-upi", 12, 6400,
        "Intel ark, Xeon 6900P: 12 channels DDR5-6400, 6 UPI 2.0 links at 24 GT/s"),
)}

# What an import assumes when nothing names the CPU: the catalog's default socket link's family.
DEFAULT_CPU = "intel-xeon-sapphire-rapids"


def cpu(name: str) -> CPU:
    try:
        return CPUS[name]
    except KeyError:
        raise InputError(f"unknown CPU {name!r}; catalog: {', '.join(CPUS)}") from None


def from_cpuid(vendor: str | None, family: int | None, model: int | None) -> CPU | None:
    """The family of an x86 CPUID vendor, family and model (what NCCL's topology XML records):
    AMD family 0x17 model >= 0x30 Rome, 0x19 model < 0x10 Milan, 0x19 >= 0x10 Genoa, 0x1A
    Turin (AMD's processor programming references); Intel family 6 models 0x4F Broadwell, 0x55
    Skylake/Cascade Lake, 0x6A Ice Lake, 0x8F Sapphire Rapids, 0xCF Emerald Rapids, 0xAD/0xAE
    Granite Rapids (Intel's model numbers, as topo.cc compares them). None: not known."""
    if vendor == "AuthenticAMD" and family is not None:
        if family == 0x1A:
            return CPUS["amd-epyc-9005"]
        if family == 0x19 and model is not None:
            return CPUS["amd-epyc-9004" if model >= 0x10 else "amd-epyc-7003"]
        if family == 0x17 and model is not None and model >= 0x30:
            return CPUS["amd-epyc-7002"]
        return None
    if vendor == "GenuineIntel" and family == 6 and model is not None:
        names = {0x4F: "intel-xeon-broadwell", 0x55: "intel-xeon-cascade-lake",
                 0x6A: "intel-xeon-ice-lake", 0x8F: "intel-xeon-sapphire-rapids",
                 0xCF: "intel-xeon-emerald-rapids", 0xAD: "intel-xeon-granite-rapids",
                 0xAE: "intel-xeon-granite-rapids"}
        return CPUS.get(names.get(model, ""))
    return None
