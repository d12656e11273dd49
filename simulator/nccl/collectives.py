"""Collectives as NCCL runs them: NCCL's choices, then the flow they put on the machine's links.

``plan`` reproduces what NCCL decides for one call (ring order and channels from
``Communicator.ring``; algorithm and protocol from NCCL's cost model in tuning.py; channels
dropped for small messages). Its ``flow`` is what the engine's fabric runs: the ring's hops
advance together, so the flow's usage is the sum over hops of the communicator's routes, and
its progress is the bytes each rank sends (``bus_bytes``). How fast that flow really goes is
physics, not NCCL's belief:

- link occupancy per payload byte = route weight x protocol wire overhead (LL sends a 4-byte
  flag with every 4 data bytes, LL128 8 in 128) / efficiency of the transport on that link;
- a start-up latency = the call's own cost + steps x the slowest hop's step latency (its
  route's link latencies plus the protocol's sync on its transport, wire.py). A pipelined ring
  of chunks costs ``steps x (step latency + chunk / rate)``, which is this latency plus
  ``bus_bytes / rate``: the chunking sets the latency floor and the ramp;
- a rate cap: channels x a channel's throughput over PCIe (wire.py), and on NVLink NCCL's own
  per-arch kernel caps for LL, LL128 and tree.

One box; a group across boxes is multinode.py's (``Communicator.plan`` sends it there).
Assumes every channel uses the same ring order (symmetric link loads).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

from simulator.catalog import links as link_catalog
from simulator.engine.program import Flow
from simulator.errors import InputError, quoted
from simulator.nccl import interference, wire
from simulator.nccl import tuning as nt
from simulator.units import GB, US

if TYPE_CHECKING:
    from simulator.nccl.communicator import Communicator
    from simulator.nccl.env import NcclEnv

OPS = ("allreduce", "allgather", "reducescatter", "broadcast", "reduce")
ROOTED = ("broadcast", "reduce")  # a pipelined chain from (to) the root, the first rank given

# the wire's physics (efficiencies, overheads, latencies, caps) lives in wire.py
WIRE_OVERHEAD, NVLINK_EFFICIENCY = wire.WIRE_OVERHEAD, wire.NVLINK_EFFICIENCY
SIMPLE_EFFICIENCY, SHM_PCIE_EFFICIENCY = wire.SIMPLE_EFFICIENCY, wire.SHM_PCIE_EFFICIENCY


@dataclass(frozen=True)
class Plan:
    """One collective call as NCCL decides it and as the fabric will run it."""

    op: str
    nbytes: int
    ranks: tuple[int, ...]
    algorithm: str
    protocol: str
    transport: str  # P2P | SHM | P2P+SHM
    n_channels: int  # channels the kernel really runs for this size
    order: tuple[int, ...]  # ring order (chain order for tree and broadcast)
    latency: float  # s, paid before bytes flow
    bus_bytes: float  # bytes each rank sends: the flow's progress
    usage: tuple[tuple[str, float], ...]  # link -> occupancy per byte of progress
    max_rate: float  # B/s of progress, from protocol throughput caps (inf: none)
    nccl_time_us: float  # NCCL's own estimate, for comparison
    # the share of each rank's memory bandwidth its kernel takes (interference.py)
    hbm_share: float = 0.0

    @cached_property
    def flow(self) -> Flow:
        """The call on the fabric: one flow whose progress is the bytes each rank sends."""
        return Flow(self.usage, self.bus_bytes, self.max_rate, self.latency)

    @property
    def flows(self) -> tuple[Flow, ...]:
        return (self.flow,)


def bus_factor(op: str, n: int) -> float:
    """nccl-tests busbw / algbw (doc/PERFORMANCE.md)."""
    if op == "allreduce":
        return 2 * (n - 1) / n
    if op in ("allgather", "reducescatter"):
        return (n - 1) / n
    return 1.0


def comm_channels(search_channels: int) -> int:
    """Channels a communicator runs: connect.cc doubles the search's rings (max 64)."""
    return min(nt.MAX_CHANNELS, 2 * search_channels)


