"""`stepsim calibrate`: recovers known parameters from logs stepsim wrote with noise, predicts the
rest of a real log from part of it, refuses what the logs cannot tell, and records it all."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from simulator.calibration import collectives_fit, record
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
     {"simple_channel_cap_gbps": 9.0, "p2p_simple_sync_us": 3.0}),
])
def test_recovers_known_parameters_from_noisy_stepsim_logs(tmp_path, preset, truth):
    log = synthetic_log(tmp_path, truth_topology(tmp_path, preset, truth), "allreduce", 0.02)
    machine = Machine.from_config(load_topology(preset))
    result = collectives_fit.fit(Communicator(machine), [nccl_tests_log.parse(log.read_text())],
                                 None)
    for name, value in truth.items():
        assert result.fitted[name] == pytest.approx(value, rel=0.15), name
    assert result.rms_error < 0.04  # the noise, not a misfit


# (log, machine, --fit-max): fitted up to 64M, or 2G where the log starts at 1G
REAL_FITS = [
    ("B8", "2x2080ti-switch", "64M"),
    ("B4", str(VALIDATION / "2x4090-docker-switch.yaml"), "64M"),
    ("B5", str(VALIDATION / "4x4090-docker-2switch.yaml"), "64M"),
    ("B12", str(VALIDATION / "2xa40-node-no-p2p.yaml"), "2G"),
]


@pytest.mark.parametrize("name, topology, fit_max", REAL_FITS)
def test_fitted_on_part_of_a_real_log_it_predicts_the_rest(capsys, tmp_path, name, topology,
                                                             fit_max):
    out = tmp_path / "cal.yaml"
    assert main(["calibrate", "-t", topology, str(REAL / f"{name}.nccl-tests.log"),
                 "--fit-max", fit_max, "-o", str(out)]) == 0
    text = capsys.readouterr().out
    predicted = [line.split() for line in text.splitlines() if line.endswith("predict")]
    assert predicted
    for fields in predicted:
        assert abs(float(fields[3].rstrip("%"))) <= 10.0, fields
    cal = load_topology(str(out)).calibration
    assert cal is not None and cal.fitted and all(f.source and f.rms_error is not None
                                                  for f in cal.fitted)


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
