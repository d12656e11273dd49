"""Collectives as NCCL runs them: NCCL's choices, then our physics on the shared fabric.

``plan`` reproduces what NCCL decides for one call (ring order and channels from
``Machine.ring``; algorithm and protocol from NCCL's cost model in nccl_tuning.py; channels
dropped for small messages). ``start`` puts the call on a
:class:`~simulator.engine.fabric.Fabric` as one flow: the ring's hops advance together, so the
flow's usage is the sum over hops of the machine's routes, and its progress is the bytes each
rank sends (``bus_bytes``). How fast that flow really goes is physics, not NCCL's belief:

- link occupancy per payload byte = route weight x protocol wire overhead (LL sends a 4-byte
  flag with every 4 data bytes, LL128 8 in 128) / efficiency of the transport on that link;
- a start-up latency = the call's own cost + steps x the slowest hop's step latency (its
  route's link latencies plus the protocol's sync on its transport, wire.py). A pipelined ring
  of chunks costs ``steps x (step latency + chunk / rate)``, which is this latency plus
  ``bus_bytes / rate``: the chunking sets the latency floor and the ramp;
- a rate cap: channels x a channel's throughput over PCIe (wire.py), and on NVLink NCCL's own
  per-arch kernel caps for LL, LL128 and tree.

Single node only. Assumes every channel uses the same ring order (symmetric link loads).
"""

from __future__ import annotations

import functools
import math
import weakref
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from simulator.errors import InputError
from simulator.machine import hardware, wire
from simulator.machine import nccl_tuning as nt
from simulator.scales import hop_mechanism
from simulator.units import GB, US

if TYPE_CHECKING:
    import simpy

    from simulator.engine.fabric import Fabric
    from simulator.machine.topology import Machine

OPS = ("allreduce", "allgather", "reducescatter", "broadcast")

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


@dataclass(frozen=True)
class Result:
    """One collective timed alone, in nccl-tests' terms (time, algbw, busbw)."""

    op: str
    bytes: int
    gpus: int
    time_us: float
    algbw_gbps: float
    busbw_gbps: float
    algorithm: str
    protocol: str
    transport: str
    n_channels: int
    bottleneck_link: str | None
    bottleneck_utilization: float

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["bottleneck"] = {"link": out.pop("bottleneck_link"),
                             "utilization": out.pop("bottleneck_utilization")}
        return out


def bus_factor(op: str, n: int) -> float:
    """nccl-tests busbw / algbw (doc/PERFORMANCE.md)."""
    if op == "allreduce":
        return 2 * (n - 1) / n
    if op in ("allgather", "reducescatter"):
        return (n - 1) / n
    return 1.0


_PLANS: dict[int, tuple[weakref.ref[Any], dict[tuple[Any, ...], Any]]] = {}


def comm_channels(search_channels: int) -> int:
    """Channels a communicator runs: connect.cc doubles the search's rings (max 64)."""
    return min(nt.MAX_CHANNELS, 2 * search_channels)


def machine_channels(machine: Machine) -> int:
    """Channels of a communicator over the whole machine (NCCL buffers scale with it)."""
    if machine.n_gpus == 1:
        return 1
    return machine.nccl.channels(comm_channels(machine.ring().n_channels))


def plan(machine: Machine, op: str, nbytes: int, ranks: tuple[int, ...] | None = None,
         algo: str = "auto", protocol: str | None = None) -> Plan:
    """NCCL's decisions for one call, cached per machine (training steps repeat sizes)."""
    if op not in OPS:
        raise InputError(f"unknown collective {op!r}; expected one of {', '.join(OPS)}")
    if algo not in ("auto", *nt.ALGORITHMS):
        raise InputError(f"unknown algorithm {algo!r}; expected auto, ring or tree")
    if protocol is not None and protocol not in nt.PROTOCOLS:
        raise InputError(f"unknown protocol {protocol!r}; expected LL, LL128 or Simple")
    if nbytes < 0:
        raise InputError(f"message size must be >= 0, got {nbytes}")
    ranks = tuple(range(machine.n_gpus)) if ranks is None else tuple(ranks)
    cache = _plan_cache(machine)
    key = (op, nbytes, ranks, algo, protocol)
    if key not in cache:
        cache[key] = _make_plan(machine, op, nbytes, ranks, algo, protocol)
    return cache[key]


def _plan_cache(machine: Machine) -> dict[tuple[Any, ...], Any]:
    """Plans of one machine, dropped when the machine is garbage-collected."""
    key = id(machine)
    entry = _PLANS.get(key)
    if entry is None or entry[0]() is not machine:
        entry = (weakref.ref(machine, functools.partial(_forget, key)), {})
        _PLANS[key] = entry
    return entry[1]


