"""NCCL over one machine: which transport joins each pair of GPUs, the links a byte crosses,
the rings and the plans of any group's collectives, under the ``NCCL_*`` variables in force.

A ``Communicator`` is NCCL's view of a machine (``ncclTopoSystem`` and the communicator built
on it): the machine itself (machine/) knows only its hardware and NCCL's path types over it;
everything that depends on NCCL's choices lives here and is worked out once per communicator.
A group of ranks is a split of it: its ring and plans come from the same object.

It is also what the engine is handed to run a step on (engine/network.py): the links'
capacities, the SMs of each GPU, and a plan (flows on links, channels) for every collective
and point-to-point transfer a program asks for.
"""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING, Any

from simulator.errors import InputError, cut
from simulator.machine.build import load_machine
from simulator.machine.links import pcie_generations
from simulator.machine.paths import PATH_RANK, Path
from simulator.machine.scales import NEUTRAL, RateScales
from simulator.nccl.env import NO_ENV, NcclEnv
from simulator.nccl.wire import HOST_MEMORY_PASSES, WireParams

if TYPE_CHECKING:
    from simulator.machine.topology import Machine
    from simulator.nccl.alltoall import PatternPlan
    from simulator.nccl.collectives import Plan
    from simulator.nccl.net import NetTransport
    from simulator.nccl.rings import Ring

Route = tuple[tuple[str, float], ...]


