"""A topology YAML from what a user already has: `nvidia-smi topo -m` or NCCL's topology XML.

``from_matrix`` infers the machine from the matrix: sockets from the GPUs' NUMA affinity (or,
without it, from which devices are SYS apart), PCIe switches from PIX groups (one switch per
group) and PXB groups (a parent switch above the groups), NVLink bridges or an NVSwitch from
``NV#`` (an NVSwitch when a GPU's NV# over all its peers adds up to more links than the card
has), NICs where the matrix puts them. NODE and PHB both become a path through the socket, as
NCCL has them (NCCL has no NODE type). ``from_nccl_xml`` copies NCCL's tree, which carries
PCIe generations and widths. What neither says (link widths, switch uplinks, the CPU model,
host memory, P2P) is an assumption, listed in the header comment of the YAML; which card sits at
each GPU and which CPU family each socket is, import_choices.py decides. NICs are kept where the
input puts them (the multi-node model places network traffic on them).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import networkx as nx
import yaml

from simulator.catalog import cpus as cpu_catalog
from simulator.errors import InputError
from simulator.inputs import nccl_topo_xml as nx_xml
from simulator.inputs.import_choices import Cards, CpuChoice, cards, cpu_choice
from simulator.inputs.nvidia_smi import TopoMatrix, is_gpu

PCIE_PATH = ("PIX", "PXB", "PHB", "NODE")  # relations that say where a device sits on PCIe


@dataclass(frozen=True)
class ImportOptions:
    gpu: str | None  # --gpu: a catalog name, or FIRST-LAST=NAME,... (None: the input's names)
    name: str
    pcie_gen: int | None = None
    lanes: int | None = None
    p2p: bool | None = None
    cpu_model: str | None = None  # --cpu: a CPU family or a socket link


@dataclass
class Imported:
    """The explicit topology (``data``, as the YAML has it), what it assumed and what it had to
    recover from the input (one line each)."""

    data: dict[str, Any]
    assumptions: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def to_yaml(self) -> str:
        head = [f"# {self.data['name']}: {self.data['description']}",
                "# Assumptions (edit the keys below where you know better):"]
        head += [f"#  - {a}" for a in self.assumptions]
        body = []
        for key, value in self.data.items():
            if key in ("nodes", "links"):
                body.append(f"{key}:")
                body += [f"  - {_flow(item)}" for item in value]
            else:
                body.append(yaml.safe_dump({key: value}, width=1000, sort_keys=False).strip())
        return "\n".join(head + body) + "\n"


def _flow(item: dict[str, Any]) -> str:
    return yaml.safe_dump(item, default_flow_style=True, width=1000, sort_keys=False).strip()


class _Builder:
    def __init__(self, opts: ImportOptions, gpus: Cards) -> None:
        self.opts = opts
        self.cards = gpus
        self.gpu = gpus.base(gpus.per_gpu.index(gpus.default))
        self.gpu_index: dict[str, int] = {}  # GPU node id -> its index
        self.gen = opts.pcie_gen or self.gpu.pcie_gen
        self.lanes = opts.lanes or 16
        self.cpus: list[dict[str, Any]] = []
        self.switches: list[dict[str, Any]] = []
        self.gpus: list[dict[str, Any]] = []
        self.nics: list[dict[str, Any]] = []
        self.links: list[dict[str, Any]] = []
        self.assumptions: list[str] = []
        gens = {gpus.base(i).pcie_gen for i in range(len(gpus.per_gpu))}
        if (opts.pcie_gen is None or opts.lanes is None) and len(gens) > 1:
            self.assumptions.append(
                f"every PCIe link is x{self.lanes}, a GPU's at its own card's generation, the "
                f"others Gen{self.gen} (the {self.gpu.name}'s; --pcie-gen/--lanes set them)")
        elif opts.pcie_gen is None or opts.lanes is None:
            self.assumptions.append(
                f"every PCIe link is Gen{self.gen} x{self.lanes} (the {self.gpu.name}'s own; "
                "--pcie-gen/--lanes set them)")
        where: dict[str, list[str]] = {}
        for index in range(len(gpus.per_gpu)):
            where.setdefault(gpus.base(index).name, []).append(str(index))
        if len(where) > 1:
            cards_at = "; ".join(f"{name} at GPU {', '.join(ix)}" for name, ix in where.items())
            self.assumptions.append(f"GPUs: {cards_at}, {gpus.why}")
        elif gpus.why != "--gpu":
            self.assumptions.append(f"GPUs: {self.gpu.name}, {gpus.why}")

    def switch(self) -> str:
        sid = f"sw{len(self.switches)}"
        self.switches.append({"id": sid, "kind": "pcie_switch"})
        return sid

    def pcie(self, a: str, b: str, gen: int | None = None, lanes: int | None = None) -> None:
        card = self.gpu_index.get(b, self.gpu_index.get(a))  # a GPU's link: its own card's gen
        own = self.cards.base(card).pcie_gen if card is not None else None
        self.links.append({"a": a, "b": b, "kind": "pcie",
                           "gen": gen or self.opts.pcie_gen or own or self.gen,
                           "lanes": lanes or self.lanes})

    def add_gpus(self, ids: list[str]) -> None:
        for index, gid in enumerate(ids):
            self.gpu_index[gid] = index
            own = self.cards.node_gpu(index)
            self.gpus.append({"id": gid, "kind": "gpu", **({"gpu": own} if own else {})})

    def cpu(self, cid: str, choice: CpuChoice) -> None:
        node: dict[str, Any] = {"id": cid, "kind": "cpu", "model": choice.model}
        if choice.memory_gb_per_s is not None:
            node["memory_bandwidth_gb_per_s"] = choice.memory_gb_per_s
        self.cpus.append(node)
        if choice.assumed and choice.assumed not in self.assumptions:
            self.assumptions.append(choice.assumed)

    def socket_links(self) -> None:
        for i, a in enumerate(self.cpus):
            for b in self.cpus[i + 1:]:
                kind = "xgmi" if a["model"].startswith("amd") else "upi"
                self.links.append({"a": a["id"], "b": b["id"], "kind": kind})
        if len(self.cpus) > 1:
            self.assumptions.append("NUMA nodes are joined pairwise by the CPU model's socket "
                                    "link (NCCL connects every CPU pair the same way)")

    def finish(self, description: str, p2p: bool, p2p_why: str) -> Imported:
        self.assumptions.append(f"p2p: {'true' if p2p else 'false'} ({p2p_why})")
        if any("memory_bandwidth_gb_per_s" in c for c in self.cpus):
            self.assumptions.append("host memory per socket: 80% of the CPU family's peak, every "
                                    "channel populated (set memory_bandwidth_gb_per_s on a cpu "
                                    "node with fewer DIMMs, or a NUMA node that is part of a "
                                    "socket)")
        else:
            self.assumptions.append("host memory 250 GB/s per socket (set "
                                    "memory_bandwidth_gb_per_s on each cpu node)")
        data: dict[str, Any] = {"name": self.opts.name, "description": description,
                                "gpu": self.cards.default, "p2p": p2p}
        data["nodes"] = self.cpus + self.switches + self.gpus + self.nics
        data["links"] = self.links
        return Imported(data, self.assumptions)

    def default_p2p(self) -> tuple[bool, str]:
        if self.opts.p2p is not None:
            return self.opts.p2p, "--p2p"
        if any(self.cards.base(i).line == "geforce" for i in range(len(self.cards.per_gpu))):
            return False, "GeForce cards have no P2P on NVIDIA's stock driver; --p2p on for a "\
                          "patched one"
        return True, "data-centre cards allow P2P; --p2p off if yours does not"


# --- nvidia-smi topo -m ---------------------------------------------------------------------

def from_matrix(m: TopoMatrix, opts: ImportOptions, source: str) -> Imported:
    names = {int(g[3:]): n for g, n in m.gpu_names.items()}
    b = _Builder(opts, cards(opts.gpu, len(m.gpus), names))
    node_id = {d: _device_id(d, m) for d in m.devices}
    b.gpu_index = {node_id[g]: i for i, g in enumerate(m.gpus)}
    sockets = _sockets(m, b)
    for cid, members in sockets:
        b.cpu(cid, cpu_choice(opts.cpu_model))
        _place(m, members, cid, node_id, b)
    b.add_gpus([node_id[g] for g in m.gpus])
    # nvidia-smi lists NICs by their verbs device names (mlx5_0, ...): RDMA; their speed is not
    # in the matrix
    b.nics.extend({"id": node_id[n], "kind": "nic", "rdma": True} for n in m.nics)
    if m.nics:
        b.assumptions.append("NIC speed unknown (`topo -m` does not print it): give each nic "
                             "a `model` (NIC catalog) or `gbps` before --nnodes; rdma: true "
                             "(nvidia-smi lists verbs devices)")
    _nvlinks(m, node_id, b)
    b.socket_links()
    if any(m.relation[(x, y)] == "NODE" for x in m.devices for y in m.devices):
        b.assumptions.append("NODE (across host bridges of one NUMA node) is a path through the "
                             "socket, NCCL's PHB; root ports are x16 to the CPU")
    if m.p2p and opts.p2p is None:
        statuses = {v for (x, y), v in m.p2p.items() if x != y}
        p2p, why = statuses == {"OK"}, f"`nvidia-smi topo -p2p` says {'/'.join(sorted(statuses))}"
    else:
        p2p, why = b.default_p2p()
    done = b.finish(f"imported from {source} (nvidia-smi topo -m)", p2p, why)
    done.warnings.extend(m.warnings)
    return done


def _device_id(device: str, m: TopoMatrix) -> str:
    if is_gpu(device):
        return device.lower()
    return m.nic_names.get(device, device).replace(":", "_") if device.startswith("NIC") \
        else device


def _components(items: Iterable[str], joined: Callable[[str, str], bool]) -> list[list[str]]:
    """Groups of items linked (transitively) by ``joined``, in first-seen order."""
    order = list(items)
    graph = nx.Graph()
    graph.add_nodes_from(order)
    graph.add_edges_from((a, c) for i, a in enumerate(order) for c in order[i + 1:]
                         if joined(a, c))
    groups = [sorted(g, key=order.index) for g in nx.connected_components(graph)]
    return sorted(groups, key=lambda g: order.index(g[0]))


def _sockets(m: TopoMatrix, b: _Builder) -> list[tuple[str, list[str]]]:
    """(cpu id, devices on it) per NUMA node, GPUs' sockets first."""
    rel = m.relation
    gpus, nics = list(m.gpus), list(m.nics)
    if len(m.numa_affinity) == len(gpus):
        by_numa: dict[int, list[str]] = {}
        for g in gpus:
            by_numa.setdefault(m.numa_affinity[g], []).append(g)
        groups = [(f"cpu{n}", members) for n, members in sorted(by_numa.items())]
    else:
        b.assumptions.append("sockets from which GPUs are SYS apart (the matrix has no NUMA "
                             "affinity)")
        pcie = _components(gpus, lambda a, c: rel[(a, c)] in PCIE_PATH)
        heads = {g[0]: g for g in pcie}

        def same_socket(a: str, c: str) -> bool:  # NVLink-joined and nowhere SYS apart
            pairs = [(x, y) for x in heads[a] for y in heads[c]]
            return any(m.nvlinks(x, y) for x, y in pairs) and \
                not any(rel[(x, y)] == "SYS" for x, y in pairs)

        merged = _components(list(heads), same_socket)
        groups = [(f"cpu{k}", sorted((d for h in hs for d in heads[h]), key=gpus.index))
                  for k, hs in enumerate(merged)]
    taken = {cid for cid, _ in groups}
    homeless: list[str] = []
    for nic in nics:
        home = next((members for _, members in groups
                     if any(rel[(nic, g)] in PCIE_PATH for g in members if is_gpu(g))), None)
        if home is None:
            homeless.append(nic)
        else:
            home.append(nic)
    k = 0
    for group in _components(homeless, lambda a, c: rel[(a, c)] in PCIE_PATH):
        while f"cpu{k}" in taken:
            k += 1
        taken.add(f"cpu{k}")
        groups.append((f"cpu{k}", group))
        b.assumptions.append(f"{', '.join(group)} are SYS from every GPU: a NUMA node of their "
                             f"own (cpu{k})")
    return groups


