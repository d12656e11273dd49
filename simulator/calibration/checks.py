"""Is a log a measurement of this machine? The run a log describes, and what contradicts it.

A log runs on the GPUs its command line made visible (``CUDA_VISIBLE_DEVICES``), else on the
first ones in the topology's order, as nccl-tests numbers them (on several boxes, as many on
each box, the first of each, as mpirun places ranks by node); under the ``NCCL_*`` variables
it names, read as `stepsim collective` reads them (nccl/env.py). Calibrating the topology on it
is refused, naming both, where:

- it ran on more GPUs than the topology has (never forced: the machine has no such GPUs);
- its GPUs are another model than the topology's at those places (`Using devices` names);
- its transport is not the topology's: its variables (NCCL_P2P_DISABLE, NCCL_P2P_LEVEL,
  NCCL_SHM_DISABLE) or NCCL's own channel lines (``via SHM``) give other transports than the
  topology gives those GPUs by default, so the fit would describe another machine;
- it moves more than the topology could at any parameter's physical ceiling (bounds.py): it
  ran over another transport or topology than the file says;
- its plateau is below half the slowest any published box of that mechanism measured against
  the model (validation/residuals.json: NVLink, PCIe P2P, SHM), which no calibration of that
  mechanism should absorb: another transport (P2P disabled?), other GPUs, or a broken box.
``--force`` fits anyway, with the log's environment applied; the calibrated topology then says
it was forced and why, and ranges take nothing from it.
"""

from __future__ import annotations

from dataclasses import dataclass

from simulator.calibration.bounds import ceiling
from simulator.catalog import gpus as gpu_catalog
from simulator.errors import InputError
from simulator.inputs.nccl_tests_log import NcclTestsLog
from simulator.nccl.communicator import Communicator
from simulator.nccl.env import NcclEnv
from simulator.nccl.perf import time_alone

# a measured rate this far above the model's ceiling is beyond rounding and run-to-run noise
CEILING_MARGIN = 1.05
# a plateau below this share of the slowest published box of its mechanism (measured / model,
# residuals.json) is another mechanism, not a slow one
FLOOR_MARGIN = 0.5


@dataclass(frozen=True)
class Run:
    """A log as it ran on the machine: its GPUs (ranks of the topology) and NCCL under its
    environment."""

    log: NcclTestsLog
    comm: Communicator  # NCCL over the whole machine, under the log's variables
    ranks: tuple[int, ...]
    chosen_by: str  # how the ranks were chosen, in words

    @property
    def name(self) -> str:
        return self.log.source


def run_of(log: NcclTestsLog, base: Communicator, topology: str) -> Run:
    """The GPUs and environment a log ran with; more GPUs than the machine has is an error."""
    machine = base.machine
    if log.gpus > machine.n_gpus:
        raise InputError(f"{log.source}: the log ran on {log.gpus} GPUs; {topology} has "
                         f"{machine.n_gpus}")
    env = NcclEnv.from_environ(dict(log.env))
    if machine.nnodes > 1:
        return Run(log, Communicator(machine, env, base.wire), _across(log, machine.nnodes,
                   machine.gpus_per_box), "the first of each box, as mpirun places them")
    visible = log.visible_devices
    if visible is not None and len(visible) == log.gpus:
        if max(visible) >= machine.n_gpus:
            raise InputError(f"{log.source}: CUDA_VISIBLE_DEVICES={','.join(map(str, visible))} "
                             f"names GPU {max(visible)}; {topology} has GPUs 0-"
                             f"{machine.n_gpus - 1}")
        ranks, how = tuple(visible), "CUDA_VISIBLE_DEVICES on its command line"
    else:
        ranks, how = tuple(range(log.gpus)), f"the first {log.gpus}, as nccl-tests numbers them"
    return Run(log, Communicator(machine, env, base.wire), ranks, how)


def _across(log: NcclTestsLog, nnodes: int, per_box: int) -> tuple[int, ...]:
    """Ranks of a log run on several boxes: as many on each, box by box (mpirun's default
    placement by node), the first GPUs of each box."""
    if log.gpus % nnodes:
        raise InputError(f"{log.source}: the log ran on {log.gpus} GPUs, not the same number "
                         f"on each of {nnodes} boxes (--nnodes)")
    k = log.gpus // nnodes
    return tuple(b * per_box + g for b in range(nnodes) for g in range(k))


def contradictions(run: Run, topology: str) -> list[str]:
    """Why this log is not a measurement of this machine (empty: nothing says so)."""
    out = [*_models(run, topology)]
    transport = _transport(run, topology)
    if transport:
        out.append(transport)
    elif not out:
        rate = _ceiling(run, topology) or _floor(run, topology)
        if rate:
            out.append(rate)
    return out


