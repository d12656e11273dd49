"""NCCL's own cost model (``src/graph/tuning.cc``): what NCCL *believes* a collective costs.

Used only to reproduce NCCL's *choices* (algorithm, protocol, channels for small messages);
how long the collective then really takes is the physics' business (collectives.py, wire.py).
Constants are NCCL's, quoted from the v2.30 snapshot described in domain-model.md 2.2-2.4.
Units follow NCCL: latencies in microseconds, bandwidths in GB/s, ``time_us = lat + bytes /
(1000 * bw)``. Across boxes (``Graph.n_nodes`` > 1) the network terms of ``ncclTopoTuneModel``
apply: the NET row of hwLat, the CPU vendor's net overhead and LL cap, the N2 / N4 columns of
the per-channel caps, tree LL128 at 120/128, and the ring's Simple "plateau" factor.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from simulator.nccl.env import NO_ENV, NcclEnv

ALGORITHMS = ("ring", "tree")
PROTOCOLS = ("LL", "LL128", "Simple")

# tuning.cc baseLat [algo][proto], us
BASE_LATENCY = {"tree": {"LL": 6.8, "LL128": 14.0, "Simple": 8.4},
                "ring": {"LL": 6.6, "LL128": 14.0, "Simple": 8.4}}
# tuning.cc hwLat [NVLINK | PCI][algo][proto], us per hop; SHM through the CPU uses PCI
HW_LATENCY = {
    "NVLINK": {"tree": {"LL": 0.6, "LL128": 1.25, "Simple": 4.0},
               "ring": {"LL": 0.6, "LL128": 1.9, "Simple": 3.4}},
    "PCI": {"tree": {"LL": 1.0, "LL128": 1.9, "Simple": 4.0},
            "ring": {"LL": 1.0, "LL128": 2.5, "Simple": 5.7}},
}
# tuning.cc hwLat NET row: across boxes, each inter-node step (Tree, Ring), us
NET_HW_LATENCY = {"tree": {"LL": 5.0, "LL128": 8.5, "Simple": 14.0},
                  "ring": {"LL": 2.7, "LL128": 4.0, "Simple": 14.0}}
# tuning.cc llMaxBws across boxes, by CPU vendor (Intel row 0, AMD row 1), N2 / N4 columns
LL_MAX_BW_NET = {"intel": (39.0, 20.4), "amd": (22.5, 19.0)}
# tuning.cc perCh* tables, N2 / N4 columns (the N1 column is the dicts below)
PER_CH_MAX_RING_LL128_BW_NET = {"volta": (20.0, 20.0), "ampere": (20.0, 20.0),
                                "hopper": (36.7, 36.7), "blackwell": (40.0, 40.0)}
PER_CH_MAX_TREE_BW_NET = {"volta": (18.5, 10.0), "ampere": (23.6, 17.8), "hopper": (41.4, 36.0),
                          "blackwell": (42.8, 24.0)}
PER_CH_MAX_TREE_LL128_BW_NET = {"volta": (20.0, 20.0), "ampere": (20.0, 20.0),
                                "hopper": (36.7, 29.0), "blackwell": (31.67, 20.0)}
# tuning.cc getNetOverhead: a network post costs 1 us on Intel, 2 us on AMD (x3 for Simple)
NET_OVERHEAD_US = {"intel": 1.0, "amd": 2.0}
# tuning.cc L648-650: ring Simple all-reduce across boxes, "plateau effect of ring"
RING_PLATEAU = {"volta": 1.9, "ampere": 1.4, "hopper": 1.4, "blackwell": 1.4}

# tuning.cc, single node (N1) column, by arch index volta/ampere/hopper/blackwell; GB/s
LL_MAX_BW = {"volta": 39.0, "ampere": 87.7, "hopper": 141.0, "blackwell": 282.0}
PER_CH_MAX_RING_LL128_BW = {"volta": 20.0, "ampere": 20.0, "hopper": 36.7, "blackwell": 40.0}
PER_CH_MAX_TREE_BW = {"volta": 26.5, "ampere": 24.0, "hopper": 38.7, "blackwell": 70.0}
PER_CH_MAX_TREE_LL128_BW = {"volta": 20.0, "ampere": 20.0, "hopper": 36.7, "blackwell": 55.6}
# tuning.cc treeCorrectionFactor[proto][log2(nBytes/64)], 64 B .. 512 MiB
TREE_CORRECTION = {
    "LL": (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0,
           1.0, 1.0, 1.0, 1.0),
    "LL128": (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9,
              .9, .9, 1.0, 1.0, 1.0),
    "Simple": (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7,
               .8, .9, .9, .9),
}
# Threads per channel (tuning.cc L244-258, device.h): threads_per_channel below.
# Bytes per thread below which enqueue.cc drops a channel (comm.h L49-51): LL 8 (x nRanks for
# ring LL), LL128 8, Simple 64.
THREAD_THRESHOLD = {"LL": 8, "LL128": 8, "Simple": 64}
# device.h NCCL_SIMPLE_MAX_NTHREADS, NCCL_LL_MAX_NTHREADS, NCCL_LL128_MAX_NTHREADS
SIMPLE_MAX_THREADS, LL_MAX_THREADS, LL128_MAX_THREADS = 512, 512, 640
PCI_BW = 12.0  # topo.h: "PCI Gen3 x16", the graph speed below which Simple gets 256 threads
MAX_CHANNELS = 64  # device.h MAXCHANNELS


def arch_index(compute_capability: int) -> str:
    """tuning.cc: >= 100 Blackwell, >= 90 Hopper, >= 80 Ampere (sm86/89 too), else Volta."""
    if compute_capability >= 100:
        return "blackwell"
    if compute_capability >= 90:
        return "hopper"
    if compute_capability >= 80:
        return "ampere"
    return "volta"


def ring_steps(op: str, n: int) -> int:
    """tuning.cc L289-291: 2(n-1) steps for all-reduce, n-1 for all-gather/reduce-scatter."""
    if op == "allreduce":
        return 2 * (n - 1)
    if op in ("allgather", "reducescatter"):
        return n - 1
    return n


@dataclass(frozen=True)
class Graph:
    """What NCCL's topology search found: channels, per-channel GB/s, and the link class."""

    n_ranks: int
    n_channels: int  # search channels, before the connect.cc duplication
    channel_bw_gbps: float  # NCCL's per-channel bandwidth (its own link constants)
    nvlink: bool  # every ring hop is NVLink (typeIntra <= NVB)
    arch: str  # arch_index()
    ll128_forced: bool = False  # NCCL_PROTO names LL128: enabled off NVLink too (pEnable 1)
    # across boxes
    n_nodes: int = 1
    cpu_vendor: str = "intel"  # comm->cpuVendor: the LL cap and net overhead across boxes
    ll128_inter: bool = True  # typeInter <= PXB (<= PXN from Hopper): LL128 allowed between boxes
    comm_channels: int = 0  # the communicator's channels (the ring's plateau rule reads them)
    tree_bw_gbps: float | None = None  # the tree graph's own per-channel speed (across boxes)

    @property
    def ppn(self) -> float:
        return self.n_ranks / self.n_nodes

    @property
    def column(self) -> int:
        """tuning.cc index2: 0 on one node, 1 on two, 2 beyond (0-based into the N2/N4 pairs
        below for the network tables)."""
        return 0 if self.n_nodes <= 2 else 1


