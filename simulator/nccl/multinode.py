"""Collectives of a group that spans boxes: NCCL's choices with its network terms, and the flow
the ring or the tree puts on the links of every box and of the network between them.

- choice: tuning.py's cost model with the ring's channels and speed from NCCL's inter-node
  search (net_rings.py), the box count, the CPU vendor (LL cap, net overhead), LL128 only where
  the GPU-NIC path allows it (tuning.cc L516-535: typeInter <= PXB, <= PXN from Hopper) and the
  intra-box path is NVLink, the tree enabled for all-reduce.
- ring flow: every channel pattern's hops (its share of the channels' bytes), each hop's route:
  a box's own (collectives.add_hop) or the network's (nccl/net.py: GDR straight to the NIC, or
  staged through the GPU's host memory on both ends, the socket copies added).
- tree flow: a chain in each box from the head its NIC reaches, the double binary tree between
  boxes (tree.py), half the bytes on each tree, per NIC pattern.
- latency: the call, then the steps inside a box at the slowest intra-box hop's step latency and
  the steps between boxes at the slowest network hop's (route latencies plus NET's per-step
  sync, wire.py), counted as tuning.cc counts them (ring: 2(nNodes-1) network steps of 2(n-1)
  for all-reduce; tree: 2 x (ppn-1) chain and 2 x log2(nNodes) network steps).
- rate caps: NCCL's kernel caps for the box count; channels x a channel's PCIe store rate where
  a kernel stores to host memory (staged sides); the socket ceiling of each box boundary.

Not modelled: PXN (a GPU reaching a rail's NIC through an NVLink peer), NVLS and NVLS-tree
(NVLink SHARP, which lifts all-reduce on NVSwitch boxes across IB above the ring's rate),
CollNet (in-network reduction), PAT (all-gather and reduce-scatter with one GPU a box), LL's
send buffer kept in host memory under GDR (net.cc L917), the CPU cost of many socket threads,
and a fabric's congestion (the switch is non-blocking). docs/accuracy.md says what the
published points show of them.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from simulator.machine.paths import PATH_RANK
from simulator.nccl import collectives as nc
from simulator.nccl import tuning as nt
from simulator.nccl import wire
from simulator.nccl.net_rings import Crossing, Pattern, comm_channels, pattern_share
from simulator.nccl.tree import transfers
from simulator.units import GB, US

if TYPE_CHECKING:
    from simulator.nccl.communicator import Communicator
    from simulator.nccl.rings import Ring

# tuning.cc L516-535: LL128 across boxes only where the GPU-NIC path is at most this
LL128_INTER = {"volta": "PXB", "ampere": "PXB", "hopper": "PXN", "blackwell": "PXN"}


def plan(comm: Communicator, op: str, nbytes: int, ranks: tuple[int, ...] | None = None,
         algo: str = "auto", protocol: str | None = None) -> nc.Plan:
    """NCCL's decisions for one call across boxes and its flow, kept by the communicator."""
    nc.check_call(op, nbytes, algo, protocol)
    ranks = tuple(range(comm.n_gpus)) if ranks is None else tuple(ranks)
    key = ("net", op, nbytes, ranks, algo, protocol)
    if key not in comm.plans:
        comm.plans[key] = _make_plan(comm, op, nbytes, ranks, algo, protocol)
    made: nc.Plan = comm.plans[key]
    return made


def graph_of(comm: Communicator, ring: Ring, ranks: tuple[int, ...], op: str,
             ll128_forced: bool) -> nt.Graph:
    """What NCCL's tuner reads of a ring across boxes."""
    m, net = comm.machine, comm.net
    intra = [(a, b) for p in ring.patterns for a, b, c in p.hops() if c is None]
    nvlink = all(m.path_type(a, b) == "NVL" for a, b in intra)  # no chain: typeIntra LOC
    cc = min(m.gpu_of(r).compute_capability for r in ranks)
    arch = nt.arch_index(cc)
    worst = max(PATH_RANK[net.path_type(r, net.nearest(r))] for r in ranks)
    vendors = {"intel" if m.is_intel_cpu(c) else "amd" for c in m.cpu_nodes}
    channels = comm.env.channels(comm_channels(ring.n_channels, ring.channel_bandwidth / GB, cc,
                                               ring.n_nodes))
    return nt.Graph(len(ranks), ring.n_channels, ring.channel_bandwidth / GB, nvlink, arch,
                    ll128_forced=ll128_forced, n_nodes=ring.n_nodes,
                    cpu_vendor="intel" if vendors == {"intel"} else "amd",
                    ll128_inter=worst <= PATH_RANK[LL128_INTER[arch]], comm_channels=channels,
                    tree_bw_gbps=ring.tree_bandwidth / GB or None)


