"""The machine: GPUs, switches, CPUs and the links between them, as NCCL sees and uses them.

Inside: ``Machine`` (the graph of nodes and links, directed links, NCCL path types, P2P vs SHM
transport, routes, a link in words) and the ring and channel choice in ``Machine.ring`` (its
rules live in simulator/machine/rings.py). Each link's numbers and hop type come from links.py;
the best path between two nodes is paths.py's search; ``Machine.graph`` is the same machine as a
networkx graph, built when something asks for it (drawing, analysis), not for simulating.

Assumptions: a path between two GPUs never passes through a third GPU (NCCL's NVB paths,
NVLink relayed by an intermediate GPU, are not modelled); a GPU's socket is the CPU it reaches
without crossing a socket link. Capacities are physical (hardware.py); NCCL's own beliefs
(``topo.h`` constants) are kept beside them and used only to reproduce NCCL's decisions.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from simulator.errors import InputError, cut
from simulator.inputs.schema import CalibrationConfig, NodeConfig, TopologyConfig
from simulator.machine import hardware
from simulator.machine.links import Link, hop_type, link_numbers, node_gpu
from simulator.machine.nccl_env import NcclEnv
from simulator.machine.paths import PATH_RANK, PATH_TYPES, Hop, Path, PathFinder, unreached
from simulator.machine.wire import HOST_MEMORY_PASSES, WireParams
from simulator.scales import NEUTRAL, RateScales
from simulator.units import GB

if TYPE_CHECKING:
    import networkx as nx

    from simulator.machine.rings import Ring

Route = tuple[tuple[str, float], ...]


def _cpu_vendor(model: str | None) -> str | None:
    if model is None:
        return None
    return "amd" if model.startswith("amd") else "intel"


@dataclass
class Machine:
    """A modelled machine. Build it with :meth:`Machine.from_config`."""

    config: TopologyConfig
    gpu: hardware.GPU
    # node -> neighbour -> the link's attributes (kind, capacity, latency, nccl_bandwidth,
    # hop_type), in the topology file's order; one dict per link, shared by both ends
    adjacency: dict[str, dict[str, dict[str, Any]]]
    links: dict[str, Link]
    nodes: dict[str, NodeConfig]  # node id -> its entry in the topology file
    gpu_nodes: tuple[str, ...]  # node id of each rank
    nccl_link_bandwidth: dict[str, float]  # directed link id -> NCCL's belief, B/s
    gpus: tuple[hardware.GPU, ...] = ()  # the card at each rank (node `gpu`, else `gpu`)
    _paths: dict[tuple[str, str], Path] = field(default_factory=dict, repr=False)
    _routes: dict[tuple[int, int], Route] = field(default_factory=dict, repr=False)
    _types: dict[tuple[int, int], str] = field(default_factory=dict, repr=False)
    _rings: dict[tuple[int, ...], Ring] = field(default_factory=dict, repr=False)
    _cpus: dict[str, str | None] = field(default_factory=dict, repr=False)
    _finder: PathFinder | None = field(default=None, repr=False)
    _graph: nx.Graph | None = field(default=None, repr=False)
    _cpu_nodes: tuple[str, ...] | None = field(default=None, repr=False)
    scales: RateScales = NEUTRAL  # achieved-rate factors for range propagation (scales.py)
    # the physical collective parameters (wire.py), with the topology's calibration applied
    wire: WireParams = field(default_factory=WireParams)
    nccl: NcclEnv = field(default_factory=NcclEnv)  # NCCL_* variables in force (nccl_env.py)
    _jobs: dict[str, Machine] = field(default_factory=dict, repr=False)

    @property
    def calibration(self) -> CalibrationConfig | None:
        """What `stepsim calibrate` fitted (values, sources, residuals), or None."""
        return self.config.calibration

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def description(self) -> str:
        return self.config.description

    @property
    def n_gpus(self) -> int:
        return len(self.gpu_nodes)

    @property
    def cpu_nodes(self) -> tuple[str, ...]:
        """The CPU (socket) nodes, in the file's order."""
        if self._cpu_nodes is None:
            self._cpu_nodes = tuple(n for n, c in self.nodes.items() if c.kind == "cpu")
        return self._cpu_nodes

    @property
    def graph(self) -> nx.Graph:
        """The machine as a networkx graph (nodes: kind, config; edges: the link attributes)."""
        if self._graph is None:
            import networkx as nx

            graph = nx.Graph(name=self.config.name)
            for node in self.config.nodes:
                graph.add_node(node.id, kind=node.kind, config=node)
            for lc in self.config.links:
                graph.add_edge(lc.a, lc.b, **self.adjacency[lc.a][lc.b])
            self._graph = graph
        return self._graph

    @property
    def paths(self) -> PathFinder:
        """The best-path search over this machine's links (paths.py), built once."""
        if self._finder is None:
            hops = {u: {v: Hop(PATH_RANK[e["hop_type"]], e["nccl_bandwidth"], e["capacity"])
                        for v, e in nbrs.items()} for u, nbrs in self.adjacency.items()}
            self._finder = PathFinder(hops, set(self.gpu_nodes))
        return self._finder

    # --- construction -----------------------------------------------------------------

    @classmethod
    def from_config(cls, config: TopologyConfig, nccl: NcclEnv | None = None) -> Machine:
        gpu = hardware.resolve_gpu(config.gpu)
        nodes = {node.id: node for node in config.nodes}
        adjacency: dict[str, dict[str, dict[str, Any]]] = {node.id: {} for node in config.nodes}
        links: dict[str, Link] = {}
        nccl_bw: dict[str, float] = {}
        wire = WireParams.from_calibration(config.calibration)
        for lc in config.links:
            kind_a, kind_b = nodes[lc.a].kind, nodes[lc.b].kind
            capacity, latency, belief = link_numbers(lc, config, gpu, nodes)
            if lc.kind in ("upi", "xgmi") and wire.socket_link_gb_per_s is not None:
                capacity = wire.socket_link_gb_per_s * GB  # calibrated (calibration.fitted)
            attrs = adjacency[lc.a].get(lc.b, {})  # a link given twice: the last one counts
            attrs.update(kind=lc.kind, capacity=capacity, latency=latency,
                         nccl_bandwidth=belief, hop_type=hop_type(kind_a, kind_b, lc.kind))
            adjacency[lc.a][lc.b] = adjacency[lc.b][lc.a] = attrs
            for src, dst in ((lc.a, lc.b), (lc.b, lc.a)):
                link_id = f"{src}->{dst}"
                links[link_id] = Link(link_id, src, dst, lc.kind, capacity, latency)
                nccl_bw[link_id] = belief
        for node in config.nodes:
            if node.kind == "cpu":
                mem = (node.memory_bandwidth_gb_per_s * GB if node.memory_bandwidth_gb_per_s
                       else hardware.DEFAULT_HOST_MEMORY_BANDWIDTH)
                if wire.host_memory_gb_per_s is not None:
                    mem = wire.host_memory_gb_per_s * GB  # calibrated (calibration.fitted)
                links[f"mem:{node.id}"] = Link(f"mem:{node.id}", node.id, node.id, "memory",
                                               mem, 0.0)
        gpu_nodes = tuple(n.id for n in config.nodes if n.kind == "gpu")
        lonely = unreached(adjacency, gpu_nodes[0])
        if lonely:
            raise InputError(f"{cut(config.name)}: node(s) {cut(', '.join(sorted(lonely)))} are "
                             f"not connected to {cut(gpu_nodes[0])}")
        gpus = tuple(node_gpu(nodes[n], gpu) for n in gpu_nodes)
        return cls(config, gpu, adjacency, links, nodes, gpu_nodes, nccl_bw, gpus, wire=wire,
                   nccl=nccl or NcclEnv())

    def for_job(self, workload: str) -> Machine:
        """The machine whose cards run at the compute fraction measured for this workload
        (the topology's calibration.compute, `stepsim calibrate --step-time`); itself if none."""
        calibration = self.config.calibration
        fractions = {c.gpu: c.achieved_fraction for c in calibration.compute
                     if c.workload == workload} if calibration else {}
        if not fractions:
            return self
        if workload not in self._jobs:
            def measured(card: hardware.GPU) -> hardware.GPU:
                share = fractions.get(card.name)
                return card if share is None else replace(card, achieved_fraction=share)

            self._jobs[workload] = replace(self, gpu=measured(self.gpu),
                                           gpus=tuple(measured(g) for g in self.gpus), _jobs={})
        return self._jobs[workload]

    def with_nccl(self, nccl: NcclEnv) -> Machine:
        """The same machine under other NCCL_* variables (a fresh one: paths and rings differ)."""
        if nccl == self.nccl:
            return self
        fresh = Machine.from_config(self.config, nccl)
        return fresh if self.scales.neutral else fresh.with_scales(self.scales)

    def with_scales(self, scales: RateScales) -> Machine:
        """The same machine with its mechanisms' achieved rates scaled (simulator/scales.py)."""
        return replace(self, gpu=replace(self.gpu, rate_scale=scales.compute), scales=scales)

    def subset(self, k: int) -> Machine:
        """The same machine with only its first ``k`` GPUs (their links dropped with them)."""
        if k < 1:
            raise InputError(f"--gpus {k}: must be at least 1")
        if k > self.n_gpus:
            raise InputError(f"--gpus {k}: the machine {self.name} has {self.n_gpus} GPUs")
        if k == self.n_gpus:
            return self
        dropped = set(self.gpu_nodes[k:])
        nodes = [n for n in self.config.nodes if n.id not in dropped]
        links = [lc for lc in self.config.links if lc.a not in dropped and lc.b not in dropped]
        part = Machine.from_config(self.config.copy(nodes=nodes, links=links), self.nccl)
        return part if self.scales.neutral else part.with_scales(self.scales)

    def gpu_of(self, rank: int) -> hardware.GPU:
        """The card at ``rank``: its node's `gpu` where given, else the machine's `gpu`."""
        return self.gpus[rank] if self.gpus else self.gpu

    def cards(self) -> dict[hardware.GPU, tuple[int, ...]]:
        """Each distinct card and its ranks, in rank order (one entry unless a mixed box)."""
        out: dict[hardware.GPU, tuple[int, ...]] = {}
        for rank in range(self.n_gpus):
            card = self.gpu_of(rank)
            out[card] = (*out.get(card, ()), rank)
        return out

    def smallest_card(self) -> hardware.GPU:
        """The card with the least memory: where a job the same on every rank fits last."""
        return min(self.cards(), key=lambda card: card.memory_bytes)

    def as_if_every_gpu(self, card: hardware.GPU) -> Machine:
        """This machine with ``card`` as its default GPU (links and routes shared): what a
        strategy reads to time one group's ops."""
        return replace(self, gpu=card, gpus=())

    # --- paths and transports ---------------------------------------------------------

    def best_path(self, a: str, b: str) -> Path:
        """NCCL's path between two nodes: lowest type, then widest, then shortest (paths.py)."""
        cached = self._paths.get((a, b))
        if cached is not None:
            return cached
        nodes = self.paths.best(a, b)
        if nodes is None:
            raise InputError(f"{cut(self.name)}: no path from {cut(a)} to {cut(b)} that avoids "
                             "other GPUs")
        best = self._make_path(nodes)
        self._paths[(a, b)] = best
        return best

    def _make_path(self, nodes: tuple[str, ...]) -> Path:
        hops = list(zip(nodes, nodes[1:], strict=False))
        edges = [self.adjacency[u][v] for u, v in hops]
        return Path(nodes, tuple(f"{u}->{v}" for u, v in hops),
                    max((e["hop_type"] for e in edges), key=PATH_RANK.__getitem__),
                    min(e["nccl_bandwidth"] for e in edges), min(e["capacity"] for e in edges))

    def local_cpu(self, rank: int) -> str | None:
        """The CPU (socket) closest to a GPU, as ncclGetLocalCpu picks it; None if no CPU.

        The best path type alone settles it unless two CPUs tie on it (then whole paths)."""
        node = self.gpu_nodes[rank]
        if node not in self._cpus:
            cpus = self.cpu_nodes
            types: dict[str, int] = {}
            for c in cpus:
                t = self.paths.type_rank(node, c)
                if t is None:
                    raise InputError(f"{cut(self.name)}: no path from {cut(node)} to {cut(c)} "
                                     "that avoids "
                                     "other GPUs")
                types[c] = t
            closest = [c for c in cpus if types[c] == min(types.values())]
            if len(closest) > 1:
                closest = [min(closest, key=lambda c: self.best_path(node, c).key())]
            self._cpus[node] = closest[0] if closest else None
        return self._cpus[node]

    def path_type(self, i: int, j: int) -> str:
        """NCCL's path type between two GPUs, as `nvidia-smi topo -m` shows it."""
        if i == j:
            return "LOC"
        known = self._types.get((i, j))
        if known is not None:
            return known
        rank = self.paths.type_rank(self.gpu_nodes[i], self.gpu_nodes[j])
        if rank is None:
            raise InputError(f"{cut(self.name)}: no path from {cut(self.gpu_nodes[i])} to "
                             f"{cut(self.gpu_nodes[j])} that avoids other GPUs")
        self._types[(i, j)] = PATH_TYPES[rank]
        return PATH_TYPES[rank]

    def p2p_allowed(self, path_type: str) -> bool:
        """paths.cc ncclTopoCheckP2p: NVLink always; PCIe only if the driver allows peer
        access and the type is at most the P2P level (NCCL_P2P_LEVEL, else the topology's
        p2p_level; LOC = NCCL_P2P_DISABLE)."""
        level = self.nccl.p2p_level or self.config.p2p_level
        if level == "LOC":
            return False
        if path_type in ("NVL", "NVB"):
            return True
        return self.config.p2p and PATH_RANK[path_type] <= PATH_RANK[level]

    def transport(self, i: int, j: int) -> str:
        """"P2P", "SHM" (staged through the receiver's host memory) or "NET" (NCCL_SHM_DISABLE:
        sockets over loopback, staged through host memory too)."""
        kind = self.path_type(i, j)
        if kind == "NET":
            return "NET"
        if i == j or self.p2p_allowed(kind):
            return "P2P"
        return "NET" if self.nccl.shm_disable else "SHM"

    def nccl_path(self, i: int, j: int) -> Path:
        """The GPU-to-GPU path NCCL's search walks: without P2P it is rerouted through the
        receiver's CPU (paths.cc addInterStep): type max of both halves, bandwidth the min."""
        direct = self.best_path(self.gpu_nodes[i], self.gpu_nodes[j])
        if self.transport(i, j) == "P2P" or direct.type == "NET":
            return direct
        cpu = self._staging_cpu(j)
        up, down = self.best_path(self.gpu_nodes[i], cpu), self.best_path(cpu, self.gpu_nodes[j])
        return Path(up.nodes + down.nodes[1:], up.links + down.links,
                    max(up.type, down.type, key=PATH_RANK.__getitem__),
                    min(up.nccl_bandwidth, down.nccl_bandwidth), min(up.capacity, down.capacity))

    def nccl_path_bandwidth(self, i: int, j: int) -> float:
        return self.nccl_path(i, j).nccl_bandwidth

    def _staging_cpu(self, receiver: int) -> str:
        cpu = self.local_cpu(receiver)
        if cpu is None:
            raise InputError(f"{cut(self.name)}: no CPU node to stage SHM transfers through "
                             f"(add a cpu node, or allow P2P)")
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
        if i == j:
            route: Route = ()
        elif (transport := self.transport(i, j)) != "P2P" and self.path_type(i, j) != "NET":
            cpu = self._staging_cpu(j)
            up = self.best_path(self.gpu_nodes[i], cpu).links
            down = self.best_path(cpu, self.gpu_nodes[j]).links
            passes = float(HOST_MEMORY_PASSES[transport])
            route = _merge([(lid, 1.0) for lid in up] + [(f"mem:{cpu}", passes)]
                           + [(lid, 1.0) for lid in down])
        else:
            path = self.best_path(self.gpu_nodes[i], self.gpu_nodes[j])
            route = tuple((lid, 1.0) for lid in path.links)
        self._routes[(i, j)] = route
        return route

    def route_latency(self, i: int, j: int) -> float:
        """Sum of the hop latencies along ``route(i, j)``, seconds."""
        return sum(self.links[lid].latency for lid, _ in self.route(i, j))

    def bottleneck_bandwidth(self, i: int, j: int) -> float:
        """Physical rate of one lone transfer from i to j: min over its route of capacity/weight."""
        route = self.route(i, j)
        if not route:
            return float("inf")
        return min(self.links[lid].capacity / w for lid, w in route)

    def describe(self, link_id: str) -> str:
        """A link in words, for reports: ``cpu0->sw0`` is "sw0's uplink to cpu0, down"."""
        link = self.links.get(link_id)
        if link is None:
            return link_id
        if link.kind == "memory":
            return f"host memory of {link.src}, where SHM stages every byte"
        src, dst = (self.nodes[n].kind if n in self.nodes else None for n in (link.src, link.dst))
        way = "up" if dst == "cpu" or (dst == "pcie_switch" and src == "gpu") else "down"
        if link.kind in ("upi", "xgmi"):
            return f"the socket link {link.src} to {link.dst}"
        if link.kind == "nvlink":
            return f"NVLink {link.src} to {link.dst}"
        if {src, dst} == {"pcie_switch", "cpu"}:
            switch = link.src if src == "pcie_switch" else link.dst
            return f"the uplink of PCIe switch {switch}, {way}"
        if "gpu" in (src, dst):
            gpu = link.src if src == "gpu" else link.dst
            return f"{gpu}'s own PCIe link, {way}"
        return f"{link.kind} link {link.src} to {link.dst}"

    def is_intel_cpu(self, node: str) -> bool:
        config = self.nodes[node]
        if config.kind != "cpu":
            return False
        return _cpu_vendor(self._cpu_model(config)) == "intel"

    def _cpu_model(self, node: NodeConfig) -> str | None:
        if node.model:
            return node.model
        for data in self.adjacency[node.id].values():
            if data["kind"] in hardware.DEFAULT_SOCKET_LINK:
                return hardware.DEFAULT_SOCKET_LINK[data["kind"]]
        return None

    # --- rings ------------------------------------------------------------------------

    def ring(self, ranks: tuple[int, ...] | list[int] | None = None) -> Ring:
        """NCCL's ring over ``ranks`` (default all): order, channels, per-channel speed."""
        from simulator.machine.rings import search_ring  # rings.py builds on Machine

        key = tuple(range(self.n_gpus)) if ranks is None else tuple(ranks)
        if key not in self._rings:
            self._rings[key] = search_ring(self, key)
        return self._rings[key]


def _merge(usage: list[tuple[str, float]]) -> Route:
    """Sum the weights of a link that appears twice, keeping first-seen order."""
    total: dict[str, float] = {}
    for lid, w in usage:
        total[lid] = total.get(lid, 0.0) + w
    return tuple(total.items())