@dataclass(frozen=True)
class Estimate:
    """NCCL's own time estimate for one algorithm and protocol (tuning.cc)."""

    algorithm: str
    protocol: str
    time_us: float
    bus_bw_gbps: float
    latency_us: float


def latency_us(graph: Graph, op: str, algorithm: str, protocol: str) -> float:
    """tuning.cc L384-431."""
    hw = HW_LATENCY["NVLINK" if graph.nvlink else "PCI"][algorithm][protocol]
    base = BASE_LATENCY[algorithm][protocol]
    n = graph.n_ranks
    if graph.n_nodes > 1:
        return _net_latency_us(graph, op, algorithm, protocol, hw, base)
    if algorithm == "tree":
        return base + 2 * (n - 1) * hw
    if op in ("broadcast", "reduce"):
        return base + hw  # all channels are alike on one node
    return base + ring_steps(op, n) * hw


def _net_latency_us(graph: Graph, op: str, algorithm: str, protocol: str, intra: float,
                    base: float) -> float:
    """Across boxes: inter-node steps at the NET latency (the tree's when one GPU a node), the
    rest at the intra-node one raised to the net overhead (tuning.cc L384-431)."""
    inter = NET_HW_LATENCY["tree" if graph.ppn == 1 else algorithm][protocol]
    nodes = graph.n_nodes
    if algorithm == "tree":
        return base + 2 * ((graph.ppn - 1) * intra + log2i(nodes) * inter)
    if op == "broadcast":  # sameChannels: one NET hop's latency (hw[a] = NET)
        return base + NET_HW_LATENCY["ring"][protocol]
    overhead = NET_OVERHEAD_US[graph.cpu_vendor] * (3 if protocol == "Simple" else 1)
    intra = max(intra, overhead)
    steps = ring_steps(op, graph.n_ranks)
    crossings = 2 * (nodes - 1) if op == "allreduce" else nodes - 1
    return base + (steps - crossings) * intra + crossings * inter


