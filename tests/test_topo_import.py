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
# fixture -> the catalog GPU closest to the card in it (A100 40GB, A6000: their 80 GB / GA102 kin)
MATRICES = {"A1": "rtx4090", "A12": "a100-sxm4-80gb", "A13": "h100-sxm", "A17": "rtx2080ti",
            "A3": "rtx5090", "A6": "rtx5090", "A9": "rtx3090"}
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
    machine = _import(tmp_path, REAL / "A9.topo.txt", "rtx3090")
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


def test_abbreviated_matrix_is_one_clear_line(tmp_path, capsys):
    out = tmp_path / "a16.yaml"
    assert main(["topo", "import", str(REAL / "A16.topo.txt"), "--gpu", "a100-pcie-80gb",
                 "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "A16.topo.txt:1: the matrix is abbreviated" in err[0]
    assert not out.exists()


@pytest.mark.parametrize("text, message", [
    ("hello\n", "no `nvidia-smi topo -m` header"),
    ("\tGPU0\tGPU1\nGPU0\t X \tPIX\n", "no row for GPU1"),
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
    assert cpu.model == "emerald-rapids-upi"  # family 6, model 207 (topo.cc's rule)
    assert all(machine.path_type(0, j) == "NVL" for j in (1, 2))


def test_nccl_topo_file_without_gpu_elements(tmp_path):
    machine = _import(tmp_path, REAL / "X1.nccl-topo.xml", "a100-sxm4-80gb")
    assert machine.n_gpus == 8
    assert machine.path_type(0, 1) == "PIX" and machine.path_type(0, 2) == "SYS"
    assert {n.model for n in machine.config.nodes if n.kind == "cpu"} == {"amd-xgmi"}


def test_bad_xml_is_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.xml"
    bad.write_text("<system><cpu numaid='0'><pci busid='0000:01:00.0' class='0x030000'")
    assert main(["topo", "import", str(bad), "--gpu", "h100-pcie"]) == 2
    assert "bad.xml:1: not valid XML" in capsys.readouterr().err


def test_nvlink_on_a_card_without_nvlink_is_an_error():
    matrix = nvidia_smi.parse((REAL / "A9.topo.txt").read_text())
    with pytest.raises(InputError, match="rtx4090 has no NVLink"):
        topo_import.from_matrix(matrix, topo_import.ImportOptions("rtx4090", "a9"), "A9")


def test_topo_without_topology_says_what_to_give(capsys):
    assert main(["topo"]) == 2
    assert "give -t TOPOLOGY" in capsys.readouterr().err
