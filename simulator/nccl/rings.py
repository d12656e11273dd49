"""NCCL's ring for a set of GPUs: the rank order, the channel count and the per-channel speed.

Where the GPUs are wired to each other by direct NVLinks (a DGX-1 hybrid cube mesh) and a cycle
through every rank uses only those links, the ring is that cycle (NCCL's search follows NVLink
paths first and finds such rings on DGX-1); of the cycles, the one whose thinnest hop has the
most links wins. Otherwise the order groups GPUs by socket, then by the PCIe switch (or root
port) above them, so a ring crosses a socket link or a switch uplink as few times as possible
(once each way per group).
Channels and speed follow NCCL's search (``src/graph/search.cc``, v2.2x-2.30), simplified to
the one ring order above used by every channel (NCCL's ``sameChannels``):

1. ``maxBw`` = best GPU-to-GPU path bandwidth, ``totalBw`` = a GPU's PCIe link or the sum of its
   NVLinks (``ncclTopoSearchInit``); start at the first table speed not above ``maxBw``.
2. At speed s, a ring of n channels fits if every directed link carries n * s * (its load per
   channel) within NCCL's belief of its bandwidth (``followPath`` subtracts bw per hop; PCIe
   hops count x1.2 on PHB paths through an Intel CPU, ``INTEL_P2P_OVERHEAD``).
3. Pass 1 lowers s while the next speed is > 0.49 of the best found, keeping the largest
   n * s (ties keep the faster speed; ``ncclTopoCompareGraphs``); stops once n * s >= totalBw.
4. ``ncclTopoDupChannels`` doubles the channels and halves s if s >= 25 GB/s, unless
   sm > 80, s < 50 and n > 4.
5. Pass 2 tries higher speeds with at least that many channels, keeping any better n * s.
6. Nothing fits: NCCL falls back to one channel in rank order at 0.1 GB/s.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from simulator.units import GB

if TYPE_CHECKING:
    from simulator.machine.topology import Machine
    from simulator.nccl.communicator import Communicator
    from simulator.nccl.net_rings import Pattern

# search.cc speed tables, GB/s, per compute capability (intra-node search).
SPEEDS_SM_BELOW_90 = (40.0, 30.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0)
SPEEDS_SM90 = (60.0, 50.0, 40.0, 30.0, 24.0, 20.0, 15.0, 12.0, 11.0, 6.0, 3.0)
SPEEDS_SM100 = (90.0, 80.0, 70.0, 60.0, 50.0, 45.0, 40.0, 30.0, 24.0, 20.0, 19.0, 18.0)
MAX_RING_CHANNELS = 32  # init.cc: ring search uses up to MAXCHANNELS/2 (device.h MAXCHANNELS 64)
INTEL_P2P_OVERHEAD = 1.2  # topo.h INTEL_P2P_OVERHEAD(bw) = bw*6/5
LOC_BW = 5000.0  # topo.h LOC_BW, GB/s: what the search assumes for a single GPU
FALLBACK_BW = 0.1  # search.cc: "falling back to simple order", bwIntra = 0.1
_EPS = 1e-3  # search.cc SUB_ROUND compares at 1/1000 GB/s
MAX_CYCLE_SEARCH = 8  # brute-force NVLink cycles up to 8 GPUs (7! = 5040 orders)


@dataclass(frozen=True)
class Ring:
    """NCCL's ring: rank order, channel count and the per-channel speed its search believes."""

    order: tuple[int, ...]
    n_channels: int
    channel_bandwidth: float  # B/s, NCCL's belief (bwIntra), not a physical rate
    bottleneck: str | None = None  # link that limited NCCL's channel packing
    fallback: bool = False  # search found nothing; NCCL's simple-order ring at 0.1 GB/s
    # across boxes (net_rings.py): the channels' patterns, cycled over the channels (each its
    # own order and NICs), and how many boxes the ring spans
    patterns: tuple[Pattern, ...] = ()
    n_nodes: int = 1
    tree_bandwidth: float = 0.0  # B/s a channel of NCCL's tree graph (net_rings.py), 0: none

    @property
    def nccl_bus_bandwidth(self) -> float:
        return self.n_channels * self.channel_bandwidth


