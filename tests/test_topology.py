"""Machine: path types, transports, routes and rings as NCCL decides them (domain-model 2.5-2.6)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.catalog import links as link_catalog
from simulator.inputs.config import load_topology, preset_names
from simulator.machine.topology import Machine
from simulator.nccl.communicator import Communicator
from simulator.nccl.env import NcclEnv
from simulator.units import GB, US

MACHINES: dict[str, Machine] = {}


def machine(name: str) -> Machine:
    if name not in MACHINES:
        MACHINES[name] = Machine.from_config(load_topology(name))
    return MACHINES[name]


def pairs(n: int) -> list[tuple[int, int]]:
    return [(i, j) for i in range(n) for j in range(n) if i != j]


def test_gpus_behind_one_switch_without_p2p_are_pix_and_shm() -> None:
    m = machine("8x5090-switch")
    assert m.n_gpus == 8
    assert {m.path_type(i, j) for i, j in pairs(8)} == {"PIX"}
    assert {Communicator(m).transport(i, j) for i, j in pairs(8)} == {"SHM"}


def test_p2p_driver_behind_one_switch_turns_around_in_the_switch() -> None:
    m = machine("8x5090-switch-p2p")
    assert {Communicator(m).transport(i, j) for i, j in pairs(8)} == {"P2P"}
    assert Communicator(m).route(0, 1) == (("gpu0->sw0", 1.0), ("sw0->gpu1", 1.0))


def test_shm_behind_one_switch_crosses_the_uplink_up_and_down_and_host_memory_twice() -> None:
    route = dict(Communicator(machine("8x5090-switch")).route(2, 5))
    assert route == {"gpu2->sw0": 1.0, "sw0->cpu0": 1.0, "mem:cpu0": 2.0, "cpu0->sw0": 1.0,
                     "sw0->gpu5": 1.0}


def test_dual_socket_pairs_are_phb_within_and_sys_across_sockets() -> None:
    m = machine("8x5090-dual-socket")
    for i, j in pairs(8):
        same_socket = (i < 4) == (j < 4)
        assert m.path_type(i, j) == ("PHB" if same_socket else "SYS")
        assert Communicator(m).transport(i, j) == "SHM"


def test_cross_socket_shm_stages_in_the_receivers_memory_across_upi() -> None:
    comm = Communicator(machine("8x5090-dual-socket"))
    assert comm.route(1, 6) == (("gpu1->cpu0", 1.0), ("cpu0->cpu1", 1.0), ("mem:cpu1", 2.0),
                                ("cpu1->gpu6", 1.0))
    assert comm.route(6, 1) == (("gpu6->cpu1", 1.0), ("cpu1->cpu0", 1.0), ("mem:cpu0", 2.0),
                                ("cpu0->gpu1", 1.0))


@pytest.mark.parametrize("name", ["8xa100-nvswitch", "8xh100-nvswitch", "8xh200-nvswitch"])
def test_nvswitch_pairs_are_nvl_and_p2p_over_nvlink(name: str) -> None:
    m = machine(name)
    assert {m.path_type(i, j) for i, j in pairs(8)} == {"NVL"}
    assert {Communicator(m).transport(i, j) for i, j in pairs(8)} == {"P2P"}
    assert Communicator(m).route(3, 7) == (("gpu3->nvs", 1.0), ("nvs->gpu7", 1.0))
    per_link = link_catalog.NVLINK_PER_LINK[m.gpu.arch]
    assert m.links["gpu3->nvs"].capacity == pytest.approx(per_link * m.gpu.nvlink_links)


def test_nvlink_bridge_is_p2p_even_without_pcie_p2p_and_disable_makes_it_shm() -> None:
    bridged = machine("2x3090ti-nvlink")
    assert bridged.path_type(0, 1) == "NVL" and Communicator(bridged).transport(0, 1) == "P2P"
    assert Communicator(bridged).route(0, 1) == (("gpu0->gpu1", 1.0),)
    assert bridged.links["gpu0->gpu1"].capacity == pytest.approx(4 * 14.0625 * GB)
    disabled = machine("2x3090ti-pcie")
    assert Communicator(disabled).transport(0, 1) == "SHM"
    assert disabled.links["gpu0->cpu0"].capacity == pytest.approx(link_catalog.pcie_bandwidth(4, 8))


def _with(name: str, **update: object) -> Machine:
    return Machine.from_config(load_topology(name).copy(**update))


def test_p2p_level_decides_like_nccl_p2p_level() -> None:
    # paths.cc: P2P only where the path type is at most NCCL_P2P_LEVEL (default PXB)
    assert Communicator(_with("8x5090-dual-socket", p2p=True)).transport(0, 1) == "SHM"  # PHB > PXB
    phb = Communicator(_with("8x5090-dual-socket", p2p=True, p2p_level="PHB"))
    assert phb.transport(0, 1) == "P2P"
    assert phb.transport(0, 5) == "SHM"
    sys_level = Communicator(_with("8x5090-dual-socket", p2p=True, p2p_level="SYS"))
    assert sys_level.transport(0, 5) == "P2P"
    assert Communicator(_with("8x5090-switch-p2p", p2p_level="LOC")).transport(0, 1) == "SHM"
    # NVLink always
    assert Communicator(_with("8xh100-nvswitch", p2p=False)).transport(0, 1) == "P2P"


def ring_hops(m: Machine, order: tuple[int, ...]) -> list[str]:
    links: list[str] = []
    for pos, src in enumerate(order):
        links += [lid for lid, _ in Communicator(m).route(src, order[(pos + 1) % len(order)])]
    return links


@pytest.mark.parametrize("name", ["8x5090-dual-socket", "8x4090-dual-socket"])
def test_dual_socket_ring_crosses_upi_once_each_way(name: str) -> None:
    m = machine(name)
    for ranks in (None, (0, 4, 1, 5, 2, 6, 3, 7), (7, 6, 5, 4, 3, 2, 1, 0)):
        ring = Communicator(m).ring(ranks)
        assert sorted(ring.order) == list(range(8))
        hops = ring_hops(m, ring.order)
        assert hops.count("cpu0->cpu1") == 1 and hops.count("cpu1->cpu0") == 1


def test_ring_over_two_switches_leaves_each_switch_once() -> None:
    m = machine("8xh100-nvswitch").subset(8)
    scrambled = (0, 2, 4, 6, 1, 3, 5, 7)
    order = Communicator(m).ring(scrambled).order
    switch_of = [r // 2 for r in order]
    changes = sum(switch_of[k] != switch_of[(k + 1) % 8] for k in range(8))
    assert changes == 4  # one entry and one exit per switch


def test_ring_channels_follow_nccl_search() -> None:
    # H100: NVLink 18 x 20.6 = 370.8 GB/s (topo.h); sm90 table: 6 channels at 60 fit, then
    # ncclTopoDupChannels doubles to 12 x 30. A100: 12 x 20 = 240 fits 6 x 40 = 240 (perfect),
    # doubled to 12 x 20 (sm80 is not > 80, so no exception).
    h100 = Communicator(machine("8xh100-nvswitch")).ring()
    assert (h100.n_channels, h100.channel_bandwidth) == (12, 30 * GB)
    a100 = Communicator(machine("8xa100-nvswitch")).ring()
    assert (a100.n_channels, a100.channel_bandwidth) == (12, 20 * GB)
    # P2P through a Gen5 switch: every GPU link is 48 GB/s to NCCL; 2 x 24 fills it.
    p2p = Communicator(machine("8x5090-switch-p2p")).ring()
    assert (p2p.n_channels, p2p.channel_bandwidth) == (2, 24 * GB)
    # SHM through one uplink: 8 hops x 1.2 (Intel PHB) per channel; even 18 GB/s (the
    # lowest sm100 speed) needs 173 GB/s of a 48 GB/s link: NCCL falls back to 0.1 GB/s.
    shm = Communicator(machine("8x5090-switch")).ring()
    assert shm.fallback and shm.n_channels == 1 and shm.channel_bandwidth == 0.1 * GB
    # Dual socket: the UPI (22 GB/s, SRP_QPI_BW) allows one channel at 20.
    dual = Communicator(machine("8x5090-dual-socket")).ring()
    assert (dual.n_channels, dual.channel_bandwidth) == (1, 20 * GB)
    assert dual.bottleneck in ("cpu0->cpu1", "cpu1->cpu0")
    assert dual.nccl_bus_bandwidth == dual.n_channels * dual.channel_bandwidth


def test_intel_overhead_applies_only_through_an_intel_cpu() -> None:
    # 2x 5090 on one Sapphire Rapids socket, SHM (PHB): x1.2 on PCIe, so 40 not 48 GB/s fit
    intel = Communicator(machine("2x5090")).ring()
    assert intel.nccl_bus_bandwidth == pytest.approx(40 * GB)
    amd = Communicator(_with("2x5090", nodes=[n.copy(model="amd-xgmi")
                                 if n.kind == "cpu" else n
                                 for n in load_topology("2x5090").nodes])).ring()
    assert amd.nccl_bus_bandwidth > intel.nccl_bus_bandwidth


def test_subset_keeps_the_first_gpus_and_their_paths() -> None:
    full = machine("8x5090-dual-socket")
    four = full.subset(4)
    assert four.n_gpus == 4 and four.gpu_nodes == full.gpu_nodes[:4]
    assert not any("gpu5" in lid for lid in four.links)
    assert "cpu0->cpu1" in four.links  # same links, other GPUs dropped
    assert four.path_type(0, 3) == full.path_type(0, 3)
    assert full.subset(8) is full
    with pytest.raises(Exception, match="has 8 GPUs"):
        full.subset(9)


def test_capacities_and_latencies_come_from_the_catalog_unless_overridden(tmp_path: Path) -> None:
    m = machine("8x5090-dual-socket")
    assert m.links["cpu0->gpu0"].capacity == pytest.approx(link_catalog.pcie_bandwidth(5, 16))
    assert m.links["cpu0->cpu1"].capacity == pytest.approx(
        link_catalog.SOCKET_LINKS["sapphire-rapids-upi"].bandwidth)
    assert m.links["mem:cpu1"].capacity == pytest.approx(250 * GB)
    assert Communicator(m).route_latency(1, 6) == pytest.approx(
        2 * link_catalog.PCIE_HOP_LATENCY
        + link_catalog.SOCKET_LINKS["sapphire-rapids-upi"].latency)
    path = tmp_path / "override.yaml"
    path.write_text(
        "name: o\ngpu: rtx4090\nnodes:\n  - {id: c, kind: cpu}\n  - {id: g0, kind: gpu}\n"
        "  - {id: g1, kind: gpu}\nlinks:\n"
        "  - {a: c, b: g0, kind: pcie, bandwidth_gb_per_s: 10, latency_us: 3}\n"
        "  - {a: c, b: g1, kind: pcie}\n")
    o = Machine.from_config(load_topology(str(path)))
    assert o.links["g0->c"].capacity == pytest.approx(10 * GB)
    assert o.links["g0->c"].latency == pytest.approx(3 * US)
    assert o.links["c->g1"].capacity == pytest.approx(link_catalog.pcie_bandwidth(4, 16))  # gpu gen
    assert o.links["mem:c"].capacity == link_catalog.DEFAULT_HOST_MEMORY_BANDWIDTH
    assert Communicator(o).bottleneck_bandwidth(0, 1) == pytest.approx(10 * GB)


DESIGN_YAML = """\
name: 8x5090-dual-socket
description: 4 GPUs on each socket's root ports, PCIe Gen5 x16, stock driver
gpu: rtx5090                  # catalog name
p2p: false                    # PCIe peer-to-peer available (GeForce stock driver: false)
nodes:                        # GPUs are ranked in the order they appear
  - {id: cpu0, kind: cpu, memory_bandwidth_gb_per_s: 250}
  - {id: cpu1, kind: cpu, memory_bandwidth_gb_per_s: 250}
  - {id: gpu0, kind: gpu}
  - {id: gpu1, kind: gpu}
  - {id: gpu2, kind: gpu}
  - {id: sw0, kind: pcie_switch}