class Communicator:
    """NCCL over ``machine`` under ``env``, moving bytes at the costs of ``wire`` (default: the
    topology's calibration applied to wire.py's defaults)."""

    def __init__(self, machine: Machine, env: NcclEnv = NO_ENV,
                 wire: WireParams | None = None) -> None:
        self.machine = machine
        self.env = env
        self.wire = wire or WireParams.from_calibration(machine.config.calibration)
        self.plans: dict[tuple[Any, ...], Any] = {}  # collectives.py's, by call
        self._routes: dict[tuple[int, int], Route] = {}
        self._rings: dict[tuple[int, ...], Ring] = {}
        self._gens: dict[str, int] | None = None
        self._net: NetTransport | None = None

    @property
    def net(self) -> NetTransport:
        """NCCL's network transport between the machine's boxes (nccl/net.py)."""
        if self._net is None:
            from simulator.nccl.net import NetTransport

            self._net = NetTransport(self)
        return self._net

    @property
    def n_gpus(self) -> int:
        return self.machine.n_gpus

    # --- transports -------------------------------------------------------------------

    def p2p_allowed(self, path_type: str) -> bool:
        """paths.cc ncclTopoCheckP2p: NVLink always; PCIe only if the driver allows peer
        access and the type is at most the P2P level (NCCL_P2P_LEVEL, else the topology's
        p2p_level; LOC = NCCL_P2P_DISABLE)."""
        config = self.machine.config
        level = self.env.p2p_level or config.p2p_level
        if level == "LOC":
            return False
        if path_type in ("NVL", "NVB"):
            return True
        return config.p2p and PATH_RANK[path_type] <= PATH_RANK[level]

    def transport(self, i: int, j: int) -> str:
        """"P2P", "SHM" (staged through the receiver's host memory), "NET" (NCCL_SHM_DISABLE:
        sockets over loopback, staged through host memory too), or between boxes "NET/IB" or
        "NET/Socket" (nccl/net.py)."""
        return "P2P" if i == j else self.transport_over(self.machine.path_type(i, j))

    def transport_over(self, path_type: str) -> str:
        """The transport between two distinct GPUs whose path has this type: the one rule
        every command and model asks (``transport(i, j)`` applies it to a pair)."""
        if path_type == "NET":
            return f"NET/{self.net.name}" if self.machine.nnodes > 1 else "NET"
        if self.p2p_allowed(path_type):
            return "P2P"
        return "NET" if self.env.shm_disable else "SHM"

    def mechanism(self, a: int, b: int) -> str | None:
        """Which mechanism of machine/scales.py carries bytes from rank a to rank b (None: the
        network, or itself)."""
        if a == b:
            return None
        if self.machine.path_type(a, b) == "NVL":
            return "nvlink"
        transport = self.transport(a, b)
        if transport == "SHM":
            return "shm"
        if transport.startswith("NET/"):  # between boxes: verbs or sockets
            return "net_ib" if transport == "NET/IB" else "net_socket"
        return "pcie_p2p" if transport == "P2P" else None

    def nccl_path(self, i: int, j: int) -> Path:
        """The GPU-to-GPU path NCCL's search walks: without P2P it is rerouted through the
        receiver's CPU (paths.cc addInterStep): type max of both halves, bandwidth the min."""
        m = self.machine
        direct = m.best_path(m.gpu_nodes[i], m.gpu_nodes[j])
        if self.transport(i, j) == "P2P" or direct.type == "NET":
            return direct
        cpu = self._staging_cpu(j)
        up, down = m.best_path(m.gpu_nodes[i], cpu), m.best_path(cpu, m.gpu_nodes[j])
        return Path(up.nodes + down.nodes[1:], up.links + down.links,
                    max(up.type, down.type, key=PATH_RANK.__getitem__),
                    min(up.nccl_bandwidth, down.nccl_bandwidth), min(up.capacity, down.capacity))

    def _staging_cpu(self, receiver: int) -> str:
        cpu = self.machine.local_cpu(receiver)
        if cpu is None:
            raise InputError(f"{cut(self.machine.name)}: no CPU node to stage SHM transfers "
                             "through (add a cpu node, or allow P2P)")
        return cpu

    def route(self, i: int, j: int) -> Route:
        """The links one byte from GPU i to GPU j crosses, with bytes per byte sent.

        P2P follows NCCL's best path. SHM goes up to the host memory of the receiver's socket
        and back down (shm.cc, NCCL_SHM_LOCALITY=2); the memory is written and read: weight 2.
        NET over loopback takes the same way with the socket's copies added (wire.py).
        """
        cached = self._routes.get((i, j))
        if cached is not None:
            return cached
        m = self.machine
        if i == j:
            route: Route = ()
        elif m.nnodes > 1 and m.path_type(i, j) == "NET":
            route = _merge(list(self.net.route(i, j)))
        elif (transport := self.transport(i, j)) != "P2P" and m.path_type(i, j) != "NET":
            cpu = self._staging_cpu(j)
            up = m.best_path(m.gpu_nodes[i], cpu).links
            down = m.best_path(cpu, m.gpu_nodes[j]).links
            passes = float(HOST_MEMORY_PASSES[transport])
            route = _merge([(lid, 1.0) for lid in up] + [(f"mem:{cpu}", passes)]
                           + [(lid, 1.0) for lid in down])
        else:
            path = m.best_path(m.gpu_nodes[i], m.gpu_nodes[j])
            route = tuple((lid, 1.0) for lid in path.links)
        self._routes[(i, j)] = route
        return route

    def route_latency(self, i: int, j: int) -> float:
        """Sum of the hop latencies along ``route(i, j)``, seconds."""
        return sum(self.machine.links[lid].latency for lid, _ in self.route(i, j))

    def bottleneck_bandwidth(self, i: int, j: int) -> float:
        """Physical rate of one lone transfer from i to j: min over its route of capacity/weight."""
        route = self.route(i, j)
        if not route:
            return float("inf")
        return min(self.machine.links[lid].capacity / w for lid, w in route)

    def bottleneck_row(self, i: int) -> list[float]:
        """``bottleneck_bandwidth(i, j)`` for every GPU j (inf for i itself), without a route
        per pair: the best paths' capacities in one sweep from i, and for a staged pair the
        thinnest of the way up to the receiver's socket, its memory and the way down."""
        m = self.machine
        source = m.gpu_nodes[i]
        types = m.path_type_row(i)
        transports = ["P2P" if j == i else self.transport_over(kind)
                      for j, kind in enumerate(types)]
        direct_to = [m.gpu_nodes[j] for j, (kind, how) in enumerate(zip(types, transports,
                                                                        strict=True))
                     if j != i and (how == "P2P" or kind == "NET")]
        direct = m.path_capacities(source, direct_to) if direct_to else {}
        up: dict[str, float] = {}  # the way from i to each socket it stages through
        row = []
        for j, node in enumerate(m.gpu_nodes):
            if j == i:
                row.append(float("inf"))
            elif m.nnodes > 1 and types[j] == "NET":  # staged or not, through the NICs
                row.append(self.bottleneck_bandwidth(i, j))
            elif node in direct:
                row.append(direct[node])
            else:
                cpu = self._staging_cpu(j)
                if cpu not in up:
                    up[cpu] = m.best_path(source, cpu).capacity
                memory = m.links[f"mem:{cpu}"].capacity / HOST_MEMORY_PASSES[transports[j]]
                row.append(min(up[cpu], memory, m.best_path(cpu, node).capacity))
        return row

    def pcie_generation(self, link_id: str) -> int | None:
        """The PCIe generation of a directed link (None: not a PCIe link)."""
        if self._gens is None:
            m = self.machine
            self._gens = pcie_generations(m.config, m.gpu, m.nodes)
        return self._gens.get(link_id)

    # --- rings and plans --------------------------------------------------------------

    def ring(self, ranks: tuple[int, ...] | list[int] | None = None) -> Ring:
        """NCCL's ring over ``ranks`` (default all): order, channels, per-channel speed."""
        from simulator.nccl.rings import search_ring  # rings.py builds on this class

        key = tuple(range(self.n_gpus)) if ranks is None else tuple(ranks)
        if key not in self._rings:
            if self.machine.nnodes > 1 and self.machine.boxes_of(key) > 1:
                from simulator.nccl.net_rings import search

                self._rings[key] = search(self, key)
            else:
                self._rings[key] = search_ring(self, key)
        return self._rings[key]

    def channels(self) -> int:
        """Channels of the communicator over the whole machine (NCCL's buffers scale with it):
        connect.cc doubles the search's rings, then NCCL_MIN/MAX_NCHANNELS clamp them."""
        from simulator.nccl.collectives import comm_channels

        if self.n_gpus == 1:
            return 1
        ring = self.ring()
        if ring.n_nodes > 1:
            from simulator.nccl.net_rings import comm_channels as net_channels

            return self.env.channels(net_channels(ring.n_channels, ring.channel_bandwidth / 1e9,
                                                  self.machine.gpu.compute_capability,
                                                  ring.n_nodes))
        return self.env.channels(comm_channels(ring.n_channels))

    def plan(self, op: str, nbytes: int, ranks: tuple[int, ...] | None = None,
             algo: str = "auto", protocol: str | None = None) -> Plan | PatternPlan:
        """NCCL's decisions for one call and its flows, kept: steps repeat the same sizes.
        Collectives (collectives.py) are one flow; all-to-all, gather, scatter and sendrecv
        (alltoall.py) one per pair."""
        from simulator.nccl import alltoall

        if op in alltoall.OPS:
            if algo not in ("auto", "p2p") or protocol is not None:
                raise InputError(f"{op} runs as NCCL's point-to-point tasks: no algorithm or "
                                 "protocol to choose (NCCL_P2P_LL_THRESHOLD sets LL)")
            return alltoall.plan(self, op, nbytes, ranks)
        return self.ring_plan(op, nbytes, ranks, algo, protocol)

    def ring_plan(self, op: str, nbytes: int, ranks: tuple[int, ...] | None = None,
                  algo: str = "auto", protocol: str | None = None) -> Plan:
        """A ring or tree collective's plan: inside one box (collectives.py) or across boxes
        (multinode.py)."""
        from simulator.nccl import collectives

        if self.machine.nnodes > 1 and (ranks is None or self.machine.boxes_of(ranks) > 1):
            from simulator.nccl import multinode

            return multinode.plan(self, op, nbytes, ranks, algo, protocol)
        return collectives.plan(self, op, nbytes, ranks, algo, protocol)

    # --- what the engine runs on (engine/network.py) ----------------------------------

    def capacities(self) -> dict[str, float]:
        return {lid: link.capacity for lid, link in self.machine.links.items()}

    def sms(self, rank: int) -> int:
        return self.machine.gpu_of(rank).sms

    def collective(self, op: str, nbytes: int, ranks: tuple[int, ...]) -> Plan | PatternPlan:
        return self.plan(op, nbytes, ranks)

    def sendrecv(self, src: int, dst: int, nbytes: int) -> Plan:
        from simulator.nccl import collectives

        if self.machine.nnodes > 1 and self.machine.box_of(src) != self.machine.box_of(dst):
            from simulator.nccl import multinode

            return multinode.p2p_plan(self, src, dst, nbytes)
        return collectives.p2p_plan(self, src, dst, nbytes)


