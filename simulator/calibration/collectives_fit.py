"""Fit the wire's physical parameters (simulator/nccl/wire.py) to nccl-tests logs.

Each log row is a measured time at one size; the model is ``perf.time_alone`` on the
user's machine with the candidate parameters. ``scipy.optimize.least_squares`` minimises the
relative time error over every row up to ``fit_max`` (both column halves, a soft-L1 loss so
one odd row, like a dip of the in-place half, does not pull the fit, after a plain
least-squares start).

A parameter is fitted only where the logs determine it: some row must depend on it (its
transport and protocol carry the row, and a 10% change moves the row's time by more than
``MIN_EFFECT``) and its effect must differ in shape from those already chosen (the columns of
the normalised Jacobian stay independent: a per-call start-up and a per-step latency look the
same to logs of one GPU count). Candidates are tried in ``ORDER``; the rest stay at their
defaults with the reason.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
from scipy.optimize import least_squares

from simulator.errors import InputError, cut
from simulator.inputs.nccl_tests_log import NcclTestsLog
from simulator.machine.topology import Machine
from simulator.nccl import collectives, wire
from simulator.nccl.communicator import Communicator
from simulator.nccl.perf import time_alone
from simulator.units import GB

# Bandwidth-like parameters first (the plateau is what a log pins best), then latencies.
ORDER = ("p2p_pcie_simple_efficiency", "nvlink_simple_efficiency", "shm_pcie_efficiency",
         "host_memory_gb_per_s", "socket_link_gb_per_s", "net_efficiency", "socket_stream_gbps",
         "simple_channel_cap_gbps", "ll_channel_cap_gbps", "p2p_simple_sync_us",
         "p2p_ll_sync_us", "shm_simple_sync_us", "shm_ll_sync_us", "net_sync_us",
         "net_ib_sync_us", "call_latency_us")
BOUNDS = {"p2p_pcie_simple_efficiency": (0.02, 1.2), "shm_pcie_efficiency": (0.02, 1.2),
          "nvlink_simple_efficiency": (0.02, 1.2),
          "host_memory_gb_per_s": (1.0, 4000.0), "socket_link_gb_per_s": (1.0, 2000.0),
          "simple_channel_cap_gbps": (0.1, 1000.0), "ll_channel_cap_gbps": (0.1, 1000.0),
          "p2p_simple_sync_us": (0.0, 500.0), "p2p_ll_sync_us": (0.0, 500.0),
          "shm_simple_sync_us": (0.0, 500.0), "shm_ll_sync_us": (0.0, 500.0),
          "net_sync_us": (0.0, 500.0), "call_latency_us": (0.0, 200.0),
          # between boxes: an efficiency, one TCP stream (a 1 Gb/s port to 800 Gb/s), a step
          "net_efficiency": (0.02, 1.2), "socket_stream_gbps": (0.05, 100.0),
          "net_ib_sync_us": (0.0, 500.0)}
MIN_EFFECT = 1e-3  # a 10% change must move some row's time by 0.1%
MIN_INDEPENDENCE = 0.05  # smallest singular value of the chosen normalised columns
STEP = 0.1  # relative change for the sensitivity check


@dataclass(frozen=True)
class RowFit:
    log: str
    bytes: int
    measured_time_us: float
    fitted_time_us: float
    measured_busbw: float
    fitted_busbw: float
    role: str  # "fit" | "predict"

    @property
    def error(self) -> float:
        """Error of the fitted bus bandwidth (from the times: the log rounds busbw to 0.01)."""
        return self.measured_time_us / self.fitted_time_us - 1


@dataclass(frozen=True)
class FitResult:
    fitted: dict[str, float]
    defaults: dict[str, float | None]
    left: dict[str, str]  # parameter -> why it stayed at its default
    rows: list[RowFit]
    rms_error: float  # relative time error over the fitted rows

    def wire(self, base: wire.WireParams) -> wire.WireParams:
        return replace(base, **self.fitted)


@dataclass(frozen=True)
class _Obs:
    log: NcclTestsLog
    bytes: int
    time_us: float
    busbw: float
    fit: bool
    in_place: bool = False


def _with_params(comm: Communicator, params: dict[str, float]) -> Communicator:
    """NCCL over the machine with these wire parameters; host memory and socket links take
    theirs."""
    w = replace(comm.wire, **params)
    machine = comm.machine
    links = dict(machine.links)
    for lid, link in machine.links.items():
        if link.kind == "memory" and w.host_memory_gb_per_s is not None:
            links[lid] = replace(link, capacity=w.host_memory_gb_per_s * GB)
        if link.kind in ("upi", "xgmi") and w.socket_link_gb_per_s is not None:
            links[lid] = replace(link, capacity=w.socket_link_gb_per_s * GB)
    return Communicator(replace(machine, links=links), comm.env, w)


def _start(comm: Communicator, name: str) -> float | None:
    """Where the fit starts: the wire's value (the links' own for host memory, socket
    links)."""
    machine = comm.machine
    value = comm.wire.value(name)
    kinds = {"host_memory_gb_per_s": ("memory",), "socket_link_gb_per_s": ("upi", "xgmi")}
    if name in kinds:
        caps = [lk.capacity / GB for lk in machine.links.values() if lk.kind in kinds[name]]
        return float(np.mean(caps)) if caps else None
    return value if value is not None and math.isfinite(value) else None


def _applies(machine: Machine, name: str, plans: Sequence[collectives.Plan]) -> bool:
    """Does any row's plan use the mechanism the parameter stands for?"""
    hops = {t for p in plans for t in p.transport.split("+")}
    protocols = {p.protocol for p in plans}
    kinds = {machine.links[lid].kind for p in plans for lid, _ in p.usage}
    pcie = any(p.transport != "P2P" or any(machine.links[lid].kind == "pcie"
                                           for lid, _ in p.usage) for p in plans)
    rules = {"p2p_pcie_simple_efficiency": "P2P" in hops and "Simple" in protocols and pcie,
             "nvlink_simple_efficiency": "nvlink" in kinds and "Simple" in protocols,
             "shm_pcie_efficiency": bool(hops & {"SHM", "NET"}),
             "host_memory_gb_per_s": "memory" in kinds,
             "socket_link_gb_per_s": bool(kinds & {"upi", "xgmi"}),
             "simple_channel_cap_gbps": "Simple" in protocols and pcie,
             "ll_channel_cap_gbps": "LL" in protocols and pcie,
             "p2p_simple_sync_us": "P2P" in hops and "Simple" in protocols,
             "p2p_ll_sync_us": "P2P" in hops and bool(protocols & {"LL", "LL128"}),
             "shm_simple_sync_us": "SHM" in hops and "Simple" in protocols,
             "shm_ll_sync_us": "SHM" in hops and "LL" in protocols,
             "net_sync_us": bool(hops & {"NET", "NET/Socket"}),
             "net_efficiency": "NET/IB" in hops, "net_ib_sync_us": "NET/IB" in hops,
             "socket_stream_gbps": "NET/Socket" in hops, "call_latency_us": True}
    return rules[name]


