"""One NCCL collective timed alone, as nccl-tests' ``*_perf`` binaries time it: each size on
idle links, in nccl-tests' terms (time, algbw, busbw): ``CollectiveSpec`` -> ``collective()``
(also ``api.collective``), and ``time_alone`` for one size."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from simulator.errors import InputError, quoted
from simulator.machine.build import blame
from simulator.nccl.collectives import OPS, bus_factor
from simulator.nccl.communicator import Communicator, load_communicator
from simulator.nccl.env import NO_ENV, NcclEnv
from simulator.units import GB, US


@dataclass(frozen=True)
class CollectiveSpec:
    """One NCCL collective over a list of sizes (bytes), as nccl-tests runs it."""

    topology: str
    op: str  # allreduce, allgather, reducescatter, broadcast
    sizes: tuple[int, ...]
    gpus: int | None = None
    algo: str = "auto"  # ring, tree or auto (NCCL's choice)
    nccl: NcclEnv = NO_ENV
    nnodes: int | None = None  # boxes (the topology's `nnodes` if None); gpus: per box


@dataclass(frozen=True)
class Result:
    """One collective timed alone, in nccl-tests' terms (time, algbw, busbw)."""

    op: str
    bytes: int
    gpus: int
    time_us: float
    algbw_gbps: float
    busbw_gbps: float
    algorithm: str
    protocol: str
    transport: str
    n_channels: int
    bottleneck_link: str | None
    bottleneck_utilization: float

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["bottleneck"] = {"link": out.pop("bottleneck_link"),
                             "utilization": out.pop("bottleneck_utilization")}
        return out


def collective(spec: CollectiveSpec) -> list[Result]:
    """Each size alone on idle links: time, algbw and busbw as nccl-tests prints them."""
    if spec.op not in OPS:
        raise InputError(f"unknown collective {quoted(spec.op)}; expected one of {', '.join(OPS)}")
    if spec.algo not in ("auto", "ring", "tree"):
        raise InputError(f"algorithm {quoted(spec.algo)}: expected ring, tree or auto")
    comm = load_communicator(spec.topology, spec.gpus, env=spec.nccl, nnodes=spec.nnodes)
    with blame(spec.topology, "topologies"):
        return [time_alone(comm, spec.op, n, algo=spec.algo) for n in spec.sizes]


def time_alone(comm: Communicator, op: str, nbytes: int, ranks: tuple[int, ...] | None = None,
               algo: str = "auto", protocol: str | None = None) -> Result:
    """Run one collective alone on a fresh fabric, as nccl-tests would time it."""
    import simpy  # here: commands that only plan (memory, topo) never load the event loop

    from simulator.engine.fabric import Fabric

    p = comm.plan(op, nbytes, ranks, algo, protocol)
    env = simpy.Environment()
    fabric = Fabric(env, comm.capacities(), record_history=False)
    flow = p.flow
    env.run(fabric.transfer(flow.usage, flow.nbytes, flow.max_rate, flow.latency))
    seconds = env.now
    n = len(p.ranks)
    algbw = nbytes / seconds / GB if seconds > 0 else 0.0
    link, util = fabric.bottleneck() if p.usage and nbytes > 0 else (None, 0.0)
    return Result(op, nbytes, n, seconds / US, algbw, algbw * bus_factor(op, n), p.algorithm,
                  p.protocol, p.transport, p.n_channels, link, util)
