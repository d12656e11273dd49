"""Scale factors on the achieved rates of the modelled mechanisms: the one hook ranges use.

A ``RateScales`` multiplies the rate the models compute for each mechanism (1.0: the model as
it is). ``Machine.with_scales(scales)`` gives the machine that carries them; two models read
them from it:
- nccl/collectives.py divides each ring hop's link occupancy by its mechanism's factor
  (``Communicator.mechanism``), so the bandwidth a collective achieves over that transport
  scales by it (latency does not);
- job/compute.py divides every kernel's time by ``GPU.rate_scale``, which ``with_scales`` sets to
  the ``compute`` factor (the one-GPU step residuals it comes from measure whole kernels);
- machine/host.py multiplies the rate of every offload flow (the copies between a GPU and host
  memory, the CPU optimizer's passes) by the ``offload`` factor, the offloaded runs' residuals
  (their throughput, so they also carry what else those runs rest on).

Mechanisms are grouped as the validation residuals are (scripts/validate.py): collectives
staged through host memory (``shm``), peer-to-peer over PCIe (``pcie_p2p``), over NVLink or
NVSwitch (``nvlink``), between boxes over NCCL's verbs transport (``net_ib``) or its sockets
(``net_socket``), the GPU's compute (``compute``), and offloading to host memory
(``offload``: the run's own kind, DeepSpeed's or FSDP's, of parameters or the optimizer).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

TRANSPORTS = ("shm", "pcie_p2p", "nvlink", "net_ib", "net_socket")
MECHANISMS = ("compute", *TRANSPORTS, "offload")


@dataclass(frozen=True)
class RateScales:
    """A factor on the achieved rate of each mechanism (1.0: the model as it is)."""

    compute: float = 1.0
    shm: float = 1.0
    pcie_p2p: float = 1.0
    nvlink: float = 1.0
    net_ib: float = 1.0
    net_socket: float = 1.0
    offload: float = 1.0

    def __post_init__(self) -> None:
        for f in fields(self):
            if not getattr(self, f.name) > 0:
                raise ValueError(f"rate scale {f.name} must be positive")

    def factor(self, mechanism: str) -> float:
        return float(getattr(self, mechanism))

    @property
    def neutral(self) -> bool:
        return all(getattr(self, f.name) == 1.0 for f in fields(self))


NEUTRAL = RateScales()
