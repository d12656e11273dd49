"""Collectives: closed forms, NCCL's choices, rules and published numbers (named by source)."""

import json
import math
from dataclasses import astuple
from pathlib import Path

import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.catalog import links as link_catalog
from simulator.cli import main
from simulator.engine.fabric import Fabric
from simulator.inputs.config import load_topology
from simulator.machine.topology import Machine
from simulator.nccl import collectives, wire
from simulator.nccl import tuning as nt
from simulator.nccl.communicator import Communicator
from simulator.nccl.perf import time_alone
from simulator.units import GB, US, GiB, MiB


def machine_from(tmp_path: Path, name: str, text: str) -> Machine:
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    return Machine.from_config(load_topology(str(path)))


def preset(name: str) -> Machine:
    return Machine.from_config(load_topology(name))


SWITCH_P2P = """
name: four-on-a-switch
gpu: rtx4090
p2p: true
nodes:
  - {id: cpu0, kind: cpu}
  - {id: sw0, kind: pcie_switch}
  - {id: gpu0, kind: gpu}
  - {id: gpu1, kind: gpu}
  - {id: gpu2, kind: gpu}
  - {id: gpu3, kind: gpu}
links:
  - {a: cpu0, b: sw0, kind: pcie, gen: 4, lanes: 16}
  - {a: sw0, b: gpu0, kind: pcie, gen: 4, lanes: 16}
  - {a: sw0, b: gpu1, kind: pcie, gen: 4, lanes: 16}
  - {a: sw0, b: gpu2, kind: pcie, gen: 4, lanes: 16}
  - {a: sw0, b: gpu3, kind: pcie, gen: 4, lanes: 16}
"""


# --- closed forms --------------------------------------------------------------------------

def test_ring_allreduce_on_equal_links_matches_closed_form(tmp_path):
    m = machine_from(tmp_path, "sw", SWITCH_P2P)
    n, size = 4, GiB
    plan = collectives.plan(Communicator(m), "allreduce", size)
    assert (plan.algorithm, plan.protocol, plan.transport) == ("ring", "Simple", "P2P")
    # every GPU link carries one hop each way; Simple P2P runs at its calibrated PCIe
    # efficiency; each step crosses two PCIe links (GPU -> switch -> GPU) then syncs
    w = Communicator(m).wire
    bandwidth = link_catalog.pcie_bandwidth(4, 16) * wire.p2p_link_efficiency(w, 4)
    step = 2 * link_catalog.PCIE_HOP_LATENCY + w.p2p_simple_sync_us * US
    latency = w.call_latency_us * US + 2 * (n - 1) * step
    expected = 2 * (n - 1) / n * size / bandwidth + latency
    assert time_alone(Communicator(m), "allreduce", size).time_us * US == pytest.approx(expected,
                                                                                    rel=1e-6)


def test_allgather_moves_half_the_bytes_of_allreduce(tmp_path):
    m = machine_from(tmp_path, "sw", SWITCH_P2P)
    ar = time_alone(Communicator(m), "allreduce", GiB)
    ag = time_alone(Communicator(m), "allgather", GiB)
    assert ag.time_us == pytest.approx(ar.time_us / 2, rel=0.02)
    assert ag.busbw_gbps == pytest.approx(ar.busbw_gbps, rel=0.02)


def test_two_concurrent_allreduces_share_the_links(tmp_path):
    m = machine_from(tmp_path, "sw", SWITCH_P2P)
    plan = collectives.plan(Communicator(m), "allreduce", GiB)
    env = simpy.Environment()
    fabric = Fabric(env, Communicator(m).capacities())
    both = env.all_of([fabric.transfer(*astuple(plan.flow)) for _ in range(2)])
    env.run(both)
    alone = time_alone(Communicator(m), "allreduce", GiB).time_us * US
    assert env.now == pytest.approx(2 * alone - plan.latency, rel=0.01)


# --- NCCL's choices ------------------------------------------------------------------------

def test_nccl_latency_table_worked_examples():
    # domain-model 2.4 worked numbers: n = 8 NVLink LL 15.0 us, PCIe Simple 88.2 us
    nvl = nt.Graph(8, 12, 20.0, True, "hopper")
    pci = nt.Graph(8, 2, 12.0, False, "ampere")
    assert nt.latency_us(nvl, "allreduce", "ring", "LL") == pytest.approx(15.0)
    assert nt.latency_us(pci, "allreduce", "ring", "Simple") == pytest.approx(88.2)
    assert nt.latency_us(pci, "allgather", "ring", "Simple") == pytest.approx(48.3)


