"""The machine: GPUs, switches, CPUs and the links between them, as a networkx graph.

Inside: ``Machine``, whose ``graph`` (a ``networkx.DiGraph`` built once from the topology file:
nodes with their ``kind`` and ``config``, each link as two directed edges with its ``id``,
``kind``, ``capacity``, ``latency``, NCCL's believed ``nccl_bandwidth`` and the hop's path type
``hop_type``/``rank``) is what paths, rings, transports, drawing and analysis read; NCCL's path
types and best paths over it (paths.py), each GPU's socket, a link in words. Each link's
numbers and hop type come from links.py. What NCCL makes of it (transports, routes, rings) is
nccl/communicator.py's.

Assumptions: a path between two GPUs never passes through a third GPU (NCCL's NVB paths,
NVLink relayed by an intermediate GPU, are not modelled); a GPU's socket is the CPU it reaches
without crossing a socket link. Capacities are physical (catalog/); NCCL's own beliefs
(``topo.h`` constants) are kept beside them and used only to reproduce NCCL's decisions.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property

import networkx as nx

from simulator.catalog import gpus as gpu_catalog
from simulator.catalog import links as link_catalog
from simulator.catalog import software
from simulator.catalog.software import TODAY, Stack
from simulator.errors import InputError, cut
from simulator.inputs.schema import CalibrationConfig, NodeConfig, TopologyConfig
from simulator.machine.cards import node_gpu, resolve_gpu
from simulator.machine.links import Link, hop_type, link_numbers
from simulator.machine.paths import PATH_RANK, PATH_TYPES, Path, PathFinder, unreached
from simulator.machine.scales import NEUTRAL, RateScales
from simulator.units import GB


def _cpu_vendor(model: str | None) -> str | None:
    if model is None:
        return None
    return "amd" if model.startswith("amd") else "intel"


@dataclass
class Machine:
    """A modelled machine. Build it with :meth:`Machine.from_config`."""

    config: TopologyConfig
    gpu: gpu_catalog.GPU
    # nodes (kind, config) and directed links (id, kind, capacity, latency, nccl_bandwidth,
    # hop_type, rank), each node's successors in the topology file's order
    graph: nx.DiGraph
    # every directed link and host-memory resource ("mem:cpu0") as the fabric carries them,
    # in the file's order: read off the graph once
    links: dict[str, Link]
    gpu_nodes: tuple[str, ...]  # node id of each rank
    gpus: tuple[gpu_catalog.GPU, ...] = ()  # the card at each rank (node `gpu`, else `gpu`)
    _paths: dict[tuple[str, str], Path] = field(default_factory=dict, repr=False)
    _types: dict[tuple[int, int], str] = field(default_factory=dict, repr=False)
    _cpus: dict[str, str | None] = field(default_factory=dict, repr=False)
    _finder: PathFinder | None = field(default=None, repr=False)
    _cpu_nodes: tuple[str, ...] | None = field(default=None, repr=False)
    scales: RateScales = NEUTRAL  # achieved-rate factors for range propagation (scales.py)
    # the machine as each job runs it (for_job); not carried over by ``replace``: a machine at
    # other rates (with_scales) or with other cards must work its own out
    _jobs: dict[tuple[str, Stack, str], Machine] = field(default_factory=dict, init=False,
                                                    repr=False)
    # several boxes (machine/cluster.py): how many, and the file's one box they copy
    nnodes: int = 1
    box: TopologyConfig | None = None

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

    @cached_property
    def nodes(self) -> dict[str, NodeConfig]:
        """Node id -> its entry in the topology file (read off the graph once)."""
        configs: dict[str, NodeConfig] = dict(self.graph.nodes(data="config"))
        return configs

    @property
    def cpu_nodes(self) -> tuple[str, ...]:
        """The CPU (socket) nodes, in the file's order."""
        if self._cpu_nodes is None:
            self._cpu_nodes = tuple(n for n, kind in self.graph.nodes(data="kind")
                                    if kind == "cpu")
        return self._cpu_nodes

    @property
    def paths(self) -> PathFinder:
        """The best-path search over this machine's graph (paths.py), built once."""
        if self._finder is None:
            self._finder = PathFinder(self.graph, set(self.gpu_nodes))
        return self._finder

    # --- construction -----------------------------------------------------------------

    @property
    def gpus_per_box(self) -> int:
        return self.n_gpus // self.nnodes

    def box_of(self, rank: int) -> int:
        """The box of a rank: torchrun's node rank (boxes fill in rank order)."""
        return rank // self.gpus_per_box

    def boxes_of(self, ranks: tuple[int, ...] | list[int]) -> int:
        """How many boxes a group of ranks spans."""
        return len({self.box_of(r) for r in ranks})

    @cached_property
    def nic_nodes(self) -> tuple[str, ...]:
        """The NIC nodes, in the file's order (box by box on a cluster)."""
        return tuple(n for n, kind in self.graph.nodes(data="kind") if kind == "nic")

    @classmethod
    def from_config(cls, config: TopologyConfig) -> Machine:
        """The machine of a topology: one box, or ``config.nnodes`` of them on its network."""
        if config.nnodes > 1:
            problems = config.network_errors()
            if problems:
                raise InputError(f"{cut(config.name)}: {problems[0][1]}")
            from simulator.machine.cluster import cluster_config

            flat = cls.from_config(cluster_config(config, config.nnodes))
            return replace(flat, nnodes=config.nnodes, box=config)
        gpu = resolve_gpu(config.gpu)
        nodes = {node.id: node for node in config.nodes}
        graph = nx.DiGraph(name=config.name)
        for node in config.nodes:
            graph.add_node(node.id, kind=node.kind, config=node)
        # what `stepsim calibrate` fitted of the hardware itself (calibration.fitted)
        fitted = {f.parameter: f.value for f in config.calibration.fitted} \
            if config.calibration else {}
        for lc in config.links:  # a link given twice: the last one counts
            capacity, latency, belief = link_numbers(lc, config, gpu, nodes)
            if lc.kind in ("upi", "xgmi") and "socket_link_gb_per_s" in fitted:
                capacity = fitted["socket_link_gb_per_s"] * GB
            hop = hop_type(nodes[lc.a].kind, nodes[lc.b].kind, lc.kind)
            for src, dst in ((lc.a, lc.b), (lc.b, lc.a)):
                graph.add_edge(src, dst, id=f"{src}->{dst}", kind=lc.kind, capacity=capacity,
                               latency=latency, nccl_bandwidth=belief, hop_type=hop,
                               rank=PATH_RANK[hop])
        links: dict[str, Link] = {}
        for lc in config.links:
            for src, dst in ((lc.a, lc.b), (lc.b, lc.a)):
                e = graph.edges[src, dst]
                links[e["id"]] = Link(e["id"], src, dst, e["kind"], e["capacity"], e["latency"])
        for node in config.nodes:
            if node.kind == "cpu":
                mem = (node.memory_bandwidth_gb_per_s * GB if node.memory_bandwidth_gb_per_s
                       else link_catalog.DEFAULT_HOST_MEMORY_BANDWIDTH)
                if "host_memory_gb_per_s" in fitted:
                    mem = fitted["host_memory_gb_per_s"] * GB
                links[f"mem:{node.id}"] = Link(f"mem:{node.id}", node.id, node.id, "memory",
                                               mem, 0.0)
        gpu_nodes = tuple(n.id for n in config.nodes if n.kind == "gpu")
        lonely = unreached(graph, gpu_nodes[0])
        if lonely:
            raise InputError(f"{cut(config.name)}: node(s) {cut(', '.join(sorted(lonely)))} are "
                             f"not connected to {cut(gpu_nodes[0])}")
        gpus = tuple(node_gpu(nodes[n], gpu) for n in gpu_nodes)
        return cls(config, gpu, graph, links, gpu_nodes, gpus)

    def for_job(self, workload: str, stack: Stack = TODAY, *, precision: str) -> Machine:
        """The machine as this job runs it: its cards at the compute fraction measured for the
        workload (the topology's calibration.compute, `stepsim calibrate --step-time`), at
        the GEMM rate of the job's software stack (catalog/software.py; a card whose topology
        gives its own matmul_tflops keeps it) and at the rate its ``precision``'s 16-bit dtype
        gets (bf16 without bf16 tensor cores: gpus.half_dtype_share); itself when none of these
        changes a card. A stack without kernels for a card is refused."""
        calibration = self.config.calibration
        fractions = {c.gpu: c.achieved_fraction for c in calibration.compute
                     if c.workload == workload} if calibration else {}
        key = (workload, stack, precision)
        if key not in self._jobs:
            def measured(card: gpu_catalog.GPU) -> gpu_catalog.GPU:
                software.check_card(card.name, card.arch, card.compute_capability, stack)
                share = 1.0 if card.own_matmul else software.gemm_row(card.arch, stack).share
                fraction = fractions.get(card.name, card.achieved_fraction)
                half = gpu_catalog.half_dtype_share(card, precision)
                if (share, fraction, half) == (card.gemm_library_share, card.achieved_fraction,
                                               card.half_dtype_share):
                    return card
                return replace(card, achieved_fraction=fraction, gemm_library_share=share,
                               half_dtype_share=half)

            gpu = measured(self.gpu)
            gpus = tuple(measured(g) for g in self.gpus)
            same = gpu is self.gpu and all(a is b for a, b in zip(gpus, self.gpus, strict=True))
            self._jobs[key] = self if same else replace(self, gpu=gpu, gpus=gpus)
        return self._jobs[key]

    def with_scales(self, scales: RateScales) -> Machine:
        """The same machine with its mechanisms' achieved rates scaled (scales.py)."""
        return replace(self, gpu=replace(self.gpu, rate_scale=scales.compute), scales=scales)

    def subset(self, k: int) -> Machine:
        """The same machine with only its first ``k`` GPUs (their links dropped with them);
        on several boxes, the first ``k`` of each box."""
        if self.box is not None:
            if k == self.gpus_per_box:
                return self
            box = Machine.from_config(self.box.copy(nnodes=1)).subset(k)
            part = Machine.from_config(box.config.copy(nnodes=self.nnodes))
            return part if self.scales.neutral else part.with_scales(self.scales)
        if k < 1:
            raise InputError(f"--gpus {k}: must be at least 1")
        if k > self.n_gpus:
            raise InputError(f"--gpus {k}: the machine {self.name} has {self.n_gpus} GPUs")
        if k == self.n_gpus:
            return self
        dropped = set(self.gpu_nodes[k:])
        nodes = [n for n in self.config.nodes if n.id not in dropped]
        links = [lc for lc in self.config.links if lc.a not in dropped and lc.b not in dropped]
        part = Machine.from_config(self.config.copy(nodes=nodes, links=links))
        return part if self.scales.neutral else part.with_scales(self.scales)

    def gpu_of(self, rank: int) -> gpu_catalog.GPU:
        """The card at ``rank``: its node's `gpu` where given, else the machine's `gpu`."""
        return self.gpus[rank] if self.gpus else self.gpu

    def cards(self) -> dict[gpu_catalog.GPU, tuple[int, ...]]:
        """Each distinct card and its ranks, in rank order (one entry unless a mixed box)."""
        out: dict[gpu_catalog.GPU, tuple[int, ...]] = {}
        for rank in range(self.n_gpus):
            card = self.gpu_of(rank)
            out[card] = (*out.get(card, ()), rank)
        return out

    def smallest_card(self) -> gpu_catalog.GPU:
        """The card with the least memory: where a job the same on every rank fits last."""
        return min(self.cards(), key=lambda card: card.memory_bytes)

    def as_if_every_gpu(self, card: gpu_catalog.GPU) -> Machine:
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

    def path_capacities(self, a: str, targets: list[str]) -> dict[str, float]:
        """``best_path(a, b).capacity`` for every target ``b``, in one sweep (paths.py)."""
        return self.paths.capacities(a, targets)

    def _make_path(self, nodes: tuple[str, ...]) -> Path:
        hops = list(zip(nodes, nodes[1:], strict=False))
        edges = [self.graph.succ[u][v] for u, v in hops]
        return Path(nodes, tuple(e["id"] for e in edges),
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

    def path_type_row(self, i: int) -> list[str]:
        """``path_type(i, j)`` for every GPU j in one sweep (nothing kept: a large machine's
        every pair is asked once, by `stepsim topo`)."""
        row = ["LOC"] * self.n_gpus
        rank_of = {node: r for r, node in enumerate(self.gpu_nodes)}
        for rank, found in self.paths.nearest(self.gpu_nodes[i], list(self.gpu_nodes)):
            for node in found:
                row[rank_of[node]] = PATH_TYPES[rank]
        return row

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
        if link.kind == "network":
            nic = link.src if src == "nic" else link.dst
            return f"{nic}'s network link, {'out' if src == 'nic' else 'in'}"
        if "nic" in (src, dst):
            nic = link.src if src == "nic" else link.dst
            return f"{nic}'s own PCIe link, {'up' if src == 'nic' else 'down'}"
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
        for data in self.graph.succ[node.id].values():
            if data["kind"] in link_catalog.DEFAULT_SOCKET_LINK:
                return link_catalog.DEFAULT_SOCKET_LINK[data["kind"]]
        return None
