"""validate.py's `offload` section: offloaded training runs as their authors published them.

Every point of validation/offload.yaml is simulated on the machine and workload listed in
RUNS (validation/topologies, validation/workloads). Throughput is compared per GPU (a run
that reports seconds for a number of samples: samples x context / seconds); memory as the
framework printed it (fsdp_qlora's peak reserved memory, torchtune's "peak memory active",
the allocator's allocated peak). None of these points fixed a constant: the CPU optimizer's
rate comes from one core's streaming bandwidth and the cited kernel ratios (host.py), the
copies from the PCIe paths; every row is a check. A point that records a verdict (host
memory that did not hold the run) is checked by tests/test_validation.py, not printed.

offload.yaml's ``calibrated`` boxes: their other runs are simulated once more as a user who
calibrated the box from some of its runs would (``stepsim calibrate --step-time`` on one GPU
for compute, ``--fit transport`` on one multi-GPU run for the transport), each a prediction
marked ``box calibrated``. The runs it was calibrated on give no row: they reproduce their
steps by construction (tests/test_calibrate.py).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
WORKLOADS = ROOT / "validation" / "workloads"
TOPOLOGIES = ROOT / "validation" / "topologies"
OFFLOAD = ROOT / "validation" / "offload.yaml"


def _w(name: str) -> str:
    return str(WORKLOADS / f"{name}.yaml")


_WORKSTATION = {"topology": str(TOPOLOGIES / "2x4090-workstation.yaml"), "strategy": "fsdp"}

# point id -> how it is simulated: RunSpec fields, and which memory counter it printed
RUNS: dict[str, dict[str, Any]] = {
    "answerdotai-2x4090-llama2-7b-qlora-offload": {
        **_WORKSTATION, "workload": _w("fsdp-qlora-llama2-7b"), "offload": "params"},
    "answerdotai-2x4090-llama2-7b-qlora": {
        **_WORKSTATION, "workload": _w("fsdp-qlora-llama2-7b"), "micro_batch": 10},
    "answerdotai-2x4090-llama2-7b-lora-offload": {
        **_WORKSTATION, "workload": _w("fsdp-lora-llama2-7b"), "offload": "params"},
    "answerdotai-2x4090-llama2-7b-lora": {
        **_WORKSTATION, "workload": _w("fsdp-lora-llama2-7b"), "micro_batch": 6},
    "answerdotai-2x4090-llama2-70b-qlora-offload": {
        **_WORKSTATION, "workload": _w("fsdp-qlora-llama2-70b"), "offload": "params"},
    "answerdotai-2x4090-yi-34b-qlora-offload": {
        **_WORKSTATION, "workload": _w("fsdp-qlora-yi-34b"), "offload": "params",
        "micro_batch": 4},
    "answerdotai-2x4090-yi-34b-qlora": {**_WORKSTATION, "workload": _w("fsdp-qlora-yi-34b")},
    **{f"answerdotai-2x4090-mistral-7b-qlora-offload-c{seq}": {
        **_WORKSTATION, "workload": _w("fsdp-qlora-mistral-7b"), "offload": "params",
        "micro_batch": batch, "seq_len": seq} for batch, seq in ((12, 2048), (1, 24576))},
    "torchtune-8xa100-llama3.1-70b-full-offload": {
        "topology": "8xa100-nvswitch", "workload": _w("torchtune-llama3.1-70b"),
        "strategy": "fsdp", "offload": "params", "memory": "allocated"},
}
# ds_z3_offload.json: offload_optimizer and offload_param to the CPU with pin_memory true
_LLMQ = {"topology": str(TOPOLOGIES / "4x4090-llmq.yaml"), "strategy": "zero3",
         "offload": "params", "pin_memory": True}
for _size, _micro, _accum in (("3b", 64, 2), ("7b", 32, 4), ("14b", 21, 6), ("32b", 1, 1)):
    RUNS[f"llmq-4x4090-qwen2.5-{_size}-zero3-offload"] = {
        **_LLMQ, "workload": _w(f"llamafactory-qwen2.5-{_size}"), "micro_batch": _micro,
        "grad_accum": _accum}
RUNS["llmq-1x4090-qwen2.5-3b-zero2-offload"] = {
    **_LLMQ, "gpus": 1, "strategy": "zero2", "offload": "optimizer", "zero_overlap_comm": True,
    "workload": _w("llamafactory-qwen2.5-3b"), "micro_batch": 48, "grad_accum": 11}
for _size, _micro, _accum in (("7b", 32, 16), ("14b", 20, 26)):
    RUNS[f"llmq-1x4090-qwen2.5-{_size}-zero3-offload"] = {
        **_LLMQ, "gpus": 1, "workload": _w(f"llamafactory-qwen2.5-{_size}"),
        "micro_batch": _micro, "grad_accum": _accum}
_SPEC_KEYS = ("gpus", "micro_batch", "seq_len", "grad_accum", "offload", "pin_memory", "pp",
              "schedule", "zero_overlap_comm")


def _data() -> dict[str, Any]:
    import yaml

    with open(OFFLOAD, encoding="utf-8") as f:
        return dict(yaml.safe_load(f))


def load() -> list[dict[str, Any]]:
    return list(_data()["offload"])


CALIBRATED = "box calibrated"  # the op of a row simulated on a box calibrated from its runs


def measured_tokens_per_s(point: dict[str, Any]) -> float:
    from progress_bar import tokens_per_s

    if "tokens_per_s" in point or "tqdm_s_per_it" in point:
        return tokens_per_s(point)
    return point["samples"] * point["seq_len"] / point["seconds"]


def _isolated(result: Any, mechanism: str | None) -> str | None:
    """``mechanism`` where the run's collectives cross nothing less certain (NVLink, or none),
    else None."""
    from simulator.api.ranges import mechanisms_used

    return mechanism if set(mechanisms_used(result)) <= {"compute", "nvlink"} else None


def rows(points: list[dict[str, Any]], row_type: Any) -> list[Any]:
    """Per point: throughput per GPU and peak memory per GPU, simulated beside measured.
    An offloaded run's throughput is tagged with its offload mechanism (ranges.py: whose
    offload, and what it moves), so its spread sets the ranges and confidence grade of every
    run that offloads alike, where nothing less certain than the offload is in the run: on one
    GPU, or with collectives over NVLink. A run whose collectives cross host memory (SHM) or
    the network also carries that transport's spread (the four-GPU LLaMA-Factory runs: their
    box's SHM rate, docs/weak-spots.md), so it is tagged with nothing and checks the ranges,
    as a run without offload does. Each throughput carries the run's range, as a user's run
    would print it."""
    from validate_frameworks import memory_row

    from simulator.api import simulate
    from simulator.api.ranges import offload_mechanism
    from simulator.units import GiB

    out = []
    for point in points:
        if point["id"] not in RUNS:
            continue
        spec = _spec(point)
        if "host_fits" in point:  # a verdict, not a figure: tests/test_validation.py
            continue
        result = simulate(spec, baseline=False, ranges=True)
        r = result.report
        gpus = r["gpus"]
        label = f"offload {spec.offload}" if spec.offload != "none" else "no offload"
        out.append(row_type(point["id"], label, gpus, None, "tok/s/GPU",
                            measured_tokens_per_s(point) / gpus, r["tokens_per_s_per_gpu"],
                            _isolated(result, offload_mechanism(spec.strategy, spec.offload)),
                            r["topology"], tuple(r["tokens_per_s_per_gpu_range"])))
        if "peak_memory_gib" in point:
            counter = RUNS[point["id"]].get("memory", "reserved")
            out.append(memory_row(row_type, point, counter, gpus, result.memory,
                                  r["topology"]))
        if "host_used_gib" in point:  # the machine's, every rank's states and more
            out.append(row_type(point["id"], "host RAM", gpus, None, "memory GiB",
                                point["host_used_gib"],
                                result.memory["host_peak_bytes"] / GiB, None, r["topology"]))
    return out + calibrated_rows(points, row_type)


def _spec(point: dict[str, Any], topology: str | None = None) -> Any:
    from validate_frameworks import software_flag

    from simulator.api import RunSpec

    setup = RUNS[point["id"]]
    return RunSpec(topology or setup["topology"], setup["workload"], setup["strategy"],
                   software=software_flag(point),
                   **{k: setup[k] for k in _SPEC_KEYS if k in setup})


def _seconds(point: dict[str, Any]) -> float:
    """A point's measured step, seconds."""
    return float(point["tokens_per_step"]) / measured_tokens_per_s(point)


