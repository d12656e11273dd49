"""`stepsim topo import`: every real `nvidia-smi topo -m` and NCCL XML fixture imports, and the
imported machine has the matrix's path types (NODE is NCCL's PHB, NV# is NVL)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from simulator.cli import main
from simulator.errors import InputError
from simulator.inputs import nvidia_smi, topo_import
from simulator.inputs.config import load_topology
from simulator.machine.topology import Machine

REAL = Path(__file__).parent / "fixtures" / "real-inputs"
MADE = Path(__file__).parent / "fixtures" / "made"
# fixture -> the catalog GPU of the card in it (A100 40GB: the 80 GB entry)
MATRICES = {"A1": "rtx4090", "A12": "a100-sxm4-80gb", "A13": "h100-sxm", "A16": "a40",
            "A17": "rtx2080ti", "A3": "rtx5090", "A6": "rtx-pro-6000", "A9": "rtx-a6000"}
NCCL_NAME = {"X": "LOC", "NODE": "PHB"}


def _import(tmp_path: Path, source: Path, gpu: str, *extra: str) -> Machine:
    out = tmp_path / f"{source.stem}.yaml"
    assert main(["topo", "import", str(source), "--gpu", gpu, "-o", str(out), *extra]) == 0
    return Machine.from_config(load_topology(str(out)))


@pytest.mark.parametrize("name", sorted(MATRICES))
def test_imported_machine_has_the_matrix_path_types(tmp_path, name):
    source = REAL / f"{name}.topo.txt"
    matrix = nvidia_smi.parse(source.read_text(), str(source))
    machine = _import(tmp_path, source, MATRICES[name])
    assert machine.n_gpus == len(matrix.gpus)
    for i, a in enumerate(matrix.gpus):
        for j, b in enumerate(matrix.gpus):
            cell = matrix.relation[(a, b)]
            want = "NVL" if cell.startswith("NV") else NCCL_NAME.get(cell, cell)
            assert machine.path_type(i, j) == want, (a, b)


def test_sockets_come_from_numa_affinity(tmp_path):
    machine = _import(tmp_path, REAL / "A6.topo.txt", "rtx5090")
    assert [machine.local_cpu(r) for r in range(8)] == ["cpu0"] * 4 + ["cpu1"] * 4
    switches = [n.id for n in machine.config.nodes if n.kind == "pcie_switch"]
    assert len(switches) == 4  # two PIX pairs per socket


def test_nvswitch_when_nv_count_exceeds_the_cards_links(tmp_path):
    machine = _import(tmp_path, REAL / "A13.topo.txt", "h100-sxm")
    nvlinks = [lc for lc in machine.config.links if lc.kind == "nvlink"]
    assert {lc.b for lc in nvlinks} == {"nvs0"} and {lc.count for lc in nvlinks} == {18}
    nics = [n.id for n in machine.config.nodes if n.kind == "nic"]
    assert nics == [f"mlx5_{k}" for k in range(8)]  # named by the NIC legend


def test_an_nvlink_bridge_is_a_direct_link(tmp_path):
    machine = _import(tmp_path, REAL / "A9.topo.txt", "rtx-a6000")
    (bridge,) = [lc for lc in machine.config.links if lc.kind == "nvlink"]
    assert (bridge.a, bridge.b, bridge.count, bridge.model) == ("gpu0", "gpu1", 4, "ampere-ga102")


def test_p2p_follows_the_topo_p2p_block(tmp_path):
    out = tmp_path / "a17.yaml"
    assert main(["topo", "import", str(REAL / "A17.topo.txt"), "--gpu", "rtx2080ti",
                 "-o", str(out)]) == 0
    text = out.read_text()
    assert "p2p: false" in text and "`nvidia-smi topo -p2p` says NS" in text


def test_header_comment_lists_every_assumption(tmp_path):
    out = tmp_path / "a1.yaml"
    assert main(["topo", "import", str(REAL / "A1.topo.txt"), "--gpu", "rtx4090", "-o",
                 str(out), "--cpu", "skylake-upi", "--pcie-gen", "4", "--lanes", "16"]) == 0
    text = out.read_text()
    comments = [line for line in text.splitlines() if line.startswith("#  - ")]
    assert any("uplink" in c for c in comments) and any("host memory" in c for c in comments)
    assert not any(c.startswith("#  - CPU model") for c in comments)  # given by --cpu
    data = yaml.safe_load(text)
    assert {n["model"] for n in data["nodes"] if n["kind"] == "cpu"} == {"skylake-upi"}


def test_stdout_without_output_flag(capsys):
    assert main(["topo", "import", str(REAL / "A3.topo.txt"), "--gpu", "rtx5090"]) == 0
    data = yaml.safe_load(capsys.readouterr().out)
    assert data["name"] == "A3" and data["p2p"] is False


def test_abbreviated_affinity_columns_import_with_a_warning(tmp_path, capsys):
    """A16: its author replaced the columns after GPU7 by '...': the GPU block is whole."""
    out = tmp_path / "a16.yaml"
    assert main(["topo", "import", str(REAL / "A16.topo.txt"), "--gpu", "a40",
                 "-o", str(out)]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "A16.topo.txt: warning: the columns after the devices are " \
        "abbreviated" in err[0]
    machine = Machine.from_config(load_topology(str(out)))
    bridges = [(lc.a, lc.b, lc.model) for lc in machine.config.links if lc.kind == "nvlink"]
    assert bridges == [(f"gpu{i}", f"gpu{i + 1}", "ampere-ga102") for i in (0, 2, 4, 6)]
    assert [machine.local_cpu(r) for r in (0, 3, 4, 7)] == ["cpu0", "cpu0", "cpu1", "cpu1"]


def test_abbreviated_device_columns_are_one_clear_line(tmp_path, capsys):
    bad = tmp_path / "cut.txt"
    bad.write_text("\tGPU0\t...\tGPU7\nGPU0\t X \t...\tSYS\n")
    assert main(["topo", "import", str(bad), "--gpu", "a40"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cut.txt:1: the matrix is abbreviated" in err[0]


def test_one_missing_row_is_read_from_its_column(tmp_path, capsys):
    lines = (REAL / "A1.topo.txt").read_text().splitlines(keepends=True)
    cut = tmp_path / "a1-cut.txt"
    cut.write_text("".join(line for line in lines if not line.startswith("GPU5\t")))
    out = tmp_path / "a1.yaml"
    assert main(["topo", "import", str(cut), "--gpu", "rtx4090", "-o", str(out)]) == 0
    assert "no row for GPU5: inferred from its column" in capsys.readouterr().err
    whole = _import(tmp_path, REAL / "A1.topo.txt", "rtx4090")
    cut_machine = Machine.from_config(load_topology(str(out)))
    assert [[cut_machine.path_type(i, j) for j in range(8)] for i in range(8)] == \
        [[whole.path_type(i, j) for j in range(8)] for i in range(8)]


def test_nic_rows_are_kept_on_the_pcie_tree(tmp_path):
    machine = _import(tmp_path, REAL / "A1.topo.txt", "rtx4090")
    (nic,) = [n.id for n in machine.config.nodes if n.kind == "nic"]
    assert nic == "mlx5_bond_0"
    switch = next(lc.a for lc in machine.config.links if lc.b == "gpu0")
    assert any({lc.a, lc.b} == {switch, nic} for lc in machine.config.links)  # GPU0's switch


def test_a_mixed_box_takes_each_gpus_model_from_its_name(tmp_path, capsys):
    """M1 (tests/fixtures/made): nvidia-smi -L names two 5090s and two 3090s; --cpu names the
    Threadripper PRO, which sets host memory; the bridge joins the two 3090s only."""
    out = tmp_path / "m1.yaml"
    assert main(["topo", "import", str(MADE / "M1.topo.txt"), "--cpu",
                 "amd-threadripper-pro-3000", "-o", str(out)]) == 0
    said = capsys.readouterr().out
    assert "2 x rtx5090, 2 x rtx3090" in said and "rtx3090 at GPU 2, 3" in said
    data = yaml.safe_load(out.read_text())
    assert data["gpu"] == "rtx5090"
    assert [n.get("gpu") for n in data["nodes"] if n["kind"] == "gpu"] == \
        [None, None, "rtx3090", "rtx3090"]
    (cpu,) = [n for n in data["nodes"] if n["kind"] == "cpu"]
    assert cpu["model"] == "amd-threadripper-pro-3000"
    assert cpu["memory_bandwidth_gb_per_s"] == pytest.approx(0.8 * 8 * 3200 * 8 / 1000, abs=0.1)
    machine = Machine.from_config(load_topology(str(out)))
    assert [g.name for g in (machine.gpu_of(r) for r in range(4))] == \
        ["rtx5090", "rtx5090", "rtx3090", "rtx3090"]
    gens = {lc.b: lc.gen for lc in machine.config.links if lc.kind == "pcie"}
    assert (gens["gpu0"], gens["gpu2"]) == (5, 4)  # each card's own PCIe generation
    (bridge,) = [lc for lc in machine.config.links if lc.kind == "nvlink"]
    assert (bridge.a, bridge.b, bridge.model) == ("gpu2", "gpu3", "ampere-ga102")
    assert not machine.is_intel_cpu("cpu0")


def test_the_cpu_assumed_is_named(tmp_path, capsys):
    assert main(["topo", "import", str(MADE / "M1.topo.txt")]) == 0
    text = capsys.readouterr().out
    assert "#  - CPU intel-xeon-sapphire-rapids, an Intel Xeon" in text
    assert "as the input names none" in text and "--cpu NAME sets yours" in text


@pytest.mark.parametrize("spec, message", [
    ("0-2=rtx5090", "names no card for GPU 3"), ("0-3=rtx5090,3=rtx3090", "GPU3 is given twice"),
    ("0-7=rtx5090", "the matrix has GPUs 0-3"), ("0-3=rtx9090", "unknown GPU 'rtx9090'"),
    ("0:3=rtx5090", "expected NAME, or FIRST-LAST=NAME"),
])
def test_bad_gpu_ranges_are_one_line(capsys, spec, message):
    assert main(["topo", "import", str(MADE / "M1.topo.txt"), "--gpu", spec]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and message in err


def test_gpu_ranges_override_the_names(tmp_path):
    machine = _import(tmp_path, MADE / "M1.topo.txt", "0-1=rtx4090,2-3=rtx-a6000")
    assert [machine.gpu_of(r).name for r in range(4)] == ["rtx4090"] * 2 + ["rtx-a6000"] * 2


def test_a_matrix_without_names_needs_gpu(capsys):
    assert main(["topo", "import", str(REAL / "A3.topo.txt")]) == 2
    assert "give --gpu NAME, or --gpu 0-3=rtx4090,4-7=rtx3090" in capsys.readouterr().err


def test_h100_pcie_with_its_nvlink_bridge_imports(tmp_path):
    text = ("\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\n"
            "GPU0\t X \tNV12\t0-31\t0\nGPU1\tNV12\t X \t0-31\t0\n")
    path = tmp_path / "h100pcie.txt"
    path.write_text(text)
    machine = _import(tmp_path, path, "h100-pcie")
    assert machine.path_type(0, 1) == "NVL"
    (bridge,) = [lc for lc in machine.config.links if lc.kind == "nvlink"]
    assert bridge.count == 12 and bridge.model is None  # NVLink4, 25 GB/s a link


@pytest.mark.parametrize("text, message", [
    ("hello\n", "no `nvidia-smi topo -m` header"),
    ("\tGPU0\tGPU1\tGPU2\nGPU0\t X \tPIX\tPIX\n", "no row for GPU1, GPU2"),
    ("\tGPU0\tGPU1\nGPU0\t X \tPIX\nGPU1\tPIX\n", "row GPU1 has 1 cells for 2 devices"),
    ("\tGPU0\tGPU1\nGPU0\t X \tFOO\nGPU1\tPIX\t X \n", "unknown relation 'FOO'"),
])
def test_malformed_matrix(text, message):
    with pytest.raises(InputError, match=message):
        nvidia_smi.parse(text, "m.txt")


def test_spaces_tabs_prompts_and_old_names_parse_alike():
    tabs = ("\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\n"
            "GPU0\t X \tSOC\t0-7\t0\nGPU1\tSOC\t X \t8-15\t1\n")
    spaces = ("user@box:~$ nvidia-smi topo -m\n"
              "        GPU0    GPU1    CPU Affinity    NUMA Affinity\n"
              "GPU0     X      SYS     0-7     0\nGPU1    SYS      X      8-15    1\n")
    a, b = nvidia_smi.parse(tabs), nvidia_smi.parse(spaces)
    assert a.relation == b.relation and a.relation[("GPU0", "GPU1")] == "SYS"
    assert a.numa_affinity == b.numa_affinity == {"GPU0": 0, "GPU1": 1}


def test_old_style_nic_columns_named_by_device():
    text = ("\tGPU0\tGPU1\tmlx5_0\tCPU Affinity\nGPU0\t X \tPIX\tPIX\t0-7\n"
            "GPU1\tPIX\t X \tPIX\t0-7\nmlx5_0\tPIX\tPIX\t X \n")
    matrix = nvidia_smi.parse(text)
    assert matrix.gpus == ("GPU0", "GPU1") and matrix.nics == ("mlx5_0",)


def test_a_nic_on_no_gpus_socket_gets_a_numa_node_of_its_own(tmp_path):
    machine = _import(tmp_path, REAL / "A12.topo.txt", "a100-sxm4-80gb")
    cpus = [n.id for n in machine.config.nodes if n.kind == "cpu"]
    assert cpus == ["cpu1", "cpu3", "cpu5", "cpu7", "cpu0"]  # NUMA ids, then the NICs' own


def test_nccl_xml_dump_keeps_speeds_nvswitch_and_cpu_model(tmp_path):
    machine = _import(tmp_path, REAL / "X2.nccl-topo.xml", "h200")
    assert machine.n_gpus == 3
    assert {lc.gen for lc in machine.config.links if lc.kind == "pcie"} == {5}
    counts = {lc.a: lc.count for lc in machine.config.links if lc.kind == "nvlink"}
    assert counts == {"gpu0": 18, "gpu1": 18, "gpu2": 18}  # 5 + 5 + 4 + 4 NVSwitch links
    (cpu,) = [n for n in machine.config.nodes if n.kind == "cpu"]
    assert cpu.model == "intel-xeon-emerald-rapids"  # family 6, model 207 (0xCF)
    assert all(machine.path_type(0, j) == "NVL" for j in (1, 2))


def test_nccl_topo_file_without_gpu_elements(tmp_path):
    machine = _import(tmp_path, REAL / "X1.nccl-topo.xml", "a100-sxm4-80gb")
    assert machine.n_gpus == 8
    assert machine.path_type(0, 1) == "PIX" and machine.path_type(0, 2) == "SYS"
    # AMD family 23 model 49: Rome, with its xGMI2 socket links and memory
    assert {n.model for n in machine.config.nodes if n.kind == "cpu"} == {"amd-epyc-7002"}
    assert {lc.kind for lc in machine.config.links if lc.a.startswith("cpu")
            and lc.b.startswith("cpu")} == {"xgmi"}


def test_bad_xml_is_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.xml"
    bad.write_text("<system><cpu numaid='0'><pci busid='0000:01:00.0' class='0x030000'")
    assert main(["topo", "import", str(bad), "--gpu", "h100-pcie"]) == 2
    assert "bad.xml:1: not valid XML" in capsys.readouterr().err


def test_nvlink_on_a_card_without_nvlink_is_an_error():
    matrix = nvidia_smi.parse((REAL / "A9.topo.txt").read_text())
    with pytest.raises(InputError, match="GPU0 is a rtx4090, which has no NVLink"):
        topo_import.from_matrix(matrix, topo_import.ImportOptions("rtx4090", "a9"), "A9")


def test_topo_without_topology_says_what_to_give(capsys):
    assert main(["topo"]) == 2
    assert "give -t TOPOLOGY" in capsys.readouterr().err
