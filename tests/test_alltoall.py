"""All-to-all, gather, scatter and sendrecv as NCCL runs them (nccl/alltoall.py): NCCL's
channel, chunk and protocol rules, closed forms on a crossbar and a shared uplink, and the
published 2x2080 Ti SHM all-to-all."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.cli import main
from simulator.nccl import alltoall, wire
from simulator.nccl.communicator import Communicator, load_communicator
from simulator.nccl.env import NcclEnv
from simulator.nccl.perf import time_alone
from simulator.outputs import nccl_tests
from simulator.units import GB, GiB, KiB, MiB
from tests.test_collectives import machine_from, preset

TWO_SWITCHES = """
name: two-switches
gpu: rtx5090
p2p: true
nodes:
  - {id: cpu0, kind: cpu}
  - {id: sw0, kind: pcie_switch}
  - {id: sw1, kind: pcie_switch}
  - {id: gpu0, kind: gpu}
  - {id: gpu1, kind: gpu}
  - {id: gpu2, kind: gpu}
  - {id: gpu3, kind: gpu}
links:
  - {a: cpu0, b: sw0, kind: pcie, gen: 5, lanes: 16}
  - {a: cpu0, b: sw1, kind: pcie, gen: 5, lanes: 16}
  - {a: sw0, b: gpu0, kind: pcie, gen: 5, lanes: 16}
  - {a: sw0, b: gpu1, kind: pcie, gen: 5, lanes: 16}
  - {a: sw1, b: gpu2, kind: pcie, gen: 5, lanes: 16}
  - {a: sw1, b: gpu3, kind: pcie, gen: 5, lanes: 16}
