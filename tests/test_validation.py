"""scripts/validate.py: every collective measurement is simulated and the errors stay small."""

import functools
import importlib.util
import statistics
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent


def load_script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


validate = load_script("validate")
validate_offload = load_script("validate_offload")


@pytest.fixture(scope="module")
def rows():
    return validate.collective_rows(validate.load_measurements())


def test_every_collective_dataset_with_points_is_simulated(rows):
    data = validate.load_measurements()
    with_points = {e["id"] for e in data["collectives"] if e.get("table") or e.get("points")}
    assert with_points == {r.id for r in rows}
    expected = sum(len(e.get("points", [])) + len(e.get("table", {}).get("bytes", []))
                   + len(e.get("also", {}).get("allgather_busbw_gbps", {}))
                   for e in data["collectives"] if e["id"] in with_points)
    assert len(rows) == expected


def test_measurements_carry_their_sources():
    data = validate.load_measurements()
    for section in ("collectives", "training", "rules"):
        for entry in data[section]:
            assert entry.get("source"), entry["id"]


def test_checks_have_a_small_median_error_and_fits_hold(rows):
    checks = [abs(r.error) for r in rows if r.role == "check"]
    assert len(checks) >= 15
    assert statistics.median(checks) < 0.05  # predictions, not the points constants came from
    for r in rows:
        if r.role == "fit":  # one constant per mechanism reproduces each point it was fitted on
            assert abs(r.error) < 0.05, r


def test_script_prints_table_and_summary(capsys):
    assert validate.main(["--section", "collectives"]) == 0
    out = capsys.readouterr().out
    assert "measured" in out and "simulated" in out and "median |error|" in out


def test_training_section_runs(capsys):
    assert validate.main(["--section", "training"]) == 0
    assert "== training ==" in capsys.readouterr().out


def test_new_workloads_match_their_cited_parameter_counts():
    from simulator.inputs.config import load_workload
    from simulator.job.workload import Job

    resnet = Job.from_config(load_workload(str(ROOT / "workloads" / "resnet50.yaml")))
    assert sum(p.numel for p in resnet.params) == 25_557_032  # torchvision resnet50
    assert len(resnet.params) == 161  # torchvision registers 161 parameter tensors
    bert = Job.from_config(load_workload(str(ROOT / "workloads" / "bert-large-squad.yaml")))
    assert sum(p.numel for p in bert.params) == 334_094_338  # HF BertForQuestionAnswering
    assert len(bert.params) == 5 + 24 * 16 + 2


def test_resnet50_buckets_as_pytorch_1_4_built_them():
    # the README's run (PyTorch 1.4): [1 MiB, cap] over torchvision's 161 tensors in
    # registration order, reversed; the largest tensor is layer4's 3x3 conv, 512x512x3x3
    from simulator.inputs.config import load_workload
    from simulator.job.workload import Job
    from simulator.strategies.buckets import MIB, legacy_bucket_plan
    from simulator.strategies.ddp import grad_tensors

    tensors = grad_tensors(Job.from_config(load_workload(str(ROOT / "workloads" /
                                                             "resnet50.yaml"))))
    assert max(t.numel for t in tensors) == 512 * 512 * 9
    small, default = legacy_bucket_plan(tensors, 1), legacy_bucket_plan(tensors, 25)
    assert (len(small), len(default)) == (35, 5)
    # the stem, layer1 and the first of layer2's tensors: reduced last in both plans
    assert small[-1].indices == default[-1].indices and small[-1].bytes < 1.6 * MIB


def test_dgx1_small_buckets_cost_throughput_as_measured():
    # pytorch benchmarks/distributed/ddp/README.md: bucket_cap_mb=1 is 2.6% slower than 25 at
    # 8 GPUs; the sign is the check (the size is the README's weak spot)
    rows = validate.training_rows(validate.load_measurements())
    losses = {r.gpus: r for r in rows if r.op == "bucket 1 v 25"}
    assert losses[8].measured == pytest.approx(2.6)
    assert all(r.simulated > 0 for r in losses.values())


