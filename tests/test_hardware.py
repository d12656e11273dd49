"""GPU catalog, GPUs a topology defines (a catalog entry with overrides), and power limits."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from simulator.catalog import gpus as gpu_catalog
from simulator.catalog import power
from simulator.errors import InputError
from simulator.inputs.config import load_topology
from simulator.inputs.schema import GpuSpec
from simulator.job import compute
from simulator.job.kernels import gemm, memory
from simulator.machine.cards import resolve_gpu
from simulator.machine.topology import Machine
from simulator.units import GB, GiB


@pytest.mark.parametrize("name", ["l40s", "rtx6000-ada", "rtx-pro-6000", "rtx-a6000",
                                  "h100-nvl", "b200"])
def test_new_catalog_gpus_have_sources_and_power_limits(name: str) -> None:
    g = gpu_catalog.gpu(name)
    assert "datasheet" in g.source or "brief" in g.source
    assert g.tdp_w > 0 and g.memory_bytes > 32 * GiB and g.matmul_flops > 100e12


# (name, memory GiB, dense 16-bit TFLOPS, FP32 TFLOPS, board W, NVLink links): the datasheets
@pytest.mark.parametrize("name, gib, tflops, fp32, watts, nvlinks", [
    ("a40", 48, 149.7, 37.4, 300, 4), ("rtx-a5000", 24, 111.1, 27.8, 230, 4),
    ("rtx-a4000", 16, 76.7, 19.2, 140, 0), ("l4", 24, 121, 30.3, 72, 0),
    ("h100-pcie", 80, 756, 51, 350, 12), ("a100-sxm4-40gb", 40, 312, 19.5, 400, 12),
    ("a100-pcie-40gb", 40, 312, 19.5, 250, 12)])
def test_pro_and_inference_cards_as_their_datasheets(name, gib, tflops, fp32, watts, nvlinks):
    g = gpu_catalog.gpu(name)
    assert (g.memory_bytes, g.tdp_w, g.nvlink_links) == (gib * GiB, watts, nvlinks)
    assert g.matmul_flops == pytest.approx(tflops * 1e12)
    assert g.fp32_flops == pytest.approx(fp32 * 1e12)
    assert "datasheet" in g.source


@pytest.mark.parametrize("device, catalog, gib", [
    ("NVIDIA GeForce RTX 4090", "rtx4090", None), ("NVIDIA A40", "a40", None),
    ("NVIDIA GeForce RTX 3090 Ti", "rtx3090ti", None), ("NVIDIA GeForce RTX 3090", "rtx3090", None),
    ("NVIDIA A100-SXM4-40GB", "a100-sxm4-40gb", None),
    ("NVIDIA A100-PCIE-40GB", "a100-pcie-40gb", None),
    ("NVIDIA H100 80GB HBM3", "h100-sxm", None), ("Tesla V100-SXM2-16GB", "v100-sxm2", 16),
    ("NVIDIA L4", "l4", None), ("NVIDIA L40S", "l40s", None),
    ("Tesla V100-SXM2-32GB", "v100-sxm2", None),
    ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "rtx-pro-6000", None)])
def test_device_names_as_cuda_prints_them(device, catalog, gib):
    assert gpu_catalog.from_device_name(device) == (catalog, gib)
    assert gpu_catalog.from_device_name("NVIDIA Quadro K600") is None


def test_every_catalog_gpu_has_a_default_power_limit() -> None:
    assert all(g.tdp_w > 0 for g in gpu_catalog.GPUS.values())


def test_a_name_and_a_bare_mapping_are_the_same_card() -> None:
    assert resolve_gpu(GpuSpec.from_data("h100-sxm")) == gpu_catalog.gpu("h100-sxm")
    assert resolve_gpu(GpuSpec(base="h100-sxm")) == gpu_catalog.gpu("h100-sxm")
    assert resolve_gpu("h100-sxm") == gpu_catalog.gpu("h100-sxm")


def test_overrides_replace_only_their_numbers() -> None:
    base = gpu_catalog.gpu("h100-sxm")
    spec = GpuSpec(base="h100-sxm", memory_gib=96, memory_bandwidth_gb_per_s=2400,
                   power_limit_w=500, sms=128)
    g = resolve_gpu(spec)
    assert g.memory_bytes == 96 * GiB and g.memory_bandwidth == 2400 * GB
    assert g.power_limit == 500 and g.tdp_w == base.tdp_w and g.sms == 128
    assert g.matmul_flops == base.matmul_flops and g.plain_matmul_flops == base.plain_matmul_flops
    assert g.name.startswith("h100-sxm (") and "power_limit_w 500" in g.name


def test_spec_peak_alone_keeps_the_achieved_share_and_matmul_sets_the_rate() -> None:
    base = gpu_catalog.gpu("rtx4090")
    half = resolve_gpu(GpuSpec(base="rtx4090", bf16_tflops=base.matmul_flops / 2e12))
    assert compute.matmul_rate(half) == pytest.approx(compute.matmul_rate(base) / 2)
    set_rate = resolve_gpu(GpuSpec(base="rtx4090", matmul_tflops=100))
    assert compute.matmul_rate(set_rate) == pytest.approx(100e12)


def _topology(tmp_path: Path, gpu: str) -> Path:
    path = tmp_path / "t.yaml"
    path.write_text(f"name: t\ngpu: {gpu}\nnodes:\n  - {{id: sw, kind: nvswitch}}\n"
                    "  - {id: g0, kind: gpu}\n  - {id: g1, kind: gpu}\n"
                    "links:\n  - {a: g0, b: sw, kind: nvlink}\n  - {a: g1, b: sw, kind: nvlink}\n")
    return path


def test_topology_gpu_mapping_reaches_the_machine(tmp_path: Path) -> None:
    path = _topology(tmp_path, "{base: h100-sxm, memory_gib: 96, memory_bandwidth_gb_per_s: "
                               "2400, power_limit_w: 500}")
    m = Machine.from_config(load_topology(str(path)))
    assert m.gpu.memory_bytes == 96 * GiB and m.gpu.power_limit == 500
    assert m.gpu.nvlink_links == 18  # the base card's NVLink count still sizes the links


@pytest.mark.parametrize(("gpu", "key", "says"), [
    ("{base: h100-sxm, memory_gb: 96}", "gpu.memory_gb", "unknown key"),
    ("{base: h101, sms: 100}", "gpu.base", "unknown 'h101'"),
    ("h101", "gpu", "unknown 'h101'"),
    ("{memory_gib: 96}", "gpu.base", "required"),
    ("{base: h100-sxm, power_limit_w: -5}", "gpu.power_limit_w", "greater than 0"),
])
def test_bad_gpu_specs_name_the_key(tmp_path: Path, gpu: str, key: str, says: str) -> None:
    path = _topology(tmp_path, gpu)
    with pytest.raises(InputError) as err:
        load_topology(str(path))
    assert err.value.key == key and says in str(err.value) and err.value.line == 2


def test_power_limit_at_or_above_the_default_changes_nothing() -> None:
    h100 = gpu_catalog.gpu("h100-sxm")
    for limit in (700, 800):
        g = resolve_gpu(GpuSpec(base="h100-sxm", power_limit_w=limit))
        assert power.clock_share(g) == 1.0
        assert compute.matmul_rate(g) == compute.matmul_rate(h100)


def test_power_limit_follows_the_cubic_dvfs_model() -> None:
    g = resolve_gpu(GpuSpec(base="h100-sxm", power_limit_w=500))
    static = power.STATIC_SHARE * 700
    assert power.clock_share(g) == pytest.approx(((500 - static) / (700 - static)) ** (1 / 3))
    assert 0.8 < power.clock_share(g) < 0.9


@given(st.floats(50, 1200), st.floats(50, 1200))
def test_a_lower_power_limit_is_never_faster(a: float, b: float) -> None:
    low, high = sorted((a, b))
    slow = resolve_gpu(GpuSpec(base="h100-sxm", power_limit_w=low))
    fast = resolve_gpu(GpuSpec(base="h100-sxm", power_limit_w=high))
    for kernel in (gemm(8192, 4096, 4096, 2), memory(1e9),
                   compute.Kernel("attention_fwd", 1e13, 1e8)):
        assert compute.kernel_time(kernel, slow) >= compute.kernel_time(kernel, fast)


def test_memory_bound_kernels_keep_their_bandwidth_under_a_power_limit() -> None:
    capped = resolve_gpu(GpuSpec(base="h100-sxm", power_limit_w=400))
    k = memory(1e9)
    assert compute.kernel_time(k, capped) == compute.kernel_time(k, gpu_catalog.gpu("h100-sxm"))


def test_a_40gb_a100_streams_its_own_hbm2_not_the_80gb_cards() -> None:
    """The 40GB A100s differ from the 80GB ones in memory only: 1,555 GB/s of HBM2 against
    2,039 (SXM) and 1,935 (PCIe), as the A100 datasheet gives them; the tensor peak is one."""
    for small, large in (("a100-sxm4-40gb", "a100-sxm4-80gb"),
                         ("a100-pcie-40gb", "a100-pcie-80gb")):
        a, b = gpu_catalog.gpu(small), gpu_catalog.gpu(large)
        assert a.memory_bandwidth == pytest.approx(1555e9)
        assert a.memory_bandwidth < 0.81 * b.memory_bandwidth
        assert (a.matmul_flops, a.sms, a.arch) == (b.matmul_flops, b.sms, b.arch)
