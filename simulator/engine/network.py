"""What the engine is handed to run programs on: the links and what moving bytes over them
takes. The engine knows nothing of NCCL or of the machine; the caller (nccl/communicator.py)
answers these questions, and the engine only runs the flows it is given.

- ``capacities()``: every link's capacity, bytes/s (directed links, host-memory resources);
- ``sms(rank)``: the streaming multiprocessors of a rank's GPU (NCCL kernels hold one per
  channel while they run, which slows compute beside them);
- ``collective(op, nbytes, ranks)`` and ``sendrecv(src, dst, nbytes)``: a ``Planned`` call,
  whose ``flows`` the fabric runs (one for a ring; one per pair for an all-to-all, all started
  together, the call over when the last ends), whose ``n_channels`` SMs its kernel holds on
  each rank and whose ``hbm_share`` of each rank's memory bandwidth its kernel takes while it
  runs (what the transport and protocol cost compute beside them is the caller's physics, not
  the engine's: nccl/interference.py).
"""

from __future__ import annotations

from typing import Protocol

from simulator.engine.program import Flow


class Planned(Protocol):
    """One collective or transfer as its library decided it."""

    @property
    def flow(self) -> Flow: ...  # the bytes on the links: usage, progress, rate cap, latency

    @property
    def flows(self) -> tuple[Flow, ...]: ...  # every flow of the call (a ring's is ``flow``)

    @property
    def n_channels(self) -> int: ...  # SMs its kernel holds on each rank

    @property
    def hbm_share(self) -> float: ...  # share of a rank's memory bandwidth its kernel takes

    @property
    def algorithm(self) -> str: ...  # what the span shows of it

    @property
    def protocol(self) -> str: ...

    @property
    def transport(self) -> str: ...


class Network(Protocol):
    """The machine as the engine sees it (nccl.Communicator is one)."""

    def capacities(self) -> dict[str, float]: ...

    def sms(self, rank: int) -> int: ...

    def collective(self, op: str, nbytes: int, ranks: tuple[int, ...]) -> Planned: ...

    def sendrecv(self, src: int, dst: int, nbytes: int) -> Planned: ...
