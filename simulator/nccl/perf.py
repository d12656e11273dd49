"""One NCCL collective timed alone, as nccl-tests' ``*_perf`` binaries time it: each size on
idle links, in nccl-tests' terms (time, algbw, busbw): ``CollectiveSpec`` -> ``collective()``
(also ``api.collective``), and ``time_alone`` for one size, its flows on a fresh fabric
(``run_alone``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from simulator.errors import InputError, quoted
from simulator.machine.build import blame
from simulator.nccl import alltoall
from simulator.nccl.collectives import OPS as COLLECTIVE_OPS
from simulator.nccl.collectives import bus_factor as ring_bus_factor
from simulator.nccl.communicator import Communicator, load_communicator
from simulator.nccl.env import NO_ENV, NcclEnv
from simulator.units import GB, US

if TYPE_CHECKING:
    from simulator.engine.program import Flow

OPS = COLLECTIVE_OPS + alltoall.OPS  # every operation nccl-tests times that stepsim models


def bus_factor(op: str, n: int) -> float:
    """nccl-tests busbw / algbw for any operation (doc/PERFORMANCE.md, src/*.cu GetBw)."""
    return alltoall.bus_factor(op, n) if op in alltoall.OPS else ring_bus_factor(op, n)


@dataclass(frozen=True)
class CollectiveSpec:
    """One NCCL collective over a list of sizes (bytes), as nccl-tests runs it."""

    topology: str
    op: str  # one of OPS
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
    p = comm.plan(op, nbytes, ranks, algo, protocol)
    n = len(p.ranks)
    if p.flows:
        seconds, link, util = run_alone(comm.capacities(), p.flows)
    else:  # one rank or nothing to move: the call alone
        seconds, link, util = comm.wire.call_latency_us * US if nbytes else 0.0, None, 0.0
    algbw = nbytes / seconds / GB if seconds > 0 else 0.0
    if nbytes <= 0:
        link, util = None, 0.0
    return Result(op, nbytes, n, seconds / US, algbw, algbw * bus_factor(op, n), p.algorithm,
                  p.protocol, p.transport, p.n_channels, link, util)


def run_alone(capacities: Mapping[str, float], flows: Sequence[Flow]
              ) -> tuple[float, str | None, float]:
    """Flows started together on idle links, run to their end on a fresh fabric in SimPy: when
    the last byte arrives, and the busiest link with its mean utilisation. A ring or chain is
    one flow; an all-to-all, gather, scatter or sendrecv a flow per pair, sharing links max-min
    fairly and taking what a pair that ends leaves (the fabric's own arithmetic, so a training
    step and ``stepsim collective`` give one call the same time)."""
    import simpy  # here: commands that only plan (memory, topo) never load the event loop

    from simulator.engine.fabric import Fabric

    env = simpy.Environment()
    fabric = Fabric(env, capacities, record_history=False)
    env.run(env.all_of([fabric.transfer(f.usage, f.nbytes, f.max_rate, f.latency)
                        for f in flows]))
    link, util = fabric.bottleneck()
    return float(env.now), link, util
