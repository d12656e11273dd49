"""Several boxes as one machine: N copies of a box joined through their NICs by one switch.

``cluster_config(box, nnodes)`` is the flat topology the rest of the simulator reads: every node
and link of the box once per box, ids prefixed ``n0.``, ``n1.`` .. (the boxes in torchrun's node
order, so rank ``r`` is local rank ``r % gpus_per_box`` of box ``r // gpus_per_box``), and a
``network_switch`` node ``net`` with a ``network`` link from each NIC. Each NIC link carries the
NIC's cabled ports at the slower of the NIC's and the switch port's line rate, times the share
of it a frame carries as payload (catalog/nics.py ``frame_efficiency``); half the network's
one-way latency sits on each side of the switch, so a message NIC to NIC crosses all of it.
NCCL's belief of the link is the NIC's own speed (``speed`` Mb/s / 8000, topo.cc
ncclTopoAddNet), which the switch does not lower.

Assumptions: a non-blocking switch (every port at line rate at once); every box alike (the file
describes one); a NIC's ports all cabled to the one switch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from simulator.catalog import nics as nic_catalog
from simulator.inputs.schema import LinkConfig, NetworkConfig, NodeConfig, TopologyConfig

SWITCH = "net"  # the network switch's node id
_PREFIX = re.compile(r"^n(\d+)\.")


def prefix(box: int, node_id: str) -> str:
    return f"n{box}.{node_id}"


def box_of_node(node_id: str) -> int | None:
    """The box a node of a flat cluster belongs to (None: the switch, or a single box)."""
    match = _PREFIX.match(node_id)
    return int(match.group(1)) if match else None


def local_id(node_id: str) -> str:
    """A node's id inside its box (``n1.gpu3`` -> ``gpu3``)."""
    return _PREFIX.sub("", node_id)


@dataclass(frozen=True)
class NicPort:
    """What a topology's NIC node puts on the network."""

    card: nic_catalog.Nic
    ports: int

    @property
    def line_gbps(self) -> float:
        return self.card.rate_gbps(self.ports)

    @property
    def rdma(self) -> bool:
        return self.card.rdma


def nic_of(node: NodeConfig) -> NicPort:
    """A ``kind: nic`` node's card (catalog entry with the node's own numbers) and ports."""
    return NicPort(nic_catalog.resolve(node.model, node.gbps, node.rdma), node.ports or 1)


def link_rate_gbps(nic: NicPort, network: NetworkConfig) -> float:
    """Line rate of a NIC's link to the switch, Gb/s: its ports at the slower of the two ends."""
    per_port = min(nic.card.gbps, network.gbps)
    rate = per_port * nic.ports
    return rate if nic.card.total_gbps is None else min(rate, nic.card.total_gbps)


def cluster_config(box: TopologyConfig, nnodes: int) -> TopologyConfig:
    """The flat topology of ``nnodes`` boxes like ``box`` on ``box.network`` (checked before:
    a NIC and a network exist)."""
    network = box.network
    assert network is not None
    nodes: list[NodeConfig] = []
    links: list[LinkConfig] = []
    nics = [n for n in box.nodes if n.kind == "nic"]
    efficiency = nic_catalog.frame_efficiency(network.kind, network.mtu)
    latency_us = network.latency_us if network.latency_us is not None else \
        nic_catalog.NETWORK_LATENCY_US[network.kind]
    for k in range(nnodes):
        nodes += [n.copy(id=prefix(k, n.id)) for n in box.nodes]
        links += [lc.copy(a=prefix(k, lc.a), b=prefix(k, lc.b)) for lc in box.links]
    nodes.append(NodeConfig(id=SWITCH, kind="network_switch"))
    for k in range(nnodes):
        for n in nics:
            rate = link_rate_gbps(nic_of(n), network)
            links.append(LinkConfig(a=prefix(k, n.id), b=SWITCH, kind="network",
                                    bandwidth_gb_per_s=rate / 8 * efficiency,
                                    latency_us=latency_us / 2))
    return box.copy(nodes=nodes, links=links, nnodes=1)