def _place(m: TopoMatrix, members: list[str], cpu: str, node_id: dict[str, str],
           b: _Builder) -> None:
    """PCIe switches on one socket: a switch per PIX group, a parent above a PXB group."""
    rel = m.relation
    leaves = _components(members, lambda a, c: rel[(a, c)] == "PIX")
    for tree in _components(members, lambda a, c: rel[(a, c)] in ("PIX", "PXB")):
        under = [leaf for leaf in leaves if leaf[0] in tree]
        if len(under) == 1 and len(under[0]) == 1:
            b.pcie(cpu, node_id[under[0][0]])  # alone on a root port
            continue
        top = cpu
        if len(under) > 1:
            top = b.switch()
            b.pcie(cpu, top)
        for leaf in under:
            sw = b.switch() if len(under) > 1 or len(leaf) > 1 else top
            if sw != top:
                b.pcie(top, sw)
            for device in leaf:
                b.pcie(sw, node_id[device])
    if b.switches and not any("uplink" in a for a in b.assumptions):
        b.assumptions.append(f"each PCIe switch has one x{b.lanes} uplink")


def _nvlinks(m: TopoMatrix, node_id: dict[str, str], b: _Builder) -> None:
    gpus = m.gpus
    pairs = [(x, y, m.nvlinks(x, y)) for i, x in enumerate(gpus) for y in gpus[i + 1:]
             if m.nvlinks(x, y)]
    if not pairs:
        return
    card = {g: b.cards.base(i) for i, g in enumerate(gpus)}
    for x, y, n in pairs:
        for end in (x, y):
            if card[end].nvlink_links == 0:
                raise InputError(f"{end} is a {card[end].name}, which has no NVLink, but the "
                                 f"matrix shows NV{n} between {x} and {y}")
    per_gpu = {g: sum(m.nvlinks(g, o) for o in gpus if o != g) for g in gpus}
    if any(total > card[g].nvlink_links for g, total in per_gpu.items()):
        b.switches.append({"id": "nvs0", "kind": "nvswitch"})
        for g in gpus:
            count = max((m.nvlinks(g, o) for o in gpus if o != g), default=0)
            if count:
                b.links.append({"a": node_id[g], "b": "nvs0", "kind": "nvlink", "count": count})
        b.assumptions.append(f"NVSwitch: NV# over all peers exceeds the {b.gpu.nvlink_links} "
                             f"NVLinks of a {b.gpu.name}")
        return
    for x, y, n in pairs:  # a GA102 bridge (RTX 3090, A6000, A40, A5000) has its own rate
        model = {"model": "ampere-ga102"} if {card[x].compute_capability,
                                               card[y].compute_capability} == {86} else {}
        b.links.append({"a": node_id[x], "b": node_id[y], "kind": "nvlink", "count": n, **model})
    b.assumptions.append("NV# pairs are direct NVLink bridges; their PCIe placement is what the "
                         "other columns say (else a root port each)")


