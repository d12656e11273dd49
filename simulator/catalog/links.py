"""The link catalog: PCIe generations, NVLink generations, socket links (QPI, UPI, xGMI), host
memory and network defaults. Every number names its source.

Two kinds of bandwidth live here and must not be mixed up:
- *physical* capacity (what bytes really get through), used by the fabric;
- *NCCL's* belief (``topo.h`` constants), used only where NCCL's own decisions are reproduced
  (path ranking, ring search, channel count, protocol choice).
Bandwidths are bytes/s (1 GB/s = 1e9 B/s), times are seconds.
"""

from __future__ import annotations

from dataclasses import dataclass

from simulator.errors import InputError
from simulator.units import GB, US

# PCIe raw rate per lane per direction, bytes/s, after line encoding (PCI-SIG specs:
# Gen3 8 GT/s 128b/130b, Gen4 16 GT/s, Gen5 32 GT/s, Gen6 64 GT/s).
PCIE_RAW_PER_LANE = {3: 8e9 * 128 / 130 / 8, 4: 16e9 * 128 / 130 / 8,
                     5: 32e9 * 128 / 130 / 8, 6: 64e9 / 8}
# Share of the raw rate that carries payload (TLP headers, DLLP, flow control at 256-byte
# max payload). Checked against measured pinned copies: Gen3 x16 13.2 GB/s (2x2080ti dataset:
# 13.2 / 15.75 = 0.84) and Gen5 x16 55.4 GB/s (8xh200 dataset: 55.4 / 63.0 = 0.88).
PCIE_PAYLOAD_EFFICIENCY = 0.86
PCIE_HOP_LATENCY = 0.2 * US  # dual-turin dataset: GPU-GPU P2P 0.36-0.44 us over two hops


def pcie_bandwidth(gen: int, lanes: int) -> float:
    if gen not in PCIE_RAW_PER_LANE:
        raise InputError(f"unknown PCIe generation {gen}; known: 3, 4, 5, 6")
    return PCIE_RAW_PER_LANE[gen] * lanes * PCIE_PAYLOAD_EFFICIENCY


def nccl_pcie_bandwidth(gen: int, lanes: int) -> float:
    """NCCL's belief: width x per-lane speed / 80 GB/s (topo.cc): Gen3 x16 = 12, Gen5 x16 = 48."""
    per_lane = {1: 15, 2: 30, 3: 60, 4: 120, 5: 240, 6: 480}[gen]
    return lanes * per_lane / 80 * GB


# NVLink, bytes/s per link per direction. Physical: NVIDIA NVLink pages (NVLink2/3/4 25 GB/s,
# NVLink5 50 GB/s; GA102 bridge 56.25 GB/s over 4 links = 14.06). NCCL's: topo.h SM*_NVLINK_BW.
NVLINK_PER_LINK = {"volta": 25 * GB, "ampere": 25 * GB, "hopper": 25 * GB,
                   "blackwell": 50 * GB, "ampere-ga102": 14.0625 * GB}
NCCL_NVLINK_PER_LINK = {70: 20 * GB, 80: 20 * GB, 86: 12 * GB, 89: 12 * GB,
                        90: 20.6 * GB, 100: 40.1 * GB, 120: 40.1 * GB}
NVLINK_HOP_LATENCY = 0.25 * US  # assumption: NVLink hop is comparable to a PCIe switch hop


@dataclass(frozen=True)
class SocketLink:
    """The link between two CPU sockets (QPI, UPI, Infinity Fabric): rates and latency."""

    name: str
    bandwidth: float  # B/s per direction: the links' raw rate (protocol overhead not modelled)
    nccl_bandwidth: float  # what NCCL's topology code assigns to it (topo.h), for its search
    latency: float
    source: str