def test_lambda_h100_bert_large_steady_scaling():
    # deeplearning-benchmark's 8x H100 SXM5 logs: 2.825 / 2.77 / 2.755 / 2.74 it/s at batch
    # 112 per GPU on 1 / 2 / 4 / 8 GPUs, an overlapped fp16 all-reduce over NVSwitch (apex
    # DDP under amp O2: 2-byte gradients); the 2-3% the box loses is not all modelled
    rows = validate.training_rows(validate.load_measurements())
    steady = [r for r in rows if r.quantity == "steady eff" and r.op.startswith("H100")]
    assert [(r.id, r.gpus) for r in steady] == [("lambda-bert-large-scaling", 2),
                                                ("lambda-bert-large-scaling", 4),
                                                ("lambda-bert-large-scaling", 8),
                                                ("lambda-bert-large-h100-2024", 8)]
    assert all(abs(r.error) < 0.03 for r in steady)  # the 2024 stack's too (PyTorch 2.3)


def test_new_training_datasets_are_simulated_and_printed(capsys):
    rows = validate.training_rows(validate.load_measurements())
    ids = {r.id for r in rows}
    assert {"v100-ddp-bucket-size", "lambda-bert-large-scaling"} <= ids
    bert = [r for r in rows if r.id == "lambda-bert-large-scaling"]
    assert len([r for r in bert if r.quantity == "seq/s"]) == 4 + 4 + 2 + 2
    assert len([r for r in bert if r.quantity == "scaling eff"]) == 4
    assert len([r for r in bert if r.quantity == "steady eff"]) == 3 + 3 + 1 + 1
    v100 = [r for r in rows if r.id == "v100-ddp-bucket-size"]
    assert [r.quantity for r in v100] == ["sec/iter", "sec/iter"] + ["tput loss %"] * 3
    assert all(r.simulated == r.simulated and r.simulated != 0 for r in rows)  # no NaN or zero
    assert validate.main(["--section", "training"]) == 0
    out = capsys.readouterr().out
    assert "lambda-bert-large-scaling" in out and "v100-ddp-bucket-size" in out


def test_the_four_gemm_points_are_within_five_percent() -> None:
    rows = validate.gemm_rows(validate.load_all())
    assert len(rows) == 4
    assert all(abs(r.error) <= 0.05 for r in rows), [(r.id, r.error) for r in rows]


def _framework_rows() -> dict[tuple[str, str], float]:
    rows = validate.framework_rows(validate.load_all())
    return {(r.id, r.quantity): r.error for r in rows}


def test_framework_memory_points_allocated_close_and_reserved_within_ten_percent() -> None:
    """Allocated peaks (torchtune's three, its 4090 QLoRA, fsdp_qlora's two batch-1 LoRA runs)
    within 5%; reserved peaks within 10%: fsdp_qlora's ten on two 3090s from a replay of its
    allocator after the wrap (step_replay.py), torchtitan's from the published median overhead
    (allocator.py); fsdp_qlora's logged set-up (fsdp_wrap.py) within 10%."""
    import statistics

    errors = _framework_rows()
    memory = {k[0]: e for k, e in errors.items() if k[1] == "memory GiB"}
    setup = {k: e for k, e in memory.items() if k.endswith("-wrap")}
    reserved = {k: e for k, e in memory.items() if "reserved" in k or "torchtitan" in k}
    allocated = {k: e for k, e in memory.items() if k not in reserved and k not in setup}
    assert (len(allocated), len(reserved), len(setup)) == (6, 11, 1)
    # the set-up replayed through the allocator (fsdp_wrap.py): fsdp_qlora's logged 3.72 GiB
    assert all(abs(e) <= 0.10 for e in setup.values()), setup
    assert all(abs(e) <= 0.05 for e in allocated.values()), allocated
    assert statistics.median(abs(e) for e in reserved.values()) <= 0.08, reserved
    assert all(abs(e) <= 0.10 for e in reserved.values()), reserved


def test_torchtune_eager_and_compiled_throughput_within_ten_percent() -> None:
    errors = _framework_rows()
    for row in ("torchtune-a100-llama3.2-3b-packed-eager",
                "torchtune-a100-llama3.2-3b-packed-compile"):
        assert abs(errors[(row, "tok/s/GPU")]) <= 0.10, (row, errors[(row, "tok/s/GPU")])