links:                        # bandwidth_gb_per_s is per direction; optional where kind implies it
  - {a: cpu0, b: cpu1, kind: upi, bandwidth_gb_per_s: 22, latency_us: 0.5}
  - {a: cpu0, b: gpu0, kind: pcie, gen: 5, lanes: 16}
  - {a: gpu0, b: gpu1, kind: nvlink, count: 4}
  - {a: cpu1, b: sw0, kind: pcie, gen: 5, lanes: 16}
  - {a: sw0, b: gpu1, kind: pcie, gen: 5, lanes: 16}
  - {a: sw0, b: gpu2, kind: pcie, gen: 5, lanes: 16}
"""


def test_design_md_explicit_form_loads(tmp_path: Path) -> None:
    path = tmp_path / "explicit.yaml"
    path.write_text(DESIGN_YAML)
    m = Machine.from_config(load_topology(str(path)))
    assert m.n_gpus == 3 and m.name == "8x5090-dual-socket"
    assert m.path_type(0, 1) == "NVL" and Communicator(m).transport(0, 1) == "P2P"
    assert m.path_type(1, 2) == "PIX" and Communicator(m).transport(1, 2) == "SHM"
    assert m.path_type(0, 2) == "SYS"
    assert m.links["cpu0->cpu1"].latency == pytest.approx(0.5 * US)
    nvlink = 4 * link_catalog.NVLINK_PER_LINK["blackwell"]
    assert m.links["gpu0->gpu1"].capacity == pytest.approx(nvlink)
    assert m.local_cpu(1) == "cpu1"


NAMES = preset_names("topologies")


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(NAMES), data=st.data())
def test_routes_are_consistent_for_any_pair(name: str, data: st.DataObject) -> None:
    m = machine(name)
    if m.n_gpus < 2:
        return
    i, j = data.draw(st.sampled_from(pairs(m.n_gpus)))
    route = Communicator(m).route(i, j)
    ids = [lid for lid, _ in route]
    assert len(set(ids)) == len(ids) and all(w > 0 for _, w in route)
    assert all(lid in m.links for lid in ids)
    assert m.links[ids[0]].src == m.gpu_nodes[i] and m.links[ids[-1]].dst == m.gpu_nodes[j]
    mem = [(lid, w) for lid, w in route if lid.startswith("mem:")]
    transport = Communicator(m).transport(i, j)
    if transport == "SHM":
        assert mem == [(f"mem:{m.local_cpu(j)}", 2.0)]
    elif transport.startswith("NET/"):  # between boxes: staged on both ends, or not at all
        assert {lid for lid, _ in mem} <= {f"mem:{m.local_cpu(i)}", f"mem:{m.local_cpu(j)}"}
    else:
        assert mem == []
    comm = Communicator(m)
    assert 0 < comm.bottleneck_bandwidth(i, j) <= min(m.links[lid].capacity for lid in ids)
    assert comm.route_latency(i, j) == pytest.approx(sum(m.links[lid].latency for lid in ids))
    assert m.path_type(i, j) == m.path_type(j, i)


@settings(max_examples=30, deadline=None)
@given(name=st.sampled_from(NAMES), data=st.data())
def test_ring_is_a_permutation_with_positive_channels(name: str, data: st.DataObject) -> None:
    m = machine(name)
    ranks = data.draw(st.permutations(range(m.n_gpus)))
    k = data.draw(st.integers(min_value=1, max_value=m.n_gpus))
    ring = Communicator(m).ring(tuple(ranks[:k]))
    assert sorted(ring.order) == sorted(ranks[:k])
    assert 1 <= ring.n_channels <= 32 and ring.channel_bandwidth > 0


def test_dgx1_ring_stays_on_nvlink_where_a_cycle_exists() -> None:
    # DGX-1 hybrid cube mesh (validation/topologies/dgx1-v100.yaml): socket grouping alone
    # would cross QPI between the quads; an all-NVLink cycle exists and NCCL takes it
    m = Machine.from_config(load_topology(
        str(Path(__file__).resolve().parent.parent / "validation/topologies/dgx1-v100.yaml")))
    for n in (3, 4, 8):
        ring = Communicator(m.subset(n)).ring()
        assert sorted(ring.order) == list(range(n))
        hops = [m.path_type(a, ring.order[(k + 1) % n]) for k, a in enumerate(ring.order)]
        assert hops == ["NVL"] * n, (ring.order, hops)
    # at 8 GPUs a cycle of double links exists (0-3-2-1-5-6-7-4): the thinnest hop has 2 links
    order = Communicator(m).ring().order
    widths = [m.graph.get_edge_data(m.gpu_nodes[a], m.gpu_nodes[order[(k + 1) % 8]])["capacity"]
              for k, a in enumerate(order)]
    assert min(widths) == 2 * link_catalog.NVLINK_PER_LINK["volta"]


def test_links_are_described_in_words() -> None:
    m = machine("8x5090-switch")
    assert m.describe("cpu0->sw0") == "the uplink of PCIe switch sw0, down"
    assert m.describe("sw0->cpu0") == "the uplink of PCIe switch sw0, up"
    assert m.describe("gpu3->sw0") == "gpu3's own PCIe link, up"
    assert m.describe("mem:cpu0").startswith("host memory of cpu0")
    assert machine("8x5090-dual-socket").describe("cpu0->cpu1").startswith("the socket link")


@pytest.mark.parametrize("env", [{}, {"NCCL_SHM_DISABLE": "1"}, {"NCCL_P2P_LEVEL": "SYS"}])
def test_a_row_of_pairs_is_each_pair_alone(env: dict[str, str]) -> None:
    """`stepsim topo` reads every pair a row at a time; each row equals the pairs asked one by
    one (path type, and the bottleneck of a lone transfer's route)."""
    for name in preset_names("topologies"):
        comm = Communicator(machine(name), NcclEnv.from_environ(env))
        m = comm.machine
        for i in range(m.n_gpus):
            assert m.path_type_row(i) == [m.path_type(i, j) for j in range(m.n_gpus)]
            assert comm.bottleneck_row(i) == [comm.bottleneck_bandwidth(i, j)
                                              for j in range(m.n_gpus)]


def test_topo_counts_the_pairs_of_a_large_machine(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """Above 16 GPUs the text counts pairs by kind (the matrices are in --json)."""
    import importlib.util
    import json

    from simulator.cli import main

    spec = importlib.util.spec_from_file_location("boxes", Path(__file__).resolve().parent.parent
                                                  / "scripts" / "boxes.py")
    assert spec is not None and spec.loader is not None
    boxes = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(boxes)
    path = tmp_path / "tree.yaml"
    path.write_text(boxes.pcie_tree(32))
    assert main(["topo", "-t", str(path)]) == 0
    text = capsys.readouterr().out
    counts = [int(line.split()[-1].replace(",", "")) for line in text.splitlines()
              if line.strip().startswith(("PIX", "PXB", "PHB", "SYS", "NVL"))]
    assert sum(counts) == 32 * 31 and "... (24 more)" in text
    assert main(["topo", "-t", str(path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert len(report["bottleneck_gbps"]) == 32 and len(report["bottleneck_gbps"][0]) == 32