def _forget(key: int, _ref: object) -> None:
    _PLANS.pop(key, None)


def _make_plan(machine: Machine, op: str, nbytes: int, ranks: tuple[int, ...], algo: str,
               protocol: str | None) -> Plan:
    n = len(ranks)
    if n == 1:  # NCCL runs a local copy: only the call overhead remains
        base = nt.BASE_LATENCY["ring"]["Simple"]
        return Plan(op, nbytes, ranks, "ring", "Simple", "LOC", 1, ranks,
                    machine.wire.call_latency_us * US, 0.0, (), math.inf, base)
    if nbytes == 0:  # enqueue.cc: "Empty collectives can be discarded" (no kernel)
        return Plan(op, 0, ranks, "ring", "Simple", "LOC", 0, ranks, 0.0, 0.0, (), math.inf,
                    0.0)
    ring = machine.ring(ranks)
    order = ring.order
    if op == "broadcast":  # the chain starts at the root (the first rank given)
        root = order.index(ranks[0])
        order = order[root:] + order[:root]
    nvlink = all(machine.path_type(a, b) == "NVL" for a, b in _cycle(order))
    env = machine.nccl
    graph = nt.Graph(n, ring.n_channels, ring.channel_bandwidth / GB, nvlink,
                     nt.arch_index(machine.gpu.compute_capability),
                     ll128_forced=protocol == "LL128" or env.ll128_forced(op))
    if algo == "tree" and op != "allreduce":
        raise InputError("tree is an all-reduce algorithm in NCCL; use --algo ring or auto")
    algorithms: tuple[str, ...] = nt.ALGORITHMS if algo == "auto" else (algo,)
    if algo == "auto" and not _tree_enabled(n):
        algorithms = ("ring",)
    if algo == "auto" and env.enabled_algorithms(op) is not None:  # NCCL_ALGO
        algorithms = env.enabled_algorithms(op) or ()
    protocols: tuple[str, ...] = nt.PROTOCOLS if protocol is None else (protocol,)
    if protocol is None and env.enabled_protocols(op) is not None:  # NCCL_PROTO
        protocols = env.enabled_protocols(op) or ()
    try:
        choice = nt.choose(graph, op, nbytes, algorithms, protocols)
    except ValueError as exc:
        raise InputError(f"{exc} ({env.line()})" if env.active else str(exc)) from None
    channels = nt.channels_used(graph, env.channels(comm_channels(ring.n_channels)), nbytes,
                                choice.algorithm, choice.protocol)

    if choice.algorithm == "tree":  # a chain inside one node: reduce up, broadcast down
        hops = list(zip(order[1:], order[:-1], strict=True))
        hops += [(b, a) for a, b in hops]
        steps = 2 * (n - 1)
        bus_bytes = float(nbytes)
    else:
        if op == "broadcast":  # a pipelined chain from the root: n-1 hops, no closing hop
            hops, steps = list(zip(order, order[1:], strict=False)), n - 1
        else:
            hops, steps = _cycle(order), nt.ring_steps(op, n)
        bus_bytes = nbytes * bus_factor(op, n)
    usage = _usage(machine, hops, choice.protocol)
    transports = sorted({machine.transport(a, b) for a, b in hops})
    hop_latency = max(step_latency(machine, a, b, choice.protocol) for a, b in hops)
    latency = machine.wire.call_latency_us * US + steps * hop_latency
    max_rate = min(_max_rate(graph, choice.algorithm, choice.protocol, channels),
                   _pcie_channel_cap(machine, hops, choice.protocol, channels))
    return Plan(op, nbytes, ranks, choice.algorithm, choice.protocol, "+".join(transports),
                channels, order, latency, bus_bytes, usage, max_rate, choice.time_us)


def _tree_enabled(n: int) -> bool:
    """Tree on one node is a chain: NCCL's model only prefers it where its PCI/NVLink Simple
    latency beats the ring's; we let the cost model decide for any n > 2."""
    return n > 2


def _cycle(order: tuple[int, ...]) -> list[tuple[int, int]]:
    return [(a, order[(i + 1) % len(order)]) for i, a in enumerate(order)]