def test_the_torchtitan_h100_row_fits_on_its_96_gb_cards() -> None:
    from simulator.api import RunSpec, simulate

    root = validate.ROOT / "validation"
    spec = RunSpec(str(root / "topologies" / "8xh100-96gb-500w.yaml"),
                   str(root / "workloads" / "torchtitan-llama3.1-8b.yaml"), "fsdp",
                   kernels="compiled")
    r = simulate(spec, baseline=False)
    assert r.memory["fits"] and r.report["recipe"]["activation_checkpointing"] == "op"


@functools.cache
def _offload_row_list() -> tuple[Any, ...]:
    return tuple(validate.offload_rows(validate.load_all()))


def _offload_rows() -> dict[tuple[str, str], float]:
    return {(r.id, r.op): r.error for r in _offload_row_list()}


def test_offloaded_fsdp_throughput_is_within_ten_percent_of_every_published_run() -> None:
    rows = [r for r in _offload_row_list() if r.op != validate_offload.CALIBRATED]
    assert all(r.role == "check" for r in rows)  # no point fixed a constant
    throughput = {r.id: r.error for r in rows if r.quantity == "tok/s/GPU"
                  and not r.id.startswith("llmq")}
    # fsdp_qlora's 2 x 4090 rows and torchtune's 8 x A100 row; the Mistral run at 24,576
    # tokens of context is slow by a fifth (docs/weak-spots.md: long-context attention on
    # GeForce), the one at 2,048 is held to the rest's tolerance
    long_context = throughput.pop("answerdotai-2x4090-mistral-7b-qlora-offload-c24576")
    assert len(throughput) == 9
    assert all(abs(e) <= 0.10 for e in throughput.values()), throughput
    assert -0.25 <= long_context < 0


# Memory tolerances, per source:
# - torchtune README (70B full, 8 x A100, CPU offload): its "peak memory" is the allocated
#   peak, the model's exact tensors: 10%.
# - AnswerDotAI fsdp_qlora benchmarks_03_2024.md, dual 4090: peak *reserved* memory of runs
#   whose batch was raised until the card was nearly full, from a replay of the caching
#   allocator over the FSDP wrap and the steps after it (simulator/memory/step_replay.py),
#   which leaves out the kernels' own temporaries: 10%.
# - IST-DASLab/llmq 4090x4.md: DeepSpeed's host memory in use after the optimizer's setup
#   (the whole machine's): 10%.
OFFLOAD_MEMORY_TOLERANCE = {
    ("torchtune-8xa100-llama3.1-70b-full-offload", "allocated pea"): 0.10,
    ("answerdotai-2x4090-llama2-7b-qlora-offload", "reserved peak"): 0.10,
    ("answerdotai-2x4090-llama2-7b-qlora", "reserved peak"): 0.10,
    ("answerdotai-2x4090-llama2-7b-lora-offload", "reserved peak"): 0.10,
    ("answerdotai-2x4090-llama2-7b-lora", "reserved peak"): 0.10,
    ("answerdotai-2x4090-llama2-70b-qlora-offload", "reserved peak"): 0.10,
    ("answerdotai-2x4090-mistral-7b-qlora-offload-c2048", "reserved peak"): 0.10,
    ("answerdotai-2x4090-mistral-7b-qlora-offload-c24576", "reserved peak"): 0.10,
    ("llmq-4x4090-qwen2.5-14b-zero3-offload", "host RAM"): 0.10,
}


@pytest.mark.parametrize("key", list(OFFLOAD_MEMORY_TOLERANCE), ids="/".join)
def test_offloaded_memory_is_within_its_sources_tolerance(key: tuple[str, str]) -> None:
    errors = _offload_rows()
    assert abs(errors[key]) <= OFFLOAD_MEMORY_TOLERANCE[key], (key, errors[key])