def _make_plan(comm: Communicator, op: str, nbytes: int, ranks: tuple[int, ...], algo: str,
               protocol: str | None) -> nc.Plan:
    n = len(ranks)
    if nbytes == 0:  # enqueue.cc: "Empty collectives can be discarded" (no kernel)
        return nc.Plan(op, 0, ranks, "ring", "Simple", "LOC", 0, ranks, 0.0, 0.0, (), math.inf,
                       0.0)
    env = comm.env
    ring = comm.ring(ranks)
    graph = graph_of(comm, ring, ranks, op, protocol == "LL128" or env.ll128_forced(op))
    choice = nc.choose(env, graph, op, nbytes, algo, protocol)
    channels = nt.channels_used(graph, graph.comm_channels, nbytes, choice.algorithm,
                                choice.protocol)
    pats = _rooted(ring.patterns, ranks[0]) if op == "broadcast" else ring.patterns
    shares = pattern_share(ring, channels)
    if choice.algorithm == "tree":
        moves = _tree_moves(comm, pats, shares)
        bus_bytes = float(nbytes)
        ppn = n / ring.n_nodes
        intra_steps, net_steps = 2 * (math.ceil(ppn) - 1), 2 * nt.log2i(ring.n_nodes)
    else:
        moves = _ring_moves(pats, shares, op)
        bus_bytes = nbytes * nc.bus_factor(op, n)
        steps = nt.ring_steps(op, n) if op != "broadcast" else n - 1
        net_steps = (2 if op == "allreduce" else 1) * (ring.n_nodes - 1)
        intra_steps = steps - net_steps
    usage: dict[str, float] = {}
    for a, b, crossing, share in moves:
        if crossing is None:
            nc.add_hop(comm, a, b, choice.protocol, share, usage)
        else:
            _add_net_hop(comm, crossing, choice.protocol, share, usage)
    latency = (comm.wire.call_latency_us * US
               + intra_steps * _slowest(comm, moves, choice.protocol, between=False)
               + net_steps * _slowest(comm, moves, choice.protocol, between=True))
    max_rate = min(nc._max_rate(graph, choice.algorithm, choice.protocol, channels),
                   _store_cap(comm, moves, choice.protocol, channels),
                   _socket_cap(comm, moves, channels))
    transports = sorted({comm.transport(a, b) for a, b, _, _ in moves})
    return nc.Plan(op, nbytes, ranks, choice.algorithm, choice.protocol, "+".join(transports),
                   channels, pats[0].order, latency, bus_bytes, tuple(usage.items()), max_rate,
                   choice.time_us)


Move = tuple[int, int, Crossing | None, float]  # src, dst, its box crossing, bytes per progress


def _rooted(pats: tuple[Pattern, ...], root: int) -> tuple[Pattern, ...]:
    """Broadcast: each pattern's order starting at the root (a chain: no closing hop)."""
    out = []
    for p in pats:
        k = p.order.index(root)
        out.append(Pattern(p.order[k:] + p.order[:k], p.crossings, p.heads))
    return tuple(out)


def _ring_moves(pats: tuple[Pattern, ...], shares: list[float], op: str) -> list[Move]:
    out: list[Move] = []
    for p, share in zip(pats, shares, strict=True):
        hops = p.hops()
        if op == "broadcast":
            hops = hops[:-1]
        out += [(a, b, c, share) for a, b, c in hops]
    return out


def _tree_moves(comm: Communicator, pats: tuple[Pattern, ...], shares: list[float]
                ) -> list[Move]:
    """Each pattern's trees: chains from its heads (the box's ring order from the head)."""
    net = comm.net
    out: list[Move] = []
    for p, share in zip(pats, shares, strict=True):
        per_box = len(p.order) // len(p.heads)
        chains = [p.order[k * per_box:(k + 1) * per_box] for k in range(len(p.heads))]
        for a, b, between, weight in transfers(chains):
            crossing = Crossing(a, b, net.nearest(a), net.nearest(b)) if between else None
            out.append((a, b, crossing, share * weight))
    return out