def speed_table(compute_capability: int) -> tuple[float, ...]:
    if compute_capability >= 100:
        return SPEEDS_SM100
    return SPEEDS_SM90 if compute_capability >= 90 else SPEEDS_SM_BELOW_90


def nvlink_cycle(machine: Machine, ranks: tuple[int, ...]) -> tuple[int, ...] | None:
    """A ring over direct GPU-to-GPU NVLinks only, widest thinnest hop first; None if none."""
    if not 3 <= len(ranks) <= MAX_CYCLE_SEARCH:
        return None
    nodes = machine.gpu_nodes
    width: dict[tuple[int, int], float] = {}
    for a in ranks:
        for b in ranks:
            data = machine.graph.succ[nodes[a]].get(nodes[b])
            if a != b and data is not None and data["kind"] == "nvlink":
                width[(a, b)] = data["capacity"]
    if any(sum(1 for (a, _) in width if a == r) < 2 for r in ranks):
        return None  # a GPU with fewer than two NVLink peers cannot sit on an NVLink cycle
    first, *rest = sorted(ranks)
    best: tuple[tuple[float, float], tuple[int, ...]] | None = None
    for perm in itertools.permutations(rest):
        order = (first, *perm)
        hops = [width.get((order[k], order[(k + 1) % len(order)])) for k in range(len(order))]
        if any(h is None for h in hops):
            continue
        widths = [h for h in hops if h is not None]
        score = (min(widths), sum(widths))
        if best is None or score > best[0]:
            best = (score, order)
    return best[1] if best else None


def ring_order(machine: Machine, ranks: tuple[int, ...]) -> tuple[int, ...]:
    """An all-NVLink cycle if there is one, else ranks grouped by socket, then by the switch or
    root port above them."""
    cycle = nvlink_cycle(machine, ranks)
    if cycle is not None:
        return cycle
    cpus = list(machine.cpu_nodes)
    groups: dict[tuple[int, str], int] = {}

    def key(rank: int) -> tuple[int, int, int]:
        cpu = machine.local_cpu(rank)
        socket = cpus.index(cpu) if cpu is not None else 0
        parent = machine.best_path(machine.gpu_nodes[rank], cpu).nodes[1] if cpu else ""
        group = groups.setdefault((socket, parent), len(groups))
        return (socket, group, rank)

    return tuple(sorted(ranks, key=key))


def channel_loads(comm: Communicator, order: tuple[int, ...]) -> dict[str, float]:
    """GB/s NCCL books on each directed link per GB/s of one channel's speed."""
    load: dict[str, float] = {}
    for pos, src in enumerate(order):
        hop_load(comm, src, order[(pos + 1) % len(order)], load)
    return load


def hop_load(comm: Communicator, src: int, dst: int, load: dict[str, float]) -> None:
    """Add to ``load`` what one channel's hop src -> dst books on each link, per GB/s."""
    machine = comm.machine
    path = comm.nccl_path(src, dst)
    intel = path.type == "PHB" and any(machine.is_intel_cpu(n) for n in path.nodes)
    for lid in path.links:
        pcie = machine.links[lid].kind == "pcie"
        load[lid] = load.get(lid, 0.0) + (INTEL_P2P_OVERHEAD if intel and pcie else 1.0)


