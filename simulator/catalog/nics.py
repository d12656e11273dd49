"""The NIC and network catalog: network cards (line rate, ports, RDMA, their PCIe slot) and what
each kind of network adds to a byte and to a message. Every number names its source.

A NIC's ``gbps`` is its line rate per port in Gb/s (what NCCL reads as the device's speed:
``speed`` Mb/s / 8000 = GB/s, ``src/graph/topo.cc`` ncclTopoAddNet); ``rdma`` says whether it
speaks verbs (InfiniBand or RoCE), which NCCL's IB transport needs (``src/transport/net_ib``);
without it NCCL uses its socket transport (``src/transport/net_socket.cc``). Whether NCCL then
uses GPUDirect RDMA is decided by nccl/net.py, not here.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from simulator.errors import InputError, quoted
from simulator.units import US


@dataclass(frozen=True)
class Nic:
    """A network card: line rate per port, ports, verbs (RDMA), and the PCIe slot it needs."""

    name: str
    gbps: float  # line rate per port, Gb/s
    ports: int
    rdma: bool  # verbs (RoCE or InfiniBand)
    pcie_gen: int
    lanes: int
    source: str
    link: str = "ethernet"  # ethernet | infiniband | vpi (either)
    total_gbps: float | None = None  # a card whose ports share less than ports x gbps

    def rate_gbps(self, ports: int) -> float:
        """Line rate of ``ports`` cabled ports, Gb/s (their share where the card caps it)."""
        rate = self.gbps * ports
        return rate if self.total_gbps is None else min(rate, self.total_gbps)


NICS: dict[str, Nic] = {n.name: n for n in (
    Nic("connectx-4", 100, 1, True, 3, 16,
        "NVIDIA ConnectX-4 VPI adapter card product brief: EDR 100 Gb/s InfiniBand or 100GbE, "
        "PCIe Gen3 x16", "vpi"),
    Nic("connectx-5", 100, 2, True, 3, 16,
        "NVIDIA ConnectX-5 VPI product brief: up to 100 Gb/s per port, two ports, PCIe Gen3 "
        "x16 (Gen4 on the Ex variant)", "vpi"),
    Nic("connectx-6", 200, 1, True, 4, 16,
        "NVIDIA ConnectX-6 VPI product brief: HDR 200 Gb/s InfiniBand or 200GbE, PCIe Gen4 x16",
        "vpi"),
    Nic("connectx-6-dx", 100, 2, True, 4, 16,
        "NVIDIA ConnectX-6 Dx Ethernet product brief: two 100GbE ports (RoCE), PCIe Gen4 x16"),
    Nic("connectx-6-lx", 25, 2, True, 4, 8,
        "NVIDIA ConnectX-6 Lx Ethernet product brief: two 25GbE ports (RoCE), PCIe Gen4 x8"),
    Nic("connectx-7", 400, 1, True, 5, 16,
        "NVIDIA ConnectX-7 product brief: NDR 400 Gb/s InfiniBand or 400GbE, PCIe Gen5 x16; "
        "the single-port card of DGX H100 (DGX H100 user guide)", "vpi"),
    Nic("bluefield-2", 100, 2, True, 4, 16,
        "NVIDIA BlueField-2 DPU product brief: two 100 Gb/s ports (Ethernet or InfiniBand), "
        "PCIe Gen4 x16", "vpi"),
    Nic("bluefield-3", 400, 1, True, 5, 16,
        "NVIDIA BlueField-3 DPU product brief: 400 Gb/s (one port), PCIe Gen5 x16", "vpi"),
    Nic("intel-e810-cqda2", 100, 2, True, 4, 16,
        "Intel Ethernet Network Adapter E810-CQDA2 product brief: two 100GbE ports sharing "
        "100 Gb/s, RDMA over RoCEv2 and iWARP, PCIe Gen4 x16", total_gbps=100),
    Nic("intel-e810-xxvda2", 25, 2, True, 4, 8,
        "Intel Ethernet Network Adapter E810-XXVDA2 product brief: two 25GbE ports, RoCEv2 and "
        "iWARP, PCIe Gen4 x8"),
    Nic("onboard-10gbe", 10, 2, False, 3, 8,
        "two 10GBASE-T ports on the board of dual-socket 8-GPU servers (Intel X710-AT2 class: "
        "no verbs), PCIe Gen3 x8; server vendors' spec pages, check your own board"),
    Nic("onboard-25gbe", 25, 2, False, 3, 8,
        "two 25GbE SFP28 ports on a board or OCP 3.0 mezzanine (Broadcom BCM57414 / Intel X710 "
        "class), PCIe Gen3 x8; RoCE not set up (set rdma: true if you configured it)"),
    Nic("onboard-100gbe", 100, 2, False, 4, 16,
        "two 100GbE QSFP28 ports on an OCP 3.0 mezzanine (Broadcom BCM57508 class: RoCE capable "
        "but not set up; set rdma: true if you configured it), PCIe Gen4 x16"),
)}

# Network kinds: how their frames carry a payload, and the one-way latency of a message across a
# non-blocking switch (NIC to NIC, without NCCL's own handoffs, which are wire.py's).
#
# Bytes on the wire around each packet's payload:
# - InfiniBand (4096-byte MTU): LRH 8 + BTH 12 + ICRC 4 + VCRC 2 = 26 (IBTA spec vol. 1 ch. 7, 9);
# - RoCEv2: preamble + inter-frame gap 20, Ethernet 14 + FCS 4, IPv4 20, UDP 8, BTH 12, ICRC 4 =
#   82 (IEEE 802.3; IBTA RoCEv2 annex A17); the RoCE MTU is the largest of 256 .. 4096 that fits
#   the Ethernet MTU with the 44 bytes of IP, UDP, BTH and ICRC (1024 at Linux's default 1500,
#   4096 with jumbo frames);
# - TCP over Ethernet: preamble + gap 20, Ethernet 14 + FCS 4 around each frame, IPv4 20 + TCP 20
#   + 12 of timestamps (on by default in Linux, RFC 7323) inside it.
DEFAULT_MTU = 1500  # Linux's Ethernet default (ip link); jumbo frames are a switch setting
IB_MTU = 4096
ROCE_MTUS = (4096, 2048, 1024, 512, 256)


def frame_efficiency(kind: str, mtu: int | None = None) -> float:
    """Payload share of the line rate for a network kind at an Ethernet MTU (bytes)."""
    if kind == "infiniband":
        return IB_MTU / (IB_MTU + 26)
    mtu = mtu or DEFAULT_MTU
    if kind == "roce":
        payload = next((m for m in ROCE_MTUS if m + 44 <= mtu), ROCE_MTUS[-1])
        return payload / (payload + 82)
    return (mtu - 52) / (mtu + 38)


# One-way latency through one switch (NIC, wire, switch, wire, NIC). InfiniBand: Quantum switch
# port-to-port 130 ns (NVIDIA QM8700 datasheet) plus two HCAs about 0.4 us each (ib_write_lat
# about 1 us back to back on ConnectX-6, perftest's published runs): 1.0 us. RoCE: Spectrum
# switches add about 0.3-0.5 us over IB's (NVIDIA SN2000/SN3000 datasheets): 1.5 us. Plain
# Ethernet through the kernel: the wire and a store-and-forward switch about 2 us; the socket
# stack's own cost per message is NCCL's socket step (wire.py net_sync_us). Uncertain to
# about +-50%: only small messages feel them.
NETWORK_LATENCY_US = {"infiniband": 1.0, "roce": 1.5, "ethernet": 2.0}
NETWORK_KINDS = tuple(NETWORK_LATENCY_US)


def nic(name: str) -> Nic:
    try:
        return NICS[name]
    except KeyError:
        raise InputError(f"unknown NIC {quoted(name)}; catalog: {', '.join(sorted(NICS))}") \
            from None


# A NIC given by its numbers alone (no catalog `model`): a PCIe Gen4 x16 card, one port.
CUSTOM_PCIE = (4, 16)


def resolve(model: str | None, gbps: float | None, rdma: bool | None) -> Nic:
    """A topology's nic node as a catalog entry with its own numbers applied."""
    base = nic(model) if model is not None else Nic(
        "custom", gbps or 0.0, 1, bool(rdma), *CUSTOM_PCIE,
        f"given by its numbers (a PCIe Gen{CUSTOM_PCIE[0]} x{CUSTOM_PCIE[1]} card assumed)")
    if gbps is not None:
        base = replace(base, gbps=gbps)
    return base if rdma is None else replace(base, rdma=rdma)


def network_latency(kind: str) -> float:
    """The default one-way latency of a network kind, seconds."""
    return NETWORK_LATENCY_US[kind] * US