def _models(run: Run, topology: str) -> list[str]:
    machine = run.comm.machine
    out = []
    for rank, name in zip(run.ranks, run.log.device_names, strict=False):
        found = gpu_catalog.from_device_name(name)
        have = machine.gpu_of(rank).name.split(" ")[0]
        if found is not None and found[0] != have:
            out.append(f"{run.name}: the log ran on {name} ({found[0]}); {topology} has a "
                       f"{have} at GPU {rank}")
            break
    return out


def hops(comm: Communicator, ranks: tuple[int, ...]) -> set[str]:
    """The transports of the ring's hops over ``ranks``."""
    order = comm.ring(ranks).order
    return {comm.transport(a, order[(k + 1) % len(order)]) for k, a in enumerate(order)}


def _transport(run: Run, topology: str) -> str | None:
    plain = Communicator(run.comm.machine, wire=run.comm.wire)
    usual, ran = hops(plain, run.ranks), hops(run.comm, run.ranks)
    gpus = ", ".join(str(r) for r in run.ranks)
    if run.log.transports and not run.log.transports & ran:
        return (f"{run.name}: NCCL's own lines say it used {'/'.join(sorted(run.log.transports))}"
                f"; {topology}'s GPUs {gpus} give {'/'.join(sorted(ran))}"
                + (f" under its {run.comm.env.line()}" if run.comm.env.active else ""))
    if usual != ran:
        return (f"{run.name}: the log ran with {run.comm.env.line()}: its GPUs {gpus} talked over "
                f"{'/'.join(sorted(ran))}; on {topology} they talk over "
                f"{'/'.join(sorted(usual))}, so a fit would describe another machine")
    return None


def _ceiling(run: Run, topology: str) -> str | None:
    """The largest rows against the model with every rate at its physical ceiling."""
    comm = ceiling(run.comm)
    big = sorted(run.log.rows, key=lambda r: r.bytes)[-3:]
    for row in big:
        if row.bytes <= 0:
            continue
        best = time_alone(comm, run.log.op, row.bytes, run.ranks)
        fastest = min(row.time_us, row.in_place_time_us or row.time_us)
        if best.time_us > CEILING_MARGIN * fastest:
            return (f"{run.name}: at {row.bytes} B the log moves {row.busbw_gbps:.3g} GB/s "
                    f"busbw; {topology}'s GPUs {', '.join(map(str, run.ranks))} "
                    f"({'/'.join(sorted(hops(run.comm, run.ranks)))}) carry at most "
                    f"{best.busbw_gbps:.3g} with every efficiency and cap at its ceiling: it ran "
                    "over another transport or topology than the file says")
    return None


MECHANISMS = {"nvlink": "NVLink", "pcie_p2p": "PCIe P2P", "shm": "SHM through host memory"}


def _floor(run: Run, topology: str) -> str | None:
    """The plateau against the slowest published box of its mechanism (uncalibrated model)."""
    from simulator.api.ranges import residual_table

    order = run.comm.ring(run.ranks).order
    seen = {run.comm.mechanism(a, order[(k + 1) % len(order)]) for k, a in enumerate(order)}
    mechanism = next((m for m in ("shm", "pcie_p2p", "nvlink") if m in seen), None)
    entry = residual_table().get(mechanism or "")
    rows = [r for r in run.log.rows if r.bytes > 0]
    if entry is None or not rows:
        return None
    row = max(rows, key=lambda r: r.bytes)
    model = time_alone(run.comm, run.log.op, row.bytes, run.ranks)
    ratio = model.time_us / min(row.time_us, row.in_place_time_us or row.time_us)
    if ratio >= FLOOR_MARGIN * entry["low"]:
        return None
    hint = ""
    if mechanism != "shm":
        shm = Communicator(run.comm.machine, NcclEnv.from_environ({"NCCL_P2P_DISABLE": "1"}),
                           run.comm.wire)
        guess = time_alone(shm, run.log.op, row.bytes, run.ranks)
        like = guess.time_us / row.time_us
        if like >= FLOOR_MARGIN * residual_table().get("shm", {"low": 0.0})["low"]:
            hint = (f"; SHM through host memory would give {guess.busbw_gbps:.3g}: was it run "
                    "with NCCL_P2P_DISABLE=1 (put the command line in the log)?")
    return (f"{run.name}: at {row.bytes} B the log moves {row.busbw_gbps:.3g} GB/s busbw, "
            f"{ratio:.2g}x what {topology}'s GPUs {', '.join(map(str, run.ranks))} give over "
            f"{MECHANISMS[mechanism or 'shm']} ({model.busbw_gbps:.3g}); published boxes "
            f"measure {entry['low']:.2f}-{entry['high']:.2f}x the model{hint}")
