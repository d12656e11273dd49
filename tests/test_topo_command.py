"""`stepsim topo`: the same transport as `collective` for every pair (one function decides it,
under the same NCCL variables), and the machine drawn as the tree it is."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simulator import api
from simulator.cli import main
from simulator.commands.topo import layout
from simulator.inputs.schema import TopologyConfig
from simulator.machine.topology import Machine
from simulator.nccl.communicator import Communicator


@pytest.fixture
def fresh():
    """Communicators built under a patched transport must not outlive the test."""
    api.clear_caches()
    yield
    api.clear_caches()


def test_topo_and_collective_ask_the_same_function(capsys, monkeypatch, fresh):
    """Whatever Communicator.transport_over (the rule: a pair's path type -> its transport)
    says is what both commands show, pair by pair."""
    monkeypatch.setattr(Communicator, "transport_over",
                        lambda self, kind: "P2P" if kind == "PIX" else "NET")
    assert main(["topo", "-t", "8x5090-dual-socket", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    kinds, matrix = report["path_type"], report["transport"]
    assert {matrix[i][j] for i in range(8) for j in range(8) if i != j} == {"NET"}
    assert all(matrix[i][j] == ("P2P" if kinds[i][j] == "PIX" else "NET")
               for i in range(8) for j in range(8) if i != j)
    assert main(["collective", "-t", "8x5090-dual-socket", "--op", "allreduce", "--bytes",
                 "1M", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["transport"] == "NET"


@pytest.mark.parametrize("env", [{}, {"NCCL_P2P_LEVEL": "SYS"}, {"NCCL_P2P_DISABLE": "1"}])
def test_each_ring_hop_runs_the_transport_topo_shows(capsys, monkeypatch, env):
    """Under NCCL's default level, NCCL_P2P_LEVEL=SYS and NCCL_P2P_DISABLE=1 alike, the
    transports topo shows on the ring's hops are the ones collective runs."""
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert main(["topo", "-t", "8x5090-switch-p2p", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert main(["collective", "-t", "8x5090-switch-p2p", "--op", "allreduce", "--bytes", "1G",
                 "--json"]) == 0
    used = set(json.loads(capsys.readouterr().out)["transport"].split("+"))
    order = report["ring"]["order"]
    hops = {report["transport"][a][order[(k + 1) % len(order)]] for k, a in enumerate(order)}
    assert hops == used
    if env:
        assert report["nccl_env"]["variables"] == " ".join(f"{k}={v}" for k, v in env.items())


def test_topo_says_what_the_environment_changed(capsys, monkeypatch):
    monkeypatch.setenv("NCCL_P2P_DISABLE", "1")
    assert main(["topo", "-t", "8x5090-switch-p2p"]) == 0
    out = capsys.readouterr().out
    assert "NCCL environment (read as NCCL reads it): NCCL_P2P_DISABLE=1" in out
    assert "use SHM (staged through host memory) instead of P2P" in out


FOUR_SWITCH_TREE = {
    "name": "tree", "gpu": "rtx5090", "p2p": True,
    "nodes": [{"id": "cpu0", "kind": "cpu"}, {"id": "root", "kind": "pcie_switch"},
              *({"id": f"sw{k}", "kind": "pcie_switch"} for k in range(3)),
              *({"id": f"gpu{k}", "kind": "gpu"} for k in range(6))],
    "links": [{"a": "cpu0", "b": "root", "kind": "pcie"},
              *({"a": "root", "b": f"sw{k}", "kind": "pcie"} for k in range(3)),
              *({"a": f"sw{k // 2}", "b": f"gpu{k}", "kind": "pcie"} for k in range(6))],
}


def test_a_four_switch_tree_is_drawn_as_a_tree():
    machine = Machine.from_config(TopologyConfig.from_data(FOUR_SWITCH_TREE))
    pos = layout(machine)
    depth = {n: -y for n, (_, y) in pos.items()}
    assert depth["cpu0"] == 0 and depth["root"] == 1
    assert {depth[f"sw{k}"] for k in range(3)} == {2}  # siblings, not a chain
    assert {depth[f"gpu{k}"] for k in range(6)} == {3}
    for k in range(3):  # each switch centred over its two GPUs, the root over the switches
        assert pos[f"sw{k}"][0] == pytest.approx((pos[f"gpu{2 * k}"][0]
                                                  + pos[f"gpu{2 * k + 1}"][0]) / 2)
    assert pos["root"][0] == pytest.approx(pos["sw1"][0]) == pytest.approx(pos["cpu0"][0])
    xs = [pos[f"gpu{k}"][0] for k in range(6)]
    assert xs == sorted(xs) and len(set(xs)) == 6


def test_the_png_is_written(tmp_path):
    out = tmp_path / "tree.png"
    assert main(["topo", "-t", "8xh100-nvswitch", "--png", str(out)]) == 0
    assert out.read_bytes()[:4] == b"\x89PNG"


def test_a_fallback_ring_says_the_transports_stand(capsys):
    """The dual-Turin box: NCCL's search falls back (AMD's socket link is 16 GB/s to it), yet
    every pair, across the sockets too, stays P2P as its p2p_level SYS says."""
    turin = str(Path(__file__).resolve().parent.parent / "validation" / "topologies"
                / "8xgb202-dual-turin-p2p.yaml")
    assert main(["topo", "-t", turin, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ring"]["fallback"]
    assert {t for row in report["transport"] for t in row if t} == {"P2P"}
    assert main(["topo", "-t", turin]) == 0
    assert "each pair keeps the transport above" in capsys.readouterr().out