def test_protocol_crossover_small_ll_large_simple():
    graph = nt.Graph(8, 1, 20.0, False, "ampere")  # domain-model 2.4 worked example
    assert nt.choose(graph, "allreduce", 64 * 1024).protocol == "LL"
    assert nt.choose(graph, "allreduce", 100 * 10**6).protocol == "Simple"


def test_ll128_only_on_nvlink():
    assert nt.bus_bandwidth_gbps(nt.Graph(8, 4, 24.0, False, "ampere"), "allreduce", "ring",
                                 "LL128") == 0
    h200 = preset("8xh200-nvswitch")
    protocols = {collectives.plan(Communicator(h200), "allreduce", 2**k).protocol
                 for k in range(3, 34)}
    assert "LL128" in protocols
    pcie = preset("8x5090-switch-p2p")
    assert all(collectives.plan(Communicator(pcie), "allreduce", 2**k).protocol != "LL128"
               for k in range(3, 34, 2))


def test_small_messages_use_fewer_channels():
    h200 = preset("8xh200-nvswitch")
    assert collectives.plan(Communicator(h200), "allreduce", 8).n_channels == 1
    assert collectives.plan(Communicator(h200), "allreduce", GiB).n_channels > 8


# --- rules from the measurements -----------------------------------------------------------

PAIR_BEHIND_SWITCH = """
name: pair-switch
gpu: rtx4090
p2p: false
nodes:
  - {id: cpu0, kind: cpu, model: sapphire-rapids-upi}
  - {id: sw0, kind: pcie_switch}
  - {id: gpu0, kind: gpu}
  - {id: gpu1, kind: gpu}
links:
  - {a: cpu0, b: sw0, kind: pcie, gen: 4, lanes: 16}
  - {a: sw0, b: gpu0, kind: pcie, gen: 4, lanes: 16}
  - {a: sw0, b: gpu1, kind: pcie, gen: 4, lanes: 16}
"""
PAIR_ON_TWO_SOCKETS = """
name: pair-sockets
gpu: rtx4090
p2p: false
nodes:
  - {id: cpu0, kind: cpu, model: sapphire-rapids-upi}
  - {id: cpu1, kind: cpu, model: sapphire-rapids-upi}
  - {id: gpu0, kind: gpu}
  - {id: gpu1, kind: gpu}
links:
  - {a: cpu0, b: cpu1, kind: upi}
  - {a: cpu0, b: gpu0, kind: pcie, gen: 4, lanes: 16}
  - {a: cpu1, b: gpu1, kind: pcie, gen: 4, lanes: 16}
"""


def test_geforce_same_switch_slower_without_p2p(tmp_path):
    """Rule geforce-same-switch-slower-without-p2p (NVIDIA/nccl issue 1309)."""
    switch = time_alone(Communicator(machine_from(tmp_path, "a", PAIR_BEHIND_SWITCH)),
                                  "allreduce", GiB)
    sockets = time_alone(Communicator(machine_from(tmp_path, "b", PAIR_ON_TWO_SOCKETS)),
                                   "allreduce", GiB)
    assert switch.transport == sockets.transport == "SHM"
    assert switch.time_us > 1.2 * sockets.time_us
    assert switch.bottleneck_link in ("cpu0->sw0", "sw0->cpu0")


def test_p2p_on_is_faster_than_off_behind_a_switch():
    off = time_alone(Communicator(preset("8x5090-switch")), "allreduce", GiB)
    on = time_alone(Communicator(preset("8x5090-switch-p2p")), "allreduce", GiB)
    assert (off.transport, on.transport) == ("SHM", "P2P")
    assert on.time_us < off.time_us / 2


def test_8x5090_switch_bottleneck_is_uplink_or_host_memory():
    r = time_alone(Communicator(preset("8x5090-switch")), "allreduce", GiB)
    assert r.bottleneck_link in ("cpu0->sw0", "sw0->cpu0", "mem:cpu0")
    assert r.bottleneck_utilization > 0.9


def test_busbw_rises_with_size_and_plateaus():
    m = preset("2x2080ti-switch")
    busbw = [time_alone(Communicator(m), "allreduce", 2**k).busbw_gbps for k in range(3, 31)]
    assert all(b2 >= b1 * 0.999 for b1, b2 in zip(busbw, busbw[1:], strict=False))
    assert busbw[-1] == pytest.approx(busbw[-3], rel=0.01)
    assert busbw[-1] > 20 * busbw[7]


