"""One NCCL collective over a list of sizes on a machine, each size alone on a fresh fabric,
as nccl-tests times it: ``CollectiveSpec`` -> ``collective()`` (also ``api.collective``)."""

from __future__ import annotations

from dataclasses import dataclass

from simulator.errors import InputError, quoted
from simulator.machine import collectives
from simulator.machine.build import blame, load_machine
from simulator.machine.nccl_env import NO_ENV, NcclEnv


@dataclass(frozen=True)
class CollectiveSpec:
    """One NCCL collective over a list of sizes (bytes), as nccl-tests runs it."""

    topology: str
    op: str  # allreduce, allgather, reducescatter, broadcast
    sizes: tuple[int, ...]
    gpus: int | None = None
    algo: str = "auto"  # ring, tree or auto (NCCL's choice)
    nccl: NcclEnv = NO_ENV


def collective(spec: CollectiveSpec) -> list[collectives.Result]:
    """Each size alone on a fresh fabric: time, algbw and busbw as nccl-tests prints them."""
    if spec.op not in collectives.OPS:
        raise InputError(f"unknown collective {quoted(spec.op)}; expected one of "
                         f"{', '.join(collectives.OPS)}")
    if spec.algo not in ("auto", "ring", "tree"):
        raise InputError(f"algorithm {quoted(spec.algo)}: expected ring, tree or auto")
    machine = load_machine(spec.topology, spec.gpus, nccl=spec.nccl)
    with blame(spec.topology, "topologies"):
        return [collectives.simulate(machine, spec.op, n, algo=spec.algo) for n in spec.sizes]
