"""NCCL's environment variables, read as NCCL reads them (paths.cc, param.cc, tuning.cc
parseList, connect.cc), and what they change in `collective` and `run`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simulator.cli import main
from simulator.errors import InputError
from simulator.inputs.config import load_topology
from simulator.machine.topology import Machine
from simulator.nccl import collectives
from simulator.nccl.communicator import Communicator
from simulator.nccl.env import NcclEnv, strtoll
from simulator.nccl.perf import time_alone
from simulator.units import GiB, MiB

TURIN = str(Path(__file__).resolve().parent.parent / "validation" / "topologies"
            / "8xgb202-dual-turin-p2p.yaml")


def machine(name: str, **env: str) -> Communicator:
    """NCCL over a preset under these variables."""
    return Communicator(Machine.from_config(load_topology(name)), NcclEnv.from_environ(env))


@pytest.mark.parametrize("text, value", [("1", 1), (" 1", 1), ("0x1", 1), ("010", 8),
                                         ("1abc", 1), ("yes", 0), ("", 0), ("-2", -2)])
def test_strtoll_reads_what_c_reads(text, value):
    assert strtoll(text) == value


@pytest.mark.parametrize("env, level", [
    ({"NCCL_P2P_DISABLE": "1"}, "LOC"), ({"NCCL_P2P_DISABLE": "0"}, None),
    ({"NCCL_P2P_DISABLE": "2"}, None), ({"NCCL_P2P_LEVEL": "SYS"}, "SYS"),
    ({"NCCL_P2P_LEVEL": "sys"}, None),  # strcmp: case-sensitive
    ({"NCCL_P2P_LEVEL": "3"}, "PHB"), ({"NCCL_P2P_LEVEL": "9"}, "SYS"),  # old numbers
    ({"NCCL_P2P_DISABLE": "1", "NCCL_P2P_LEVEL": "SYS"}, "LOC"),
])
def test_p2p_level_as_paths_cc_reads_it(env, level):
    assert NcclEnv.from_environ(env).p2p_level == level


def test_algo_and_proto_lists_are_case_insensitive_with_negation_and_prefixes():
    env = NcclEnv.from_environ({"NCCL_ALGO": "ring;allreduce:TREE", "NCCL_PROTO": "^ll128"})
    assert env.enabled_algorithms("allreduce") == ("tree",)
    assert env.enabled_algorithms("allgather") == ("ring",)
    assert env.enabled_protocols("allreduce") == ("LL", "Simple")


@pytest.mark.parametrize("env, message", [
    ({"NCCL_ALGO": "butterfly"}, "unrecognized element 'butterfly'"),
    ({"NCCL_PROTO": "ll;simple"}, "must have a prefix"),
    ({"NCCL_ALGO": "alltoall:ring"}, "unrecognized function"),
])
def test_bad_lists_are_errors_as_in_nccl(env, message):
    with pytest.raises(InputError, match=message):
        NcclEnv.from_environ(env)


def test_channel_bounds_clamp_as_connect_cc():
    env = NcclEnv.from_environ({"NCCL_MIN_NCHANNELS": "100", "NCCL_MAX_NCHANNELS": "0"})
    assert (env.min_channels, env.max_channels) == (64, 1)
    assert NcclEnv.from_environ({"NCCL_MAX_NCHANNELS": "2"}).channels(4) == 2
    assert NcclEnv.from_environ({"NCCL_MIN_NCHANNELS": "8"}).channels(4) == 8


def test_p2p_disable_equals_the_no_p2p_box():
    off = time_alone(machine("8x5090-switch-p2p", NCCL_P2P_DISABLE="1"),
                               "allreduce", GiB)
    stock = time_alone(machine("8x5090-switch"), "allreduce", GiB)
    assert off.transport == stock.transport == "SHM"
    assert off.time_us == pytest.approx(stock.time_us, rel=1e-9)


def test_p2p_disable_in_collective_output_says_why(capsys, monkeypatch):
    monkeypatch.setenv("NCCL_P2P_DISABLE", "1")
    assert main(["collective", "-t", "8x5090-switch-p2p", "--op", "allreduce", "-b", "1G"]) == 0
    out = capsys.readouterr().out
    assert "# stepsim: NCCL environment (read as NCCL reads it): NCCL_P2P_DISABLE=1" in out
    assert "56 of 56 GPU pairs use SHM (staged through host memory) instead of P2P" in out
    monkeypatch.delenv("NCCL_P2P_DISABLE")
    assert main(["collective", "-t", "8x5090-switch", "--op", "allreduce", "-b", "1G"]) == 0
    stock = capsys.readouterr().out
    row = [line for line in out.splitlines() if line.startswith("  1073741824")]
    assert row == [line for line in stock.splitlines() if line.startswith("  1073741824")]


@pytest.mark.parametrize("variable, value, said", [
    ("NCCL_ALGO", "Tree", "algorithm: tree where NCCL would choose ring"),
    ("NCCL_PROTO", "LL", "protocol: LL where NCCL would choose Simple"),
])
def test_algo_and_proto_change_the_choice_and_say_so(capsys, monkeypatch, variable, value, said):
    monkeypatch.setenv(variable, value)
    assert main(["collective", "-t", "8x5090-switch-p2p", "--op", "allreduce", "-b", "1G",
                 "--json"]) == 0
    obj = json.loads(capsys.readouterr().out)[0]
    assert {"NCCL_ALGO": obj["algorithm"], "NCCL_PROTO": obj["protocol"]}[variable].lower() \
        == value.lower()
    assert main(["collective", "-t", "8x5090-switch-p2p", "--op", "allreduce", "-b", "1G"]) == 0
    assert said in capsys.readouterr().out


def test_min_channels_lifts_a_channel_bound_plateau():
    """The dual-Turin P2P box: NCCL's fallback ring runs 2 channels of 256 threads, which bind;
    NCCL_MIN_NCHANNELS=8 adds channels until the Gen5 links bind (validation/pcie-p2p.yaml)."""
    default = time_alone(machine(TURIN), "allreduce", GiB)
    eight = time_alone(machine(TURIN, NCCL_MIN_NCHANNELS="8"), "allreduce", GiB)
    assert (default.n_channels, eight.n_channels) == (2, 8)
    assert default.busbw_gbps < 0.55 * eight.busbw_gbps


def test_host_memory_binds_the_shm_box_at_any_channel_count():
    """8x5090 over two sockets without P2P, NVIDIA/nccl#1639's run (NCCL_NTHREADS=256
    NCCL_MIN_NCHANNELS=8): 28 GB/s, host memory binding; NCCL's own 2 channels of 512 threads
    carry as much, so they change nothing."""
    default = time_alone(machine("8x5090-dual-socket"), "allreduce", GiB)
    run = machine("8x5090-dual-socket", NCCL_MIN_NCHANNELS="8", NCCL_NTHREADS="256")
    eight = time_alone(run, "allreduce", GiB)
    assert (default.n_channels, eight.n_channels) == (2, 8)
    assert eight.busbw_gbps == pytest.approx(28.0, rel=0.10)
    assert default.busbw_gbps == pytest.approx(eight.busbw_gbps, rel=1e-6)
    assert "mem:" in (eight.bottleneck_link or "")


@pytest.mark.parametrize("value, threads", [("256", 256), ("100", 512), ("1024", 512),
                                            ("32", 64), ("0", None), ("-1", None)])
def test_nthreads_as_nccl_reads_it(value, threads):
    """tuning.cc getNthreads: not a multiple of 32 or above 512 -> 512, below 64 -> 64, 0 or
    less -> NCCL's default."""
    env = NcclEnv.from_environ({"NCCL_NTHREADS": value})
    assert env.threads(512, 512) == (threads or 512)
    assert env.threads(256, 512) == (threads or 256)


