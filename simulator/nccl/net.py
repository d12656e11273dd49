"""NCCL's network transport between boxes, as NCCL decides it: which plugin (IB verbs or
sockets), which NIC each GPU uses, GPUDirect RDMA or staging through host memory, and what each
choice puts on the links (the route of a byte, its host-memory passes, the socket ceiling).

Rules, each from NCCL 2.30 (commit 5067397, domain-model.md):

- plugin: ``NCCL_NET`` names one (IB or Socket, case-insensitive); unset, NCCL tries IB first
  (src/plugin/net.cc) and IB fails without a verbs device or with ``NCCL_IB_DISABLE``
  (src/transport/net_ib/init.cc L291), leaving sockets. IB uses the NICs with verbs only.
- the GPU's NIC: the closest usable NIC of its box (lowest path type, then NCCL's bandwidth),
  NICs tied for closest shared out by the GPU's index among the GPUs they tie for (the rails of a
  DGX: one NIC per GPU); a ring may leave a box by another NIC than it entered by unless
  ``NCCL_CROSS_NIC=0`` (src/graph/search.cc ncclTopoSearchCheckNet).
- GPUDirect RDMA (src/graph/paths.cc ncclTopoCheckGdr L468-549): the NIC must support it (the IB
  plugin with nvidia-peermem or DMA-BUF: ``NCCL_PTR_CUDA``, net_ib/init.cc L546-553; sockets never,
  ``ptrSupport = NCCL_PTR_HOST``, net_socket.cc L170) and so must the GPU
  (``cudaDevAttrGPUDirectRDMASupported``, src/plugin/net.cc ncclGpuGdrSupport: 0 on GeForce, 1 on
  data-centre and RTX PRO cards); a send reads GPU memory only if ``NCCL_NET_GDR_READ`` allows
  (default: from Ampere on, or with an NVLink peer before); and the GPU-NIC path type must be at
  most ``NCCL_NET_GDR_LEVEL`` (default PXB: a shared PCIe switch, not through the CPU).
- without it, bytes stage through pinned host memory on the CPU local to the GPU on both ends
  (paths.cc L846-855 "divert all traffic through the CPU local to the GPU"; net.cc L917, L1101:
  buffers in host memory unless GDR): the GPU's kernel stores into it over PCIe and the NIC reads
  it, and the other way on the receiving side. The socket transport adds the kernel's copy into
  and out of its socket buffers (a read and a write of host memory each side).
- socket ceiling: one TCP stream moves ``socket_stream_gbps`` (wire.py). With NCCL's default of no
  helper threads the proxy thread of the GPU alone moves every channel's data over the
  connections' own sockets, so a box boundary moves one stream's worth; with
  ``NCCL_SOCKET_NTHREADS`` T > 0 and ``NCCL_NSOCKS_PERTHREAD`` S, each channel's connection splits
  its messages over T x S sockets driven by its own T threads (net_socket.cc L348-400, L660-668):
  min(T, T x S) streams a channel. CPU contention between many such threads is not modelled.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

from simulator.errors import InputError, cut
from simulator.machine.cluster import box_of_node, nic_of
from simulator.machine.paths import PATH_RANK, PATH_TYPES, Path
from simulator.nccl.env import MAX_SOCKET_THREADS, MAX_SOCKETS
from simulator.units import GB

if TYPE_CHECKING:
    from simulator.nccl.communicator import Communicator, Route

# Host-memory passes per byte of a staged network hop, on each side: the GPU's store (or load)
# and the NIC's DMA; sockets add the kernel's copy between NCCL's buffer and the socket buffer.
STAGING_PASSES = {"IB": 2, "Socket": 4}
DEFAULT_GDR_LEVEL = "PXB"  # paths.cc: netGdrLevel = PATH_PXB (PATH_P2C on C2C systems)


def gpu_supports_gdr(line: str) -> bool:
    """cudaDevAttrGPUDirectRDMASupported: NVIDIA's GPUDirect RDMA documentation lists data-centre
    and professional (Quadro / RTX PRO) cards; GeForce reports 0 (remote-lab.net, "Enabling
    GPUDirect RDMA on GeForce GPUs", 2026-04-05: the stock driver refuses it)."""
    return line != "geforce"


@dataclass(frozen=True)
class Gdr:
    """Whether one side of a network hop uses GPUDirect RDMA, and why (for the notes)."""

    used: bool
    why: str


class NetTransport:
    """NCCL's network transport over a communicator's machine of several boxes."""

    def __init__(self, comm: Communicator) -> None:
        self.comm = comm
        self.machine = comm.machine
        self.env = comm.env
        self._nearest: dict[int, str] = {}

    # --- the plugin -------------------------------------------------------------------

    @cached_property
    def name(self) -> str:
        """"IB" or "Socket", as NCCL's plugin order and the variables decide."""
        verbs = [n for n in self.machine.nic_nodes if nic_of(self.machine.nodes[n]).rdma]
        env = self.env
        if env.net == "Socket":
            return "Socket"
        if env.net == "IB" and (env.ib_disable or not verbs):
            why = "NCCL_IB_DISABLE is set" if env.ib_disable else "no NIC has rdma: true"
            raise InputError(f"NCCL_NET=IB: the IB plugin finds no device ({why}); NCCL fails "
                             "to initialise")
        return "IB" if verbs and not env.ib_disable else "Socket"

    @cached_property
    def why(self) -> str:
        """Why this plugin, in words."""
        if self.env.net is not None:
            return f"NCCL_NET={self.env.net}"
        if self.name == "IB":
            return "verbs NICs: NCCL tries its IB plugin first"
        if self.env.ib_disable:
            return "NCCL_IB_DISABLE is set"
        return "no NIC has verbs (rdma: false): NCCL falls back to sockets"

    def usable(self, box: int) -> tuple[str, ...]:
        """The NICs of a box this plugin uses."""
        nics = [n for n in self.machine.nic_nodes if box_of_node(n) == box]
        if self.name == "IB":
            nics = [n for n in nics if nic_of(self.machine.nodes[n]).rdma]
        if not nics:
            raise InputError(f"{cut(self.machine.name)}: box {box} has no NIC for NET/"
                             f"{self.name}")
        return tuple(nics)

    # --- which NIC ----------------------------------------------------------------------

    def nearest(self, rank: int) -> str:
        """The NIC a GPU uses: closest by path type, then NCCL's bandwidth; ties shared out."""
        if rank not in self._nearest:
            m = self.machine
            box = m.box_of(rank)
            nics = self.usable(box)

            def closest(r: int) -> tuple[str, ...]:
                keys = {n: self._path(m.gpu_nodes[r], n).key()[:2] for n in nics}
                best = min(keys.values())
                return tuple(n for n in nics if keys[n] == best)

            mine = closest(rank)
            peers = [r for r in range(box * m.gpus_per_box, (box + 1) * m.gpus_per_box)
                     if closest(r) == mine]
            self._nearest[rank] = mine[peers.index(rank) % len(mine)]
        return self._nearest[rank]

    def _path(self, a: str, b: str) -> Path:
        return self.machine.best_path(a, b)

    # --- GPUDirect RDMA -----------------------------------------------------------------

    def gdr(self, rank: int, nic: str, read: bool) -> Gdr:
        """paths.cc ncclTopoCheckGdr for one GPU, NIC and direction (read = the send side)."""
        m = self.machine
        card = m.gpu_of(rank)
        if self.name != "IB":
            return Gdr(False, "the socket transport moves host memory only")
        if not gpu_supports_gdr(card.line):
            return Gdr(False, f"{card.name} does not support it (GeForce: "
                              "cudaDevAttrGPUDirectRDMASupported = 0)")
        if read:
            setting = self.env.gdr_read
            if setting == 0:
                return Gdr(False, "NCCL_NET_GDR_READ=0 keeps sends in host memory")
            if (setting is None or setting < 0) and card.compute_capability < 80 and not \
                    self._has_nvlink_peer(rank):
                return Gdr(False, "before Ampere NCCL reads GPU memory for sends only with an "
                                  "NVLink peer")
        level = self.env.gdr_level or DEFAULT_GDR_LEVEL
        path = self._path(m.gpu_nodes[rank], nic)
        if PATH_RANK[path.type] > PATH_RANK[level]:
            return Gdr(False, f"GPU and NIC are {path.type} apart, beyond NCCL_NET_GDR_LEVEL "
                              f"{level}")
        return Gdr(True, f"GPU and NIC are {path.type} apart (NCCL_NET_GDR_LEVEL {level})")

    def _has_nvlink_peer(self, rank: int) -> bool:
        """paths.cc: an NVLink peer in the box, or the box's only GPU ("it's better to keep
        things local if we have a single GPU")."""
        m = self.machine
        box = m.box_of(rank)
        if m.gpus_per_box == 1:
            return True
        return any(m.path_type(rank, r) == "NVL" for r in
                   range(box * m.gpus_per_box, (box + 1) * m.gpus_per_box) if r != rank)

    # --- routes -------------------------------------------------------------------------

    def half(self, rank: int, nic: str, send: bool) -> Route:
        """The links between a GPU and its NIC a byte crosses, with bytes per byte: the direct
        path with GDR, else up to the GPU's own CPU, through its memory, and on to the NIC."""
        return tuple((lid, w) for lid, w, _ in self.segments(rank, nic, send))

    def segments(self, rank: int, nic: str, send: bool) -> list[tuple[str, float, str]]:
        """``half`` with the role of each link: "kernel" (the GPU's own loads and stores over
        PCIe to host memory), "dma" (the NIC's DMA, or the GPU memory GDR exposes to it),
        "memory" (host-memory passes)."""
        m = self.machine
        gpu = m.gpu_nodes[rank]
        if self.gdr(rank, nic, read=send).used:
            path = self._path(gpu, nic) if send else self._path(nic, gpu)
            return [(lid, 1.0, "dma") for lid in path.links]
        cpu = m.local_cpu(rank)
        if cpu is None:
            raise InputError(f"{cut(m.name)}: no CPU node to stage network transfers through")
        passes = float(STAGING_PASSES[self.name])
        to_gpu = self._path(gpu, cpu) if send else self._path(cpu, gpu)
        to_nic = self._path(cpu, nic) if send else self._path(nic, cpu)
        kernel = [(lid, 1.0, "kernel") for lid in to_gpu.links]
        dma = [(lid, 1.0, "dma") for lid in to_nic.links]
        memory = [(f"mem:{cpu}", passes, "memory")]
        return kernel + memory + dma if send else dma + memory + kernel

    def wire(self, nic_out: str, nic_in: str) -> Route:
        """The network links between two NICs (through the switch)."""
        return tuple((lid, 1.0) for lid in self._path(nic_out, nic_in).links)

    def route(self, src: int, dst: int, nic_out: str | None = None,
              nic_in: str | None = None) -> Route:
        """One byte from GPU src to GPU dst in another box."""
        out = nic_out or self.nearest(src)
        into = nic_in or self.nearest(dst)
        return self.half(src, out, send=True) + self.wire(out, into) + \
            self.half(dst, into, send=False)

    def nccl_links(self, src: int, dst: int, nic_out: str, nic_in: str) -> list[tuple[str, float]]:
        """The links NCCL's search books a channel of this hop on, with its load per GB/s:
        the GPU-NIC paths (through the local CPU without GDR, paths.cc addInterStep), x1.2 on
        PCIe for a PHB path through an Intel CPU (search.cc followPath), and the NIC's own."""
        out: list[tuple[str, float]] = []
        for rank, nic, send in ((src, nic_out, True), (dst, nic_in, False)):
            links = [lid for lid, _ in self.half(rank, nic, send) if not lid.startswith("mem:")]
            kinds = [self.machine.links[lid].kind for lid in links]
            intel = self._phb_intel(rank, nic, send)
            out += [(lid, 1.2 if intel and kind == "pcie" else 1.0)
                    for lid, kind in zip(links, kinds, strict=True)]
        out += [(lid, 1.0) for lid, _ in self.wire(nic_out, nic_in)]
        return out

    def _phb_intel(self, rank: int, nic: str, send: bool) -> bool:
        m = self.machine
        gpu = m.gpu_nodes[rank]
        if self.gdr(rank, nic, read=send).used:
            path = self._path(gpu, nic)
            return path.type == "PHB" and any(m.is_intel_cpu(n) for n in path.nodes)
        cpu = m.local_cpu(rank)
        return cpu is not None and m.is_intel_cpu(cpu) and \
            PATH_RANK[self._path(gpu, cpu).type] <= PATH_RANK["PHB"]

    def nccl_bandwidth(self, rank: int, nic: str) -> float:
        """NCCL's bandwidth of a GPU's path to the network (search.cc getMaxBw over NET)."""
        links = [lid for lid, _ in self.half(rank, nic, send=True) if not lid.startswith("mem:")]
        beliefs = [self.machine.graph.edges[self.machine.links[lid].src,
                                            self.machine.links[lid].dst]["nccl_bandwidth"]
                   for lid in links]
        wire = [e for e in self.machine.graph.succ[nic].values() if e["kind"] == "network"]
        return min(beliefs + [e["nccl_bandwidth"] for e in wire])

    def path_type(self, rank: int, nic: str) -> str:
        """NCCL's type of a GPU's path to its NIC: PHB or worse when staged (addInterStep)."""
        m = self.machine
        direct = self._path(m.gpu_nodes[rank], nic).type
        if self.gdr(rank, nic, read=False).used:
            return direct
        cpu = m.local_cpu(rank)
        staged = max(PATH_RANK[self._path(m.gpu_nodes[rank], cpu).type] if cpu else 0,
                     PATH_RANK[self._path(cpu, nic).type] if cpu else 0, PATH_RANK["PHB"])
        return PATH_TYPES[max(PATH_RANK[direct], staged)]

    # --- what a hop costs beyond its links ------------------------------------------------

    def stream_ceiling(self, channels: int) -> float:
        """B/s the socket transport moves across one box boundary (inf over IB)."""
        if self.name != "Socket":
            return math.inf
        threads = min(self.env.socket_threads if self.env.socket_threads is not None and
                      self.env.socket_threads >= 0 else 0, MAX_SOCKET_THREADS)
        per_thread = self.env.socks_per_thread
        socks = threads * (per_thread if per_thread is not None and per_thread >= 0 else 1)
        if socks > MAX_SOCKETS and threads:
            socks = MAX_SOCKETS // threads * threads
        streams = 1 if threads == 0 or socks == 0 else channels * min(threads, socks)
        return streams * self.comm.wire.socket_stream_gbps * GB

    @property
    def mechanism(self) -> str:
        """Its achieved-rate factor's name (machine/scales.py)."""
        return "net_ib" if self.name == "IB" else "net_socket"

    def sync_us(self) -> float:
        """Per-step cost of a network hop beyond its links' latencies (wire.py)."""
        w = self.comm.wire
        return w.net_ib_sync_us if self.name == "IB" else w.net_sync_us

    def describe(self, ranks: tuple[int, ...] | None = None) -> str:
        """The transport in one line: plugin, why, GDR each way and why, the ceiling."""
        m = self.machine
        rank = 0 if ranks is None else ranks[0]
        nic = self.nearest(rank)
        card = nic_of(m.nodes[nic])
        send, recv = self.gdr(rank, nic, read=True), self.gdr(rank, nic, read=False)
        count = len(self.usable(m.box_of(rank)))
        speed = f"{count} x " if count > 1 else ""
        speed += f"{card.line_gbps:g} Gb/s {card.card.name}"
        text = f"NET/{self.name} ({self.why}) over {speed} per box"
        if send.used and recv.used:
            text += f"; GPUDirect RDMA both ways ({send.why})"
        elif not send.used and not recv.used:
            text += (f"; no GPUDirect RDMA: {recv.why}; every byte staged through host memory "
                     "on both ends")
        else:
            text += f"; GPUDirect RDMA on receive only (send: {send.why})"
        if self.name == "Socket":
            text += (f"; one TCP stream moves {self.comm.wire.socket_stream_gbps:g} GB/s "
                     "(NCCL_SOCKET_NTHREADS, NCCL_NSOCKS_PERTHREAD)")
        return text
