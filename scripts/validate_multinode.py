"""The `multinode` section of scripts/validate.py: validation/multinode.yaml's collectives
across boxes, each simulated on the machine its entry names (a preset or a validation
topology), at its box count, GPUs per box, algorithm and NCCL variables, as nccl-tests times
them (simulator/nccl/perf.py). Rows are tagged with their transport's mechanism, ``net_ib`` or
``net_socket`` (machine/scales.py): their spread is that transport's uncalibrated range."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
MULTINODE = ROOT / "validation" / "multinode.yaml"


def load(path: Path = MULTINODE) -> dict[str, Any]:
    with open(path, encoding="utf-8") as f:
        return dict(yaml.safe_load(f))


def fits(data: dict[str, Any]) -> set[tuple[str, str, int]]:
    """The (id, op, bytes) of the rows that fixed a constant (validate.py's CALIBRATION)."""
    return {(e["id"], p["op"], p["bytes"]) for e in data["collectives"] if e.get("role") == "fit"
            for p in e["points"]}


def _machine(entry: dict[str, Any]) -> str:
    name = str(entry["machine"])
    return str(ROOT / name) if name.endswith(".yaml") else name


def rows(data: dict[str, Any], row: Callable[..., Any]) -> Iterator[Any]:
    from simulator.nccl.communicator import load_communicator
    from simulator.nccl.env import NcclEnv
    from simulator.nccl.perf import time_alone

    for entry in data["collectives"]:
        env = NcclEnv.from_environ({k: str(v) for k, v in entry.get("nccl_env", {}).items()})
        for point in entry["points"]:
            nnodes = point.get("nnodes", entry.get("nnodes"))
            comm = load_communicator(_machine(entry), entry.get("gpus"), env=env, nnodes=nnodes)
            result = time_alone(comm, point["op"], point["bytes"],
                                algo=point.get("algorithm", "auto"))
            n, tags = comm.machine.n_gpus, (comm.net.mechanism, comm.machine.name)
            if "time_us" in point:
                yield row(entry["id"], point["op"], n, point["bytes"], "time us",
                          point["time_us"], result.time_us, *tags)
            else:
                yield row(entry["id"], point["op"], n, point["bytes"], "busbw GB/s",
                          point["busbw_gbps"], result.busbw_gbps, *tags)
