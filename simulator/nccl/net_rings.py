"""NCCL's ring across boxes: each channel enters a box through a NIC, visits its GPUs and leaves
through a NIC for the next box (src/graph/search.cc, inter-node pattern "NET n -> GPU a -> ..
-> GPU x -> NET n (or m if crossNic)"), so every channel crosses each box boundary once.

Channels take the box's NICs in turn (``ncclTopoSearchRecNet`` starts channel c at net
``(c + i) % netCount``), each channel's chain starting at a GPU local to its NIC: a *pattern* per
NIC, the box's ring order (rings.py ``ring_order``) rotated to start there. It leaves by the NIC
closest to its last GPU (``NCCL_CROSS_NIC`` 1 or the default 2) or by the NIC it entered by
(``NCCL_CROSS_NIC=0``). Channels and their speed come from the same search as one box's
(rings.py ``pack``) over NCCL's inter-node speed table (search.cc ``speedArrayInter``), each
channel booking its speed on every link of its chain and of its GPU-NIC paths, the NIC's own
link at the NIC's speed; ``maxBw`` is the widest GPU-to-network path (``getMaxBw`` over NET).
Boxes are alike (every box's NIC patterns are the first box's).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from simulator.machine.cluster import local_id
from simulator.nccl.rings import (
    _EPS,
    FALLBACK_BW,
    MAX_RING_CHANNELS,
    Ring,
    _gpu_total_bw,
    hop_load,
    pack,
    ring_order,
)
from simulator.units import GB

if TYPE_CHECKING:
    from simulator.nccl.communicator import Communicator

# search.cc speedArrayInter, sm90SpeedArrayInter, sm100SpeedArrayInter (GB/s)
SPEEDS_INTER = (48.0, 30.0, 28.0, 24.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0,
                3.0, 2.4, 1.2, 0.24, 0.12)
SPEEDS_INTER_SM90 = (48.0, 45.0, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5, 15.0, 12.0, 6.0, 3.0,
                     2.4, 1.2, 0.24, 0.12)
SPEEDS_INTER_SM100 = (96.0, 86.0, 80.0, 48.0, 45.1, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5,
                      15.0, 12.0, 6.0, 3.0, 2.4, 1.2, 0.24, 0.12)


@dataclass(frozen=True)
class Crossing:
    """A channel's step from one box to the next: its GPUs and the NICs it leaves and enters by."""

    src: int
    dst: int
    nic_out: str
    nic_in: str


@dataclass(frozen=True)
class Pattern:
    """The channels of one NIC: the ring's order across all boxes and its box crossings."""

    order: tuple[int, ...]
    crossings: tuple[Crossing, ...]
    heads: tuple[int, ...]  # each box's first GPU (a tree's head, tree.py)

    def hops(self) -> list[tuple[int, int, Crossing | None]]:
        """Every hop of the ring, a crossing with its NICs."""
        by_src = {c.src: c for c in self.crossings}
        out = []
        for pos, a in enumerate(self.order):
            b = self.order[(pos + 1) % len(self.order)]
            crossing = by_src.get(a)
            out.append((a, b, crossing if crossing is not None and crossing.dst == b else None))
        return out


def speed_table(compute_capability: int) -> tuple[float, ...]:
    if compute_capability >= 100:
        return SPEEDS_INTER_SM100
    return SPEEDS_INTER_SM90 if compute_capability >= 90 else SPEEDS_INTER


def chains(comm: Communicator, ranks: tuple[int, ...]) -> dict[int, tuple[int, ...]]:
    """Each box's GPUs of the group in the box's ring order, boxes in order."""
    m = comm.machine
    boxes = sorted({m.box_of(r) for r in ranks})
    return {b: ring_order(m, tuple(r for r in ranks if m.box_of(r) == b)) for b in boxes}


def patterns(comm: Communicator, ranks: tuple[int, ...]) -> tuple[Pattern, ...]:
    """One pattern per NIC the first box's GPUs use (module docstring)."""
    net = comm.net
    by_box = chains(comm, ranks)
    boxes = list(by_box)
    first = by_box[boxes[0]]
    nics: list[str] = []
    for r in first:
        name = local_id(net.nearest(r))
        if name not in nics:
            nics.append(name)
    cross = comm.env.cross_nic is None or comm.env.cross_nic != 0
    out = []
    for name in nics:
        rotated = {}
        for b, chain in by_box.items():
            start = next((i for i, r in enumerate(chain) if local_id(net.nearest(r)) == name), 0)
            rotated[b] = chain[start:] + chain[:start]
        crossings = []
        for i, b in enumerate(boxes):
            here, there = rotated[b], rotated[boxes[(i + 1) % len(boxes)]]
            out_nic = net.nearest(here[-1]) if cross else net.nearest(here[0])
            crossings.append(Crossing(here[-1], there[0], out_nic, net.nearest(there[0])))
        order = tuple(r for b in boxes for r in rotated[b])
        out.append(Pattern(order, tuple(crossings), tuple(rotated[b][0] for b in boxes)))
    return tuple(out)


def pattern_load(comm: Communicator, pattern: Pattern) -> dict[str, float]:
    """GB/s NCCL books on each link per GB/s of one channel of this pattern."""
    load: dict[str, float] = {}
    for a, b, crossing in pattern.hops():
        if crossing is None:
            hop_load(comm, a, b, load)
            continue
        for lid, w in comm.net.nccl_links(a, b, crossing.nic_out, crossing.nic_in):
            load[lid] = load.get(lid, 0.0) + w
    return load


