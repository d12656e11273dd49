"""What `stepsim topo import` cannot read from a matrix and must be told or assume: the card at
each GPU and the CPU family of each socket.

Cards: ``--gpu NAME`` for every GPU, ``--gpu 0-3=rtx4090,4-7=rtx3090`` by GPU index (the
matrix's GPU0, GPU1, ...), else the model names the paste itself carries (``nvidia-smi -L``
lines, NCCL's XML has none). A box of two models is a machine whose ``gpu`` is the model most
of its GPUs have, the others named on their nodes.

CPUs: ``--cpu NAME`` names a family of catalog/cpus.py (or, as before, a socket link); NCCL's
XML gives its CPUID, which names the family; else the catalog's default family is assumed and
the import says so.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import Any

from simulator.catalog import cpus as cpu_catalog
from simulator.catalog import gpus as gpu_catalog
from simulator.catalog import links as link_catalog
from simulator.errors import InputError

_RANGE = re.compile(r"^\s*(\d+)\s*(?:-\s*(\d+))?\s*=\s*(\S+)\s*$")


@dataclass(frozen=True)
class Cards:
    """The card at each GPU (a catalog name, or a mapping with a smaller memory) and why."""

    per_gpu: tuple[str | dict[str, Any], ...]
    why: str

    @property
    def default(self) -> str | dict[str, Any]:
        """The model most GPUs have (the first GPU's on a tie): the machine's ``gpu``."""
        counts = Counter(_key(c) for c in self.per_gpu)
        top = max(counts.values())
        return next(c for c in self.per_gpu if counts[_key(c)] == top)

    def base(self, index: int) -> gpu_catalog.GPU:
        card = self.per_gpu[index]
        return gpu_catalog.gpu(card if isinstance(card, str) else card["base"])

    def node_gpu(self, index: int) -> str | dict[str, Any] | None:
        """What the GPU node itself says: nothing where it is the machine's card."""
        card = self.per_gpu[index]
        return None if _key(card) == _key(self.default) else card


def _key(card: str | dict[str, Any]) -> str:
    return card if isinstance(card, str) else f"{card['base']}:{card.get('memory_gib')}"


def cards(spec: str | None, n_gpus: int, names: dict[int, str]) -> Cards:
    """The card at each of ``n_gpus`` GPUs from ``--gpu`` (``spec``) or the paste's names."""
    if spec is None:
        if len(names) < n_gpus:
            raise InputError("the input names no GPU model for every GPU: give --gpu NAME, or "
                             "--gpu 0-3=rtx4090,4-7=rtx3090 for a box of several "
                             f"(catalog: {', '.join(sorted(gpu_catalog.GPUS))})")
        per_gpu = []
        for index in range(n_gpus):
            found = gpu_catalog.from_device_name(names[index])
            if found is None:
                raise InputError(f"GPU{index} is a {names[index]!r}, which the catalog does not "
                                 "have: give --gpu with the closest card (catalog: "
                                 f"{', '.join(sorted(gpu_catalog.GPUS))})")
            base, memory = found
            per_gpu.append(base if memory is None else {"base": base, "memory_gib": memory})
        return Cards(tuple(per_gpu), "as the paste's nvidia-smi -L lines name them")
    if "=" not in spec:
        gpu_catalog.gpu(spec.strip())
        return Cards((spec.strip(),) * n_gpus, "--gpu")
    given: dict[int, str] = {}
    for part in spec.split(","):
        match = _RANGE.match(part)
        if match is None:
            raise InputError(f"--gpu {spec!r}: expected NAME, or FIRST-LAST=NAME,... by GPU "
                             "index (0-3=rtx4090,4-7=rtx3090)")
        first = int(match.group(1))
        last = int(match.group(2)) if match.group(2) is not None else first
        gpu_catalog.gpu(match.group(3))
        if last < first or last >= n_gpus:
            raise InputError(f"--gpu {part.strip()!r}: the matrix has GPUs 0-{n_gpus - 1}")
        for index in range(first, last + 1):
            if index in given:
                raise InputError(f"--gpu {spec!r}: GPU{index} is given twice")
            given[index] = match.group(3)
    missing = [str(i) for i in range(n_gpus) if i not in given]
    if missing:
        raise InputError(f"--gpu {spec!r} names no card for GPU {', '.join(missing)}")
    return Cards(tuple(given[i] for i in range(n_gpus)), "--gpu")


@dataclass(frozen=True)
class CpuChoice:
    """What a cpu node gets: its ``model`` and host memory (None: the schema's default), and
    the assumption to state (None: the user or the input named it)."""

    model: str
    memory_gb_per_s: float | None
    assumed: str | None


def cpu_choice(name: str | None, cpuid: cpu_catalog.CPU | None = None,
               vendor_model: str | None = None) -> CpuChoice:
    """``--cpu NAME`` if given, else the family the input's CPUID names, else the family of
    what the input says of its vendor (``vendor_model``, a socket link), else the default."""
    if name is not None:
        if name in cpu_catalog.CPUS:
            family = cpu_catalog.CPUS[name]
            return CpuChoice(name, round(family.memory_gb_per_s, 1), None)
        if name in link_catalog.SOCKET_LINKS:
            return CpuChoice(name, None, None)
        raise InputError(f"--cpu {name!r}: known: {', '.join(cpu_catalog.CPUS)} (or a socket "
                         f"link: {', '.join(link_catalog.SOCKET_LINKS)})")
    if cpuid is not None:
        return CpuChoice(cpuid.name, round(cpuid.memory_gb_per_s, 1), None)
    if vendor_model is not None:
        return CpuChoice(vendor_model, None, None)
    family = cpu_catalog.CPUS[cpu_catalog.DEFAULT_CPU]
    return CpuChoice(family.name, round(family.memory_gb_per_s, 1),
                     f"CPU {family.name}, an {family.family}, as the input names none: its "
                     f"socket link and {family.memory_gb_per_s:.0f} GB/s of host memory per "
                     "socket; --cpu NAME sets yours (e.g. amd-epyc-9005, "
                     "amd-threadripper-pro-5000, intel-xeon-ice-lake)")
