"""The catalog's names as a command offers and checks them (GPU models, CPU families, socket
links, PCIe generations, software stacks): commands read them here, never from the catalog
(docs/architecture.md, "The layers": commands import only api, advice, calibration, outputs
and inputs)."""

from __future__ import annotations

from simulator.catalog import cpus as cpu_catalog
from simulator.catalog import gpus as gpu_catalog
from simulator.catalog import links as link_catalog
from simulator.catalog import software

GPU_NAMES = tuple(sorted(gpu_catalog.GPUS))
CPU_FAMILIES = tuple(cpu_catalog.CPUS)
DEFAULT_CPU = cpu_catalog.DEFAULT_CPU
SOCKET_LINKS = tuple(link_catalog.SOCKET_LINKS)
PCIE_GENERATIONS = tuple(sorted(link_catalog.PCIE_RAW_PER_LANE))


def check_gpu(name: str) -> None:
    """An unknown card name is an InputError naming the catalog's closest."""
    gpu_catalog.gpu(name)


def check_software(text: str) -> None:
    """A ``--software`` value the rate tables cannot resolve is an InputError naming the flag."""
    software.parse_flag(text)