def plan(comm: Communicator, op: str, nbytes: int, ranks: tuple[int, ...] | None = None,
         algo: str = "auto", protocol: str | None = None) -> Plan:
    """NCCL's decisions for one call inside a box, kept by the communicator (training steps
    repeat sizes). Communicator.ring_plan picks between this and multinode.py."""
    check_call(op, nbytes, algo, protocol)
    ranks = tuple(range(comm.n_gpus)) if ranks is None else tuple(ranks)
    key = (op, nbytes, ranks, algo, protocol)
    if key not in comm.plans:
        comm.plans[key] = _make_plan(comm, op, nbytes, ranks, algo, protocol)
    made: Plan = comm.plans[key]
    return made


def choose(env: NcclEnv, graph: nt.Graph, op: str, nbytes: int, algo: str,
           protocol: str | None, *, tree: bool = True) -> nt.Estimate:
    """NCCL's algorithm and protocol for one call: its cost model over what --algo / --proto
    and NCCL_ALGO / NCCL_PROTO leave (``tree``: whether the tree is built at all)."""
    if algo == "tree" and op != "allreduce":
        raise InputError("tree is an all-reduce algorithm in NCCL; use --algo ring or auto")
    algorithms: tuple[str, ...] = nt.ALGORITHMS if algo == "auto" else (algo,)
    if algo == "auto" and not tree:
        algorithms = ("ring",)
    if algo == "auto" and env.enabled_algorithms(op) is not None:  # NCCL_ALGO
        algorithms = env.enabled_algorithms(op) or ()
    protocols: tuple[str, ...] = nt.PROTOCOLS if protocol is None else (protocol,)
    if protocol is None and env.enabled_protocols(op) is not None:  # NCCL_PROTO
        protocols = env.enabled_protocols(op) or ()
    try:
        return nt.choose(graph, op, nbytes, algorithms, protocols)
    except ValueError as exc:
        raise InputError(f"{exc} ({env.line()})" if env.active else str(exc)) from None


def check_call(op: str, nbytes: int, algo: str, protocol: str | None) -> None:
    """Refuse a call NCCL would not make: an unknown collective, algorithm or protocol."""
    if op not in OPS:
        raise InputError(f"unknown collective {quoted(op)}; expected one of {', '.join(OPS)}")
    if algo not in ("auto", *nt.ALGORITHMS):
        raise InputError(f"unknown algorithm {quoted(algo)}; expected auto, ring or tree")
    if protocol is not None and protocol not in nt.PROTOCOLS:
        raise InputError(f"unknown protocol {quoted(protocol)}; expected LL, LL128 or Simple")
    if nbytes < 0:
        raise InputError(f"message size must be >= 0, got {nbytes}")