def test_shm_disable_falls_back_to_net_over_loopback():
    m = machine("8x5090-switch", NCCL_SHM_DISABLE="1")
    assert m.transport(0, 1) == "NET"
    mem = dict(m.route(0, 1))["mem:cpu0"]
    assert mem == 6  # GPU write, the socket's two copies (read + write each), GPU read
    slower = time_alone(m, "allreduce", MiB).time_us
    assert slower > time_alone(machine("8x5090-switch"), "allreduce", MiB).time_us


def test_proto_ll128_enables_it_off_nvlink_as_nccl_does():
    plan = collectives.plan(machine("8x5090-switch-p2p", NCCL_PROTO="LL128"), "allreduce", GiB)
    assert plan.protocol == "LL128"


def test_run_applies_the_environment_and_reports_it(capsys, monkeypatch):
    monkeypatch.setenv("NCCL_P2P_DISABLE", "1")
    assert main(["run", "-t", "8x5090-switch-p2p", "-w", "gpt2-medium", "--no-ranges",
                 "--json"]) == 0
    off = json.loads(capsys.readouterr().out)
    assert off["nccl_env"]["variables"] == {"NCCL_P2P_DISABLE": "1"}
    assert any("use SHM" in e for e in off["nccl_env"]["effects"])
    monkeypatch.delenv("NCCL_P2P_DISABLE")
    assert main(["run", "-t", "8x5090-switch-p2p", "-w", "gpt2-medium", "--no-ranges",
                 "--json"]) == 0
    on = json.loads(capsys.readouterr().out)
    assert "nccl_env" not in on and on["comm_time_s"] < off["comm_time_s"]


def test_a_variable_that_changes_nothing_says_so(capsys, monkeypatch):
    monkeypatch.setenv("NCCL_P2P_DISABLE", "1")  # the stock GeForce box has no P2P anyway
    assert main(["collective", "-t", "8x5090-switch", "--op", "allreduce", "-b", "1G"]) == 0
    assert "these change nothing on this machine" in capsys.readouterr().out


def test_lowercase_level_is_ignored_and_said(capsys, monkeypatch):
    monkeypatch.setenv("NCCL_P2P_LEVEL", "sys")
    assert main(["collective", "-t", "8x5090-switch-p2p", "--op", "allreduce", "-b", "1M"]) == 0
    assert "NCCL_P2P_LEVEL=sys (NCCL compares level names case-sensitively" in \
        capsys.readouterr().out