def _add_net_hop(comm: Communicator, crossing: Crossing, protocol: str, share: float,
                 usage: dict[str, float]) -> None:
    """A network hop's occupancy per byte: the wire overhead of the protocol on every link; the
    GPU's stores to host memory at SHM's PCIe efficiency (Simple's fence stalls too); the NIC's
    DMA at the link's payload rate; the network at NET/IB's efficiency."""
    m, costs, net = comm.machine, comm.wire, comm.net
    scale = m.scales.factor(net.mechanism)
    parts = net.segments(crossing.src, crossing.nic_out, send=True)
    parts += [(lid, w, "wire") for lid, w in net.wire(crossing.nic_out, crossing.nic_in)]
    parts += net.segments(crossing.dst, crossing.nic_in, send=False)
    for lid, weight, role in parts:
        occupancy = weight * wire.WIRE_OVERHEAD[protocol]
        if role == "kernel":
            occupancy /= costs.shm_pcie_efficiency
            if protocol == "Simple":
                occupancy /= wire.SIMPLE_EFFICIENCY
        elif role == "wire" and net.name == "IB":
            occupancy /= costs.net_efficiency
        usage[lid] = usage.get(lid, 0.0) + share * occupancy / scale


def _step(comm: Communicator, a: int, b: int, crossing: Crossing | None, protocol: str) -> float:
    """One step over a hop: its route's link latencies and the transport's sync, seconds."""
    if crossing is None:
        return nc.step_latency(comm, a, b, protocol)
    net = comm.net
    route = net.route(a, b, crossing.nic_out, crossing.nic_in)
    return sum(comm.machine.links[lid].latency for lid, _ in route) + net.sync_us() * US


def _slowest(comm: Communicator, moves: list[Move], protocol: str, between: bool) -> float:
    steps = [_step(comm, a, b, c, protocol) for a, b, c, _ in moves if (c is not None) == between]
    return max(steps, default=0.0)


def _store_cap(comm: Communicator, moves: list[Move], protocol: str, channels: int) -> float:
    """Channels x one channel's PCIe store rate where a kernel stores over PCIe: a box's
    non-NVLink hops (collectives.py) and the staged sides of network hops."""
    m, net = comm.machine, comm.net
    box_hops = [(a, b) for a, b, c, _ in moves if c is None]
    cap = nc._pcie_channel_cap(comm, box_hops, protocol, channels) if box_hops else math.inf
    staged = any(not net.gdr(c.src, c.nic_out, read=True).used or
                 not net.gdr(c.dst, c.nic_in, read=False).used
                 for _, _, c, _ in moves if c is not None)
    if staged:
        scale = m.scales.factor(net.mechanism)
        cap = min(cap, channels * wire.channel_cap(comm.wire, protocol) * scale)
    return cap


def _socket_cap(comm: Communicator, moves: list[Move], channels: int) -> float:
    """The socket ceiling of each GPU that sends across a boundary, over the share of the bytes
    its proxy moves there (NCCL's proxy thread per GPU, net.py)."""
    net = comm.net
    if net.name != "Socket":
        return math.inf
    load: dict[int, float] = {}
    for _, _, c, share in moves:
        if c is not None:
            load[c.src] = load.get(c.src, 0.0) + share
    cap = math.inf
    for share in load.values():
        proxy_channels = max(1, round(channels * share))
        scale = comm.machine.scales.factor(net.mechanism)
        cap = min(cap, net.stream_ceiling(proxy_channels) * scale / share)
    return cap


def p2p_plan(comm: Communicator, src: int, dst: int, nbytes: int) -> nc.Plan:
    """One ncclSend/ncclRecv between boxes (pipeline stages box by box): two channels, as
    ncclTopoGetNchannels gives a network peer (NCCL_NCHANNELS_PER_NET_PEER, default 2); LL at
    most 16 KiB a channel; the route through both GPUs' NICs."""
    key = ("p2p-net", src, dst, nbytes)
    if key not in comm.plans:
        net = comm.net
        channels = 2
        protocol = "LL" if nbytes / channels <= nc.P2P_LL_THRESHOLD else "Simple"
        crossing = Crossing(src, dst, net.nearest(src), net.nearest(dst))
        usage: dict[str, float] = {}
        _add_net_hop(comm, crossing, protocol, 1.0, usage)
        moves: list[Move] = [(src, dst, crossing, 1.0)]
        latency = comm.wire.call_latency_us * US + _step(comm, src, dst, crossing, protocol)
        arch = nt.arch_index(comm.machine.gpu_of(src).compute_capability)
        max_rate = min(nt.LL_MAX_BW[arch] * GB if protocol == "LL" else math.inf,
                       _store_cap(comm, moves, protocol, channels),
                       _socket_cap(comm, moves, channels))
        comm.plans[key] = nc.Plan("sendrecv", nbytes, (src, dst), "p2p", protocol,
                                  comm.transport(src, dst), channels, (src, dst), latency,
                                  float(nbytes), tuple(usage.items()), max_rate, 0.0)
    made: nc.Plan = comm.plans[key]
    return made
