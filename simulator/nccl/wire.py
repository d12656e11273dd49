"""What moving a collective's bytes really costs, by transport and protocol (not NCCL's beliefs).

NCCL's tuning constants (tuning.py) only rank NCCL's options; the time a collective takes
comes from the parameters here, each measured or calibrated on a named dataset:

- **start-up**: a call costs ``call_latency_us`` (the kernel's launch and prologue) plus, for
  each of its sequential steps, the slowest hop's step latency: the sum of the link latencies
  on the hop's route (``latency_us`` of each link: PCIe, NVLink, the socket link) plus a
  protocol's synchronisation on that transport (LL: the receiver polls a flag that arrives with
  the data; Simple: a ``__threadfence_system`` then a flag write and poll; SHM: the receiver
  polls host memory across PCIe);
- **rate**: the smaller of two ceilings, each from its own measurements. The links: each link's
  capacity shared fairly, each byte occupying it for the protocol's wire overhead over the
  transport's efficiency (Simple P2P over PCIe: a share of the busiest link's payload rate per
  PCIe generation). The channels: over PCIe (P2P or SHM) at most ``*_channel_cap_gbps`` per
  channel, a channel being one thread block pushing stores, so its throughput scales with the
  threads NCCL gives it (Simple: 512, or 256 where NCCL's ring graph is slow, tuning.cc) and more
  channels (``NCCL_MIN_NCHANNELS``) lift a channel-bound plateau until the links bind.

``WireParams`` holds them; a calibrated topology (``calibration.fitted``) replaces any of them,
and ``inputs/schema.py``'s ``CALIBRATION_PARAMETERS`` says what each one is (the keys a
``calibration`` block may name).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING

from simulator.catalog import links as link_catalog
from simulator.units import GB, US

if TYPE_CHECKING:
    from simulator.inputs.schema import CalibrationConfig

# --- the datasets the defaults come from (validation/*.yaml) ---------------------------------
# Bytes on the wire per payload byte: LL line = 8 B data + 8 B flags in 16 B; LL128 line =
# 120 B data + 8 B flag in 128 B (device.h ncclLLFifoLine, NCCL_LL128_LINESIZE).
WIRE_OVERHEAD = {"LL": 2.0, "LL128": 128 / 120, "Simple": 1.0}
# NVLink payload share of the signalling rate: nvbandwidth device-to-device copy 396.4 GB/s
# over 18 NVLink4 links x 25 GB/s (8xh200-nvswitch-ring, `also`).
NVLINK_EFFICIENCY = 396.4 / 450.0
# Simple protocol over NVLink: per-step flag + __threadfence_system stalls a channel between
# steps. Calibrated on 8xh200-nvswitch-ring: ring AR / AG / RS at 16G reach 367.2 / 361.4 /
# 362.9 GB/s against the 396.4 GB/s copy rate; one factor, their mean, serves all three.
SIMPLE_EFFICIENCY = (367.2 + 361.4 + 362.9) / 3 / 396.4
# SHM: GPU kernels store to and load from pinned host memory over PCIe (no copy engine), which
# uses PCIe less well than DMA. Calibrated on 2x2080ti-gen3-switch-shm: the mean bandwidth
# plateau of its large messages (all-reduce 16M-1G: 3.99, 3.99, 4.00, 4.00; all-gather 1G:
# 3.79 GB/s busbw), with both ring hops crossing one Gen3 x16 uplink (13.54 GB/s) each way.
SHM_PLATEAU_BUSBW = (3.99 + 3.99 + 4.00 + 4.00 + 3.79) / 5
SHM_PCIE_EFFICIENCY = SHM_PLATEAU_BUSBW * 2 / (13.54 * SIMPLE_EFFICIENCY)

# 2x4090 / 4x4090 SHM in Docker (kalavai-net/kalavai-client, fixtures B4, B5): all-reduce of 8 B
# takes 8.97 us over 2 ring steps and 18.90 us over 6: 2.48 us a step, 4.0 us for the call;
# consistent with CUDA's 3-4 us per back-to-back kernel launch (NVIDIA, "Getting Started with
# CUDA Graphs", 2019).
_B4_8B_US, _B5_8B_US = 8.97, 18.90
CALL_LATENCY_US = _B4_8B_US - 2 * (_B5_8B_US - _B4_8B_US) / 4

# 2x2080ti-gen3-switch-shm: the all-reduce latency floor (8 B: 12.25 us, 1 KiB: 12.10 us) =
# the call + 2 steps x (its SHM route: 4 PCIe hops, + the host-memory poll).
_SHM_FLOOR_US = (12.25 + 12.10) / 2
SHM_LL_SYNC_US = (_SHM_FLOOR_US - CALL_LATENCY_US) / 2 - 4 * link_catalog.PCIE_HOP_LATENCY / US
# ...and its first Simple row, 64 KiB in 40.10 us, of which 16.6 us move the bytes at the
# plateau: the rest is the call + 2 Simple steps (fence, flag, poll, all through host memory).
SHM_SIMPLE_SYNC_US = ((40.10 - 65536 / SHM_PLATEAU_BUSBW / 1e3 - CALL_LATENCY_US) / 2
                      - 4 * link_catalog.PCIE_HOP_LATENCY / US)

# Simple P2P over PCIe reaches a share of the busiest link's payload rate that depends on the
# PCIe generation (a ring all-reduce's plateau over its links' catalog payload rate):
# - Gen4: 4x4090-epyc-p2p-patched, 1 GiB at 25.95 GB/s busbw on Gen4 x16 root ports;
# - Gen5: 8xgb202-wrx90-2switch-p2p (validation/pcie-p2p.yaml), 1 GiB at 46.44 GB/s busbw, every
#   ring hop a Gen5 x16 link (its 4 channels of 512 threads could carry twice that, below).
# No published Gen3 or Gen6 plateau: they take the nearest measured generation's share.
_GEN4_PLATEAU, _GEN5_PLATEAU = 25.95, 46.44
P2P_SIMPLE_LINK_EFFICIENCY = {
    4: _GEN4_PLATEAU / (link_catalog.pcie_bandwidth(4, 16) / GB),
    5: _GEN5_PLATEAU / (link_catalog.pcie_bandwidth(5, 16) / GB)}
P2P_SIMPLE_LINK_EFFICIENCY[3] = P2P_SIMPLE_LINK_EFFICIENCY[4]  # assumption: as Gen4
P2P_SIMPLE_LINK_EFFICIENCY[6] = P2P_SIMPLE_LINK_EFFICIENCY[5]  # assumption: as Gen5

# ...and the GB202 box's 16 MiB (44.16) and 64 MiB (45.63) rows leave 32.6 and 44.8 us of
# start-up over that link-bound plateau, mean 38.7: 14 steps, each over a cross-switch hop of 4
# PCIe links.
_GB202_STEPS = 14
_GB202_STARTUP_US = sum(size * 1.75 / bw / 1e3 - size * 1.75 / _GEN5_PLATEAU / 1e3
                        for size, bw in ((16 << 20, 44.16), (64 << 20, 45.63))) / 2
P2P_SIMPLE_SYNC_US = ((_GB202_STARTUP_US - CALL_LATENCY_US) / _GB202_STEPS
                      - 4 * link_catalog.PCIE_HOP_LATENCY / US)

# One channel is one thread block storing over PCIe; its Simple throughput scales with its
# threads. NCCL gives a ring's Simple channels NCCL_SIMPLE_MAX_NTHREADS = 512 threads, or 256
# where the ring graph's bwIntra x nChannels <= PCI_BW = 12 GB/s (tuning.cc L244-247), as where
# its search found no ring and fell back to one channel at 0.1 GB/s (search.cc).
# Fitted where the channel count was varied: voipmonitor/rtx6kpro optimization/nccl-tuning.md,
# "Impact of Channel Count" (8x RTX PRO 6000 on dual EPYC Turin, P2P over the socket link):
# NCCL's default there, the fallback (2 channels of 256 threads: "Channels 2 (minimum)" on the
# same page), reaches 22.2 GB/s busbw at 32 MiB; NCCL_MIN_NCHANNELS=8 lifts it to 37.6 (the
# links bind). Less the start-up of its 14 steps (the call, each step's cross-socket hop and
# sync), 2 channels of 256 threads move 32 MiB x 1.75 at 22.2 GB/s; one of 512 twice one.
_TURIN_BYTES, _TURIN_BUSBW, _TURIN_CHANNELS, _TURIN_STEPS = 32 << 20, 22.2, 2, 14
_TURIN_STEP_US = (2 * link_catalog.PCIE_HOP_LATENCY
                  + link_catalog.SOCKET_LINKS["amd-xgmi"].latency) / US + P2P_SIMPLE_SYNC_US
_TURIN_MOVING_US = (_TURIN_BYTES * 1.75 / _TURIN_BUSBW / 1e3
                    - CALL_LATENCY_US - _TURIN_STEPS * _TURIN_STEP_US)
SIMPLE_THREADS = 512  # NCCL_SIMPLE_MAX_NTHREADS (device.h)
SIMPLE_CHANNEL_CAP_GBPS = (_TURIN_BYTES * 1.75 / _TURIN_MOVING_US / 1e3 / _TURIN_CHANNELS
                           * SIMPLE_THREADS / 256)

# Host-memory passes per byte of a staged transport: SHM writes it there and reads it back
# (shm.cc); NET over loopback sockets adds the kernel's two copies, each a read and a write
# (the sender's send() into the socket buffer, the receiver's recv() out of it).
HOST_MEMORY_PASSES = {"SHM": 2, "NET": 6}
# assumption: a loopback TCP message through the kernel's stack and NCCL's proxy threads costs
# about 10 us a step; no published nccl-tests table with NCCL_SHM_DISABLE=1 was found
NET_SYNC_US = 10.0

# --- between boxes (nccl/net.py) ------------------------------------------------------------
# NCCL's IB transport moves this share of the network's payload rate (the links already carry
# the frames' headers, catalog/nics.py). The published ring plateaus over GPUDirect RDMA, each
# over its line rate and divided by InfiniBand's frame share (4096/4122): 12.2 GB/s on one
# 100 Gb/s EDR card (NVIDIA/nccl-tests#29, sjeaugey 2019: "as good as you can get"), 192 GB/s on
# DGX A100's 8 x 200 Gb/s HDR (NVIDIA/nccl#812, AddyLaddy), 96 GB/s peak on 3 x 8 A100 with
# 4 x 200 Gb/s HDR (NVIDIA/nccl-tests#119); their mean (validation/multinode.yaml, "fit" rows).
_IB_FRAME = 4096 / 4122
_IB_PLATEAUS = (12.2 / 12.5, 192 / 200, 96 / 100)
NET_EFFICIENCY = sum(_IB_PLATEAUS) / len(_IB_PLATEAUS) / _IB_FRAME
# A step of NET/IB: the GPU posts a flag, NCCL's proxy thread polls it and posts the RDMA write,
# the remote proxy polls its completion (and flushes GPU memory before Hopper) and raises the
# tail the remote GPU polls. NVIDIA/nccl-tests#150: all_reduce of 8 B between two A100 nodes,
# one GPU each, over HDR InfiniBand, 19.90 us out of place and 18.96 in place: the call plus 2
# steps, each over the network's one-way latency (1 us, catalog/nics.py) and 4 PCIe hops.
_NCCL_TESTS_150_US = (19.90 + 18.96) / 2
NET_IB_SYNC_US = ((_NCCL_TESTS_150_US - CALL_LATENCY_US) / 2 - 1.0
                  - 4 * link_catalog.PCIE_HOP_LATENCY / US)
# One TCP stream through a host's kernel: "single stream testing will range from 15-35 Gbps" on
# a tuned 100G host (ESnet, "Performance Expectations for a 100G Host", fasterdata.es.net,
# 2024-01-17); their geometric mean. NCCL over sockets reports the same order: 1.85 GB/s on one
# ring over 32 Gb/s (NVIDIA/nccl#209), about 4 GB/s over IPoIB (NVIDIA/nccl#465); the range
# (1.9-4.4 GB/s) is its uncertainty.
SOCKET_STREAM_GBPS = math.sqrt(15 * 35) / 8


@dataclass(frozen=True)
class WireParams:
    """The physical collective parameters of one machine (defaults: the datasets above)."""

    call_latency_us: float = CALL_LATENCY_US
    # LL: the flag travels with the data and the receiver spins on its own memory, so no
    # round trip is added (NCCL issue #281: LL needs no fence); calibrate can give it one
    p2p_ll_sync_us: float = 0.0
    p2p_simple_sync_us: float = P2P_SIMPLE_SYNC_US
    shm_ll_sync_us: float = SHM_LL_SYNC_US
    shm_simple_sync_us: float = SHM_SIMPLE_SYNC_US
    net_sync_us: float = NET_SYNC_US
    # None: each PCIe link's generation's share (P2P_SIMPLE_LINK_EFFICIENCY); a calibration
    # fits one share for every link of the box
    p2p_pcie_simple_efficiency: float | None = None
    nvlink_simple_efficiency: float = SIMPLE_EFFICIENCY
    shm_pcie_efficiency: float = SHM_PCIE_EFFICIENCY
    simple_channel_cap_gbps: float = SIMPLE_CHANNEL_CAP_GBPS  # a channel of 512 threads
    # no published row is LL-channel-bound: GB202's LL rows (64K-1M) are wire-bound (LL moves
    # 8 data bytes in 16); calibrate fits a cap when a log says otherwise
    ll_channel_cap_gbps: float = math.inf
    host_memory_gb_per_s: float | None = None  # None: each cpu node's own
    socket_link_gb_per_s: float | None = None  # None: each socket link's own
    net_efficiency: float = NET_EFFICIENCY  # NET/IB's share of the network's payload rate
    net_ib_sync_us: float = NET_IB_SYNC_US
    socket_stream_gbps: float = SOCKET_STREAM_GBPS

    @classmethod
    def from_calibration(cls, calibration: CalibrationConfig | None) -> WireParams:
        params = cls()
        if calibration is None:
            return params
        known = {f.name for f in fields(cls)}
        return replace(params, **{f.parameter: f.value for f in calibration.fitted
                                  if f.parameter in known})

    def value(self, name: str) -> float | None:
        return getattr(self, name)  # type: ignore[no-any-return]


def sync_us(params: WireParams, transport: str, protocol: str) -> float:
    """A protocol's per-step synchronisation on a transport, beyond the route's latencies."""
    if transport == "SHM":
        return params.shm_simple_sync_us if protocol == "Simple" else params.shm_ll_sync_us
    if transport == "NET":
        return params.net_sync_us
    return params.p2p_simple_sync_us if protocol == "Simple" else params.p2p_ll_sync_us


def p2p_link_efficiency(params: WireParams, gen: int | None) -> float:
    """Share of a PCIe link's payload rate Simple P2P uses: the calibrated one, else its
    generation's (Gen4's where the generation is not known)."""
    if params.p2p_pcie_simple_efficiency is not None:
        return params.p2p_pcie_simple_efficiency
    return P2P_SIMPLE_LINK_EFFICIENCY.get(gen or 4, P2P_SIMPLE_LINK_EFFICIENCY[4])


def channel_cap(params: WireParams, protocol: str, threads: int = SIMPLE_THREADS) -> float:
    """B/s one channel of ``threads`` threads can push over PCIe for a protocol (inf: no
    cap)."""
    if protocol == "Simple":
        return params.simple_channel_cap_gbps * GB * threads / SIMPLE_THREADS
    if protocol == "LL":
        return params.ll_channel_cap_gbps * GB
    return math.inf  # LL128 runs on NVLink only (NCCL's default)