def _usage(machine: Machine, hops: list[tuple[int, int]],
           protocol: str) -> tuple[tuple[str, float], ...]:
    total: dict[str, float] = {}
    shm_efficiency = machine.wire.shm_pcie_efficiency
    for a, b in hops:
        shm = machine.transport(a, b) in ("SHM", "NET")  # GPU stores to host memory
        mechanism = hop_mechanism(machine, a, b)  # its achieved-rate factor (scales.py)
        scale = machine.scales.factor(mechanism) if mechanism else 1.0
        for link_id, weight in machine.route(a, b):
            kind = machine.links[link_id].kind
            occupancy = weight * WIRE_OVERHEAD[protocol]
            if kind == "nvlink":
                occupancy /= NVLINK_EFFICIENCY
            if protocol == "Simple":  # flag + fence stalls: calibrated per transport
                if kind == "nvlink":
                    occupancy /= machine.wire.nvlink_simple_efficiency
                elif kind == "pcie" and not shm:
                    occupancy /= machine.wire.p2p_pcie_simple_efficiency
                else:
                    occupancy /= SIMPLE_EFFICIENCY
            if kind == "pcie" and shm:
                occupancy /= shm_efficiency
            total[link_id] = total.get(link_id, 0.0) + occupancy / scale
    return tuple(total.items())


def _pcie_channel_cap(machine: Machine, hops: list[tuple[int, int]], protocol: str,
                      channels: int) -> float:
    """Channels x one channel's throughput over PCIe (wire.py) when any hop is off NVLink,
    scaled as the hops' link rates are (scales.py); inf on NVLink."""
    pcie = [(a, b) for a, b in hops if machine.path_type(a, b) != "NVL"]
    if not pcie:
        return math.inf
    scale = min(machine.scales.factor(m) if (m := hop_mechanism(machine, a, b)) else 1.0
                for a, b in pcie)
    return channels * wire.channel_cap(machine.wire, protocol) * scale


def step_latency(machine: Machine, a: int, b: int, protocol: str) -> float:
    """One ring step over the hop a -> b: its route's link latencies (``latency_us``) plus
    the protocol's sync on its transport (wire.py), seconds."""
    sync = wire.sync_us(machine.wire, machine.transport(a, b), protocol)
    return machine.route_latency(a, b) + sync * US


def _max_rate(graph: nt.Graph, algorithm: str, protocol: str, channels: int) -> float:
    """NCCL's per-arch kernel caps, in bytes of progress per second.

    tuning.cc llMaxBw and perChMax*Bw are NVIDIA's characterisation of what the LL / LL128 /
    tree kernels can push over NVLink (on PCIe the channel caps of wire.py bind first); we apply
    them to the channels really running.
    """
    arch = graph.arch
    if algorithm == "tree":
        per_channel = (nt.PER_CH_MAX_TREE_LL128_BW if protocol == "LL128"
                       else nt.PER_CH_MAX_TREE_BW)[arch]
        return 0.5 * channels * per_channel * GB  # tuning.cc: tree algBw = busBw / 2
    if protocol == "LL":
        return nt.LL_MAX_BW[arch] * GB
    if protocol == "LL128":
        return channels * nt.PER_CH_MAX_RING_LL128_BW[arch] * GB
    return math.inf


# --- point-to-point -------------------------------------------------------------------------

# NCCL_P2P_LL_THRESHOLD default: send/recv of at most 16 KiB per channel use LL (enqueue.cc)
P2P_LL_THRESHOLD = 16384


def p2p_plan(machine: Machine, src: int, dst: int, nbytes: int) -> Plan:
    """One ncclSend/ncclRecv pair (pipeline activations), cached per machine.

    Channels per peer as paths.cc ncclTopoGetNchannels sets them on one node: 2 over PCIe or
    SHM, 2 per NVLink over NVLink. The bytes follow ``machine.route`` (P2P, or SHM through the
    receiver's host memory) with the same protocol overheads and transport efficiencies as a
    collective's hops; the latency is a two-rank chain's (the call plus one step); over PCIe
    its channels' caps bind as a collective's do.
    """
    cache = _plan_cache(machine)
    key = ("p2p", src, dst, nbytes)
    if key not in cache:
        nvlink = machine.path_type(src, dst) == "NVL"
        channels = 2
        if nvlink:
            per_link = hardware.NCCL_NVLINK_PER_LINK.get(machine.gpu_of(src).compute_capability,
                                                         hardware.NCCL_NVLINK_PER_LINK[80])
            channels = 2 * max(1, round(machine.nccl_path_bandwidth(src, dst) / per_link))
        protocol = "LL" if nbytes / channels <= P2P_LL_THRESHOLD else "Simple"
        latency = (machine.wire.call_latency_us * US
                   + step_latency(machine, src, dst, protocol))
        arch = nt.arch_index(machine.gpu_of(src).compute_capability)
        max_rate = min(nt.LL_MAX_BW[arch] * GB if protocol == "LL" else math.inf,
                       _pcie_channel_cap(machine, [(src, dst)], protocol, channels))
        cache[key] = Plan("sendrecv", nbytes, (src, dst), "p2p", protocol,
                          machine.transport(src, dst), channels, (src, dst), latency,
                          float(nbytes), _usage(machine, [(src, dst)], protocol), max_rate, 0.0)
    return cache[key]