# --- NCCL topology XML ---------------------------------------------------------------------

def from_nccl_xml(system: nx_xml.NcclSystem, opts: ImportOptions, source: str) -> Imported:
    gpus = system.gpus()
    b = _Builder(opts, cards(opts.gpu, len(gpus), {}))
    b.assumptions = [f"PCIe links NCCL gave no speed or width for are Gen{b.gen} x{b.lanes}"
                     if a.startswith("every PCIe link") else a for a in b.assumptions]
    gpu_id = {g.busid: f"gpu{i}" for i, g in enumerate(gpus)}
    b.gpu_index = {gid: i for i, gid in enumerate(gpu_id.values())}
    nic_count = [0]

    def walk(node: nx_xml.PciNode, parent: str) -> None:
        if node.kind == "gpu":
            b.pcie(parent, gpu_id[node.busid], node.gen, node.width)
        elif node.kind == "nic":
            nid = (node.nic_name or f"nic{nic_count[0]}").replace(":", "_")
            nic_count[0] += 1
            b.nics.append({"id": nid, "kind": "nic", **node.nic_facts})
            b.pcie(parent, nid, node.gen, node.width)
        elif node.kind == "switch" or node.children:
            sw = b.switch()
            b.pcie(parent, sw, node.gen, node.width)
            for child in node.children:
                walk(child, sw)

    for k, cpu in enumerate(system.cpus):
        cid = f"cpu{cpu.numaid if cpu.numaid >= 0 else k}"
        b.cpu(cid, cpu_choice(opts.cpu_model,
                              cpu_catalog.from_cpuid(cpu.vendor, cpu.familyid, cpu.modelid),
                              cpu.model))
        for child in cpu.children:
            walk(child, cid)
        for name in cpu.nics:
            b.nics.append({"id": name, "kind": "nic", **cpu.nic_facts.get(name, {})})
            b.pcie(cid, name)
    b.add_gpus(list(gpu_id.values()))
    _xml_nvlinks(gpus, gpu_id, b)
    b.socket_links()
    p2p, why = b.default_p2p()
    return b.finish(f"imported from {source} (NCCL topology XML)", p2p, why)


def _xml_nvlinks(gpus: list[nx_xml.PciNode], gpu_id: dict[str, str], b: _Builder) -> None:
    if not any(g.nvlinks for g in gpus):
        b.assumptions.append("no NVLink (the XML lists none; a hand-written NCCL_TOPO_FILE "
                             "leaves them to the driver)")
        return
    done: set[frozenset[str]] = set()
    switch_links: dict[str, int] = {}
    for g in gpus:
        for target, count, tclass in g.nvlinks:
            if tclass.startswith(nx_xml.NVSWITCH_CLASS):
                switch_links[g.busid] = switch_links.get(g.busid, 0) + count
            elif target in gpu_id and frozenset((g.busid, target)) not in done:
                done.add(frozenset((g.busid, target)))
                b.links.append({"a": gpu_id[g.busid], "b": gpu_id[target], "kind": "nvlink",
                                "count": count})
    if switch_links:
        b.switches.append({"id": "nvs0", "kind": "nvswitch"})
        for busid, count in switch_links.items():
            b.links.append({"a": gpu_id[busid], "b": "nvs0", "kind": "nvlink", "count": count})