def test_the_llmq_box_calibrated_on_its_own_runs_predicts_its_other_four_gpu_runs() -> None:
    """`stepsim calibrate` as a user would run it on llmq's box: each one-GPU run's compute
    (--step-time), then the four-GPU 7B step's SHM rate (--fit transport, unpublished). On
    the calibrated box the four-GPU 3B and 14B runs are predictions, within 10% where
    uncalibrated they are 11% and 75% fast."""
    calibration = validate_offload._calibration(0)
    (transport,) = calibration.fitted
    assert transport.parameter == "shm_pcie_efficiency" and transport.value < transport.default
    assert {c.workload for c in calibration.compute} == {
        f"llamafactory-qwen2.5-{size}" for size in ("3b", "7b", "14b")}
    calibrated = {r.id: r for r in _offload_row_list() if r.op == validate_offload.CALIBRATED}
    assert sorted(calibrated) == ["llmq-4x4090-qwen2.5-14b-zero3-offload",
                                  "llmq-4x4090-qwen2.5-3b-zero3-offload"]
    assert all(r.role == "check" and abs(r.error) <= 0.10 for r in calibrated.values())
    uncalibrated = _offload_rows()[("llmq-4x4090-qwen2.5-14b-zero3-offload", "offload params")]
    assert uncalibrated > 0.5  # what the box's unknown transport costs an uncalibrated answer


def test_the_32b_run_that_ran_out_of_host_memory_does_not_fit_the_host() -> None:
    """llmq's LLaMA-Factory Qwen2.5-32B ZeRO-3 offload on four 4090s and 503 GiB of RAM ran out
    of host memory while DeepSpeed set up the optimizer: 18 B x 32.8 B parameters = 549 GiB."""
    from simulator.api import RunSpec, simulate

    [point] = [p for p in validate_offload.load() if p["id"].startswith("llmq-4x4090-qwen2.5-32b")]
    setup = validate_offload.RUNS[point["id"]]
    spec = RunSpec(setup["topology"], setup["workload"], setup["strategy"],
                   offload=setup["offload"])
    memory = simulate(spec, baseline=False).memory
    assert point["host_fits"] is False and not memory["host_fits"]
    assert memory["host_peak_bytes"] > memory["host_capacity_bytes"]


@pytest.mark.parametrize("size", ["3b", "7b", "14b"])
def test_the_llamafactory_runs_that_ran_fit_their_gpus(size: str) -> None:
    """llmq's LLaMA-Factory runs on four 24 GB 4090s ran (and were timed): with Liger's fused
    linear cross-entropy no logits are kept, so each fits (the 3B's saved logits alone, 64 x
    1,024 tokens x 151,936 x 2 B, would have been 18.5 GiB)."""
    from simulator.api import RunSpec, simulate

    [point_id] = [i for i in validate_offload.RUNS if i.startswith(f"llmq-4x4090-qwen2.5-{size}-")]
    setup = validate_offload.RUNS[point_id]
    spec = RunSpec(setup["topology"], setup["workload"], setup["strategy"],
                   **{k: setup[k] for k in validate_offload._SPEC_KEYS if k in setup})
    assert simulate(spec, baseline=False).memory["fits"]


def test_alltoall_section_every_row_carries_a_source_and_stays_within_its_band() -> None:
    """validation/alltoall.yaml: the SHM all-to-all plateau within 20 % (the model moves both
    ranks' halves through the uplink at the all-reduce's SHM efficiency; the measured rate is
    15 % above), and every GPU pair writing at once within 10 % of the published aggregate.
    The latency floor (under 64 KiB) is left out: nccl-tests' one thread posting every task
    of every GPU is not modelled (docs/accuracy.md)."""
    import yaml

    data = yaml.safe_load((ROOT / "validation" / "alltoall.yaml").read_text())
    assert all(e.get("source") for section in data.values() for e in section)
    rows = validate.alltoall_rows({})
    assert len(rows) == sum(len(e["rows"]) for e in data["nccl_tests"]) + len(data["fabric"])
    for r in rows:
        if r.op == "pair-writes":
            assert abs(r.error) < 0.10, r
        elif r.bytes is not None and r.bytes >= 1 << 20:
            assert abs(r.error) < 0.20, r