# --- published numbers (validation/measurements.yaml), tolerances named by source ----------

# 2x2080ti-gen3-switch-shm (Anthony-Hoo AutoDL test): nccl-tests all-reduce table
ANTHONY_HOO_2080TI = {  # bytes: busbw GB/s
    1024: 0.08, 8192: 0.63, 65536: 1.63, 262144: 3.05, 1048576: 3.75, 4194304: 3.94,
    16777216: 3.99, 67108864: 3.99, 268435456: 4.00, 1073741824: 4.00}


@pytest.mark.parametrize("size,measured", ANTHONY_HOO_2080TI.items())
def test_2x2080ti_allreduce_busbw(size, measured):
    r = time_alone(Communicator(preset("2x2080ti-switch")), "allreduce", size)
    tolerance = 0.10 if size >= MiB else 0.30
    assert r.busbw_gbps == pytest.approx(measured, rel=tolerance)
    assert r.transport == "SHM"


def test_2x2080ti_small_message_time():
    r = time_alone(Communicator(preset("2x2080ti-switch")), "allreduce", 8)
    assert r.time_us == pytest.approx(12.25, rel=0.30)  # Anthony-Hoo table, 8 bytes


@pytest.mark.parametrize("op,measured", [("allreduce", 367.2), ("allgather", 361.4),
                                         ("reducescatter", 362.9)])
def test_h200_ring_16g_stas00(op, measured):
    r = time_alone(Communicator(preset("8xh200-nvswitch")), op, 16 * GiB, algo="ring")
    assert r.busbw_gbps == pytest.approx(measured, rel=0.05)  # stas00 ml-engineering, NVLS off


@pytest.mark.parametrize("gpus,measured", [(4, 363.3), (6, 365.1)])
def test_h200_ring_fewer_gpus_stas00(gpus, measured):
    m = preset("8xh200-nvswitch").subset(gpus)
    r = time_alone(Communicator(m), "allreduce", 8 * GiB, algo="ring")
    assert r.busbw_gbps == pytest.approx(measured, rel=0.05)


def test_a100_nvswitch_nccl_tests_issue_175():
    r = time_alone(Communicator(preset("8xa100-nvswitch")), "allreduce", 4 * GiB)
    assert r.busbw_gbps == pytest.approx(232.5, rel=0.10)


# --- invariants ----------------------------------------------------------------------------

@settings(max_examples=25, deadline=None)
@given(st.sampled_from(collectives.OPS), st.integers(3, 33), st.integers(2, 8))
def test_collective_invariants(op, log_size, gpus):
    m = preset("8x5090-dual-socket").subset(gpus)
    size = 2**log_size
    r1 = time_alone(Communicator(m), op, size)
    assert r1 == time_alone(Communicator(m), op, size)  # deterministic
    plan = collectives.plan(Communicator(m), op, size)
    # never faster than its latency plus the bytes through its tightest link
    tightest = min(m.links[lid].capacity / w for lid, w in plan.usage)
    assert r1.time_us * US >= (plan.latency + plan.bus_bytes / min(tightest, plan.max_rate)) * (
        1 - 1e-6)
    # bytes are conserved: each link carries its weight times the progress
    env = simpy.Environment()
    fabric = Fabric(env, Communicator(m).capacities())
    env.run(fabric.transfer(*astuple(plan.flow)))
    carried = fabric.link_bytes
    for lid, weight in plan.usage:
        assert carried[lid] == pytest.approx(weight * plan.bus_bytes, rel=1e-6)


def test_more_bandwidth_is_never_slower(tmp_path):
    slow = machine_from(tmp_path, "slow", PAIR_ON_TWO_SOCKETS)
    fast = machine_from(tmp_path, "fast", PAIR_ON_TWO_SOCKETS.replace(
        "kind: upi}", "kind: upi, bandwidth_gb_per_s: 80}"))
    for size in (8, MiB, GiB):
        assert (time_alone(Communicator(fast), "allreduce", size).time_us
                <= time_alone(Communicator(slow), "allreduce", size).time_us * (1 + 1e-9))


def test_single_gpu_costs_only_the_call():
    r = time_alone(Communicator(preset("8xh200-nvswitch").subset(1)), "allreduce", GiB)
    assert r.busbw_gbps == 0 and 0 < r.time_us < 20