"""


def test_rules_as_nccl_writes_them() -> None:
    assert [alltoall.pow2_up(x) for x in (1, 2, 3, 4, 5, 24)] == [1, 2, 4, 4, 8, 32]
    assert [alltoall.reverse_bits(r, 2) for r in range(4)] == [0, 2, 1, 3]  # channel.h
    # enqueue.cc L913-926, one node, 128 KiB chunk: parts of >= 16 KiB, at most 4 MiB
    assert alltoall.task_channels(1 * MiB, 1, 2, 128 * KiB, False) == 1
    assert alltoall.task_channels(8 * MiB, 1, 2, 128 * KiB, False) == 2
    assert alltoall.task_channels(64 * MiB, 2, 2, 128 * KiB, False) == 2
    assert alltoall.task_channels(0, 2, 2, 128 * KiB, False) == 1
    assert alltoall.task_channels(8 * KiB, 2, 2, 128 * KiB, False) == 1  # one part of 16 KiB


def test_channels_and_chunk_follow_the_links() -> None:
    pcie = Communicator(preset("8x5090-switch-p2p"))
    ranks = tuple(range(8))
    assert alltoall.p2p_channels(pcie, ranks) == 4  # 2 search rings, doubled
    assert alltoall.peer_channels(pcie, 0, 1) == 2  # PCIe: 2 per peer
    assert alltoall.chunk_size(pcie, ranks) == 128 * KiB  # NCCL_P2P_PCI_CHUNKSIZE
    nvl = Communicator(preset("8xh100-nvswitch"))
    assert alltoall.chunk_size(nvl, ranks) == 512 * KiB  # every pair on NVLink
    assert alltoall.p2p_channels(nvl, ranks) == 32  # 24 rounded up to a power of two
    # NCCL's NVLink path bandwidth over its per-link figure (topo.h SM90 20.6 GB/s), x2
    assert alltoall.peer_channels(nvl, 0, 1) == 2 * int(
        nvl.nccl_path(0, 1).nccl_bandwidth / (20.6 * GB))
    env = NcclEnv.from_environ({"NCCL_P2P_PCI_CHUNKSIZE": "524288",
                                "NCCL_MAX_P2P_NCHANNELS": "2"})
    tuned = Communicator(preset("8x5090-switch-p2p"), env)
    assert alltoall.chunk_size(tuned, ranks) == 512 * KiB
    assert alltoall.p2p_channels(tuned, ranks) == 2


def test_protocol_switches_to_ll_below_the_threshold_per_channel() -> None:
    comm = Communicator(preset("8x5090-switch-p2p"))
    small = alltoall.plan(comm, "alltoall", 8 * 8 * KiB)  # 8 KiB per peer
    big = alltoall.plan(comm, "alltoall", 64 * MiB)
    assert small.protocol == "LL" and big.protocol == "Simple"
    env = NcclEnv.from_environ({"NCCL_P2P_LL_THRESHOLD": "0"})
    assert alltoall.plan(Communicator(preset("8x5090-switch-p2p"), env), "alltoall",
                         8 * 8 * KiB).protocol == "Simple"


def test_p2p_read_only_between_ampere_gpus_on_nvlink() -> None:
    a100 = Communicator(preset("8xa100-nvswitch"))
    assert alltoall.plan(a100, "alltoall", 8 * MiB).transport == "P2P/read"
    h100 = Communicator(preset("8xh100-nvswitch"))
    assert alltoall.plan(h100, "alltoall", 8 * MiB).transport == "P2P/write"
    env = NcclEnv.from_environ({"NCCL_P2P_READ_ENABLE": "0"})
    assert alltoall.plan(Communicator(preset("8xa100-nvswitch"), env), "alltoall",
                         8 * MiB).transport == "P2P/write"


def test_every_pair_moves_its_share_once() -> None:
    comm = Communicator(preset("8x5090-switch-p2p"))
    p = alltoall.plan(comm, "alltoall", 64 * MiB)
    assert len(p.tasks) == 64 and len(p.flows) == 56  # a rank's copy to itself: no link
    assert all(f.nbytes == 8 * MiB for f in p.flows)
    gather = alltoall.plan(comm, "gather", 64 * MiB)
    assert {t.dst for t in gather.tasks} == {0} and len(gather.flows) == 7
    scatter = alltoall.plan(comm, "scatter", 64 * MiB)
    assert {t.src for t in scatter.tasks} == {0} and len(scatter.flows) == 7
    ring = alltoall.plan(comm, "sendrecv", 64 * MiB)
    assert sorted((t.src, t.dst) for t in ring.tasks) == [(i, (i + 1) % 8) for i in range(8)]


def test_alltoall_on_a_crossbar_is_n_minus_1_over_n_size_over_link_rate() -> None:
    """NVSwitch: each GPU's link carries its n-1 sends; busbw = the link's payload rate."""
    comm = Communicator(preset("8xh100-nvswitch"))
    size = 4 * GiB
    r = time_alone(comm, "alltoall", size)
    p = comm.plan("alltoall", size)
    lid, weight = max(p.flows[0].usage, key=lambda u: comm.machine.links[u[0]].capacity)
    rate = comm.machine.links[lid].capacity / weight  # one pair's payload rate alone
    latency = max(f.latency for f in p.flows)
    expected = latency + (7 / 8) * size / rate
    assert r.time_us * 1e-6 == pytest.approx(expected, rel=1e-6)
    assert r.busbw_gbps == pytest.approx(7 / 8 * size / (expected * GB), rel=1e-9)


def test_a_shared_uplink_binds_half_the_pairs(tmp_path) -> None:
    """Two switches of two GPUs: the 4 cross-switch pairs of each direction share one uplink,
    so a cross pair moves at a quarter of it while the same-switch pair has its links."""
    comm = Communicator(machine_from(tmp_path, "two-switches", TWO_SWITCHES))
    p = comm.plan("alltoall", 1 * GiB)
    r = time_alone(comm, "alltoall", 1 * GiB)
    assert r.bottleneck_link in ("sw0->cpu0", "cpu0->sw0", "sw1->cpu0", "cpu0->sw1")
    cross = [f for f in p.flows if any(lid == "sw0->cpu0" for lid, _ in f.usage)]
    assert len(cross) == 4
    uplink = comm.machine.links["sw0->cpu0"].capacity
    weight = dict(cross[0].usage)["sw0->cpu0"]
    per_pair = min(uplink / weight / 4, cross[0].max_rate)
    assert r.time_us * 1e-6 == pytest.approx(cross[0].latency + (1 * GiB / 4) / per_pair,
                                             rel=1e-6)


def test_thread_blocks_or_the_gpu_link_bind_on_one_switch_with_p2p() -> None:
    """One PCIe switch, P2P: each pair's task holds 2 of 4 thread blocks shared by 4 works,
    so a rank sends at most 7 x 2 x cap / 4 (a rank's copy to itself holds the rest); at the
    per-channel rate wire.py gives a 512-thread channel that is above what a GPU's own Gen5
    link carries, so the link binds; at a quarter of it the thread blocks do."""
    from dataclasses import replace

    comm = Communicator(preset("8x5090-switch-p2p"))
    cap = comm.wire.simple_channel_cap_gbps
    p = comm.plan("alltoall", 1 * GiB)
    assert all(f.max_rate == pytest.approx(2 * cap * GB / 4, rel=1e-9) for f in p.flows)
    r = time_alone(comm, "alltoall", 1 * GiB)
    assert r.bottleneck_link.startswith("sw0->gpu") and r.bottleneck_utilization > 0.99
    assert r.busbw_gbps < 7 * 2 * cap / 4
    slow = Communicator(comm.machine, wire=replace(comm.wire, simple_channel_cap_gbps=cap / 4))
    r = time_alone(slow, "alltoall", 1 * GiB)
    assert r.busbw_gbps == pytest.approx(7 * 2 * (cap / 4) / 4, rel=0.01)
    send = time_alone(slow, "sendrecv", 1 * GiB)  # one peer on 2 channels
    assert send.busbw_gbps == pytest.approx(2 * cap / 4, rel=0.01)


def test_without_p2p_every_byte_goes_through_host_memory() -> None:
    env = NcclEnv.from_environ({"NCCL_P2P_DISABLE": "1"})
    comm = Communicator(preset("8x5090-switch-p2p"), env)
    p = comm.plan("alltoall", 64 * MiB)
    assert p.transport == "SHM"
    assert all(any(lid.startswith("mem:") for lid, _ in f.usage) for f in p.flows)
    slow = time_alone(comm, "alltoall", 64 * MiB)
    fast = time_alone(Communicator(preset("8x5090-switch-p2p")), "alltoall", 64 * MiB)
    assert slow.busbw_gbps < fast.busbw_gbps / 4  # 56 pairs up and down one uplink


@settings(max_examples=25, deadline=None)
@given(st.integers(min_value=10, max_value=30), st.sampled_from(["alltoall", "sendrecv",
                                                                  "gather", "scatter"]))
def test_more_bytes_never_take_less_time(log_size: int, op: str) -> None:
    comm = load_communicator("8x5090-dual-socket")
    small = time_alone(comm, op, 1 << log_size)
    big = time_alone(comm, op, 1 << (log_size + 1))
    assert big.time_us >= small.time_us
    assert big.busbw_gbps <= comm.machine.links["gpu0->cpu0"].capacity / GB * 1.0001


# 2x RTX 2080 Ti behind one PCIe switch, no P2P (SHM): alltoall_perf -g 2, out-of-place
# (Anthony-Hoo/Anthony-Hoo.github.io posts/AutoDL_Multi-GPU_Interconnection_Test.md, 37e805e).
ANTHONY_HOO_ALLTOALL = {1 * MiB: 3.46, 16 * MiB: 4.45, 256 * MiB: 4.56, 1 * GiB: 4.61}


@pytest.mark.parametrize("size, busbw", sorted(ANTHONY_HOO_ALLTOALL.items()))
def test_anthony_hoo_2x2080ti_shm_alltoall_within_20_percent(size: int, busbw: float) -> None:
    """Each rank's half crosses the switch uplink both ways through host memory, beside the
    other rank's: the SHM efficiency calibrated on the same box's all-reduce sets the rate."""
    r = time_alone(load_communicator("2x2080ti-switch"), "alltoall", size)
    assert r.transport == "SHM"
    assert r.busbw_gbps == pytest.approx(busbw, rel=0.20)


def test_nccl_tests_sizes_and_columns_for_the_new_binaries() -> None:
    assert nccl_tests.sizes("alltoall", 1024, 8, 4) == (1024, 32)  # count per peer
    assert nccl_tests.sizes("gather", 100, 8, 4) == (96, 3)
    assert nccl_tests.sizes("sendrecv", 1024, 8, 4) == (1024, 256)
    assert {nccl_tests.BINARIES[b] for b in ("alltoall_perf", "sendrecv_perf", "reduce_perf",
                                             "gather_perf", "scatter_perf")} == {
        "alltoall", "sendrecv", "reduce", "gather", "scatter"}
    assert alltoall.bus_factor("alltoall", 8) == pytest.approx(7 / 8)
    assert alltoall.bus_factor("sendrecv", 8) == 1.0


@pytest.mark.parametrize("op", ["alltoall_perf", "sendrecv_perf", "reduce_perf", "gather_perf",
                                "scatter_perf"])
def test_collective_command_prints_every_new_binary(op: str, capsys) -> None:
    assert main(["collective", "-t", "8x5090-dual-socket", "--op", op, "-b", "1K", "-e", "1M",
                 "-f", "32"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line and not line.startswith("#")]
    assert len(rows) == 3
    root = "0" if op in ("reduce_perf", "gather_perf", "scatter_perf") else "-1"
    assert all(row.split()[4] == root for row in rows)
    assert "# stepsim:" in out


def test_reduce_is_a_chain_into_the_root() -> None:
    comm = Communicator(preset("8x5090-switch-p2p"))
    p = comm.plan("reduce", 64 * MiB)
    assert p.order[-1] == 0 and p.algorithm == "ring"
    b = comm.plan("broadcast", 64 * MiB)
    assert b.order[0] == 0
    assert math.isclose(p.bus_bytes, 64 * MiB)


def test_wire_costs_are_the_collectives_own() -> None:
    """A pair's flow occupies its route as a one-hop ring would (collectives._usage)."""
    from simulator.nccl.collectives import _usage

    comm = Communicator(preset("8x5090-dual-socket"))
    p = comm.plan("alltoall", 64 * MiB)
    t = next(t for t in p.tasks if t.src != t.dst)
    assert p.flows[0].usage == _usage(comm, [(t.src, t.dst)], t.protocol)
    assert wire.channel_cap(comm.wire, "Simple") > 0
