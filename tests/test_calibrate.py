"""`stepsim calibrate`: recovers known parameters from logs stepsim wrote with noise, predicts the
rest of a real log from part of it, refuses what the logs cannot tell, and records it all."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simulator.api.ranges import calibrated_mechanisms
from simulator.calibration import checks, collectives_fit, record
from simulator.cli import main
from simulator.inputs import nccl_tests_log
from simulator.inputs.config import load_topology, resolve
from simulator.inputs.schema import CalibrationConfig, FittedValue
from simulator.machine.topology import Machine
from simulator.nccl import collectives
from simulator.nccl.communicator import Communicator
from simulator.nccl.perf import time_alone
from simulator.outputs import nccl_tests

ROOT = Path(__file__).resolve().parent.parent
REAL = Path(__file__).parent / "fixtures" / "real-inputs"
VALIDATION = ROOT / "validation" / "topologies"


def truth_topology(tmp_path: Path, preset: str, values: dict[str, float]) -> str:
    """The preset with a calibration block that sets ``values``: the box a log comes from."""
    fitted = [FittedValue(parameter=k, value=v, source="test truth") for k, v in values.items()]
    path = tmp_path / "truth.yaml"
    path.write_text(record.render(resolve(preset, "topologies").read_text(),
                                  CalibrationConfig(fitted=fitted)))
    return str(path)


def synthetic_log(tmp_path: Path, topology: str, op: str, noise: float, seed: int = 1) -> Path:
    """An nccl-tests log stepsim prints for ``topology``, times jittered by ``noise``."""
    machine = Machine.from_config(load_topology(topology))
    rng = np.random.default_rng(seed)
    rows = []
    for k in range(3, 31):
        size = 1 << k
        r = time_alone(Communicator(machine), op, size)
        t = r.time_us * (1 + noise * rng.standard_normal())
        rows.append(nccl_tests.Row(size, size // 4, t, size / t / 1e3,
                                   size / t / 1e3 * collectives.bus_factor(op, machine.n_gpus)))
    header = nccl_tests.Header(machine.n_gpus, 8, 1 << 30, 2, True)
    path = tmp_path / f"{op}.log"
    path.write_text(nccl_tests.render(header, op, "float", "sum", rows, []))
    return path


@pytest.mark.parametrize("preset, truth", [
    ("2x2080ti-switch", {"shm_pcie_efficiency": 0.45, "shm_ll_sync_us": 5.0,
                         "shm_simple_sync_us": 14.0}),
    (str(VALIDATION / "8xgb202-wrx90-2switch-p2p.yaml"),
     {"p2p_pcie_simple_efficiency": 0.7, "p2p_simple_sync_us": 3.0}),
    # the fallback ring's 2 channels of 256 threads bind there: their throughput is determined
    (str(VALIDATION / "8xgb202-dual-turin-p2p.yaml"),
     {"simple_channel_cap_gbps": 15.0, "p2p_simple_sync_us": 3.0}),
])
def test_recovers_known_parameters_from_noisy_stepsim_logs(tmp_path, preset, truth):
    log = synthetic_log(tmp_path, truth_topology(tmp_path, preset, truth), "allreduce", 0.02)
    comm = Communicator(Machine.from_config(load_topology(preset)))
    run = checks.run_of(nccl_tests_log.parse(log.read_text()), comm, preset)
    assert checks.contradictions(run, preset) == []
    result = collectives_fit.fit([run], None)
    for name, value in truth.items():
        assert result.fitted[name] == pytest.approx(value, rel=0.15), name
    assert result.rms_error < 0.04  # the noise, not a misfit
    assert result.settled and result.rounds <= collectives_fit.MAX_ROUNDS
    assert not result.at_bound


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    """Each real matrix imported as a user would: the topologies the logs ran on."""
    out = tmp_path_factory.mktemp("imported")
    paths = {}
    for name, gpu in (("A17", "rtx2080ti"), ("A16", "a40"), ("A12", "a100-sxm4-80gb"),
                      ("A13", "h100-sxm")):
        paths[name] = str(out / f"{name}.yaml")
        assert main(["topo", "import", str(REAL / f"{name}.topo.txt"), "--gpu", gpu, "-o",
                     paths[name]]) == 0
    return paths


# (log, its topology: an imported matrix or, where none was published, a validation machine,
#  --fit-max: 64M, or 2G where the log starts at 1G, tolerance of the predicted rows)
# B9's largest row is a step no mechanism of the model has: its out-of-place half jumps from
# 3.39 to 3.79 GB/s between 512M and 1G while the in-place half rose smoothly from 64M
# (3.38 .. 3.84); the model predicts the plateau of the others, 14% below that last row.
REAL_FITS = [
    ("B8", "A17", "64M", 0.10), ("B9", "A17", "64M", 0.15),
    ("B4", str(VALIDATION / "2x4090-docker-switch.yaml"), "64M", 0.10),
    ("B5", str(VALIDATION / "4x4090-docker-2switch.yaml"), "64M", 0.10),
    ("B2", str(VALIDATION / "6x4090-tinybox-p2p.yaml"), "64M", 0.10),
    ("B10", "A16", "2G", 0.10), ("B13", "A12", "2G", 0.10), ("B15", "A13", "2G", 0.10),
]


@pytest.mark.parametrize("name, topology, fit_max, tolerance", REAL_FITS)
def test_every_real_log_calibrates_within_its_bounds_and_predicts_the_rest(
        capsys, tmp_path, imported, name, topology, fit_max, tolerance):
    out = tmp_path / "cal.yaml"
    assert main(["calibrate", "-t", imported.get(topology, topology),
                 str(REAL / f"{name}.nccl-tests.log"), "--fit-max", fit_max, "-o",
                 str(out)]) == 0
    text = capsys.readouterr().out
    for fields in (line.split() for line in text.splitlines() if line.endswith("predict")):
        assert abs(float(fields[3].rstrip("%"))) <= 100 * tolerance, fields
    cal = load_topology(str(out)).calibration
    assert cal is not None and cal.fitted and not cal.forced
    for f in cal.fitted:
        assert f.low is not None and f.high is not None and f.low <= f.value <= f.high
        assert f.at_bound is None and f.source and f.rms_error is not None
    errors = [float(line.split()[3].rstrip("%")) / 100 for line in text.splitlines()
              if line.endswith(" fit")]
    said = float(text.split("rms error ")[1].split("%")[0]) / 100
    assert said == pytest.approx(np.sqrt(np.mean(np.square(errors))), abs=0.002)  # its table


B12_AS_RUN = Path(__file__).parent / "fixtures" / "logs" / "B12-as-run.nccl-tests.log"


def test_p2p_disabled_against_a_p2p_topology_is_refused_then_forced(capsys, tmp_path):
    """B12 as run (CUDA_VISIBLE_DEVICES=1,2 NCCL_P2P_DISABLE=1) against the NVSwitch preset:
    its GPUs 1, 2 talk P2P there. Refused in one line naming both; --force fits SHM with the
    log's variables applied, and every later answer says it was forced."""
    argv = ["calibrate", "-t", "8xa100-nvswitch", str(B12_AS_RUN), "--fit-max", "2G"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "NCCL_P2P_DISABLE=1" in err[0] and "8xa100-nvswitch" in err[0]
    assert "talked over SHM" in err[0] and "talk over P2P" in err[0] and "--force" in err[0]
    out = tmp_path / "forced.yaml"
    assert main([*argv, "--force", "-o", str(out)]) == 0
    said = capsys.readouterr()
    assert "gpu1, gpu2: CUDA_VISIBLE_DEVICES" in said.out
    assert "as run with NCCL_P2P_DISABLE=1" in said.out and "warning: forced:" in said.err
    cal = load_topology(str(out)).calibration
    assert "NCCL_P2P_DISABLE=1" in cal.forced
    assert [f.parameter for f in cal.fitted] == ["shm_pcie_efficiency"]
    assert main(["collective", "-t", str(out), "--op", "allreduce", "-b", "1G"]) == 0
    assert "# stepsim: calibration forced: " in capsys.readouterr().out
    assert main(["run", "-t", str(out), "-w", "gpt2-medium", "--gpus", "2", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert "NCCL_P2P_DISABLE=1" in report["calibration"]["forced"]
    assert not calibrated_mechanisms(Machine.from_config(load_topology(str(out))))


def test_a_log_without_its_command_is_refused_by_its_rates(capsys, tmp_path, imported):
    """B12 as published (no command line): on A16's first two GPUs, an NVLink pair, it runs
    at 0.08x the model, far below any published NVLink box; SHM would explain it."""
    assert main(["calibrate", "-t", imported["A16"], str(REAL / "B12.nccl-tests.log")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "over NVLink" in err[0] and "NCCL_P2P_DISABLE=1" in err[0]
    # forced, it fits the NVLink share the rows ask for, still within (0, 1], and says so
    out = tmp_path / "forced.yaml"
    assert main(["calibrate", "-t", imported["A16"], str(REAL / "B12.nccl-tests.log"),
                 "--force", "-o", str(out)]) == 0
    capsys.readouterr()
    cal = load_topology(str(out)).calibration
    assert cal.forced and all(f.low <= f.value <= f.high for f in cal.fitted)


def test_with_its_command_line_the_same_rows_calibrate_its_shm_pair(capsys, imported):
    """B12 as run names GPUs 1 and 2 of A16: NODE apart, SHM there by default too."""
    assert main(["calibrate", "-t", imported["A16"], str(B12_AS_RUN), "--fit-max", "2G"]) == 0
    out = capsys.readouterr().out
    assert "gpu1, gpu2" in out and "shm_pcie_efficiency" in out.split("left at")[0]


@pytest.mark.parametrize("log, topology, says", [
    ("B4", "2x5090", "ran on NVIDIA GeForce RTX 4090 (rtx4090); 2x5090 has a rtx5090 at GPU 0"),
    ("B10", str(VALIDATION / "2xa40-node-no-p2p.yaml"), "carry at most"),
])
def test_a_log_that_contradicts_the_topology_is_one_line(capsys, log, topology, says):
    assert main(["calibrate", "-t", topology, str(REAL / f"{log}.nccl-tests.log")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and says in err and "(--force fits it anyway)" in err


def test_a_fit_on_a_bound_says_so_and_narrows_nothing(capsys, tmp_path):
    """A log made with no SHM LL sync at all: the fit lands on its floor (0, the route's own
    latencies), says so, and the SHM mechanism keeps its uncalibrated range."""
    truth = truth_topology(tmp_path, "2x2080ti-switch", {"shm_ll_sync_us": 0.0})
    log = synthetic_log(tmp_path, truth, "allreduce", 0.0)
    out = tmp_path / "cal.yaml"
    assert main(["calibrate", "-t", "2x2080ti-switch", str(log), "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "at its floor: the route's link latencies alone explain the rows" in text
    cal = load_topology(str(out)).calibration
    assert {f.parameter: f.at_bound for f in cal.fitted}["shm_ll_sync_us"] == "floor"
    assert "shm" not in calibrated_mechanisms(Machine.from_config(load_topology(str(out))))


def test_the_refit_loop_ends_when_the_binding_set_alternates(monkeypatch):
    """A screen that keeps changing its mind cannot keep the fit going: a set seen before ends
    it with the better fit, and MAX_ROUNDS bounds it whatever happens."""
    sets = iter([["shm_pcie_efficiency"], ["shm_ll_sync_us"]] * 20)
    monkeypatch.setattr(collectives_fit, "_screen",
                        lambda *a, **k: (next(sets), {}))
    comm = Communicator(Machine.from_config(load_topology("2x2080ti-switch")))
    run = checks.run_of(nccl_tests_log.parse((REAL / "B8.nccl-tests.log").read_text()), comm,
                        "2x2080ti-switch")
    result = collectives_fit.fit([run], 1 << 20)
    assert not result.settled and result.rounds <= collectives_fit.MAX_ROUNDS
    assert set(result.fitted) in ({"shm_pcie_efficiency"}, {"shm_ll_sync_us"})


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzzed_logs_calibrate_or_refuse_in_one_line(capsys, tmp_path, data):
    """Cells replaced, rows cut, sizes duplicated: `calibrate` uses the rows that parse, names
    the rest in one warning line, and never raises."""
    lines = (REAL / "B8.nccl-tests.log").read_text().splitlines()
    for _ in range(data.draw(st.integers(1, 5))):
        k = data.draw(st.integers(8, len(lines) - 3))
        action = data.draw(st.sampled_from(["cell", "cut", "dup"]))
        fields = lines[k].split()
        if action == "cell" and fields:
            fields[data.draw(st.integers(0, len(fields) - 1))] = data.draw(
                st.sampled_from(["N/A", "0x10", "-inf", "1e-308", "nan", "1e309"]))
            lines[k] = "  ".join(fields)
        elif action == "cut":
            lines[k] = lines[k][:data.draw(st.integers(0, len(lines[k])))]
        else:
            lines.insert(k, lines[k])
    log = tmp_path / "fuzzed.log"
    log.write_text("\n".join(lines))
    code = main(["calibrate", "-t", "2x2080ti-switch", str(log), "--fit-max", "1M"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code in (0, 2)
    assert len(err) <= 1 and all("Traceback" not in line for line in err)


def test_twenty_thousand_rows_calibrate_in_seconds(capsys, tmp_path):
    """10,000 sizes, each measured twice: the fit and the table thin them to sizes evenly
    spaced in log size, and say so."""
    machine = Machine.from_config(load_topology("2x2080ti-switch"))
    comm = Communicator(machine)
    rows = []
    for k in range(10_000):
        size = 4096 + 4096 * k
        t = time_alone(comm, "allreduce", size).time_us
        row = nccl_tests.Row(size, size // 4, t, size / t / 1e3, size / t / 1e3)
        rows += [row, row]
    log = tmp_path / "big.log"
    log.write_text(nccl_tests.render(nccl_tests.Header(2, 4096, size, 4096, False),
                                     "allreduce", "float", "sum", rows, []))
    started = time.perf_counter()
    assert main(["calibrate", "-t", "2x2080ti-switch", str(log), "--fit-max", "16M"]) == 0
    assert time.perf_counter() - started < 30  # seconds, on a shared CI core
    captured = capsys.readouterr()
    assert "10000 sizes: the fit and the table use" in captured.out
    table = [line for line in captured.out.splitlines() if line.endswith(("fit", "predict"))]
    assert len(table) <= 2 * collectives_fit.MAX_SIZES
    assert "10000 size(s) measured more than once" in captured.err


def test_output_is_written_before_the_report_is_piped_away(tmp_path):
    out = tmp_path / "piped.yaml"
    command = (f"{sys.executable} -m simulator calibrate -t 2x2080ti-switch "
               f"{REAL / 'B8.nccl-tests.log'} -o {out} | head -1")
    done = subprocess.run(command, shell=True, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and out.exists()
    assert load_topology(str(out)).calibration.fitted


def test_refuses_what_the_log_cannot_determine(capsys):
    assert main(["calibrate", "-t", "2x2080ti-switch", str(REAL / "B8.nccl-tests.log")]) == 0
    out = capsys.readouterr().out
    left = out.split("left at stepsim's defaults:")[1]
    assert "call_latency_us" in left and "cannot tell it apart from" in left
    assert "p2p_simple_sync_us" in left and "no row of these logs uses" in left
    assert "(give -o OUT.yaml" in out


def test_the_calibrated_topology_runs_and_says_so(capsys, tmp_path):
    out = tmp_path / "cal.yaml"
    assert main(["calibrate", "-t", "2x2080ti-switch", str(REAL / "B8.nccl-tests.log"),
                 "-o", str(out)]) == 0
    capsys.readouterr()
    machine = Machine.from_config(load_topology(str(out)))
    fitted = {f.parameter: f.value for f in machine.calibration.fitted}
    assert Communicator(machine).wire.shm_pcie_efficiency == fitted["shm_pcie_efficiency"]
    original = (resolve("2x2080ti-switch", "topologies").read_text())
    assert out.read_text().startswith(original.rstrip("\n"))  # the user's file, kept
    assert main(["collective", "-t", str(out), "--op", "allreduce", "-b", "1G"]) == 0
    assert "# stepsim: calibrated machine" in capsys.readouterr().out
    # micro-batch 1: the preset's 5 does not fit an 11 GB card, and a job that does not fit is
    # not simulated
    assert main(["run", "-t", str(out), "-w", "gpt2-medium", "--micro-batch", "1",
                 "--no-ranges", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["calibration"]["fitted"] == fitted


def test_a_second_calibration_replaces_the_block(tmp_path, capsys):
    first, second = tmp_path / "a.yaml", tmp_path / "b.yaml"
    log = str(REAL / "B8.nccl-tests.log")
    assert main(["calibrate", "-t", "2x2080ti-switch", log, "-o", str(first)]) == 0
    assert main(["calibrate", "-t", str(first), log, "--fit-max", "1M", "-o", str(second)]) == 0
    capsys.readouterr()
    assert second.read_text().splitlines().count("calibration:") == 1
    assert "sizes up to 1M" in yaml.safe_load(second.read_text())["calibration"]["source"]


def test_fit_max_below_every_row_is_one_line(capsys):
    assert main(["calibrate", "-t", "2x2080ti-switch", str(REAL / "B12.nccl-tests.log"),
                 "--fit-max", "64M"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "leaves no row" in err


def test_compute_from_one_measured_step(capsys, tmp_path):
    out = tmp_path / "c.yaml"
    assert main(["calibrate", "-t", "2x5090", "-w", "gpt2-medium", "--step-time", "0.2",
                 "-o", str(out)]) == 0
    capsys.readouterr()
    (entry,) = load_topology(str(out)).calibration.compute
    assert entry.workload == "gpt2-medium" and entry.gpu == "rtx5090"
    assert entry.achieved_fraction == pytest.approx(entry.modelled_step_s / 0.2, rel=0.01)
    assert main(["run", "-t", str(out), "-w", "gpt2-medium", "--gpus", "1", "--no-ranges",
                 "--json"]) == 0
    one = json.loads(capsys.readouterr().out)
    assert one["step_time_s"] == pytest.approx(0.2, rel=1e-3)
    assert one["calibration"]["compute_achieved_fraction"] == {"rtx5090": entry.achieved_fraction}
    assert main(["run", "-t", str(out), "-w", "llama3.2-1b", "--checkpointing", "full",
                 "--no-ranges", "--json"]) == 0  # (without checkpointing it does not fit)
    other = json.loads(capsys.readouterr().out)["calibration"]
    assert other["compute_achieved_fraction"] is None
    assert other["compute_calibrated_for_other_workloads"] == ["gpt2-medium"]


def test_step_time_needs_a_workload(capsys):
    assert main(["calibrate", "-t", "2x5090", "--step-time", "0.2"]) == 2
    assert "needs the job it measured" in capsys.readouterr().err


def test_an_unknown_fitted_parameter_is_a_load_error(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(resolve("2x5090", "topologies").read_text() + "calibration:\n  fitted:\n"
                    "  - {parameter: warp_speed, value: 9, source: x}\n")
    with pytest.raises(Exception, match="unknown parameter 'warp_speed'"):
        load_topology(str(path))


def _with_shm_efficiency(tmp_path: Path, value: float) -> str:
    path = tmp_path / "truth.yaml"
    path.write_text(resolve("2x5090", "topologies").read_text() + "calibration:\n  fitted:\n"
                    f"  - {{parameter: shm_pcie_efficiency, value: {value}, source: truth}}\n")
    return str(path)


def _step(capsys, topology: str, *job: str) -> float:
    assert main(["run", "-t", topology, *job, "--no-ranges", "--json"]) == 0
    return float(json.loads(capsys.readouterr().out)["step_time_s"])


def test_transport_from_one_measured_step_recovers_the_rate_that_made_it(capsys, tmp_path):
    job = ["-w", "gpt2-medium", "-s", "ddp"]
    measured = _step(capsys, _with_shm_efficiency(tmp_path, 0.2), *job)
    out = tmp_path / "fitted.yaml"
    assert main(["calibrate", "-t", "2x5090", *job, "--gpus", "2", "--step-time",
                 repr(measured), "--fit", "transport", "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "collectives through host memory (SHM)" in text and "busbw" in text
    calibration = load_topology(str(out)).calibration
    (fit,) = calibration.fitted
    assert fit.parameter == "shm_pcie_efficiency" and fit.rms_error is None
    assert fit.value == pytest.approx(0.2, rel=1e-3)
    assert _step(capsys, str(out), *job) == pytest.approx(measured, rel=1e-4)
    # one measured step narrows the range as a calibration does, and grades it medium at best
    assert calibrated_mechanisms(Machine.from_config(load_topology(str(out))), "gpt2-medium") \
        == {"shm": None}
    assert main(["run", "-t", str(out), *job, "--json"]) == 0
    shm = json.loads(capsys.readouterr().out)["confidence"]["mechanisms"]["shm"]
    assert shm["grade"] == "medium" and "measured step" in shm["basis"]


def test_a_transport_fit_keeps_the_logs_other_fits(tmp_path):
    old = CalibrationConfig(source="logs", fitted=[
        FittedValue(parameter="shm_pcie_efficiency", value=0.5, source="logs"),
        FittedValue(parameter="shm_simple_sync_us", value=3.0, source="logs")])
    new = FittedValue(parameter="shm_pcie_efficiency", value=0.1, source="a step")
    merged = record.merged(old, transport=new, source="step")
    assert {(f.parameter, f.value) for f in merged.fitted} == {
        ("shm_pcie_efficiency", 0.1), ("shm_simple_sync_us", 3.0)}


@pytest.mark.parametrize(("flags", "says"), [
    (["-w", "gpt2-medium", "--gpus", "1", "--step-time", "0.2"], "no collectives between GPUs"),
    (["-w", "gpt2-medium", "--gpus", "2", "--step-time", "0.01"], "not the transport's"),
    (["-w", "llama2-7b-lora", "--gpus", "2", "--step-time", "1.5"], "hides its communication"),
])
def test_a_step_the_transport_cannot_explain_is_refused_in_one_line(capsys, tmp_path, flags,
                                                                    says):
    out = tmp_path / "never.yaml"
    assert main(["calibrate", "-t", "2x5090", *flags, "--fit", "transport",
                 "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err and not out.exists()


@pytest.mark.parametrize("seconds", ["nan", "inf", "abc", "0"])
def test_a_step_time_that_is_not_a_positive_number_is_one_line(capsys, seconds):
    assert main(["calibrate", "-t", "2x5090", "-w", "gpt2-medium", "--step-time", seconds]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--step-time" in err
