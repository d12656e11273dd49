"""Where each fitted parameter may lie, from what it means, and where a fit starts.

A fit stays inside physical bounds and says when it ends on one (the rows want what the model
cannot give: another transport, another topology, a mechanism the model lacks):

- an efficiency is a share of a link's payload rate: in (0, 1];
- a per-step synchronisation is time beyond the route's link latencies, which are already the
  physical floor of a step: at least 0;
- a call is at least one kernel launch: back-to-back launches cost 0.9 us beyond the kernel
  (NVIDIA, "Getting Started with CUDA Graphs", 2019: 3.8 us a launch for a 2.9 us kernel);
- host memory is at most its spec: the CPU family's channels x rate x 8 bytes (catalog/cpus.py;
  a node naming no family is taken as the catalog's default family), or the node's own figure
  where it gives a higher one;
- a socket link at most its spec (catalog/links.py), a channel at most the fastest PCIe link of
  the box (one thread block moves no more than the link it stores over);
- between boxes: NET/IB's efficiency is a share of the network link, one TCP stream moves at
  most the network port's payload rate, and NET/IB's step sync is a latency like the others.
Latencies have no physical ceiling; 500 us a step (and a call) is beyond any published row.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np

from simulator.catalog import cpus as cpu_catalog
from simulator.catalog import links as link_catalog
from simulator.nccl import wire
from simulator.nccl.communicator import Communicator
from simulator.units import GB

CALL_FLOOR_US = 3.8 - 2.9  # a kernel launch beyond its kernel (CUDA Graphs blog)
LATENCY_CEILING_US = 500.0
SHARE_FLOOR = 1e-3  # an efficiency above 0: a thousandth of the link


@dataclass(frozen=True)
class Bound:
    low: float
    high: float
    low_means: str  # what reaching the bound says
    high_means: str

    def where(self, value: float) -> Literal["floor", "ceiling"] | None:
        """"floor" or "ceiling" when ``value`` sits on a bound (to 0.1%), else None."""
        span = max(abs(self.high - self.low), 1e-12)
        if value <= self.low + 1e-3 * min(span, abs(self.low) + 1e-3):
            return "floor"
        if value >= self.high - 1e-3 * min(span, abs(self.high)):
            return "ceiling"
        return None

    def text(self, unit: str) -> str:
        low = "(0" if self.low in (SHARE_FLOOR,) else f"[{self.low:.4g}"
        return f"{low}, {self.high:.4g}]" + (f" {unit}" if unit else "")


def bounds(comm: Communicator) -> dict[str, Bound]:
    """Every parameter's physical bounds on this machine."""
    m = comm.machine
    share = Bound(SHARE_FLOOR, 1.0, "the rows move almost nothing over it",
                  "the rows move more than the whole link: another transport or topology?")
    sync = Bound(0.0, LATENCY_CEILING_US, "the route's link latencies alone explain the rows",
                 "steps slower than any published one")
    pcie = [lk.capacity for lk in m.links.values() if lk.kind == "pcie"]
    channel = Bound(0.1, max(pcie, default=1e12) / GB, "a channel moves almost nothing",
                    "one channel would move a whole PCIe link")
    sockets = [lk for lk in m.links.values() if lk.kind in ("upi", "xgmi")]
    network = [lk.capacity for lk in m.links.values() if lk.kind == "network"]
    socket_spec = max((lk.capacity for lk in sockets), default=0.0) / GB
    return {
        "p2p_pcie_simple_efficiency": share, "nvlink_simple_efficiency": share,
        "shm_pcie_efficiency": share,
        "host_memory_gb_per_s": Bound(1.0, _memory_spec(comm), "host memory nearly stalls",
                                      "more than the CPU's memory channels deliver"),
        "socket_link_gb_per_s": Bound(1.0, max(socket_spec, 1.0), "the socket link stalls",
                                      "more than the socket link's spec"),
        "simple_channel_cap_gbps": channel, "ll_channel_cap_gbps": channel,
        "p2p_simple_sync_us": sync, "p2p_ll_sync_us": sync, "shm_simple_sync_us": sync,
        "shm_ll_sync_us": sync, "net_sync_us": sync, "net_ib_sync_us": sync,
        "net_efficiency": share,
        # one TCP stream moves at most the fastest network port it leaves by
        "socket_stream_gbps": Bound(0.05, max(max(network, default=0.0) / GB, 0.05),
                                    "a TCP stream nearly stalls",
                                    "one stream would fill the whole network port"),
        "call_latency_us": Bound(CALL_FLOOR_US, LATENCY_CEILING_US,
                                 "a call no slower than a bare kernel launch",
                                 "calls slower than any published one"),
    }


def _memory_spec(comm: Communicator) -> float:
    """GB/s: the peak of the fastest socket, from its CPU family (or its own higher figure)."""
    m = comm.machine
    peaks = []
    for node in (n for n in m.config.nodes if n.kind == "cpu"):
        family = cpu_catalog.CPUS.get(node.model or "")
        if family is None:  # a socket link, or nothing: the widest family with that link
            same = [c for c in cpu_catalog.CPUS.values()
                    if node.model in (None, c.socket_link)] or \
                [cpu_catalog.CPUS[cpu_catalog.DEFAULT_CPU]]
            family = max(same, key=lambda c: c.memory_bandwidth)
        peak = family.memory_bandwidth / cpu_catalog.STREAM_SHARE / GB
        peaks.append(max(peak, m.links[f"mem:{node.id}"].capacity / GB))
    return max(peaks, default=link_catalog.DEFAULT_HOST_MEMORY_BANDWIDTH / GB)


def start(comm: Communicator, name: str) -> float | None:
    """Where the fit starts: the wire's value (the links' own for host memory and socket links,
    the links' generations' share for Simple P2P); None where stepsim sets none (no cap)."""
    machine = comm.machine
    value = comm.wire.value(name)
    if name == "p2p_pcie_simple_efficiency" and value is None:
        gens = sorted({g for lid in machine.links if (g := comm.pcie_generation(lid))})
        return float(np.mean([wire.p2p_link_efficiency(comm.wire, g) for g in gens])) \
            if gens else None
    kinds = {"host_memory_gb_per_s": ("memory",), "socket_link_gb_per_s": ("upi", "xgmi")}
    if name in kinds:
        caps = [lk.capacity / GB for lk in machine.links.values() if lk.kind in kinds[name]]
        return float(np.mean(caps)) if caps else None
    return value if value is not None and math.isfinite(value) else None


def at(comm: Communicator, params: dict[str, float]) -> Communicator:
    """NCCL over the machine with these parameter values; host memory and socket links take
    theirs as link capacities."""
    w = replace(comm.wire, **params)
    machine = comm.machine
    links = dict(machine.links)
    for lid, link in machine.links.items():
        if link.kind == "memory" and w.host_memory_gb_per_s is not None:
            links[lid] = replace(link, capacity=w.host_memory_gb_per_s * GB)
        if link.kind in ("upi", "xgmi") and w.socket_link_gb_per_s is not None:
            links[lid] = replace(link, capacity=w.socket_link_gb_per_s * GB)
    return Communicator(replace(machine, links=links), comm.env, w)


def ceiling(comm: Communicator) -> Communicator:
    """NCCL over the machine with every rate at its physical ceiling and every latency at its
    floor: the fastest the model could ever be."""
    limits = bounds(comm)
    return at(comm, {n: (b.low if n.endswith("_us") else b.high) for n, b in limits.items()})