def log2i(n: int) -> int:
    """NCCL's log2i: the floor of log2 n."""
    return n.bit_length() - 1 if n > 0 else 0


def bus_bandwidth_gbps(graph: Graph, op: str, algorithm: str, protocol: str) -> float:
    """tuning.cc L304-382: NCCL's bus bandwidth for one (algorithm, protocol), 0 = disabled."""
    if algorithm == "tree" and op != "allreduce":
        return 0.0
    if protocol == "LL128" and not ((graph.nvlink and graph.ll128_inter) or graph.ll128_forced):
        return 0.0  # LL128 only where NVIDIA verified 128-byte store ordering (NVLink)
    nch = graph.n_channels
    per_channel = graph.tree_bw_gbps if algorithm == "tree" and graph.tree_bw_gbps else \
        graph.channel_bw_gbps  # tuning.cc: graphs[a]->bwIntra, each algorithm's own graph
    bw = nch * per_channel
    ll_max, ring_ll128, tree_max, tree_ll128 = caps(graph)
    if algorithm == "ring":
        if protocol == "LL":
            return min(ll_max, 0.5 * bw)
        if protocol == "LL128":
            return min(0.92 * bw, nch * ring_ll128)
        return bw
    # Tree all-reduce: the 0.92 / per-channel cap comes first and LL, LL128 scale what it left
    # (tuning.cc applies the refinements in sequence to the same busBw).
    tree = min(0.92 * bw, nch * tree_max)
    # No x0.85 here: tuning.cc applies it when comm->maxTreePattern is NCCL_TOPO_PATTERN_TREE,
    # and a single node's tree graph keeps the NCCL_TOPO_PATTERN_BALANCED_TREE it is searched
    # with (init.cc); search.cc only retries as TREE on sm90+, and without NICs both patterns
    # search the same GPU chains, so the retry never replaces the balanced result.
    if protocol == "LL":
        return min(tree / 3.8, ll_max)
    if protocol == "LL128":
        return min(tree * (7 / 9 if graph.n_nodes == 1 else 120 / 128), nch * tree_ll128)
    return tree


def caps(graph: Graph) -> tuple[float, float, float, float]:
    """llMaxBw and the per-channel ring LL128, tree and tree LL128 caps for the graph's node
    count (tuning.cc L263-275: one node by GPU arch, several by CPU vendor for LL)."""
    arch = graph.arch
    if graph.n_nodes == 1:
        return (LL_MAX_BW[arch], PER_CH_MAX_RING_LL128_BW[arch], PER_CH_MAX_TREE_BW[arch],
                PER_CH_MAX_TREE_LL128_BW[arch])
    col = graph.column
    return (LL_MAX_BW_NET[graph.cpu_vendor][col], PER_CH_MAX_RING_LL128_BW_NET[arch][col],
            PER_CH_MAX_TREE_BW_NET[arch][col], PER_CH_MAX_TREE_LL128_BW_NET[arch][col])