# --- running -----------------------------------------------------------------------------

def fabric_for(env: simpy.Environment, machine: Machine, **kwargs: Any) -> Fabric:
    """A fabric with every link (and host-memory resource) of the machine."""
    from simulator.engine.fabric import Fabric

    return Fabric(env, {lid: link.capacity for lid, link in machine.links.items()}, **kwargs)


def start(env: simpy.Environment, fabric: Fabric, plan: Plan) -> simpy.Event:
    """Put the collective on the fabric; the event fires when every rank is done."""
    return fabric.transfer(plan.usage, plan.bus_bytes, plan.max_rate, plan.latency,
                           tag=plan.op)


def start_groups(env: simpy.Environment, fabric: Fabric, plans: list[Plan],
                 machine: Machine) -> simpy.Event:
    """Put every group of one call on the fabric; the event fires when all are done.

    Groups alike in all but which links they use (the same bytes, latency and rate cap, the
    same occupancies on links of the same capacities) that share no link run as ONE flow over
    all their links: each link still carries exactly its own group's bytes, and the groups
    advance together, as they do when nothing else treats them differently. A 1,024-GPU box
    with TP 8 has 128 TP groups: one flow instead of 128 for the fabric to share. Where other
    traffic loads one group's links more than another's, the slowest group sets the pace of
    all (the program stands for every group and waits for the last anyway). How the groups
    join is worked out once per machine and set of plans.
    """
    if len(plans) == 1:  # one group (data parallelism over every GPU): nothing to join
        return env.all_of([start(env, fabric, plans[0])])
    flows = [fabric.transfer(usage, first.bus_bytes, first.max_rate, first.latency,
                             tag=first.op) for usage, first in _joined(machine, plans)]
    return env.all_of(flows)


def _joined(machine: Machine, plans: list[Plan]) -> list[tuple[tuple[tuple[str, float], ...],
                                                              Plan]]:
    """(usage over all their links, the first plan) of each batch of alike, disjoint groups,
    in the order of their first group; cached by the plans' identities (kept with it)."""
    cache = _plan_cache(machine)
    key = ("joined", *(id(p) for p in plans))
    known = cache.get(key)
    if known is None or any(a is not b for a, b in zip(known[0], plans, strict=True)):
        batches: list[tuple[set[str], list[Plan]]] = []
        alike: dict[tuple[Any, ...], list[int]] = {}  # shape -> its batches
        for p in plans:
            shape = (p.bus_bytes, p.latency, p.max_rate,
                     tuple(sorted((w, machine.links[lid].capacity) for lid, w in p.usage)))
            links = {lid for lid, _ in p.usage}
            k = next((k for k in alike.get(shape, ()) if not batches[k][0] & links), None)
            if k is None:
                alike.setdefault(shape, []).append(len(batches))
                batches.append((links, [p]))
            else:
                batches[k][0].update(links)
                batches[k][1].append(p)
        cache[key] = known = (tuple(plans), [(tuple(pair for p in group for pair in p.usage),
                                                group[0]) for _, group in batches])
    joined: list[tuple[tuple[tuple[str, float], ...], Plan]] = known[1]
    return joined


def simulate(machine: Machine, op: str, nbytes: int, ranks: tuple[int, ...] | None = None,
             algo: str = "auto", protocol: str | None = None) -> Result:
    """Run one collective alone on a fresh fabric, as nccl-tests would time it."""
    import simpy  # here: commands that only plan (memory, topo) never load the event loop

    p = plan(machine, op, nbytes, ranks, algo, protocol)
    env = simpy.Environment()
    fabric = fabric_for(env, machine, record_history=False)
    env.run(start(env, fabric, p))
    seconds = env.now
    n = len(p.ranks)
    algbw = nbytes / seconds / GB if seconds > 0 else 0.0
    link, util = fabric.bottleneck() if p.usage and nbytes > 0 else (None, 0.0)
    return Result(op, nbytes, n, seconds / US, algbw, algbw * bus_factor(op, n), p.algorithm,
                  p.protocol, p.transport, p.n_channels, link, util)