def _make_plan(comm: Communicator, op: str, nbytes: int, ranks: tuple[int, ...], algo: str,
               protocol: str | None) -> Plan:
    n = len(ranks)
    if n == 1:  # NCCL runs a local copy: only the call overhead remains
        base = nt.BASE_LATENCY["ring"]["Simple"]
        return Plan(op, nbytes, ranks, "ring", "Simple", "LOC", 1, ranks,
                    comm.wire.call_latency_us * US, 0.0, (), math.inf, base)
    if nbytes == 0:  # enqueue.cc: "Empty collectives can be discarded" (no kernel)
        return Plan(op, 0, ranks, "ring", "Simple", "LOC", 0, ranks, 0.0, 0.0, (), math.inf,
                    0.0)
    machine = comm.machine
    ring = comm.ring(ranks)
    order = ring.order
    if op in ROOTED:  # broadcast's chain starts at the root (the first rank given)
        root = order.index(ranks[0])
        order = order[root:] + order[:root]
        if op == "reduce":  # reduce's ends there: the ring's order after the root, then it
            order = order[1:] + order[:1]
    nvlink = all(machine.path_type(a, b) == "NVL" for a, b in _cycle(order))
    env = comm.env
    graph = nt.Graph(n, ring.n_channels, ring.channel_bandwidth / GB, nvlink,
                     nt.arch_index(machine.gpu.compute_capability),
                     ll128_forced=protocol == "LL128" or env.ll128_forced(op))
    choice = choose(env, graph, op, nbytes, algo, protocol, tree=_tree_enabled(n))
    channels = nt.channels_used(graph, env.channels(comm_channels(ring.n_channels)), nbytes,
                                choice.algorithm, choice.protocol, env)

    if choice.algorithm == "tree":  # a chain inside one node: reduce up, broadcast down
        hops = list(zip(order[1:], order[:-1], strict=True))
        hops += [(b, a) for a, b in hops]
        steps = 2 * (n - 1)
        bus_bytes = float(nbytes)
    else:
        if op in ROOTED:  # a pipelined chain from (to) the root: n-1 hops, no closing hop
            hops, steps = list(zip(order, order[1:], strict=False)), n - 1
        else:
            hops, steps = _cycle(order), nt.ring_steps(op, n)
        bus_bytes = nbytes * bus_factor(op, n)
    usage = _usage(comm, hops, choice.protocol)
    transports = sorted({comm.transport(a, b) for a, b in hops})
    hop_latency = max(step_latency(comm, a, b, choice.protocol) for a, b in hops)
    latency = comm.wire.call_latency_us * US + steps * hop_latency
    threads = nt.threads_per_channel(graph, choice.algorithm, choice.protocol, env)
    max_rate = min(_max_rate(graph, choice.algorithm, choice.protocol, channels),
                   _pcie_channel_cap(comm, hops, choice.protocol, channels, threads))
    transport = "+".join(transports)
    return Plan(op, nbytes, ranks, choice.algorithm, choice.protocol, transport, channels,
                order, latency, bus_bytes, usage, max_rate, choice.time_us,
                interference.hbm_share(comm, op, ranks, transport, choice.protocol, usage,
                                       max_rate))


def _tree_enabled(n: int) -> bool:
    """Tree on one node is a chain: NCCL's model only prefers it where its PCI/NVLink Simple
    latency beats the ring's; we let the cost model decide for any n > 2."""
    return n > 2


def _cycle(order: tuple[int, ...]) -> list[tuple[int, int]]:
    return [(a, order[(i + 1) % len(order)]) for i, a in enumerate(order)]


def _usage(comm: Communicator, hops: list[tuple[int, int]],
           protocol: str) -> tuple[tuple[str, float], ...]:
    total: dict[str, float] = {}
    for a, b in hops:
        add_hop(comm, a, b, protocol, 1.0, total)
    return tuple(total.items())


def add_hop(comm: Communicator, a: int, b: int, protocol: str, share: float,
            total: dict[str, float]) -> None:
    """Add to ``total`` the occupancy of each link of the hop a -> b (one box) per byte of
    progress, for ``share`` of the bytes."""
    machine, costs = comm.machine, comm.wire
    shm = comm.transport(a, b) in ("SHM", "NET")  # GPU stores to host memory
    mechanism = comm.mechanism(a, b)  # its achieved-rate factor (machine/scales.py)
    scale = machine.scales.factor(mechanism) if mechanism else 1.0
    for link_id, weight in comm.route(a, b):
        kind = machine.links[link_id].kind
        occupancy = weight * WIRE_OVERHEAD[protocol]
        if kind == "nvlink":
            occupancy /= NVLINK_EFFICIENCY
        if protocol == "Simple":  # flag + fence stalls: calibrated per transport
            if kind == "nvlink":
                occupancy /= costs.nvlink_simple_efficiency
            elif kind == "pcie" and not shm:  # the link's generation's share
                occupancy /= wire.p2p_link_efficiency(costs, comm.pcie_generation(link_id))
            else:
                occupancy /= SIMPLE_EFFICIENCY
        if kind == "pcie" and shm:
            occupancy /= costs.shm_pcie_efficiency
        total[link_id] = total.get(link_id, 0.0) + share * occupancy / scale


