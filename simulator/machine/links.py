"""A topology file's links as the simulator uses them: ``Link`` (one direction of a link, or a
host-memory resource), each link's physical capacity and latency from the link catalog
(or the file's own figures), NCCL's believed bandwidth of it, and the NCCL path type of the hop.

Assumptions: a PCIe link without ``gen`` runs at its GPU end's generation (else a NIC end's,
else the machine's card), x16 unless ``lanes`` says otherwise (a NIC's own width); an NVLink's
count and generation, unless given, are those of the GPU at its first end; a socket link
without a model is its CPU's, else the default of its kind. A ``bandwidth_gb_per_s`` given in
the file replaces the physical capacity only: NCCL still believes what it detects from the
generation and lanes (a network link: the NIC's speed).
"""

from __future__ import annotations

from dataclasses import dataclass

from simulator.catalog import gpus as gpu_catalog
from simulator.catalog import links as link_catalog
from simulator.catalog import nics as nic_catalog
from simulator.errors import InputError, cut, quoted
from simulator.inputs.schema import LinkConfig, NodeConfig, TopologyConfig
from simulator.machine.cards import node_gpu
from simulator.units import GB, US


@dataclass(frozen=True)
class Link:
    """One direction of a physical link (id ``"a->b"``), or a host-memory resource ``mem:cpu0``."""

    id: str
    src: str
    dst: str
    kind: str  # pcie | nvlink | upi | xgmi | network | memory
    capacity: float  # B/s, physical
    latency: float  # s


def hop_type(kind_a: str, kind_b: str, link_kind: str) -> str:
    """Path type of one hop (paths.cc ncclTopoSetPaths)."""
    if link_kind == "nvlink":
        return "NVL"
    if link_kind in ("upi", "xgmi"):
        return "SYS"
    if link_kind == "network":
        return "NET"
    if "cpu" in (kind_a, kind_b):
        return "PHB"  # a PCI link touching a CPU: through the host bridge
    if kind_a == "pcie_switch" and kind_b == "pcie_switch":
        return "PXB"  # a PCI-to-PCI hop: several switches
    return "PIX"


def pcie_generation(lc: LinkConfig, gpu: gpu_catalog.GPU, nodes: dict[str, NodeConfig]) -> int:
    """A PCIe link's generation: its own ``gen``, else its GPU end's, else a NIC end's (the
    card's own), else the machine's card."""
    end_gpus = [node_gpu(nodes[n], gpu) for n in (lc.a, lc.b) if nodes[n].kind == "gpu"]
    card = _nic_end(lc, nodes)
    return lc.gen or (end_gpus[0].pcie_gen if end_gpus else card.pcie_gen if card else
                      gpu.pcie_gen)


def pcie_generations(config: TopologyConfig, gpu: gpu_catalog.GPU,
                     nodes: dict[str, NodeConfig]) -> dict[str, int]:
    """Each directed PCIe link id ("a->b") and its generation."""
    out: dict[str, int] = {}
    for lc in config.links:
        if lc.kind == "pcie":
            out[f"{lc.a}->{lc.b}"] = out[f"{lc.b}->{lc.a}"] = pcie_generation(lc, gpu, nodes)
    return out


def link_numbers(lc: LinkConfig, config: TopologyConfig, gpu: gpu_catalog.GPU,
                  nodes: dict[str, NodeConfig]) -> tuple[float, float, float]:
    """Physical capacity (B/s), latency (s) and NCCL's believed bandwidth (B/s) of a link."""
    where = f"{cut(config.name)}: link {cut(lc.a)}-{cut(lc.b)}"
    end_gpus = [node_gpu(nodes[n], gpu) for n in (lc.a, lc.b) if nodes[n].kind == "gpu"]
    if lc.kind == "pcie":
        gen = pcie_generation(lc, gpu, nodes)
        card = _nic_end(lc, nodes)  # a NIC's slot defaults to the card's own width
        lanes = lc.lanes or (card.lanes if card and not end_gpus else 16)
        capacity, latency = link_catalog.pcie_bandwidth(gen, lanes), link_catalog.PCIE_HOP_LATENCY
        belief = link_catalog.nccl_pcie_bandwidth(gen, lanes)
    elif lc.kind == "nvlink":
        owner = end_gpus[0] if end_gpus else gpu
        count = lc.count or owner.nvlink_links
        if count == 0:
            raise InputError(f"{where}: {owner.name} has no NVLink")
        per_link = link_catalog.NVLINK_PER_LINK.get(lc.model or owner.arch)
        if per_link is None:
            raise InputError(f"{where}: unknown NVLink model {quoted(lc.model or owner.arch)}; "
                             f"known: {', '.join(link_catalog.NVLINK_PER_LINK)}")
        capacity, latency = per_link * count, link_catalog.NVLINK_HOP_LATENCY
        cc = owner.compute_capability
        nccl_per_link = link_catalog.NCCL_NVLINK_PER_LINK
        per_link_nccl = nccl_per_link.get(cc, nccl_per_link[80])
        belief = per_link_nccl * count  # topo.cc: count * ncclTopoNVLinkBw(cc)
    elif lc.kind in ("upi", "xgmi"):
        cpu_model = nodes[lc.a].model or nodes[lc.b].model
        name = lc.model or cpu_model or link_catalog.DEFAULT_SOCKET_LINK[lc.kind]
        socket = link_catalog.socket_link(name)  # a socket link, or a CPU family's
        if socket is None:
            raise InputError(f"{where}: unknown socket link {quoted(name)}; "
                             f"known: {', '.join(link_catalog.SOCKET_LINKS)}")
        capacity, latency, belief = socket.bandwidth, socket.latency, socket.nccl_bandwidth
    else:  # network: a NIC's link to the switch (machine/cluster.py gives its rate)
        capacity, latency = link_catalog.NETWORK_DEFAULT_BANDWIDTH, link_catalog.NETWORK_LATENCY
        card = _nic_end(lc, nodes)
        belief = capacity
        if card is not None:  # NCCL's belief: the NIC's speed / 8000 GB/s (topo.cc)
            node = nodes[lc.a] if nodes[lc.a].kind == "nic" else nodes[lc.b]
            belief = card.rate_gbps(node.ports or 1) / 8 * GB
    if lc.bandwidth_gb_per_s is not None:
        capacity = lc.bandwidth_gb_per_s * GB  # what NCCL detects (gen, lanes) stays its belief
    if lc.latency_us is not None:
        latency = lc.latency_us * US
    return capacity, latency, belief


def _nic_end(lc: LinkConfig, nodes: dict[str, NodeConfig]) -> nic_catalog.Nic | None:
    """The card at a NIC end of a link (catalog/nics.py with the node's numbers), if any."""
    for end in (lc.a, lc.b):
        node = nodes[end]
        if node.kind == "nic":
            return nic_catalog.resolve(node.model, node.gbps, node.rdma)
    return None