def algorithm_bandwidth_gbps(graph: Graph, op: str, algorithm: str, protocol: str,
                             nbytes: int) -> float:
    bus = bus_bandwidth_gbps(graph, op, algorithm, protocol)
    if algorithm == "ring":
        algbw = bus * graph.n_ranks / ring_steps(op, graph.n_ranks)
    else:
        algbw = bus * 0.5
        log_size = int(math.log2(nbytes >> 6)) if nbytes >= 64 else -1
        if 0 <= log_size < len(TREE_CORRECTION[protocol]):
            algbw *= TREE_CORRECTION[protocol][log_size]
    return algbw


def estimate(graph: Graph, op: str, nbytes: int, algorithm: str, protocol: str) -> float:
    """NCCL's predicted time in us (inf where the combination is disabled)."""
    algbw = algorithm_bandwidth_gbps(graph, op, algorithm, protocol, nbytes)
    if algbw <= 0:
        return math.inf
    latency = latency_us(graph, op, algorithm, protocol)
    if (algorithm == "ring" and protocol == "Simple" and graph.n_nodes > 1 and op == "allreduce"
            and nbytes / (max(1, graph.comm_channels) * graph.n_ranks) >= 64):
        latency *= RING_PLATEAU[graph.arch]  # tuning.cc L648-650
    return latency + nbytes / (1000 * algbw)


def choose(graph: Graph, op: str, nbytes: int, algorithms: tuple[str, ...] = ALGORITHMS,
           protocols: tuple[str, ...] = PROTOCOLS) -> Estimate:
    """The (algorithm, protocol) of least predicted time, as ``topoGetAlgoInfo`` picks it."""
    best: Estimate | None = None
    for algorithm in algorithms:
        for protocol in protocols:
            t = estimate(graph, op, nbytes, algorithm, protocol)
            if math.isfinite(t) and (best is None or t < best.time_us):
                best = Estimate(algorithm, protocol, t,
                                bus_bandwidth_gbps(graph, op, algorithm, protocol),
                                latency_us(graph, op, algorithm, protocol))
    if best is None:
        raise ValueError(f"no NCCL algorithm/protocol is enabled for {op} with {algorithms}")
    return best


def threads_per_channel(graph: Graph, algorithm: str, protocol: str,
                        env: NcclEnv = NO_ENV) -> int:
    """comm->maxThreads (tuning.cc L244-258): LL128 640; LL 512; Simple 512, but 256 for a ring
    whose graph is no faster than PCI_BW; NCCL_NTHREADS for Simple and LL. What enqueue.cc drops
    channels by, and what a ring's channels run (a tree kernel then runs 640 regardless)."""
    if protocol == "LL128":
        return LL128_MAX_THREADS
    if protocol == "Simple":
        slow = algorithm == "ring" and graph.n_channels * graph.channel_bw_gbps <= PCI_BW
        return env.threads(256 if slow else SIMPLE_MAX_THREADS, SIMPLE_MAX_THREADS)
    return env.threads(LL_MAX_THREADS, LL_MAX_THREADS)


def channels_used(graph: Graph, comm_channels: int, nbytes: int, algorithm: str,
                  protocol: str, env: NcclEnv = NO_ENV) -> int:
    """enqueue.cc L2093-2105: small messages drop channels until each thread has enough work."""
    threshold = THREAD_THRESHOLD[protocol]
    if algorithm == "ring" and protocol == "LL":
        threshold *= graph.n_ranks
    threads = threads_per_channel(graph, algorithm, protocol, env)
    nc = comm_channels
    while nc > 1 and nbytes < nc * threads * threshold:
        nc -= 1
    return nc