def test_tree_can_be_forced_for_allreduce_only():
    m = preset("8xh200-nvswitch")
    assert collectives.plan(Communicator(m), "allreduce", GiB, algo="tree").algorithm == "tree"
    assert math.isfinite(time_alone(Communicator(m), "allreduce", GiB, algo="tree").time_us)
    with pytest.raises(Exception, match="tree"):
        collectives.plan(Communicator(m), "allgather", GiB, algo="tree")


# --- CLI -----------------------------------------------------------------------------------

def test_cli_text_has_nccl_tests_columns_and_bottleneck(capsys):
    assert main(["collective", "-t", "8x5090-switch", "--op", "allreduce", "--bytes", "1G"]) == 0
    out = capsys.readouterr().out
    assert "busbw" in out and "algbw" in out and "out-of-place" in out
    assert "bottleneck" in out and "cpu0->sw0" in out


def test_cli_json_one_size_is_an_object_a_range_a_list(capsys):
    assert main(["collective", "-t", "2x2080ti-switch", "--op", "allgather", "--bytes", "64K",
                 "--json"]) == 0
    obj = json.loads(capsys.readouterr().out)
    for key in ("op", "bytes", "gpus", "time_us", "algbw_gbps", "busbw_gbps", "algorithm",
                "protocol", "transport", "bottleneck"):
        assert key in obj
    assert obj["bytes"] == 65536 and obj["bottleneck"]["link"]
    assert main(["collective", "-t", "8xh200-nvswitch", "--op", "broadcast", "-b", "1K", "-e",
                 "1M", "-f", "4", "--gpus", "4", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["bytes"] for r in rows] == [1024, 4096, 16384, 65536, 262144, 1048576]
    assert all(r["gpus"] == 4 for r in rows)


@pytest.mark.parametrize("argv", [
    ["--op", "alltoall", "--bytes", "1M"],
    ["--op", "allreduce", "--bytes", "12Q"],
    ["--op", "allreduce", "-b", "1M", "-e", "1K"],
    ["--op", "allreduce", "--bytes", "1M", "--gpus", "9"],
    ["--op", "allreduce", "--bytes", "1M", "--algo", "butterfly"],
])
def test_cli_bad_input_exits_2_with_one_line(argv, capsys):
    assert main(["collective", "-t", "8x5090-switch", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "error" in err


def test_cli_unknown_preset_lists_presets(capsys):
    assert main(["collective", "-t", "9x9999", "--op", "allreduce"]) == 2
    assert "8x5090-switch" in capsys.readouterr().err


def test_bandwidth_units_are_gb_per_s():
    r = time_alone(Communicator(preset("8xh200-nvswitch")), "allreduce", GiB)
    assert r.algbw_gbps == pytest.approx(GiB / (r.time_us * US) / GB)


def test_tree_ll_and_ll128_scale_the_capped_tree_bandwidth():
    """tuning.cc: Tree busBw = min(0.92*bw, nCh*perChMaxTreeBw) first; LL (/3.8) and LL128
    (x7/9 on one node) then scale that, not the raw nChannels*bw."""
    ampere = nt.Graph(8, 8, 20.0, True, "ampere")  # 160 GB/s raw: the 0.92 binds
    assert nt.bus_bandwidth_gbps(ampere, "allreduce", "tree", "Simple") == pytest.approx(147.2)
    assert nt.bus_bandwidth_gbps(ampere, "allreduce", "tree", "LL") == pytest.approx(147.2 / 3.8)
    assert nt.bus_bandwidth_gbps(ampere, "allreduce", "tree", "LL128") == pytest.approx(
        147.2 * 7 / 9)
    hopper = nt.Graph(8, 16, 45.0, True, "hopper")  # 720 raw: the 16 x 38.7 cap binds
    assert nt.bus_bandwidth_gbps(hopper, "allreduce", "tree", "LL128") == pytest.approx(
        16 * 38.7 * 7 / 9)


def test_single_node_tree_has_no_plain_tree_penalty():
    """A single node's tree graph is BALANCED_TREE, so tuning.cc's x0.85 does not apply."""
    graph = nt.Graph(8, 2, 12.0, False, "ampere")
    assert nt.bus_bandwidth_gbps(graph, "allreduce", "tree", "Simple") == pytest.approx(
        0.92 * 24.0)