@functools.cache
def _calibration(box: int) -> Any:
    """The ``calibrated`` box's calibration block as `stepsim calibrate` builds it from the
    box's runs: each one-GPU run's achieved compute (``--step-time``), then on top of them the
    transport that gives the ``fit`` run's step (``--fit transport``). Once a process: each
    fit simulates its run some twenty times."""
    import tempfile

    from simulator.calibration import compute_step, record, transport_step

    entry = _data()["calibrated"][box]
    by_id = {p["id"]: p for p in load()}
    calibration = None
    for point_id in entry.get("compute", []):
        point = by_id[point_id]
        calibration = record.merged(calibration,
                                    compute=compute_step.fit(_spec(point), _seconds(point)))
    with tempfile.TemporaryDirectory() as folder:
        path = _write(folder, entry["machine"], calibration)
        fitted = transport_step.fit(_spec(by_id[entry["fit"]], path),
                                    _seconds(by_id[entry["fit"]])).fitted
    return record.merged(calibration, transport=fitted)


def _write(folder: str, machine: str, calibration: Any) -> str:
    """The topology with its calibration block, as `stepsim calibrate -o` writes it."""
    from simulator.calibration import record

    path = Path(folder) / Path(machine).name
    text = (ROOT / machine).read_text(encoding="utf-8")
    path.write_text(record.render(text, calibration) if calibration else text,
                    encoding="utf-8")
    return str(path)


def calibrated_rows(points: list[dict[str, Any]], row_type: Any) -> list[Any]:
    """Each calibrated box's ``predict`` runs on the box calibrated from its other runs."""
    import tempfile

    from simulator.api import simulate

    by_id = {p["id"]: p for p in points}
    out = []
    for box, entry in enumerate(_data().get("calibrated", [])):
        with tempfile.TemporaryDirectory() as folder:
            path = _write(folder, entry["machine"], _calibration(box))
            for point_id in entry["predict"]:
                point = by_id[point_id]
                r = simulate(_spec(point, path), baseline=False, ranges=True).report
                gpus = r["gpus"]
                out.append(row_type(point["id"], CALIBRATED, gpus, None, "tok/s/GPU",
                                    measured_tokens_per_s(point) / gpus,
                                    r["tokens_per_s_per_gpu"], None, r["topology"],
                                    tuple(r["tokens_per_s_per_gpu_range"])))
    return out