def _merge(usage: list[tuple[str, float]]) -> Route:
    """Sum the weights of a link that appears twice, keeping first-seen order."""
    total: dict[str, float] = {}
    for lid, w in usage:
        total[lid] = total.get(lid, 0.0) + w
    return tuple(total.items())


def load_communicator(topology: str, gpus: int | None = None, scales: RateScales = NEUTRAL,
                      env: NcclEnv = NO_ENV, nnodes: int | None = None) -> Communicator:
    """NCCL over the machine ``load_machine(topology, gpus, scales, nnodes)`` under ``env``,
    built once per process for each of them (rings and plans are worked out once)."""
    return _communicator(topology, gpus, scales, env, nnodes)


@lru_cache(maxsize=64)
def _communicator(topology: str, gpus: int | None, scales: RateScales,
                  env: NcclEnv, nnodes: int | None = None) -> Communicator:
    return Communicator(load_machine(topology, gpus, scales, nnodes), env)


def forget_communicators() -> None:
    _communicator.cache_clear()


def transport_effects(comm: Communicator, plain: Communicator) -> list[str]:
    """GPU pairs whose transport NCCL's variables changed (``plain``: the machine without
    them), in words."""
    n = comm.n_gpus
    pairs = [(i, j) for i in range(n) for j in range(n) if i != j]
    moved: dict[tuple[str, str], int] = {}
    for i, j in pairs:
        before, after = plain.transport(i, j), comm.transport(i, j)
        if before != after:
            moved[(before, after)] = moved.get((before, after), 0) + 1
    why = {"SHM": "staged through host memory", "P2P": "peer-to-peer",
           "NET": "sockets over loopback, staged through host memory",
           "NET/IB": "verbs between boxes", "NET/Socket": "TCP sockets between boxes"}
    return [f"{count} of {len(pairs)} GPU pairs use {after} ({why[after]}) instead of {before}"
            for (before, after), count in sorted(moved.items())]
