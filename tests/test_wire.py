"""The wire's physics: per-hop latencies by transport, channel caps on PCIe, efficiencies.

Checks named after their datasets (validation/pcie-p2p.yaml, measurements.yaml), with the
acceptance tolerances of each row, and the invariant that none of it changes NCCL's choices.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from simulator.inputs.config import load_topology
from simulator.inputs.schema import CALIBRATION_PARAMETERS
from simulator.machine.topology import Machine
from simulator.nccl import collectives, wire
from simulator.nccl import tuning as nt
from simulator.nccl.communicator import Communicator
from simulator.nccl.env import NcclEnv
from simulator.nccl.perf import time_alone
from simulator.units import GB, GiB, KiB, MiB

ROOT = Path(__file__).resolve().parent.parent
GB202 = str(ROOT / "validation" / "topologies" / "8xgb202-wrx90-2switch-p2p.yaml")
# voipmonitor/rtx6kpro wrx90 two-switch box, 8 GPUs, ring forced (validation/pcie-p2p.yaml)
GB202_ALLREDUCE = {64 * KiB: 6.33, 256 * KiB: 18.28, MiB: 21.57, 16 * MiB: 44.16,
                   64 * MiB: 45.63, GiB: 46.44}


def machine(path: str) -> Machine:
    return Machine.from_config(load_topology(path))


@pytest.mark.parametrize("size, measured", GB202_ALLREDUCE.items())
def test_gb202_two_switch_p2p_allreduce(size, measured):
    r = time_alone(Communicator(machine(GB202)), "allreduce", size, algo="ring")
    assert r.busbw_gbps == pytest.approx(measured, rel=0.15 if size >= MiB else 0.30)
    assert r.transport == "P2P"


def test_gb202_plateau_is_its_links_not_its_channels():
    """4 channels of 512 threads could carry twice the plateau: the Gen5 links bind, at the
    share of their payload rate Simple P2P reaches on Gen5 (its own 1 GiB row)."""
    m = machine(GB202)
    comm = Communicator(m)
    plan = collectives.plan(comm, "allreduce", GiB)
    assert plan.n_channels == 4
    assert plan.max_rate == pytest.approx(4 * comm.wire.simple_channel_cap_gbps * GB)
    link = m.links["gpu0->sw0"].capacity * wire.P2P_SIMPLE_LINK_EFFICIENCY[5]
    assert plan.max_rate > 1.5 * link
    assert time_alone(comm, "allreduce", GiB).busbw_gbps == pytest.approx(link / GB, rel=0.01)


TURIN = str(ROOT / "validation" / "topologies" / "8xgb202-dual-turin-p2p.yaml")


def test_turin_fallback_runs_two_half_channels_that_bind():
    """NCCL's search finds no ring over AMD's 16 GB/s socket link at sm120's speeds: one ring at
    0.1 GB/s, doubled to 2 channels of 256 threads (tuning.cc L244-247); they, not the links,
    set the 32 MiB row (voipmonitor/rtx6kpro: 22.2 GB/s); 8 channels lift it to the links."""
    comm = Communicator(machine(TURIN))
    assert comm.ring().fallback
    plan = collectives.plan(comm, "allreduce", 32 * MiB)
    assert (plan.protocol, plan.n_channels) == ("Simple", 2)
    assert plan.max_rate == pytest.approx(comm.wire.simple_channel_cap_gbps * GB)  # 2 x half
    assert time_alone(comm, "allreduce", 32 * MiB).busbw_gbps == pytest.approx(22.2, rel=0.02)
    eight = Communicator(machine(TURIN), NcclEnv.from_environ({"NCCL_MIN_NCHANNELS": "8"}))
    wide = time_alone(eight, "allreduce", GiB)
    assert wide.n_channels == 8
    link = machine(TURIN).links["gpu0->cpu0"].capacity * wire.P2P_SIMPLE_LINK_EFFICIENCY[5]
    assert wide.busbw_gbps == pytest.approx(link / GB, rel=0.01)


def test_two_socket_p2p_box_is_not_halved_by_its_two_channels():
    """An Intel two-socket box with P2P: NCCL's ring is one channel at 20 GB/s (> PCI_BW), so
    its 2 channels get 512 threads each and the Gen5 links, not the channels, bind."""
    m = Machine.from_config(load_topology("8x5090-dual-socket").copy(p2p=True, p2p_level="SYS"))
    comm = Communicator(m)
    plan = collectives.plan(comm, "allreduce", GiB)
    assert plan.n_channels == 2 and m.is_intel_cpu("cpu0")
    assert nt.threads_per_channel(nt.Graph(8, comm.ring().n_channels,
                                           comm.ring().channel_bandwidth / GB, False,
                                           "blackwell"), "ring", "Simple") == 512
    link = m.links["gpu0->cpu0"].capacity * wire.P2P_SIMPLE_LINK_EFFICIENCY[5]
    assert time_alone(comm, "allreduce", GiB).busbw_gbps == pytest.approx(link / GB, rel=0.05)


def test_latency_us_on_a_link_changes_the_time(tmp_path):
    text = Path(GB202).read_text()
    times = []
    for latency in (0, 1000000):
        path = tmp_path / f"lat{latency}.yaml"
        path.write_text(text.replace("{a: cpu0, b: sw0, kind: pcie, gen: 5, lanes: 16}",
                                     f"{{a: cpu0, b: sw0, kind: pcie, gen: 5, lanes: 16, "
                                     f"latency_us: {latency}}}"))
        times.append(time_alone(Communicator(machine(str(path))), "allreduce", MiB).time_us)
    # 14 steps, each crossing the uplink once on the slowest hop
    assert times[1] - times[0] == pytest.approx(14 * 1e6, rel=1e-3)


def test_step_latency_is_route_plus_protocol_sync():
    m = machine(GB202)
    w = Communicator(m).wire
    same_switch = collectives.step_latency(Communicator(m), 0, 1, "LL")
    cross = collectives.step_latency(Communicator(m), 3, 4, "LL")
    assert same_switch == pytest.approx(Communicator(m).route_latency(0, 1)
                                        + w.p2p_ll_sync_us * 1e-6)
    assert cross > same_switch  # through the root complex: twice the PCIe links
    assert collectives.step_latency(Communicator(m), 3, 4, "Simple") - cross == pytest.approx(
        (w.p2p_simple_sync_us - w.p2p_ll_sync_us) * 1e-6)


def test_shm_steps_pay_the_host_memory_poll():
    m = machine("2x2080ti-switch")
    assert Communicator(m).transport(0, 1) == "SHM"
    ll = collectives.step_latency(Communicator(m), 0, 1, "LL")
    comm = Communicator(m)
    assert ll == pytest.approx(comm.route_latency(0, 1) + comm.wire.shm_ll_sync_us * 1e-6)


def test_channel_cap_binds_only_off_nvlink():
    plan = collectives.plan(Communicator(machine("8xh200-nvswitch")), "allreduce", 16 * GiB)
    assert plan.max_rate > 1000 * GB  # NVLink: no PCIe channel cap
    plan = collectives.plan(Communicator(machine("8x5090-switch-p2p")), "allreduce", GiB)
    assert plan.max_rate == pytest.approx(plan.n_channels * wire.SIMPLE_CHANNEL_CAP_GBPS * GB)
    # the per-channel throughput is what the Turin box's two 256-thread channels reach
    cap = wire.SIMPLE_CHANNEL_CAP_GBPS  # 2 x 256 threads = one channel of 512, plus start-up
    assert cap == pytest.approx(22.2, rel=0.03)


def test_wire_parameters_never_change_nccls_choices():
    """NCCL's tuning constants alone pick algorithm, protocol and channels."""
    for name in ("8x5090-switch", "8x5090-switch-p2p", "8x5090-dual-socket", "8xh200-nvswitch",
                 "2x2080ti-switch"):
        base = Communicator(machine(name))
        odd = Communicator(machine(name), wire=wire.WireParams(
            call_latency_us=100, p2p_simple_sync_us=50, shm_ll_sync_us=0, shm_simple_sync_us=0,
            simple_channel_cap_gbps=1, ll_channel_cap_gbps=1, p2p_pcie_simple_efficiency=0.1))
        for size in (8, 64 * KiB, MiB, 64 * MiB, GiB):
            a, b = base.plan("allreduce", size), odd.plan("allreduce", size)
            assert (a.algorithm, a.protocol, a.n_channels) == (b.algorithm, b.protocol,
                                                                b.n_channels)
            assert a.nccl_time_us == b.nccl_time_us
            assert b.latency != a.latency  # the physics did change


def test_gb202_choices_are_nccls():
    """LL on 2 then 4 channels for small sizes, Simple on 4 from 16 MiB (enqueue.cc, tuning.cc)."""
    m = machine(GB202)
    comm = Communicator(m)
    got = [(p.protocol, p.n_channels) for p in
           (comm.plan("allreduce", s, algo="ring") for s in GB202_ALLREDUCE)]
    assert got == [("LL", 2), ("LL", 4), ("LL", 4), ("Simple", 4), ("Simple", 4), ("Simple", 4)]
    assert nt.BASE_LATENCY["ring"]["Simple"] == 8.4  # NCCL's belief, unchanged, still ranks


def test_every_wire_parameter_is_documented():
    doc = (ROOT / "docs" / "inputs.md").read_text()
    documented = set(re.findall(r"`(\w+)`", doc))
    assert set(CALIBRATION_PARAMETERS) <= documented
    assert set(CALIBRATION_PARAMETERS) == {f.name for f in dataclasses.fields(wire.WireParams)}


def test_one_gpu_costs_the_call_alone():
    m = machine("8xh200-nvswitch").subset(1)
    r = time_alone(Communicator(m), "allreduce", GiB)
    assert r.time_us == pytest.approx(Communicator(m).wire.call_latency_us)
