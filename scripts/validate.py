"""Run stepsim on every published measurement in validation/measurements.yaml,
validation/pcie-p2p.yaml, validation/frameworks.yaml, validation/offload.yaml and
validation/alltoall.yaml and validation/multinode.yaml.

Prints one row per point (id, op, gpus, bytes, measured, simulated, error %) and then the
median and worst |error|. Sections: ``collectives`` (nccl-tests numbers), ``training`` (step
throughput), ``frameworks`` (training runs as frameworks publish them), ``offload``
(offloaded runs: FSDP CPU offload on a dual-4090 workstation and 8 A100s), ``gemm`` (one
large GEMM per GPU), ``boxes`` (no-P2P boxes of
validation/box-spread.yaml, simulated from the machine a user would describe), ``alltoall``
(validation/alltoall.yaml: nccl-tests all-to-all, and every GPU pair writing at once) and
``multinode`` (collectives across boxes, validation/multinode.yaml:
scripts/validate_multinode.py); each
section is one function returning rows, listed in SECTIONS. Always exits 0: it reports, the
tests hold the tolerances.

Each row names the mechanism it measures (``shm``, ``pcie_p2p``, ``nvlink`` collectives,
``compute:<GPU line>`` for one-GPU steps; simulator/machine/scales.py). ``--write-residuals`` writes
their spread per mechanism to validation/residuals.json, which the ranges read
(simulator/api/ranges.py, docs/ranges.md). ``--markdown`` writes the same tables as
docs/accuracy.md (tests/test_docs.py checks the file is what the script writes now).

    python scripts/validate.py [--section NAME|all] [--write-residuals] [--markdown]
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
# This checkout's simulator (not whichever stepsim is installed) and its sibling scripts.
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]

from simulator.catalog import gpus as gpu_catalog  # noqa: E402
from simulator.inputs.config import load_topology  # noqa: E402
from simulator.machine.topology import Machine  # noqa: E402
from simulator.nccl import collectives  # noqa: E402
from simulator.nccl.communicator import Communicator  # noqa: E402
from simulator.nccl.env import NcclEnv  # noqa: E402
from simulator.nccl.perf import time_alone  # noqa: E402

MEASUREMENTS = ROOT / "validation" / "measurements.yaml"
FRAMEWORKS = ROOT / "validation" / "frameworks.yaml"
BOX_SPREAD = ROOT / "validation" / "box-spread.yaml"
RESIDUALS = ROOT / "validation" / "residuals.json"
PCIE_P2P = ROOT / "validation" / "pcie-p2p.yaml"  # more collectives, one op and size list each
ALLTOALL = ROOT / "validation" / "alltoall.yaml"
VALIDATION_TOPOLOGIES = ROOT / "validation" / "topologies"
WORKLOADS = ROOT / "workloads"

# Which machine file models each collective dataset (a preset name or a validation YAML).
COLLECTIVE_MACHINES = {
    "2x2080ti-gen3-switch-shm": "2x2080ti-switch",
    "8xh200-nvswitch-ring": "8xh200-nvswitch",
    "8xa100-sxm4-nvswitch": "8xa100-nvswitch",
    "6x4090-gen4-p2p-patched": str(VALIDATION_TOPOLOGIES / "6x4090-tinybox-p2p.yaml"),
    "4x4090-epyc-p2p-patched": str(VALIDATION_TOPOLOGIES / "4x4090-epyc-p2p.yaml"),
    "a100-nvlink-pair-then-sys": str(VALIDATION_TOPOLOGIES / "a100-nvlink-pairs-dual-socket.yaml"),
    "8xgb202-wrx90-2switch-p2p": str(VALIDATION_TOPOLOGIES / "8xgb202-wrx90-2switch-p2p.yaml"),
    "8xgb202-dual-turin-p2p-channels": str(VALIDATION_TOPOLOGIES / "8xgb202-dual-turin-p2p.yaml"),
}
# Points that fixed a constant (see the dataset comments in simulator/nccl/wire.py): they
# show the fit, not a prediction. Every other row is a check.
CALIBRATION = {
    ("2x2080ti-gen3-switch-shm", "allreduce", 8),  # SHM per-step latency: the latency floor
    ("2x2080ti-gen3-switch-shm", "allreduce", 1024),
    ("2x2080ti-gen3-switch-shm", "allreduce", 65536),  # SHM Simple step: its first Simple row
    ("2x2080ti-gen3-switch-shm", "allreduce", 16777216),  # SHM efficiency on PCIe: the
    ("2x2080ti-gen3-switch-shm", "allreduce", 67108864),  # bandwidth plateau
    ("2x2080ti-gen3-switch-shm", "allreduce", 268435456),
    ("2x2080ti-gen3-switch-shm", "allreduce", 1073741824),
    ("2x2080ti-gen3-switch-shm", "allgather", 1073741824),
    ("8xh200-nvswitch-ring", "allreduce", 17179869184),  # Simple-protocol efficiency, with
    ("8xh200-nvswitch-ring", "allgather", 17179869184),  # the all-gather and
    ("8xh200-nvswitch-ring", "reducescatter", 17179869184),  # reduce-scatter points
    ("4x4090-epyc-p2p-patched", "allreduce", 1073741824),  # Simple P2P share of a Gen4 link
    ("8xgb202-wrx90-2switch-p2p", "allreduce", 1073741824),  # Simple P2P share of a Gen5 link
    ("8xgb202-dual-turin-p2p-channels", "allreduce", 33554432),  # Simple throughput a channel
    ("8xgb202-wrx90-2switch-p2p", "allreduce", 16777216),  # Simple P2P per-step sync: the
    ("8xgb202-wrx90-2switch-p2p", "allreduce", 67108864),  # start-up left by these two
    # each GPU's plain GEMM rate in simulator/catalog/ is its gemm point
    ("gemm-4090-8192", "gemm", None), ("gemm-5090-8192", "gemm", None),
    ("gemm-h100sxm-8192", "gemm", None), ("gemm-a800pcie-8192", "gemm", None),
}
import validate_multinode  # noqa: E402  (its fit rows join the calibration points)

CALIBRATION |= validate_multinode.fits(validate_multinode.load())  # wire.py NET_* constants
# Points published without a size are plateau numbers; run them at this size.
PLATEAU_BYTES = 1 << 30


@dataclass(frozen=True)
class Row:
    id: str
    op: str
    gpus: int
    bytes: int | None
    quantity: str  # what is compared: "busbw GB/s", "time us", "samples/s", ...
    measured: float
    simulated: float
    mechanism: str | None = None  # what the point measures (scales.py), None: a mix
    topology: str | None = None  # name of the machine it was simulated on
    simulated_range: tuple[float, float] | None = None  # training: the run's range

    @property
    def error(self) -> float:
        return (self.simulated - self.measured) / self.measured

    @property
    def role(self) -> str:
        return "fit" if (self.id, self.op, self.bytes) in CALIBRATION else "check"


def load_measurements(path: Path = MEASUREMENTS) -> dict[str, Any]:
    with open(path, encoding="utf-8") as f:
        data = dict(yaml.safe_load(f))
    if path == MEASUREMENTS:  # pcie-p2p.yaml's collectives join these
        with open(PCIE_P2P, encoding="utf-8") as f:
            extra = yaml.safe_load(f)["collectives"]
        data["collectives"] = data["collectives"] + [_with_op(e) for e in extra]
    return data


def _with_op(entry: dict[str, Any]) -> dict[str, Any]:
    """Points that take their op and GPU count from the entry (pcie-p2p.yaml's form); its
    measurements were taken with the ring algorithm forced unless the entry says otherwise."""
    points = [{"op": entry["op"], "gpus": entry["gpus"],
               "algorithm": entry.get("algorithm", "ring"), **p}
              for p in entry.get("points", [])]
    return {**entry, "points": points}


def load_all() -> dict[str, Any]:
    """Both measurement files as one mapping (frameworks.yaml adds `gemm` and its runs)."""
    data = load_measurements()
    frameworks = load_measurements(FRAMEWORKS)
    data["gemm"] = frameworks["gemm"]
    data["frameworks"] = frameworks["training"]
    return data


def gemm_rows(data: dict[str, Any]) -> list[Row]:
    """One m = n = k = 8192 GEMM per GPU, TFLOP/s, as the catalog rates time it."""
    from simulator.catalog import gpus as gpu_catalog
    from simulator.job import compute

    rows = []
    for point in data.get("gemm", []):
        rate = compute.gemm_rate(8192, 8192, 8192, gpu_catalog.gpu(point["gpu"]))
        rows.append(Row(point["id"], "gemm", 1, None, "TFLOP/s", point["tflops"], rate / 1e12))
    return rows


def slowest_mechanism(hops: set[str | None]) -> str | None:
    """The slowest of the transports some hops cross: SHM, then PCIe P2P, then NVLink."""
    return next((m for m in ("shm", "pcie_p2p", "nvlink") if m in hops), None)


def plan_mechanism(comm: Communicator, plan: collectives.Plan) -> str | None:
    """The slowest transport a collective's ring crosses."""
    order = plan.order
    return slowest_mechanism({comm.mechanism(a, order[(i + 1) % len(order)])
                              for i, a in enumerate(order)})


def compute_mechanism(gpu_name: str) -> str:
    """One-GPU steps measure the achieved compute of the GPU's product line."""
    return f"compute:{gpu_catalog.GPUS[gpu_name].line}"


def collective_rows(data: dict[str, Any]) -> list[Row]:
    """Every nccl-tests number of the `collectives` section, simulated."""
    rows: list[Row] = []
    machines: dict[str, Machine] = {}

    def machine(dataset: str, gpus: int, env: NcclEnv | None = None) -> Communicator:
        if dataset not in machines:
            machines[dataset] = Machine.from_config(load_topology(COLLECTIVE_MACHINES[dataset]))
        return Communicator(machines[dataset].subset(gpus), env or NcclEnv())

    for entry in data["collectives"]:
        dataset = entry["id"]
        if dataset not in COLLECTIVE_MACHINES:
            continue  # link-level numbers only (no collective to run)
        table = entry.get("table")
        if table:
            m = machine(dataset, entry["gpus"])
            for size, t_us, busbw in zip(table["bytes"], table["time_us"],
                                         table["busbw_gbps"], strict=True):
                r = time_alone(m, entry["op"], size)
                tags = _tags(m, entry["op"], size)
                if busbw > 0.05:  # nccl-tests rounds to 0.01: below, compare the time
                    rows.append(Row(dataset, entry["op"], m.n_gpus, size, "busbw GB/s",
                                    busbw, r.busbw_gbps, *tags))
                else:
                    rows.append(Row(dataset, entry["op"], m.n_gpus, size, "time us", t_us,
                                    r.time_us, *tags))
            for size, busbw in entry.get("also", {}).get("allgather_busbw_gbps", {}).items():
                r = time_alone(m, "allgather", int(size))
                rows.append(Row(dataset, "allgather", m.n_gpus, int(size), "busbw GB/s",
                                busbw, r.busbw_gbps, *_tags(m, "allgather", int(size))))
        for point in entry.get("points", []):
            env = NcclEnv.from_environ({k: str(v) for k, v in point.get("nccl_env", {}).items()})
            m = machine(dataset, point["gpus"], env)  # with the run's NCCL_* variables
            algo = point.get("algorithm", "auto")
            if "avg_busbw_gbps" in point:  # nccl-tests' footer: the mean over a -f 2 sweep
                rows.append(_average_row(dataset, m, point, algo))
                continue
            size = int(point.get("bytes", PLATEAU_BYTES))
            r = time_alone(m, point["op"], size, algo=algo)
            rows.append(Row(dataset, point["op"], m.n_gpus, size, "busbw GB/s",
                            point["busbw_gbps"], r.busbw_gbps,
                            *_tags(m, point["op"], size, algo)))
    return rows


def _average_row(dataset: str, m: Communicator, point: dict[str, Any], algo: str) -> Row:
    """nccl-tests' "Avg bus bandwidth" of a sweep from ``sizes[0]`` to ``sizes[1]`` by factors of
    two, simulated over the same sizes (both halves alike, so the mean of one)."""
    low, high = (int(x) for x in point["sizes"])
    sizes = [low << k for k in range((high // low).bit_length()) if low << k <= high]
    busbw = [time_alone(m, point["op"], s, algo=algo).busbw_gbps for s in sizes]
    return Row(dataset, point["op"], m.n_gpus, None, "avg busbw", point["avg_busbw_gbps"],
               statistics.fmean(busbw), *_tags(m, point["op"], sizes[-1], algo))


def _tags(m: Communicator, op: str, size: int, algo: str = "auto") -> tuple[str | None, str]:
    """A collective row's mechanism and machine name."""
    return plan_mechanism(m, m.plan(op, size, algo=algo)), m.machine.name


def box_rows(_data: dict[str, Any]) -> list[Row]:
    """No-P2P boxes of validation/box-spread.yaml, each on the machine that describes it."""
    from simulator.api import load_communicator

    spread = load_measurements(BOX_SPREAD)
    rows: list[Row] = []
    for box in spread["boxes"]:
        source = box["machine"]
        topology = str(ROOT / source) if source.endswith(".yaml") else source
        points = box.get("points") or [{"gpus": box["gpus"], "bytes": int(size),
                                        "busbw_gbps": busbw}
                                       for size, busbw in box["busbw_gbps"].items()]
        env = NcclEnv.from_environ({k: str(v) for k, v in box.get("nccl_env", {}).items()})
        for point in points:
            m = load_communicator(topology, point["gpus"], env=env)  # the run's NCCL_* variables
            size = int(point["bytes"])
            r = time_alone(m, box["op"], size)
            rows.append(Row(box["id"], box["op"], m.n_gpus, size, "busbw GB/s",
                            point["busbw_gbps"], r.busbw_gbps, *_tags(m, box["op"], size)))
    return rows


# Which machine, workload and flags model each training result. Megatron-LM's "local" DDP of
# that release all-reduced after backward without overlap, hence --no-overlap there.
TRAINING_RUNS: dict[str, dict[str, Any]] = {
    "2x3090ti-gpt2-medium-megatron": {
        "workload": "gpt2-medium", "strategy": "ddp", "overlap": False,
        "machines": {"nvlink": "2x3090ti-nvlink", "pcie x8, NCCL_P2P_DISABLE=1": "2x3090ti-pcie",
                     None: "2x3090ti-nvlink"},
    },
    "8xa100-mpt-fsdp": {
        "workload": "mpt-7b", "strategy": "fsdp", "overlap": True,
        "machines": {None: "8xa100-nvswitch"}, "models": {"mpt-7b"},
    },


    "v100-ddp-bucket-size": {
        # fp32, SGD with momentum, batch 32 (benchmark.py); 1 GPU "no ddp" runs plain. The
        # README's run printed "PyTorch version: 1.4.0a0+05140f0": its reducer never rebuilt
        # its buckets and divided each in a kernel of its own (strategies/ddp.py)
        "workload": str(WORKLOADS / "resnet50.yaml"), "strategy": "ddp", "overlap": True,
        "legacy_reducer": True,
        "machines": {None: str(VALIDATION_TOPOLOGIES / "dgx1-v100.yaml")},
    },
    "lambda-bert-large-scaling": {
        "workload": str(WORKLOADS / "bert-large-squad.yaml"), "strategy": "ddp", "overlap": True,
        # hardware -> (machine, batch per GPU from pytorch-train-bs-fp16.csv: 112 on the 80 GB
        # cards, 28 on the RTX 3090; the H100 SXM5 row is absent there, taken as the 80 GB 112)
        "hardware": {"A100 80GB SXM4": ("8xa100-nvswitch", 112),
                     "H100 80GB SXM5": ("8xh100-nvswitch", 112),
                     "2x RTX 3090": (str(VALIDATION_TOPOLOGIES / "2x3090-pcie.yaml"), 28),
                     "2x RTX 4090": (str(VALIDATION_TOPOLOGIES / "2x4090-lambda-wrx80.yaml"),
                                     28)},
    },
    "lambda-bert-large-h100-2024": {
        "workload": str(WORKLOADS / "bert-large-squad.yaml"), "strategy": "ddp", "overlap": True,
        "hardware": {"H100 80GB SXM5": ("8xh100-nvswitch", 112)},
    },
}


def _bucket_slowdown(note: str) -> float | None:
    """"bucket_cap_mb=1 is 2.6% slower than the default 25" -> 0.026."""
    match = re.search(r"bucket_cap_mb=1 is ([\d.]+)% slower", note)
    return float(match.group(1)) / 100 if match else None


def software_flag(entry: dict[str, Any]) -> str | None:
    """A measurement's software stack as --software gives it (validate_frameworks.py)."""
    import validate_frameworks

    return validate_frameworks.software_flag(entry)


def _scaling_rows(entry: dict[str, Any], setup: dict[str, Any]) -> list[Row]:
    """Throughput at each GPU count of one machine, and the scaling efficiency at the largest."""
    from simulator.api import RunSpec, simulate

    rows: list[Row] = []
    for result in entry["results"]:
        topology, batch = setup["hardware"][result["hardware"]]
        simulated: dict[int, float] = {}
        for gpus, measured in zip(result["gpus"], result["seq_per_s"], strict=True):
            spec = RunSpec(topology, setup["workload"], setup["strategy"], gpus=gpus,
                           micro_batch=batch, overlap=setup["overlap"],
                           software=software_flag(entry))
            report = simulate(spec, baseline=False, ranges=True).report
            simulated[gpus] = report["samples_per_s"]
            rows.append(Row(entry["id"], result["hardware"][:13], gpus, None, "seq/s",
                            measured, simulated[gpus], *_training_tags(report, "samples_per_s")))
        n = max(result["gpus"])
        measured_eff = result["seq_per_s"][-1] / (n * result["seq_per_s"][0])
        rows.append(Row(entry["id"], result["hardware"][:13], n, None, "scaling eff",
                        measured_eff, simulated[n] / (n * simulated[min(simulated)])))
        # the steady step (the logs' rate once running), which is what stepsim simulates:
        # the headline figures above also carry each run's start-up
        steady = result.get("steady_seq_per_s") or []
        for gpus, rate in list(zip(result["gpus"], steady, strict=True))[1:]:
            rows.append(Row(entry["id"], result["hardware"][:13], gpus, None, "steady eff",
                            rate / (gpus * steady[0]),
                            simulated[gpus] / (gpus * simulated[result["gpus"][0]])))
    return rows


def _bucket_rows(entry: dict[str, Any], setup: dict[str, Any]) -> list[Row]:
    """sec/iter per GPU count, and the bucket_cap_mb=1 throughput loss against 25 MB."""
    from simulator.api import RunSpec, simulate

    machine = setup["machines"][None]

    def run(gpus: int, bucket_mb: float | None = None) -> dict[str, Any]:
        spec = RunSpec(machine, setup["workload"], setup["strategy"], gpus=gpus,
                       bucket_mb=bucket_mb, overlap=setup["overlap"],
                       legacy_reducer=setup.get("legacy_reducer", False),
                       software=software_flag(entry))
        return simulate(spec, baseline=False, ranges=True).report

    def step(gpus: int, bucket_mb: float | None = None) -> float:
        return float(run(gpus, bucket_mb)["step_time_s"])

    rows: list[Row] = []
    for result in entry["results"]:
        gpus = int(result["gpus"])
        if "sec_per_iter" in result:
            report = run(gpus)
            rows.append(Row(entry["id"], "resnet50", gpus, None, "sec/iter",
                            result["sec_per_iter"], report["step_time_s"],
                            *_training_tags(report)))
        slowdown = _bucket_slowdown(result.get("note", ""))
        if slowdown is not None:  # the source's diff is in ex/sec: 1 - throughput ratio, %
            rows.append(Row(entry["id"], "bucket 1 v 25", gpus, None, "tput loss %",
                            100 * slowdown, 100 * (1 - step(gpus, 25) / step(gpus, 1))))
    return rows


def _training_tags(report: dict[str, Any], key: str = "step_time_s"
                   ) -> tuple[str | None, str, tuple[float, float] | None]:
    """A one-GPU step measures compute alone; a multi-GPU step mixes mechanisms. The range of
    ``key`` follows the step time's (throughputs are per-step counts over it)."""
    mechanism = compute_mechanism(report["gpu"]) if report["gpus"] == 1 else None
    low, high = report.get("step_time_s_range") or (None, None)
    bounds = None
    if low and high:
        bounds = (low, high) if key == "step_time_s" else (
            report[key] * report["step_time_s"] / high, report[key] * report["step_time_s"] / low)
    return mechanism, report["topology"], bounds


def training_rows(data: dict[str, Any]) -> list[Row]:
    """Training-step measurements: throughput, MFU and the all-reduce share of the step."""
    from simulator.api import RunSpec, simulate

    rows: list[Row] = []
    for entry in data.get("training", []):
        setup = TRAINING_RUNS.get(entry["id"])
        if setup is None:
            continue  # no machine or workload file models this dataset yet
        if "hardware" in setup:
            rows += _scaling_rows(entry, setup)
            continue
        if entry["id"] == "v100-ddp-bucket-size":
            rows += _bucket_rows(entry, setup)
            continue
        for result in entry["results"]:
            if "models" in setup and result.get("model") not in setup["models"]:
                continue
            gpus = int(result.get("gpus", 8))
            topology = setup["machines"].get(result.get("link"), setup["machines"][None])
            spec = RunSpec(topology, setup["workload"], setup["strategy"] if gpus > 1 else "ddp",
                           gpus=gpus, micro_batch=result.get("micro_batch"),
                           grad_accum=result.get("grad_accum"), overlap=setup["overlap"],
                           software=software_flag(entry))
            r = simulate(spec, baseline=False, ranges=True).report
            label = f"{entry['id']}"
            what = f"{result.get('link') or result.get('model') or ''}".split(",")[0][:13]
            if "samples_per_s" in result:
                rows.append(Row(label, what, gpus, None, "samples/s", result["samples_per_s"],
                                r["samples_per_s"], *_training_tags(r, "samples_per_s")))
            if "tokens_per_s_per_gpu" in result:
                rows.append(Row(label, what, gpus, None, "tok/s/GPU",
                                result["tokens_per_s_per_gpu"], r["tokens_per_s_per_gpu"],
                                *_training_tags(r, "tokens_per_s_per_gpu")))
            if "mfu" in result:
                rows.append(Row(label, what, gpus, None, "MFU", result["mfu"], r["mfu"]))
            split = result.get("time_split", {})
            if "allreduce" in split:
                rows.append(Row(label, what, gpus, None, "AR share", split["allreduce"],
                                r["comm_time_s"] / r["step_time_s"]))
    return rows


def framework_rows(data: dict[str, Any]) -> list[Row]:
    """validation/frameworks.yaml's training runs (scripts/validate_frameworks.py)."""
    import validate_frameworks

    return list(validate_frameworks.rows(data, Row, compute_mechanism))


def multinode_rows(data: dict[str, Any]) -> list[Row]:
    """validation/multinode.yaml's collectives across boxes (scripts/validate_multinode.py)."""
    import validate_multinode

    return list(validate_multinode.rows(validate_multinode.load(), Row))


def offload_rows(data: dict[str, Any]) -> list[Row]:
    """validation/offload.yaml's offloaded runs (scripts/validate_offload.py)."""
    import validate_offload

    return list(validate_offload.rows(validate_offload.load(), Row))


def alltoall_rows(_data: dict[str, Any]) -> list[Row]:
    """validation/alltoall.yaml: nccl-tests all-to-all tables, each under the slowest
    transport its pairs cross, and a fabric check
    (every GPU pair writing at once: copies, no NCCL transport, so no mechanism)."""
    from simulator.engine.program import Flow
    from simulator.nccl.perf import run_alone

    with open(ALLTOALL, encoding="utf-8") as f:
        data = yaml.safe_load(f)
    rows: list[Row] = []
    for entry in data.get("nccl_tests", []):
        machine = Machine.from_config(load_topology(_machine_file(entry["machine"])))
        m = Communicator(machine.subset(entry["gpus"]))
        mechanism = slowest_mechanism({m.mechanism(a, b) for a in range(m.n_gpus)
                                       for b in range(m.n_gpus)})
        for size, (t_us, busbw) in entry["rows"].items():
            r = time_alone(m, entry["op"], int(size))
            if busbw > 0.05:  # nccl-tests rounds to 0.01: below, compare the time
                rows.append(Row(entry["id"], entry["op"], m.n_gpus, int(size), "busbw GB/s",
                                busbw, r.busbw_gbps, mechanism, machine.name))
            else:
                rows.append(Row(entry["id"], entry["op"], m.n_gpus, int(size), "time us", t_us,
                                r.time_us, mechanism, machine.name))
    for entry in data.get("fabric", []):
        machine = Machine.from_config(load_topology(_machine_file(entry["machine"])))
        m = Communicator(machine)
        size = int(entry["bytes_per_pair"])
        pairs = [(a, b) for a in range(m.n_gpus) for b in range(m.n_gpus) if a != b]
        seconds, _, _ = run_alone(m.capacities(), [Flow(m.route(a, b), size) for a, b in pairs])
        rows.append(Row(entry["id"], "pair-writes", m.n_gpus, size, "GB/s",
                        entry["aggregate_gbps"], len(pairs) * size / seconds / 1e9, None,
                        machine.name))
    return rows


def _machine_file(name: str) -> str:
    """A preset name, or a path relative to the repository."""
    return str(ROOT / name) if "/" in name else name


SECTIONS: dict[str, Callable[[dict[str, Any]], list[Row]]] = {
    "collectives": collective_rows,
    "training": training_rows,
    "frameworks": framework_rows,
    "offload": offload_rows,
    "gemm": gemm_rows,
    "boxes": box_rows,
    "alltoall": alltoall_rows,
    "multinode": multinode_rows,
}


# What the residual table keeps: achieved rates (a time counts inverted), at sizes a training
# step moves (buckets, per-block gathers: 1 MiB and up; smaller ones are latency bound).
RATE_QUANTITIES = {"busbw GB/s", "avg busbw", "samples/s", "seq/s", "tok/s/GPU"}
TIME_QUANTITIES = {"sec/iter", "time us"}
MIN_BYTES = 1 << 20


def rate_ratio(row: Row) -> float | None:
    """Measured rate / simulated rate: the factor the model's rate is off by (None: skip)."""
    if row.bytes is not None and row.bytes < MIN_BYTES:
        return None
    if row.quantity in RATE_QUANTITIES:
        return row.measured / row.simulated
    if row.quantity in TIME_QUANTITIES:
        return row.simulated / row.measured
    return None


def residual_table(rows: list[Row]) -> dict[str, Any]:
    """Per mechanism: the spread of rate ratios over all boxes and within each box."""
    table: dict[str, Any] = {}
    for row in rows:
        ratio = rate_ratio(row)
        if row.mechanism is None or ratio is None:
            continue
        entry = table.setdefault(row.mechanism, {"ratios": [], "boxes": {}})
        entry["ratios"].append(ratio)
        box = entry["boxes"].setdefault(f"{row.id} @ {row.topology}",
                                        {"topology": row.topology, "ratios": [], "fit": False})
        box["ratios"].append(ratio)
        box["fit"] = box["fit"] or row.role == "fit"
    def down(x: float) -> float:  # four decimals, outward: the spread keeps its own points
        return math.floor(x * 1e4) / 1e4

    def up(x: float) -> float:
        return math.ceil(x * 1e4) / 1e4

    out: dict[str, Any] = {}
    for mechanism in sorted(table):
        entry = table[mechanism]
        out[mechanism] = {
            "low": down(min(entry["ratios"])), "high": up(max(entry["ratios"])),
            "points": len(entry["ratios"]),
            "boxes": {box_id: {"topology": box["topology"], "low": down(min(box["ratios"])),
                               "high": up(max(box["ratios"])),
                               "points": len(box["ratios"]), "fit": box["fit"]}
                      for box_id, box in sorted(entry["boxes"].items())},
        }
    return out


# The table's own note, first in the file (JSON: every run reads it with the standard library)
RESIDUALS_ABOUT = (
    "Generated by `python scripts/validate.py --write-residuals`; do not edit by hand (a test "
    "checks it matches what the models give now). Per mechanism (simulator/machine/scales.py): the "
    "factor by which measured rates differ from simulated ones (measured / simulated; a time "
    "counts inverted), over every validation point of that mechanism at 1 MiB and up and every "
    "one-GPU step. low/high: over all boxes (an uncalibrated machine); boxes: each box's own "
    "spread, and whether its points fixed a constant of the model (fit). docs/ranges.md says "
    "how simulator/api/ranges.py turns these into ranges.")


def all_rows() -> list[Row]:
    data = load_all()
    return [row for section in SECTIONS.values() for row in section(data)]


def write_residuals(rows: list[Row], path: Path = RESIDUALS) -> None:
    table = {"about": RESIDUALS_ABOUT, "min_bytes": MIN_BYTES,
             "mechanisms": residual_table(rows)}
    path.write_text(json.dumps(table, indent=2) + "\n", encoding="utf-8")


def range_text(r: Row) -> str:
    """A row's simulated range, marked where the measurement falls outside it ('' if none)."""
    if r.simulated_range is None:
        return ""
    low, high = r.simulated_range
    return f"{low:.2f}-{high:.2f}" + ("" if low <= r.measured <= high else " (outside)")


def render(rows: list[Row]) -> str:
    lines = [f"{'id':<28} {'op':<13} {'gpus':>4} {'bytes':>11} {'quantity':<11} "
             f"{'measured':>10} {'simulated':>10} {'error':>8}  role"]
    for r in rows:
        size = "-" if r.bytes is None else str(r.bytes)
        bounds = f"  {range_text(r)}" if r.simulated_range is not None else ""
        lines.append(f"{r.id:<28} {r.op:<13} {r.gpus:>4} {size:>11} {r.quantity:<11} "
                     f"{r.measured:>10.2f} {r.simulated:>10.2f} {r.error:>+8.1%}  {r.role}"
                     f"{bounds}")
    if rows:
        errors = [abs(r.error) for r in rows]
        worst = max(rows, key=lambda r: abs(r.error))
        checks = [abs(r.error) for r in rows if r.role == "check"]
        lines.append(f"{len(rows)} points: median |error| {statistics.median(errors):.1%}, "
                     f"worst {abs(worst.error):.1%} ({worst.id} {worst.op} {worst.gpus} GPUs"
                     + (f" {worst.bytes} B" if worst.bytes else "") + ")")
        if checks and len(checks) < len(rows):
            lines.append(f"{len(checks)} checks (calibration points left out): median |error| "
                         f"{statistics.median(checks):.1%}, worst {max(checks):.1%}")
        ranged = [r for r in rows if r.simulated_range is not None]
        if ranged:
            inside = [r for r in ranged if r.simulated_range is not None
                      and r.simulated_range[0] <= r.measured <= r.simulated_range[1]]
            memory = any(r.quantity == "memory GiB" for r in ranged)
            lines.append(f"{len(inside)} of {len(ranged)} points fall inside their simulated "
                         "ranges (simulator/api/ranges.py"
                         + ("; reserved memory: simulator/memory/allocator.py, "
                            "step_replay.py)" if memory else ")"))
    return "\n".join(lines)


ACCURACY = ROOT / "docs" / "accuracy.md"
SECTION_WORDS = {
    "collectives": "nccl-tests numbers (validation/measurements.yaml, validation/pcie-p2p.yaml)",
    "training": "training-step throughput and scaling (validation/measurements.yaml)",
    "frameworks": "training runs as frameworks publish them (validation/frameworks.yaml)",
    "offload": "offloaded runs: throughput and host RAM (validation/offload.yaml); a `box "
               "calibrated` row is the run on its box calibrated from the box's other runs, "
               "as `stepsim calibrate` does it",
    "gemm": "one m = n = k = 8192 GEMM per GPU (validation/frameworks.yaml)",
    "boxes": "no-P2P boxes as a user would describe them, uncalibrated "
             "(validation/box-spread.yaml)",
    "alltoall": "nccl-tests all-to-all, and every GPU pair of a box writing at once "
                "(validation/alltoall.yaml)",
    "multinode": "nccl-tests across boxes: NET/IB with and without GPUDirect RDMA, TCP "
                 "sockets (validation/multinode.yaml; why the worst rows are off: "
                 "weak-spots.md, Between boxes)",
}


def _summary(rows: list[Row]) -> tuple[str, str, str]:
    """(median |error|, worst |error|, the worst row) of a section, as text."""
    if not rows:
        return "", "", ""
    worst = max(rows, key=lambda r: abs(r.error))
    where = f"{worst.id} {worst.op}, {worst.gpus} GPUs" + (f", {worst.bytes} B"
                                                          if worst.bytes else "")
    return (f"{statistics.median(abs(r.error) for r in rows):.1%}", f"{abs(worst.error):.1%}",
            where)


def summary_table(sections: dict[str, list[Row]]) -> list[str]:
    """Each section's points, median and worst error, as markdown rows (README.md keeps the
    same table; tests/test_docs.py holds it true)."""
    lines = ["| section | points | median error | worst error | worst row |",
             "|---|---:|---:|---:|---|"]
    for name, rows in sections.items():
        median, worst, where = _summary(rows)
        lines.append(f"| {name} | {len(rows)} | {median} | {worst} | {where} |")
    return lines


def markdown(sections: dict[str, list[Row]]) -> str:
    """Every section's rows as docs/accuracy.md holds them: a summary, then each table."""
    every = [r for rows in sections.values() for r in rows]
    lines = ["# Accuracy: the simulator against every published measurement it carries", "",
             "Generated by `python scripts/validate.py --markdown`; do not edit by hand "
             "(tests/test_docs.py checks it is what the script writes now). Each row is one "
             "published number, its source in the YAML file the section names; *fit* rows "
             "fixed a constant of the model (an efficiency, a latency, a per-channel cap, a "
             "GPU's GEMM rate), every other row is a prediction. Error = simulated / measured "
             "- 1. Why the worst rows are off: [weak-spots.md](weak-spots.md); how a run's "
             "ranges follow from these errors: [ranges.md](ranges.md).", "",
             *summary_table(sections)]
    ranged = [r for r in every if r.simulated_range is not None]
    inside = [r for r in ranged if r.simulated_range is not None
              and r.simulated_range[0] <= r.measured <= r.simulated_range[1]]
    lines += ["", f"{len(inside)} of {len(ranged)} measured points fall inside the range the "
              "simulator gives them.", ""]
    for name, rows in sections.items():
        lines += [f"## {name}", "", SECTION_WORDS.get(name, "") + ".", "",
                  "| id | op | GPUs | bytes | quantity | measured | simulated | error | role "
                  "| simulated range |",
                  "|---|---|---:|---:|---|---:|---:|---:|---|---|"]
        for r in rows:
            span = range_text(r)
            lines.append(f"| {r.id} | {r.op} | {r.gpus} | {'' if r.bytes is None else r.bytes}"
                         f" | {r.quantity} | {r.measured:.2f} | {r.simulated:.2f} | "
                         f"{r.error:+.1%} | {r.role} | {span} |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--section", choices=[*SECTIONS, "all"], default="all")
    parser.add_argument("--write-residuals", action="store_true",
                        help=f"write the per-mechanism residual table to {RESIDUALS.name} "
                        "(needs --section all)")
    parser.add_argument("--markdown", action="store_true",
                        help=f"write every section to docs/{ACCURACY.name} instead of printing")
    args = parser.parse_args(argv)
    data = load_all()
    names = list(SECTIONS) if args.section == "all" else [args.section]
    if args.write_residuals and args.section != "all":
        parser.error("--write-residuals needs every section (--section all)")
    if args.markdown:
        if args.section != "all":
            parser.error("--markdown writes every section (--section all)")
        ACCURACY.write_text(markdown({name: SECTIONS[name](data) for name in names}),
                            encoding="utf-8")
        print(f"wrote {ACCURACY.relative_to(ROOT)}")
        return 0
    everything: list[Row] = []
    for name in names:
        rows = SECTIONS[name](data)
        everything += rows
        print(f"== {name} ==")
        print(render(rows) if rows else "(no points simulated in this section yet)")
        print()
    if args.write_residuals:
        write_residuals(everything)
        print(f"wrote {RESIDUALS.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