# Inter-socket links of a two-socket server. Physical: links x transfers/s x 2 bytes each way
# (Intel QPI/UPI: 20-lane links move 2 bytes per transfer per direction; AMD xGMI: x16 links).
# NCCL believes much less (it models cross-socket GPU peer traffic); two measurements say the
# physical rate is what staged traffic sees: dual-turin cross-NUMA P2P 50-51 GB/s against
# NCCL's 16, and a100-nvlink-pair-then-sys 20 GB/s busbw across the socket link against its 10.
# Latency, one way, beyond the PCIe hops on either side, from published measurements:
# - xGMI: GPU P2P write latency on dual EPYC Turin (voipmonitor/rtx6kpro hardware/pcie-bandwidth
#   .md, purplepow3r's p2pBandwidthLatencyTest matrix): cross-NUMA pairs 0.36-0.44 us, mean
#   0.393, same-NUMA 0.36-0.38, mean 0.368: the socket link adds 0.025 us;
# - QPI/UPI: Intel Memory Latency Checker on Xeon E7-4800 (Intel blog "Memory Latencies on Intel
#   Xeon Processor E5-4600 and E7-4800 product families", 2014-01-28): a load from the other
#   socket's memory takes 194-202 ns against 135 ns locally, about 60 ns more for a round trip
#   over one QPI hop: 0.03 us one way. No newer published figure per UPI generation was found.
_XGMI_HOP = (0.393 - 0.368) * US
_UPI_HOP = 0.03 * US
SOCKET_LINKS: dict[str, SocketLink] = {s.name: s for s in (
    SocketLink("broadwell-qpi", 2 * 9.6e9 * 2, 6 * GB, _UPI_HOP,
               "Xeon E5 v4: 2 QPI links at 9.6 GT/s; NCCL topo.h BDW_QPI_BW"),
    SocketLink("skylake-upi", 3 * 10.4e9 * 2, 10 * GB, _UPI_HOP,
               "Xeon Scalable Gold/Platinum: 3 UPI links at 10.4 GT/s; NCCL topo.h SKL_QPI_BW"),
    SocketLink("sapphire-rapids-upi", 3 * 16e9 * 2, 22 * GB, _UPI_HOP,
               "4th-gen Xeon Gold: 3 UPI 2.0 links at 16 GT/s (Platinum has 4); "
               "NCCL topo.h SRP_QPI_BW"),
    SocketLink("emerald-rapids-upi", 3 * 20e9 * 2, 40 * GB, _UPI_HOP,
               "5th-gen Xeon Gold: 3 UPI 2.0 links at 20 GT/s; NCCL topo.h ERP_QPI_BW"),
    SocketLink("ice-lake-upi", 3 * 11.2e9 * 2, 10 * GB, _UPI_HOP,
               "3rd-gen Xeon Gold: 3 UPI links at 11.2 GT/s; NCCL topo.h SKL_QPI_BW (model 0x6A "
               "is above SKL's 0x55, below SRP's 0x8F)"),
    SocketLink("granite-rapids-upi", 6 * 24e9 * 2, 22 * GB, _UPI_HOP,
               "Xeon 6900P: 6 UPI 2.0 links at 24 GT/s; NCCL topo.h SRP_QPI_BW (model 0xAD is "
               "above SRP's 0x8F, below ERP's 0xCF)"),
    SocketLink("amd-xgmi", 3 * 32e9 * 16 / 8, 16 * GB, _XGMI_HOP,
               "EPYC 9004/9005: 3 xGMI x16 links at 32 Gb/s per lane (the 4th often serves "
               "PCIe); NCCL topo.h AMD_BW"),
    SocketLink("amd-xgmi2", 4 * 16e9 * 16 / 8, 16 * GB, _XGMI_HOP,
               "EPYC 7002/7003: 4 xGMI x16 links at 16 Gb/s per lane; NCCL topo.h AMD_BW"),
)}
DEFAULT_SOCKET_LINK = {"upi": "sapphire-rapids-upi", "xgmi": "amd-xgmi"}


def socket_link(name: str) -> SocketLink | None:
    """A socket link by its own name, or by the name of a CPU family (cpus.py) that has it."""
    from simulator.catalog.cpus import CPUS

    if name in CPUS:
        return SOCKET_LINKS[CPUS[name].socket_link]
    return SOCKET_LINKS.get(name)

# Host memory bandwidth per socket available to staged copies, when the topology gives none:
# 8 channels of DDR5-4800 = 307 GB/s peak; STREAM-copy reaches about 80% of peak.
DEFAULT_HOST_MEMORY_BANDWIDTH = 250 * GB
NETWORK_DEFAULT_BANDWIDTH = 12.5 * GB  # 100 Gbit/s NIC (NCCL topo.h NET_BW is 12)
NETWORK_LATENCY = 2.0 * US
