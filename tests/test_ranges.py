"""Ranges: from the validation residuals of the mechanisms a run uses, by re-simulation."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import yaml

from simulator import api
from simulator.api import ranges
from simulator.cli import main

ROOT = Path(__file__).resolve().parent.parent


def ranged(topology: str, workload: str, strategy: str = "ddp", **kw: object) -> dict:
    return api.simulate(api.RunSpec(topology, workload, strategy, **kw),  # type: ignore[arg-type]
                        ranges=True).report


@pytest.mark.parametrize(("topology", "workload", "strategy"), [
    ("8x5090-switch", "llama2-7b-lora", "ddp"), ("2x5090", "llama3.2-1b", "tp"),
    ("8xh100-nvswitch", "gpt2-medium", "fsdp"), ("1x4090", "gpt2-medium", "ddp")])
def test_every_headline_range_holds_its_point(topology: str, workload: str, strategy: str
                                              ) -> None:
    r = ranged(topology, workload, strategy)
    keys = ranges.HEADLINE + (("scaling_efficiency",) if r["scaling_efficiency"] else ())
    for key in keys:
        low, high = r[f"{key}_range"]
        assert low <= r[key] <= high, key
    # the slow end is slower: a real spread, not a fixed percentage around the point
    low, high = r["step_time_s_range"]
    assert high > r["step_time_s"]


def test_mechanisms_are_those_the_collectives_cross() -> None:
    def used(topology: str, gpus: int | None = None) -> list[str]:
        return ranges.mechanisms_used(api.simulate(api.RunSpec(topology, "gpt2-medium",
                                                               gpus=gpus)))
    assert used("8x5090-switch", 1) == ["compute"]
    assert used("8x5090-switch") == ["compute", "shm"]
    assert used("8x5090-switch-p2p") == ["compute", "pcie_p2p"]
    assert used("8xh100-nvswitch") == ["compute", "nvlink"]


@pytest.mark.parametrize(("strategy", "flags"), [
    ("ddp", {}), ("zero1", {}), ("zero3", {"offload": "params"}), ("fsdp", {}), ("tp", {}),
    ("tp+fsdp", {"tp": 2}), ("ddp", {"pp": 2, "grad_accum": 4})])
def test_a_transport_alone_rerun_runs_the_points_programs(strategy: str,
                                                          flags: dict[str, object]) -> None:
    """The width shares' step-time re-runs reuse the point's programs where only transports
    change: so no strategy may read a transport's rate, and ``step_time`` is the step's."""
    from dataclasses import replace

    from simulator.machine.scales import RateScales

    spec = api.RunSpec("8x5090-switch", "llama3.2-1b", strategy, **flags)  # type: ignore[arg-type]
    point = api.simulate(spec, baseline=False)
    for scales in (RateScales(shm=0.6), RateScales(compute=0.8, shm=1.3)):
        again = api.simulate(replace(point.spec, scales=scales), baseline=False)
        if scales.compute == 1.0:
            assert again.programs == point.programs
        alone = api.step_time(replace(point.spec, scales=scales),
                              point.programs if scales.compute == 1.0 else None)
        assert alone == again.report["step_time_s"] != point.report["step_time_s"]


def test_an_uncalibrated_no_p2p_box_is_wide_and_says_shm_sets_it() -> None:
    r = ranged("2x5090", "llama3.2-1b", "tp")
    basis = r["range_basis"]
    assert basis["dominant"] == "shm"
    assert basis["mechanisms"]["shm"]["basis"].startswith("uncalibrated")
    assert "host memory" in basis["summary"] and "nccl-tests" in basis["summary"]
    low, high = r["step_time_s_range"]
    assert high / r["step_time_s"] > 1.3  # no-P2P boxes differ by several times


def test_ranges_narrow_on_the_box_the_mechanism_was_fitted_on(tmp_path: Path) -> None:
    # 2x2080ti-switch is the box whose nccl-tests log fixed the SHM efficiency; the same file
    # under another name is an uncalibrated box of the same shape
    source = ROOT / "topologies" / "2x2080ti-switch.yaml"
    config = yaml.safe_load(source.read_text())
    config["name"] = "my-2x2080ti"
    copy = tmp_path / "my-2x2080ti.yaml"
    copy.write_text(yaml.safe_dump(config))
    # fp16, as a Turing card trains (bf16 is emulated there, and compute would swamp the SHM)
    fitted = ranged(str(source), "gpt2-medium", precision="fp16")
    other = ranged(str(copy), "gpt2-medium", precision="fp16")
    assert fitted["step_time_s"] == pytest.approx(other["step_time_s"])

    def width(r: dict) -> float:
        low, high = r["step_time_s_range"]
        return high - low
    assert width(fitted) < 0.5 * width(other)
    assert fitted["range_basis"]["mechanisms"]["shm"]["basis"].startswith("fitted")


def test_the_calibrated_spread_is_narrower_than_the_uncalibrated_one() -> None:
    entry = ranges.residual_table()["shm"]
    low, high = ranges.calibrated_spread(entry)
    assert entry["low"] < low < 1 < high < max(entry["high"], 1.5)


def test_cost_ranges_follow_the_step_ranges(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "-t", "2x5090", "-w", "gpt2-medium", "--price-per-gpu-hour", "1",
                 "--train-tokens", "1B", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    cost = r["cost"]
    low, high = r["step_time_s_range"]
    assert cost["usd_per_step_range"] == pytest.approx([2 / 3600 * low, 2 / 3600 * high])
    assert cost["usd_per_million_tokens_range"][0] <= cost["usd_per_million_tokens"]
    assert cost["usd_to_train_range"][1] >= cost["usd_to_train"]


def test_text_prints_the_range_beside_the_figure_and_what_sets_it(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "-t", "2x5090", "-w", "gpt2-medium"]) == 0
    out = capsys.readouterr().out
    step_row = next(line for line in out.splitlines() if "step time" in line)
    assert "(" in step_row and "-" in step_row.split("(")[1]
    assert "range: " in out and "sets" in out
    assert main(["run", "-t", "2x5090", "-w", "gpt2-medium", "--no-ranges", "--json"]) == 0
    assert "step_time_s_range" not in json.loads(capsys.readouterr().out)


def test_the_residual_table_is_what_validate_gives_now() -> None:
    spec = importlib.util.spec_from_file_location("validate", ROOT / "scripts" / "validate.py")
    assert spec and spec.loader
    validate = importlib.util.module_from_spec(spec)
    sys.modules["validate"] = validate
    spec.loader.exec_module(validate)
    fresh = validate.residual_table(validate.all_rows())
    stored = json.loads((ROOT / "validation" / "residuals.json").read_text())["mechanisms"]
    assert fresh == stored, ("validation/residuals.json is stale: run "
                             "`python scripts/validate.py --write-residuals`")


def test_a_topology_calibrated_on_its_own_logs_narrows_its_range(tmp_path: Path) -> None:
    from simulator.nccl import wire

    config = yaml.safe_load((ROOT / "topologies" / "2x5090.yaml").read_text())
    config["name"] = "my-2x5090"
    plain = tmp_path / "plain.yaml"
    plain.write_text(yaml.safe_dump(config))
    # what `stepsim calibrate` writes: the SHM efficiency it fitted (here the default, so the
    # point stays put) and the fit's rms error over the log's rows
    config["calibration"] = {"source": "all_reduce_perf log", "fitted": [
        {"parameter": "shm_pcie_efficiency", "value": wire.SHM_PCIE_EFFICIENCY,
         "source": "all_reduce_perf -b 8 -e 8G", "rms_error": 0.03}]}
    calibrated = tmp_path / "calibrated.yaml"
    calibrated.write_text(yaml.safe_dump(config))
    before = ranged(str(plain), "llama3.2-1b", "tp")
    after = ranged(str(calibrated), "llama3.2-1b", "tp")
    assert after["step_time_s"] == pytest.approx(before["step_time_s"])
    shm = after["range_basis"]["mechanisms"]["shm"]
    assert (shm["low"], shm["high"]) == pytest.approx((0.94, 1.06))
    assert "calibrated" in shm["basis"]

    def width(r: dict) -> float:
        return r["step_time_s_range"][1] - r["step_time_s_range"][0]
    assert width(after) < 0.5 * width(before)


def test_an_offloaded_run_is_ranged_over_its_offloads_spread() -> None:
    """One RTX 4090, ZeRO-3 with parameters in host RAM: the step waits on the copies and the
    CPU optimizer, so the offload's spread (its one-GPU validation runs, 0.88-0.98x) widens the
    range, where compute alone left it 0.01 s wide; the copies' flows carry the factor."""
    from simulator.machine import host
    from simulator.machine.scales import RateScales

    report = api.simulate(api.RunSpec("1x4090", "llama2-7b", "zero3", offload="params",
                                      checkpointing="full"), baseline=False,
                          ranges=True).report
    low, high = report["step_time_s_range"]
    spread = report["range_basis"]["mechanisms"]["offload"]
    assert high / report["step_time_s"] > 1 / spread["low"] - 0.05 and spread["low"] < 0.95
    assert report["range_basis"]["dominant"] == "offload"
    assert report["range_basis"]["summary"].startswith(
        "range: DeepSpeed ZeRO-3 parameter offload sets")
    machine = api.load_machine("1x4090")
    point, slow = (host.copy_flow(m, 0, 1e9, to_host=True)
                   for m in (machine, machine.with_scales(RateScales(offload=0.5))))
    assert [w for _, w in slow.usage] == pytest.approx([2 * w for _, w in point.usage])