def _pcie_channel_cap(comm: Communicator, hops: list[tuple[int, int]], protocol: str,
                      channels: int, threads: int = wire.SIMPLE_THREADS) -> float:
    """Channels x one channel's throughput over PCIe with its threads (wire.py) when any hop
    is off NVLink, scaled as the hops' link rates are (scales.py); inf on NVLink."""
    machine = comm.machine
    pcie = [(a, b) for a, b in hops if machine.path_type(a, b) != "NVL"]
    if not pcie:
        return math.inf
    scale = min(machine.scales.factor(m) if (m := comm.mechanism(a, b)) else 1.0
                for a, b in pcie)
    return channels * wire.channel_cap(comm.wire, protocol, threads) * scale


def step_latency(comm: Communicator, a: int, b: int, protocol: str) -> float:
    """One ring step over the hop a -> b: its route's link latencies (``latency_us``) plus
    the protocol's sync on its transport (wire.py), seconds."""
    sync = wire.sync_us(comm.wire, comm.transport(a, b), protocol)
    return comm.route_latency(a, b) + sync * US


def _max_rate(graph: nt.Graph, algorithm: str, protocol: str, channels: int) -> float:
    """NCCL's per-arch kernel caps, in bytes of progress per second.

    tuning.cc llMaxBw and perChMax*Bw are NVIDIA's characterisation of what the LL / LL128 /
    tree kernels can push over NVLink (on PCIe the channel caps of wire.py bind first); we apply
    them to the channels really running (across boxes, their columns for the box count).
    """
    ll_max, ring_ll128, tree_max, tree_ll128 = nt.caps(graph)
    if algorithm == "tree":
        per_channel = tree_ll128 if protocol == "LL128" else tree_max
        return 0.5 * channels * per_channel * GB  # tuning.cc: tree algBw = busBw / 2
    if protocol == "LL":
        return ll_max * GB
    if protocol == "LL128":
        return channels * ring_ll128 * GB
    return math.inf


# --- point-to-point -------------------------------------------------------------------------

# NCCL_P2P_LL_THRESHOLD default: send/recv of at most 16 KiB per channel use LL (enqueue.cc)
P2P_LL_THRESHOLD = 16384


def p2p_plan(comm: Communicator, src: int, dst: int, nbytes: int) -> Plan:
    """One ncclSend/ncclRecv pair (pipeline activations), kept by the communicator.

    Channels per peer as paths.cc ncclTopoGetNchannels sets them on one node: 2 over PCIe or
    SHM, 2 per NVLink over NVLink. The bytes follow ``Communicator.route`` (P2P, or SHM through the
    receiver's host memory) with the same protocol overheads and transport efficiencies as a
    collective's hops; the latency is a two-rank chain's (the call plus one step); over PCIe
    its channels' caps bind as a collective's do.
    """
    machine = comm.machine
    key = ("p2p", src, dst, nbytes)
    if key not in comm.plans:
        nvlink = machine.path_type(src, dst) == "NVL"
        channels = 2
        if nvlink:
            per_link = link_catalog.NCCL_NVLINK_PER_LINK.get(machine.gpu_of(src).compute_capability,
                                                         link_catalog.NCCL_NVLINK_PER_LINK[80])
            channels = 2 * max(1, round(comm.nccl_path(src, dst).nccl_bandwidth / per_link))
        protocol = "LL" if nbytes / channels <= P2P_LL_THRESHOLD else "Simple"
        latency = comm.wire.call_latency_us * US + step_latency(comm, src, dst, protocol)
        arch = nt.arch_index(machine.gpu_of(src).compute_capability)
        max_rate = min(nt.LL_MAX_BW[arch] * GB if protocol == "LL" else math.inf,
                       _pcie_channel_cap(comm, [(src, dst)], protocol, channels))
        usage = _usage(comm, [(src, dst)], protocol)
        transport = comm.transport(src, dst)
        comm.plans[key] = Plan("sendrecv", nbytes, (src, dst), "p2p", protocol, transport,
                               channels, (src, dst), latency, float(nbytes), usage, max_rate,
                               0.0, interference.hbm_share(comm, "broadcast", (src, dst),
                                                           transport, protocol, usage,
                                                           max_rate))
    made: Plan = comm.plans[key]
    return made
