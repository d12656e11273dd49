"""Machines from topology files: each file read and built once per process, every variant
(fewer GPUs, scaled rates) derived from that one build; and the error that names the file
when building from it fails."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache

from simulator.errors import InputError
from simulator.inputs.config import key_line, load_topology, resolve
from simulator.machine.scales import NEUTRAL, RateScales
from simulator.machine.topology import Machine


def load_machine(topology: str, gpus: int | None = None,
                 scales: RateScales = NEUTRAL, nnodes: int | None = None) -> Machine:
    """The machine of a topology YAML or preset, cut to its first ``gpus`` GPUs (cached),
    with its mechanisms' rates scaled by ``scales``; ``nnodes`` boxes of it (default the
    file's ``nnodes``, else one) joined by its ``network`` (machine/cluster.py), ``gpus`` then
    counting the GPUs of each box (torchrun's --nproc-per-node).

    The file is read and the machine built once per process: every variant (fewer GPUs,
    scaled rates, more boxes) derives from that one build and shares its paths."""
    return _machine(topology, gpus, scales, nnodes)


@lru_cache(maxsize=64)
def _machine(topology: str, gpus: int | None, scales: RateScales,
             nnodes: int | None = None) -> Machine:
    if not scales.neutral:
        return _machine(topology, gpus, NEUTRAL, nnodes).with_scales(scales)
    if gpus is not None:
        built = _machine(topology, None, NEUTRAL, nnodes)
        if gpus > built.gpus_per_box:
            raise InputError(f"--gpus {gpus}: the machine has only {built.gpus_per_box} GPUs"
                             + (" in each box" if built.nnodes > 1 else ""))
        with blame(topology, "topologies"):  # one box of several is built anew
            return built.subset(gpus)
    if nnodes is not None:
        if nnodes < 1:
            raise InputError(f"--nnodes {nnodes}: must be at least 1")
        built = _machine(topology, None, NEUTRAL, None)
        if nnodes == built.nnodes:
            return built
        box = built.box or built.config
        name = f"{box.name} ({nnodes} box{'es' if nnodes > 1 else ''})"  # not the file's count
        with blame(topology, "topologies"):
            return Machine.from_config(box.copy(nnodes=nnodes, name=name))
    with blame(topology, "topologies"):
        return Machine.from_config(load_topology(topology))


def forget_machines() -> None:
    _machine.cache_clear()


@contextmanager
def blame(name_or_path: str, kind: str, machine: Machine | None = None,
          topology: str = "") -> Iterator[None]:
    """An input error found while building from a file names that file (a machine whose
    nodes do not connect, LoRA targets the model lacks), as loading errors do. With
    ``machine``, an error the machine raises (its messages start with its name: a route it
    cannot find) names the ``topology`` file instead."""
    try:
        yield
    except InputError as exc:
        if exc.file is not None:
            raise
        if machine is not None and exc.message.startswith(f"{machine.name}: "):
            name_or_path, kind = topology, "topologies"
        path = resolve(name_or_path, kind)
        line = exc.line if exc.line is not None or exc.key is None else key_line(path, exc.key)
        raise InputError(exc.message, file=str(path), line=line, key=exc.key) from None