def test_the_four_4090_offload_runs_agree_at_the_shm_rate_a_sibling_box_measured(
        tmp_path: Path) -> None:
    """llmq's box publishes no nccl-tests log. Calibrated on the one published log of another
    4x RTX 4090 box without P2P (kalavai B5: 2.59 GB/s all-reduce bus bandwidth), as a user
    would (`stepsim calibrate`), its LLaMA-Factory ZeRO-3 offload runs at 3B and 7B come
    within 10%, and the 14B run is off by what the same recipe on one of those GPUs, with no
    collective at all, is off: what the uncalibrated rows miss is the box's SHM rate, not the
    fetch path (docs/weak-spots.md)."""
    from simulator.api import RunSpec, simulate
    from simulator.cli import main

    calibrated = tmp_path / "4x4090-llmq-b5.yaml"
    assert main(["calibrate", "-t", str(ROOT / "validation/topologies/4x4090-llmq.yaml"),
                 str(ROOT / "tests/fixtures/real-inputs/B5.nccl-tests.log"),
                 "-o", str(calibrated)]) == 0
    points = {p["id"]: p for p in validate_offload.load()}

    def error(point_id: str, topology: str, gpus: int) -> float:
        setup = validate_offload.RUNS[point_id]
        spec = RunSpec(topology, setup["workload"], setup["strategy"],
                       **{k: setup[k] for k in validate_offload._SPEC_KEYS if k in setup})
        simulated = simulate(spec, baseline=False).report["tokens_per_s_per_gpu"]
        return simulated / (validate_offload.measured_tokens_per_s(points[point_id]) / gpus) - 1

    four = {size: error(f"llmq-4x4090-qwen2.5-{size}-zero3-offload", str(calibrated), 4)
            for size in ("3b", "7b", "14b")}
    one = error("llmq-1x4090-qwen2.5-14b-zero3-offload",
                validate_offload.RUNS["llmq-1x4090-qwen2.5-14b-zero3-offload"]["topology"], 1)
    assert abs(four["3b"]) <= 0.10 and abs(four["7b"]) <= 0.10, four
    assert abs(four["14b"] - one) <= 0.05, (four, one)


def test_the_default_shm_rate_is_the_one_the_fsdp_qlora_workstation_ran_at(
        tmp_path: Path) -> None:
    """No-P2P boxes come in two modes (validation/box-spread.yaml). fsdp_qlora's bare-metal
    dual-4090 workstation runs FSDP steps whose time moves with the SHM rate: at the default
    (the link-bound mode) its LoRA and Yi 34B runs are within 10%, and at the slow mode another
    dual 4090 measured (kalavai B4, 2.24 GB/s) they would be more than 15% slow, so the
    default is not lowered toward the slow boxes (docs/weak-spots.md)."""
    from simulator.api import RunSpec, simulate
    from simulator.cli import main

    slow = tmp_path / "2x4090-workstation-b4.yaml"
    assert main(["calibrate", "-t", str(ROOT / "validation/topologies/2x4090-workstation.yaml"),
                 str(ROOT / "tests/fixtures/real-inputs/B4.nccl-tests.log"),
                 "-o", str(slow)]) == 0
    points = {p["id"]: p for p in validate_offload.load()}

    def error(point_id: str, topology: str | None) -> float:
        setup = validate_offload.RUNS[point_id]
        spec = RunSpec(topology or setup["topology"], setup["workload"], setup["strategy"],
                       **{k: setup[k] for k in validate_offload._SPEC_KEYS if k in setup})
        simulated = simulate(spec, baseline=False, ranges=False).report["tokens_per_s_per_gpu"]
        return simulated / (validate_offload.measured_tokens_per_s(points[point_id]) / 2) - 1

    for point_id in ("answerdotai-2x4090-llama2-7b-lora", "answerdotai-2x4090-yi-34b-qlora"):
        assert abs(error(point_id, None)) <= 0.10, point_id
        assert error(point_id, str(slow)) < -0.15, point_id


def test_a_progress_bars_second_step_is_read_as_tqdm_averages_it() -> None:
    """tqdm's s/it after two steps is (x2 + 0.7 x1) / 1.7 (a bias-corrected moving average,
    smoothing 0.3): reading it back gives x2, where llmq's 2 x s/it - x1 does not. Its 14B
    bar's elapsed times (03:41 after one step, 07:01 after two) say the second took 200 s."""
    progress_bar = load_script("progress_bar")
    first, second = 221.55, 200.0
    shown = (second + 0.7 * first) / 1.7
    assert progress_bar.second_step_seconds(first, shown) == pytest.approx(second)
    assert progress_bar.second_step_seconds(221.55, 208.87) == pytest.approx(421 - 221.55,
                                                                           abs=1.0)
    assert 2 * 208.87 - 221.55 < 197  # the arithmetic reading is 2% short