def search(comm: Communicator, ranks: tuple[int, ...]) -> Ring:
    """NCCL's ring over a group that spans several boxes."""
    m = comm.machine
    pats = patterns(comm, ranks)
    loads = [pattern_load(comm, p) for p in pats]
    belief = {e["id"]: e["nccl_bandwidth"] / GB for _, _, e in m.graph.edges(data=True)}

    def fit(speed: float) -> tuple[int, str]:
        """Channels that fit at this speed (patterns in turn), and the link that stops them."""
        used: dict[str, float] = {}
        for n in range(MAX_RING_CHANNELS):
            load = loads[n % len(loads)]
            full = [lid for lid, w in load.items()
                    if used.get(lid, 0.0) + w * speed > belief[lid] + _EPS]
            if full:
                return n, full[0]
            for lid, w in load.items():
                used[lid] = used.get(lid, 0.0) + w * speed
        return MAX_RING_CHANNELS, ""

    net = comm.net
    max_bw = max(net.nccl_bandwidth(r, net.nearest(r)) for r in ranks) / GB
    total_bw = max(_gpu_total_bw(m, r) for r in ranks)
    cc = min(m.gpu_of(r).compute_capability for r in ranks)
    packed = pack(fit, speed_table(cc), max_bw, total_bw, cc)
    nodes = m.boxes_of(ranks)
    if packed is None:  # search.cc: one channel at 0.1 GB/s
        return Ring(pats[0].order, 1, FALLBACK_BW * GB, fallback=True, patterns=pats[:1],
                    n_nodes=nodes)
    n, speed, limit = packed
    tree = tree_speed(comm, pats, n, belief, max_bw, speed_table(cc))
    return Ring(pats[0].order, n, speed * GB, bottleneck=limit or None, patterns=pats,
                n_nodes=nodes, tree_bandwidth=(tree or speed) * GB)


def tree_load(comm: Communicator, pattern: Pattern) -> dict[str, float]:
    """GB/s NCCL's tree search books per GB/s of one channel (search.cc BALANCED_TREE,
    backToNet 0): into the head from its NIC at full speed, back out from the head and from
    the next GPU at half each ("count half of the bandwidth on each of the first two GPUs"),
    and the chain down the box's GPUs once, with no hop back to the NIC from its last GPU."""
    net = comm.net
    load: dict[str, float] = {}
    per_box = len(pattern.order) // len(pattern.heads)
    for k, head in enumerate(pattern.heads):
        chain = pattern.order[k * per_box:(k + 1) * per_box]
        nic = net.nearest(head)
        for other, edge in comm.machine.graph.succ[nic].items():  # the NIC's network link
            if edge["kind"] == "network":  # each way once: in to the head, out from it
                for lid in (edge["id"], comm.machine.graph.edges[other, nic]["id"]):
                    load[lid] = load.get(lid, 0.0) + 1.0
        halves = [(head, 1.0 if len(chain) == 1 else 0.5)] + \
            ([(chain[1], 0.5)] if len(chain) > 1 else [])
        for lid, w, _ in net.segments(head, nic, send=False):  # NET -> head
            if not lid.startswith("mem:"):
                load[lid] = load.get(lid, 0.0) + w
        for rank, share in halves:  # head and next GPU -> NET
            for lid, w, _ in net.segments(rank, nic, send=True):
                if not lid.startswith("mem:"):
                    load[lid] = load.get(lid, 0.0) + w * share
        for a, b in zip(chain, chain[1:], strict=False):
            hop_load(comm, a, b, load)
    return load


def tree_speed(comm: Communicator, pats: tuple[Pattern, ...], channels: int,
               belief: dict[str, float], max_bw: float, speeds: tuple[float, ...]
               ) -> float | None:
    """The tree graph's speed (init.cc: searched with the ring's channel count): the fastest
    table speed at which that many tree channels fit; None if none does."""
    loads = [tree_load(comm, p) for p in pats]
    for speed in (s for s in speeds if s <= max_bw + _EPS):
        used: dict[str, float] = {}
        for n in range(channels):
            for lid, w in loads[n % len(loads)].items():
                used[lid] = used.get(lid, 0.0) + w * speed
        if all(used[lid] <= belief[lid] + _EPS for lid in used):
            return speed
    return None


def pattern_share(ring: Ring, channels: int) -> list[float]:
    """Each pattern's share of ``channels`` channels taken in turn (the bytes it carries)."""
    k = len(ring.patterns)
    counts = [channels // k + (1 if i < channels % k else 0) for i in range(k)]
    if not any(counts):  # fewer channels than NICs: the first patterns only
        counts[0] = 1
    total = sum(counts)
    return [c / total for c in counts]


def comm_channels(search_channels: int, channel_gbps: float, cc: int, n_nodes: int) -> int:
    """connect.cc: the search's rings doubled (at most 64), then doubled once more across
    boxes on Hopper and later when the ring's speed is above 45 GB/s (L481-483)."""
    n = min(64, 2 * search_channels)
    if cc >= 90 and n_nodes > 1 and channel_gbps > 45.0 and n < 16:
        n = min(64, 2 * n)
    return n


def log2i(n: int) -> int:
    """NCCL's log2i: floor of log2."""
    return int(math.floor(math.log2(n))) if n > 0 else 0