def search_ring(comm: Communicator, ranks: tuple[int, ...]) -> Ring:
    machine = comm.machine
    if len(set(ranks)) != len(ranks) or not ranks:
        raise ValueError(f"ring ranks must be distinct and non-empty, got {ranks}")
    order = ring_order(machine, ranks)
    if len(order) == 1:
        return Ring(order, 1, LOC_BW * GB)
    load = channel_loads(comm, order)
    edges = machine.graph.succ
    belief = {lid: edges[link.src][link.dst]["nccl_bandwidth"] / GB
              for lid, link in ((lid, machine.links[lid]) for lid in load)}

    # the link with the least of NCCL's bandwidth per unit of channel speed limits the packing
    limit = min(load, key=lambda lid: belief[lid] / load[lid])
    headroom = belief[limit] / load[limit]

    def fit(speed: float) -> tuple[int, str]:
        """Channels that fit at this speed, and the link that limits them."""
        n = math.floor(headroom / speed + _EPS)
        return (n, limit) if n < MAX_RING_CHANNELS else (MAX_RING_CHANNELS, "")

    max_bw = _max_path_bandwidth(comm, order)
    total_bw = max(_gpu_total_bw(machine, r) for r in order)
    speeds = speed_table(machine.gpu.compute_capability)
    packed = pack(fit, speeds, max_bw, total_bw, machine.gpu.compute_capability)
    if packed is None:
        return Ring(tuple(sorted(ranks)), 1, FALLBACK_BW * GB, fallback=True)
    n_best, s_best, limit_best = packed
    return Ring(order, n_best, s_best * GB, bottleneck=limit_best or None)


def pack(fit: Callable[[float], tuple[int, str]], speeds: tuple[float, ...], max_bw: float,
         total_bw: float, cc: int) -> tuple[int, float, str] | None:
    """search.cc's two passes over a speed table (steps 1-5 of the module docstring): the
    channels, their speed (GB/s) and the link that limited them; None if nothing fits."""
    index = next((i for i, s in enumerate(speeds) if s <= max_bw), len(speeds) - 1)

    n_best, s_best, limit_best = 0, 0.0, ""
    while True:  # pass 1
        n, limit = fit(speeds[index])
        if n * speeds[index] > n_best * s_best + _EPS:
            n_best, s_best, limit_best = n, speeds[index], limit
        if n_best and n_best * s_best >= total_bw - _EPS:
            break
        if index < len(speeds) - 1 and (n_best == 0 or speeds[index + 1] / s_best > 0.49):
            index += 1
            continue
        break
    if n_best == 0:
        return None

    # ncclTopoDupChannels
    if s_best >= 25.0 and not (cc > 80 and s_best < 50.0 and n_best > 4):
        doubled = min(2 * n_best, MAX_RING_CHANNELS)
        s_best /= math.ceil(doubled / n_best)
        n_best = doubled

    for speed in sorted(s for s in speeds if s > s_best):  # pass 2: raise the speed
        n, limit = fit(speed)
        if n >= n_best and n * speed > n_best * s_best + _EPS:
            n_best, s_best, limit_best = n, speed, limit
    return n_best, s_best, limit_best


def _max_path_bandwidth(comm: Communicator, order: tuple[int, ...]) -> float:
    """search.cc ncclTopoSearchInit maxBw: the widest NCCL path between two GPUs of the ring,
    GB/s. A path is no wider than its first hop, so sources go widest link first and the search
    stops once no source left can beat the best found (one source on symmetric machines)."""
    machine = comm.machine
    nodes = machine.gpu_nodes
    reach = {r: max(e["nccl_bandwidth"] / GB for e in machine.graph.succ[nodes[r]].values())
             for r in order}
    best = 0.0
    for a in sorted(order, key=lambda r: -reach[r]):
        if reach[a] <= best:
            break
        best = max(best, *(comm.nccl_path(a, b).nccl_bandwidth / GB for b in order if b != a))
    return best


def _gpu_total_bw(machine: Machine, rank: int) -> float:
    """search.cc getTotalBw: max(the GPU's PCIe link, the sum of its NVLinks), GB/s."""
    node = machine.gpu_nodes[rank]
    pcie, nvlink = 0.0, 0.0
    for data in machine.graph.succ[node].values():
        bw = data["nccl_bandwidth"] / GB
        if data["kind"] == "nvlink":
            nvlink += bw
        elif data["kind"] == "pcie":
            pcie = bw
    return max(pcie, nvlink)
