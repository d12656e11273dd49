"""What-if upgrades: each rewrite changes the machine as a buyer would, or says why not."""

from __future__ import annotations

import pytest

from simulator import api
from simulator.advice import advise, whatif
from simulator.catalog.gpus import gpu
from simulator.inputs.config import load_topology
from simulator.machine.cards import resolve_gpu
from simulator.machine.topology import Machine
from simulator.nccl.communicator import Communicator
from simulator.outputs.cost import Prices


def rewrite(name: str, topology: str):  # noqa: ANN201
    config = load_topology(topology)
    return whatif.UPGRADES[name](config, resolve_gpu(config.gpu))


def test_p2p_driver_turns_shm_into_p2p_behind_a_switch() -> None:
    config, _ = rewrite("p2p driver", "8x5090-switch")
    machine = Machine.from_config(config)
    assert Communicator(machine).transport(0, 1) == "P2P"
    assert rewrite("p2p driver", "8xh100-nvswitch")[0] is None


def test_root_ports_become_one_switch_and_switches_two_sockets() -> None:
    one, note = rewrite("pcie switch or two sockets", "8x5090-dual-socket")
    assert one is not None and "one PCIe switch" in note
    assert Machine.from_config(one).path_type(0, 7) == "PIX"
    two, note = rewrite("pcie switch or two sockets", "8x5090-switch")
    assert two is not None and Machine.from_config(two).path_type(0, 7) == "SYS"
    assert rewrite("pcie switch or two sockets", "8xh100-nvswitch")[0] is None


def test_pcie_generation_and_nvlink_only_where_the_card_has_them() -> None:
    config, note = rewrite("next pcie generation", "8x4090-dual-socket")
    assert config is None and "Gen4 card" in note
    assert rewrite("nvlink bridge", "8x5090-switch")[0] is None
    bridged, _ = rewrite("nvlink bridge", "2x3090ti-pcie")
    assert bridged is not None and Machine.from_config(bridged).path_type(0, 1) == "NVL"


def test_twice_the_gpus_and_a_bigger_card() -> None:
    doubled, _ = rewrite("twice the gpus", "4x5090")
    assert Machine.from_config(doubled).n_gpus == 8
    bigger, _ = rewrite("more memory", "4x5090")
    assert resolve_gpu(bigger.gpu).memory_bytes > gpu("rtx5090").memory_bytes


def test_upgrades_are_simulated_with_ranges_and_priced_per_gpu() -> None:
    prices = Prices(usd_per_gpu_hour=1.0)
    answer = advise.advise([advise.PricedMachine("2x5090", prices)], "gpt2-medium", jobs=1)
    results = {r["upgrade"]: r for r in whatif.upgrades(answer["best"], prices)}
    assert set(results) == set(whatif.UPGRADES)
    for r in results.values():
        assert r["applies"] or r["note"]
        if r["applies"]:
            low, high = r["step_time_s_range"]
            assert low <= r["step_time_s"] <= high
    doubled = results["twice the gpus"]
    assert doubled["usd_per_hour"] == pytest.approx(4.0)
    assert doubled["tokens_per_s"] > answer["best"]["tokens_per_s"]
    assert api.load_machine("2x5090").n_gpus == 2  # the preset itself is untouched
    text = "\n".join(whatif.lines(answer["best"], list(results.values())))
    assert "does not apply" in text and "per million tokens" in text


def test_a_p2p_driver_that_nccl_would_not_use_says_so() -> None:
    config, note = rewrite("p2p driver", "8x5090-dual-socket")  # root ports: PHB apart
    assert config is None and "NCCL_P2P_LEVEL" in note


def test_a_bigger_card_carries_its_own_price() -> None:
    bigger, note = rewrite("more memory", "8x5090-switch")
    card = resolve_gpu(bigger.gpu)
    base = load_topology("8x5090-switch").price_usd_per_hour
    assert bigger.price_usd_per_hour == pytest.approx(
        base * card.price_usd / gpu("rtx5090").price_usd)
    assert "card prices" in note