def fit(comm: Communicator, logs: Sequence[NcclTestsLog], fit_max: int | None) -> FitResult:
    machine = comm.machine
    observations: list[_Obs] = []
    machines: dict[int, Communicator] = {}
    for log in logs:
        if log.gpus > machine.n_gpus:
            raise InputError(f"the log ran on {log.gpus} GPUs, the machine "
                             f"{cut(machine.name)} has {machine.n_gpus}", file=log.source)
        if log.gpus % machine.nnodes:  # several boxes: the log's GPUs are theirs alike
            raise InputError(f"the log ran on {log.gpus} GPUs, not a multiple of the "
                             f"{machine.nnodes} boxes (--nnodes)", file=log.source)
        per_box = log.gpus // machine.nnodes
        machines[log.gpus] = Communicator(machine.subset(per_box), comm.env, comm.wire)
        usable = [r for r in log.rows if r.bytes > 0 and r.time_us > 0]
        chosen = [r for r in usable if fit_max is None or r.bytes <= fit_max]
        if not chosen:
            raise InputError(f"--fit-max {fit_max} leaves no row (its sizes are "
                             f"{log.sizes}); raise --fit-max", file=log.source)
        for r in usable:
            on = r in chosen
            observations.append(_Obs(log, r.bytes, r.time_us, r.busbw_gbps, on))
            if on and r.in_place_time_us:
                observations.append(_Obs(log, r.bytes, r.in_place_time_us,
                                         r.in_place_busbw_gbps or 0.0, True, in_place=True))
    fit_obs = [o for o in observations if o.fit]

    def times(params: dict[str, float], obs: Sequence[_Obs]) -> np.ndarray:
        built = {n: _with_params(m, params) for n, m in machines.items()}
        return np.array([time_alone(built[o.log.gpus], o.log.op, o.bytes).time_us
                         for o in obs])

    measured = np.array([o.time_us for o in fit_obs])
    plans = [collectives.plan(machines[o.log.gpus], o.log.op, o.bytes) for o in fit_obs]
    defaults = {name: comm.wire.value(name) for name in ORDER}
    starts = {n: s for n in ORDER if (s := _start(comm, n)) is not None}
    left: dict[str, str] = {}
    base = times({}, fit_obs) / measured - 1
    columns: list[np.ndarray] = []
    chosen_names: list[str] = []
    for name in ORDER:
        if name not in starts:
            left[name] = {"socket_link_gb_per_s": "the machine has no socket link",
                          "host_memory_gb_per_s": "the machine has no CPU node"}.get(
                name, "stepsim sets no such cap by default, so no row shows where one binds")
            continue
        if not _applies(machine, name, plans):
            left[name] = "no row of these logs uses what it describes"
            continue
        nudged = times({name: starts[name] * (1 + STEP) if starts[name] else STEP}, fit_obs)
        column = nudged / measured - 1 - base
        if np.max(np.abs(column)) < MIN_EFFECT:
            left[name] = f"no row up to --fit-max depends on it (a 10% change moves none by " \
                         f"{MIN_EFFECT:.1%})"
            continue
        trial = [*columns, column / np.linalg.norm(column)]
        singular = np.linalg.svd(np.array(trial).T, compute_uv=False)
        if singular[-1] < MIN_INDEPENDENCE:
            twin = max(chosen_names, key=lambda c: abs(float(
                columns[chosen_names.index(c)] @ trial[-1])))
            left[name] = f"these logs cannot tell it apart from {twin}"
            continue
        columns.append(trial[-1])
        chosen_names.append(name)
    # unknowns in units of their start (1.0 where it is 0: a sync of 1 us)
    scale = np.array([starts[n] or 1.0 for n in chosen_names])

    def residuals(x: np.ndarray) -> np.ndarray:
        params = dict(zip(chosen_names, (x * scale).tolist(), strict=True))
        return times(params, fit_obs) / measured - 1

    fitted: dict[str, float] = {}
    if chosen_names:
        low = np.array([BOUNDS[n][0] for n in chosen_names]) / scale
        high = np.array([BOUNDS[n][1] for n in chosen_names]) / scale
        x0 = np.clip(np.array([starts[n] for n in chosen_names]) / scale, low, high)
        # plain least squares first (a robust loss started far off downweights exactly the
        # rows that are wrong), then soft-L1 from there so one odd row cannot pull the fit
        plain = least_squares(residuals, x0, bounds=(low, high), diff_step=1e-3, max_nfev=200)
        robust = least_squares(residuals, plain.x, bounds=(low, high), loss="soft_l1",
                               f_scale=0.05, diff_step=1e-3, max_nfev=200)
        fitted = dict(zip(chosen_names, (robust.x * scale).tolist(), strict=True))
    final = times(fitted, observations)
    rms = float(np.sqrt(np.mean((times(fitted, fit_obs) / measured - 1) ** 2)))
    rows: list[RowFit] = []
    for o, t in zip(observations, final, strict=True):
        if o.in_place:
            continue  # fitted on, shown once (the out-of-place half)
        factor = collectives.bus_factor(o.log.op, o.log.gpus)
        rows.append(RowFit(o.log.source, o.bytes, o.time_us, float(t), o.busbw,
                           o.bytes / (t * 1e-6) / GB * factor, "fit" if o.fit else "predict"))
    return FitResult(fitted, defaults, left, rows, rms)
