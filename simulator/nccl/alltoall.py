"""NCCL's point-to-point operations: ``ncclAlltoAll``, ``ncclGather``, ``ncclScatter`` and a
group of ``ncclSend``/``ncclRecv`` (nccl-tests' sendrecv ring), as NCCL runs them.

NCCL runs each as send and recv tasks, one per peer (enqueue.cc L3070-3108: ``ncclAlltoAll``
appends a send and a recv for every rank, ``ncclGather`` a recv from every rank at the root,
``ncclScatter`` a send to every rank from it), scheduled in rounds (init.cc L930-950: on one
node round ``r`` sends to ``rank + r`` and receives from ``rank - r``) and all posted in one
kernel: every peer's bytes move at once, each pair on its own transport (P2P, SHM through the
receiver's host memory, or the network) and route, so they contend for every switch uplink,
root port, host memory and socket link they share. That contention is what makes an all-to-all
on PCIe unlike an all-reduce, whose ring uses each link once per direction.

NCCL's rules, each with its source (NVIDIA/nccl 2.30.7, src/):

- channels: the kernel runs on ``p2pnChannels`` = the communicator's channels clamped by
  NCCL_MIN/MAX_P2P_NCHANNELS, rounded up to a power of two (paths.cc L978-991); a peer gets at
  most ``p2pnChannelsPerPeer``: 2 over PCIe or SHM, 2 per NVLink's worth of NCCL bandwidth over
  NVLink, NCCL_NCHANNELS_PER_NET_PEER (else 2) over the network, the least over its peers,
  rounded up to a power of two (paths.cc L920-972, L989-1003);
- per task: start from the most channels that still give each of the n peers its own
  (enqueue.cc L1143-1146), as many as parts of at least chunk/8 need (chunk/2 between nodes),
  doubled while a part exceeds 32 chunks (one chunk between nodes) up to the per-peer maximum
  (enqueue.cc L913-926);
- the chunk: NCCL_P2P_NET_CHUNKSIZE between nodes, NCCL_P2P_NVL_CHUNKSIZE when every pair is
  on NVLink, else NCCL_P2P_PCI_CHUNKSIZE (128 KiB, 512 KiB, 128 KiB), at most NCCL_BUFFSIZE / 8
  (init.cc L818-843);
- protocol: LL when a task moves at most NCCL_P2P_LL_THRESHOLD (16 KiB) per channel, else
  Simple (enqueue.cc L859, L929-931);
- P2P read (the receiver pulls) only between two sm80 GPUs on NVLink, or as
  NCCL_P2P_READ_ENABLE says; otherwise the sender writes (paths.cc L414-418, p2p.cc L327-342);
- a channel is one thread block; its warps are shared evenly by the tasks (works) placed on it
  (device/sendrecv.h, ``nWarpPerWork = nWarps / nWorks``); a round's tasks start at channel
  ``reverseBits(round)`` (channel.h L22-33) and take consecutive channels (device.h L277).

Physics (as collectives.py's, from wire.py): a pair's bytes occupy each link of its route at
the protocol's wire overhead over the transport's efficiency; over PCIe a thread block pushes
at most wire.py's per-channel rate, which a task gets in proportion to its warps on each of
its channels; a task starts after the call's launch and one step of its hop (wire.py).
Assumptions: a P2P read costs what a write costs (no published measurement separates them for
NCCL on PCIe); a rank's copy to itself takes warps but no link (device memory is far faster);
the tasks of rounds beyond the 8 a batch holds share their channels' warps instead of waiting
for the batch before them (the same throughput, a different order).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

from simulator.catalog import links as link_catalog
from simulator.catalog.gpus import achievable_memory_bandwidth
from simulator.engine.program import Flow
from simulator.errors import InputError
from simulator.nccl import interference
from simulator.nccl import tuning as nt

if TYPE_CHECKING:
    from simulator.nccl.communicator import Communicator

OPS = ("alltoall", "gather", "scatter", "sendrecv")
MAX_CHANNELS = 64  # device.h MAXCHANNELS
P2P_CHUNK = {"NET": 1 << 17, "PCI": 1 << 17, "NVL": 1 << 19}  # init.cc L818-820
CHUNK_VARIABLE = {"NET": "NCCL_P2P_NET_CHUNKSIZE", "PCI": "NCCL_P2P_PCI_CHUNKSIZE",
                  "NVL": "NCCL_P2P_NVL_CHUNKSIZE"}
BUFFSIZE = 1 << 22  # init.cc DEFAULT_BUFFSIZE (4 MiB)
NCCL_STEPS = 8  # device.h
P2P_LL_THRESHOLD = 16384  # enqueue.cc L859
NET_CHANNELS_PER_PEER = 2  # paths.cc: 2 when no NIC count is known


@dataclass(frozen=True)
class Task:
    """One send of one rank to one peer, as the kernel runs it."""

    src: int
    dst: int
    nbytes: int
    round: int  # the p2p schedule's round: (dst - src) mod n
    channels: int  # thread blocks it is striped over
    protocol: str  # LL | Simple
    mode: str  # P2P/write, P2P/read, SHM, NET


@dataclass(frozen=True)
class PatternPlan:
    """One grouped point-to-point call as NCCL runs it: a flow per pair."""

    op: str
    nbytes: int  # nccl-tests' size: the buffer one rank sends (alltoall: to all its peers)
    ranks: tuple[int, ...]
    tasks: tuple[Task, ...]
    n_channels: int  # thread blocks the kernel runs on each rank (the SMs it holds)
    chunk: int  # bytes per step (NCCL's p2pChunkSize)
    flows: tuple[Flow, ...]  # one per task that crosses a link, in task order
    hbm_share: float = 0.0  # of a rank's memory bandwidth its kernel takes (interference.py)
    algorithm: str = "p2p"

    @property
    def protocol(self) -> str:
        """The protocols of the pairs' tasks (a rank's copy to itself runs none)."""
        return "+".join(sorted({t.protocol for t in self.tasks if t.src != t.dst})) or "Simple"

    @property
    def transport(self) -> str:
        return "+".join(sorted({t.mode for t in self.tasks if t.src != t.dst})) or "LOC"

    @cached_property
    def flow(self) -> Flow:
        """The pair that takes longest alone (what a single-flow reader sees)."""
        if not self.flows:
            return Flow((), 0.0)
        return max(self.flows, key=lambda f: f.latency + f.nbytes / max(f.max_rate, 1e-30))


def pow2_up(x: int) -> int:
    return 1 << max(0, (x - 1).bit_length())


def reverse_bits(value: int, bits: int) -> int:
    """channel.h reverseBits: the ``bits`` low bits of ``value`` in reverse order."""
    out = 0
    for _ in range(bits):
        out = (out << 1) | (value & 1)
        value >>= 1
    return out


def p2p_channels(comm: Communicator, ranks: tuple[int, ...]) -> int:
    """paths.cc L978-991: the group's channels, clamped by NCCL_MIN/MAX_P2P_NCHANNELS, rounded
    up to a power of two."""
    from simulator.nccl.collectives import comm_channels

    env = comm.env
    nch = env.channels(comm_channels(comm.ring(ranks).n_channels))
    nch = min(nch, env.param("NCCL_MAX_P2P_NCHANNELS", MAX_CHANNELS))
    nch = max(nch, env.param("NCCL_MIN_P2P_NCHANNELS", 1))
    return min(MAX_CHANNELS, pow2_up(max(1, nch)))


def peer_channels(comm: Communicator, a: int, b: int) -> int:
    """paths.cc ncclTopoGetNchannels: channels a task to one peer may use."""
    machine = comm.machine
    kind = machine.path_type(a, b)
    if kind == "NET":
        return comm.env.param("NCCL_NCHANNELS_PER_NET_PEER", NET_CHANNELS_PER_PEER)
    if kind in ("NVL", "NVB"):
        per_link = link_catalog.NCCL_NVLINK_PER_LINK.get(
            machine.gpu_of(a).compute_capability, link_catalog.NCCL_NVLINK_PER_LINK[80])
        return 2 * max(1, int(comm.nccl_path(a, b).nccl_bandwidth / per_link))
    return 2


def chunk_size(comm: Communicator, ranks: tuple[int, ...]) -> int:
    """init.cc L830-843: NCCL's p2pChunkSize for the group."""
    machine = comm.machine
    pairs = [(a, b) for a in ranks for b in ranks if a != b]
    kinds = {machine.path_type(a, b) for a, b in pairs}
    link = "NET" if "NET" in kinds else ("NVL" if kinds <= {"NVL", "NVB"} and kinds else "PCI")
    chunk = comm.env.param(CHUNK_VARIABLE[link], P2P_CHUNK[link])
    return max(1, min(chunk, comm.env.param("NCCL_BUFFSIZE", BUFFSIZE) // NCCL_STEPS))


def task_channels(nbytes: int, low: int, high: int, chunk: int, remote: bool) -> int:
    """enqueue.cc L913-926: the channels one task is striped over."""
    if nbytes == 0:
        return 1
    min_part = chunk // 2 if remote else chunk // 8
    max_part = chunk if remote else chunk * 32
    nch = min(low, -(-nbytes // max(1, min_part)))
    part = max(min_part, -(-nbytes // nch))
    while part > max_part and nch <= high // 2:
        nch *= 2
        part = -(-nbytes // nch)
    return nch


def _mode(comm: Communicator, a: int, b: int) -> str:
    transport = comm.transport(a, b)
    if transport != "P2P":
        return transport
    machine = comm.machine
    read = (machine.path_type(a, b) == "NVL"
            and machine.gpu_of(a).compute_capability == 80
            and machine.gpu_of(b).compute_capability == 80)
    setting = comm.env.param("NCCL_P2P_READ_ENABLE", -2)
    if setting != -2:
        read = setting != 0
    return "P2P/read" if read else "P2P/write"


def sends(op: str, nbytes: int, ranks: tuple[int, ...], root: int = 0
          ) -> list[tuple[int, int, int]]:
    """(src, dst, bytes) of every send of a call; ``nbytes`` as nccl-tests counts it (alltoall,
    gather, scatter: the whole buffer, 1/n per peer; sendrecv: what each rank sends)."""
    n = len(ranks)
    if op == "sendrecv":
        return [(ranks[i], ranks[(i + 1) % n], nbytes) for i in range(n)]
    part = nbytes // n
    root_rank = ranks[root]
    if op == "alltoall":
        return [(a, b, part) for a in ranks for b in ranks]
    if op == "gather":
        return [(a, root_rank, part) for a in ranks]
    if op == "scatter":
        return [(root_rank, b, part) for b in ranks]
    raise InputError(f"unknown point-to-point operation {op!r}; expected {', '.join(OPS)}")


def plan(comm: Communicator, op: str, nbytes: int, ranks: tuple[int, ...] | None = None
         ) -> PatternPlan:
    """NCCL's tasks for one call and a flow per pair, kept by the communicator."""
    if nbytes < 0:
        raise InputError(f"message size must be >= 0, got {nbytes}")
    ranks = tuple(range(comm.n_gpus)) if ranks is None else tuple(ranks)
    key = ("p2p-pattern", op, nbytes, ranks)
    if key not in comm.plans:
        comm.plans[key] = _make(comm, op, nbytes, ranks)
    made: PatternPlan = comm.plans[key]
    return made


def _make(comm: Communicator, op: str, nbytes: int, ranks: tuple[int, ...]) -> PatternPlan:
    n = len(ranks)
    listed = sends(op, nbytes, ranks)
    if n == 1 or nbytes == 0:  # one rank: a local copy; nothing: no kernel
        return PatternPlan(op, nbytes, ranks, (), 0 if nbytes == 0 else 1, 0, ())
    index = {r: i for i, r in enumerate(ranks)}
    total = p2p_channels(comm, ranks)
    bits = max(0, (total - 1).bit_length())
    chunk = chunk_size(comm, ranks)
    threshold = comm.env.param("NCCL_P2P_LL_THRESHOLD", P2P_LL_THRESHOLD)
    per_peer = {r: min(total, pow2_up(min(peer_channels(comm, r, p) for p in ranks if p != r)))
                for r in ranks}
    tasks: list[Task] = []
    for a, b, size in listed:
        rnd = (index[b] - index[a]) % n
        high = per_peer[a]
        low = high
        while low * n > total and low > 1:  # enqueue.cc L1146
            low //= 2
        remote = comm.machine.path_type(a, b) == "NET"
        nch = task_channels(size, low, high, chunk, remote)
        protocol = "LL" if a != b and size <= nch * threshold else "Simple"
        mode = "LOC" if a == b else _mode(comm, a, b)
        tasks.append(Task(a, b, size, rnd, nch, protocol, mode))
    # thread blocks of each rank and the works on each (its sends' and receives' rounds)
    works: dict[int, dict[int, int]] = {r: {} for r in ranks}
    placed: dict[tuple[int, int], set[int]] = {}  # (rank, round) -> channels, send or recv
    for t in tasks:
        base = reverse_bits(t.round, bits)
        chans = {(base + part) & (total - 1) for part in range(t.channels)}
        for rank in {t.src, t.dst}:
            placed.setdefault((rank, t.round), set()).update(chans)
    for (rank, _), chans in placed.items():
        for c in chans:
            works[rank][c] = works[rank].get(c, 0) + 1
    used = max(len(w) for w in works.values())
    flows = tuple(_flow(comm, t, total, bits, works) for t in tasks if t.src != t.dst)
    return PatternPlan(op, nbytes, ranks, tuple(tasks), used, chunk, flows,
                       _hbm_share(comm, ranks, tasks, flows))


def _hbm_share(comm: Communicator, ranks: tuple[int, ...], tasks: list[Task],
               flows: tuple[Flow, ...]) -> float:
    """The memory bandwidth the kernel takes from compute on the busiest rank: the bytes it
    sends at a copy's local bytes per byte over their transport (interference.py counts a
    rank's progress so: it receives as much as it sends), over the time the slowest pair
    takes alone (an upper bound on the rate, as interference.py bounds a ring's)."""
    seconds = max((f.latency + f.nbytes / interference.lone_rate(comm, f.usage, f.max_rate)
                   for f in flows), default=0.0)
    if seconds <= 0:
        return 0.0
    moved = {r: 0.0 for r in ranks}
    for t in tasks:
        if t.src != t.dst:
            moved[t.src] += t.nbytes * interference.local_bytes("sendrecv", t.mode.split("/")[0],
                                                                t.protocol)
    memory = min(achievable_memory_bandwidth(comm.machine.gpu_of(r)) for r in ranks)
    return max(moved.values()) / seconds / memory


def _flow(comm: Communicator, task: Task, total: int, bits: int,
          works: dict[int, dict[int, int]]) -> Flow:
    """One pair's bytes on its route: usage as a one-hop ring's, capped by the warps its task
    holds on each of its channels at both ends (over PCIe), after the call and one step."""
    from simulator.nccl.collectives import _pcie_channel_cap, _usage, step_latency

    a, b = task.src, task.dst
    usage = _usage(comm, [(a, b)], task.protocol)
    base = reverse_bits(task.round, bits)
    chans = [(base + part) & (total - 1) for part in range(task.channels)]
    per_channel = _pcie_channel_cap(comm, [(a, b)], task.protocol, 1)
    if math.isfinite(per_channel):
        cap = min(sum(per_channel / works[rank][c] for c in chans) for rank in (a, b))
    else:
        cap = math.inf
    if task.protocol == "LL":  # tuning.cc llMaxBw: what the LL kernel pushes at most
        arch = nt.arch_index(comm.machine.gpu_of(a).compute_capability)
        cap = min(cap, nt.LL_MAX_BW[arch] * 1e9)
    latency = comm.wire.call_latency_us * 1e-6 + step_latency(comm, a, b, task.protocol)
    return Flow(usage, float(task.nbytes), cap, latency)


def bus_factor(op: str, n: int) -> float:
    """nccl-tests busbw / algbw: alltoall, gather, scatter (n-1)/n (src/alltoall.cu L48-54,
    gather.cu, scatter.cu); sendrecv 1 (sendrecv.cu L38-44)."""
    return 1.0 if op == "sendrecv" else (n - 1) / n

