"""The CPU catalog: families by vendor, their socket links and memory, and how nodes name them."""

from __future__ import annotations

import pytest

from simulator.catalog import cpus
from simulator.catalog import links as link_catalog
from simulator.inputs.config import load_topology, resolve
from simulator.machine.topology import Machine
from simulator.nccl.communicator import Communicator
from simulator.units import GB


def test_every_family_has_a_socket_link_a_vendor_and_a_source():
    for cpu in cpus.CPUS.values():
        assert cpu.socket_link in link_catalog.SOCKET_LINKS
        assert cpu.name.startswith(cpu.vendor + "-")  # what Machine reads the vendor from
        assert "product pages" in cpu.source or "ark" in cpu.source


def test_memory_is_eighty_percent_of_the_channels_peak():
    turin = cpus.cpu("amd-epyc-9005")  # 12 x DDR5-6400 = 614.4 GB/s peak
    assert turin.memory_gb_per_s == pytest.approx(0.8 * 614.4)
    spr = cpus.cpu("intel-xeon-sapphire-rapids")  # 8 x DDR5-4800: the old 250 GB/s default
    assert spr.memory_bandwidth == pytest.approx(link_catalog.DEFAULT_HOST_MEMORY_BANDWIDTH,
                                                 rel=0.02)


@pytest.mark.parametrize("vendor, family, model, name", [
    ("AuthenticAMD", 0x1A, 0x02, "amd-epyc-9005"), ("AuthenticAMD", 0x19, 0x11, "amd-epyc-9004"),
    ("AuthenticAMD", 0x19, 0x01, "amd-epyc-7003"), ("AuthenticAMD", 0x17, 0x31, "amd-epyc-7002"),
    ("GenuineIntel", 6, 0x8F, "intel-xeon-sapphire-rapids"),
    ("GenuineIntel", 6, 0x55, "intel-xeon-cascade-lake"), ("GenuineIntel", 6, 0x01, None)])
def test_cpuid_to_family(vendor, family, model, name):
    got = cpus.from_cpuid(vendor, family, model)
    assert (got.name if got else None) == name


def test_a_node_may_name_its_family_and_nccl_sees_its_vendor(tmp_path):
    text = resolve("8x5090-dual-socket", "topologies").read_text()
    path = tmp_path / "amd.yaml"
    path.write_text(text.replace("model: sapphire-rapids-upi", "model: amd-epyc-9005"))
    m = Machine.from_config(load_topology(str(path)))
    assert not m.is_intel_cpu("cpu0")
    upi = next(lk for lk in m.links.values() if lk.kind in ("upi", "xgmi"))
    assert upi.capacity == link_catalog.SOCKET_LINKS["amd-xgmi"].bandwidth
    # NCCL believes AMD's 16 GB/s: over two sockets at sm120 its search falls back
    assert Communicator(m).ring().fallback
    assert m.graph.edges[upi.src, upi.dst]["nccl_bandwidth"] == 16 * GB


def test_an_unknown_cpu_is_one_line_naming_both_catalogs(tmp_path):
    text = resolve("2x5090", "topologies").read_text()
    path = tmp_path / "bad.yaml"
    path.write_text(text.replace("model: sapphire-rapids-upi", "model: amd-epyc-9999"))
    with pytest.raises(Exception, match=r"model: unknown 'amd-epyc-9999'.*amd-epyc-9005"):
        load_topology(str(path))
