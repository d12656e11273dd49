"""Machines from topology files: each file read and built once per process, every variant
(fewer GPUs, scaled rates) derived from that one build; and the error that names the file
when building from it fails."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache

from simulator.errors import InputError
from simulator.inputs.config import load_topology, resolve
from simulator.machine.scales import NEUTRAL, RateScales
from simulator.machine.topology import Machine


def load_machine(topology: str, gpus: int | None = None,
                 scales: RateScales = NEUTRAL) -> Machine:
    """The machine of a topology YAML or preset, cut to its first ``gpus`` GPUs (cached),
    with its mechanisms' rates scaled by ``scales``.

    The file is read and the machine built once per process: every variant (fewer GPUs,
    scaled rates) derives from that one build and shares its paths."""
    return _machine(topology, gpus, scales)


@lru_cache(maxsize=64)
def _machine(topology: str, gpus: int | None, scales: RateScales) -> Machine:
    if not scales.neutral:
        return _machine(topology, gpus, NEUTRAL).with_scales(scales)
    if gpus is not None:
        built = _machine(topology, None, NEUTRAL)
        if gpus > built.n_gpus:
            raise InputError(f"--gpus {gpus}: the machine has only {built.n_gpus} GPUs")
        return built.subset(gpus)
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
        raise InputError(exc.message, file=str(resolve(name_or_path, kind)), line=exc.line,
                         key=exc.key) from None
